"""Bounded database waits (app/db/pool.py `bounds`, ENGRAM_STATEMENT_TIMEOUT_SECONDS,
ENGRAM_LOCK_TIMEOUT_SECONDS, ENGRAM_IDLE_IN_TRANSACTION_SECONDS): a request's statement or
lock wait past its bound is refused with a clear, retryable error and writes nothing; a turn
that meets one fails as failed turns do; search upkeep, long by design, is not cut off. A
refusal is logged by its kind (class, SQLSTATE, table), never in its words, which may quote a
row."""

import asyncio
import logging
import uuid

import asyncpg
import httpx
import pytest
from factories import (
    allow,
    caller,
    full_memory,
    make_agent,
    make_agent_id,
    memory_harness,
    remember,
    token_for,
)
from helpers import eventually, holding
from mcp_support import call, mcp_session, mcp_url, refused
from openai_server import OpenAIServer
from runtime_support import EXECUTE, chat, events, memories, run, tool_runs

from app.auth.caller import Caller
from app.auth.service import hash_token
from app.config import Settings
from app.db import errors
from app.db.pool import bounds, create_pool, lift_bounds, session_changed
from app.embeddings.setup import ensure_model
from app.executions import erasure_store
from app.history import store as history_store
from app.main import request_bounds
from app.memory import maintenance
from app.memory.vectors import VECTOR_COLUMNS
from app.services import start_services, stop_services
from app.state import AppState

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")
ADD = """mutation($a: UUID!, $i: AgentMemoryInput!) {
  addAgentMemory(actionId: $a, input: $i) { memoryId } }"""
DELETE = """mutation($a: UUID!, $id: UUID!) {
  deleteAgentMemory(actionId: $a, id: $id) { status version } }"""
READ = "query($a: UUID!, $id: UUID!) { agentMemory(actionId: $a, id: $id) { status version } }"
SETTINGS = (
    "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
    "current_setting('idle_in_transaction_session_timeout')"
)


async def waiting(state: AppState, sql: str) -> bool:
    """Whether a statement holding `sql` waits for a lock."""
    return bool(
        await state.pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND position($1 in query) > 0 AND pid <> pg_backend_pid()",
            sql,
        )
    )


def test_the_defaults_bound_every_request_generously() -> None:
    settings = Settings()
    assert request_bounds(settings) == {
        "statement_timeout": "60000",
        "lock_timeout": "10000",
        "idle_in_transaction_session_timeout": "60000",
    }
    # 0 sets none: the server's own applies; a bound under a millisecond is one, not none.
    assert bounds(0, 0.0001, 0) == {"lock_timeout": "1"}


async def test_a_missing_table_is_unavailable_and_a_statements_missing_from_entry_is_not(
    db_url: str,
) -> None:
    """SQLSTATE 42P01 has two senses: a table the database does not hold (being restored:
    UNAVAILABLE, retry) and a FROM entry a statement lacks or names wrongly, a mistake in the
    statement, which no retry mends: that stays an internal error, logged with its traceback."""
    conn = await asyncpg.connect(db_url)
    try:
        with pytest.raises(asyncpg.UndefinedTableError) as gone:
            await conn.fetch("SELECT * FROM no_such_table_of_engrams")
        with pytest.raises(asyncpg.UndefinedTableError) as missing:
            await conn.fetch("SELECT m.memory_id FROM agent_memories a")
        with pytest.raises(asyncpg.UndefinedTableError) as invalid:
            await conn.fetch("SELECT 1 FROM agent_memories a WHERE agent_memories.kind = ''")
    finally:
        await conn.close()
    assert errors.database_refusal(gone.value) == ("UNAVAILABLE", errors.SCHEMA_MISSING_MESSAGE)
    for mistake in (missing.value, invalid.value):
        assert mistake.sqlstate == "42P01"
        assert errors.database_refusal(mistake) is None, str(mistake)


