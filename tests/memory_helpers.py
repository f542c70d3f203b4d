"""Helpers for the memory tests: agents with memory, their writers, turns that commit."""

import uuid
from typing import Any
from uuid import UUID

from app.actions import service as actions
from app.actions.service import ActionVersion
from app.auth.caller import Caller
from app.memory.records import MemoryRecord
from app.memory.service import MemoryWork, NewMemory, Writer
from app.runtime import store as runtime_store
from app.state import AppState

LABELS = {
    "customer_id": {"number": 5, "description": "The customer the memory is about."},
    "ticket": {"number": 7, "description": "The support ticket."},
}
BOTH = ["session", "agent"]


def memory_harness(**memory: Any) -> dict[str, Any]:
    """A harness with memory on, both scopes read and written, unless overridden."""
    return {
        "memory": {
            "enabled": True,
            "scope": {"read": BOTH, "write": BOTH},
            "labels": LABELS,
            "tools": ["add_memory", "read_memory", "delete_memory"],
            **memory,
        }
    }


async def make_agent(
    state: AppState, who: Caller, name: str = "support", **memory: Any
) -> ActionVersion:
    return await actions.create_action(
        state.pool, who, name=name, instructions="", model=None, harness=memory_harness(**memory)
    )


def writer(
    agent: ActionVersion,
    *,
    session: str | None = "s1",
    preview: bool = False,
    source: str = "TOOL",
    execution_id: UUID | None = None,
    invocation: int = 1,
    principal: str | None = None,
) -> Writer:
    return Writer(
        account_id=agent.account_id,
        action=agent,
        execution_id=execution_id or uuid.uuid4(),
        invocation_number=invocation,
        session_id=session,
        principal=principal or actions.agent_principal(agent.action_id),
        source=source,  # type: ignore[arg-type]
        preview=preview,
    )


def work(state: AppState, w: Writer) -> MemoryWork:
    assert state.embedder is not None
    return MemoryWork(state.pool, state.embedder, w)


async def commit(state: AppState, unit: MemoryWork) -> list[MemoryRecord]:
    """Commits a unit of work in a transaction of its own, as a turn's end does."""
    async with state.pool.acquire() as conn, conn.transaction():
        return await unit.commit(conn)


async def record_turn(state: AppState, w: Writer) -> None:
    """The execution (and session) a writer's turn belongs to, so provenance links resolve."""
    async with state.pool.acquire() as conn, conn.transaction():
        if w.session_id is not None:
            await runtime_store.ensure_session(conn, w.account_id, w.action.action_id, w.session_id)
        await runtime_store.insert_execution(
            conn,
            account_id=w.account_id,
            action_id=w.action.action_id,
            execution_id=w.execution_id,
            action_version=w.action.version,
            session_id=w.session_id,
            turn=1,
            kind="TURN",
            status="SUCCEEDED",
            preview=w.preview,
            principal=w.principal,
            input={"message": "hello"},
            invocation_number=w.invocation_number,
        )


async def remember(
    state: AppState, agent: ActionVersion, summary: str, *, kind: str = "fact", **options: Any
) -> MemoryRecord:
    """One turn that adds one record and commits."""
    keys = ("session", "preview", "source", "execution_id", "invocation", "principal")
    w = writer(agent, **{k: options.pop(k) for k in keys if k in options})
    unit = work(state, w)
    added = await unit.add(NewMemory(summary=summary, kind=kind, **options))
    await commit(state, unit)
    return added[0]


async def forget(
    state: AppState, agent: ActionVersion, memory_id: UUID, **options: Any
) -> MemoryRecord:
    """One turn that deletes one record and commits."""
    unit = work(state, writer(agent, **options))
    deleted = await unit.delete(memory_id)
    await commit(state, unit)
    return deleted


async def listed(state: AppState, w: Writer) -> list[UUID]:
    """What the writer's recall and search see: its visible, live records, newest first."""
    from app.memory import store

    async with state.pool.acquire() as conn:
        rows = await store.list_page(conn, w.reader(), after=None, limit=10_000, ascending=False)
    return [r["memory_id"] for r in rows]
