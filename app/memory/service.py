"""Memory records: writes (staged per turn, committed atomically), reads, deletes.

CONTRACT (used by the runtime and the GraphQL layer; implemented in this module):

- `Writer` names who writes and with what provenance.
- `MemoryWork(pool, embedder, writer)` is one writer's unit of work. `add`, `delete` stage
  changes as rows of `agent_memories` with `pending_execution = writer.execution_id`, which
  only this writer's own reads see (app/memory/visibility.py); `commit(conn)` makes them
  visible inside the caller's transaction (with the turn's other writes) and raises Conflict
  when a record it replaces or deletes changed meanwhile; `discard()` drops them.
- Embeddings are computed in `add` (outside any transaction); `embed_tokens` collects usage.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import asyncpg

from app.actions.service import ActionVersion
from app.embeddings.base import Embedder
from app.memory.records import MemoryRecord, Scope, Source
from app.memory.visibility import AgentReader


@dataclass(frozen=True)
class Writer:
    account_id: UUID
    action: ActionVersion  # the agent version writing: its harness decides what is allowed
    execution_id: UUID
    invocation_number: int
    session_id: str | None
    principal: str  # becomes modifiedBy
    source: Source
    preview: bool

    def reader(self) -> AgentReader:
        """How this writer reads: its read scopes, its session, its own staged rows."""
        return AgentReader(
            account_id=self.account_id,
            action_id=self.action.action_id,
            session_id=self.session_id,
            scopes=self.action.harness.memory.read,
            preview=self.preview,
            execution_id=self.execution_id,
        )


@dataclass(frozen=True)
class NewMemory:
    summary: str
    kind: str
    content: str = ""
    labels: Mapping[str | int, str] = field(default_factory=dict)  # by label name or number
    scope: Scope | None = None  # None: SESSION when write includes session, else AGENT
    pinned: bool = False
    replaces: UUID | None = None
    metadata: Any = None


class MemoryWork:
    def __init__(self, pool: asyncpg.Pool, embedder: Embedder, writer: Writer) -> None:
        self.pool = pool
        self.embedder = embedder
        self.writer = writer
        self.embed_tokens: list[int] = []

    async def add(self, new: NewMemory) -> list[MemoryRecord]:
        """Stages a record; returns the records written (the new one, and the one it replaces)."""
        raise NotImplementedError

    async def delete(self, memory_id: UUID) -> MemoryRecord:
        """Stages a deletion; deleting a deleted record returns it unchanged."""
        raise NotImplementedError

    async def read(self, memory_id: UUID, version: int | None = None) -> MemoryRecord | None:
        """One record the writer can see, whatever its status (or an exact version)."""
        raise NotImplementedError

    async def pinned(self) -> list[MemoryRecord]:
        """The pinned records the writer reads, as every turn's instructions list them."""
        raise NotImplementedError

    async def commit(self, conn: asyncpg.Connection) -> list[MemoryRecord]:
        """Makes the staged changes visible in the caller's transaction; Conflict if stale."""
        raise NotImplementedError

    async def discard(self) -> None:
        """Drops whatever this work staged (a failed turn leaves no memory)."""
        raise NotImplementedError
