"""M56: paging Action.memories through 10,000 records returns each live record exactly once, in
order, while other writers add records."""

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from factories import commit, make_agent, work, writer

from app.actions.service import agent_principal
from app.memory import operator, store
from app.memory.records import MemoryRecord
from app.memory.service import NewMemory
from app.memory.vectors import memory_text

RECORDS = 10_000
PAGE = 100
BATCH = 1_000
PAGE_QUERY = """
query($a: UUID!, $after: String, $sort: SortOrder) {
  action(actionId: $a) {
    memories(first: 100, after: $after, sort: $sort) {
      edges { cursor node { memoryId created status } }
      pageInfo { hasNextPage endCursor }
    }
  }
}"""


async def load(state, agent, count: int) -> list[MemoryRecord]:
    """Committed records, embedded in batches and copied in; every three share a timestamp so
    that the keyset's tie-break on memoryId is exercised."""
    start = datetime.now(UTC) - timedelta(days=1)
    records = [
        MemoryRecord(
            account_id=agent.account_id,
            action_id=agent.action_id,
            memory_id=uuid.uuid4(),
            version=1,
            created=start + timedelta(milliseconds=i // 3),
            modified=start + timedelta(milliseconds=i // 3),
            summary=f"fact number {i} about customer {i % 97}",
            content="",
            metadata={},
            status="ACTIVE",
            scope="AGENT",
            kind="fact",
            source="TOOL",
            pinned=False,
            labels={5: f"c-{i % 97}"},
            replaces=None,
            replaced_by=None,
            preview=False,
            execution_id=uuid.uuid4(),
            invocation_number=1,
            action_version=1,
            session_id=f"s{i % 13}",
            modified_by=agent_principal(agent.action_id),
        )
        for i in range(count)
    ]
    async with state.pool.acquire() as conn:
        # Building the vector index row by row is what search benchmarks measure; paging does
        # not use it, and it would take most of this test's time.
        await conn.execute("DROP INDEX IF EXISTS agent_memories_embedding")
        for i in range(0, count, BATCH):
            batch = records[i : i + BATCH]
            embedded = await state.embedder.embed(
                [memory_text(r.summary, r.content) for r in batch]
            )
            async with conn.transaction():
                await store.copy_committed(conn, batch, list(embedded.vectors))
    return records


def key(node: dict) -> tuple[datetime, UUID]:
    return datetime.fromisoformat(node["created"].replace("Z", "+00:00")), UUID(node["memoryId"])


# M56
@pytest.mark.parametrize("sort", ["DESC", "ASC"])
async def test_m56_paging_10000_records_while_writers_add(state, gql, admin, sort):
    agent = await make_agent(state, admin)
    records = await load(state, agent, RECORDS)
    for r in records[::200]:  # deleted ones leave the listing
        await operator.delete_memory(
            state.pool, admin, action_id=agent.action_id, memory_id=r.memory_id
        )
    deleted = {r.memory_id for r in records[::200]}
    live = {r.memory_id for r in records} - deleted

    added: set[UUID] = set()
    stop = asyncio.Event()

    async def keep_adding(session: str) -> None:
        n = 0
        while not stop.is_set():
            unit = work(state, writer(agent, session=session))
            (record,) = await unit.add(
                NewMemory(summary=f"new {session} {n}", kind="fact", scope="AGENT")
            )
            await commit(state, unit)
            added.add(record.memory_id)
            n += 1
            await asyncio.sleep(0.01)  # a steady trickle, not a flood that starves the reader

    writers = [asyncio.create_task(keep_adding(f"w{i}")) for i in range(2)]
    seen: list[dict] = []
    after = None
    pages = 0
    try:
        while True:
            page = (
                await gql(admin, PAGE_QUERY, a=str(agent.action_id), after=after, sort=sort)
            ).ok()
            memories = page["action"]["memories"]
            seen += [e["node"] for e in memories["edges"]]
            assert all(e["cursor"] for e in memories["edges"])
            pages += 1
            if not memories["pageInfo"]["hasNextPage"]:
                break
            after = memories["pageInfo"]["endCursor"]
            await asyncio.sleep(0)  # let the writers in between pages
    finally:
        stop.set()
        await asyncio.gather(*writers)

    ids = [UUID(n["memoryId"]) for n in seen]
    assert len(ids) == len(set(ids)), "a record was returned twice"
    assert live <= set(ids), f"{len(live - set(ids))} live records were never returned"
    assert not set(ids) & deleted
    assert set(ids) - live <= added  # anything else is a record added while paging
    assert all(n["status"] == "ACTIVE" for n in seen)
    keys = [key(n) for n in seen]
    assert keys == sorted(keys, reverse=sort == "DESC"), "pages are out of order"
    assert pages >= len(live) // PAGE
    assert added, "the writers added nothing while the pages were read"
