"""The operator API on memory at scale: `Action.memories(first: 100)` and `agentMemory`.

Builds (once, then reuses) a dedicated embedded PostgreSQL under --data-dir holding
1,000,000 records spread over 1,000 agents (about 1,000 each: by default one agent per 1,000
records, every agent's rows scattered
through the table, 10% of them superseded or deleted, a few in preview, labels on some),
loaded with COPY through `app.memory.store.copy_committed`. Then it times, in process,
through the whole GraphQL layer (`schema.execute` with a `Context`, grants checked, every
field serialized), as a client with exactly the grants the spec asks for:

- `action(actionId) { memories(first: 100) { edges { cursor node {...} } pageInfo {...} } }`
  for random agents: the first page, and the page after it;
- the same first page asking each record's `action { name }` and `execution { status }`,
  with the statements it sends to PostgreSQL (DataLoaders: one per kind, whatever the page);
- `agentMemory(actionId, id) {...}` for random records;

and, for comparison, the same listing and read through the memory layer alone, and its SQL.

    python bench/memory_api.py                    # 1,000,000 records: ~10 minutes the first time
    python bench/memory_api.py --records 100000   # quick check (100 agents)
    python bench/memory_api.py --vectors          # also random 256-d unit vectors (+ HNSW build)

Vectors are NULL unless --vectors: neither operation reads them. The server is tuned for the
benchmark with ALTER SYSTEM (shared_buffers so the table stays in memory) and restarted.
"""

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import percentiles, statements_sent, tuned_server  # noqa: E402

from app.actions import service as actions  # noqa: E402
from app.auth.caller import Caller  # noqa: E402
from app.auth.policies import ADMIN_POLICIES, parse_policies  # noqa: E402
from app.auth.service import ensure_default_account  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import migrate  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings import store as embedding_store  # noqa: E402
from app.graphql.context import Context  # noqa: E402
from app.graphql.schema import schema  # noqa: E402
from app.memory import operator  # noqa: E402
from app.memory import store as memory_store  # noqa: E402
from app.memory.records import MemoryRecord  # noqa: E402
from app.memory.vectors import VECTOR_COLUMNS  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402
from app.state import AppState  # noqa: E402

DIMENSIONS = 256
BATCH = 50_000
SERVER_SETTINGS = {
    "shared_buffers": "3GB",
    "maintenance_work_mem": "1GB",
    "work_mem": "16MB",
    "effective_cache_size": "8GB",
    "random_page_cost": "1.1",
    "max_wal_size": "8GB",
    "synchronous_commit": "off",
    "autovacuum": "off",  # the load ends with its own VACUUM ANALYZE
}
HARNESS = {
    "memory": {
        "enabled": True,
        "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        "labels": {"customer_id": {"number": 5, "description": "The customer."}},
    }
}
TEXT = """customer account invoice refund shipping order delayed prefers phone email escalate
manager contract renewal discount address changed payment failed card expired support ticket
priority warehouse Oslo Berlin Lisbon weekly report meeting Monday deadline password reset login
error billing cycle annual plan upgrade downgrade trial"""
WORDS = TEXT.split()
KINDS = ("guidance", "fact", "event", "reference")
# What an operator console asks for in a listing, and for one record.
LIST_FIELDS = """id memoryId created modified version summary status scope kind source pinned
  labels { number value name } replaces replacedBy preview sessionId modifiedBy"""
READ_FIELDS = """id memoryId created modified version actionId summary content metadata status scope
  kind source pinned labels { number value name } replaces replacedBy preview executionId
  invocationNumber actionVersion sessionId modifiedBy"""
LIST = f"""query($a: UUID!, $after: String) {{ action(actionId: $a) {{
  memories(first: 100, after: $after) {{ edges {{ cursor node {{ {LIST_FIELDS} }} }}
  pageInfo {{ hasNextPage endCursor }} }} }} }}"""
LINKED = f"""query($a: UUID!) {{ action(actionId: $a) {{
  memories(first: 100) {{ edges {{ cursor node {{ {LIST_FIELDS}
    action {{ name }} execution {{ status }} }} }} pageInfo {{ hasNextPage endCursor }} }} }} }}"""
