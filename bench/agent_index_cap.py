"""What each agent with its own search indexes costs every other statement on agent_memories.

A large agent's own HNSW and GIN indexes are partial indexes of agent_memories
(app/memory/maintenance.py), and `ENGRAM_AGENT_INDEX_MAX_AGENTS` caps how many agents have
them. Planning a statement on the table opens and locks every index of it and tests every
partial index's predicate; an INSERT tests them all and opens and locks each one. This loads
--agents agents of --records records each into a scratch database, gives the first N of them
their own indexes (N = each of --steps, built in turn), and for each N times, server side:

- planning the index plan's search statement for a listed agent (EXPLAIN (SUMMARY), the SQL
  app/memory/search_store.py builds): what a search pays until its connection caches a
  generic plan of its statement (asyncpg keeps 100 statements per connection, and an agent
  with own indexes has a statement text of its own);
- planning the exact plan's statement for an unlisted agent (cached generic after five runs);
- an insert of --batch records into an unlisted agent (copy_committed, as addAgentMemories
  and imports write), in a transaction rolled back;
- the relation locks the planned search statement holds, and PostgreSQL's lock table size.

    python bench/agent_index_cap.py                     # 500 agents x 40 records, N 0..500
    python bench/agent_index_cap.py --steps 0,50,100 --samples 100

Its server runs in --data-dir (by default a new /tmp/engram-capbench-*, removed at the end).
"""

import argparse
import asyncio
import contextlib
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import NEW_AGENT, bench_record, fresh_database  # noqa: E402

from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import maintenance, search_store  # noqa: E402
from app.memory import search as search_module  # noqa: E402
from app.memory.search_store import Filters  # noqa: E402
from app.memory.store import copy_committed  # noqa: E402
from app.memory.vectors import memory_text  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402

TOPICS = ["dogs and cats", "train timetables", "quarterly revenue", "mountain hiking", "jazz"]
QUERY = "hiking in the mountains with the dog"


class Capture:
    """A connection that keeps the SQL of the last fetch instead of running it."""

    def __init__(self) -> None:
        self.sql: tuple[Any, ...] = ()

    async def fetch(self, *args: Any) -> list[Any]:
        self.sql = args
        return []

    async def fetchrow(self, *args: Any) -> Any:
        self.sql = args
        return None


async def load(pool: asyncpg.Pool, embedder: StaticEmbedder, agents: int, records: int) -> list:
    keys = [(uuid.uuid4(), uuid.uuid4()) for _ in range(agents)]
    texts = [f"Note {i} about {TOPICS[i % len(TOPICS)]}" for i in range(records)]
    vectors = (await embedder.embed([memory_text(t, "") for t in texts])).vectors
    async with pool.acquire() as conn, conn.transaction():
        for account, action in keys:
            await conn.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'b')", account)
            await conn.execute(NEW_AGENT, account, action)
            rows = [bench_record(account, action, t) for t in texts]
            await copy_committed(conn, rows, vectors)
    await pool.execute("VACUUM ANALYZE agent_memories")
    return keys


async def give_indexes(pool: asyncpg.Pool, keys: list) -> None:
    """Own indexes for these agents, as a round builds them (CREATE INDEX CONCURRENTLY)."""
    async with pool.acquire() as conn:
        states = await maintenance._agent_index_states(conn)
        for key in keys:
            await maintenance._build(conn, *key, states)


def planning_ms(plan: list[asyncpg.Record]) -> float:
    line = next(r[0] for r in plan if r[0].startswith("Planning Time"))
    return float(re.search(r"([\d.]+) ms", line).group(1))  # type: ignore[union-attr]


async def measure(
    pool: asyncpg.Pool, embedder: StaticEmbedder, keys: list, n: int, samples: int, batch_rows: int
):
    vector = (await embedder.embed([QUERY])).vectors[0]
    ranking = search_module.make_ranking("hybrid", QUERY, vector, None, 10)
    capture = Capture()
    listed, unlisted = OperatorReader(*keys[0]), OperatorReader(*keys[-1])
    async with pool.acquire() as conn:  # None when n is 0
        records = await search_store.listed_records(conn, listed)
    await search_store.ranked_index(capture, listed, Filters(), ranking, records)
    index_sql = capture.sql
    with contextlib.suppress(LookupError):  # it reads the gate's answer from no rows
        await search_store.ranked_exact(capture, unlisted, Filters(), ranking, 10_000)
    exact_sql = capture.sql
    figures: dict[str, float] = {}
    async with pool.acquire() as conn:
        for name, (sql, *args) in (("index plan", index_sql), ("exact plan", exact_sql)):
            times = []
            for _ in range(samples):
                times.append(planning_ms(await conn.fetch("EXPLAIN (SUMMARY) " + sql, *args)))
            figures[f"plan {name}"] = statistics.median(times)
        async with conn.transaction():
            await conn.fetch("EXPLAIN " + index_sql[0], *index_sql[1:])
            figures["locks"] = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                "AND locktype = 'relation'"
            )
        batch = [bench_record(*keys[-1], f"jazz note {i}") for i in range(batch_rows)]
        times = []
        for _ in range(samples):
            tr = conn.transaction()
            await tr.start()
            try:
                started = time.perf_counter()
                await copy_committed(conn, batch, [vector] * batch_rows)
                times.append((time.perf_counter() - started) * 1000)
            finally:
                await tr.rollback()
        figures["insert"] = statistics.median(times)
    return figures


async def run(args: argparse.Namespace) -> None:
    pg = EmbeddedPostgres(Path(args.data_dir) / "pgdata")
    embedder = StaticEmbedder()
    url = await fresh_database(pg, "agent_index_cap", embedder)
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        keys = await load(pool, embedder, args.agents, args.records)
        lock_table = await pool.fetchval(
            "SELECT current_setting('max_locks_per_transaction')::int"
            " * (current_setting('max_connections')::int"
            " + current_setting('max_prepared_transactions')::int)"
        )
        print(f"# {args.agents} agents x {args.records} records; lock table {lock_table} slots")
        print(
            "own-index agents | plan index stmt | plan exact stmt"
            f" | insert {args.batch} rows (COPY) | locks"
        )
        have = 0
        for n in sorted(int(s) for s in args.steps.split(",")):
            started = time.perf_counter()
            await give_indexes(pool, keys[have:n])
            built = time.perf_counter() - started
            have = n
            f = await measure(pool, embedder, keys, n, args.samples, args.batch)
            print(
                f"{n:16d} | {f['plan index plan']:12.2f} ms | {f['plan exact plan']:12.2f} ms"
                f" | {f['insert']:20.2f} ms | {int(f['locks']):5d}   (built in {built:.0f} s)",
                flush=True,
            )
    finally:
        await pool.close()
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=None, help="default: a new /tmp/engram-capbench-*")
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--records", type=int, default=40, help="records per agent")
    parser.add_argument("--steps", default="0,50,200,500", help="agents with own indexes")
    parser.add_argument("--samples", type=int, default=50, help="timings per figure (median)")
    parser.add_argument("--batch", type=int, default=100, help="records per timed insert")
    args = parser.parse_args()
    scratch = args.data_dir is None
    if scratch:
        args.data_dir = tempfile.mkdtemp(prefix="engram-capbench-", dir="/tmp")
    if max(int(s) for s in args.steps.split(",")) > args.agents:
        parser.error("--steps cannot exceed --agents")
    print(f"# data in {args.data_dir}")
    try:
        asyncio.run(run(args))
    finally:
        if scratch:
            shutil.rmtree(args.data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
