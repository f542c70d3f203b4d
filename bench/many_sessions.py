"""A turn of an agent that writes mostly to other sessions: ranked over its scopes' rows.

Loads one agent into a scratch database: AGENT agent-scope records, SESSIONS sessions of PER
records each, and the turn's own session of MINE (LoCoMo dev sentences, `static` embeddings),
and lists it with its own indexes (one upkeep round). A turn reading agent scope and its
session then sees AGENT + MINE of its rows, and a turn reading its session alone MINE. Per
turn and mode it times, alternating per question, the plan the service chooses
(`search.ranked`: with few such rows, the exact plan over them, counted by the scopes' indexes,
migration 0021, or by the session index for the session alone) and the index plan forced (the
agent's own HNSW and GIN indexes through the turn's filter), SQL as the service runs it, and
compares both pages with the exact ranking (`plan="exact"`). `--drop-index` runs it without
migration 0021's index, whose index plan is what the service ran for such a turn before.

    python bench/many_sessions.py --locomo PATH [--agent 100] [--sessions 500] [--per 100]
        [--mine 100] [--queries 60] [--drop-index]
"""

import argparse
import random
import shlex
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import (  # noqa: E402
    add_locomo_argument,
    load_agent,
    load_locomo,
    percentiles,
    questions,
    run_scratch,
    sentences,
)

from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import maintenance  # noqa: E402
from app.memory import search as search_module  # noqa: E402
from app.memory.search_store import Filters  # noqa: E402
from app.memory.visibility import AgentReader  # noqa: E402
from app.scope import Scope  # noqa: E402

MINE = "mine"


async def load(pool, embedder, texts: list[str], args: argparse.Namespace) -> tuple:
    scopes = (
        [{}] * args.agent
        + [
            {"scope": "SESSION", "session_id": f"other {i % args.sessions}"}
            for i in range(args.sessions * args.per)
        ]
        + [{"scope": "SESSION", "session_id": MINE}] * args.mine
    )
    return await load_agent(pool, embedder, texts, scopes)


async def compare(pool, turn: AgentReader, picks: list[str], vectors) -> None:
    """Per mode, the chosen plan against the index plan forced, alternated per question."""
    for mode in ("hybrid", "lexical", "vector"):
        times: dict[str, list[float]] = {"chosen": [], "index": []}
        shared: dict[str, list[float]] = {"chosen": [], "index": []}
        plans = set()
        for i, (question, vector) in enumerate(zip(picks, vectors, strict=True)):
            ranking = search_module.make_ranking(mode, question, vector, None, 10)
            exact, _ = await search_module.ranked(pool, turn, Filters(), ranking, "exact")
            best = {r.memory_id for r in exact}
            for which in ("chosen", "index") if i % 2 else ("index", "chosen"):
                started = time.perf_counter()
                found, plan = await search_module.ranked(
                    pool, turn, Filters(), ranking, None if which == "chosen" else "index"
                )
                if i < 6:
                    continue
                times[which].append((time.perf_counter() - started) * 1000)
                if best:
                    shared[which].append(len(best & {r.memory_id for r in found}) / len(best))
                if which == "chosen":
                    plans.add(plan)
        for which in ("chosen", "index"):
            label = f"chosen ({'/'.join(sorted(plans))})" if which == "chosen" else "index"
            overlap = sum(shared[which]) / max(1, len(shared[which]))
            print(
                f"    {mode:7s} {label:15s} {percentiles(times[which])}"
                f"  top-10 of exact {overlap:.3f}"
            )


async def measure(url: str, samples: list[dict], args: argparse.Namespace) -> None:
    embedder = StaticEmbedder()
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        t = time.perf_counter()
        account, action = await load(pool, embedder, sentences(samples), args)
        if args.drop_index:  # as before migration 0021
            await pool.execute("DROP INDEX agent_memories_agent_scope")
        await pool.execute("VACUUM ANALYZE agent_memories")
        await maintenance.run_round(pool, min_records=2_000)
        listed = await pool.fetchval("SELECT records FROM agent_indexes")
        if listed is None:
            raise SystemExit("the agent was not listed: it needs 2,000 records or more")
        print(f"  loaded and listed ({listed:,} records) in {time.perf_counter() - t:.0f} s")
        asked = questions(samples)
        picks = random.Random(3).sample(asked, min(args.queries + 6, len(asked)))
        vectors = (await embedder.embed(picks)).vectors
        turns = {
            f"agent scope and its session ({args.agent + args.mine:,} rows)": tuple(Scope),
            f"its session alone ({args.mine:,} rows)": (Scope.SESSION,),
        }
        for title, scopes in turns.items():
            turn = AgentReader(account, action, MINE, scopes, False, uuid.uuid4(), 1)
            print(f"  a turn reading {title}:")
            await compare(pool, turn, picks, vectors)
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_locomo_argument(parser)
    parser.add_argument("--agent", type=int, default=100, help="agent-scope records")
    parser.add_argument("--sessions", type=int, default=500, help="other sessions")
    parser.add_argument("--per", type=int, default=100, help="records in each other session")
    parser.add_argument("--mine", type=int, default=100, help="records in the turn's session")
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument(
        "--drop-index",
        action="store_true",
        help="without the agent-scope index (as before migration 0021): the index plan's before",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args()
    samples = load_locomo(args.locomo)
    print("# python bench/many_sessions.py " + shlex.join(sys.argv[1:]))
    run_scratch(
        args.data_dir, "engram-sessions-", lambda url: measure(url, samples, args), StaticEmbedder()
    )


if __name__ == "__main__":
    main()
