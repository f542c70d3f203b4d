"""Search upkeep (app/memory/maintenance.py): large agents' own indexes, and their word counts.

M20 (search combines meaning and words) has to hold at any size: an agent large enough gets
its own HNSW and GIN indexes, the planner uses them for that agent's searches, and the
results equal the exact plan's. The threshold is lowered so that tens of records count as
large.
"""

import asyncio
import logging
import math
import re
import threading
import uuid
from dataclasses import replace
from typing import Any

import asyncpg
import numpy as np
import pytest
from factories import Capture, SearchAgent, make_search_agent
from helpers import eventually
from pydantic import ValidationError

from app import cli
from app.auth.caller import Caller
from app.config import Settings
from app.db import hnsw
from app.db.pool import create_pool, session_changed
from app.embeddings import reembed as reembed_module
from app.embeddings import store as embedding_store
from app.embeddings.setup import ensure_model
from app.memory import maintenance, search_store
from app.memory import search as search_module
from app.memory.search_store import Filters, Ranking
from app.memory.vectors import VECTOR_COLUMNS
from app.memory.visibility import Reader
from app.services import start_services
from app.state import AppState

TOPICS = ["dogs and cats", "train timetables", "quarterly revenue", "mountain hiking", "jazz"]


async def fill(agent: SearchAgent, count: int) -> list[uuid.UUID]:
    return [
        await agent.add(f"Note {i} about {TOPICS[i % len(TOPICS)]}", f"detail {i}")
        for i in range(count)
    ]


async def index_exists(pool: asyncpg.Pool, name: str) -> bool:
    return bool(await pool.fetchval("SELECT to_regclass($1) IS NOT NULL", name))


async def built_over(pool: asyncpg.Pool, name: str) -> str | None:
    """The HNSW index's comment (hnsw.note_built), "in its file" where it names the
    index's file now."""
    said, file = await pool.fetchrow(
        "SELECT obj_description(oid, 'pg_class'), relfilenode FROM pg_class WHERE relname = $1",
        name,
    )
    return said and said.replace(f" in file {file}", " in its file")


async def ranking(agent: SearchAgent, query: str, mode: str = "hybrid") -> search_store.Ranking:
    vector = (await agent.state.embedder.embed([query])).vectors[0]
    return search_module.make_ranking(mode, query, vector, None, 5)


async def index_plan_uses(agent: SearchAgent, query: str) -> str:
    """The index plan's query for `query`, EXPLAINed in the transaction that ran it."""
    r = await ranking(agent, query)
    async with agent.state.pool.acquire() as conn, conn.transaction(readonly=True):
        # Tens of rows are read and sorted fastest in full; at scale the indexes win.
        await conn.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
        capture = Capture(conn)
        records = await search_store.listed_records(conn, agent.operator)
        await search_store.ranked_index(capture, agent.operator, Filters(), r, records)
        rows = await conn.fetch("EXPLAIN " + capture.sql[0], *capture.sql[1:])
    return "\n".join(r[0] for r in rows)


async def test_m20_large_agent_gets_own_indexes_that_the_planner_uses(
    state: AppState, admin: Caller
) -> None:
    large, small = await make_search_agent(state, admin), await make_search_agent(state, admin)
    await fill(large, 120)
    await fill(small, 10)
    await state.pool.execute("ANALYZE agent_memories")
    query = "hiking in the mountains"
    before = await search_module.ranked(
        state.pool, large.operator, Filters(), await ranking(large, query, "vector"), "exact"
    )

    done = await maintenance.run_round(state.pool, min_records=100)
    assert done is not None and done.dropped == [] and done.failed == []
    vectors, words = maintenance.index_names(large.account_id, large.action_id)
    assert sorted(done.built) == sorted([vectors, words])
    assert await index_exists(state.pool, vectors) and await index_exists(state.pool, words)
    small_names = maintenance.index_names(small.account_id, small.action_id)
    assert not any([await index_exists(state.pool, n) for n in small_names])

    # The agent's HNSW index serves its vector candidates (its GIN index is chosen by cost: at
    # tens of rows the btree wins; at 200,000 records it is used, bench/README.md).
    plan = await index_plan_uses(large, query)
    assert vectors in plan
    assert vectors not in await index_plan_uses(small, query)
    # An agent with its own indexes takes the index plan without counting its rows; its
    # vector top-5 (from 40 candidates of 120 records) is the exact plan's.
    after = await search_module.ranked(
        state.pool, large.operator, Filters(), await ranking(large, query, "vector")
    )
    assert after[1] == "index"
    assert [r.memory_id for r in after[0]] == [r.memory_id for r in before[0]]
    # A label or ID filter may leave few rows: those searches still count them.
    narrowed = await search_module.ranked(
        state.pool, large.operator, Filters(labels={5: "x"}), await ranking(large, query)
    )
    assert narrowed == ([], "exact")

    again = await maintenance.run_round(state.pool, min_records=100)
    assert again is not None and again.built == [] and again.dropped == []


def literal(value: Any) -> str:
    """An SQL literal for a search parameter (to EXECUTE a prepared statement by hand)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, np.ndarray):
        return "'[" + ",".join(repr(float(x)) for x in value) + "]'"
    return "'" + str(value).replace("'", "''") + "'"


async def cached_statements(conn: asyncpg.Connection, marker: str) -> list[asyncpg.Record]:
    """The connection's prepared statements whose text holds `marker`, with their plan counts.
    The marker goes as a parameter, so this query's own text (also prepared) does not hold it."""
    return await conn.fetch(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE strpos(statement, $1) > 0",
        marker,
    )


