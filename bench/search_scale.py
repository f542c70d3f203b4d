"""Search at scale: latency of every search path, vector recall, and load throughput.

Builds (once, then reuses) a dedicated embedded PostgreSQL under --data-dir holding
1,000 agents of 1,000 records each, one agent of 200,000 records, and two mid-size agents
(5,000 and 25,000 records) used to place the exact/index threshold, every agent's rows
scattered through the table. Texts are sentences of the LoCoMo dev conversations
(summary = one turn with its speaker, content = another turn, about 46 words), embedded
with the `static` model and loaded with COPY (a later run, on the data set already loaded,
first migrates it and runs one round of the service's search upkeep, as the service does at
start). Then it times, server side (the SQL of one search, without the query embedding,
which the runtime does once per search anyway), hybrid, lexical and vector search and the
query-less listing through the real `app.memory.search` code, and compares the vector path
with exact brute-force top-10.

    python bench/search_scale.py --locomo PATH               # full size: ~25 min the first time
    python bench/search_scale.py --locomo PATH --scale 0.05  # quick: 50 small agents
    python bench/search_scale.py --locomo PATH --reorder     # rows in agent order first
    python bench/search_scale.py --locomo PATH --cold --http --json after.json  # every target

With --cold it first restarts the server with the OS page cache dropped (when this process may:
root) and without prewarm, and times the first search of agents the warm run leaves alone.
With --http it then times searchMemories over HTTP at every size (bench/search_http.py, which
also serves the data set from another source tree). With --json the figures go to a file too,
for `bench/search_compare.py` (bench/README.md).

The server is tuned for the benchmark with ALTER SYSTEM (shared_buffers 8GB so the table and
its indexes stay in memory, maintenance_work_mem 4GB and one parallel worker for the HNSW
build) and restarted; the service itself sets nothing of the kind.
"""

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import (  # noqa: E402
    NEW_AGENT,
    add_locomo_argument,
    load_locomo,
    percentiles,
    questions,
    restart_cold,
    summary,
    tuned_server,
    write_json,
)

from app.actions.harness import SearchConfig  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import hnsw, migrate  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings import store as embedding_store  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import maintenance  # noqa: E402
from app.memory.vectors import VECTOR_COLUMNS, memory_text  # noqa: E402

AGENT_INDEX_MIN_RECORDS = Settings.model_fields["agent_index_min_records"].default

SAMPLES: list[dict] = []  # LoCoMo's dev half, read from --locomo in main()
TURN = uuid.uuid4()  # the execution of the turn whose reader searches (make_reader)

SERVER_SETTINGS = {
    "shared_buffers": "8GB",
    "maintenance_work_mem": "4GB",
    "max_parallel_maintenance_workers": "1",
    "work_mem": "16MB",
    "effective_cache_size": "16GB",
    "random_page_cost": "1.1",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    "synchronous_commit": "off",
    "autovacuum": "off",  # the load ends with its own VACUUM ANALYZE; no surprise work mid-run
}
KINDS = ("guidance", "fact", "event", "reference")
COLUMNS = (
    "account_id",
    "action_id",
    "memory_id",
    "version",
    "created",
    "modified",
    "summary",
    "content",
    "metadata",
    "status",
    "scope",
    "kind",
    "source",
    "pinned",
    "labels",
    "preview",
    "execution_id",
    "invocation_number",
    "action_version",
    "session_id",
    "modified_by",
    "embedding",
)


def locomo_turns() -> list[str]:
    turns: list[str] = []
    for sample in SAMPLES:
        for key, session in sample["conversation"].items():
            if key.startswith("session_") and isinstance(session, list):
                turns += [f"{t['speaker']}: {t['text']}" for t in session]
    return turns


def locomo_questions() -> list[str]:
    return questions(SAMPLES)


