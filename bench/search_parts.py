"""What single parts of the search code buy, on search_scale.py's data set.

bench/README.md's table "What each part of the search code buys" gives each part of
app/memory/search.py, search_store.py and maintenance.py a figure; these are the parts no
other benchmark measures. Each runs on the data set `bench/search_scale.py` loads (1,230,000
records; load it first, `--load-only`), with LoCoMo dev questions and a turn's reader, through
`search.ranked` with the plan named (the index plan for a listed agent's pages):

- `deep-pages`: paging 10 records at a time to --depth, with the candidate lists and
  `hnsw.ef_search` a later page gets (4 x the records before it and on it, `make_ranking`)
  and with those of the first page (40 candidates; `hnsw.ef_search` 80, or
  LARGE_AGENT_EF_SEARCH for a large agent in vector mode): the share of the exact plan's top
  records the pages hold.
- `recount`: a listed agent's pages with its words counted now, against counted when it had
  1 / (1 + share) of its records (`WORDS_RECOUNT`: how far the counts may lag), by share.
- `kept-counts`: a listed agent searched with the words the upkeep keeps, against counted at
  each search (as before its first count).
- `ids`: a search under an ID filter ranked exactly at once (`ranked`'s shortcut), against
  through the exact statement's gate.
- `carry`: a first page reading what ranked it for its cursors (its words' weights, hybrid's
  best text score), against not; a second page ranked with them, against weighed afresh.
- `shared-probes`: a lexical walk whose tiers that share a GIN probe read it once
  (`search_store._shared_probes`) against every tier reading its own, first and second
  pages, alternated question by question, whatever `SHARED_PROBES_MIN_RECORDS` says.
- `iterative-scan`: vector pages under a filter that hides most of the HNSW walk's records (one
  kind of four), with `hnsw.iterative_scan` relaxed_order (the connections' default) and off.
- `labels`: a listed agent searched under one label value that a few thousand of its records
  hold, as the service chooses and on the index plan.
- `probes`: a listed agent's own HNSW index against brute force, by `hnsw.ef_search`, for the
  questions and for queries made from the agent's records (what a check of a built index
  could search with).
- `builds`: one agent's HNSW and GIN indexes built as the upkeep builds them (CREATE INDEX
  CONCURRENTLY reads the whole table).
- `plans`: the statements that pass the agent's key as a plain parameter (a search or a
  listing under a label value or IDs) on the plan a connection caches (generic), on one made
  for the values (custom), and as `plan_cache_mode` auto chooses.
- `backends`: searches on a new connection (a PostgreSQL backend that has touched none of the
  shared buffers yet) against the same searches on a connection that has served as many
  searches of other questions first: the backend's minor page faults and CPU per search, and
  the latency (what `app/db/pool.py` keeping its connections buys).
- `bound`: around `EXACT_MAX_ROWS`, a label value set on --counts of the 200,000-record
  agent's records, ranked exactly and by the index plan, and how much of the exact page the
  index plan finds.

    python bench/search_parts.py --locomo PATH deep-pages kept-counts   # or: all

What `recount` and `kept-counts` change in the data set is rolled back.
"""

import argparse
import asyncio
import contextlib
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import search_scale as scale  # noqa: E402
from common import add_locomo_argument, load_locomo, percentiles, summary  # noqa: E402

from app.db.pool import SESSION_SETTINGS, create_pool, init_connection  # noqa: E402
from app.db.sql import Params  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import maintenance, search, search_store, store  # noqa: E402
from app.memory.search_store import Filters, Plan, Ranking  # noqa: E402
from app.memory.store import has_labels  # noqa: E402
from app.memory.visibility import OperatorReader, Reader  # noqa: E402

WARMUP = 5  # timings left out at the start of each series


