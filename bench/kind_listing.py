"""`Action.memories(kind:)` and `searchMemories(kind:)` without a query on a large agent, for a
common kind, a rare one and absent ones, with each candidate index.

Loads one agent into a scratch database: RECORDS records over 30 days, of kinds `fact` (60%,
a tenth of them superseded), `event` (30%) and `preference` (10%), but for RARE records of
`reference` and NOTE of `note` (every one superseded: no live record), each spread over the
whole time; none of `procedure`; ANALYZE. Then, for each `--variant` (indexes made and dropped
in that database):

- `none`: the tables before migration 0033 (its index dropped);
- `kind`: as migrated: 0033's `agent_memories_kind` on `(account_id, action_id, kind, created,
  memory_id)`;
- `kind-live`: the kind index partial: the rows a listing shows without a status filter
  (`pending_execution IS NULL AND (status = 'ACTIVE' OR (preview AND tombstone))`);
- `created-kind`: no kind index, `agent_memories_created` with `kind` after its keyset columns;

and each kind, it times the listing's first page of 50 and a page after the 100th record of
the kind (or, for a kind with fewer, the middle of the agent's time), newest and oldest first,
without and with `statuses: [ACTIVE]`, as `app.memory.store.list_page` sends it, and
`searchMemories`' first page (`app.memory.search_store.newest`, a prepared statement reused:
the plan PostgreSQL caches from its sixth run). p50 / p95 ms of runs 5-24; the size of the
variant's index; the time to build it. With `--ranked`, also a hybrid `searchMemories` of each
kind (`app.memory.search.ranked`, as it plans it): whether the index changes a ranked plan.

With `--writes N`, instead: N records inserted into that agent (`store.copy_committed`) and N
of its records' status changed (one UPDATE), each in a transaction rolled back, with each
variant in turn, `--rounds` times: records/s and the database server process's CPU a record
(from /proc: the machine's other jobs slow it less than they slow the wall clock).

    python bench/kind_listing.py [--records 200000] [--rare 200] [--note 1000]
        [--variant none kind kind-live created-kind] [--data-dir DIR]
        [--ranked] [--writes 2000 --rounds 8]
"""

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import bench_record, load_agent, run_scratch  # noqa: E402

from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import search as search_module  # noqa: E402
from app.memory import search_store, store  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402

WORDS = ["order", "refund", "coffee", "espresso", "manager", "outage", "delivery", "invoice"]
KINDS = ["fact", "event", "preference", "reference", "note", "procedure"]

CREATED = """
    CREATE INDEX agent_memories_created ON agent_memories
        (account_id, action_id, created DESC, memory_id DESC)
"""
# Migration 0033's index: each variant but `kind` drops it first and builds it again after.
KIND = """
    CREATE INDEX agent_memories_kind ON agent_memories
        (account_id, action_id, kind, created, memory_id)
"""
WITHOUT_KIND = "DROP INDEX agent_memories_kind"
VARIANTS = {
    "none": ([WITHOUT_KIND], [KIND]),
    "kind": ([], []),
    "kind-live": (
        [
            WITHOUT_KIND,
            "CREATE INDEX agent_memories_kind ON agent_memories"
            " (account_id, action_id, kind, created, memory_id)"
            " WHERE pending_execution IS NULL AND (status = 'ACTIVE' OR (preview AND tombstone))",
        ],
        [WITHOUT_KIND, KIND],
    ),
    "created-kind": (
        [
            WITHOUT_KIND,
            "DROP INDEX agent_memories_created",
            "CREATE INDEX agent_memories_created ON agent_memories"
            " (account_id, action_id, created DESC, memory_id DESC, kind)",
        ],
        ["DROP INDEX agent_memories_created", CREATED, KIND],
    ),
}


def scopes(args: argparse.Namespace) -> list[dict]:
    """Every record's columns, oldest first."""
    start = datetime.now(UTC) - timedelta(days=30)
    step = timedelta(days=30) / args.records
    rare = {round((k + 0.5) * args.records / args.rare) for k in range(args.rare)}
    note = {round((k + 0.3) * args.records / args.note) for k in range(args.note)}
    rows = []
    for i in range(args.records):
        columns: dict = {"created": start + i * step}
        if i in rare:
            columns["kind"] = "reference"
        elif i in note:
            columns |= {"kind": "note", "status": "SUPERSEDED"}
        elif i % 10 < 6:
            columns["kind"] = "fact"
            if i % 100 < 6:
                columns["status"] = "SUPERSEDED"
        elif i % 10 < 9:
            columns["kind"] = "event"
        else:
            columns["kind"] = "preference"
        rows.append(columns)
    return rows


