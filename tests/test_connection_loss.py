"""Connections the database ends at a chosen moment (pg_terminate_backend: what a restart, an
operator or an idle-session bound does), each at a precise point of a request: the request
answers as a database gone (UNAVAILABLE, retry) or, for a turn, fails as turns do, with words
that say so, and keeps nothing half-written (bench/conn_loss.py is the random storm)."""

import asyncio
import logging
import uuid
from asyncio.subprocess import PIPE
from typing import Any

import asyncpg
import pytest
from factories import make_agent_id, memory_harness
from helpers import eventually, holding
from openai_server import OpenAIServer
from runtime_support import chat, events, memories, run
from servers import clean_env, engram_command

from app.auth.caller import Caller
from app.state import AppState


async def waiter(state: AppState, sql: str) -> int | None:
    """The backend whose statement holding `sql` waits for a lock. (Asked on a connection of
    its own: one in a transaction sees pg_stat_activity as it was when it first read it.)"""
    return await state.pool.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND position($1 in query) > 0 AND pid <> pg_backend_pid()",
        sql,
    )


async def end_waiter(
    state: AppState, other: asyncpg.Connection, sql: str, *, how: str = "pg_terminate_backend"
) -> None:
    """Ends (from `other`) the backend whose statement holding `sql` waits for a lock, once it
    waits; or, `how="pg_cancel_backend"`, cancels its statement."""
    found: list[int] = []

    async def waits() -> bool:
        pid = await waiter(state, sql)
        found.extend([pid] if pid else [])
        return pid is not None

    await eventually(waits, f"a statement holding {sql!r} waiting for a lock", 30)
    assert how in ("pg_terminate_backend", "pg_cancel_backend")
    assert await other.fetchval(f"SELECT {how}($1)", found[0])


SESSION = "SELECT FROM sessions WHERE action_id = $1 AND session_id = 's1' FOR UPDATE"