async def test_m20_a_large_agent_searches_its_own_indexes_on_a_cached_plan(
    db_url: str, state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await make_search_agent(state, admin)
    await fill(agent, 120)
    await state.pool.execute("ANALYZE agent_memories")
    await maintenance.run_round(state.pool, min_records=100)
    vectors, _ = maintenance.index_names(agent.account_id, agent.action_id)
    r = await ranking(agent, "hiking in the mountains", "vector")
    exact, _ = await search_module.ranked(state.pool, agent.operator, Filters(), r, "exact")

    captured: list[tuple[Any, ...]] = []
    ranked_index = search_store.ranked_index

    async def capture(conn: Any, *args: Any, **kwargs: Any) -> Any:
        wrapper = Capture(conn)
        found = await ranked_index(wrapper, *args, **kwargs)
        captured.append(wrapper.sql)
        return found

    monkeypatch.setattr(search_store, "ranked_index", capture)
    pool = await create_pool(db_url, min_size=1, max_size=1)  # one connection: one cache
    try:
        # The exact plan's statement finds the agent listed and reads nothing (the first
        # search; the next run the index statement alone); the index plan finds the exact
        # plan's top 5 (40 candidates of 120 records).
        for _ in range(8):
            found, plan = await search_module.ranked(pool, agent.operator, Filters(), r)
            assert plan == "index" and [x.memory_id for x in found] == [x.memory_id for x in exact]
        # After five runs the statement's plan is cached, generic, and still reads the
        # agent's own HNSW index: the statement names the agent's key as constants.
        sql, *args = captured[-1]
        assert f"'{agent.action_id}'::uuid" in sql
        async with pool.acquire() as conn:
            cached = await conn.fetchval(
                "SELECT max(generic_plans) FROM pg_prepared_statements WHERE statement = $1", sql
            )
            assert cached >= 1
            await conn.execute(f"PREPARE probe AS {sql}")
            # As index_plan_uses: at 120 rows a scan and a sort would win the cost comparison.
            session_changed(conn)  # the session's settings: the pool resets them on release
            await conn.execute(
                "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off;"
                " SET enable_sort = off"
            )
            plan_rows = await conn.fetch(
                f"EXPLAIN EXECUTE probe({', '.join(literal(a) for a in args)})"
            )
            assert vectors in "\n".join(row[0] for row in plan_rows)
            await conn.execute("DEALLOCATE probe")

        # Unlisted (a round dropping its indexes): the very next search ranks it exactly, as
        # its statement finds it unlisted (what the process remembers is only checked).
        await state.pool.execute("DELETE FROM agent_indexes")
        assert (await search_module.ranked(pool, agent.operator, Filters(), r))[1] == "exact"
        # A deeper page (30: ef_search 120) sets a larger ef_search for its own statement's
        # transaction only: the connection keeps its default after it.
        wide = search_module.make_ranking("vector", r.text or "", r.vector, None, 30)
        assert wide.ef_search > search_module.EF_SEARCH
        await maintenance.run_round(state.pool, min_records=100)
        assert (await search_module.ranked(pool, agent.operator, Filters(), wide))[1] == "index"
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW hnsw.ef_search") == str(search_module.EF_SEARCH)
            assert await conn.fetchval("SHOW hnsw.iterative_scan") == "relaxed_order"
    finally:
        await pool.close()


async def test_m20_one_statement_searches_keep_the_readers_view(
    db_url: str, state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # M20 and the visibility rules on the index plan, for an agent reader and every mode: the
    # same records before and after the statement's plan is cached, none hidden. (The turn
    # sees few rows, which would be ranked over its scopes: not here.)
    monkeypatch.setattr(search_module, "SCOPED_MAX_ROWS", 0)
    agent = await make_search_agent(state, admin)
    await fill(agent, 120)
    text = "hiking in the mountains"
    hidden = [
        await agent.add(f"{text} in session two", scope="SESSION", session_id="s2"),
        await agent.add(f"{text}, a preview", preview=True),
        await agent.add(f"{text}, deleted", status="DELETED"),
    ]
    mine = await agent.add(f"{text} in my session", scope="SESSION", session_id="s1")
    await state.pool.execute("ANALYZE agent_memories")
    await maintenance.run_round(state.pool, min_records=100)
    reader = agent.reader(session="s1")
    pool = await create_pool(db_url, min_size=1, max_size=1)
    try:
        for mode in ("hybrid", "lexical", "vector"):
            r = await ranking(agent, text, mode)
            runs = [await search_module.ranked(pool, reader, Filters(), r) for _ in range(7)]
            assert all(run == runs[0] for run in runs) and runs[0][1] == "index"
            found = [record.memory_id for record in runs[0][0]]
            assert mine in found and not set(hidden) & set(found), mode
    finally:
        await pool.close()


async def test_m20_a_listed_agent_is_searched_by_one_statement_that_checks_its_plan(
    db_url: str, state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An agent found listed is remembered: its next search runs the index statement at once,
    # without the exact statement's gate. That statement checks the listing (and, for a turn
    # reading agent scope, its scopes' counts) itself: where the plan no longer holds it reads
    # none of the agent's records, and the gate decides as for any agent, so the page is never
    # a stale plan's.
    agent = await make_search_agent(state, admin)
    ids = await fill(agent, 120)
    await maintenance.run_round(state.pool, min_records=100)
    calls: list[tuple[str, Any]] = []
    ranked_exact, ranked_index = search_store.ranked_exact, search_store.ranked_index

    async def exact(*args: Any, **kwargs: Any) -> Any:
        found = await ranked_exact(*args, **kwargs)
        calls.append(("exact", found[1]))
        return found

    async def index(conn: Any, *args: Any, **kwargs: Any) -> Any:
        capture = Capture(conn)
        found = await ranked_index(capture, *args, **kwargs)
        calls.append(("index", found[0] is not None and found[1]))  # False: the check failed
        if found[0] is None:
            await reads_no_record(conn, *capture.sql)
        return found

    async def reads_no_record(conn: Any, sql: str, *values: Any) -> None:
        """Every scan of the table ran no loop, but the join of the (empty) page's records
        and a turn's session rows read for its words' weights (the pool decodes json)."""
        (explained,) = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *values)
        nodes, read = [explained["Plan"]], []
        while nodes:
            node = nodes.pop()
            if node.get("Subplan Name") == "CTE own":
                continue
            nodes += node.get("Plans", [])
            page = node.get("Index Name") == "agent_memories_pkey" and "Filter" not in node
            if node.get("Relation Name") == "agent_memories" and not page:
                read.append(node["Actual Loops"])
        assert read and set(read) == {0}

    monkeypatch.setattr(search_store, "ranked_exact", exact)
    monkeypatch.setattr(search_store, "ranked_index", index)
    turn = agent.reader(execution_id=uuid.uuid4())
    pool = await create_pool(db_url, min_size=1, max_size=4)
    try:

        async def statements(
            reader: Reader,
            mode: str = "hybrid",
            on: asyncpg.Pool | None = None,
            filters: Filters | None = None,
        ) -> list[tuple[str, Any]]:
            calls.clear()
            filters = filters or Filters()
            r = await ranking(agent, "hiking in the mountains", mode)
            found, plan = await search_module.ranked(on or pool, reader, filters, r)
            made = [*calls, ("plan", plan)]
            exact_page, _ = await search_module.ranked(on or pool, reader, filters, r, "exact")
            assert [(x.memory_id, x.score) for x in found] == [
                (x.memory_id, x.score) for x in exact_page
            ]
            return made

        listed = [("index", 120), ("plan", "index")]
        assert await statements(agent.operator) == [("exact", 120), *listed]
        for mode in ("hybrid", "lexical", "vector"):
            assert await statements(agent.operator, mode) == listed
        # Searches at once each find it remembered.
        calls.clear()
        r = await ranking(agent, "hiking in the mountains")
        pages = await asyncio.gather(
            *(search_module.ranked(pool, agent.operator, Filters(), r) for _ in range(4))
        )
        assert {plan for _, plan in pages} == {"index"} and calls == [("index", 120)] * 4
        # Remembered by pool (a process may serve several databases). Label filters and a
        # reader of one session alone count their rows first, whatever is remembered.
        assert await statements(agent.operator, on=state.pool) == [("exact", 120), *listed]
        labelled = Filters(labels={5: "x"})
        assert await statements(agent.operator, filters=labelled) == [
            ("exact", None),
            ("plan", "exact"),
        ]
        alone = agent.reader(scopes=("session",), execution_id=uuid.uuid4())
        assert (await statements(alone))[0] == ("exact", None)
        # A turn reading agent scope is remembered apart: its scopes' counts decide too. Once
        # they count few enough for it to be ranked over them, its statement finds that and
        # reads nothing, and the gate sends it to its scopes (the gate's statement, then the
        # one over the scopes), in every mode.
        by_scope = [("exact", None), ("exact", None), ("plan", "exact")]
        for mode in ("hybrid", "lexical", "vector"):
            monkeypatch.setattr(search_module, "SCOPED_MAX_ROWS", 10)  # its 120: too many
            await statements(turn, mode)
            assert await statements(turn, mode) == listed
            monkeypatch.setattr(search_module, "SCOPED_MAX_ROWS", 500)
            assert await statements(turn, mode) == [("index", False), *by_scope]
            assert await statements(turn, mode) == by_scope
        # Unlisted by a round of another pool (as by another process): the same.
        await state.pool.execute("DELETE FROM agent_memories WHERE memory_id = any($1)", ids[:80])
        done = await maintenance.run_round(state.pool, min_records=100)
        assert len(done.dropped) == 2
        ranked = [("exact", None), ("plan", "exact")]
        assert await statements(agent.operator) == [("index", False), *ranked]
        assert await statements(agent.operator) == ranked
    finally:
        await pool.close()


async def test_m20_an_agent_unlisted_after_its_gate_is_ranked_exactly(
    state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A round may unlist an agent, and drop its indexes, between the exact statement's gate,
    # which found it listed, and the index statement. That statement checks the listing, under
    # label or ID filters too, and reads none of the agent's records: the agent is then ranked
    # exactly, not by an index plan without its indexes (no index holds every agent's words,
    # migration 0034: each of its word tiers would read the agent's rows). A turn whose scopes
    # the upkeep counted few, but hold more since, is still ranked by the index plan.
    monkeypatch.setattr(search_module, "_LISTED", {})
    monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 10)
    monkeypatch.setattr(search_module, "SCOPED_MAX_ROWS", 130)
    agent = await make_search_agent(state, admin)
    await fill(agent, 100)
    for i in range(20):
        await agent.add(f"Note {i} about mountain hiking, labelled", labels={5: "x"})
    names = maintenance.index_names(agent.account_id, agent.action_id)
    calls: list[tuple[str, Any]] = []
    race = False
    ranked_exact, ranked_index = search_store.ranked_exact, search_store.ranked_index

    async def exact(*args: Any, **kwargs: Any) -> Any:
        nonlocal race
        found = await ranked_exact(*args, **kwargs)
        calls.append(("exact", found[1]))
        if race and found[0] is None:
            race = False  # a round of another connection, as of another process
            done = await maintenance.run_round(state.pool, min_records=1000)
            assert sorted(done.dropped) == sorted(names)
        return found

    async def index(*args: Any, **kwargs: Any) -> Any:
        found = await ranked_index(*args, **kwargs)
        calls.append(("index", found[0] is not None and found[1]))  # False: the check failed
        return found

    monkeypatch.setattr(search_store, "ranked_exact", exact)
    monkeypatch.setattr(search_store, "ranked_index", index)

    async def statements(reader: Reader, filters: Filters, unlisted: bool) -> list[Any]:
        """Each mode's statements: the agent listed, then (with `unlisted`) unlisted by a round
        right after the gate; the page the exact plan's."""
        nonlocal race
        made = []
        for mode in ("hybrid", "lexical", "vector"):
            if unlisted:
                await maintenance.run_round(state.pool, min_records=100)
                assert await index_exists(state.pool, names[1])
            search_module._LISTED.clear()
            calls.clear()
            race = unlisted
            r = await ranking(agent, "hiking in the mountains", mode)
            found, plan = await search_module.ranked(state.pool, reader, filters, r)
            made.append([*calls, ("plan", plan)])
            race = False
            exact_page, _ = await search_module.ranked(state.pool, reader, filters, r, "exact")
            assert [(x.memory_id, x.score) for x in found] == [
                (x.memory_id, x.score) for x in exact_page
            ]
        assert all(m == made[0] for m in made), made
        return made[0]

    checked, unlisted = ("index", False), [("exact", None), ("plan", "exact")]
    for filters in (Filters(), Filters(labels={5: "x"})):  # 20 rows hold the label: too many
        assert await statements(agent.operator, filters, True) == [
            ("exact", 120),
            checked,
            *unlisted,
        ]
    # A turn reading agent scope: the upkeep counted 120 records in its scopes (at most 130:
    # ranked over them), which hold 140 since. Its statement finds too few counted, and the
    # index plan ranks it, the listing alone checked.
    await maintenance.run_round(state.pool, min_records=100)
    await fill(agent, 20)
    turn = agent.reader(execution_id=uuid.uuid4())
    assert await statements(turn, Filters(), False) == [
        ("exact", 120),
        ("exact", 120),
        checked,
        ("index", 120),
        ("plan", "index"),
    ]


async def test_listed_agents_remembered_are_at_most_max_listed(
    state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each listed agent searched is remembered (with each session of its turns reading agent
    # scope): a process serving many agents holds at most MAX_LISTED, the least recently used
    # going first, rather than one entry for every agent it ever searched.
    agents = [await make_search_agent(state, admin) for _ in range(4)]
    for agent in agents:
        await fill(agent, 101)
    await maintenance.run_round(state.pool, min_records=100)
    monkeypatch.setattr(search_module, "_LISTED", {})
    monkeypatch.setattr(search_module, "MAX_LISTED", 2)
    for agent in agents:
        r = await ranking(agent, "hiking in the mountains")
        found, plan = await search_module.ranked(state.pool, agent.operator, Filters(), r)
        assert found and plan == "index"
        assert len(search_module._LISTED) <= 2
    assert [key[2] for key in search_module._LISTED] == [a.action_id for a in agents[2:]]


async def test_m20_the_exact_plan_runs_on_a_cached_generic_plan(
    db_url: str, state: AppState, admin: Caller
) -> None:
    agents = [await make_search_agent(state, admin) for _ in range(3)]
    for agent in agents:
        await fill(agent, 10)
    pool = await create_pool(db_url, min_size=1, max_size=1)

    async def plans() -> tuple[int, int]:
        async with pool.acquire() as conn:
            (row,) = await cached_statements(conn, "WITH gate AS MATERIALIZED")
            assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
        # The key hidden from the planner (search_store.OpaqueKey): at scale a custom plan that
        # saw it looked cheaper, and `auto` planned every search (here the agents are alike).
        assert "account_id = (SELECT $1::uuid)" in row["statement"]
        assert "action_id = (SELECT $2::uuid)" in row["statement"]
        return row["generic_plans"], row["custom_plans"]

    try:
        # One statement chooses the plan and ranks, the same for every agent: `auto` plans
        # its first five runs, then keeps the generic plan, as the agent's key, hidden from the
        # planner, leaves a custom plan no cheaper.
        found = []
        for agent in agents * 4:
            r = await ranking(agent, "train timetables")
            found.append(await search_module.ranked(pool, agent.operator, Filters(), r))
        assert [plan for _, plan in found] == ["exact"] * 12 and all(rows for rows, _ in found)
        assert found[3:6] == found[:3] and found[6:9] == found[:3] and found[9:] == found[:3]
        assert await plans() == (12 - 5, 5)
    finally:
        await pool.close()


async def test_m20_indexes_go_when_the_agent_shrinks_and_come_back_when_lost(
    state: AppState, admin: Caller
) -> None:
    agent = await make_search_agent(state, admin)
    ids = await fill(agent, 40)
    names = maintenance.index_names(agent.account_id, agent.action_id)
    assert sorted((await maintenance.run_round(state.pool, 30)).built) == sorted(names)

    # One index lost (dropped by hand): rebuilt; its partner is left alone.
    await state.pool.execute(f"DROP INDEX {names[1]}")
    done = await maintenance.run_round(state.pool, 30)
    assert done.dropped == [] and done.built == [names[1]]
    assert await index_exists(state.pool, names[1])

    # Under half the threshold: unlisted and its indexes dropped by the same round (searches
    # read `agent_indexes` in the statement that ranks them, so none uses a dropped index).
    await state.pool.execute("DELETE FROM agent_memories WHERE memory_id = any($1)", ids[:30])
    done = await maintenance.run_round(state.pool, 30)
    assert sorted(done.dropped) == sorted(names) and done.built == []
    assert not any([await index_exists(state.pool, n) for n in names])
    assert await state.pool.fetchval("SELECT count(*) FROM agent_indexes") == 0
    async with state.pool.acquire() as conn:
        assert await search_store.listed_records(conn, agent.operator) is None

    # Back over the threshold: built and listed again.
    await fill(agent, 30)
    assert sorted((await maintenance.run_round(state.pool, 30)).built) == sorted(names)
    async with state.pool.acquire() as conn:
        assert await search_store.listed_records(conn, agent.operator) == 40


async def test_m20_a_large_agent_is_searched_with_a_larger_ef_search_in_vector_mode(
    db_url: str, state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rounds keep each listed agent's record count; from LARGE_AGENT_RECORDS on, its own
    # HNSW index is searched with LARGE_AGENT_EF_SEARCH in vector mode (recall at 200,000
    # records; a hybrid page, mostly from its words' tiers, found as much of the exact ranking
    # at the default, and at HYBRID_EF_SEARCH), and the setting lasts for that search only:
    # the statement sets it for its own transaction. A search of an agent the process
    # remembers as listed uses the count its last search read, so a round's new count applies
    # from the search after next.
    monkeypatch.setattr(search_module, "LARGE_AGENT_RECORDS", 130)
    agent = await make_search_agent(state, admin)
    await fill(agent, 120)
    await maintenance.run_round(state.pool, min_records=100)
    seen: list[str] = []
    left: list[str] = []  # what each search found on the connection: the search before's
    ranked_index = search_store.ranked_index

    async def capture(conn: Any, *args: Any, **kwargs: Any) -> Any:
        left.append(await conn.fetchval("SHOW hnsw.ef_search"))
        # Read in the statement's transaction, which keeps what it set until it ends.
        async with conn.transaction():
            found = await ranked_index(conn, *args, **kwargs)
            seen.append(await conn.fetchval("SHOW hnsw.ef_search"))
        return found

    monkeypatch.setattr(search_store, "ranked_index", capture)
    r = await ranking(agent, "hiking in the mountains", "vector")
    pool = await create_pool(db_url, min_size=1, max_size=1)
    try:

        async def search() -> None:
            assert (await search_module.ranked(pool, agent.operator, Filters(), r))[1] == "index"

        await search()  # listed with 120 records: the default
        await fill(agent, 20)
        await search()  # 140 now, but listed with 120 until the next round
        await maintenance.run_round(state.pool, min_records=100)
        await search()  # remembered with 120
        await search()  # 140, as the search before read it
        found, plan = await search_module.ranked(pool, agent.operator, Filters(), r, "index")
        assert plan == "index" and found
        hybrid = await ranking(agent, "hiking in the mountains", "hybrid")
        assert (await search_module.ranked(pool, agent.operator, Filters(), hybrid))[1] == "index"
        await state.pool.execute(
            "DELETE FROM agent_memories WHERE memory_id IN (SELECT memory_id FROM agent_memories "
            "WHERE account_id = $1 AND action_id = $2 LIMIT 30)",
            agent.account_id,
            agent.action_id,
        )
        await maintenance.run_round(state.pool, min_records=100)
        await search()  # remembered with 140
        await search()  # 110 at the round
        default, large = str(search_module.EF_SEARCH), str(search_module.LARGE_AGENT_EF_SEARCH)
        hybrid_ef = str(search_module.HYBRID_EF_SEARCH)  # no wider than its vector list
        assert seen == [default, default, default, large, large, hybrid_ef, large, default]
        assert left == [default] * 8
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW hnsw.ef_search") == default
    finally:
        await pool.close()


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
async def test_m20_the_index_plan_walks_hnsw_with_its_own_ef_search(
    state: AppState, admin: Caller, mode: str
) -> None:
    # The statement's own `hnsw.ef_search` governs its HNSW walk, whatever the connection's:
    # without the iterative scan a walk returns at most ef_search records, so a page of 30
    # from a connection set to 10 is full only if the statement's 150 came first. Hybrid's
    # query shares no word with the records: its page is the vector list's. Eight runs, so
    # that the cached generic plan answers too.
    agent = await make_search_agent(state, admin)
    await fill(agent, 120)
    await maintenance.run_round(state.pool, min_records=100)
    vector = (await state.embedder.embed(["mountain hiking"])).vectors[0]
    page = search_module.make_ranking(mode, "zyzzyva", vector, None, 30)
    found: dict[int, set[int]] = {10: set(), 150: set()}
    async with state.pool.acquire() as conn, conn.transaction():
        records = await search_store.listed_records(conn, agent.operator)
        assert records == 120
        for ef in (10, 150) * 4:
            # At 120 records a scan and a sort would win the cost comparison (index_plan_uses).
            await conn.execute(
                "SET LOCAL hnsw.ef_search = 10; SET LOCAL hnsw.iterative_scan = off;"
                " SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off"
            )
            r = replace(page, ef_search=ef)
            rows, _ = await search_store.ranked_index(conn, agent.operator, Filters(), r, records)
            found[ef].add(len(rows or []))
    assert found == {10: {10}, 150: {30}}


async def test_m20_at_most_max_agents_have_their_own_indexes(
    state: AppState, admin: Caller
) -> None:
    agents = [await make_search_agent(state, admin) for _ in range(3)]
    for agent, records in zip(agents, (40, 60, 50), strict=True):
        await fill(agent, records)
    small, large, middle = (maintenance.index_names(a.account_id, a.action_id) for a in agents)

    async def listed() -> list[uuid.UUID]:
        rows = await state.pool.fetch("SELECT action_id FROM agent_indexes ORDER BY action_id")
        return [r["action_id"] for r in rows]

    # The largest first, up to the limit.
    done = await maintenance.run_round(state.pool, 30, max_agents=2)
    assert sorted(done.built) == sorted([*large, *middle]) and done.dropped == []
    # A lower limit takes the smaller agent's indexes.
    done = await maintenance.run_round(state.pool, 30, max_agents=1)
    assert done.dropped == sorted(middle) and done.built == []
    assert await listed() == [agents[1].action_id]
    # A larger agent does not take the place of one that has its indexes (no rebuild churn)
    # until it holds TRADE times its records: then the smaller one's are dropped.
    newcomer = await make_search_agent(state, admin)
    await fill(newcomer, 70)
    done = await maintenance.run_round(state.pool, 30, max_agents=1)
    assert done.built == [] and done.dropped == []
    assert await listed() == [agents[1].action_id]
    await fill(newcomer, maintenance.TRADE * 60 - 70)
    done = await maintenance.run_round(state.pool, 30, max_agents=1)
    newest = maintenance.index_names(newcomer.account_id, newcomer.action_id)
    assert sorted(done.built) == sorted(newest) and done.dropped == sorted(large)
    assert await listed() == [newcomer.action_id]
    done = await maintenance.run_round(state.pool, 30, max_agents=1)  # and nothing trades back
    assert done.built == [] and done.dropped == []
    done = await maintenance.run_round(state.pool, 30, max_agents=0)
    assert done.dropped == sorted(newest)
    assert not any([await index_exists(state.pool, n) for n in (*small, *large, *middle)])


async def test_m20_indexes_built_with_other_options_are_rebuilt(
    state: AppState, admin: Caller
) -> None:
    agent = await make_search_agent(state, admin)
    await fill(agent, 40)
    vectors, words = maintenance.index_names(agent.account_id, agent.action_id)
    await maintenance.run_round(state.pool, 30)
    options = "SELECT reloptions FROM pg_class WHERE relname = $1"
    assert sorted(await state.pool.fetchval(options, vectors)) == [
        "ef_construction=128",  # built at 256, then lowered for the inserts
        "m=12",
    ]
    assert await state.pool.fetchval(options, words) == ["fastupdate=off"]
    # As an earlier release built it: the next round builds a replacement beside it, then
    # drops it; the agent stays listed, so its searches never go without one.
    await state.pool.execute(f"ALTER INDEX {vectors} SET (ef_construction = 200)")
    done = await maintenance.run_round(state.pool, 30)
    assert done.dropped == [vectors] and done.built == [vectors]
    assert "ef_construction=128" in await state.pool.fetchval(options, vectors)
    assert await state.pool.fetchval("SELECT count(*) FROM agent_indexes") == 1
    leftovers = "SELECT count(*) FROM pg_class WHERE relname LIKE '%\\_next'"
    assert await state.pool.fetchval(leftovers) == 0
    again = await maintenance.run_round(state.pool, 30)
    assert again.dropped == [] and again.built == []

    # A round that stopped between dropping the old index and renaming its replacement: the
    # next round takes the replacement as it is, rather than build it again.
    await state.pool.execute(f"ALTER INDEX {vectors} RENAME TO {vectors}_next")
    done = await maintenance.run_round(state.pool, 30)
    assert done.dropped == [] and done.built == []
    assert await index_exists(state.pool, vectors)
    assert await state.pool.fetchval(leftovers) == 0


async def test_m20_an_agents_hnsw_index_takes_its_inserts_at_a_lower_ef_construction(
    state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built at OPTIONS' ef_construction, then lowered to INSERT_EF_CONSTRUCTION (pgvector reads
    it at each insert): by the build of a round and of IndexBuilds, and by a later round for an
    index still at the build's, without building it again; a lowering that waits too long for
    its lock is left to the next round, the agent still searched by its index."""
    options = "SELECT reloptions FROM pg_class WHERE relname = $1"
    oid = "SELECT $1::regclass::oid"
    lowered = sorted([f"ef_construction={hnsw.INSERT_EF_CONSTRUCTION}", "m=12"])
    built = sorted(f"{k}={v}" for k, v in maintenance.OPTIONS[0].items())
    assert built != lowered
    agent, other = await make_search_agent(state, admin), await make_search_agent(state, admin)
    await fill(agent, 45)  # the larger one takes the one place
    await fill(other, 40)
    vectors = maintenance.index_names(agent.account_id, agent.action_id)[0]
    done = await maintenance.run_round(state.pool, 30, max_agents=1)
    assert vectors in done.built
    assert sorted(await state.pool.fetchval(options, vectors)) == lowered
    theirs = maintenance.index_names(other.account_id, other.action_id)[0]
    async with state.pool.acquire() as conn:
        session_changed(conn)
        assert await maintenance.index_agent(conn, (other.account_id, other.action_id), None)
    assert sorted(await state.pool.fetchval(options, theirs)) == lowered

    # As a release before this one left it: lowered by the next round, not built again.
    await state.pool.execute(f"ALTER INDEX {vectors} SET (ef_construction = 256)")
    was = await state.pool.fetchval(oid, vectors)
    done = await maintenance.run_round(state.pool, 30)
    assert done.built == [] and done.dropped == []
    assert sorted(await state.pool.fetchval(options, vectors)) == lowered
    assert await state.pool.fetchval(oid, vectors) == was

    # A transaction that read agent_memories holds a lock on each of its indexes until it
    # ends: the lowering gives up after LOWER_LOCK_TIMEOUT, the round goes on.
    await state.pool.execute(f"ALTER INDEX {vectors} SET (ef_construction = 256)")
    monkeypatch.setattr(hnsw, "LOWER_LOCK_TIMEOUT", "50ms")
    async with state.pool.acquire() as reader, reader.transaction():
        await reader.fetchval("SELECT count(*) FROM agent_memories")
        done = await maintenance.run_round(state.pool, 30)
    assert done.failed == []
    assert sorted(await state.pool.fetchval(options, vectors)) == built
    query = "hiking in the mountains"
    found, plan = await search_module.ranked(
        state.pool, agent.operator, Filters(), await ranking(agent, query, "vector")
    )
    assert plan == "index" and found
    await maintenance.run_round(state.pool, 30)
    assert sorted(await state.pool.fetchval(options, vectors)) == lowered


async def test_m20_an_agents_hnsw_index_is_built_again_once_the_agent_has_doubled(
    state: AppState, admin: Caller
) -> None:
    """Records written after the build go in at INSERT_EF_CONSTRUCTION: once the agent holds
    REBUILD_GROWTH times the rows its HNSW index was built over (the index's comment), a round
    builds it again beside the old one; its GIN index and its listing stay."""
    assert hnsw.REBUILD_GROWTH == 2
    agent = await make_search_agent(state, admin)
    await fill(agent, 40)
    await maintenance.run_round(state.pool, 30)
    vectors, words = maintenance.index_names(agent.account_id, agent.action_id)
    oid = "SELECT $1::regclass::oid"
    assert await built_over(state.pool, vectors) == "engram: built over 40 rows in its file"
    was = {name: await state.pool.fetchval(oid, name) for name in (vectors, words)}
    await fill(agent, 39)
    done = await maintenance.run_round(state.pool, 30)
    assert done.built == [] and done.dropped == []
    await fill(agent, 1)
    done = await maintenance.run_round(state.pool, 30)
    assert done.built == [vectors] and done.dropped == [vectors]
    assert await built_over(state.pool, vectors) == "engram: built over 80 rows in its file"
    assert await state.pool.fetchval(oid, vectors) != was[vectors]
    assert await state.pool.fetchval(oid, words) == was[words]
    options = await state.pool.fetchval(
        "SELECT reloptions FROM pg_class WHERE relname = $1", vectors
    )
    assert f"ef_construction={hnsw.INSERT_EF_CONSTRUCTION}" in options
    assert await state.pool.fetchval("SELECT count(*) FROM agent_indexes") == 1
    leftovers = "SELECT count(*) FROM pg_class WHERE relname LIKE '%\\_next'"
    assert await state.pool.fetchval(leftovers) == 0
    r = await ranking(agent, "hiking in the mountains", "vector")
    assert (await search_module.ranked(state.pool, agent.operator, Filters(), r))[1] == "index"

    # An index without the comment, as a release before this one built it: the round notes the
    # rows it finds, and builds nothing.
    await fill(agent, 90)
    await state.pool.execute(f"COMMENT ON INDEX {vectors} IS NULL")
    done = await maintenance.run_round(state.pool, 30)
    assert done.built == [] and done.dropped == []
    assert await built_over(state.pool, vectors) == "engram: built over 170 rows in its file"
    # One that says no rows (a build that found none, its records deleted meanwhile) likewise.
    file = await state.pool.fetchval("SELECT relfilenode FROM pg_class WHERE relname = $1", vectors)
    await state.pool.execute(
        f"COMMENT ON INDEX {vectors} IS 'engram: built over 0 rows in file {file}'"
    )
    done = await maintenance.run_round(state.pool, 30)
    assert done.built == [] and done.dropped == []
    assert await built_over(state.pool, vectors) == "engram: built over 170 rows in its file"


async def test_m20_an_agents_hnsw_index_postgresql_built_again_is_built_again_by_a_round(
    state: AppState, admin: Caller
) -> None:
    """PostgreSQL builds an index again with its options (a restore from pg_dump, REINDEX,
    VACUUM FULL, a CLUSTER by hand): an agent's HNSW index then went in wholly at
    INSERT_EF_CONSTRUCTION, the comment's rows notwithstanding. Its file is not the one the
    comment names: the next round builds it again at OPTIONS' ef_construction, beside it."""
    agent = await make_search_agent(state, admin)
    await fill(agent, 40)
    await maintenance.run_round(state.pool, 30)
    vectors, words = maintenance.index_names(agent.account_id, agent.action_id)
    oid = "SELECT $1::regclass::oid"
    for rebuild in (f"REINDEX INDEX {vectors}", "VACUUM FULL agent_memories"):
        was = {name: await state.pool.fetchval(oid, name) for name in (vectors, words)}
        await state.pool.execute(rebuild)
        said = await built_over(state.pool, vectors)  # the comment stays, naming the old file
        assert said and said.startswith("engram: built over 40 rows in file ")
        done = await maintenance.run_round(state.pool, 30)
        assert done.built == [vectors] and done.dropped == [vectors], rebuild
        assert await state.pool.fetchval(oid, vectors) != was[vectors]
        assert await state.pool.fetchval(oid, words) == was[words]
        assert await built_over(state.pool, vectors) == "engram: built over 40 rows in its file"
        done = await maintenance.run_round(state.pool, 30)
        assert done.built == [] and done.dropped == []
    r = await ranking(agent, "hiking in the mountains", "vector")
    assert (await search_module.ranked(state.pool, agent.operator, Filters(), r))[1] == "index"


async def test_m20_interrupted_builds_and_orphans_are_dropped(
    state: AppState, admin: Caller
) -> None:
    agent = await make_search_agent(state, admin)
    await fill(agent, 40)
    vectors, words = maintenance.index_names(agent.account_id, agent.action_id)
    # A CREATE INDEX CONCURRENTLY that fails leaves an invalid index under its name (here a
    # unique index over duplicate values), listed nowhere.
    with pytest.raises(asyncpg.UniqueViolationError):
        await state.pool.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {vectors} ON agent_memories (kind) "
            f"WHERE action_id = '{agent.action_id}'"
        )
    gone = uuid.uuid4()
    orphan = maintenance.index_names(agent.account_id, gone)[1]
    await state.pool.execute(
        f"CREATE INDEX {orphan} ON agent_memories (created) WHERE action_id = '{gone}'"
    )
    done = await maintenance.run_round(state.pool, 30)
    assert sorted(done.dropped) == sorted([vectors, orphan])
    assert sorted(done.built) == sorted([vectors, words])
    valid = await state.pool.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", vectors
    )
    assert valid is True and not await index_exists(state.pool, orphan)


async def test_m20_one_process_maintains_at_a_time(state: AppState) -> None:
    async with state.pool.acquire() as conn:
        await conn.execute(f"SELECT pg_advisory_lock({maintenance.ROUND_LOCK})")
        assert await maintenance.run_round(state.pool, 30) is None
        await conn.execute(f"SELECT pg_advisory_unlock({maintenance.ROUND_LOCK})")
    assert await maintenance.run_round(state.pool, 30) is not None


async def test_m20_new_dimensions_drop_agent_indexes_and_keep_vectors_in_the_row(
    state: AppState, admin: Caller
) -> None:
    agent = await make_search_agent(state, admin)
    await fill(agent, 12)
    await maintenance.run_round(state.pool, 10)
    names = maintenance.index_names(agent.account_id, agent.action_id)
    assert await index_exists(state.pool, names[0])
    other = await make_search_agent(state, admin)
    await fill(other, 12)
    await maintenance.run_round(state.pool, 10)
    others = maintenance.index_names(other.account_id, other.action_id)
    # Unlisted by hand, its indexes still there (a round stopped between): they go too.
    await state.pool.execute("DELETE FROM agent_indexes WHERE action_id = $1", other.action_id)
    async with state.pool.acquire() as conn, conn.transaction():
        await embedding_store.set_dimensions(conn, 64, VECTOR_COLUMNS)
    assert not any([await index_exists(state.pool, n) for n in others])
    assert not any([await index_exists(state.pool, n) for n in names])
    assert await state.pool.fetchval("SELECT count(*) FROM agent_indexes") == 0
    storage = await state.pool.fetchval(
        "SELECT attstorage::text FROM pg_attribute "
        "WHERE attrelid = 'agent_memories'::regclass AND attname = 'embedding'"
    )
    assert storage == "m"  # MAIN: kept in the row (migration 0005), not reset by the new type
    assert await index_exists(state.pool, "history_parts_embedding")
    # Memory has no HNSW index shared by every agent (migration 0015): writes touch no graph.
    assert not await index_exists(state.pool, "agent_memories_embedding")


async def test_m20_words_are_indexed_by_each_listed_agent_alone(
    state: AppState, admin: Caller
) -> None:
    # No GIN index holds every agent's words (migration 0034): it served only agents without
    # their own indexes, whose exact plan is faster, and every write paid for it. A listed
    # agent's own has no pending list (fastupdate off), which every search would scan in full.
    agent = await make_search_agent(state, admin)
    await fill(agent, 12)
    await maintenance.run_round(state.pool, 10)
    words = await state.pool.fetch(
        "SELECT c.relname, c.reloptions FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_am a ON a.oid = c.relam"
        " WHERE i.indrelid = 'agent_memories'::regclass AND a.amname = 'gin'"
        " AND pg_get_indexdef(i.indexrelid) LIKE '%tsv%'"
    )
    own = maintenance.index_names(agent.account_id, agent.action_id)[1]
    assert [(r["relname"], r["reloptions"]) for r in words] == [(own, ["fastupdate=off"])]


async def test_m20_the_service_maintains_search_in_the_background(
    state: AppState, admin: Caller
) -> None:
    agent = await make_search_agent(state, admin)
    await fill(agent, 25)
    settings = state.settings.model_copy(
        update={"search_maintenance_seconds": 0.05, "agent_index_min_records": 20}
    )
    service = AppState(settings=settings, pool=state.pool, embedder=state.embedder)
    await start_services(service)
    try:
        built = "SELECT count(*) > 0 FROM agent_indexes"
        await eventually(lambda: state.pool.fetchval(built), "a round building the indexes")
    finally:
        await service.services[maintenance.SEARCH_MAINTENANCE].aclose()
    assert service.services[maintenance.SEARCH_MAINTENANCE]._task is None  # cancelled, awaited


async def test_m20_maintain_search_command(
    state: AppState, admin: Caller, db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    agent = await make_search_agent(state, admin)
    await fill(agent, 12)
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.setenv("ENGRAM_AGENT_INDEX_MAX_AGENTS", "0")  # the limit is the setting's
    code = await asyncio.to_thread(cli.main, ["maintain-search", "--min-records", "10"])
    assert code == 0 and "built 0 search indexes" in capsys.readouterr().out
    monkeypatch.delenv("ENGRAM_AGENT_INDEX_MAX_AGENTS")
    code = await asyncio.to_thread(cli.main, ["maintain-search", "--min-records", "10"])
    assert code == 0
    assert "built 2 search indexes" in capsys.readouterr().out
    assert await state.pool.fetchval("SELECT count(*) FROM agent_indexes") == 1
    # Unlisted by a lower limit: its indexes go at once.
    monkeypatch.setenv("ENGRAM_AGENT_INDEX_MAX_AGENTS", "0")
    code = await asyncio.to_thread(cli.main, ["maintain-search", "--min-records", "10"])
    assert code == 0 and "dropped 2" in capsys.readouterr().out


async def test_m20_maintain_search_reorder_leaves_the_round_to_a_process_that_began_one(
    state: AppState,
    admin: Caller,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    """Another process begins a round between `--reorder`'s reorder and its own round: the
    reorder is done, and the command says so and exits 0 (it said "another process is
    maintaining search; try again" and exited 2, as if nothing had been done)."""
    agent = await make_search_agent(state, admin)
    await fill(agent, 12)
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    reordered, begun = threading.Event(), threading.Event()
    real = maintenance.reorder

    async def then_a_round_begins(conn: asyncpg.Connection) -> None:
        await real(conn)
        reordered.set()
        await asyncio.to_thread(begun.wait, 10)

    monkeypatch.setattr(maintenance, "reorder", then_a_round_begins)
    command = asyncio.create_task(
        asyncio.to_thread(cli.main, ["maintain-search", "--min-records", "10", "--reorder"])
    )
    async with state.pool.acquire() as other:
        assert await asyncio.to_thread(reordered.wait, 10)
        await other.execute(f"SELECT pg_advisory_lock({maintenance.ROUND_LOCK})")
        begun.set()
        try:
            code = await asyncio.wait_for(command, 30)
        finally:
            await other.execute(f"SELECT pg_advisory_unlock({maintenance.ROUND_LOCK})")
    said = capsys.readouterr()
    assert code == 0, said.err
    assert re.fullmatch(
        r"stored the memory records in agent order again in \d+\.\d s; another process is "
        r"maintaining search: the round is left to it\n",
        said.out,
    )
    assert await state.pool.fetchval("SELECT count(*) FROM agent_indexes") == 0  # not its round


async def scores_in_both_plans(
    pool: asyncpg.Pool, reader: Reader, ranking: Ranking
) -> tuple[dict[uuid.UUID, float | None], str]:
    """Each record's score as the chosen plan ranks it, and that plan; the exact plan must rank
    the same records with the same scores."""
    found, chosen = await search_module.ranked(pool, reader, Filters(), ranking)
    exact, _ = await search_module.ranked(pool, reader, Filters(), ranking, "exact")
    assert [(x.memory_id, x.score) for x in found] == [(x.memory_id, x.score) for x in exact]
    return {x.memory_id: x.score for x in found}, chosen


async def test_m21_a_listed_agents_word_weights_are_bm25_idf_of_its_own_counts(
    state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A listed agent's words are counted by the maintenance over its live records: a word's
    # weight is ln(1 + (N - n + 0.5) / (n + 0.5)), N the records and n those holding it (in
    # agent scope exactly; in every scope a word held by at most one counts as one). Another
    # agent's records, preview, deleted and uncommitted ones count for nothing; both plans
    # score by the counts (not by what they read), until the agent has changed by a tenth; the
    # counts go with its indexes.
    # Each reader is weighed by the records it sees: an operator by every scope's, a reader of
    # agent scope by the agent scope's and its own session's (counted as it searches), a
    # reader of one session alone by that session's.
    agent, other = [await make_search_agent(state, admin) for _ in range(2)]
    for i in range(30):
        await agent.add(f"Zanzibar trip note {i}" if i < 5 else f"Garden note {i}")
        await other.add(f"Zanzibar volcano {i}")

    async def add_to(session_id: str, text: str) -> uuid.UUID:
        return await agent.add(text, scope="SESSION", session_id=session_id)

    session = [await add_to("s2", f"Zanzibar volcano garden, session two {i}") for i in range(4)]
    await agent.add("Zanzibar volcano preview", preview=True)
    await agent.add("Zanzibar volcano deleted", status="DELETED")
    await agent.add("Zanzibar volcano pending", pending_execution=uuid.uuid4())
    query = "zanzibar garden volcano"
    words = (
        "SELECT term::text, counted, held, counted_any, held_any FROM query_words($1, $2, $3, '')"
    )
    key = (agent.account_id, agent.action_id)

    async def counts() -> dict[str, tuple[int, ...]]:
        return {r[0]: tuple(r[1:]) for r in await state.pool.fetch(words, query, *key)}

    assert set((await counts()).values()) == {(None, 0, None, 1)}
    done = await maintenance.run_round(state.pool, min_records=30)
    assert done is not None and done.counted == 2

    def idf(records: int, n: int) -> float:
        return math.log(1 + (records - n + 0.5) / (n + 0.5))

    # Agent scope: 30 records; every scope: 34.
    assert await counts() == {
        "'zanzibar'": (30, 5, 34, 9),
        "'garden'": (30, 25, 34, 29),
        "'volcano'": (30, 0, 34, 4),
    }
    # Written after the count: scored by the counts, not by what a plan reads.
    both = await agent.add("Zanzibar garden")
    r = search_module.make_ranking("lexical", query, None, None, 10)
    monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 0)

    async def scores(reader: Reader, plan: str = "index") -> dict[uuid.UUID, float | None]:
        found, chosen = await scores_in_both_plans(state.pool, reader, r)
        assert chosen == plan
        return found

    found = await scores(agent.operator)
    assert found[both] == pytest.approx(idf(34, 9) + idf(34, 29), rel=1e-9)
    assert found[session[0]] == pytest.approx(idf(34, 9) + idf(34, 29) + idf(34, 4), rel=1e-9)
    # A live reader of agent scope: the agent scope's counts, and its session's if it reads it
    # (volcano, in none of agent scope, 0 + 4); a preview reader, who may see records no count
    # holds, weighs every word alike.
    two = agent.reader(session="s2", scopes=("agent", "session"))
    for reader, weight in (
        (agent.reader(session="s1", scopes=("agent",)), idf(30, 5) + idf(30, 25)),
        (agent.reader(session="s1", scopes=("agent", "session")), idf(30, 5) + idf(30, 25)),
        (two, idf(34, 9) + idf(34, 29)),
        (agent.reader(session="s1", scopes=("agent",), preview=True), 2.0),
    ):
        assert (await scores(reader))[both] == pytest.approx(weight, rel=1e-9)
    seen = idf(34, 9) + idf(34, 29) + idf(34, 4)
    assert (await scores(two))[session[0]] == pytest.approx(seen, rel=1e-9)
    # Another session's records, even once counted, move no weight of session two's reader
    # (volcano stays in 0 + 4 of 31 + 4, `both` counted now); its own session's move them at
    # once.
    for i in range(4):
        await add_to("s3", f"Volcano ash {i}")
    assert (await maintenance.run_round(state.pool, min_records=30)).counted == 1
    assert (await counts())["'volcano'"] == (31, 0, 39, 8)
    seen = idf(35, 10) + idf(35, 30) + idf(35, 4)
    assert (await scores(two))[session[0]] == pytest.approx(seen, rel=1e-9)
    fifth = await add_to("s2", "Volcano, session two again")
    assert (await scores(two))[session[0]] == pytest.approx(
        idf(36, 10) + idf(36, 30) + idf(36, 5), rel=1e-9
    )
    # One session alone: weighed by its five records, ranked by the session's index when they
    # are few, and by the agent's indexes (counting the session's words as it goes) otherwise.
    alone = agent.reader(session="s2", scopes=("session",))
    found = await scores(alone)
    assert sorted(found) == sorted([*session, fifth])
    assert found[session[0]] == pytest.approx(idf(5, 4) + idf(5, 4) + idf(5, 5), rel=1e-9)
    monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 5)
    assert await scores(alone, "exact") == found
    for i in range(3):  # a tenth more than the 31 counted, with `both`: not counted again
        await agent.add(f"Zanzibar harbour {i}")
        assert (await maintenance.run_round(state.pool, min_records=30)).counted == (i == 2)
    assert (await counts())["'zanzibar'"] == (34, 9, 43, 13)
    # A deletion: counted again at the next round, whatever the number of records.
    await state.pool.execute(
        "UPDATE agent_memories SET status = 'DELETED' WHERE memory_id = $1", both
    )
    assert (await maintenance.run_round(state.pool, min_records=30)).counted == 1
    assert (await counts())["'zanzibar'"] == (33, 8, 42, 12)
    assert (await maintenance.run_round(state.pool, min_records=30)).counted == 0
    await maintenance.run_round(state.pool, min_records=1000)  # unlisted: the counts go
    assert await state.pool.fetchval("SELECT count(*) FROM agent_words") == 0


async def test_m21_a_listed_agents_large_session_has_its_words_kept(
    state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A listed agent's session of SESSION_WORDS_MIN live records or more has its words counted
    # by the maintenance too (its live records only, and its own, not another agent's session
    # of the same ID): its turns are weighed by those counts instead of counting the session at
    # each search, until it grows by a tenth or loses a record; under half the threshold, or
    # with the agent's listing, the counts go.
    monkeypatch.setattr(maintenance, "SESSION_WORDS_MIN", 6)
    agent, other = [await make_search_agent(state, admin) for _ in range(2)]
    for i in range(20):
        await agent.add(f"Harbour note {i}" if i < 4 else f"Garden note {i}")

    async def add_to(session_id: str, text: str, **columns: Any) -> uuid.UUID:
        return await agent.add(text, scope="SESSION", session_id=session_id, **columns)

    big = [await add_to("big", f"Harbour lantern {i}" if i < 2 else f"Kite {i}") for i in range(6)]
    await add_to("big", "Lantern preview", preview=True)
    await add_to("big", "Lantern staged", pending_execution=uuid.uuid4())
    staged = await add_to(
        "big", "Lantern staged deletion", status="DELETED", pending_execution=uuid.uuid4()
    )
    await add_to("big", "Lantern deleted", status="DELETED")
    await add_to("small", "Harbour lantern small")
    for i in range(10):  # another listed agent, with a session of the same ID
        await other.add(f"Lantern {i}", scope="SESSION" if i < 6 else "AGENT", session_id="big")
    done = await maintenance.run_round(state.pool, min_records=10)
    assert done is not None and done.sessions == 2
    kept = "SELECT session_id, counted FROM session_counts WHERE action_id = $1"
    assert [tuple(r) for r in await state.pool.fetch(kept, agent.action_id)] == [("big", 6)]
    words = "SELECT term::text, session_counted, session_held FROM query_words($1, $2, $3, $4)"
    key = (agent.account_id, agent.action_id)

    async def counts(query: str, session: str = "big") -> dict[str, tuple[int, int]]:
        return {r[0]: tuple(r[1:]) for r in await state.pool.fetch(words, query, *key, session)}

    assert await counts("lantern kite") == {"'lantern'": (6, 2), "'kite'": (6, 4)}
    assert await counts("lantern", "small") == {"'lantern'": (None, 0)}

    def idf(records: int, n: int) -> float:
        return math.log(1 + (records - n + 0.5) / (n + 0.5))

    r = search_module.make_ranking("lexical", "harbour lantern", None, None, 10)

    async def score(reader: Reader, memory_id: uuid.UUID) -> float | None:
        return (await scores_in_both_plans(state.pool, reader, r))[0][memory_id]

    turn = agent.reader(session="big", scopes=("agent", "session"))
    alone = agent.reader(session="big", scopes=("session",))
    counted = idf(26, 6) + idf(26, 2)  # harbour: 4 + 2 of 20 + 6; lantern: 0 + 2
    assert await score(turn, big[0]) == pytest.approx(counted, rel=1e-9)
    assert await score(alone, big[0]) == pytest.approx(idf(6, 2) * 2, rel=1e-9)
    # Written after the count: not counted until the session has grown by a tenth.
    festival = await add_to("big", "Lantern festival")
    assert await score(turn, big[0]) == pytest.approx(counted, rel=1e-9)
    assert await score(alone, big[0]) == pytest.approx(idf(6, 2) * 2, rel=1e-9)
    # A session without kept counts is counted at each search.
    small = agent.reader(session="small", scopes=("agent", "session"))
    found, _ = await search_module.ranked(state.pool, small, Filters(), r)
    assert found[0].score == pytest.approx(idf(21, 5) + idf(21, 1), rel=1e-9)
    assert (await maintenance.run_round(state.pool, min_records=10)).sessions == 1
    assert await score(turn, big[0]) == pytest.approx(idf(27, 6) + idf(27, 3), rel=1e-9)
    assert await score(alone, big[0]) == pytest.approx(idf(7, 2) + idf(7, 3), rel=1e-9)
    # One record deleted and one written: counted again at the next round, though as many are
    # live (a staged deletion dropped as its turn failed, meanwhile, hides nothing).
    await state.pool.execute(
        "UPDATE agent_memories SET status = 'DELETED' WHERE memory_id = $1", big[5]
    )
    await state.pool.execute("DELETE FROM agent_memories WHERE memory_id = $1", staged)
    again = await add_to("big", "Kite again")
    assert (await maintenance.run_round(state.pool, min_records=10)).sessions == 1
    assert await counts("kite") == {"'kite'": (7, 4)}
    assert (await maintenance.run_round(state.pool, min_records=10)).sessions == 0
    # Under half the threshold: the counts go, and its turns count it again.
    await state.pool.execute(
        "UPDATE agent_memories SET status = 'DELETED' WHERE memory_id = any($1::uuid[])",
        [*big[2:], festival, again],
    )
    assert (await maintenance.run_round(state.pool, min_records=10)).sessions == 0
    assert await state.pool.fetch(kept, agent.action_id) == []
    assert await score(alone, big[0]) == pytest.approx(idf(2, 2) * 2, rel=1e-9)
    assert [tuple(r) for r in await state.pool.fetch(kept, other.action_id)] == [("big", 6)]
    await maintenance.run_round(state.pool, min_records=1000)  # unlisted: the counts go
    assert await state.pool.fetchval("SELECT count(*) FROM session_words") == 0
    assert await state.pool.fetchval("SELECT count(*) FROM session_counts") == 0


async def building_behind(
    state: AppState, writer: asyncpg.Connection, memory_id: uuid.UUID
) -> asyncio.Task[maintenance.Round | None]:
    """A round whose build (CREATE INDEX CONCURRENTLY) is in flight, waiting for `writer`'s
    open write of the record (as for any older transaction) until it commits."""
    await writer.execute("BEGIN")
    await writer.execute(
        "UPDATE agent_memories SET modified = modified WHERE memory_id = $1", memory_id
    )
    running = asyncio.create_task(maintenance.run_round(state.pool, 30))
    building = (
        "SELECT count(*) > 0 FROM pg_stat_activity "
        "WHERE query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'"
    )
    await eventually(lambda: state.pool.fetchval(building), "a build in flight")
    return running


@pytest.mark.parametrize("change", ["first start", "reembed", "resumed reembed"])
async def test_m20_new_dimensions_wait_for_a_build_in_flight_asking_between_statements(
    state: AppState,
    admin: Caller,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    change: str,
) -> None:
    """New embedding dimensions (a service's first start, `engram reembed`) drop every agent's
    and session's own indexes, once no round or build is in flight. Waiting for the round's
    lock in a statement of their transaction deadlocked with a round's CREATE INDEX
    CONCURRENTLY, which waits out that statement's snapshot (DeadlockDetectedError, the new
    dimensions undone): they ask for it between statements, before the transaction, and say
    once that they wait. A reembed that resumes an interrupted run waits the same way, and
    says so: it drops nothing (it said it was dropping the indexes)."""
    monkeypatch.setattr(maintenance, "HOLD_RETRY_SECONDS", 0.05)

    async def nobody_serves(*_: Any) -> None:  # the fixture's own service beats
        pass

    monkeypatch.setattr(reembed_module, "_refuse_while_serving", nobody_serves)
    assert state.embedder is not None
    agent = await make_search_agent(state, admin)
    ids = await fill(agent, 40)
    writer = await asyncpg.connect(db_url)
    try:
        running = await building_behind(state, writer, ids[0])
        if change == "first start":
            await state.pool.execute("DELETE FROM deployment WHERE key = 'embedding'")
            changing = asyncio.create_task(ensure_model(state.pool, state.embedder, VECTOR_COLUMNS))
        else:
            if change == "resumed reembed":  # a run to this model was interrupted
                async with state.pool.acquire() as conn:
                    embedder = state.embedder
                    await embedding_store.set_reembed_target(
                        conn, embedder.name, embedder.dimensions
                    )
            changing = asyncio.create_task(
                reembed_module.reembed(state.pool, state.embedder, VECTOR_COLUMNS)
            )

        def waits() -> list[str]:
            said = (r.getMessage() for r in caplog.records)
            return [m for m in said if "waits for the search maintenance in flight" in m]

        with caplog.at_level(logging.INFO, logger=maintenance.__name__):
            await eventually(waits, "the new dimensions waiting")
            await asyncio.sleep(0.3)  # asked for again meanwhile
            assert not changing.done()
            await writer.execute("COMMIT")
            done = await asyncio.wait_for(running, 30)
            await asyncio.wait_for(changing, 30)
    finally:
        await writer.close()
    assert done is not None and done.failed == [] and len(done.built) == 2
    doing = (
        "resuming `engram reembed`, which drops no index,"
        if change == "resumed reembed"
        else "dropping the search indexes for new embedding dimensions"
    )
    assert waits() == [
        f"{doing} waits for the search maintenance in flight (a round or an index build, maybe "
        "of another process); trying again every 0.05 s"
    ]
    # Dropped once built, not under the build; kept by a reembed that resumed.
    for name in done.built:
        assert await index_exists(state.pool, name) == (change == "resumed reembed")
    kept = await state.pool.fetchval("SELECT count(*) FROM agent_indexes")
    assert (kept > 0) == (change == "resumed reembed")
    held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    assert await state.pool.fetchval(held) == 0


async def test_m20_new_dimensions_refuse_to_drop_under_a_round_not_waited_for(
    state: AppState,
) -> None:
    """Dropping the indexes in a transaction without the round's lock held first (a caller
    that skipped `dropping_agent_indexes`) is refused while a round holds it, never waited
    for."""
    async with state.pool.acquire() as holder:
        await holder.execute(f"SELECT pg_advisory_lock({maintenance.ROUND_LOCK})")
        try:
            async with state.pool.acquire() as conn, conn.transaction():
                with pytest.raises(RuntimeError, match="hold its lock before the transaction"):
                    await embedding_store.set_dimensions(conn, 64, VECTOR_COLUMNS)
        finally:
            await holder.execute(f"SELECT pg_advisory_unlock({maintenance.ROUND_LOCK})")


def test_m20_index_build_memory_must_be_a_size() -> None:
    assert Settings(agent_index_build_memory="512MB").agent_index_build_memory == "512MB"
    assert Settings(agent_index_build_memory="").agent_index_build_memory == ""
    with pytest.raises(ValidationError):
        Settings(agent_index_build_memory="1GB'; DROP TABLE agent_memories; --")
    assert Settings().agent_index_max_agents == 100
    with pytest.raises(ValidationError):
        Settings(agent_index_max_agents=-1)


async def agent_pages(pool: asyncpg.Pool, agent: SearchAgent) -> list[int]:
    """The heap pages holding the agent's records, in order."""
    rows = await pool.fetch(
        "SELECT DISTINCT (ctid::text::point)[0]::int AS page FROM agent_memories "
        "WHERE account_id = $1 AND action_id = $2 ORDER BY 1",
        agent.account_id,
        agent.action_id,
    )
    return [r["page"] for r in rows]


async def test_m20_reorder_stores_each_agents_records_together(
    state: AppState, admin: Caller, db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # Two agents writing by turns: their records alternate on the same pages. Reordered, each
    # agent's records fill pages of their own, one run of pages after the other's, and search
    # finds the same records.
    agents = [await make_search_agent(state, admin) for _ in range(2)]
    for i in range(60):
        for agent in agents:
            await agent.add(f"Note {i} about {TOPICS[i % len(TOPICS)]} " + "words " * 40)
    before = [await agent_pages(state.pool, agent) for agent in agents]
    assert set(before[0]) & set(before[1])
    r = await ranking(agents[0], "hiking in the mountains")
    found = await search_module.ranked(state.pool, agents[0].operator, Filters(), r)
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    code = await asyncio.to_thread(cli.main, ["maintain-search", "--reorder"])
    said = capsys.readouterr().out
    assert code == 0 and "counted the words of" in said
    # It says it reordered (a rewrite that locked the table), and how long it took.
    assert re.match(r"stored the memory records in agent order again in \d+\.\d s; ", said), said
    after = [await agent_pages(state.pool, agent) for agent in agents]
    assert not set(after[0]) & set(after[1])
    for pages in after:
        assert pages == list(range(pages[0], pages[-1] + 1))  # one run of pages
        assert len(pages) < len(before[0])
    assert await search_module.ranked(state.pool, agents[0].operator, Filters(), r) == found


async def test_m20_reorder_builds_agents_hnsw_indexes_at_the_builds_ef_construction(
    state: AppState, admin: Caller
) -> None:
    """CLUSTER builds every index again with its options: an agent's HNSW index, lowered for
    its inserts, is set back to OPTIONS' ef_construction for the rewrite and lowered after,
    in CLUSTER's transaction, its comment saying it was built over the rows it now holds, in
    its new file (a round then builds nothing); its searches find what they found."""
    agent = await make_search_agent(state, admin)
    await fill(agent, 40)
    await maintenance.run_round(state.pool, 30)
    await fill(agent, 30)  # inserted at INSERT_EF_CONSTRUCTION; CLUSTER builds them in at 256
    vectors = maintenance.index_names(agent.account_id, agent.action_id)[0]
    r = await ranking(agent, "hiking in the mountains", "vector")
    found = await search_module.ranked(state.pool, agent.operator, Filters(), r)
    assert found[1] == "index"
    said: list[str] = []
    async with state.pool.acquire() as conn:
        session_changed(conn)
        conn.add_query_logger(lambda logged: said.append(logged.query))
        await maintenance.reorder(conn)
    steps = [
        q
        for q in said
        if q.startswith(("CLUSTER", "LOCK")) or (q.startswith("ALTER INDEX") and vectors in q)
    ]
    built, lowered = maintenance.OPTIONS[0]["ef_construction"], hnsw.INSERT_EF_CONSTRUCTION
    assert steps == [
        "LOCK TABLE agent_memories IN ACCESS EXCLUSIVE MODE",
        f"ALTER INDEX {vectors} SET (ef_construction = {built})",
        "CLUSTER agent_memories USING agent_memories_created",
        f"ALTER INDEX {vectors} SET (ef_construction = {lowered})",
    ]
    options = await state.pool.fetchval(
        "SELECT reloptions FROM pg_class WHERE relname = $1", vectors
    )
    assert f"ef_construction={lowered}" in options
    assert await built_over(state.pool, vectors) == "engram: built over 70 rows in its file"
    done = await maintenance.run_round(state.pool, 30)
    assert done.built == [] and done.dropped == []
    assert await search_module.ranked(state.pool, agent.operator, Filters(), r) == found


async def test_m20_reorder_locks_the_table_before_its_agents_indexes(
    state: AppState, admin: Caller
) -> None:
    """A statement on agent_memories locks the table, then each of its indexes (planning);
    `reorder` alters the agents' HNSW indexes before CLUSTER, so it locks the table first: one
    that holds the table and then reads waits for nothing, and the rewrite waits for it (an
    index locked before the table: deadlock detected, the reorder or the statement undone)."""
    agent = await make_search_agent(state, admin)
    await fill(agent, 40)
    await maintenance.run_round(state.pool, 30)
    async with state.pool.acquire() as writer, state.pool.acquire() as conn:
        session_changed(conn)
        # With pgvector loaded, ALTER INDEX SET (ef_construction) locks ACCESS EXCLUSIVE.
        await conn.execute("SELECT '[1]'::vector")
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        async with writer.transaction():
            await writer.execute("LOCK TABLE agent_memories IN ROW EXCLUSIVE MODE")  # an insert's
            reordering = asyncio.create_task(maintenance.reorder(conn))
            waiting = "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted"
            await eventually(lambda: state.pool.fetchval(waiting, pid), "reorder waits")
            # Its statement reads the agent (locking each index), as a write's check does.
            count = "SELECT count(*) FROM agent_memories WHERE action_id = $1"
            assert await writer.fetchval(count, agent.action_id) == 40
        await reordering
    r = await ranking(agent, "hiking in the mountains", "vector")
    assert (await search_module.ranked(state.pool, agent.operator, Filters(), r))[1] == "index"


async def test_m20_lowering_waits_for_one_lock_a_round_and_alters_no_lowered_index(
    state: AppState, admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each index lowering waits for locks statements on agent_memories queue behind: a round
    alters no index already lowered, and once one lowering has waited LOWER_LOCK_TIMEOUT (what
    holds one index, a transaction that read the table, holds them all) tries no other."""
    agents = [await make_search_agent(state, admin) for _ in range(3)]
    for agent in agents:
        await fill(agent, 40)
    await maintenance.run_round(state.pool, 30)
    names = [maintenance.index_names(a.account_id, a.action_id)[0] for a in agents]
    altered: list[str] = []
    set_ef_construction = hnsw.set_ef_construction

    async def recorded(conn: asyncpg.Connection, name: str, value: str) -> None:
        altered.append(name)
        await set_ef_construction(conn, name, value)

    monkeypatch.setattr(hnsw, "set_ef_construction", recorded)
    done = await maintenance.run_round(state.pool, 30)
    assert done.built == [] and altered == []  # all lowered by their builds

    for name in names:  # as a release before this one left them
        await state.pool.execute(f"ALTER INDEX {name} SET (ef_construction = 256)")
    monkeypatch.setattr(hnsw, "LOWER_LOCK_TIMEOUT", "50ms")
    async with state.pool.acquire() as conn:
        session_changed(conn)
        await conn.execute("SELECT '[1]'::vector")  # pgvector loaded: ACCESS EXCLUSIVE
        async with state.pool.acquire() as reader, reader.transaction():
            await reader.fetchval("SELECT count(*) FROM agent_memories")
            assert await hnsw.lower(conn, names) == []
        assert altered == [sorted(names)[0]]
        assert await hnsw.lower(conn, names) == sorted(names)


async def test_m20_a_round_whose_connection_the_server_ends_says_why(
    state: AppState, db_url: str
) -> None:
    """The server ends the round's connection (pg_terminate_backend, a restart): the round fails
    with the server's reason, which the service logs in one line; its lock went with the
    session. Letting the lock go on that connection raised asyncpg's "connection has been
    released back to the pool" instead, which was all the log said."""
    holder = await asyncpg.connect(db_url)
    try:
        async with holder.transaction():
            # The round's first write (`_record_round`) waits on this row.
            await holder.execute(
                "INSERT INTO deployment (key, value) VALUES ($1, '{}') "
                "ON CONFLICT (key) DO UPDATE SET value = '{}'",
                maintenance.ROUND_KEY,
            )
            running = asyncio.create_task(maintenance.run_round(state.pool, 30))
            waiting = (
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INSERT INTO deployment%'"
            )
            await eventually(lambda: state.pool.fetchval(waiting), "the round waiting")
            await holder.execute("SELECT pg_terminate_backend($1)", await holder.fetchval(waiting))
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)) as ended:
                await running
    finally:
        await holder.close()
    assert "terminating connection due to administrator command" in str(ended.value)
    held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    assert await state.pool.fetchval(held) == 0
    assert await maintenance.run_round(state.pool, 30) is not None


async def test_m20_reorder_waits_for_a_build_in_flight_and_holds_no_table_meanwhile(
    state: AppState, admin: Caller, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`engram maintain-search --reorder` while a round (or a write's build) runs CREATE INDEX
    CONCURRENTLY: its table lock, asked for then, was granted only once the build ended, and
    every read and write of memory queued behind it meanwhile (minutes for a large agent; each
    request CONFLICT at ENGRAM_LOCK_TIMEOUT_SECONDS). It waits for the round's lock instead,
    asking between statements: a statement waiting for it would hold a snapshot the build waits
    out (deadlock, one of them undone)."""
    monkeypatch.setattr(maintenance, "HOLD_RETRY_SECONDS", 0.05)
    agent, other = await make_search_agent(state, admin), await make_search_agent(state, admin)
    ids = await fill(agent, 40)
    await fill(other, 3)
    writer = await asyncpg.connect(db_url)
    reorderer = await asyncpg.connect(db_url)
    try:
        running = await building_behind(state, writer, ids[0])
        pid = await reorderer.fetchval("SELECT pg_backend_pid()")
        reordering = asyncio.create_task(maintenance.reorder(reorderer))
        asked = (
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND (query LIKE "
            "'%pg_try_advisory_lock%' OR (query LIKE 'LOCK TABLE%' AND wait_event_type = 'Lock'))"
        )
        await eventually(lambda: state.pool.fetchval(asked, pid), "the reorder waiting")
        async with state.pool.acquire() as reader, reader.transaction():
            # Another agent's records are read meanwhile, without waiting.
            await reader.execute("SET LOCAL lock_timeout = '200ms'")
            count = "SELECT count(*) FROM agent_memories WHERE action_id = $1"
            assert await reader.fetchval(count, other.action_id) == 3
        assert not reordering.done()
        await writer.execute("COMMIT")
        done = await asyncio.wait_for(running, 30)
        await asyncio.wait_for(reordering, 30)
    finally:
        await writer.close()
        await reorderer.close()
    assert done is not None and done.failed == [] and len(done.built) == 2
    held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    assert await state.pool.fetchval(held) == 0