class Held:
    """One connection, as the pool that `search.ranked` acquires from."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        yield self.conn


class Bench:
    """The data set's agents, the questions and their vectors, and a pool on the data set."""

    def __init__(self, pool: asyncpg.Pool, questions: list[str], vectors: Any) -> None:
        self.pool = pool
        self.questions = questions
        self.vectors = vectors
        self.plan = scale.Plan(1.0)
        self.url = ""

    def agent(self, size: int) -> scale.Agent:
        return next(a for a in self.plan.agents if a[2] == size)

    def ranking(self, mode: str, i: int, limit: int = 10, **page: Any) -> Ranking:
        vector = self.vectors[i] if mode != "lexical" else None
        return search.make_ranking(mode, self.questions[i], vector, None, limit, **page)

    async def page(
        self, ranking: Ranking, reader: Reader, plan: Plan, pool: Any = None
    ) -> list[UUID]:
        found, _ = await search.ranked(pool or self.pool, reader, Filters(), ranking, plan)
        return [r.memory_id for r in found]

    async def pages(self, reader: Reader, mode: str, pool: Any = None) -> list[list[UUID]]:
        """The index plan's first page for every question."""
        return [
            await self.page(self.ranking(mode, i), reader, "index", pool)
            for i in range(len(self.questions))
        ]


def reader_of(agent: scale.Agent) -> Reader:
    return scale.make_reader("agent", agent[0], agent[1])  # type: ignore[no-any-return]


def overlap(found: list[UUID], exact: list[UUID]) -> float:
    return len(set(found) & set(exact)) / max(1, len(exact))


async def memory_ids(conn: asyncpg.Connection, agent: scale.Agent) -> list[UUID]:
    """Every record ID of the agent."""
    rows = await conn.fetch(
        "SELECT memory_id FROM agent_memories WHERE account_id = $1 AND action_id = $2",
        *agent[:2],
    )
    return [r[0] for r in rows]


async def set_label(
    conn: asyncpg.Connection, agent: scale.Agent, value: str, ids: list[UUID]
) -> None:
    """Label 5 set to `value` on the agent's records `ids` (in the caller's transaction)."""
    await conn.execute(
        "UPDATE agent_memories SET labels = $1::jsonb WHERE account_id = $2 AND action_id = $3"
        " AND memory_id = any($4::uuid[])",
        {"5": value},
        *agent[:2],
        ids,
    )


@contextlib.asynccontextmanager
async def rolled_back(b: Bench) -> AsyncIterator[asyncpg.Connection]:
    """A connection in a transaction rolled back at the end, whatever happens: what a part
    changes in the data set does not outlive it."""
    async with b.pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:
            yield conn
        finally:
            await transaction.rollback()


async def deep_pages(b: Bench, depth: int) -> None:
    print(f"\ndeep pages: 10 a page to {depth}, share of the exact top-n the pages hold")
    marks = [d for d in (10, 50, 100, 200, 500, 1000) if d <= depth]
    for size in (25_000, 200_000):
        reader = reader_of(b.agent(size))
        for mode in ("vector", "hybrid", "lexical"):
            shares: dict[tuple[bool, int], list[float]] = {}
            times: dict[bool, list[float]] = {True: [], False: []}
            for i in range(len(b.questions)):
                exact = await b.page(b.ranking(mode, i, depth), reader, "exact")
                for widened in (True, False) if i % 2 else (False, True):
                    got: list[UUID] = []
                    after = None
                    while len(got) < depth:
                        r = b.ranking(mode, i, after=after, depth=len(got))
                        if not widened:
                            r = replace(r, candidates=search.CANDIDATES, ef_search=search.EF_SEARCH)
                        t = time.perf_counter()
                        page, _ = await search.ranked(b.pool, reader, Filters(), r, "index")
                        if not page:  # the end of the results, as the client sees it
                            break
                        times[widened].append((time.perf_counter() - t) * 1000)
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


async def recount(b: Bench, shares: list[float]) -> None:
    print("\nrecount: pages with the words counted now, against counted when the agent had")
    print("  1 / (1 + share) of its records (a random part of them)")
    for size in (5_000, 25_000, 200_000):
        agent = b.agent(size)
        reader = reader_of(agent)
        async with rolled_back(b) as conn:
            held = Held(conn)
            now = {mode: await b.pages(reader, mode, held) for mode in ("hybrid", "lexical")}
            for share in shares:
                words, counted, took = await _counted_part(conn, agent, share)
                await _store_counts(conn, agent, words, counted)
                for mode in ("hybrid", "lexical"):
                    then = await b.pages(reader, mode, held)
                    same = sum(a == c for a, c in zip(now[mode], then, strict=True))
                    mean = sum(map(overlap, then, now[mode])) / len(then)
                    print(
                        f"  {size:,} share {share}: {mode:7} overlap {mean:.4f}, pages identical "
                        f"{same} of {len(then)}; counting {counted['words_counted_any']:,} "
                        f"records took {took:.2f} s"
                    )