async def turn_at_its_last_model_call(
    state: AppState, gql, admin: Caller, model_server: OpenAIServer
) -> tuple[str, asyncio.Task[dict[str, Any]]]:
    """An agent whose session s1 has a turn, and a second turn of it, running, that has added
    a memory and waits a second for its last model call's answer (before its commit, which
    waits for the session: `SESSION` holds it)."""
    action_id = await make_agent_id(state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.say("Hello.")
    assert (await run(gql, admin, action_id, "hi"))["status"] == "SUCCEEDED"  # the session
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Noted.", delay=1.0)
    turn = asyncio.create_task(run(gql, admin, action_id, "email me"))
    await eventually(lambda: len(chat(model_server)) == 3, "the turn's last model call")
    return action_id, turn


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
    action_id, turn = await turn_at_its_last_model_call(state, gql, admin, model_server)
    with caplog.at_level(logging.WARNING, logger="app.runtime.turns"):
        async with holding(db_url, SESSION, uuid.UUID(action_id)) as other:
            await end_waiter(state, other, "FOR UPDATE")  # the commit's wait for its session
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


async def test_a_turn_whose_failure_record_loses_its_connection_too_keeps_the_failure(
    state: AppState,
    gql,
    admin: Caller,
    model_server: OpenAIServer,
    db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The commit's connection is ended while it waits for its session, and so is the
    connection of the failure's record (which waits for the session too): the failure is kept
    alone, noting the transcript events lost, and none of it is logged as an error."""
    action_id, turn = await turn_at_its_last_model_call(state, gql, admin, model_server)
    with caplog.at_level(logging.WARNING, logger="app.runtime.turns"):
        async with holding(db_url, SESSION, uuid.UUID(action_id)) as other:
            await end_waiter(state, other, "FOR UPDATE")  # the commit's wait
            await end_waiter(state, other, "FOR SHARE")  # the failure's own record's wait
            failed = await asyncio.wait_for(turn, 30)
    assert failed["status"] == "FAILED"
    assert "database became unavailable" in failed["error"], failed["error"]
    (ended,) = events(failed, "turn.failed")
    assert ended["error"] == failed["error"] and "could not be stored" in ended["transcriptLost"]
    assert await memories(gql, admin, action_id) == []
    turn_logs = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "app.runtime.turns"
    ]
    assert any("could not be stored" in m for _, m in turn_logs), turn_logs
    assert all(level == "WARNING" for level, _ in turn_logs), turn_logs


async def test_a_turn_on_a_database_missing_a_table_fails_saying_so(
    state: AppState,
    gql,
    admin: Caller,
    model_server: OpenAIServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A turn whose commit meets a table of Engram's that is not there (the session's history,
    dropped under the service, as a restore not yet finished leaves it): the turn fails saying
    so, logged as a warning naming the table, where its error said the database became
    unavailable (restarting, or its connection ended), which nothing did. It passes again once
    the table is back."""
    harness = {**memory_harness(), "history": {"index": "messages"}}
    action_id = await make_agent_id(state, admin, harness=harness)
    model_server.say("Hello.")
    assert (await run(gql, admin, action_id, "hi"))["status"] == "SUCCEEDED"
    await state.pool.execute("ALTER TABLE history_parts RENAME TO history_parts_aside")
    model_server.say("Hello again.")
    with caplog.at_level(logging.WARNING, logger="app.runtime.turns"):
        failed = await run(gql, admin, action_id, "hi again")
    assert failed["status"] == "FAILED"
    assert failed["error"] == (
        "the database does not hold all of Engram's tables (it is being restored, or was "
        "changed under the service), and the turn's database work was rolled back; retry the "
        "execution once the database is restored whole"
    )
    (ended,) = events(failed, "turn.failed")
    assert ended == {"error": failed["error"]}
    turn_logs = [r for r in caplog.records if r.name == "app.runtime.turns"]
    assert turn_logs and all(r.levelno == logging.WARNING for r in turn_logs)
    assert any('SQLSTATE 42P01, table "history_parts"' in r.getMessage() for r in turn_logs)
    await state.pool.execute("ALTER TABLE history_parts_aside RENAME TO history_parts")
    model_server.say("Hello again.")
    retried = await run(gql, admin, action_id, execution_id=failed["executionId"], input=None)
    assert retried["status"] == "SUCCEEDED", retried["error"]


async def test_an_export_whose_connection_is_ended_says_so_in_one_line(
    state: AppState, admin: Caller, db_url: str, tmp_path
) -> None:
    """`engram export` whose connection the server ends while it reads (here while it waits
    for the records' table, held by another transaction): one line naming the lost connection
    and what is left (no file), exit status 2, no traceback."""
    agent = await make_agent_id(state, admin, harness=memory_harness())
    path = tmp_path / "agent.jsonl"
    command = [*engram_command(), "export", "--action", agent, "-o", str(path)]
    async with holding(db_url, "LOCK TABLE agent_memories IN ACCESS EXCLUSIVE MODE") as other:
        proc = await asyncio.create_subprocess_exec(
            *command, env=clean_env(database_url=db_url), stdout=PIPE, stderr=PIPE
        )
        await end_waiter(state, other, "agent_memories")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    said = err.decode()
    assert proc.returncode == 2 and "Traceback" not in said, said
    assert said.strip().splitlines()[-1] == (
        "engram export: the database became unavailable while it ran (restarting, or its "
        "connection was ended): no file was written (a file already there is as it was); what went "
        "to standard output is cut short, and an import refuses it as such"
    ), said
    assert sorted(p.name for p in tmp_path.iterdir()) == []


async def test_an_export_of_a_database_missing_a_table_says_so_in_one_line(
    state: AppState, admin: Caller, db_url: str, tmp_path
) -> None:
    """`engram export` while the database is being restored (its tables not all made yet, here
    `agent_memories` gone): one line saying so and what to do, exit status 2, no traceback."""
    agent = await make_agent_id(state, admin, harness=memory_harness())
    await state.pool.execute("DROP TABLE agent_memories CASCADE")
    path = tmp_path / "agent.jsonl"
    proc = await asyncio.create_subprocess_exec(
        *engram_command(),
        "export",
        "--action",
        agent,
        "-o",
        str(path),
        env=clean_env(database_url=db_url),
        stdout=PIPE,
        stderr=PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    said = err.decode()
    assert proc.returncode == 2 and "Traceback" not in said, said
    assert said.strip().splitlines()[-1] == (
        "engram export: the database does not hold all of Engram's tables (it is being "
        "restored, or was changed under the command): no file was written (a file already there "
        "is as it was); what went to standard output is cut short, and an import refuses it as "
        "such"
    ), said
    assert sorted(p.name for p in tmp_path.iterdir()) == []


async def test_an_export_whose_statement_is_cancelled_says_so_in_one_line(
    state: AppState, admin: Caller, db_url: str, tmp_path
) -> None:
    """`engram export` whose statement the database cancels (an operator's pg_cancel_backend,
    or a statement_timeout or lock_timeout the database or its role sets): one line with
    PostgreSQL's reason and what is left (no file), exit status 2, no traceback. It printed
    asyncpg's traceback."""
    agent = await make_agent_id(state, admin, harness=memory_harness())
    path = tmp_path / "agent.jsonl"
    command = [*engram_command(), "export", "--action", agent, "-o", str(path)]
    async with holding(db_url, "LOCK TABLE agent_memories IN ACCESS EXCLUSIVE MODE") as other:
        proc = await asyncio.create_subprocess_exec(
            *command, env=clean_env(database_url=db_url), stdout=PIPE, stderr=PIPE
        )
        await end_waiter(state, other, "agent_memories", how="pg_cancel_backend")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    said = err.decode()
    assert proc.returncode == 2 and "Traceback" not in said, said
    assert said.strip().splitlines()[-1] == (
        "engram export: the database stopped its work (canceling statement due to user "
        "request): no file was written (a file already there is as it was); what went to "
        "standard output is cut short, and an import refuses it as such"
    ), said
    assert sorted(p.name for p in tmp_path.iterdir()) == []
