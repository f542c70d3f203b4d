"""Connections the database ends at a chosen moment (pg_terminate_backend: what a restart, an
operator or an idle-session bound does), each at a precise point of a request: the request
answers as a database gone (UNAVAILABLE, retry) or, for a turn, fails as turns do, with words
that say so, and keeps nothing half-written (bench/conn_loss.py is the random storm)."""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest
from factories import make_agent_id, memory_harness
from helpers import eventually
from openai_server import OpenAIServer
from runtime_support import chat, events, memories, run

from app.auth.caller import Caller
from app.state import AppState


@asynccontextmanager
async def holding(url: str, sql: str, *args: object) -> AsyncIterator[asyncpg.Connection]:
    """Another client's transaction holding the locks `sql` takes, until the block ends."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(sql, *args)
            yield conn
    finally:
        await conn.close()


async def waiter(state: AppState, sql: str) -> int | None:
    """The backend whose statement holding `sql` waits for a lock. (Asked on a connection of
    its own: one in a transaction sees pg_stat_activity as it was when it first read it.)"""
    return await state.pool.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND position($1 in query) > 0 AND pid <> pg_backend_pid()",
        sql,
    )


async def test_a_turn_whose_connection_is_ended_at_its_commit_fails_saying_so(
    state: AppState,
    gql,
    admin: Caller,
    model_server: OpenAIServer,
    db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The turn's commit waits for its session (held here); its backend is ended while it
    waits. The turn fails as failed turns do (transcript kept, nothing of its memory), with an
    error that says the database went away and to retry, not an internal error; and it is
    logged as such, without a traceback."""
    action_id = await make_agent_id(state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.say("Hello.")
    assert (await run(gql, admin, action_id, "hi"))["status"] == "SUCCEEDED"  # the session
    session = "SELECT FROM sessions WHERE action_id = $1 AND session_id = 's1' FOR UPDATE"
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Noted.", delay=1.0)
    turn = asyncio.create_task(run(gql, admin, action_id, "email me"))
    await eventually(lambda: len(chat(model_server)) == 3, "the turn's last model call")
    with caplog.at_level(logging.WARNING, logger="app.runtime.turns"):
        async with holding(db_url, session, uuid.UUID(action_id)) as other:
            found: list[int] = []

            async def commit_waits() -> bool:
                pid = await waiter(state, "sessions")
                found.extend([pid] if pid else [])
                return pid is not None

            await eventually(commit_waits, "the commit's wait for its session", 30)
            assert await other.fetchval("SELECT pg_terminate_backend($1)", found[0])
        failed = await asyncio.wait_for(turn, 30)
    assert failed["status"] == "FAILED"
    assert "internal error" not in failed["error"], failed["error"]
    assert "database became unavailable" in failed["error"] and "retry" in failed["error"]
    (ended,) = events(failed, "turn.failed")
    assert ended == {"error": failed["error"]}
    assert await memories(gql, admin, action_id) == []
    turn_logs = [r for r in caplog.records if r.name == "app.runtime.turns"]
    assert turn_logs and all(r.levelno == logging.WARNING for r in turn_logs), [
        (r.levelname, r.getMessage()) for r in turn_logs
    ]
    # It can be retried.
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Noted.")
    retried = await run(gql, admin, action_id, execution_id=failed["executionId"], input=None)
    assert retried["status"] == "SUCCEEDED", retried["error"]
    assert len(await memories(gql, admin, action_id)) == 1
