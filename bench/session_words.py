"""A turn of a large session: its words kept by the upkeep, or counted at each search.

Loads two identical agents into a scratch database: AGENT agent-scope records and SESSION
records in one session (LoCoMo dev sentences, `static` embeddings), lists both with their own
indexes (one upkeep round, which keeps the large session's word counts), then forgets the
second agent's session counts, so that its turns count the session as they search, as they
do below `SESSION_WORDS_MIN` (app/memory/maintenance.py). It then times hybrid search, SQL
as the service runs it (`search.ranked`), alternating the two agents per question, for a turn
reading agent and session scope and for one reading its session alone, and checks that both
agents rank the same records.

    python bench/session_words.py --locomo PATH [--agent 10000] [--session 40000] [--queries 100]
"""

import argparse
import random
import shlex
import sys
import time
import uuid
from dataclasses import replace
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

SESSION = "long"
LISTED = 2_000  # the upkeep round's min_records: an agent below it gets no indexes or counts


async def load(pool, embedder, texts: list[str], agent: int, session: int) -> tuple:
    scopes = [{}] * agent + [{"scope": "SESSION", "session_id": SESSION}] * session
    return await load_agent(pool, embedder, texts, scopes)


async def measure(url: str, samples: list[dict], agent: int, session: int, queries: int) -> None:
    embedder = StaticEmbedder()
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        texts = sentences(samples)
        t = time.perf_counter()
        agents = [await load(pool, embedder, texts, agent, session) for _ in range(2)]
        await pool.execute("VACUUM ANALYZE agent_memories")
        done = await maintenance.run_round(pool, min_records=LISTED)
        print(
            f"  loaded and listed 2 agents of {agent:,} + {session:,} records in "
            f"{time.perf_counter() - t:.0f} s; sessions counted: {done.sessions if done else 0}"
        )
        counted = agents[1]
        for table in ("session_counts", "session_words"):
            await pool.execute(
                f"DELETE FROM {table} WHERE account_id = $1 AND action_id = $2", *counted
            )
        asked = questions(samples)
        picks = random.Random(3).sample(asked, min(queries + 6, len(asked)))
        vectors = (await embedder.embed(picks)).vectors
        turn = AgentReader(
            uuid.uuid4(), uuid.uuid4(), SESSION, tuple(Scope), False, uuid.uuid4(), 1
        )
        for name, scopes in (
            ("agent and session scope", tuple(Scope)),
            ("session alone", (Scope.SESSION,)),
        ):
            times: dict[int, list[float]] = {0: [], 1: []}
            same = 0
            for i, (question, vector) in enumerate(zip(picks, vectors, strict=True)):
                ranking = search_module.make_ranking("hybrid", question, vector, None, 10)
                pages = {}
                for which in (0, 1) if i % 2 else (1, 0):
                    reader = replace(
                        turn, account_id=agents[which][0], action_id=agents[which][1], scopes=scopes
                    )
                    started = time.perf_counter()
                    records, _ = await search_module.ranked(pool, reader, Filters(), ranking)
                    if i >= 6:
                        times[which].append((time.perf_counter() - started) * 1000)
                    pages[which] = [r.summary for r in records]
                same += i >= 6 and pages[0] == pages[1]
            print(f"  a turn reading {name} (hybrid, ms, n={len(times[0])}, same pages {same}):")
            print(f"    session words kept:            {percentiles(times[0])}")
            print(f"    session counted at each search: {percentiles(times[1])}")
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_locomo_argument(parser)
    parser.add_argument("--agent", type=int, default=10_000, help="agent-scope records")
    parser.add_argument("--session", type=int, default=40_000, help="records in the session")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args()
    if args.agent + args.session < LISTED or args.session < maintenance.SESSION_WORDS_MIN:
        parser.error(
            f"--agent and --session: at least {LISTED:,} records in all and "
            f"{maintenance.SESSION_WORDS_MIN:,} in the session, or no session's words are kept "
            "and both agents search alike"
        )
    samples = load_locomo(args.locomo)
    print("# python bench/session_words.py " + shlex.join(sys.argv[1:]))
    run_scratch(
        args.data_dir,
        "engram-sessions-",
        lambda url: measure(url, samples, args.agent, args.session, args.queries),
        StaticEmbedder(),
    )


if __name__ == "__main__":
    main()