class Plan:
    """Which agents hold how many records, at a given scale."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.small_agents = max(2, round(1000 * scale))
        self.small_size = 1000
        self.mid_sizes = (5000, 25000) if scale >= 0.5 else ()
        self.big_size = max(2000, round(200_000 * scale))
        self.accounts = [uuid.UUID(int=(i + 1) << 64) for i in range(10)]
        rng = random.Random(7)
        self.agents: list[tuple[uuid.UUID, uuid.UUID, int]] = []
        for i in range(self.small_agents):
            self.agents.append(
                (self.accounts[i % 10], uuid.UUID(int=rng.getrandbits(128)), self.small_size)
            )
        for size in self.mid_sizes:
            self.agents.append((self.accounts[0], uuid.UUID(int=rng.getrandbits(128)), size))
        self.big = (self.accounts[0], uuid.UUID(int=rng.getrandbits(128)), self.big_size)
        self.agents.append(self.big)
        self.total = sum(size for _, _, size in self.agents)

    @property
    def database(self) -> str:
        return f"engram_bench_{str(self.scale).replace('.', '_')}"


async def upkeep(url: str) -> None:
    """One round of the service's search upkeep, as it runs at start: own indexes for the
    agents of the default threshold, and word counts (again where a migration cleared them)."""
    t = time.perf_counter()
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        done = await maintenance.run_round(pool, AGENT_INDEX_MIN_RECORDS)
    finally:
        await pool.close()
    if done is None:
        print("  upkeep: skipped, another process holds the round's lock", flush=True)
        return
    print(
        f"  upkeep: {len(done.built)} agent indexes built, {len(done.dropped)} dropped, "
        f"{done.counted} agents' words counted in {time.perf_counter() - t:.0f} s",
        flush=True,
    )


def server(data_dir: Path) -> EmbeddedPostgres:
    return tuned_server(data_dir, SERVER_SETTINGS)


def rows_for(plan: Plan, turns: list[str]) -> list[tuple[uuid.UUID, uuid.UUID, str, str, datetime]]:
    """Every record's agent, text and creation time, shuffled so each agent's rows scatter."""
    rng = random.Random(11)
    now = datetime(2026, 11, 1, tzinfo=UTC)
    rows = []
    for account, action, size in plan.agents:
        for _ in range(size):
            summary = rng.choice(turns)[:500]
            content = rng.choice(turns).split(": ", 1)[1]
            created = now - timedelta(seconds=rng.randrange(365 * 86400))
            rows.append((account, action, summary, content, created))
    rng.shuffle(rows)
    return rows


async def load(plan: Plan, url: str, embedder: StaticEmbedder) -> dict[str, float]:
    """Creates agents, COPYs every record with its embedding, then builds the indexes."""
    figures: dict[str, float] = {}
    conn = await copy_connection(url)
    try:
        await embedding_store.record_model(conn, embedder.name, embedder.dimensions)
        await embedding_store.set_dimensions(conn, embedder.dimensions, VECTOR_COLUMNS)
        await conn.executemany(
            "INSERT INTO accounts (account_id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            [(a, f"bench {i}") for i, a in enumerate(plan.accounts)],
        )
        await conn.executemany(
            NEW_AGENT,
            [(account, action) for account, action, _ in plan.agents],
        )
        # Bulk load without secondary indexes, then build them: what a restore or a re-embed does.
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'agent_memories' "
            "AND indexname <> 'agent_memories_pkey'"
        )
        for index in indexes:
            await conn.execute(f'DROP INDEX "{index["indexname"]}"')

        rows = rows_for(plan, locomo_turns())
        batch = 10_000
        embed_seconds = copy_seconds = 0.0
        started = time.perf_counter()

        async def embed(chunk: Sequence[tuple[Any, ...]]) -> tuple[np.ndarray, float]:
            t = time.perf_counter()
            result = await embedder.embed([memory_text(r[2], r[3]) for r in chunk])
            return result.vectors, time.perf_counter() - t

        pending = asyncio.ensure_future(embed(rows[:batch]))
        for offset in range(0, len(rows), batch):
            chunk = rows[offset : offset + batch]
            vectors, seconds = await pending
            embed_seconds += seconds
            if offset + batch < len(rows):
                pending = asyncio.ensure_future(embed(rows[offset + batch : offset + 2 * batch]))
            records = [
                (
                    account,
                    action,
                    uuid.uuid4(),
                    1,
                    created,
                    created,
                    summary,
                    content,
                    {},
                    "ACTIVE",
                    "AGENT",
                    KINDS[i % 4],
                    "EXTRACTION",
                    False,
                    {"5": f"customer-{i % 50}"} if i % 10 == 0 else {},
                    False,
                    uuid.uuid4(),
                    1,
                    1,
                    None,
                    "agent",
                    vectors[j],
                )
                for j, (i, (account, action, summary, content, created)) in enumerate(
                    zip(range(offset, offset + len(chunk)), chunk, strict=True)
                )
            ]
            t = time.perf_counter()
            await conn.copy_records_to_table("agent_memories", records=records, columns=COLUMNS)
            copy_seconds += time.perf_counter() - t
            done = offset + len(chunk)
            if done % 100_000 < batch:
                rate = done / (time.perf_counter() - started)
                print(f"  loaded {done:,}/{len(rows):,} ({rate:,.0f} records/s)", flush=True)
        elapsed = time.perf_counter() - started
        figures["load_records_per_s"] = len(rows) / elapsed
        figures["embed_texts_per_s"] = len(rows) / embed_seconds
        figures["copy_records_per_s"] = len(rows) / copy_seconds

        for index in indexes:
            t = time.perf_counter()
            await conn.execute(index["indexdef"])
            key = f"build_{index['indexname']}_s"
            figures[key] = time.perf_counter() - t
            print(f"  built {index['indexname']} in {figures[key]:.0f} s", flush=True)
        t = time.perf_counter()
        await conn.execute("VACUUM ANALYZE agent_memories")
        figures["vacuum_analyze_s"] = time.perf_counter() - t
        # What the service's maintenance does after the load: the large agents' own HNSW and
        # GIN indexes, and their word counts.
        t = time.perf_counter()
        await upkeep(url)
        figures["build_agent_indexes_s"] = time.perf_counter() - t
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_figures (key text PRIMARY KEY, value float8 NOT NULL)"
        )
        await conn.executemany(
            "INSERT INTO bench_figures VALUES ($1, $2) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            list(figures.items()),
        )
    finally:
        await conn.close()
    return figures


async def online_insert_rate(
    url: str,
    plan: Plan,
    embedder: StaticEmbedder,
    count: int,
    ef_construction: str | None = None,
    base: int = 10_000,
    writers: int = 1,
) -> float:
    """Records embedded and stored per second into the fully indexed table, for an agent of
    their own, by `writers` connections at once (each its share of `count`, in its own
    transaction), rolled back with them: the dead entries they leave in the indexes (the
    bench's server runs without autovacuum) are under a key no search reads. (Written to the
    first small agent, as until the twenty-fourth session, runs left its range of the
    covering index at 3,366 buffers for its 1,000 rows, against 264 for another agent's.)

    With `ef_construction`, into an agent with its own indexes: it is given `base` records
    first, untimed, and its HNSW and GIN indexes as a round builds them, the HNSW's
    ef_construction then set to that (pgvector reads it at each insert;
    app/db/hnsw.py INSERT_EF_CONSTRUCTION). One writer does that in its
    transaction, so that it goes with the rest; several need it committed to share it, and
    it is deleted and its indexes dropped after them."""
    turns = locomo_turns()
    rng = random.Random(5)
    conns = [await copy_connection(url) for _ in range(writers)]
    setup = conns[0]
    account, action = plan.accounts[0], uuid.uuid4()
    names = maintenance.index_names(account, action)

    async def write(conn: asyncpg.Connection, records: int) -> None:
        for offset in range(0, records, 500):
            texts = [
                (rng.choice(turns), rng.choice(turns)) for _ in range(min(500, records - offset))
            ]
            vectors = (await embedder.embed([memory_text(s, c) for s, c in texts])).vectors
            now = datetime.now(UTC)
            await conn.copy_records_to_table(
                "agent_memories",
                records=[
                    (
                        account,
                        action,
                        uuid.uuid4(),
                        1,
                        now,
                        now,
                        s,
                        c,
                        {},
                        "ACTIVE",
                        "AGENT",
                        "fact",
                        "TOOL",
                        False,
                        {},
                        False,
                        uuid.uuid4(),
                        1,
                        1,
                        None,
                        "agent",
                        v,
                    )
                    for (s, c), v in zip(texts, vectors, strict=True)
                ],
                columns=COLUMNS,
            )

    async def prepare() -> None:
        await setup.execute(NEW_AGENT, account, action)
        if ef_construction is not None:
            await write(setup, base)
            where = maintenance.agent_predicate(account, action)
            for name, method in zip(names, maintenance.index_methods(), strict=True):
                await setup.execute(
                    f"CREATE INDEX {name} ON agent_memories USING {method} WHERE {where}"
                )
            await setup.execute(f"ALTER INDEX {names[0]} SET (ef_construction = {ef_construction})")

    async def clean_up() -> None:
        """The shared setup removed, on a connection of its own."""
        conn = await asyncpg.connect(url)
        try:
            for name in names:
                await conn.execute(f"DROP INDEX IF EXISTS {name}")
            await conn.execute(
                "DELETE FROM agent_memories WHERE account_id = $1 AND action_id = $2",
                account,
                action,
            )
            await conn.execute(
                "DELETE FROM actions WHERE account_id = $1 AND action_id = $2", account, action
            )
        finally:
            await conn.close()

    shared = writers > 1
    try:
        if shared:
            await prepare()
        transactions = [conn.transaction() for conn in conns]
        for tr in transactions:
            await tr.start()
        if not shared:
            await prepare()
        shares = [count // writers + (k < count % writers) for k in range(writers)]
        started = time.perf_counter()
        # Every writer to its end, even once another failed: none is left writing on a
        # connection closed below.
        outcomes = await asyncio.gather(
            *(write(c, n) for c, n in zip(conns, shares, strict=True)), return_exceptions=True
        )
        elapsed = time.perf_counter() - started
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        for tr in transactions:
            await tr.rollback()
    finally:
        # Closed before the clean-up, which ends what transactions a failure left open (the
        # server rolls them back): a writer's holds agent_memories, whose DROP INDEX would
        # wait for it forever (this task never ending it), and the clean-up run in one
        # (setup's) would be rolled back with it, or refused in an aborted one.
        for conn in conns:
            await conn.close()
        if shared:
            await clean_up()
    return count / elapsed


async def copy_connection(url: str) -> asyncpg.Connection:
    """A connection whose codecs COPY in binary: vectors, and jsonb (version byte 1 + text)."""
    conn = await asyncpg.connect(url)
    await register_vector(conn)
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: b"\x01" + json.dumps(v).encode(),
        decoder=lambda b: json.loads(b[1:]),
        schema="pg_catalog",
        format="binary",
    )
    return conn


async def reorder(url: str) -> None:
    """What `engram maintain-search --reorder` does: rows in agent order."""
    conn = await asyncpg.connect(url)
    try:
        t = time.perf_counter()
        await maintenance.reorder(conn)
        print(f"  reordered by agent in {time.perf_counter() - t:.0f} s", flush=True)
        # Remembered with the data set: a later run without --reorder reads the same order.
        await conn.execute(
            "INSERT INTO bench_figures VALUES ('reordered', 1) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )
    finally:
        await conn.close()


async def prewarm(url: str) -> None:
    """Loads the table and its indexes into shared_buffers (pg_prewarm), as a warm server has.
    Before any figure: a server just started reads every page from the OS (the online insert
    rate measured cold was 55 records/s against 333 warm)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        t = time.perf_counter()
        # Every table and index of the schema and their TOAST: whatever layout search reads.
        relations = await conn.fetch(
            "SELECT c.oid::regclass::text AS name FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 'm') AND c.relpages > 0 "
            "UNION ALL SELECT t.oid::regclass::text FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_class t ON t.oid = c.reltoastrelid "
            "WHERE n.nspname = 'public' AND t.relpages > 0"
        )
        for relation in relations:
            await conn.fetchval("SELECT pg_prewarm($1::regclass)", relation["name"])
        print(f"  prewarmed in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        await conn.close()


CPUIDLE = Path("/sys/devices/system/cpu/cpuidle/current_driver")
HALT_POLL = Path("/sys/module/haltpoll/parameters")


async def host(url: str) -> dict[str, str]:
    """What of the machine moves these figures by tens of percent, reported with them
    (bench/README.md, twenty-seventh and twenty-eighth sessions): whether the server's shared
    memory is in huge pages (`huge_pages` is `try` by default: on where the OS reserved enough,
    `vm.nr_hugepages`), and on a virtual machine whose idle driver is `haltpoll`, for how long
    at most an idle vCPU polls before it halts (and whether that time grows and shrinks)."""
    conn = await asyncpg.connect(url)
    try:
        huge = await conn.fetchval("SHOW huge_pages_status")
    finally:
        await conn.close()
    driver = CPUIDLE.read_text().strip() if CPUIDLE.exists() else "unknown"
    poll = f"none (cpuidle driver {driver})"
    if driver == "haltpoll":
        most, grow, shrink = (
            (HALT_POLL / f"guest_halt_poll_{name}").read_text().strip()
            for name in ("ns", "grow_start", "allow_shrink")
        )
        poll = f"up to {most} ns (grow_start {grow} ns, allow_shrink {shrink})"
    return {"huge_pages": huge, "guest_halt_poll": poll}


Agent = tuple[uuid.UUID, uuid.UUID, int]
Group = tuple[str, int, list[Agent]]  # title, records per agent, the agents
Pick = tuple[Agent, int]  # an agent and the question (index) to search it with


def groups_of(plan: Plan, sizes: set[int] | None) -> list[Group]:
    small = [a for a in plan.agents if a[2] == plan.small_size]
    title = f"{plan.small_size:,}-record agents ({len(small):,} of them)"
    groups = [(title, plan.small_size, small)]
    groups += [
        (f"{size:,}-record agent", size, [a for a in plan.agents if a[2] == size])
        for size in plan.mid_sizes
    ]
    groups.append((f"{plan.big_size:,}-record agent", plan.big_size, [plan.big]))
    return [g for g in groups if not sizes or g[1] in sizes]


def warm_picks(groups: list[Group], queries: int, questions: int) -> list[list[Pick]]:
    """Per group, the agents and questions the warm run searches (the same on every run)."""
    rng = random.Random(3)
    return [
        [(rng.choice(agents), rng.randrange(questions)) for _ in range(queries)]
        for _, _, agents in groups
    ]


def cold_agents(agents: list[Agent], picks: list[Pick], count: int) -> list[Agent]:
    """Up to `count` of the group's agents that the warm run does not search (all of them when
    the group is one agent): the cold run's searches are each the first of its agent."""
    if len(agents) == 1:
        return agents
    searched = {agent for agent, _ in picks}
    rest = [a for a in agents if a not in searched]
    random.Random(13).shuffle(rest)
    return rest[:count]


def make_reader(reader_kind: str, account: uuid.UUID, action: uuid.UUID) -> Any:
    from app.memory.visibility import AgentReader, OperatorReader
    from app.scope import Scope

    if reader_kind == "operator":  # searchMemories: every session, live and preview
        return OperatorReader(account_id=account, action_id=action)
    # search_memory during a live turn: the agent scope and its session's, no preview, and the
    # turn's own staged writes (none here). A reader without a turn (no execution) would be
    # planned anew at each search, which no search of the service is: with the execution's
    # parameter NULL, a custom plan folds its test away and always looks cheaper than the
    # generic one (1.5-2.5 ms of planning a search at 25,000 records, fourteenth session).
    return AgentReader(account, action, "bench-session", tuple(Scope), False, TURN, 1)


async def measure_cold(
    url: str,
    embedder: StaticEmbedder,
    groups: list[Group],
    picks: list[list[Pick]],
    per_mode: int,
    reader_kind: str,
    note: str,
) -> dict[str, dict[str, dict[str, float]]]:
    """The first search of agents after a restart without prewarm: per group of many agents,
    `per_mode` distinct agents per mode, each searched once; a group of one agent searched
    once (hybrid), then 9 more times (modes in turn) to show how fast it warms."""
    from app.memory import search as search_module
    from app.memory.search_store import Filters

    questions = locomo_questions()
    vectors = (await embedder.embed(questions)).vectors
    rng = random.Random(17)
    figures: dict[str, dict[str, dict[str, float]]] = {}
    pool = await create_pool(url, min_size=1, max_size=2)
    modes = ("hybrid", "lexical", "vector")

    async def timed(agent: Agent, mode: str) -> float:
        q = rng.randrange(len(questions))
        ranking = search_module.make_ranking(mode, questions[q], vectors[q], None, 10)
        reader = make_reader(reader_kind, agent[0], agent[1])
        t = time.perf_counter()
        await search_module.ranked(pool, reader, Filters(), ranking)
        return (time.perf_counter() - t) * 1000

    try:
        print(f"\ncold: the first search of an agent ({note}; no prewarm)")
        for (title, size, agents), warm in zip(groups, picks, strict=True):
            chosen = cold_agents(agents, warm, per_mode * 3)
            found: dict[str, dict[str, float]] = {}
            if len(chosen) < 3 and len(agents) > 1:
                print(f"  {title}: skipped, the warm run searches (nearly) every one of them")
                continue
            if len(agents) == 1:
                first = await timed(chosen[0], "hybrid")
                rest = [await timed(chosen[0], modes[i % 3]) for i in range(9)]
                print(f"  {title}: cold first search (hybrid) {first:.2f} ms")
                print(f"    cold next 9 (modes in turn): {percentiles(rest)}")
                found = {"first hybrid": summary([first]), "next 9": summary(rest)}
            else:
                print(f"  {title}, {len(chosen) // 3} distinct agents per mode:")
                for i, mode in enumerate(modes):
                    samples = [await timed(agent, mode) for agent in chosen[i::3]]
                    print(f"    cold {mode:8s} first search  {percentiles(samples)}")
                    found[mode] = summary(samples)
            figures[str(size)] = found
    finally:
        await pool.close()
    return figures


async def measure(
    plan: Plan,
    url: str,
    embedder: StaticEmbedder,
    groups: list[Group],
    picks: list[list[Pick]],
    recall_samples: int,
    reader_kind: str,
) -> dict[str, Any]:
    """Per agent size: latency of each mode under the chosen plan (and, to show why it is
    chosen, under the other plan), and top-10 overlap with exact brute force. Returns the
    chosen plan's figures per size."""
    from app.memory import search as search_module
    from app.memory.search import search
    from app.memory.search_store import Filters, Ranking

    pool = await create_pool(url, min_size=1, max_size=2)
    questions = locomo_questions()
    vectors = (await embedder.embed(questions)).vectors
    config = SearchConfig(max_results=10)
    figures: dict[str, Any] = {}
    try:

        def ranking(mode: str, q: int) -> Ranking:
            return search_module.make_ranking(mode, questions[q], vectors[q], None, 10)

        for (title, size, agents), group_picks in zip(groups, picks, strict=True):
            print(f"\n{title}")
            for forced in (None, "exact", "index"):
                if forced == "exact" and agents[0][2] > 50_000:
                    print("  exact plan forced: skipped (seconds per search at this size)")
                    continue
                if forced == "index" and agents[0][2] < AGENT_INDEX_MIN_RECORDS:
                    print("  index plan forced: none (without own indexes, ranked exactly)")
                    continue
                runs = group_picks[: max(20, len(group_picks) // 4)] if forced else group_picks
                timings: dict[str, list[float]] = {m: [] for m in ("hybrid", "lexical", "vector")}
                overlap: dict[str, list[float]] = {"vector": [], "hybrid": []}
                used: set[str] = set()
                for i, ((account, action, _), q) in enumerate(runs):
                    reader = make_reader(reader_kind, account, action)
                    # Rotated, so that no mode always meets the agent's pages first.
                    modes = list(timings)
                    for mode in modes[i % 3 :] + modes[: i % 3]:
                        t = time.perf_counter()
                        found, chosen = await search_module.ranked(
                            pool, reader, Filters(), ranking(mode, q), forced
                        )
                        timings[mode].append((time.perf_counter() - t) * 1000)
                        used.add(chosen)
                        # Brute force over a large agent takes about a second: fewer samples
                        # there. (Hybrid took 30 until the fifty-fourth session, whose 30 at
                        # 200,000 records read 0.927 where 200 questions read 0.982.)
                        enough = {"vector": 200, "hybrid": 200}
                        if agents[0][2] >= 10_000:
                            enough = {"vector": recall_samples, "hybrid": recall_samples}
                        if mode in overlap and len(overlap[mode]) < enough[mode]:
                            exact, _ = await search_module.ranked(
                                pool, reader, Filters(), ranking(mode, q), "exact"
                            )
                            want = {r.memory_id for r in exact}
                            got = {r.memory_id for r in found}
                            overlap[mode].append(len(want & got) / len(want))
                name = "chosen plan" if forced is None else f"{forced} plan forced"
                print(f"  {name} ({', '.join(sorted(used))}):")
                for mode, samples in timings.items():
                    print(f"    {mode:8s} top-10  {percentiles(samples[5:])}")
                for mode, found_share in overlap.items():
                    print(
                        f"    {mode} top-10 overlap with the exact plan's (brute force): "
                        f"{statistics.mean(found_share):.3f} (n={len(found_share)})"
                    )
                if forced is None:
                    figures[str(size)] = {
                        **{mode: summary(samples[5:]) for mode, samples in timings.items()},
                        "overlap": {m: statistics.mean(v) for m, v in overlap.items()},
                        "plan": ", ".join(sorted(used)),
                    }
            # search_memory in a turn: the turn's recall searched the same agent a moment before
            # (with the request as its query), so what the process learnt of the agent serves.
            in_turn: list[float] = []
            for (account, action, _), q in group_picks:
                reader = make_reader(reader_kind, account, action)
                recall = ranking("hybrid", (q + 1) % len(questions))
                await search_module.ranked(pool, reader, Filters(), recall)
                t = time.perf_counter()
                await search_module.ranked(pool, reader, Filters(), ranking("hybrid", q))
                in_turn.append((time.perf_counter() - t) * 1000)
            print(f"  hybrid after the turn's recall (search_memory): {percentiles(in_turn[5:])}")
            listing: list[float] = []
            for (account, action, _), _q in group_picks:
                reader = make_reader(reader_kind, account, action)
                t = time.perf_counter()
                await search(pool, embedder, reader, config, query=None, limit=100)
                listing.append((time.perf_counter() - t) * 1000)
            print(f"  query-less listing, 100 newest: {percentiles(listing[5:])}")

        account, action, _ = plan.big
        reader = make_reader(reader_kind, account, action)
        samples = []
        for question in questions[:200]:
            t = time.perf_counter()
            await search(pool, embedder, reader, config, query=question)
            samples.append((time.perf_counter() - t) * 1000)
        print(
            f"\nwhole search() with the query embedding, hybrid, {plan.big_size:,}-record agent: "
            f"{percentiles(samples[5:])}"
        )
    finally:
        await pool.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_locomo_argument(parser)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full size (1.0)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "engram-bench-scale"
    )
    parser.add_argument("--queries", type=int, default=200, help="searches per agent group")
    parser.add_argument(
        "--sizes", default="", help="only agents of these sizes, e.g. 1000,200000 (default: all)"
    )
    parser.add_argument(
        "--recall-samples",
        type=int,
        default=50,
        help="searches of a large agent compared with brute force, vector and hybrid each "
        "(about 1 s each at 200,000 records)",
    )
    parser.add_argument(
        "--reader",
        choices=("agent", "operator"),
        default="agent",
        help="whose search: an agent's search_memory in a turn (the target's), or an operator's",
    )
    parser.add_argument("--reload", action="store_true", help="drop and rebuild the data set")
    parser.add_argument(
        "--reorder",
        action="store_true",
        help="store the records in agent order first (`engram maintain-search --reorder`)",
    )
    parser.add_argument(
        "--load-only", action="store_true", help="load (and with --reorder, reorder), then stop"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="first, restart the server with the OS page cache dropped (root) and no prewarm, "
        "and time the first search of agents the warm run does not search",
    )
    parser.add_argument(
        "--cold-agents",
        type=int,
        default=50,
        help="with --cold: distinct agents per mode among the 1,000-record ones (50)",
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="then searchMemories over HTTP at every size (bench/search_http.py; with --cold, "
        "its cold first searches too)",
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the figures here (search_compare.py)"
    )
    args = parser.parse_args()
    SAMPLES[:] = load_locomo(args.locomo)
    command = "python bench/search_scale.py " + shlex.join(sys.argv[1:])
    plan = Plan(args.scale)
    print(f"# {command}")
    print(
        f"# {plan.total:,} records: {plan.small_agents:,} agents x {plan.small_size:,}, "
        f"mid agents {list(plan.mid_sizes)}, one agent of {plan.big_size:,}"
    )

    pg = server(args.data_dir)
    embedder = StaticEmbedder()

    async def prepare() -> bool:
        conn = await asyncpg.connect(pg.uri())
        try:
            exists = await conn.fetchval(
                "SELECT 1 FROM pg_database WHERE datname = $1", plan.database
            )
            if exists and args.reload:
                await conn.execute(f'DROP DATABASE "{plan.database}" WITH (FORCE)')
                exists = False
            if not exists:
                await conn.execute(f'CREATE DATABASE "{plan.database}"')
            loaded = False
            if exists:
                db = await asyncpg.connect(pg.uri(plan.database))
                try:
                    loaded = bool(
                        await db.fetchval("SELECT to_regclass('bench_figures') IS NOT NULL")
                    )
                finally:
                    await db.close()
            return loaded
        finally:
            await conn.close()

    url = pg.uri(plan.database)
    loaded = asyncio.run(prepare())
    migrate.upgrade(url)  # a data set loaded by an earlier release gets the later migrations
    if not loaded:
        print("loading ...", flush=True)
        asyncio.run(load(plan, url, embedder))
    else:
        asyncio.run(upkeep(url))

    async def figures() -> dict[str, float]:
        conn = await asyncpg.connect(url)
        try:
            return {
                r["key"]: r["value"]
                for r in await conn.fetch("SELECT key, value FROM bench_figures")
            }
        finally:
            await conn.close()

    load_figures = asyncio.run(figures())
    print("\nload (bulk, secondary indexes built after):")
    f = load_figures
    print(
        f"  embedded {f['embed_texts_per_s']:,.0f} texts/s; "
        f"COPY {f['copy_records_per_s']:,.0f} records/s; "
        f"embedded and stored {f['load_records_per_s']:,.0f} records/s end to end"
    )
    for key, value in sorted(load_figures.items()):
        if key.startswith("build_") or key == "vacuum_analyze_s":
            print(f"  {key}: {value:,.0f} s")
    if args.reorder:
        asyncio.run(reorder(url))
    # As the data set holds them: in agent order once a run (or its load) reordered them.
    rows = "in agent order" if args.reorder or "reordered" in load_figures else "scattered"
    print(f"  rows: {rows}")
    if args.load_only:
        return
    sizes = {int(x) for x in args.sizes.split(",") if x}
    groups = groups_of(plan, sizes or None)
    picks = warm_picks(groups, args.queries, len(locomo_questions()))
    figures: dict[str, Any] = {
        "command": command,
        "records": plan.total,
        "rows": rows,
    }
    if args.cold:
        # First, while this process has searched nothing: the cold searches are of agents the
        # warm run below does not search, so that its searches stay each agent's first too.
        pg, note = restart_cold(pg, args.data_dir, SERVER_SETTINGS)
        url = pg.uri(plan.database)
        cold = asyncio.run(
            measure_cold(url, embedder, groups, picks, args.cold_agents, args.reader, note)
        )
        figures |= {"sql_cold": cold, "cold_note": note}
    asyncio.run(prewarm(url))
    figures["host"] = asyncio.run(host(url))
    print(
        f"  host: shared memory in huge pages {figures['host']['huge_pages']}; "
        f"guest halt polling {figures['host']['guest_halt_poll']}"
    )
    rate = asyncio.run(online_insert_rate(url, plan, embedder, 2000))
    print(
        f"  online: {rate:,.0f} records/s embedded and COPYed into the fully indexed table "
        "(2,000 records of a new agent, rolled back)"
    )
    figures["online_writes_per_s"] = rate
    built = maintenance.OPTIONS[0]["ef_construction"]
    for ef in dict.fromkeys([built, hnsw.INSERT_EF_CONSTRUCTION]):
        rate = asyncio.run(online_insert_rate(url, plan, embedder, 2000, ef))
        print(
            f"  online, into an agent with its own indexes (ef_construction {ef}"
            f"{', as built' if ef == built else ', as a round leaves it'}): {rate:,.0f} records/s"
            " (2,000 records into an agent of 10,000, rolled back)"
        )
        figures[f"online_writes_own_indexes_{ef}_per_s"] = rate
    # Online writes come from many turns at once: the table's rate with two writers (this
    # machine's cores), into a new agent and into one with its own indexes as a round leaves
    # them.
    for ef in (None, hnsw.INSERT_EF_CONSTRUCTION):
        rate = asyncio.run(online_insert_rate(url, plan, embedder, 2000, ef, writers=2))
        into = "a new agent" if ef is None else f"an agent of 10,000 with its own indexes ({ef})"
        print(f"  online, two writers at once into {into}: {rate:,.0f} records/s (2,000 records)")
        figures[f"online_writes_two_writers_{'own_indexes' if ef else 'new'}_per_s"] = rate
    figures["sql"] = asyncio.run(
        measure(plan, url, embedder, groups, picks, args.recall_samples, args.reader)
    )
    if args.http:
        from search_http import serve_and_measure

        print("\nsearchMemories over HTTP (bench/search_http.py), `engram serve` of this tree:")
        http, pg = serve_and_measure(
            pg,
            args.data_dir,
            plan,
            ROOT,
            locomo_questions(),
            groups,
            picks,
            args.cold,
            args.cold_agents,
        )
        figures |= http
    print(f"\nreproduce: {command}")
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
