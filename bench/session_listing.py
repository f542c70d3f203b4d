"""`Action.memories(sessionId:)` on a large agent: the plan PostgreSQL chooses and its time.

Loads one agent into a scratch database: AGENT agent-scope records, SESSIONS sessions of PER
session-scope records each, written in turn (a session's records spread over the agent's whole
time), one session of BIG records spread the same way, one of BIG records before every other
record (a conversation long past), and one of 5; ANALYZE. For each session
(and one the agent never had) it prints the plan of the first page of 50 (newest first, then a
page after the 1,000th newest of the session) as `app.memory.store.list_page` sends it, planned
for its values: the indexes it reads, rows and buffers, and p50 / max ms of runs 9-16. Also the
time to build the session index again (REINDEX) and its size.

    python bench/session_listing.py [--agent 20000] [--sessions 1000] [--per 170] [--big 10000]
"""

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import load_agent, run_scratch  # noqa: E402

from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import store  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402

WORDS = ["order", "refund", "coffee", "espresso", "manager", "outage", "delivery", "invoice"]


def scopes(args: argparse.Namespace) -> list[dict]:
    """Every record's columns, oldest first: the sessions' records interleaved in time."""
    start = datetime.now(UTC) - timedelta(days=30)
    rows: list[dict] = []
    small = [("small", 5)]
    named = [(f"s{i}", args.per) for i in range(args.sessions)] + [("big", args.big)] + small
    total = args.agent + sum(n for _, n in named) + args.big
    # Each session's records at even steps over the whole time, the agent's in between.
    slots: list[tuple[float, dict]] = []
    for session, n in named:
        for k in range(n):
            slots.append(((k + 0.5) / n, {"scope": "SESSION", "session_id": session}))
    for k in range(args.agent):
        slots.append(((k + 0.25) / args.agent, {}))
    # And a session of BIG records before all others, one after another (a past conversation).
    for k in range(args.big):
        slots.append((-1 + k / args.big / 2, {"scope": "SESSION", "session_id": "old"}))
    slots.sort(key=lambda s: s[0])
    for i, (_, columns) in enumerate(slots):
        rows.append({**columns, "created": start + timedelta(milliseconds=i * 10)})
    assert len(rows) == total
    return rows


async def explained(conn, sql: str, values: list) -> dict:
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *values)
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]


def nodes(plan: dict) -> list[str]:
    found = []
    node = plan.get("Plan", plan)
    name = node["Node Type"]
    if "Index Name" in node:
        name += f" on {node['Index Name']}"
    found.append(
        f"{name} (rows {node.get('Actual Rows')}, hit+read "
        f"{node.get('Shared Hit Blocks', 0) + node.get('Shared Read Blocks', 0)})"
    )
    for child in node.get("Plans", []):
        found += nodes(child)
    return found


async def measure(url: str, args: argparse.Namespace) -> None:
    embedder = StaticEmbedder()
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        texts = [f"{a} {b} note" for a in WORDS for b in WORDS]
        started = time.perf_counter()
        account, action = await load_agent(pool, embedder, texts, scopes(args))
        async with pool.acquire() as conn:
            await conn.execute("ANALYZE agent_memories")
            total = await conn.fetchval("SELECT count(*) FROM agent_memories")
            print(f"# {total:,} records loaded in {time.perf_counter() - started:.0f} s")
            # What building the index costs (migration 0032 builds it while writes wait).
            t = time.perf_counter()
            await conn.execute("REINDEX INDEX agent_memories_session")
            size = await conn.fetchval("SELECT pg_relation_size('agent_memories_session')")
            print(
                f"# agent_memories_session built in {time.perf_counter() - t:.2f} s, "
                f"{size / 2**20:.1f} MB"
            )
            reader = OperatorReader(account, action)
            cases = [
                ("big", args.big),
                ("old", args.big),
                ("s7", args.per),
                ("small", 5),
                ("never-had", 0),
            ]
            for session, n in cases:
                f = store.ListFilters(session_id=session)
                pages = [("first page", None)]
                if n > 1000:
                    rows = await store.list_page(
                        conn, reader, after=None, limit=1000, ascending=False, filters=f
                    )
                    last = rows[-1]
                    pages.append(("after 1,000", (last["created"], last["memory_id"])))
                for what, after in pages:
                    sql, values = store._page(reader, after, 51, False, f)
                    plan = await explained(conn, sql, values)
                    times = []
                    for _ in range(16):
                        t = time.perf_counter()
                        await store.list_page(
                            conn, reader, after=after, limit=51, ascending=False, filters=f
                        )
                        times.append((time.perf_counter() - t) * 1000)
                    kept = times[8:]
                    print(
                        f"\n## session {session} ({n:,} records), {what}: "
                        f"p50 {statistics.median(kept):.2f} ms, max {max(kept):.2f} ms; "
                        f"execution {plan['Execution Time']:.2f} ms"
                    )
                    for line in nodes(plan):
                        print(f"    {line}")
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agent", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--per", type=int, default=170)
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args()
    run_scratch(
        args.data_dir,
        "engram-session-listing-",
        lambda url: measure(url, args),
        StaticEmbedder(),
    )


if __name__ == "__main__":
    main()