READ = f"query($a: UUID!, $id: UUID!) {{ agentMemory(actionId: $a, id: $id) {{ {READ_FIELDS} }} }}"


def server(data_dir: Path) -> EmbeddedPostgres:
    return tuned_server(data_dir, SERVER_SETTINGS)


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIMENSIONS), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def load(
    state: AppState, admin: Caller, records: int, agents: int, vectors: bool
) -> dict[str, float]:
    figures: dict[str, float] = {}
    pool = state.pool
    started = time.perf_counter()
    agent_ids = []
    for i in range(agents):
        created = await actions.create_action(
            pool, admin, name=f"agent {i}", instructions="", model=None, harness=HARNESS
        )
        agent_ids.append(created.action_id)
    figures["create_agents_s"] = time.perf_counter() - started

    async with pool.acquire() as conn:
        # Bulk load without secondary indexes, then build them: what a restore does.
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'agent_memories' "
            "AND indexname <> 'agent_memories_pkey'"
        )
        for index in indexes:
            await conn.execute(f'DROP INDEX "{index["indexname"]}"')

        rng = random.Random(11)
        vector_rng = np.random.default_rng(13)
        now = datetime(2026, 11, 1, tzinfo=UTC)
        started = time.perf_counter()
        for offset in range(0, records, BATCH):
            n = min(BATCH, records - offset)
            batch = []
            for i in range(offset, offset + n):
                # Rows in random agent order: each agent's records scatter through the table.
                action_id = agent_ids[rng.randrange(agents)]
                created = now - timedelta(seconds=rng.randrange(365 * 86400), microseconds=i)
                roll = rng.random()
                status = "SUPERSEDED" if roll < 0.06 else "DELETED" if roll < 0.10 else "ACTIVE"
                session = f"session-{rng.randrange(200)}"
                batch.append(
                    MemoryRecord(
                        account_id=admin.account_id,
                        action_id=action_id,
                        memory_id=uuid.uuid4(),
                        version=1,
                        created=created,
                        modified=created,
                        summary=sentence(rng, 12),
                        content=sentence(rng, 40) if rng.random() < 0.7 else "",
                        metadata={},
                        status=status,  # type: ignore[arg-type]
                        scope="SESSION" if rng.random() < 0.5 else "AGENT",
                        kind=KINDS[i % 4],
                        source="EXTRACTION" if rng.random() < 0.7 else "TOOL",
                        pinned=rng.random() < 0.01,
                        labels={5: f"customer-{rng.randrange(500)}"} if rng.random() < 0.3 else {},
                        replaces=None,
                        replaced_by=None,
                        preview=rng.random() < 0.02,
                        execution_id=uuid.uuid4(),
                        invocation_number=1,
                        action_version=1,
                        session_id=session,
                        modified_by=actions.agent_principal(action_id),
                    )
                )
            embeddings: list[np.ndarray | None] = (
                list(unit_vectors(vector_rng, n)) if vectors else [None] * n
            )
            await memory_store.copy_committed(conn, batch, embeddings)
            done = offset + n
            if done % 200_000 < BATCH or done == records:
                rate = done / (time.perf_counter() - started)
                print(f"  loaded {done:,}/{records:,} ({rate:,.0f} records/s)", flush=True)
        figures["copy_records_per_s"] = records / (time.perf_counter() - started)
        for index in indexes:
            if "embedding" in index["indexname"] and not vectors:
                await conn.execute(index["indexdef"])  # empty: NULL vectors are not indexed
                continue
            t = time.perf_counter()
            await conn.execute(index["indexdef"])
            figures[f"build_{index['indexname']}_s"] = time.perf_counter() - t
            print(f"  built {index['indexname']} in {time.perf_counter() - t:.0f} s", flush=True)
        t = time.perf_counter()
        await conn.execute("VACUUM ANALYZE agent_memories")
        await conn.execute("VACUUM ANALYZE agent_memory_versions")
        figures["vacuum_analyze_s"] = time.perf_counter() - t
    return figures


async def timed(work: Any) -> float:
    t = time.perf_counter()
    await work
    return (time.perf_counter() - t) * 1000


