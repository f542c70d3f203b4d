"""The purge of old administrative events (app/auth/events_store.py `forget_older_than`, run by
each process's liveness sweep, app/runtime/liveness.py) over a backlog: OLD events older than
the retention (a year, the default) among KEPT newer ones, in 20 accounts, the old ones written
first. The purge runs as back-to-back sweeps would (each call at most PURGE_BATCHES batches of
PURGE_BATCH), by PURGERS processes at once, while another connection records an event in its
own transaction every 5 ms, as admin mutations do.

Prints the whole purge's time, its calls' (a sweep's share) and batches' longest, the writes'
latency before and during it, and a call that finds nothing old once done (what every
heartbeat costs afterwards).

    python bench/event_purge.py                          # 1,000,000 old among 200,000 kept
    python bench/event_purge.py --old 100000 --kept 20000 --purgers 2
"""

import argparse
import asyncio
import atexit
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import fresh_database  # noqa: E402

from app.auth import events_store  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import bounds, create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402

RETENTION_DAYS = 365
ACCOUNTS = 20
WRITE_EVERY = 0.005


async def load(conn: asyncpg.Connection, accounts: list[uuid.UUID], count: int, low: int) -> None:
    """`count` events spread over the accounts, `low` to `low` + 300 days old, oldest first."""
    chunk = 100_000
    for start in range(0, count, chunk):
        await conn.execute(
            """
            INSERT INTO admin_events (account_id, at, actor, actor_token, operation,
                target_kind, target, target_principal, changes)
            SELECT ($1::uuid[])[1 + i % array_length($1, 1)],
                   now() - make_interval(days => $4)
                       - (1 - i::float8 / ($2::int + $3::int)) * interval '300 days',
                   'job-runner', gen_random_uuid(), 'createClientToken', 'token',
                   gen_random_uuid()::text, 'job-runner', '{"expires": "2026-12-08T10:00:00Z"}'
            FROM generate_series($2::int, $2::int + $3::int - 1) i
            """,
            accounts,
            start,
            min(chunk, count - start),
            low,
        )


async def writes(pool: asyncpg.Pool, account_id: uuid.UUID, until: asyncio.Event) -> list[float]:
    """Each event's write, in its own transaction, every WRITE_EVERY s until `until`: seconds."""
    actor = events_store.Actor("admin", account_id, uuid.uuid4())
    took = []
    async with pool.acquire() as conn:
        while not until.is_set():
            began = time.perf_counter()
            async with conn.transaction():
                await events_store.record(
                    conn,
                    actor,
                    "createClientToken",
                    account_id=account_id,
                    kind="token",
                    target=str(uuid.uuid4()),
                    principal="job-runner",
                )
            took.append(time.perf_counter() - began)
            await asyncio.sleep(WRITE_EVERY)
    return took


def latency(took: list[float]) -> str:
    ms = sorted(t * 1000 for t in took)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{len(ms)} writes, p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f}, max {ms[-1]:.1f}"


async def purge(pool: asyncpg.Pool, calls: list[float]) -> int:
    """Calls as back-to-back sweeps would until none is left: events deleted."""
    deleted = 0
    async with pool.acquire() as conn:
        while True:
            began = time.perf_counter()
            done, more = await events_store.forget_older_than(conn, RETENTION_DAYS)
            calls.append(time.perf_counter() - began)
            deleted += done
            if not more:
                return deleted


async def measure(pg: EmbeddedPostgres, args: argparse.Namespace) -> None:
    url = await fresh_database(pg, "engram_event_purge", StaticEmbedder())
    conn = await asyncpg.connect(url)
    accounts = [uuid.uuid4() for _ in range(ACCOUNTS)]
    await conn.executemany(
        "INSERT INTO accounts (account_id, name) VALUES ($1, $2)",
        [(a, f"tenant {i}") for i, a in enumerate(accounts)],
    )
    began = time.perf_counter()
    await load(conn, accounts, args.old, RETENTION_DAYS + 1)
    await load(conn, accounts, args.kept, 0)
    await conn.execute("VACUUM ANALYZE admin_events")
    size = await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('admin_events'))")
    print(
        f"loaded {args.old:,} old and {args.kept:,} kept events ({size}) in "
        f"{time.perf_counter() - began:.0f} s"
    )

    # The service's bounds on statements and lock waits (app/db/pool.py).
    s = Settings()
    limits = bounds(
        s.statement_timeout_seconds, s.lock_timeout_seconds, s.idle_in_transaction_seconds
    )
    pool = await create_pool(url, min_size=1, max_size=args.purgers + 1, limits=limits)
    until = asyncio.Event()
    writer = asyncio.create_task(writes(pool, accounts[0], until))
    await asyncio.sleep(args.baseline)
    until.set()
    print(f"writes before the purge: {latency(await writer)}")

    until = asyncio.Event()
    writer = asyncio.create_task(writes(pool, accounts[0], until))
    calls: list[list[float]] = [[] for _ in range(args.purgers)]
    began = time.perf_counter()
    deleted = await asyncio.gather(*(purge(pool, c) for c in calls))
    took = time.perf_counter() - began
    until.set()
    during = await writer
    every = [c for each in calls for c in each]
    batch = events_store.PURGE_BATCH * events_store.PURGE_BATCHES
    print(
        f"purge by {args.purgers}: {sum(deleted):,} deleted "
        f"({', '.join(f'{d:,}' for d in deleted)})"
        f" in {took:.1f} s, {len(every)} calls of up to {batch:,} events: p50 "
        f"{statistics.median(every) * 1000:.0f} ms, max {max(every) * 1000:.0f} ms"
    )
    print(f"writes during the purge: {latency(during)}")
    left = await conn.fetchval("SELECT count(*) FROM admin_events")
    for when in ("after the purge", "after VACUUM"):
        if when == "after VACUUM":
            await conn.execute("VACUUM admin_events")
        took = []
        for _ in range(5):
            began = time.perf_counter()
            assert await events_store.forget_older_than(conn, RETENTION_DAYS) == (0, False)
            took.append(time.perf_counter() - began)
        print(
            f"a call that finds nothing old, {when}: first {took[0] * 1000:.2f} ms, "
            f"then {statistics.median(took[1:]) * 1000:.2f} ms"
        )
    print(f"{left:,} events left")
    await conn.close()
    await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=int, default=1_000_000)
    parser.add_argument("--kept", type=int, default=200_000)
    parser.add_argument("--purgers", type=int, default=1, help="processes purging at once")
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of writes alone")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args()
    print("# python bench/event_purge.py " + shlex.join(sys.argv[1:]))
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="engram-event-purge-"))
    if args.data_dir is None:
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    pg = EmbeddedPostgres(root / "pgdata")
    try:
        asyncio.run(measure(pg, args))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
