"""What single parts of the search code buy, on search_scale.py's data set.

bench/README.md's table "What each part of the search code buys" gives each part of
app/memory/search.py, search_store.py and maintenance.py a figure; these are the parts no
other benchmark measures. Each runs on the data set `bench/search_scale.py` loads (1,230,000
records; load it first, `--load-only`), with LoCoMo dev questions, the turn's reader:

- `deep-pages`: paging 10 records at a time to --depth on the index plan, with the widened
  candidate lists and `hnsw.ef_search` of a later page (4 x the records before it and on it,
  `make_ranking`) and without: the share of the exact plan's top records the pages hold.
- `recount`: a listed agent's pages with its words counted now, against counted when it had
  1 / (1 + share) of its records (`WORDS_RECOUNT`: how far the counts may lag), by share.
- `kept-counts`: a listed agent searched with the words the upkeep keeps, against counted at
  each search (as before its first count).
- `ids`: a search under an ID filter ranked exactly at once (`ranked`'s shortcut), against
  through the exact statement's gate.
- `probes`: a listed agent's own HNSW index against brute force, by `hnsw.ef_search`, for the
  questions and for queries the upkeep could make from the agent's records, to check a built
  index with (none of them tracks the questions: bench/README.md, twentieth session).
- `builds`: one agent's HNSW and GIN indexes built as the upkeep builds them (CREATE INDEX
  CONCURRENTLY reads the whole table): what a rebuild costs, which the half-threshold drop,
  `TRADE` and the replacement built beside the old index (`_next`) avoid or hide.

    python bench/search_parts.py --locomo PATH deep-pages kept-counts   # or: all

The counts of `recount` and `kept-counts` are changed for the measurement and counted again
at its end (`count_agent_words`), as a round would.
"""

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import search_scale as scale  # noqa: E402
from common import add_locomo_argument, load_locomo, percentiles  # noqa: E402

from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import search, search_store  # noqa: E402
from app.memory.maintenance import OPTIONS  # noqa: E402
from app.memory.search_store import Filters, Ranking  # noqa: E402

Agent = tuple[UUID, UUID, int]


class Bench:
    """The data set's agents, the questions and their vectors, and a pool on the data set."""

    def __init__(self, pool: asyncpg.Pool, questions: list[str], vectors: Any) -> None:
        self.pool = pool
        self.questions = questions
        self.vectors = vectors
        self.plan = scale.Plan(1.0)

    def agent(self, size: int) -> Agent:
        return next(a for a in self.plan.agents if a[2] == size)

    def ranking(self, mode: str, i: int, limit: int = 10, **page: Any) -> Ranking:
        vector = self.vectors[i] if mode != "lexical" else None
        return search.make_ranking(mode, self.questions[i], vector, None, limit, **page)

    async def page(self, ranking: Ranking, agent: Agent, plan: str, **kw: Any) -> list[UUID]:
        reader = scale.make_reader("agent", agent[0], agent[1])
        found, _ = await search.ranked(self.pool, reader, Filters(**kw), ranking, plan)  # type: ignore[arg-type]
        return [r.memory_id for r in found]


def overlap(found: list[UUID], exact: list[UUID]) -> float:
    return len(set(found) & set(exact)) / max(1, len(exact))