def cpu_figures(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples):6.2f}  mean {statistics.fmean(samples):6.2f} ms"


async def measure(
    state: AppState, reader: Caller, linked_reader: Caller, queries: int
) -> dict[str, str]:
    rng = random.Random(3)
    async with state.pool.acquire() as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        for relation in await conn.fetch(
            "SELECT c.oid::regclass::text AS name FROM pg_class c "
            "WHERE c.relname LIKE 'agent_memor%' AND c.relkind IN ('r', 'i', 't')"
        ):
            await conn.fetchval("SELECT pg_prewarm($1::regclass)", relation["name"])
        agents = [r["action_id"] for r in await conn.fetch("SELECT action_id FROM actions")]
        sample = await conn.fetch(
            "SELECT action_id, memory_id FROM agent_memories TABLESAMPLE SYSTEM (1) LIMIT $1",
            queries * 2,
        )

    async def run(query: str, who: Caller = reader, **variables: Any) -> dict[str, Any]:
        # A context per request, as the service makes: its DataLoaders cache for one request.
        context = Context(state, who)
        result = await schema.execute(query, variable_values=variables, context_value=context)
        assert not result.errors, result.errors
        assert result.data is not None
        return result.data

    # Warm up the code paths (strawberry builds its execution plans lazily).
    for _ in range(50):
        await run(LIST, a=str(rng.choice(agents)))
        pick = rng.choice(sample)
        await run(READ, a=str(pick["action_id"]), id=str(pick["memory_id"]))

    first_page, next_page, read, layer_list, layer_read, sql_list = [], [], [], [], [], []
    linked_page: list[float] = []
    list_cpu, read_cpu = [], []  # this process's CPU time: the GraphQL layer's own cost
    sizes = []
    load_before = os.getloadavg()[0]
    for _ in range(queries):
        agent = rng.choice(agents)
        t, cpu = time.perf_counter(), time.process_time()
        data = await run(LIST, a=str(agent))
        first_page.append((time.perf_counter() - t) * 1000)
        list_cpu.append((time.process_time() - cpu) * 1000)
        page = data["action"]["memories"]
        sizes.append(len(page["edges"]))
        if page["pageInfo"]["hasNextPage"]:
            next_page.append(
                await timed(run(LIST, a=str(agent), after=page["pageInfo"]["endCursor"]))
            )
        pick = rng.choice(sample)
        t, cpu = time.perf_counter(), time.process_time()
        found = await run(READ, a=str(pick["action_id"]), id=str(pick["memory_id"]))
        read.append((time.perf_counter() - t) * 1000)
        read_cpu.append((time.process_time() - cpu) * 1000)
        assert found["agentMemory"] is not None
        layer_list.append(
            await timed(
                operator.list_memories(
                    state.pool, reader, action_id=agent, limit=101, after=None, ascending=False
                )
            )
        )
        layer_read.append(
            await timed(
                operator.get_memory(
                    state.pool, reader, action_id=pick["action_id"], memory_id=pick["memory_id"]
                )
            )
        )
        async with state.pool.acquire() as conn:
            sql_list.append(
                await timed(
                    memory_store.list_page(
                        conn,
                        OperatorReader(reader.account_id, agent),
                        after=None,
                        limit=101,
                        ascending=False,
                    )
                )
            )
    assert min(sizes) == 100, "every agent should fill a first page"
    # Apart: its DataLoaders' tasks and futures make garbage-collector passes that would
    # land in the other figures.
    for _ in range(queries):
        linked_page.append(await timed(run(LINKED, linked_reader, a=str(rng.choice(agents)))))
    agent = rng.choice(agents)
    plain_statements = await statements_sent(state.pool, lambda: run(LIST, a=str(agent)))
    linked_statements = await statements_sent(
        state.pool, lambda: run(LINKED, linked_reader, a=str(agent))
    )
    load = f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    return {
        "Action.memories(first: 100), first page (GraphQL)": percentiles(first_page),
        "Action.memories(first: 100), next page (GraphQL)": percentiles(next_page),
        "the first page with each record's action and execution": percentiles(linked_page),
        "statements sent: the first page / with action and execution": (
            f"{plain_statements} / {linked_statements}"
        ),
        "agentMemory(actionId, id) (GraphQL)": percentiles(read),
        "memory layer: list 100 (no GraphQL)": percentiles(layer_list),
        "memory layer: read one (no GraphQL)": percentiles(layer_read),
        "SQL: one page of 101 rows (store.list_page)": percentiles(sql_list),
        "CPU of this process per memories page": cpu_figures(list_cpu),
        "CPU of this process per agentMemory": cpu_figures(read_cpu),
        "load average during the run": load,
    }


