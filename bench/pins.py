"""An agent-scope pin's budget check at many sessions: the statement that finds the longest
other sessions' pinned lists (`app.memory.store.other_sessions_pins`), as shipped and as it was
before migration 0030 (every pinned session row of the agent read to rank the sessions by
their listed length); and what a pin costs its writer end to end (`MemoryWork.add` and
`commit`), a session pin and an agent-scope pin.

Loads one agent into a scratch database per size: SESSIONS sessions of PER pinned
session-scope records each (summaries of 40-120 characters, CONTENT characters of content),
and 10 agent-scope pins (one agent per size); times each statement 20 times for a turn of
another session, alternating, and prints p50 and max of runs 5-20 (ms) and the rows each
returns, and whether both find lists of the same longest length. Then WRITES turns each pin
one record and commit (session pins each in a new session; agent-scope pins), and prints p50
and max of those after the first 5 (ms): session pins alternately with and without counting
their session's list again (`store.count_pinned_lists` replaced by nothing), and the
statements that count one session's list again alone.

    python bench/pins.py [--sessions 1000 10000 50000] [--per 2] [--content 2000] [--writes 40]

Runs on a release before migration 0030 too (its `other_sessions_pins` is then the statement
"before" times as well): that is how the writes' cost before was measured.
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

from app.actions.service import agent_principal, create_action  # noqa: E402
from app.auth.caller import Caller  # noqa: E402
from app.auth.policies import ADMIN_POLICIES  # noqa: E402
from app.auth.service import ensure_default_account  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.db.sql import Params  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import store  # noqa: E402
from app.memory.records import PIN_LINE_EXTRA  # noqa: E402
from app.memory.service import MemoryWork, NewMemory, Writer  # noqa: E402
from app.memory.visibility import AgentReader, visible  # noqa: E402
from app.scope import Scope  # noqa: E402
from app.text import DISGUISING_SQL  # noqa: E402

HARNESS = {
    "memory": {
        "enabled": True,
        "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        "pinned": {"max_tokens": 100_000},
    }
}


async def before(conn, reader: AgentReader, most: int = 3) -> list:
    """The statement as ec4733b ran it: every pinned session row ranked by listed length."""
    p = Params()
    other = AgentReader(reader.account_id, reader.action_id, None, (Scope.SESSION,), reader.preview)
    where = visible(other, p, "m", scope="m.scope = 'SESSION'")
    where += " AND m.pinned AND m.pending_execution IS NULL"
    listed = f"length(to_json(regexp_replace(m.summary, {p(DISGUISING_SQL)}, '', 'g'))::text)"
    return await conn.fetch(
        f"""
        WITH longest AS (
            SELECT m.session_id FROM agent_memories m
            WHERE {where} AND m.session_id <> ALL({p([reader.session_id])}::text[])
            GROUP BY m.session_id
            ORDER BY sum({listed} + {PIN_LINE_EXTRA}) DESC LIMIT {p(most)}
        )
        SELECT {store._m("m")} FROM agent_memories m JOIN longest l ON l.session_id = m.session_id
        WHERE {where} ORDER BY m.created, m.memory_id
        """,
        *p.values,
    )


async def shipped(conn, reader: AgentReader) -> list:
    return await store.other_sessions_pins(conn, reader, [reader.session_id])


def longest(rows: list) -> int:
    """The characters of the longest list among the rows' sessions (as `_longest_list`)."""
    lengths: dict[str, int] = {}
    for row in rows:
        line = store.record(row).pinned_line()
        lengths[row["session_id"]] = lengths.get(row["session_id"], 0) + len(line) + 1
    return max(lengths.values(), default=0)


async def load(pool, caller: Caller, sessions: int, per: int, content: int):
    agent = await create_action(
        pool, caller, name=f"pins {sessions}", instructions="", model=None, harness=HARNESS
    )
    account, action = agent.account_id, agent.action_id
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
        await store.copy_committed(conn, records, vectors)
    await pool.execute("VACUUM ANALYZE agent_memories")
    return agent, AgentReader(account, action, "mine", tuple(Scope), False, uuid.uuid4(), 1)


