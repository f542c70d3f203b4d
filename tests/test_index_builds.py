"""Own search indexes built soon after a write takes an agent or a session past its threshold
(app/memory/maintenance.py IndexBuilds), without waiting for a maintenance round.

M20 (search combines meaning and words, at any size): until a large agent has its own
indexes, it is ranked by scoring every record, which grows with the agent. The tests lower
the thresholds so that tens of records count as large; the fixtures run no rounds
(`search_maintenance_seconds` 0), so every index here was built on a write.
"""

import asyncio
import logging
import uuid
from typing import Any

import asyncpg
import pytest
from factories import full_memory, make_agent, make_agent_id
from helpers import GQL, eventually
from openai_server import OpenAIServer
from runtime_support import run, tool_runs

from app.auth.caller import Caller
from app.db import hnsw
from app.history import indexes as history_indexes
from app.memory import maintenance
from app.memory import search as search_module
from app.memory.search_store import Filters
from app.memory.visibility import OperatorReader
from app.state import AppState

BULK = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { memoryIds } }"""
ADD = """mutation($a: UUID!, $i: AgentMemoryInput!) {
  addAgentMemory(actionId: $a, input: $i) { memoryId } }"""
TOPICS = ["dogs and cats", "train timetables", "quarterly revenue", "mountain hiking", "jazz"]


def inputs(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"summary": f"Note {i} about {TOPICS[i % len(TOPICS)]}", "kind": "fact"}
        for i in range(start, start + n)
    ]


async def add_many(gql: GQL, admin: Caller, action_id: uuid.UUID, n: int, start: int = 0) -> None:
    (await gql(admin, BULK, a=str(action_id), inputs=inputs(n, start))).ok()


def builds(state: AppState) -> maintenance.IndexBuilds:
    return state.services[maintenance.SEARCH_MAINTENANCE].builds


async def index_oids(pool: asyncpg.Pool, account_id: uuid.UUID, action_id: uuid.UUID) -> list[Any]:
    """The agent's own indexes (None where missing): an index built again has another oid."""
    names = maintenance.index_names(account_id, action_id)
    return [await pool.fetchval("SELECT to_regclass($1)::oid", name) for name in names]


async def listed(pool: asyncpg.Pool, action_id: uuid.UUID) -> bool:
    return bool(
        await pool.fetchval("SELECT count(*) FROM agent_indexes WHERE action_id = $1", action_id)
    )


async def plan(state: AppState, account_id: uuid.UUID, action_id: uuid.UUID) -> str:
    assert state.embedder is not None
    query = "hiking in the mountains"
    vector = (await state.embedder.embed([query])).vectors[0]
    ranking = search_module.make_ranking("hybrid", query, vector, None, 5)
    reader = OperatorReader(account_id, action_id)
    found, chosen = await search_module.ranked(state.pool, reader, Filters(), ranking)
    assert found
    return chosen