def timed_runs(samples: list[float]) -> str:
    kept = sorted(samples[4:])
    p95 = kept[min(len(kept) - 1, int(0.95 * len(kept)))]
    return f"{statistics.median(kept):.1f} / {p95:.1f}"


async def plan_of(conn, sql: str, values: list) -> str:
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *values)
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    found = []
    while plan is not None:
        if "Index Name" in plan:
            found.append(f"{plan['Node Type']} on {plan['Index Name']}")
        elif plan["Node Type"] not in ("Limit",):
            found.append(plan["Node Type"])
        plan = (plan.get("Plans") or [None])[0]
    return ", ".join(found)


def cpu_ms(pid: int) -> float:
    """The CPU time (user and system) process `pid` has used, in ms: a server process's own
    work, which other processes on the machine slow less than they slow the wall clock."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def writes(conn, account, action, embedder, count: int) -> dict[str, float]:
    """Records/s inserted (`copy_committed`, as imports and the benchmarks write) and updated
    (a status change, which writes every index's entry again), into the loaded agent, each in a
    transaction rolled back; and for each, the server process's CPU ms a record."""
    records = [
        bench_record(account, action, WORDS[i % len(WORDS)], kind=KINDS[i % 4])
        for i in range(count)
    ]
    vectors = (await embedder.embed([r.summary for r in records])).vectors
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    found: dict[str, float] = {}

    async def timed(name: str, write) -> None:
        tr = conn.transaction()
        await tr.start()
        try:
            cpu, t = cpu_ms(pid), time.perf_counter()
            await write()
            found[name] = count / (time.perf_counter() - t)
            found[f"{name} cpu"] = (cpu_ms(pid) - cpu) / count
        finally:
            await tr.rollback()

    await timed("insert", lambda: store.copy_committed(conn, records, vectors))
    await timed(
        "update",
        lambda: conn.execute(
            "UPDATE agent_memories SET status = 'DELETED', version = version + 1"
            " WHERE memory_id IN (SELECT memory_id FROM agent_memories WHERE account_id = $1"
            " AND action_id = $2 AND status = 'ACTIVE' ORDER BY random() LIMIT $3)",
            account,
            action,
            count,
        ),
    )
    return found


async def measure(url: str, args: argparse.Namespace) -> None:
    pool = await create_pool(url, min_size=1, max_size=2)
    embedder = StaticEmbedder()
    try:
        started = time.perf_counter()
        account, action = await load_agent(pool, embedder, WORDS, scopes(args))
        async with pool.acquire() as conn:
            await conn.execute("VACUUM ANALYZE agent_memories")
            counts = await conn.fetch(
                "SELECT kind, count(*) AS n, count(*) FILTER (WHERE status = 'ACTIVE') AS live"
                " FROM agent_memories GROUP BY 1 ORDER BY 2 DESC"
            )
        print(
            f"# {args.records:,} records loaded in {time.perf_counter() - started:.0f} s: "
            + ", ".join(f"{r['kind']} {r['n']:,} ({r['live']:,} live)" for r in counts)
        )
        reader = OperatorReader(account, action)
        query = "refund for the coffee order"
        vector = (await embedder.embed([query])).vectors[0]
        ranking = search_module.make_ranking("hybrid", query, vector, None, 10)
        if args.writes:
            rates: dict[str, list[dict[str, float]]] = {v: [] for v in args.variant}
            async with pool.acquire() as conn:
                await writes(conn, account, action, embedder, args.writes)  # warm
                for _ in range(args.rounds):
                    for variant in args.variant:
                        make, undo = VARIANTS[variant]
                        for sql in make:
                            await conn.execute(sql)
                        rates[variant].append(
                            await writes(conn, account, action, embedder, args.writes)
                        )
                        for sql in undo:
                            await conn.execute(sql)
            print(f"\n## writes of {args.writes:,} records, {args.rounds} rounds alternated")
            print(
                "| variant | inserted records/s, median (each round) | insert: server CPU us"
                " a record | updated records/s | update: CPU us |"
            )
            print("| --- | --- | --- | --- | --- |")
            for variant, found in rates.items():

                def of(name: str, found=found) -> list[float]:
                    return [r[name] for r in found]

                def rate(name: str, of=of) -> str:
                    return (
                        f"{statistics.median(of(name)):,.0f}"
                        f" ({', '.join(f'{r:,.0f}' for r in of(name))})"
                    )

                def work(name: str, of=of) -> str:
                    return f"{statistics.median(of(name + ' cpu')) * 1000:.0f}"

                print(
                    f"| {variant} | {rate('insert')} | {work('insert')} | {rate('update')} |"
                    f" {work('update')} |",
                    flush=True,
                )
            return
        for variant in args.variant:
            make, undo = VARIANTS[variant]
            async with pool.acquire() as conn:
                built = time.perf_counter()
                for sql in make:
                    await conn.execute(sql)
                built = time.perf_counter() - built
                await conn.execute("ANALYZE agent_memories")
                size = await conn.fetchval(
                    "SELECT pg_size_pretty(sum(pg_relation_size(indexrelid)))"
                    " FROM pg_index WHERE indrelid = 'agent_memories'::regclass"
                    " AND indexrelid::regclass::text"
                    " IN ('agent_memories_kind', 'agent_memories_created')"
                )
                print(f"\n## {variant}: built in {built:.2f} s; created/kind indexes {size}")
                print("| kind | page | order | status | p50 / p95 ms | plan |")
                print("| --- | --- | --- | --- | --- | --- |")
                for kind in KINDS:
                    keysets = await conn.fetch(
                        "SELECT created, memory_id FROM agent_memories WHERE kind = $1"
                        " AND status = 'ACTIVE' ORDER BY created DESC, memory_id DESC",
                        kind,
                    )
                    asc_keysets = keysets[::-1]
                    for ascending in (False, True):
                        ordered = asc_keysets if ascending else keysets
                        if len(ordered) > 100:
                            later = tuple(ordered[99])
                        else:
                            later = tuple(
                                await conn.fetchrow(
                                    "SELECT created, memory_id FROM agent_memories"
                                    " ORDER BY created OFFSET $1 LIMIT 1",
                                    args.records // 2,
                                )
                            )
                        for page, after in (("first", None), ("after 100th", later)):
                            for statuses in (None, ["ACTIVE"]):
                                f = store.ListFilters(kind=kind, statuses=statuses)
                                times = []
                                for _ in range(24):
                                    t = time.perf_counter()
                                    await store.list_page(
                                        conn,
                                        reader,
                                        after=after,
                                        limit=51,
                                        ascending=ascending,
                                        filters=f,
                                    )
                                    times.append((time.perf_counter() - t) * 1000)
                                sql, values = store._page(reader, after, 51, ascending, f)
                                plan = await plan_of(conn, sql, values)
                                print(
                                    f"| {kind} | {page} | {'asc' if ascending else 'desc'} |"
                                    f" {'ACTIVE' if statuses else ''} | {timed_runs(times)} |"
                                    f" {plan} |",
                                    flush=True,
                                )
                    times = []
                    for _ in range(24):
                        t = time.perf_counter()
                        await search_store.newest(
                            conn, reader, search_store.Filters(kind=kind), after=None, limit=51
                        )
                        times.append((time.perf_counter() - t) * 1000)
                    print(
                        f"| {kind} | searchMemories first | desc | | {timed_runs(times)} | |",
                        flush=True,
                    )
                    if args.ranked:
                        # A ranked search under the kind (not changed here: whether the new
                        # index changes its plan), as `search.ranked` plans it.
                        times, plans = [], set()
                        for _ in range(24):
                            t = time.perf_counter()
                            _, plan = await search_module.ranked(
                                pool, reader, search_store.Filters(kind=kind), ranking
                            )
                            times.append((time.perf_counter() - t) * 1000)
                            plans.add(plan)
                        print(
                            f"| {kind} | searchMemories hybrid | | | {timed_runs(times)} |"
                            f" {', '.join(sorted(plans))} plan |",
                            flush=True,
                        )
                for sql in undo:
                    await conn.execute(sql)
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rare", type=int, default=200)
    parser.add_argument("--note", type=int, default=1000)
    parser.add_argument("--variant", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument(
        "--writes", type=int, default=0, help="measure writes of this many records instead"
    )
    parser.add_argument("--ranked", action="store_true", help="and a hybrid search of each kind")
    parser.add_argument("--rounds", type=int, default=5, help="--writes: rounds alternated")
    args = parser.parse_args()
    run_scratch(args.data_dir, "engram-kinds-", lambda url: measure(url, args), StaticEmbedder())


if __name__ == "__main__":
    main()
