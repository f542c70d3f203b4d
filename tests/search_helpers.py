"""A search test's agent: records written with plain SQL, exactly as each test needs them."""

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from app.actions import service as actions
from app.actions.harness import SearchConfig
from app.auth.caller import Caller
from app.embeddings.text import memory_text
from app.memory.search import search
from app.memory.visibility import AgentReader, OperatorReader, Reader
from app.state import AppState

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = SearchConfig()


class Agent:
    """One agent and a way to write its records exactly as a test needs them."""

    def __init__(self, state: AppState, account_id: UUID, action_id: UUID) -> None:
        self.state = state
        self.account_id = account_id
        self.action_id = action_id
        self.clock = T0

    @property
    def operator(self) -> OperatorReader:
        return OperatorReader(self.account_id, self.action_id)

    def reader(
        self,
        *,
        session: str | None = "s1",
        scopes: Sequence[str] = ("session", "agent"),
        preview: bool = False,
        execution_id: UUID | None = None,
    ) -> AgentReader:
        return AgentReader(
            self.account_id, self.action_id, session, tuple(scopes), preview, execution_id
        )

    async def add(
        self, summary: str, content: str = "", *, created: datetime | None = None, **columns: Any
    ) -> UUID:
        self.clock += timedelta(minutes=1)
        row = {
            "memory_id": uuid.uuid4(),
            "created": created or self.clock,
            "summary": summary,
            "content": content,
            "status": "ACTIVE",
            "scope": "AGENT",
            "kind": "fact",
            "labels": {},
            "preview": False,
            "session_id": None,
            "replaces": None,
            "pending_execution": None,
            **columns,
        }
        row["labels"] = {str(k): v for k, v in row["labels"].items()}
        vector = (await self.state.embedder.embed([memory_text(summary, content)])).vectors[0]
        await self.state.pool.execute(
            """
            INSERT INTO agent_memories (
                account_id, action_id, memory_id, version, created, modified, summary, content,
                status, scope, kind, source, labels, replaces, preview, execution_id,
                invocation_number, action_version, session_id, modified_by, pending_execution,
                embedding)
            VALUES ($1, $2, $3, 1, $4, $4, $5, $6, $7, $8, $9, 'TOOL', $10, $11, $12, $13, 1, 1,
                    $14, 'agent', $15, $16)
            """,
            self.account_id,
            self.action_id,
            row["memory_id"],
            row["created"],
            summary,
            content,
            row["status"],
            row["scope"],
            row["kind"],
            row["labels"],
            row["replaces"],
            row["preview"],
            uuid.uuid4(),
            row["session_id"],
            row["pending_execution"],
            vector,
        )
        return row["memory_id"]

    async def find(
        self,
        query: str | None,
        reader: Reader | None = None,
        config: SearchConfig = CONFIG,
        **kwargs: Any,
    ) -> list[UUID]:
        result = await search(
            self.state.pool,
            self.state.embedder,
            reader or self.operator,
            config,
            query=query,
            **kwargs,
        )
        return [r.memory_id for r in result.records]


async def new_agent(state: AppState, admin: Caller) -> Agent:
    created = await actions.create_action(
        state.pool, admin, name=f"agent {uuid.uuid4()}", instructions="", model=None, harness=None
    )
    return Agent(state, admin.account_id, created.action_id)