async def deep_pages(b: Bench, depth: int) -> None:
    print(f"\ndeep pages: 10 a page to {depth}, share of the exact top-n the pages hold")
    marks = [d for d in (10, 50, 100, 200, 500, 1000) if d <= depth]
    for size in (25_000, 200_000):
        agent = b.agent(size)
        for mode in ("vector", "hybrid", "lexical"):
            shares: dict[tuple[bool, int], list[float]] = {}
            times: dict[bool, list[float]] = {True: [], False: []}
            for i in range(len(b.questions)):
                exact = await b.page(b.ranking(mode, i, depth), agent, "exact")
                for widened in (True, False):
                    got: list[UUID] = []
                    after = None
                    while len(got) < depth:
                        r = b.ranking(mode, i, after=after, depth=len(got))
                        if not widened:
                            r = replace(r, candidates=search.CANDIDATES, ef_search=search.EF_SEARCH)
                        reader = scale.make_reader("agent", agent[0], agent[1])
                        t = time.perf_counter()
                        page, _ = await search.ranked(b.pool, reader, Filters(), r, "index")
                        times[widened].append((time.perf_counter() - t) * 1000)
                        if not page:
                            break
                        got += [x.memory_id for x in page]
                        last = page[-1]
                        after = (last.score or 0.0, last.created, last.memory_id)
                    for d in marks:
                        shares.setdefault((widened, d), []).append(overlap(got[:d], exact[:d]))
            for widened in (True, False):
                cells = "  ".join(
                    f"@{d} {sum(shares[(widened, d)]) / len(shares[(widened, d)]):.3f}"
                    for d in marks
                )
                label = "widened" if widened else "fixed  "
                print(f"  {size:,} {mode:7} {label} {cells}  a page: {percentiles(times[widened])}")


async def _pages(b: Bench, agent: Agent, mode: str) -> list[list[UUID]]:
    return [await b.page(b.ranking(mode, i), agent, "index") for i in range(len(b.questions))]


@contextlib.asynccontextmanager
async def _counts_changed(b: Bench, agent: Agent) -> AsyncIterator[asyncpg.Connection]:
    """A connection to change the agent's word counts with; counted again at the end."""
    async with b.pool.acquire() as conn:
        try:
            yield conn
        finally:
            await conn.fetchval("SELECT count_agent_words($1, $2)", agent[0], agent[1])


async def recount(b: Bench, shares: list[float]) -> None:
    print("\nrecount: pages with the words counted now, against counted when the agent had")
    print("  1 / (1 + share) of its records (a random part of them)")
    for size in (5_000, 25_000, 200_000):
        agent = b.agent(size)
        now = {mode: await _pages(b, agent, mode) for mode in ("hybrid", "lexical")}
        for share in shares:
            async with b.pool.acquire() as conn:
                words, counted, took = await _counted_part(conn, agent, share)
            async with _counts_changed(b, agent) as conn:
                await _store_counts(conn, agent, words, counted)
                then = {mode: await _pages(b, agent, mode) for mode in ("hybrid", "lexical")}
            for mode in ("hybrid", "lexical"):
                same = sum(a == c for a, c in zip(now[mode], then[mode], strict=True))
                mean = sum(map(overlap, then[mode], now[mode])) / len(now[mode])
                print(
                    f"  {size:,} share {share}: {mode:7} overlap {mean:.4f}, pages identical "
                    f"{same} of {len(now[mode])}; a count took {took:.2f} s"
                )


async def _counted_part(
    conn: asyncpg.Connection, agent: Agent, share: float
) -> tuple[list[asyncpg.Record], asyncpg.Record, float]:
    """The agent's words as `count_agent_words` counts them over 1 / (1 + share) of its records
    (the rest deleted in a transaction rolled back), its totals, and the count's seconds."""
    key = agent[:2]
    transaction = conn.transaction()
    await transaction.start()
    try:
        await conn.execute(
            "DELETE FROM agent_memories WHERE account_id = $1 AND action_id = $2 AND random() < $3",
            *key,
            share / (1 + share),
        )
        t = time.perf_counter()
        await conn.fetchval("SELECT count_agent_words($1, $2)", *key)
        took = time.perf_counter() - t
        words = await conn.fetch(
            "SELECT * FROM agent_words WHERE account_id = $1 AND action_id = $2", *key
        )
        counted = await conn.fetchrow(
            "SELECT words_counted, words_counted_any FROM agent_indexes "
            "WHERE account_id = $1 AND action_id = $2",
            *key,
        )
        return words, counted, took
    finally:
        await transaction.rollback()