@pytest.mark.settings(lock_timeout_seconds=0.3)
async def test_a_request_waiting_on_a_locked_row_past_the_lock_bound_is_a_conflict(
    state: AppState, gql, admin: Caller, db_url: str
) -> None:
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "wrong address", scope="AGENT")
    deleter = caller(agent.account_id, EVERYTHING, principal="ops@example.com")
    ids = {"a": str(agent.action_id), "id": str(record.memory_id)}
    lock = "SELECT FROM agent_memories WHERE memory_id = $1 FOR UPDATE"
    async with holding(db_url, lock, record.memory_id) as other:
        refused = await asyncio.wait_for(gql(deleter, DELETE, **ids), 30)
        # Answered while the other transaction still holds the row: not after it let go.
        assert not other.is_closed() and other.is_in_transaction()
    assert refused.codes == ["CONFLICT"], refused.errors
    assert "ENGRAM_LOCK_TIMEOUT_SECONDS" in refused.errors[0]["message"]
    assert refused.data is None
    # Nothing written; once the row is free, the retry passes.
    assert (await gql(admin, READ, **ids)).ok()["agentMemory"] == {"status": "ACTIVE", "version": 1}
    assert (
        await state.pool.fetchval(
            "SELECT count(*) FROM agent_memories WHERE memory_id = $1", record.memory_id
        )
        == 1
    )
    deleted = (await gql(deleter, DELETE, **ids)).ok()["deleteAgentMemory"]
    assert deleted == {"status": "DELETED", "version": 2}


@pytest.mark.settings(statement_timeout_seconds=0.3, lock_timeout_seconds=0)
async def test_a_statement_past_the_statement_bound_is_refused_unavailable(
    state: AppState, gql, admin: Caller, db_url: str
) -> None:
    """With no lock bound, the statement bound ends the same wait: QueryCanceledError."""
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "wrong address", scope="AGENT")
    ids = {"a": str(agent.action_id), "id": str(record.memory_id)}
    lock = "SELECT FROM agent_memories WHERE memory_id = $1 FOR UPDATE"
    async with holding(db_url, lock, record.memory_id) as other:
        refused = await asyncio.wait_for(gql(admin, DELETE, **ids), 30)
        assert other.is_in_transaction()
    assert refused.codes == ["UNAVAILABLE"], refused.errors
    assert "ENGRAM_STATEMENT_TIMEOUT_SECONDS" in refused.errors[0]["message"]
    assert (await gql(admin, READ, **ids)).ok()["agentMemory"] == {"status": "ACTIVE", "version": 1}


@pytest.mark.settings(statement_timeout_seconds=0.3, lock_timeout_seconds=0)
async def test_a_statement_past_its_bound_answers_503_with_retry_after(
    state: AppState, admin: Caller, base_url: str, db_url: str
) -> None:
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "wrong address", scope="AGENT")
    token = await token_for(state, admin, "ops", EVERYTHING)
    body = {"query": DELETE, "variables": {"a": str(agent.action_id), "id": str(record.memory_id)}}
    lock = "SELECT FROM agent_memories WHERE memory_id = $1 FOR UPDATE"
    async with (
        holding(db_url, lock, record.memory_id),
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        response = await http.post(
            "/graphql", json=body, headers={"authorization": f"Bearer {token}"}
        )
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) > 0
    assert [e["extensions"]["code"] for e in response.json()["errors"]] == ["UNAVAILABLE"]