@pytest.mark.settings(agent_index_min_records=30)
async def test_m20_an_agent_written_past_the_threshold_gets_its_own_indexes_at_once(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    one_call, by_steps = await make_agent(state, admin), await make_agent(state, admin)
    account_id = admin.account_id
    # One addAgentMemories call takes the first past 30 records.
    await add_many(gql, admin, one_call.action_id, 40)
    await eventually(lambda: listed(state.pool, one_call.action_id), "indexes after a bulk add")
    assert None not in await index_oids(state.pool, account_id, one_call.action_id)
    assert await plan(state, account_id, one_call.action_id) == "index"

    # The second: 29 records leave it under the threshold, exact; one more addAgentMemory
    # takes it past.
    await add_many(gql, admin, by_steps.action_id, 29)
    await builds(state).settle()
    assert not await listed(state.pool, by_steps.action_id)
    assert await index_oids(state.pool, account_id, by_steps.action_id) == [None, None]
    assert await plan(state, account_id, by_steps.action_id) == "exact"
    one = {"summary": "Went mountain hiking in the rain", "kind": "fact"}
    (await gql(admin, ADD, a=str(by_steps.action_id), i=one)).ok()
    await eventually(lambda: listed(state.pool, by_steps.action_id), "indexes after one more")
    built = await index_oids(state.pool, account_id, by_steps.action_id)
    assert None not in built
    assert await plan(state, account_id, by_steps.action_id) == "index"

    # Writes past the threshold again build nothing again: the same indexes stay.
    for start in (30, 40):
        await add_many(gql, admin, by_steps.action_id, 10, start)
        (await gql(admin, ADD, a=str(by_steps.action_id), i=one)).ok()
    await builds(state).settle()
    assert await index_oids(state.pool, account_id, by_steps.action_id) == built


@pytest.mark.settings(agent_index_min_records=3)
async def test_m20_an_agent_saving_records_in_its_turns_gets_its_own_indexes(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(state, admin, harness=full_memory(tools=["add_memory"]))
    await add_many(gql, admin, uuid.UUID(action_id), 2)
    await builds(state).settle()
    assert not await listed(state.pool, uuid.UUID(action_id))
    # The turn's add_memory is staged; its commit takes the agent to 3 records.
    model_server.call_tools(("add_memory", {"summary": "Ada likes jazz", "kind": "fact"}))
    model_server.say("Saved.")
    executed = await run(gql, admin, action_id, "remember: Ada likes jazz")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert "error" not in tool_runs(executed, "add_memory")[0]
    await eventually(lambda: listed(state.pool, uuid.UUID(action_id)), "indexes after a turn")
    assert await plan(state, admin.account_id, uuid.UUID(action_id)) == "index"


@pytest.mark.settings(agent_index_min_records=30, agent_index_max_agents=1)
async def test_m20_an_agent_beyond_the_cap_stays_exact_until_a_round(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    first, second = await make_agent(state, admin), await make_agent(state, admin)
    await add_many(gql, admin, first.action_id, 40)
    await eventually(lambda: listed(state.pool, first.action_id), "the first agent's indexes")
    await add_many(gql, admin, second.action_id, 50)
    await builds(state).settle()
    assert not await listed(state.pool, second.action_id)
    assert await plan(state, admin.account_id, second.action_id) == "exact"


async def test_m20_one_builder_at_a_time_and_a_busy_lock_is_tried_again(
    state: AppState, admin: Caller, gql: GQL, caplog: pytest.LogCaptureFixture
) -> None:
    agent = await make_agent(state, admin)
    await add_many(gql, admin, agent.action_id, 40)  # under the default threshold: nothing
    await builds(state).settle()
    assert not await listed(state.pool, agent.action_id)
    mine = maintenance.IndexBuilds(
        state.pool,
        min_records=30,
        max_agents=None,
        min_parts=None,
        max_sessions=None,
        retry_seconds=0.05,
    )
    key = (admin.account_id, agent.action_id)
    async with state.pool.acquire() as holder:
        # Another process's round (or build) holds the lock: this one builds nothing meanwhile.
        await holder.execute(f"SELECT pg_advisory_lock({maintenance.ROUND_LOCK})")
        mine.wrote(key, 40)
        mine.wrote(key, 1)  # one check in flight per agent
        assert list(mine._tasks) == [key]
        with caplog.at_level(logging.INFO, logger=maintenance.__name__):
            await asyncio.sleep(0.3)  # several tries
        assert not await listed(state.pool, agent.action_id)
        waits = [r for r in caplog.records if "another process is running" in r.getMessage()]
        assert len(waits) == 1 and str(agent.action_id) in waits[0].getMessage()  # said once
        await holder.execute(f"SELECT pg_advisory_unlock({maintenance.ROUND_LOCK})")
    await asyncio.wait_for(mine.settle(), 30)
    assert await listed(state.pool, agent.action_id)
    built = await index_oids(state.pool, admin.account_id, agent.action_id)
    mine.wrote(key, 1)  # known to have its indexes: not even counted until the next round
    await mine.settle()
    assert await index_oids(state.pool, admin.account_id, agent.action_id) == built
    held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    assert await state.pool.fetchval(held) == 0


@pytest.mark.settings(agent_index_min_records=30)
async def test_m20_the_service_stops_cleanly_with_a_build_in_flight(
    gql: GQL, admin: Caller, state: AppState, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = await make_agent(state, admin)
    blocker = await asyncpg.connect(db_url)
    try:
        # A lock CREATE INDEX CONCURRENTLY waits on: the build stays in flight.
        await blocker.execute("BEGIN; LOCK TABLE agent_memories IN SHARE UPDATE EXCLUSIVE MODE")
        await add_many(gql, admin, agent.action_id, 40)
        waiting = (
            "SELECT count(*) > 0 FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND query LIKE 'CREATE INDEX CONCURRENTLY%'"
        )
        await eventually(lambda: state.pool.fetchval(waiting), "a build waiting on the lock")
        await asyncio.wait_for(state.services[maintenance.SEARCH_MAINTENANCE].aclose(), 10)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # not failed
        assert not builds(state)._tasks
        # The build was cancelled in the server too, and the round's lock let go.
        assert not await state.pool.fetchval(waiting)
        held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        assert await state.pool.fetchval(held) == 0
        await blocker.execute("COMMIT")
    finally:
        await blocker.close()
    # Its writes no longer start builds; the next round replaces what the cancelled one left.
    assert not await listed(state.pool, agent.action_id)
    done = await maintenance.run_round(state.pool, 30)
    assert done is not None and done.failed == []
    assert await listed(state.pool, agent.action_id)


@pytest.mark.usefixtures("model_server")
@pytest.mark.settings(history_index_min_parts=3)
async def test_h6_a_session_written_past_the_threshold_gets_its_own_index_at_once(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    action_id = await make_agent_id(state, admin, harness={"history": {"index": "messages"}})
    key = (admin.account_id, uuid.UUID(action_id), "s1")
    name = history_indexes.index_name(key)
    exists = "SELECT count(*) > 0 FROM pg_class WHERE relname = $1"
    parts = "SELECT count(*) FROM history_parts WHERE session_id = 's1'"
    assert (await run(gql, admin, action_id, "The boat is at pier seven."))["status"] == (
        "SUCCEEDED"
    )
    await builds(state).settle()
    assert await state.pool.fetchval(parts) < 3
    assert not await state.pool.fetchval(exists, name)
    assert (await run(gql, admin, action_id, "Lunch was tomato soup."))["status"] == "SUCCEEDED"
    assert await state.pool.fetchval(parts) >= 3
    await eventually(lambda: state.pool.fetchval(exists, name), "the session's own index")
    await builds(state).settle()
    valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)"
    assert await state.pool.fetchval(valid, name) is True
    # Another session of the agent, still small: none.
    await run(gql, admin, action_id, "Rain.", session="s2")
    await builds(state).settle()
    own = "SELECT count(*) FROM pg_class WHERE relname LIKE 'history\\_parts\\_vectors\\_%'"
    assert await state.pool.fetchval(own) == 1


@pytest.mark.usefixtures("model_server")
@pytest.mark.settings(history_index_min_parts=3, history_index_max_sessions=2)
async def test_h6_leftover_indexes_hold_no_place_against_a_session_written_past_the_threshold(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    """A write's build counts the sessions holding a place of ENGRAM_HISTORY_INDEX_MAX_SESSIONS
    as a round does. It counted every index of the naming: a replacement an interrupted build
    left beside a session's index (NEXT) and the index of a session no longer there each held
    one until the next round dropped them, and the new session waited for that round (up to
    ENGRAM_SEARCH_MAINTENANCE_SECONDS), searched without its own index meanwhile."""
    action_id = await make_agent_id(state, admin, harness={"history": {"index": "messages"}})

    async def indexed_once_written(session: str) -> bool:
        for message in ("The boat is at pier seven.", "Lunch was tomato soup."):
            turn = await run(gql, admin, action_id, message, session=session)
            assert turn["status"] == "SUCCEEDED"
        await builds(state).settle()
        name = history_indexes.index_name((admin.account_id, uuid.UUID(action_id), session))
        valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)"
        return await state.pool.fetchval(valid, name) is True

    assert await indexed_once_written("s1")
    s1 = history_indexes.index_name((admin.account_id, uuid.UUID(action_id), "s1"))
    gone = (admin.account_id, uuid.uuid4(), "gone")  # a session no longer there
    leftovers = [f"{s1}{hnsw.NEXT}", history_indexes.index_name(gone)]
    for name in leftovers:
        # A CREATE INDEX CONCURRENTLY that fails (here unique over duplicates) leaves its
        # index, invalid.
        with pytest.raises(asyncpg.UniqueViolationError):
            await state.pool.execute(
                f"CREATE UNIQUE INDEX CONCURRENTLY {name} ON history_parts (session_id)"
            )
    assert await indexed_once_written("s2")
    # A round counts the same: it keeps both, drops the leftovers and builds nothing.
    done = await maintenance.run_round(state.pool, 10**9, min_parts=3, max_sessions=2)
    assert done is not None and done.built == [] and sorted(done.dropped) == sorted(leftovers)


async def test_m20_a_failed_build_waits_for_the_next_round_and_memory_is_bounded(
    state: AppState, admin: Caller, gql: GQL, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await make_agent(state, admin)
    await add_many(gql, admin, agent.action_id, 40)
    key = (admin.account_id, agent.action_id)
    # maintenance_work_mem beyond the server's range: every build fails in the database.
    failing = maintenance.IndexBuilds(
        state.pool,
        min_records=30,
        max_agents=None,
        min_parts=None,
        max_sessions=None,
        build_memory="3000GB",
    )
    failing.wrote(key, 40)
    await failing.settle()
    assert not await listed(state.pool, agent.action_id)
    # Not tried again at each write (each try would hold the rounds' lock): after a round.
    failing.wrote(key, 1)
    assert not failing._tasks
    failing.forget()
    failing.wrote(key, 1)
    assert list(failing._tasks) == [key]
    await failing.settle()
    assert (
        await state.pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    )

    # What it remembers between rounds is bounded: past MAX_KEYS keys it starts afresh.
    monkeypatch.setattr(maintenance, "MAX_KEYS", 2)
    small = maintenance.IndexBuilds(
        state.pool, min_records=10**6, max_agents=None, min_parts=None, max_sessions=None
    )
    for _ in range(5):
        small.wrote((admin.account_id, uuid.uuid4()), 1)
        await small.settle()
        assert len(small._counted) + len(small._settled) <= 2
