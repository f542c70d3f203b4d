"""The one rule of which memory records a reader sees, as an SQL predicate.

Every list, search, recall and read of memory records builds its WHERE clause here, so the
rules of the spec (agent, session, read scopes, live or preview, status, and a running turn's
own staged writes) hold everywhere or nowhere.
"""

from dataclasses import dataclass
from uuid import UUID

from app.db.sql import Params
from app.scope import Scope


@dataclass(frozen=True)
class AgentReader:
    """An agent reading its own memory during a turn (recall, search, read, delete)."""

    account_id: UUID
    action_id: UUID
    session_id: str | None  # None: an agent without a session sees no session scope
    scopes: tuple[Scope, ...]  # harness.memory.scope.read
    preview: bool
    execution_id: UUID | None = None  # the running turn, whose staged writes it sees
    # The running attempt of that turn: a retry never sees what a failed attempt staged.
    # None: every attempt of the execution (for readers that do not know it).
    invocation_number: int | None = None


@dataclass(frozen=True)
class OperatorReader:
    """An operator (API client) reading an agent's records: every session, live and preview."""

    account_id: UUID
    action_id: UUID


@dataclass(frozen=True)
class OperatorPages:
    """An operator reading several agents' records in one statement, as OperatorReader reads
    one agent's: `agent` is the SQL naming each row's agent (a column of the `unnest` of the
    pages asked)."""

    account_id: UUID
    agent: str


Reader = AgentReader | OperatorReader


def staged_by(reader: AgentReader, p: Params, m: str) -> str:
    """SQL: row `m` is staged (not yet committed) by the reader's own running attempt."""
    invocation = p(reader.invocation_number)
    return (
        f"({m}.pending_execution = {p(reader.execution_id)}"
        f" AND ({invocation}::integer IS NULL OR {m}.pending_invocation = {invocation}))"
    )


def shadows(reader: AgentReader, p: Params, r: str) -> str:
    """SQL: row `r`, which names a record in `replaces`, hides that record from the reader.

    A record is hidden when the reader's own attempt has staged its replacement or deletion,
    and, for a preview reader, when any committed preview record names it (spec: preview
    turns see every record except those a preview record names in `replaces`).
    """
    return (
        f"({staged_by(reader, p, r)}"
        f" OR ({r}.pending_execution IS NULL AND {r}.preview AND {p(reader.preview)}))"
    )


def counted(m: str = "m") -> str:
    """SQL: row `m` is a record that word counts hold (search weights, migrations 0018 and
    0020): committed, live and not preview, which every live reader of its scope sees."""
    return f"{m}.status = 'ACTIVE' AND {m}.pending_execution IS NULL AND NOT {m}.preview"


def gone(m: str = "m") -> str:
    """SQL: row `m` is a committed record deleted or replaced. Such rows only ever grow in
    number (a staged one may be dropped with its turn), so a change in their count tells the
    maintenance that a counted record went."""
    return f"{m}.status <> 'ACTIVE' AND {m}.pending_execution IS NULL"


def in_session(session: str, p: Params, m: str = "m") -> str:
    """SQL: row `m` is of session scope, in `session`, whatever its status; served by the
    session index (migration 0020)."""
    return f"({m}.scope = 'SESSION' AND {m}.session_id = {p(session)})"


def scope_arms(reader: AgentReader, p: Params, m: str = "m") -> list[str]:
    """SQL, one predicate per scope the reader reads (agent scope, its own session's): row `m`
    is of that scope, whatever its status; each served by its partial index (migrations 0020
    and 0021), and a range of the covering index (0024)."""
    arms: list[str] = []
    if Scope.AGENT in reader.scopes:
        arms.append(f"{m}.scope = 'AGENT'")
    if Scope.SESSION in reader.scopes and reader.session_id is not None:
        arms.append(in_session(reader.session_id, p, m))
    return arms


def in_scopes(reader: AgentReader, p: Params, m: str = "m") -> str:
    """SQL: row `m` is of a scope the reader reads, whatever its status."""
    arms = scope_arms(reader, p, m)
    return "(" + " OR ".join(arms) + ")" if arms else "false"


def visible(
    reader: Reader | OperatorPages,
    p: Params,
    m: str = "m",
    *,
    any_status: bool = False,
    scope: str | None = None,
) -> str:
    """SQL predicate over `agent_memories` aliased `m`: the records `reader` sees.

    `any_status` is for reading one record by ID (spec: "whatever its status"); lists,
    searches and recalls see only live records. `scope`: an agent reader's records of one of
    its scopes alone (one of `scope_arms`).
    """
    account = p(reader.account_id)
    action = reader.agent if isinstance(reader, OperatorPages) else p(reader.action_id)
    where = [f"{m}.account_id = {account}", f"{m}.action_id = {action}"]

    if isinstance(reader, OperatorReader | OperatorPages):
        where.append(f"{m}.pending_execution IS NULL")
        if not any_status:
            # Spec: deleted and superseded records are omitted, except preview deletions: the
            # preview tombstones naming the live record they delete. A preview record that
            # replaced one and was deleted later is no deletion, and stays omitted.
            where.append(f"({m}.status = 'ACTIVE' OR ({m}.preview AND {m}.tombstone))")
        return " AND ".join(where)

    where.append(f"({m}.pending_execution IS NULL OR {staged_by(reader, p, m)})")
    where.append(scope if scope is not None else in_scopes(reader, p, m))
    # Live readers never see preview records.
    where.append(f"(NOT {m}.preview OR {p(reader.preview)})")
    if not any_status:
        where.append(f"{m}.status = 'ACTIVE'")
        where.append(
            f"""NOT EXISTS (
                SELECT 1 FROM agent_memories r
                WHERE r.account_id = {m}.account_id AND r.action_id = {m}.action_id
                  AND r.replaces = {m}.memory_id AND {shadows(reader, p, "r")}
            )"""
        )
    return " AND ".join(where)
