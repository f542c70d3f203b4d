"""The plans of an agent's listings filtered by kind: `Action.memories(kind:)` and
`searchMemories(kind:)` without a query read the records of that kind by their index
(migration 0033), not the agent's records by time until a page is full. A kind few or none of a
200,000-record agent's live records hold read the whole agent: 50-500 ms (bench/README.md,
`kind_listing.py`)."""

from typing import Any
from uuid import UUID

import pytest
from factories import Capture, SearchAgent, make_search_agent

from app.auth.caller import Caller
from app.memory import search_store, store
from app.memory.store import RECORD_COLUMNS
from app.state import AppState


async def _copies_around(pool: Any, source: UUID, copies: int) -> None:
    """`copies` more rows like record `source`, each an ID of its own, a second apart, half
    before it and half after it."""
    columns = [c for c in (*RECORD_COLUMNS, "embedding") if c not in ("memory_id", "created")]
    await pool.execute(
        f"INSERT INTO agent_memories (memory_id, created, {', '.join(columns)}) "
        f"SELECT gen_random_uuid(), created + (g - $2 / 2) * interval '1 second', "
        f"{', '.join(columns)} FROM agent_memories, generate_series(1, $2) g "
        "WHERE memory_id = $1",
        source,
        copies,
    )


def _reads(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's scans of agent_memories."""
    found = [plan] if plan.get("Relation Name") == "agent_memories" else []
    for child in plan.get("Plans", []):
        found += _reads(child)
    return found


def _rows_read(reads: list[dict[str, Any]]) -> float:
    """The rows those scans read, kept or not (a scan's counts are each loop's average)."""
    return sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in reads
    )


async def _explained(conn: Any, sql: str, values: list[Any], mode: str) -> dict[str, Any]:
    async with conn.transaction():
        await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
        # The pool's connections decode json.
        return (await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *values))[0]["Plan"]


@pytest.fixture
async def agent(state: AppState, admin: Caller) -> SearchAgent:
    """3,000 facts a second apart, and three references among them."""
    agent = await make_search_agent(state, admin)
    fact = await agent.add("A fact")
    await agent.add("A reference", kind="reference")
    await agent.add("Another reference", kind="reference")
    await agent.add("A third reference", kind="reference")
    await _copies_around(state.pool, fact, 3000)
    await state.pool.execute("ANALYZE agent_memories")
    return agent


@pytest.mark.parametrize("ascending", [False, True])
@pytest.mark.parametrize("statuses", [None, ["ACTIVE"]])
async def test_a_kind_few_records_hold_is_listed_from_its_index(
    agent: SearchAgent, ascending: bool, statuses: list[str] | None
) -> None:
    references = await agent.state.pool.fetch(
        "SELECT memory_id FROM agent_memories WHERE action_id = $1 AND kind = 'reference'"
        f" ORDER BY created {'ASC' if ascending else 'DESC'}",
        agent.action_id,
    )
    async with agent.state.pool.acquire() as conn:
        for kind, listed in (("reference", references), ("procedure", [])):
            f = store.ListFilters(kind=kind, statuses=statuses)
            page = await store.list_page(
                conn, agent.operator, after=None, limit=50, ascending=ascending, filters=f
            )
            assert [r["memory_id"] for r in page] == [r["memory_id"] for r in listed]
            # The statement list_page sends, planned for its values as it plans it.
            sql, values = store._page(agent.operator, None, 50, ascending, f)
            reads = _reads(await _explained(conn, sql, values, "force_custom_plan"))
            assert {n.get("Index Name") for n in reads} == {"agent_memories_kind"}
            assert _rows_read(reads) == len(listed)


async def test_search_memories_without_a_query_lists_a_kind_from_its_index(
    agent: SearchAgent,
) -> None:
    async with agent.state.pool.acquire() as conn:
        captured = Capture(conn)
        found = await search_store.newest(
            captured, agent.operator, search_store.Filters(kind="reference"), after=None, limit=10
        )
        assert [r.summary for r in found] == [
            "A third reference",
            "Another reference",
            "A reference",
        ]
        # The plan the statement's cached plan runs, for any kind (generic).
        sql, *values = captured.sql
        reads = _reads(await _explained(conn, sql, values, "force_generic_plan"))
    assert {n.get("Index Name") for n in reads} == {"agent_memories_kind"}
    assert _rows_read(reads) == 3


class _Recording:
    """A connection that records the SQL and values of its last fetch."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.sql = conn, ("",)

    def transaction(self) -> Any:
        return self.conn.transaction()

    async def execute(self, *args: Any) -> Any:
        return await self.conn.execute(*args)

    async def fetch(self, *args: Any) -> Any:
        self.sql = args
        return await self.conn.fetch(*args)


async def test_several_agents_pages_of_a_kind_are_read_from_its_index(
    agent: SearchAgent, state: AppState, admin: Caller
) -> None:
    # `actions { memories(kind:) }`: one statement reads each agent's page (store.list_pages).
    small = await make_search_agent(state, admin)
    theirs = await small.add("Their reference", kind="reference")
    async with state.pool.acquire() as conn:
        recording = _Recording(conn)
        pages = await store.list_pages(
            recording,
            admin.account_id,
            [(agent.action_id, None, 50), (small.action_id, None, 50)],
            ascending=False,
            filters=store.ListFilters(kind="reference"),
        )
        assert [len(p) for p in pages] == [3, 1] and pages[1][0]["memory_id"] == theirs
        sql, *values = recording.sql
        reads = _reads(await _explained(conn, sql, values, "force_custom_plan"))
    assert {n.get("Index Name") for n in reads} == {"agent_memories_kind"}
    assert _rows_read(reads) == 4
