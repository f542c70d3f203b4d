"""An agent-scope pin's budget check at many sessions: the statement that finds the longest
other sessions' pinned lists (`app.memory.store.other_sessions_pins`), as shipped and as it
was before the thirty-sixth session (every pinned session row, content included, gathered in
a materialized CTE, sessions ranked by raw summary length).

Loads one agent into a scratch database per size: SESSIONS sessions of PER pinned
session-scope records each (summaries of 40-120 characters, CONTENT characters of content),
and 10 agent-scope pins (one agent per size); times each statement 20 times for a turn of
another session, alternating, and prints p50 and max of runs 5-20 (ms) and the rows each returns.

    python bench/pins.py [--sessions 1000 10000 50000] [--per 2] [--content 2000]
"""

import argparse
import random
import shlex
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import bench_record, run_scratch  # noqa: E402

from app.db.pool import create_pool  # noqa: E402
from app.db.sql import Params  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import store  # noqa: E402
from app.memory.visibility import AgentReader, visible  # noqa: E402
from app.scope import Scope  # noqa: E402

NEW_AGENT = "INSERT INTO actions (account_id, action_id, current_version) VALUES ($1, $2, 1)"


async def before(conn, reader: AgentReader, most: int = 3) -> list:
    """The statement as it was (0af07bf)."""
    p = Params()
    other = AgentReader(reader.account_id, reader.action_id, None, (Scope.SESSION,), reader.preview)
    where = visible(other, p, "m", scope="m.scope = 'SESSION'")
    return await conn.fetch(
        f"""
        WITH pins AS (
            SELECT {store._m("m")} FROM agent_memories m
            WHERE {where} AND m.pinned AND m.pending_execution IS NULL
              AND m.session_id IS DISTINCT FROM {p(reader.session_id)}
        ), longest AS (
            SELECT session_id FROM pins GROUP BY session_id
            ORDER BY sum(length(summary)) + 60 * count(*) DESC LIMIT {p(most)}
        )
        SELECT pins.* FROM pins JOIN longest USING (session_id) ORDER BY created, memory_id
        """,
        *p.values,
    )


async def shipped(conn, reader: AgentReader) -> list:
    return await store.other_sessions_pins(conn, reader, [reader.session_id])


async def load(pool, sessions: int, per: int, content: int) -> AgentReader:
    account, action = uuid.uuid4(), uuid.uuid4()
    rng = random.Random(7)
    records = [
        bench_record(account, action, f"pin {k}: " + "w" * rng.randrange(30, 110), pinned=True)
        for k in range(10)
    ]
    records += [
        bench_record(
            account,
            action,
            f"session {i} pin {k}: " + "w" * rng.randrange(20, 100),
            content="c" * content,
            pinned=True,
            scope="SESSION",
            session_id=f"s{i}",
        )
        for i in range(sessions)
        for k in range(per)
    ]
    vectors = [(await StaticEmbedder().embed(["pin"])).vectors[0]] * len(records)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'bench')", account)
        await conn.execute(NEW_AGENT, account, action)
        await store.copy_committed(conn, records, vectors)
    await pool.execute("VACUUM ANALYZE agent_memories")
    return AgentReader(account, action, "mine", tuple(Scope), False, uuid.uuid4(), 1)


async def measure(url: str, sizes: list[int], per: int, content: int) -> None:
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        print(
            "| sessions | pinned rows | before: p50 / max ms (rows) | shipped: p50 / max (rows) |"
        )
        print("| --- | --- | --- | --- |")
        for sessions in sizes:
            reader = await load(pool, sessions, per, content)
            times: dict[str, list[float]] = {"before": [], "shipped": []}
            rows: dict[str, int] = {}
            async with pool.acquire() as conn:
                for run in range(20):
                    order = [before, shipped] if run % 2 else [shipped, before]
                    for statement in order:
                        started = time.perf_counter()
                        found = await statement(conn, reader)
                        if run >= 4:
                            times[statement.__name__].append((time.perf_counter() - started) * 1000)
                        rows[statement.__name__] = len(found)
            cells = [
                f"{statistics.median(t):.1f} / {max(t):.1f} ({rows[name]})"
                for name, t in times.items()
            ]
            print(f"| {sessions:,} | {sessions * per:,} | {cells[0]} | {cells[1]} |", flush=True)
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--per", type=int, default=2, help="pins in each session")
    parser.add_argument("--content", type=int, default=2000, help="content characters a pin")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args()
    print("# python bench/pins.py " + shlex.join(sys.argv[1:]))
    run_scratch(
        args.data_dir,
        "engram-pins-",
        lambda url: measure(url, args.sessions, args.per, args.content),
        StaticEmbedder(),
    )


if __name__ == "__main__":
    main()