async def pin(pool, agent, session: str, scope: str) -> float:
    """One turn that pins one record and commits; its milliseconds."""
    writer = Writer(
        account_id=agent.account_id,
        action=agent,
        execution_id=uuid.uuid4(),
        invocation_number=1,
        session_id=session,
        principal=agent_principal(agent.action_id),
        source="TOOL",
        preview=False,
    )
    work = MemoryWork(pool, StaticEmbedder(), writer)
    started = time.perf_counter()
    await work.add(NewMemory(summary=f"a pin of {session}", kind="fact", pinned=True, scope=scope))
    async with pool.acquire() as conn, conn.transaction():
        await work.commit(conn)
    return (time.perf_counter() - started) * 1000


async def uncounted(*_: object) -> None:
    """`store.count_pinned_lists` left out: a session pin's cost without it, alternating."""


async def counting(pool, agent) -> str:
    """What a session pin's commit adds to count its session's list again (its two statements,
    `store.count_pinned_lists`), 20 times in one transaction; n/a before migration 0030."""
    count = getattr(store, "count_pinned_lists", None)
    if count is None:
        return "n/a"
    samples = []
    async with pool.acquire() as conn, conn.transaction():
        ids = [r["memory_id"] for r in await store.list_pinned(conn, agent_reader(agent, "s7"))]
        for _ in range(25):
            started = time.perf_counter()
            await count(conn, agent.account_id, agent.action_id, ids)
            samples.append((time.perf_counter() - started) * 1000)
    return cell(samples[5:])


def agent_reader(agent, session: str) -> AgentReader:
    return AgentReader(agent.account_id, agent.action_id, session, (Scope.SESSION,), False)


def cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):.1f} / {max(samples):.1f}"


async def measure(url: str, sizes: list[int], per: int, content: int, writes: int) -> None:
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            account = await ensure_default_account(conn)
        caller = Caller(account, "admin", ADMIN_POLICIES, in_default_account=True)
        print(
            "| sessions | pinned rows | before: p50 / max ms (rows) | shipped: p50 / max (rows) "
            "| same longest | session pin: p50 / max ms | session pin, not counted | "
            "agent-scope pin | counting a session |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for sessions in sizes:
            agent, reader = await load(pool, caller, sessions, per, content)
            times: dict[str, list[float]] = {"before": [], "shipped": []}
            rows: dict[str, list] = {}
            async with pool.acquire() as conn:
                for run in range(20):
                    order = [before, shipped] if run % 2 else [shipped, before]
                    for statement in order:
                        started = time.perf_counter()
                        found = await statement(conn, reader)
                        if run >= 4:
                            times[statement.__name__].append((time.perf_counter() - started) * 1000)
                        rows[statement.__name__] = found
            same = longest(rows["before"]) == longest(rows["shipped"])
            cells = [f"{cell(t)} ({len(rows[name])})" for name, t in times.items()]
            pins: dict[str, list[float]] = {"session": [], "uncounted": [], "agent": []}
            count = getattr(store, "count_pinned_lists", None)
            for i in range(writes):
                pins["session"].append(await pin(pool, agent, f"w{i}", "SESSION"))
                if count is not None:
                    store.count_pinned_lists = uncounted  # type: ignore[assignment]
                    try:
                        pins["uncounted"].append(await pin(pool, agent, f"u{i}", "SESSION"))
                    finally:
                        store.count_pinned_lists = count
                pins["agent"].append(await pin(pool, agent, f"w{i}", "AGENT"))
            written = [cell(s[5:]) if s else "n/a" for s in pins.values()]
            print(
                f"| {sessions:,} | {sessions * per:,} | {cells[0]} | {cells[1]} | {same} | "
                f"{' | '.join(written)} | {await counting(pool, agent)} |",
                flush=True,
            )
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--per", type=int, default=2, help="pins in each session")
    parser.add_argument("--content", type=int, default=2000, help="content characters a pin")
    parser.add_argument(
        "--writes",
        type=int,
        default=40,
        help="pins of each kind (more than 5: the first 5 warm up)",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args()
    if args.writes <= 5:
        parser.error("--writes: more than 5 (the first 5 of each kind are not timed)")
    print("# python bench/pins.py " + shlex.join(sys.argv[1:]))
    run_scratch(
        args.data_dir,
        "engram-pins-",
        lambda url: measure(url, args.sessions, args.per, args.content, args.writes),
        StaticEmbedder(),
    )


if __name__ == "__main__":
    main()
