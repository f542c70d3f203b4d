"""The one rule of which memory records a reader sees, as an SQL predicate.

Every list, search, recall and read of memory records builds its WHERE clause here, so the
rules of the spec (agent, session, read scopes, live or preview, status, and a running turn's
own staged writes) hold everywhere or nowhere.
"""

from dataclasses import dataclass
from typing import Any
from uuid import UUID


class Params:
    """Collects query parameters; calling it with a value returns its `$n` placeholder."""

    def __init__(self, *values: Any) -> None:
        self.values: list[Any] = list(values)

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


@dataclass(frozen=True)
class AgentReader:
    """An agent reading its own memory during a turn (recall, search, read, delete)."""

    account_id: UUID
    action_id: UUID
    session_id: str | None  # None: an agent without a session sees no session scope
    scopes: tuple[str, ...]  # harness.memory.scope.read: "session" and/or "agent"
    preview: bool
    execution_id: UUID | None = None  # the running turn, whose staged writes it sees


@dataclass(frozen=True)
class OperatorReader:
    """An operator (API client) reading an agent's records: every session, live and preview."""

    account_id: UUID
    action_id: UUID


Reader = AgentReader | OperatorReader


def visible(reader: Reader, p: Params, m: str = "m", *, any_status: bool = False) -> str:
    """SQL predicate over `agent_memories` aliased `m`: the records `reader` sees.

    `any_status` is for reading one record by ID (spec: "whatever its status"); lists,
    searches and recalls see only live records.
    """
    account, action = p(reader.account_id), p(reader.action_id)
    where = [f"{m}.account_id = {account}", f"{m}.action_id = {action}"]

    if isinstance(reader, OperatorReader):
        where.append(f"{m}.pending_execution IS NULL")
        if not any_status:
            # Spec: deleted and superseded records are omitted, except preview deletions.
            where.append(f"({m}.status = 'ACTIVE' OR ({m}.preview AND {m}.status = 'DELETED'))")
        return " AND ".join(where)

    execution = p(reader.execution_id)
    preview = p(reader.preview)
    where.append(f"({m}.pending_execution IS NULL OR {m}.pending_execution = {execution})")
    scopes: list[str] = []
    if "agent" in reader.scopes:
        scopes.append(f"{m}.scope = 'AGENT'")
    if "session" in reader.scopes and reader.session_id is not None:
        scopes.append(f"({m}.scope = 'SESSION' AND {m}.session_id = {p(reader.session_id)})")
    where.append("(" + " OR ".join(scopes) + ")" if scopes else "false")
    # Live readers never see preview records.
    where.append(f"(NOT {m}.preview OR {preview})")
    if not any_status:
        where.append(f"{m}.status = 'ACTIVE'")
        # Hidden: records that a preview record names in `replaces` (for preview readers), and
        # records the running turn has staged a replacement or deletion of.
        where.append(
            f"""NOT EXISTS (
                SELECT 1 FROM agent_memories r
                WHERE r.account_id = {m}.account_id AND r.action_id = {m}.action_id
                  AND r.replaces = {m}.memory_id
                  AND ((r.pending_execution IS NULL AND r.preview AND {preview})
                       OR r.pending_execution = {execution})
            )"""
        )
    return " AND ".join(where)