async def _counted_part(
    conn: asyncpg.Connection, agent: scale.Agent, share: float
) -> tuple[list[asyncpg.Record], asyncpg.Record, float]:
    """The agent's words as `count_agent_words` counts them over 1 / (1 + share) of its records
    (the others deleted in a savepoint rolled back), its totals, and the count's seconds."""
    savepoint = conn.transaction()
    await savepoint.start()
    try:
        await conn.execute(
            "DELETE FROM agent_memories WHERE account_id = $1 AND action_id = $2 AND random() < $3",
            agent[0],
            agent[1],
            share / (1 + share),
        )
        t = time.perf_counter()
        await conn.fetchval("SELECT count_agent_words($1, $2)", agent[0], agent[1])
        took = time.perf_counter() - t
        words = await conn.fetch(
            "SELECT * FROM agent_words WHERE account_id = $1 AND action_id = $2", *agent[:2]
        )
        counted = await conn.fetchrow(
            "SELECT words_counted, words_counted_any FROM agent_indexes "
            "WHERE account_id = $1 AND action_id = $2",
            *agent[:2],
        )
        assert counted is not None, "the agent is not listed: run search_scale.py first"
        return words, counted, took
    finally:
        await savepoint.rollback()


async def _store_counts(
    conn: asyncpg.Connection,
    agent: scale.Agent,
    words: list[asyncpg.Record],
    counted: asyncpg.Record | None,
) -> None:
    """Replaces the agent's word counts (None: none, as before its first count)."""
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
        *(counted.values() if counted is not None else (None, None)),
    )


async def kept_counts(b: Bench) -> None:
    print("\nkept counts: a listed agent's index plan, words kept by the upkeep against counted")
    print("  at each search (its counts dropped, as before the first)")
    for size in (5_000, 25_000, 200_000):
        agent = b.agent(size)
        reader = reader_of(agent)
        for kept in (True, False):
            async with rolled_back(b) as conn:
                if not kept:
                    await _store_counts(conn, agent, [], None)
                for mode in ("hybrid", "lexical"):
                    times = []
                    for i in range(len(b.questions)):
                        t = time.perf_counter()
                        await b.page(b.ranking(mode, i), reader, "index", Held(conn))
                        times.append((time.perf_counter() - t) * 1000)
                    label = "kept   " if kept else "counted"
                    print(f"  {size:,} {mode:7} {label} {percentiles(times[WARMUP:])}")


async def ids(b: Bench) -> None:
    print("\nids: an ID filter ranked exactly at once, against through the gate (hybrid)")
    rng = random.Random(4)
    for size in (1_000, 25_000, 200_000):
        agent = b.agent(size)
        reader = reader_of(agent)
        async with b.pool.acquire() as conn:
            every = await memory_ids(conn, agent)
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
                    else:  # what `ranked` runs for the same search without its shortcut
                        async with b.pool.acquire() as conn:
                            found, _ = await search_store.ranked_exact(
                                conn, reader, filters, r, search.EXACT_MAX_ROWS
                            )
                    times[shortcut].append((time.perf_counter() - t) * 1000)
                    assert found is not None, "the gate left an ID filter to the index plan"
                    pages[shortcut] = [x.memory_id for x in found]
                same += pages[True] == pages[False]
            for shortcut in (True, False):
                label = "shortcut" if shortcut else "gate    "
                print(
                    f"  {size:,} {count} IDs {label} {percentiles(times[shortcut][WARMUP:])}, "
                    f"pages identical {same} of {len(b.questions)}"
                )