async def prepare(url: str, records: int, agents: int, vectors: bool, fresh: bool) -> AppState:
    pool = await create_pool(url, min_size=1, max_size=4)
    state = AppState(settings=Settings(database_url=url), pool=pool)
    async with pool.acquire() as conn:
        if await embedding_store.recorded_model(conn) is None:
            await embedding_store.record_model(conn, "bench:random-unit", DIMENSIONS)
            await embedding_store.set_dimensions(conn, DIMENSIONS, VECTOR_COLUMNS)
        account_id = await ensure_default_account(conn)
        loaded = await conn.fetchval("SELECT count(*) FROM agent_memories")
    admin = Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)
    if loaded != records or fresh:
        if loaded:
            raise SystemExit(f"the database holds {loaded:,} records; pass --fresh to rebuild it")
        print(f"loading {records:,} records over {agents:,} agents ...", flush=True)
        figures = await load(state, admin, records, agents, vectors)
        print("  " + json.dumps({k: round(v, 1) for k, v in figures.items()}), flush=True)
    else:
        print(f"reusing {loaded:,} records", flush=True)
    return state


async def main_async(args: argparse.Namespace, url: str) -> None:
    state = await prepare(url, args.records, args.agents, args.vectors, args.fresh)
    async with state.pool.acquire() as conn:
        account_id = await ensure_default_account(conn)
        per_agent = await conn.fetchval(
            "SELECT avg(n) FROM (SELECT count(*) n FROM agent_memories GROUP BY action_id) c"
        )

    def console(*resources: str) -> Caller:
        grant = {"effect": "ALLOW", "actions": ["SELECT"], "resources": list(resources)}
        return Caller(account_id, "console", parse_policies([grant]))

    # Exactly the spec's grants for listing and reading, and SELECT on the agent to reach it.
    listing = (
        "financial.AgentMemory.indexes.*",
        "financial.AgentMemory.document",
        "financial.Action.document",
    )
    reader = console(*listing)
    # The same, and SELECT on executions: what a page asking each record's execution needs.
    linked_reader = console(*listing, "financial.ActionExecution.document")
    try:
        results = await measure(state, reader, linked_reader, args.queries)
    finally:
        await state.pool.close()
    print(
        f"\n{args.records:,} records over {args.agents:,} agents "
        f"(about {per_agent:,.0f} per agent), in process, one client at a time:"
    )
    for name, figures in results.items():
        print(f"  {name:<52} {figures}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--agents", type=int, default=None, help="by default one per 1,000 records (at least 1)"
    )
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--vectors", action="store_true", help="random unit vectors, HNSW-indexed")
    parser.add_argument("--fresh", action="store_true", help="rebuild the database")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "engram-bench-memory"
    )
    args = parser.parse_args()
    if args.agents is None:
        # Agents of about 1,000 records: each fills a first page of 100 at any size.
        args.agents = max(1, args.records // 1000)
    pg = server(args.data_dir)
    name = f"engram_memory_api_{args.records}_{args.agents}{'_v' if args.vectors else ''}"

    async def create_database() -> None:
        conn = await asyncpg.connect(pg.uri())
        try:
            if args.fresh:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            exists = await conn.fetchval("SELECT true FROM pg_database WHERE datname = $1", name)
            if not exists:
                await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    try:
        asyncio.run(create_database())
        migrate.upgrade(pg.uri(name))
        args.fresh = False
        asyncio.run(main_async(args, pg.uri(name)))
    finally:
        pg.stop()
    print(f"\nreproduce: python bench/memory_api.py {shlex.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