async def test_the_pool_sets_its_bounds_at_connect_and_keeps_them_through_a_reset(
    db_url: str,
) -> None:
    pool = await create_pool(db_url, min_size=1, max_size=1, limits=bounds(0.2, 0.1, 5))
    try:
        async with pool.acquire() as conn:
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            assert tuple(await conn.fetchrow(SETTINGS)) == ("200ms", "100ms", "5s")
            with pytest.raises(asyncpg.QueryCanceledError) as cancelled:
                await conn.execute("SELECT pg_sleep(2)")
            assert errors.is_statement_timeout(cancelled.value)
            assert not errors.is_unavailable(cancelled.value)
            await lift_bounds(conn)  # upkeep's: none until the connection is released
            assert tuple(await conn.fetchrow(SETTINGS)) == ("0", "0", "0")
            await conn.execute("SELECT pg_sleep(0.4)")
        async with pool.acquire() as conn:
            # The same connection, reset (RESET ALL) to the bounds it connected with.
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend
            assert tuple(await conn.fetchrow(SETTINGS)) == ("200ms", "100ms", "5s")
            session_changed(conn)
        async with pool.acquire() as conn:
            assert tuple(await conn.fetchrow(SETTINGS)) == ("200ms", "100ms", "5s")
    finally:
        await pool.close()


async def test_a_transaction_left_idle_past_its_bound_is_ended_as_unavailable(
    db_url: str,
) -> None:
    """A process stalled mid-transaction holds no row locks for long: the server ends its
    session, and what it then tries is answered as a database gone (UNAVAILABLE, retry)."""
    pool = await create_pool(db_url, min_size=1, max_size=1, limits=bounds(idle_in_transaction=0.2))
    try:
        async with pool.acquire() as conn:
            with pytest.raises(Exception) as ended:  # noqa: PT011 (asyncpg's, by its state)
                async with conn.transaction():
                    await conn.execute("SELECT FROM agent_memories FOR UPDATE")
                    await asyncio.sleep(1)
                    await conn.execute("SELECT 1")
            assert errors.is_unavailable(ended.value), repr(ended.value)
        async with pool.acquire() as conn:  # the pool replaces the connection
            assert await conn.fetchval("SELECT 1") == 1
        # Should the server's own word for it arrive first, it reads the same.
        timeout = asyncpg.exceptions.IdleInTransactionSessionTimeoutError("idle timeout")
        assert errors.is_unavailable(timeout)
    finally:
        await pool.close()