async def carry(b: Bench) -> None:
    """A first page with what ranked it read for its cursors (`search_store._finish`'s
    `weights` and `best` columns) against without them (as before they were carried), and a
    second page ranked with the first's weights and best against weighed afresh; alternated
    question by question, on a turn's reader, with the plan the service chooses."""
    print("\ncarry: what ranked a first page, read for its cursors and carried to the next")
    finish = search_store._finish

    def bare(reader: Reader, r: Ranking, p: Params, **kwargs: Any) -> str:
        return finish(reader, replace(r, by_length=True), p, **kwargs)  # no carried columns

    for size in (1_000, 200_000):
        reader = reader_of(b.agent(size))
        for mode in ("hybrid", "lexical"):
            first: dict[bool, list[float]] = {True: [], False: []}
            later: dict[bool, list[float]] = {True: [], False: []}
            for i in range(len(b.questions)):
                for carried in (True, False) if i % 2 else (False, True):
                    search_store._finish = finish if carried else bare  # type: ignore[assignment]
                    try:
                        t = time.perf_counter()
                        page, _ = await search.ranked(b.pool, reader, Filters(), b.ranking(mode, i))
                        first[carried].append((time.perf_counter() - t) * 1000)
                    finally:
                        search_store._finish = finish  # type: ignore[assignment]
                if not page:
                    continue
                last = page[-1]
                for carried in (True, False) if i % 2 else (False, True):
                    r = b.ranking(
                        mode, i, after=(last.score, last.created, last.memory_id), depth=10
                    )
                    if carried:
                        r = replace(r, weights=page.weights, best=page.best)
                    t = time.perf_counter()
                    await search.ranked(b.pool, reader, Filters(), r)
                    later[carried].append((time.perf_counter() - t) * 1000)
            for name, times in (("first page ", first), ("second page", later)):
                for carried in (True, False):
                    label = "carried" if carried else "afresh "
                    print(
                        f"  {size:,} {mode:7} {name} {label} {percentiles(times[carried][WARMUP:])}"
                    )


async def shared_probes(b: Bench) -> None:
    """A lexical walk reading each GIN probe its tiers share once, against each tier reading
    its own (`SHARED_PROBES_MIN_RECORDS` at 0 and at infinity), first and second pages,
    alternated question by question, on a turn's reader; the pages compared."""
    print("\nshared-probes: a lexical walk's shared GIN probes read once, against per tier")
    least = search_store.SHARED_PROBES_MIN_RECORDS
    for size in (25_000, 200_000):
        reader = reader_of(b.agent(size))
        times: dict[bool, list[float]] = {True: [], False: []}
        same = 0
        for i in range(len(b.questions)):
            pages: dict[bool, list[tuple[UUID, float]]] = {}
            for once in (True, False) if i % 2 else (False, True):
                search_store.SHARED_PROBES_MIN_RECORDS = 0 if once else 2**62
                try:
                    t = time.perf_counter()
                    page, _ = await search.ranked(
                        b.pool, reader, Filters(), b.ranking("lexical", i)
                    )
                    times[once].append((time.perf_counter() - t) * 1000)
                    pages[once] = [(r.memory_id, r.score) for r in page]
                    if page:
                        last = page[-1]
                        r = b.ranking(
                            "lexical", i, after=(last.score, last.created, last.memory_id)
                        )
                        r = replace(r, weights=page.weights, best=page.best)
                        later, _ = await search.ranked(b.pool, reader, Filters(), r)
                        pages[once] += [(x.memory_id, x.score) for x in later]
                finally:
                    search_store.SHARED_PROBES_MIN_RECORDS = least
            same += pages[True] == pages[False]
        for once in (True, False):
            label = "once    " if once else "per tier"
            print(f"  {size:,} lexical {label} {percentiles(times[once][WARMUP:])}")
        print(
            f"  {size:,} lexical pages (first and second) identical: {same} of {len(b.questions)}"
        )


async def iterative_scan(b: Bench) -> None:
    print("\niterative scan: vector pages of one kind of record (a quarter of the agent's) on the")
    print("  index plan, hnsw.iterative_scan relaxed_order (the default) against off")
    for size in (25_000, 200_000):
        reader = reader_of(b.agent(size))
        kind = Filters(kind=scale.KINDS[0])
        exact = []
        for i in range(len(b.questions)):
            found, _ = await search.ranked(b.pool, reader, kind, b.ranking("vector", i), "exact")
            exact.append([r.memory_id for r in found])
        for setting in ("relaxed_order", "off"):
            async with rolled_back(b) as conn:
                await conn.execute(f"SET LOCAL hnsw.iterative_scan = {setting}")
                times, shares, short = [], [], 0
                for i in range(len(b.questions)):
                    t = time.perf_counter()
                    found, _ = await search.ranked(
                        Held(conn), reader, kind, b.ranking("vector", i), "index"
                    )
                    times.append((time.perf_counter() - t) * 1000)
                    shares.append(overlap([r.memory_id for r in found], exact[i]))
                    short += len(found) < 10
            print(
                f"  {size:,} {setting:13} overlap {sum(shares) / len(shares):.3f}, pages short "
                f"of 10: {short} of {len(shares)}; {percentiles(times[WARMUP:])}"
            )