async def _store_counts(
    conn: asyncpg.Connection, agent: Agent, words: list[asyncpg.Record], counted: Any
) -> None:
    async with conn.transaction():
        await conn.execute(
            "DELETE FROM agent_words WHERE account_id = $1 AND action_id = $2", *agent[:2]
        )
        if words:
            await conn.copy_records_to_table(
                "agent_words", records=[tuple(w) for w in words], columns=list(words[0].keys())
            )
        await conn.execute(
            "UPDATE agent_indexes SET words_counted = $3, words_counted_any = $4 "
            "WHERE account_id = $1 AND action_id = $2",
            *agent[:2],
            *(counted or (None, None)),
        )


async def kept_counts(b: Bench) -> None:
    print("\nkept counts: a listed agent's index plan, words kept by the upkeep against counted")
    print("  at each search (its counts dropped, as before the first)")
    for size in (5_000, 25_000, 200_000):
        agent = b.agent(size)
        for kept in (True, False):
            times: dict[str, list[float]] = {"hybrid": [], "lexical": []}
            async with _counts_changed(b, agent) as conn:
                if not kept:
                    await _store_counts(conn, agent, [], None)
                for mode, ts in times.items():
                    for i in range(len(b.questions)):
                        t = time.perf_counter()
                        await b.page(b.ranking(mode, i), agent, "index")
                        ts.append((time.perf_counter() - t) * 1000)
            for mode, ts in times.items():
                label = "kept   " if kept else "counted"
                print(f"  {size:,} {mode:7} {label} {percentiles(ts[5:])}")


async def ids(b: Bench) -> None:
    print("\nids: an ID filter ranked exactly at once, against through the gate (hybrid)")
    rng = random.Random(4)
    for size in (1_000, 25_000, 200_000):
        agent = b.agent(size)
        async with b.pool.acquire() as conn:
            every = [
                r[0]
                for r in await conn.fetch(
                    "SELECT memory_id FROM agent_memories WHERE account_id = $1 AND action_id = $2",
                    *agent[:2],
                )
            ]
        reader = scale.make_reader("agent", agent[0], agent[1])
        for count in (20, 500):
            times: dict[bool, list[float]] = {True: [], False: []}
            same = 0
            for i in range(len(b.questions)):
                filters = Filters(ids=rng.sample(every, count))
                r = b.ranking("hybrid", i)
                pages = {}
                for shortcut in (True, False) if i % 2 else (False, True):
                    t = time.perf_counter()
                    if shortcut:
                        found, _ = await search.ranked(b.pool, reader, filters, r)
                    else:
                        async with b.pool.acquire() as conn:
                            found, _ = await search_store.ranked_exact(
                                conn, reader, filters, r, search.EXACT_MAX_ROWS
                            )
                    times[shortcut].append((time.perf_counter() - t) * 1000)
                    pages[shortcut] = [x.memory_id for x in found or ()]
                same += pages[True] == pages[False]
            for shortcut in (True, False):
                label = "shortcut" if shortcut else "gate    "
                print(
                    f"  {size:,} {count} IDs {label} {percentiles(times[shortcut][10:])}, "
                    f"pages identical {same} of {len(b.questions)}"
                )