async def test_a_held_connection_the_server_ended_is_unavailable(db_url: str) -> None:
    """A connection held between two statements (a request awaiting its model or embedder)
    whose backend the server ends (a restart): the next statement is answered as a database
    gone (UNAVAILABLE, retry), not as an internal error; asyncpg's own words for it say the
    connection "has been released back to the pool"."""
    pool = await create_pool(db_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            other = await asyncpg.connect(db_url)
            try:
                assert await other.fetchval("SELECT pg_terminate_backend($1)", backend)
            finally:
                await other.close()

            def ended() -> bool:  # asyncpg has read the server's goodbye
                try:
                    return conn.is_closed()
                except asyncpg.InterfaceError:  # the proxy already detached
                    return True

            await eventually(ended, "the connection seen closed")
            with pytest.raises(asyncpg.InterfaceError) as lost:
                await conn.fetchval("SELECT 1")
        assert "released back to the pool" in str(lost.value)
        assert errors.database_refusal(lost.value) == ("UNAVAILABLE", errors.UNAVAILABLE_MESSAGE)
        async with pool.acquire() as conn:  # the pool replaces the connection
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


@pytest.mark.settings(lock_timeout_seconds=0.3)
async def test_a_turn_past_the_lock_bound_fails_and_keeps_nothing(
    state: AppState, gql, admin: Caller, model_server: OpenAIServer, db_url: str
) -> None:
    action_id = await make_agent_id(state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.say("Hello.")
    assert (await run(gql, admin, action_id, "hi"))["status"] == "SUCCEEDED"
    session = "SELECT FROM sessions WHERE action_id = $1 AND session_id = 's1' FOR UPDATE"
    # Refused at its start, while another transaction holds its session: nothing runs.
    async with holding(db_url, session, uuid.UUID(action_id)):
        refused = await gql(
            admin, EXECUTE, input={"actionId": action_id, "sessionId": "s1", "input": "hi"}
        )
    assert refused.codes == ["CONFLICT"], refused.errors
    # Held from while its model works: the turn fails at its commit, as failed turns do.
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Noted.", delay=1.0)
    turn = asyncio.create_task(run(gql, admin, action_id, "email me"))
    await eventually(lambda: len(chat(model_server)) == 3, "the turn's last model call")
    async with holding(db_url, session, uuid.UUID(action_id)):
        # Its commit waits past the lock bound and fails; the failure's own record waits on.
        await eventually(lambda: waiting(state, "FOR SHARE"), "the failure's wait", 30)
        await asyncio.sleep(0.6)  # past the lock bound
    failed = await asyncio.wait_for(turn, 30)
    assert failed["status"] == "FAILED"
    assert "ENGRAM_LOCK_TIMEOUT_SECONDS" in failed["error"], failed["error"]
    # Its transcript kept whole, as any failed turn's.
    assert len(tool_runs(failed, "add_memory")) == 1
    (ended,) = events(failed, "turn.failed")
    assert ended == {"error": failed["error"]}
    assert await memories(gql, admin, action_id) == []
    # It can be retried.
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Noted.")
    retried = await run(gql, admin, action_id, execution_id=failed["executionId"], input=None)
    assert retried["status"] == "SUCCEEDED", retried["error"]
    assert len(await memories(gql, admin, action_id)) == 1


@pytest.mark.settings(statement_timeout_seconds=0.2, lock_timeout_seconds=0.2)
async def test_search_upkeep_is_not_cut_off_by_the_bounds(
    state: AppState, admin: Caller, db_url: str
) -> None:
    """An index build waits for every older transaction (CREATE INDEX CONCURRENTLY): here a
    second, past both bounds of the pool it runs on; it finishes, and the connection goes
    back to the pool bounded again."""
    agent = await make_agent(state, admin)
    for i in range(6):
        await remember(state, agent, f"note {i}", scope="AGENT")
    # A snapshot older than the build's, held for a second.
    async with holding(db_url, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ") as other:
        await other.fetchval("SELECT count(*) FROM agent_memories")
        round_ = asyncio.create_task(maintenance.run_round(state.pool, min_records=5))
        await asyncio.sleep(1)
        assert not round_.done()  # waiting for this transaction, past both bounds
    done = await asyncio.wait_for(round_, 60)
    assert done is not None and done.failed == [], done
    assert sorted(done.built) == sorted(maintenance.index_names(agent.account_id, agent.action_id))
    async with state.pool.acquire() as conn:
        assert tuple(await conn.fetchrow(SETTINGS)) == ("200ms", "200ms", "1min")


async def test_a_start_waits_past_the_bounds_for_a_reembed_holding_the_model(
    db_url: str, embedder
) -> None:
    """`engram reembed` holds the model's lock for its whole run; a service starting meanwhile
    waits for it (its start is no request) rather than failing at the lock bound."""
    pool = await create_pool(db_url, min_size=1, max_size=1, limits=bounds(0.2, 0.2))
    try:
        async with holding(db_url, "SELECT pg_advisory_xact_lock(hashtext('engram.embedding'))"):
            start = asyncio.create_task(ensure_model(pool, embedder, VECTOR_COLUMNS))
            await asyncio.sleep(0.6)
            assert not start.done()
        await asyncio.wait_for(start, 30)
    finally:
        await pool.close()


@pytest.mark.settings(lock_timeout_seconds=0.3)
async def test_an_mcp_call_refused_at_the_lock_bound_says_so_as_graphql_does(
    state: AppState, admin: Caller, base_url: str, db_url: str
) -> None:
    harness = memory_harness(tools=["add_memory"], scope={"write": ["session", "agent"]})
    action_id = await make_agent_id(state, admin, harness=harness)
    policies = (
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT", "INSERT", "UPDATE"], "financial.AgentMemory.*"),
    )
    token = await token_for(state, admin, "client", *policies)
    note = {"summary": "Ada prefers email", "kind": "fact", "scope": "agent"}
    session = "SELECT FROM sessions WHERE action_id = $1 AND session_id = 's1' FOR UPDATE"
    async with mcp_session(mcp_url(base_url, action_id), token) as client:
        await call(client, "add_memory", **note)  # the session exists
        async with holding(db_url, session, uuid.UUID(action_id)):
            body = await refused(client, "add_memory", **note)
        assert body["code"] == "CONFLICT", body
        assert "ENGRAM_LOCK_TIMEOUT_SECONDS" in body["error"]
        await call(client, "add_memory", **note)


@pytest.mark.settings(lock_timeout_seconds=0.3)
async def test_a_token_check_past_the_lock_bound_is_refused_as_such_over_mcp_and_graphql(
    state: AppState, admin: Caller, base_url: str, db_url: str
) -> None:
    """A request's token check writes the token's last use (at most once a minute), which waits
    for a lock on the token's row (a token being revoked, its client deleted, an index built on
    the table): past the lock bound, MCP answers as GraphQL does, 409 CONFLICT naming the
    setting, not a 500, and the GraphQL request is counted as CONFLICT."""
    action_id = await make_agent_id(state, admin)
    token = await token_for(state, admin, "client", EVERYTHING)
    lock = "SELECT FROM client_tokens WHERE token_hash = $1 FOR UPDATE"
    headers = {"authorization": f"Bearer {token}"}
    async with (
        holding(db_url, lock, hash_token(token)),
        httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as http,
    ):
        answers = [
            await http.post(mcp_url("", action_id), json={"jsonrpc": "2.0", "id": 1}),
            await http.post("/graphql", json={"query": "{ __typename }"}),
        ]
    mcp, graphql = (a.json() for a in answers)
    assert [a.status_code for a in answers] == [409, 409], [a.text for a in answers]
    assert mcp["error"]["data"]["code"] == graphql["errors"][0]["extensions"]["code"] == "CONFLICT"
    assert "ENGRAM_LOCK_TIMEOUT_SECONDS" in mcp["error"]["message"]
    assert mcp["error"]["message"] == graphql["errors"][0]["message"]
    # Counted under the code its body carries, as the README says of engram_requests_total.
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as http:
        metrics = (await http.get("/metrics")).text
    assert 'engram_requests_total{code="CONFLICT",operation="-"} 1.0' in metrics, metrics


async def test_a_start_waits_past_the_bounds_for_a_reorder_holding_the_memory_table(
    db_url: str, embedder
) -> None:
    """`engram maintain-search --reorder` holds agent_memories' lock while it rewrites the
    table (minutes on a large one); a service starting meanwhile waits for it, as for a
    re-embed, rather than failing at the lock bound in its first sweep of dead turns' staged
    rows. Its later sweeps stay bounded."""
    pool = await create_pool(db_url, min_size=1, max_size=1, limits=bounds(0.2, 0.2))
    state = AppState(
        settings=Settings(database_url=db_url, search_maintenance_seconds=0),
        pool=pool,
        embedder=embedder,
    )
    try:
        async with holding(db_url, "LOCK TABLE agent_memories IN ACCESS EXCLUSIVE MODE"):
            start = asyncio.create_task(start_services(state))
            await asyncio.sleep(0.6)
            assert not start.done()
        await asyncio.wait_for(start, 30)
        async with pool.acquire() as conn:  # its connection back, bounded again
            assert tuple(await conn.fetchrow(SETTINGS)) == ("200ms", "200ms", "0")
    finally:
        await stop_services(state)
        await pool.close()


ERASE = """mutation($a: UUID!) { eraseSession(actionId: $a, sessionId: "long") {
  erasedEvents erasedExecutions erasedTranscriptEvents } }"""
LONG_SESSION = [
    "INSERT INTO sessions (account_id, action_id, session_id, turns) VALUES ($1, $2, 'long', $3)",
    """
    INSERT INTO executions (account_id, action_id, execution_id, action_version, session_id,
                            turn, kind, status, principal, input, output, created)
    SELECT $1, $2, gen_random_uuid(), 1, 'long', t, 'TURN', 'SUCCEEDED', 'u', '"words"',
           '"reply"', now() - make_interval(secs => $3 - t)
    FROM generate_series(1, $3::int) t
    """,
    """
    INSERT INTO transcript_events (account_id, action_id, execution_id, sequence,
                                   invocation_number, type, data)
    SELECT account_id, action_id, execution_id, s, 1, 'turn.input', '{"message": "words"}'
    FROM executions, generate_series(1, 2) s WHERE account_id = $1 AND action_id = $2
    """,
    """
    INSERT INTO history_events (account_id, action_id, session_id, event_id, turn, execution_id,
                                invocation_number, sequence, who, data, text, parts, preview)
    SELECT account_id, action_id, 'long', gen_random_uuid(), turn, execution_id, 1, s,
           (ARRAY['user', 'agent'])[s], '{}', 'words', 1, false
    FROM executions, generate_series(1, 2) s WHERE account_id = $1 AND action_id = $2
    """,
    """
    INSERT INTO history_parts (account_id, action_id, session_id, event_id, part, turn, preview,
                               text, tools)
    SELECT account_id, action_id, session_id, event_id, 1, turn, false, text, '{}'
    FROM history_events WHERE account_id = $1 AND action_id = $2
    """,
]
# Each history event deleted and each transcript event rewritten takes 10 ms more (and one of
# the events of turn $1, when given, 3 s): a session of 150 turns is 3 s of work for either
# table, twice the bound, and 20 rows a statement 0.2 s.
SLOW_ROWS = """
CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(CASE WHEN OLD.turn = {stuck} THEN 3 ELSE 0.01 END);
    RETURN OLD;
END $$;
CREATE FUNCTION slow_transcript() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
CREATE TRIGGER slow_row BEFORE DELETE ON history_events FOR EACH ROW EXECUTE FUNCTION slow_row();
CREATE TRIGGER slow_transcript BEFORE UPDATE ON transcript_events
    FOR EACH ROW EXECUTE FUNCTION slow_transcript();
"""
SESSION_ROWS = """SELECT
    (SELECT count(*) FROM history_events WHERE action_id = $1),
    (SELECT count(*) FROM history_parts WHERE action_id = $1),
    (SELECT count(*) FROM executions WHERE action_id = $1 AND input = '"[erased]"'),
    (SELECT count(*) FROM transcript_events WHERE action_id = $1 AND data ? 'erased')"""


async def long_session(
    state: AppState, admin: Caller, turns: int, stuck: int = 0, events: int = 2
) -> str:
    """An agent with a session "long" of `turns` turns (two history events and `events`
    transcript events each), whose rows are slow to erase (SLOW_ROWS); its ID."""
    agent = await make_agent(state, admin)
    async with state.pool.acquire() as conn, conn.transaction():
        for sql in LONG_SESSION:
            if "INTO transcript_events" in sql:
                sql = sql.replace("generate_series(1, 2)", f"generate_series(1, {events})")
            await conn.execute(sql, agent.account_id, agent.action_id, *([turns] * ("$3" in sql)))
        await conn.execute(SLOW_ROWS.format(stuck=stuck))
    return str(agent.action_id)


@pytest.mark.settings(statement_timeout_seconds=1.5)
async def test_a_session_too_long_to_erase_in_one_statement_is_erased_in_several(
    state: AppState, gql, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eraseSession deletes a session's history, and rewrites its executions and transcripts,
    a bounded batch a statement: a session as long as a user may make it is erased within
    ENGRAM_STATEMENT_TIMEOUT_SECONDS, which one statement over all of it would pass (and be
    refused at every retry)."""
    monkeypatch.setattr(history_store, "ERASE_BATCH", 20)
    monkeypatch.setattr(erasure_store, "ERASE_BATCH", 10)
    action_id = await long_session(state, admin, 150)
    erased = (await gql(admin, ERASE, a=action_id)).ok()["eraseSession"]
    assert erased == {"erasedEvents": 300, "erasedExecutions": 150, "erasedTranscriptEvents": 300}
    left = await state.pool.fetchrow(SESSION_ROWS, uuid.UUID(action_id))
    assert tuple(left) == (0, 0, 150, 300)


@pytest.mark.settings(statement_timeout_seconds=1.5)
async def test_an_erasure_refused_in_a_later_batch_erases_nothing(
    state: AppState, gql, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All or nothing: the batches share one transaction, so a batch past the bound (here the
    fifth, one of its rows slow) leaves the batches before it undone too."""
    monkeypatch.setattr(history_store, "ERASE_BATCH", 20)
    action_id = await long_session(state, admin, 150, stuck=45)
    answer = await gql(admin, ERASE, a=action_id)
    assert answer.codes == ["UNAVAILABLE"], answer.errors
    assert "ENGRAM_STATEMENT_TIMEOUT_SECONDS" in answer.errors[0]["message"]
    left = await state.pool.fetchrow(SESSION_ROWS, uuid.UUID(action_id))
    assert tuple(left) == (300, 300, 0, 0)


@pytest.mark.settings(statement_timeout_seconds=1.5)
async def test_executions_with_long_transcripts_are_erased_a_bounded_number_of_events_a_statement(
    state: AppState, gql, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's transcript may hold a thousand events (16 model calls of 64 tool calls each, by
    default): a batch of executions is not a bound on the rows its transcripts are. Here three
    turns of 100 events each, 3 s of work in one statement, twice the bound."""
    monkeypatch.setattr(erasure_store, "ERASE_TRANSCRIPT_BATCH", 20)
    action_id = await long_session(state, admin, 3, events=100)
    erased = (await gql(admin, ERASE, a=action_id)).ok()["eraseSession"]
    assert erased == {"erasedEvents": 6, "erasedExecutions": 3, "erasedTranscriptEvents": 300}
    left = await state.pool.fetchrow(SESSION_ROWS, uuid.UUID(action_id))
    assert tuple(left) == (0, 0, 3, 300)


@pytest.mark.settings(lock_timeout_seconds=0.3)
async def test_a_refusal_answered_by_the_error_handler_keeps_its_request_id_and_status(
    state: AppState, admin: Caller, base_url: str, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """/metrics checks its token outside GraphQL: past the lock bound the refusal is answered
    by the app's error handler (409 CONFLICT), and, as every answer, it carries the request's
    X-Request-ID and is logged with the status the client got, not a 500 it never saw."""
    token = await token_for(state, admin, "watcher", EVERYTHING)
    lock = "SELECT FROM client_tokens WHERE token_hash = $1 FOR UPDATE"
    headers = {"authorization": f"Bearer {token}", "x-request-id": "metrics-at-the-bound"}
    caplog.set_level(logging.INFO, "app.access")
    async with (
        holding(db_url, lock, hash_token(token)),
        httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as http,
    ):
        answer = await http.get("/metrics")
    assert answer.status_code == 409, answer.text
    assert answer.json()["errors"][0]["extensions"]["code"] == "CONFLICT"
    assert answer.headers.get("x-request-id") == "metrics-at-the-bound"

    def logged() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "app.access" and r.getMessage().startswith("GET /metrics ")
        ]

    await eventually(logged, "the request's log line")
    assert logged()[0].startswith("GET /metrics 409 "), logged()


# A refusal whose words quote a row's values, as a server's may (a duplicate key's DETAIL
# `Key (x)=(...)`, a text that is no valid input): here a trigger's, raised with a SQLSTATE the
# service answers as a conflict (40001) or a lock bound (55P03), naming its table.
QUOTING = """
    CREATE OR REPLACE FUNCTION quoting() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'could not serialize access to %', to_jsonb(NEW)
            USING ERRCODE = TG_ARGV[0], DETAIL = format('Key (row)=(%s)', to_jsonb(NEW)),
                  TABLE = TG_TABLE_NAME;
    END $$;
"""


async def quoting(
    state: AppState, table: str, when: str, sqlstate: str = "40001", rows: str = "true"
) -> None:
    """The database refuses each `when` (BEFORE INSERT, say) on `table` of the `rows` it names
    in words that quote the row."""
    async with state.pool.acquire() as conn:
        await conn.execute(QUOTING)
        await conn.execute(
            f"CREATE TRIGGER quoting {when} ON {table} FOR EACH ROW WHEN ({rows}) "
            f"EXECUTE FUNCTION quoting('{sqlstate}')"
        )


def warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def logged_as_refused(said: list[str], sqlstate: str, table: str) -> None:
    """Each line names the refusal's SQLSTATE and table, and none quotes the row: its words
    may hold a tenant's data."""
    assert said and all(sqlstate in line and f'"{table}"' in line for line in said), said
    assert not [line for line in said if "secret" in line or "Key (" in line], said


async def test_a_refusal_at_the_edge_is_logged_by_its_sqlstate_not_its_words(
    state: AppState, admin: Caller, base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The token check of /metrics, /graphql and /mcp (app/main.py, app/mcp/endpoint.py),
    refused as it writes the token's last use: answered CONFLICT, each logged once."""
    action_id = await make_agent_id(state, admin)
    token = await token_for(state, admin, "secret-watcher", EVERYTHING)
    await quoting(state, "client_tokens", "BEFORE UPDATE")
    headers = {"authorization": f"Bearer {token}"}
    with caplog.at_level(logging.WARNING):
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as http:
            answers = [
                await http.get("/metrics"),
                await http.post("/graphql", json={"query": "{ __typename }"}),
                await http.post(mcp_url("", action_id), json={"jsonrpc": "2.0", "id": 1}),
            ]
    assert [a.status_code for a in answers] == [409, 409, 409], [a.text for a in answers]
    said = warned(caplog)
    assert len(said) == 3, said
    logged_as_refused(said, "40001", "client_tokens")


async def test_a_refusal_within_graphql_or_an_mcp_call_is_logged_by_its_sqlstate_not_its_words(
    state: AppState, gql, admin: Caller, base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A record written by an operator (GraphQL's `rolled back at`) or an MCP call (`tool call
    refused by the database`), refused as its execution starts: the row quoted holds the
    record's text."""
    action_id = await make_agent_id(state, admin, harness=full_memory())
    token = await token_for(state, admin, "client", EVERYTHING)
    await quoting(state, "executions", "BEFORE INSERT")
    note = {"summary": "Ada's secret diagnosis", "kind": "fact"}
    with caplog.at_level(logging.WARNING):
        added = await gql(admin, ADD, a=action_id, i={**note, "scope": "AGENT"})
        async with mcp_session(mcp_url(base_url, action_id), token) as client:
            body = await refused(client, "add_memory", **note, scope="agent")
    assert added.codes == ["CONFLICT"] and body["code"] == "CONFLICT", (added.errors, body)
    said = warned(caplog)
    assert len(said) == 2, said
    logged_as_refused(said, "40001", "executions")


async def test_a_turn_refused_by_the_database_is_logged_by_its_sqlstate_not_its_words(
    state: AppState, gql, admin: Caller, model_server: OpenAIServer, caplog
) -> None:
    """Its transcript's write past a lock bound (55P03): the turn fails, and its line names
    the refusal, not the transcript it quotes (the turn's input)."""
    action_id = await make_agent_id(state, admin)
    model_server.say("Your secret is safe.")
    # Its failure's own record is let through.
    await quoting(state, "transcript_events", "BEFORE INSERT", "55P03", "NEW.type <> 'turn.failed'")
    with caplog.at_level(logging.WARNING):
        failed = await run(gql, admin, action_id, "keep my secret")
    assert failed["status"] == "FAILED"
    said = [line for line in warned(caplog) if "failed" in line]
    assert len(said) == 1, warned(caplog)
    logged_as_refused(said, "55P03", "transcript_events")