def _backend_stat(pid: int) -> tuple[int, float, float]:
    """A local backend's minor page faults and user and system CPU (ms) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    return int(fields[7]), int(fields[11]) * tick, int(fields[12]) * tick


async def _served(
    b: Bench, conn: asyncpg.Connection, agents: list[scale.Agent], mode: str, warm: list[str]
) -> str:
    """The questions searched on `conn` (question i of agent `agents[i]`) after the `warm`
    questions (of the agents after them): faults and CPU of its backend, and the latency."""
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    n = len(b.questions)
    if warm:
        vectors = (await StaticEmbedder().embed(warm)).vectors
        for i, text in enumerate(warm):
            r = search.make_ranking(mode, text, vectors[i] if mode != "lexical" else None, None, 10)
            await search.ranked(Held(conn), reader_of(agents[n + i]), Filters(), r)
    before, times = _backend_stat(pid), []
    for i in range(n):
        t = time.perf_counter()
        await search.ranked(Held(conn), reader_of(agents[i]), Filters(), b.ranking(mode, i))
        times.append((time.perf_counter() - t) * 1000)
    faults, user, system = (y - x for x, y in zip(before, _backend_stat(pid), strict=True))
    return f"faults {faults / n:.0f}, CPU user {user / n:.2f} sys {system / n:.2f} ms; " + (
        percentiles(times)
    )


async def backends(b: Bench) -> None:
    print("\nbackends: searches on a new connection (after ten others, which prepare and plan its")
    print("  statements), against on one that served as many other searches first (other")
    print("  questions; at 1,000 records other agents), per search")
    n = len(b.questions)
    others = [q for q in scale.locomo_questions() if q not in set(b.questions)]
    others = random.Random(8).sample(others, n)
    small = [a for a in b.plan.agents if a[2] == 1_000][: 2 * n]
    for agents in (small, [b.agent(200_000)] * (2 * n)):
        for mode in ("hybrid", "lexical", "vector"):
            for warm in (False, True):
                conn = await asyncpg.connect(b.url, server_settings=dict(SESSION_SETTINGS))
                try:
                    await init_connection(conn)
                    # Ten first, so that both have their statements prepared and planned.
                    figures = await _served(b, conn, agents, mode, others[: n if warm else 10])
                finally:
                    await conn.close()
                label = "warm" if warm else "new "
                print(f"  {agents[0][2]:,} {mode:7} {label} {figures}")


async def labels(b: Bench) -> None:
    print("\nlabels: a listed agent searched under one label value (hybrid), as the service")
    print("  chooses (the exact plan) and the index plan forced")
    label = {5: "customer-0"}  # on every fiftieth record of the data set
    for size in (25_000, 200_000):
        agent = b.agent(size)
        reader = reader_of(agent)
        async with b.pool.acquire() as conn:
            params = Params(*agent[:2])
            holding = await conn.fetchval(
                "SELECT count(*) FROM agent_memories m WHERE m.account_id = $1 "
                f"AND m.action_id = $2 AND {has_labels(label, params)}",
                *params.values,
            )
        for plan in (None, "index"):
            times, chosen = [], set()
            for i in range(len(b.questions)):
                t = time.perf_counter()
                _, how = await search.ranked(
                    b.pool, reader, Filters(labels=label), b.ranking("hybrid", i), plan
                )
                times.append((time.perf_counter() - t) * 1000)
                chosen.add(how)
            # A connection plans a statement anew for its first five runs (plan_cache_mode auto).
            first = ", ".join(f"{t:.0f}" for t in times[:5])
            print(
                f"  {size:,} records, {holding:,} with the label, {'/'.join(sorted(chosen))}: "
                f"first five {first} ms; then {percentiles(times[5:])}"
            )


async def bound(b: Bench, counts: list[int]) -> None:
    print("\nbound: a label value on n of the 200,000-record agent's records (set in a transaction")
    print("  rolled back), ranked exactly and by the index plan, alternated; hybrid p50 / p95 ms")
    print(f"  (EXACT_MAX_ROWS {search.EXACT_MAX_ROWS:,}: the service ranks exactly up to it)")
    agent = b.agent(200_000)
    reader = reader_of(agent)
    value = "bench-bound"
    rng = random.Random(9)
    for n in counts:
        async with rolled_back(b) as conn:
            chosen = rng.sample(await memory_ids(conn, agent), n)
            t = time.perf_counter()
            await set_label(conn, agent, value, chosen)
            await conn.execute("ANALYZE agent_memories")
            set_up = time.perf_counter() - t
            held, times = Held(conn), {"exact": [], "index": []}
            shares = []
            for i in range(len(b.questions)):
                pages = {}
                for plan in ("exact", "index") if i % 2 else ("index", "exact"):
                    t = time.perf_counter()
                    found, _ = await search.ranked(
                        held, reader, Filters(labels={5: value}), b.ranking("hybrid", i), plan
                    )
                    times[plan].append((time.perf_counter() - t) * 1000)
                    pages[plan] = [r.memory_id for r in found]
                shares.append(overlap(pages["index"], pages["exact"]))
            exact, index = (percentiles(times[plan][WARMUP:]) for plan in ("exact", "index"))
            print(f"  n {n:,} (set up in {set_up:.0f} s): exact {exact}")
            print(
                f"  {'':{len(f'{n:,}') + 2}}index {index}, "
                f"top-10 overlap with exact {statistics.mean(shares):.3f}"
            )


async def probes(b: Bench) -> None:
    print("\nprobes: the vector top-10 of a listed agent's own HNSW index against brute force,")
    print("  by hnsw.ef_search, for LoCoMo questions and for queries made from its records")
    count = len(b.questions)
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
                "questions": list(b.vectors),
                "spans of a record (4-9 words)": list((await embedder.embed(spans)).vectors),
                "midpoints of two records": [
                    (vectors[i] + vectors[count + i]) / 2 for i in range(count)
                ],
            }
            # The key as constants, which the agent's partial index needs (search_store.AgentKey).
            nearest = (
                "SELECT memory_id FROM agent_memories "
                f"WHERE {maintenance.agent_predicate(account, action)} ORDER BY {{}} LIMIT 10"
            )
            brute = nearest.format("(embedding <=> $1) + 0")  # + 0: no index gives the order
            walk = nearest.format("embedding <=> $1")
            for name, qs in queries.items():
                exact = [[r[0] for r in await conn.fetch(brute, q)] for q in qs]
                cells = []
                for ef in (40, 60, 80, 100, 120, 150, 200, 300):
                    async with conn.transaction():
                        await conn.execute(f"SET LOCAL hnsw.ef_search = {ef}")
                        found = [[r[0] for r in await conn.fetch(walk, q)] for q in qs]
                    cells.append(f"{ef} {sum(map(overlap, found, exact)) / len(qs):.3f}")
                print(f"  {size:,} {name}: " + ", ".join(cells))


async def builds(b: Bench) -> None:
    print("\nbuilds: one agent's indexes, CREATE INDEX CONCURRENTLY as the upkeep builds them")
    async with b.pool.acquire() as conn:
        for size in (1_000, 5_000, 25_000):
            account, action, _ = b.agent(size)
            for kind, method in zip(("hnsw", "gin"), maintenance.index_methods(), strict=True):
                name = f"bench_parts_{kind}_{size}"
                await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                t = time.perf_counter()
                try:
                    await conn.execute(
                        f"CREATE INDEX CONCURRENTLY {name} ON agent_memories USING {method} "
                        f"WHERE {maintenance.agent_predicate(account, action)}"
                    )
                    took = time.perf_counter() - t
                finally:  # also an invalid index, which every write would go on updating
                    await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                print(f"  {size:,} records, {kind}: {took:.2f} s")


PLAN_MODES = {"force_custom_plan": "custom", "force_generic_plan": "generic", "auto": "auto"}


async def plans(b: Bench) -> None:
    print("\nplans: the plan a connection caches (generic) against one made for the values")
    print("  (custom), and plan_cache_mode auto's choice, one connection, p50 / p95 ms")
    rng = random.Random(3)
    for size in (1_000, 200_000):
        agent = b.agent(size)
        for value, holders in (("customer-0", None), ("bench-rare", 20)):
            async with rolled_back(b) as conn:
                every = await memory_ids(conn, agent)
                if holders is not None:
                    await set_label(conn, agent, value, rng.sample(every, holders))
                who = f"{holders} hold" if holders else "2% hold"
                for name, run in _plan_cases(b, conn, agent, value, every, rng).items():
                    if holders is not None and "IDs" in name:
                        continue  # the IDs do not depend on the label
                    cells = []
                    for mode, plan in PLAN_MODES.items():
                        await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                        times = []
                        for i in range(len(b.questions)):
                            t = time.perf_counter()
                            await run(i)
                            times.append((time.perf_counter() - t) * 1000)
                        s = summary(times[WARMUP:])
                        cells.append(f"{plan} {s['p50']:.2f} / {s['p95']:.2f}")
                    print(f"  {size:,} records, {value} ({who}), {name}: " + ", ".join(cells))


def _plan_cases(
    b: Bench,
    conn: asyncpg.Connection,
    agent: scale.Agent,
    value: str,
    every: list[UUID],
    rng: random.Random,
) -> dict[str, Callable[[int], Awaitable[Any]]]:
    """`plans`' statements, each run for question i."""
    reader = reader_of(agent)
    operator = OperatorReader(agent[0], agent[1])
    held = Held(conn)
    label = Filters(labels={5: value})

    def ranked(filters: Filters, i: int) -> Awaitable[Any]:
        return search.ranked(held, reader, filters, b.ranking("hybrid", i))

    def ids(n: int) -> Filters:
        return Filters(ids=rng.sample(every, n))

    return {
        "search, label": lambda i: ranked(label, i),
        "listing, label (newest)": lambda i: search_store.newest(
            conn, reader, label, after=None, limit=11
        ),
        "listing, label (list_page)": lambda i: store.list_page(
            conn,
            operator,
            after=None,
            limit=11,
            ascending=False,
            filters=store.ListFilters(labels={5: value}),
        ),
        "search, 20 IDs": lambda i: ranked(ids(20), i),
        "search, 500 IDs": lambda i: ranked(ids(500), i),
        "listing, 20 IDs": lambda i: search_store.newest(
            conn, reader, ids(20), after=None, limit=11
        ),
    }


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
    parser.add_argument(
        "--counts", default="2000,5000,10000,20000", help="bound: records holding the label"
    )
    args = parser.parse_args()
    scale.SAMPLES[:] = load_locomo(args.locomo)
    parts = list(PARTS) if "all" in args.parts else args.parts
    print(f"# python bench/search_parts.py {shlex.join(sys.argv[1:])}")
    pg = scale.server(args.data_dir)

    async def run() -> None:
        url = pg.uri(scale.Plan(1.0).database)
        try:
            conn = await asyncpg.connect(url)
        except asyncpg.InvalidCatalogNameError:
            message = f"no data set in {args.data_dir}: run search_scale.py --load-only"
            raise SystemExit(message) from None
        await conn.close()
        questions = random.Random(5).sample(scale.locomo_questions(), args.questions)
        vectors = (await StaticEmbedder().embed(questions)).vectors
        await scale.prewarm(url)
        pool = await create_pool(url, min_size=1, max_size=2)
        try:
            b = Bench(pool, questions, vectors)
            b.url = url
            for part in parts:
                await PARTS[part](b, args)
        finally:
            await pool.close()

    try:
        asyncio.run(run())
    finally:
        pg.stop()


PARTS: dict[str, Callable[[Bench, argparse.Namespace], Awaitable[None]]] = {
    "deep-pages": lambda b, args: deep_pages(b, args.depth),
    "recount": lambda b, args: recount(b, [float(s) for s in args.shares.split(",")]),
    "kept-counts": lambda b, _: kept_counts(b),
    "ids": lambda b, _: ids(b),
    "iterative-scan": lambda b, _: iterative_scan(b),
    "carry": lambda b, _: carry(b),
    "shared-probes": lambda b, _: shared_probes(b),
    "labels": lambda b, _: labels(b),
    "probes": lambda b, _: probes(b),
    "builds": lambda b, _: builds(b),
    "plans": lambda b, _: plans(b),
    "bound": lambda b, args: bound(b, [int(n) for n in args.counts.split(",")]),
    "backends": lambda b, _: backends(b),
}


if __name__ == "__main__":
    main()