async def probes(b: Bench, count: int) -> None:
    print("\nprobes: the vector top-10 of a listed agent's own HNSW index against brute force,")
    print("  by hnsw.ef_search, for LoCoMo questions and for queries made from its records")
    rng = random.Random(7)
    embedder = StaticEmbedder()
    async with b.pool.acquire() as conn:
        for size in (5_000, 25_000, 200_000):
            account, action, _ = b.agent(size)
            rows = await conn.fetch(
                "SELECT embedding, summary, content FROM agent_memories "
                "WHERE account_id = $1 AND action_id = $2 ORDER BY random() LIMIT $3",
                account,
                action,
                2 * count,
            )
            spans = []
            for row in rows[:count]:
                words = f"{row['summary']} {row['content']}".split()
                n = rng.randint(4, 9)
                start = rng.randrange(max(1, len(words) - n))
                spans.append(" ".join(words[start : start + n]))
            vectors = [r["embedding"].to_numpy() for r in rows]
            queries = {
                "questions": list(b.vectors[:count]),
                "spans of a record (4-9 words)": list((await embedder.embed(spans)).vectors),
                "midpoints of two records": [
                    (vectors[i] + vectors[count + i]) / 2 for i in range(count)
                ],
            }
            for name, qs in queries.items():
                nearest = (
                    "SELECT memory_id FROM agent_memories WHERE account_id = $1 "
                    "AND action_id = $2 ORDER BY {} LIMIT 10"
                )
                brute = nearest.format("(embedding <=> $3) + 0")  # + 0: no index gives the order
                exact = [[r[0] for r in await conn.fetch(brute, account, action, q)] for q in qs]
                walk = nearest.format("embedding <=> $3")
                cells = []
                for ef in (40, 60, 80, 100, 120, 150, 200, 300):
                    async with conn.transaction():
                        await conn.execute(f"SET LOCAL hnsw.ef_search = {ef}")
                        found = [
                            [r[0] for r in await conn.fetch(walk, account, action, q)] for q in qs
                        ]
                    mean = sum(map(overlap, found, exact)) / len(qs)
                    cells.append(f"{ef} {mean:.3f}")
                print(f"  {size:,} {name}: " + ", ".join(cells))


async def builds(b: Bench) -> None:
    print("\nbuilds: one agent's indexes, CREATE INDEX CONCURRENTLY as the upkeep builds them")
    hnsw, gin = (", ".join(f"{k} = {v}" for k, v in options.items()) for options in OPTIONS)
    methods = {
        "hnsw": f"hnsw (embedding vector_cosine_ops) WITH ({hnsw})",
        "gin": f"gin (tsv) WITH ({gin})",
    }
    async with b.pool.acquire() as conn:
        for size in (1_000, 5_000, 25_000):
            account, action, _ = b.agent(size)
            agent = f"account_id = '{account}' AND action_id = '{action}'"
            for kind, method in methods.items():
                name = f"bench_parts_{kind}_{size}"
                await conn.execute(f"DROP INDEX IF EXISTS {name}")
                t = time.perf_counter()
                await conn.execute(
                    f"CREATE INDEX CONCURRENTLY {name} ON agent_memories USING {method} "
                    f"WHERE {agent}"
                )
                took = time.perf_counter() - t
                await conn.execute(f"DROP INDEX CONCURRENTLY {name}")
                print(f"  {size:,} records, {kind}: {took:.2f} s")


PARTS = ("deep-pages", "recount", "kept-counts", "ids", "probes", "builds")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_locomo_argument(parser)
    parser.add_argument("parts", nargs="+", choices=(*PARTS, "all"))
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "engram-bench-scale"
    )
    parser.add_argument("--questions", type=int, default=60, help="LoCoMo questions a part")
    parser.add_argument("--depth", type=int, default=200, help="deep-pages: how deep")
    parser.add_argument("--shares", default="0.1,0.3,1.0", help="recount: how far counts lag")
    args = parser.parse_args()
    scale.SAMPLES[:] = load_locomo(args.locomo)
    parts = PARTS if "all" in args.parts else args.parts
    print(f"# python bench/search_parts.py {' '.join(sys.argv[1:])}")
    pg = scale.server(args.data_dir)

    async def run() -> None:
        url = pg.uri(scale.Plan(1.0).database)
        questions = random.Random(5).sample(scale.locomo_questions(), args.questions)
        vectors = (await StaticEmbedder().embed(questions)).vectors
        await scale.prewarm(url)
        pool = await create_pool(url, min_size=1, max_size=2)
        try:
            b = Bench(pool, questions, vectors)
            for part in parts:
                if part == "deep-pages":
                    await deep_pages(b, args.depth)
                elif part == "recount":
                    await recount(b, [float(s) for s in args.shares.split(",")])
                elif part == "kept-counts":
                    await kept_counts(b)
                elif part == "ids":
                    await ids(b)
                elif part == "probes":
                    await probes(b, args.questions)
                else:
                    await builds(b)
        finally:
            await pool.close()

    try:
        asyncio.run(run())
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
