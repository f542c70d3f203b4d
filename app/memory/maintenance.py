"""Search upkeep: own search indexes of large agents and of large sessions' history
(app/history/indexes.py), and word counts.

Run every `search_maintenance_seconds`, by one process at a time (a session advisory lock;
other processes skip the round; `Rounds` counts each outcome for the service's metrics):

- Agents with at least `agent_index_min_records` records get an HNSW and a GIN index of their
  own, partial indexes on `(account_id, action_id)`, built with CREATE INDEX CONCURRENTLY
  (each build reads the whole table once); smaller agents are ranked exactly. The index plan
  names a listed agent's key as constants, so the planner picks them (search_store.AgentKey).
  An agent under half the threshold loses them, and at most `agent_index_max_agents` agents
  have them: every statement planned on agent_memories or writing to it locks each of its
  indexes, and hundreds would fill PostgreSQL's lock table under concurrent load. An index of
  this naming that no listed agent keeps (an interrupted build) is dropped by the next round.
- A listed agent's words are counted (`count_agent_words`, migrations 0018 and 0020: over its
  live records of agent scope, and of every scope) when it is listed, and again after a record
  is deleted or replaced or once either count has grown by a tenth (WORDS_RECOUNT): the
  searches of operators (every scope) and of live readers of agent scope (with their own
  session's words) weigh a query word by how many of them hold it (app/memory/search.py says
  what other searches do). Its sessions of SESSION_WORDS_MIN live records or more have their
  words counted too (`count_sessions`), so that their turns do not count them at each search.

Between rounds, `IndexBuilds` gives an agent (or a session) its own indexes soon after a write
of this process takes it past the threshold (a commit of addAgentMemory/addAgentMemories, a
turn's memory or history, `engram import`), in the background and under the same lock, so
that it is not searched by scoring every record until the next round. An agent beyond
`agent_index_max_agents` is: it gets no indexes until a round finds it a place (another falls
under half the threshold, the cap is raised, or it grows to TRADE times the records of the
smallest listed agent, which then loses its own).

`engram maintain-search` runs one round by hand; with `--reorder` it first stores the records
in agent order again (`reorder`).
"""

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import cast
from uuid import UUID

import asyncpg

from app import tasks
from app.db import hnsw
from app.db.pool import drawing_on, lift_bounds, session_changed
from app.history import indexes as history_indexes
from app.memory import visibility
from app.state import ServiceKey

log = logging.getLogger(__name__)

# The round's advisory lock: one process at a time runs a round or a build.
ROUND_LOCK = "hashtext('engram.search_maintenance')"
# How often `holding_round` asks for the round's lock again while a round or a build holds it.
HOLD_RETRY_SECONDS = 1.0
# The `deployment` row that says which process ran the last round, when it started and when it
# finished (null while it runs): several processes share a database, one round at a time.
ROUND_KEY = "search_maintenance.round"
PROCESS = f"{socket.gethostname()}:{os.getpid()}"
# Storage options of an agent's HNSW and GIN indexes: ef_construction 256 for recall at the
# search's ef_search (lowered once built, app/db/hnsw.py); m 12, not pgvector's 16, for a faster
# walk (vector p50 at 25,000 records 0.78 of m 16's at the same ef_search, overlap with exact
# 0.995 against 0.999; at 200,000 records, with ef_search 150 against m 16's 120, 0.82 at the
# same overlap; bench/README.md, nineteenth session). An index built with other options is
# rebuilt, and so is an HNSW index once the agent has grown to hnsw.REBUILD_GROWTH times the
# records it was built over.
OPTIONS = ({"m": "12", "ef_construction": hnsw.BUILD_EF_CONSTRUCTION}, {"fastupdate": "off"})
_PREFIXES = ("agent_memories_vectors_", "agent_memories_words_")
# A listed agent's words are counted again once its counted records have grown by this share
# (a count reads every record of the agent: 2.3 s for the 200,000-record agent of
# bench/search_scale.py, 0.4 s at 25,000); at once after a deletion or replacement.
WORDS_RECOUNT = 0.1
# A listed agent's session of this many live records or more has its words counted too (and
# again as WORDS_RECOUNT says), dropped under half that: a turn of it that reads agent scope
# would otherwise count them at each search (a scan of the session's rows; a reader of it
# alone, a count over the rows it ranks), 70 to 170 ms more a search for 50,000 records.
SESSION_WORDS_MIN = 1_000
# With `agent_index_max_agents` agents listed, an agent of TRADE times the smallest listed one's
# records takes its place, one a round (`index_agents`).
TRADE = 2
AgentKey = tuple[UUID, UUID]  # (account_id, action_id)
Key = AgentKey | history_indexes.Key  # an agent's, or a session's (account, action, session)
# Said when an agent's build is done: `engram import` waits for it silently otherwise (a
# 200,000-record agent's HNSW index takes minutes).
_BUILD_DONE = "built search indexes for agent %s in %.1f s"


# What a round of the service comes to (`Rounds`); skipped: another process held the lock.
OUTCOMES = ("done", "failed", "skipped")


@dataclass
class Rounds:
    """The service's rounds so far, by outcome (OUTCOMES), and the unix time the last one done
    finished: they run outside any request, so the service's metrics read them when scraped
    (app/main.py)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    last_done: float | None = None

    def count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        if outcome == "done":
            self.last_done = time.time()


@dataclass(frozen=True)
class Round:
    """What one maintenance round did."""

    counted: int  # agents whose words were counted
    built: list[str]  # agent indexes created
    dropped: list[str]  # agent indexes removed
    failed: list[UUID]  # agents whose build failed (logged)
    sessions: int = 0  # sessions whose words were counted (`count_sessions`)


def index_names(account_id: UUID, action_id: UUID) -> tuple[str, str]:
    """The agent's HNSW and GIN indexes: a prefix and a digest of its key (PostgreSQL's names
    are at most 63 bytes)."""
    digest = hashlib.md5(f"{account_id}/{action_id}".encode()).hexdigest()
    return f"{_PREFIXES[0]}{digest}", f"{_PREFIXES[1]}{digest}"


def index_methods() -> tuple[str, str]:
    """How an agent's HNSW and GIN indexes are built (`USING ...`), with OPTIONS."""
    hnsw, gin = (", ".join(f"{k} = {v}" for k, v in options.items()) for options in OPTIONS)
    return f"hnsw (embedding vector_cosine_ops) WITH ({hnsw})", f"gin (tsv) WITH ({gin})"


def agent_predicate(account_id: UUID, action_id: UUID) -> str:
    """The agent's indexes' predicate: its key as constants (a predicate takes no parameters;
    UUIDs printed by Python are hex digits and dashes)."""
    return f"account_id = '{UUID(str(account_id))}' AND action_id = '{UUID(str(action_id))}'"


async def _agent_index_states(conn: asyncpg.Connection) -> dict[str, bool]:
    """Every index of agent_memories named like an agent's, and whether it is current: it
    answers queries (an index left invalid by an interrupted build does not, but is still
    written to) and was built with today's OPTIONS (an HNSW index's ef_construction since
    lowered to hnsw.INSERT_EF_CONSTRUCTION or not)."""
    rows = await conn.fetch(
        "SELECT c.relname, i.indisvalid, coalesce(c.reloptions, '{}') AS options "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = 'agent_memories'::regclass "
        "AND (c.relname LIKE $1 || '%' OR c.relname LIKE $2 || '%')",
        *(prefix.replace("_", "\\_") for prefix in _PREFIXES),
    )
    vectors, words = hnsw.current(OPTIONS[0]), [hnsw.spelled(OPTIONS[1])]
    return {
        r["relname"]: r["indisvalid"]
        and sorted(r["options"]) in (vectors if r["relname"].startswith(_PREFIXES[0]) else words)
        for r in rows
    }


async def drop_agent_indexes(conn: asyncpg.Connection) -> None:
    """Unlists every agent (its word counts go too, and its searches count words themselves
    until it is listed again) and drops every index of this naming, inside the caller's
    transaction: new embedding dimensions make
    them stale (app/embeddings/store.py reset_vectors); the next round rebuilds them.

    The caller holds the round's lock, taken before its transaction (`dropping_agent_indexes`),
    so that no round or build is in flight; without it, it is taken here for the transaction
    when free, and refused otherwise: waiting for it here deadlocks with the build (as
    `_hold_round` says)."""
    if not await conn.fetchval(f"SELECT pg_try_advisory_xact_lock({ROUND_LOCK})"):
        raise RuntimeError(
            "search maintenance is running: hold its lock before the transaction that drops "
            "the search indexes (maintenance.dropping_agent_indexes)"
        )
    await conn.execute("DELETE FROM agent_indexes")
    for name in await _agent_index_states(conn):
        quoted = await conn.fetchval("SELECT quote_ident($1)", name)
        await conn.execute(f"DROP INDEX IF EXISTS {quoted}")
    await history_indexes.drop_session_indexes(conn)  # large sessions' own indexes too


async def _drop_index(conn: asyncpg.Connection, name: str) -> None:
    quoted = await conn.fetchval("SELECT quote_ident($1)", name)
    await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quoted}")


async def _build(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, states: dict[str, bool]
) -> tuple[list[str], list[str]]:
    """Builds the agent's indexes that are missing, and replaces those that are invalid or were
    built with other options: the replacement is built beside the old index, which goes only
    then, so the agent's searches are never without one. Lists the agent in `agent_indexes`.
    Returns the indexes built and dropped."""
    started = time.monotonic()
    methods = dict(zip(index_names(account_id, action_id), index_methods(), strict=True))
    built: list[str] = []
    dropped: list[str] = []
    if any(name not in states for name in methods):
        # Searched without its own indexes until both are there, then listed again.
        await conn.execute(
            "DELETE FROM agent_indexes WHERE account_id = $1 AND action_id = $2",
            account_id,
            action_id,
        )
    for name, method in methods.items():
        current = states.get(name)
        if current:
            continue
        target = name if current is None else f"{name}{hnsw.NEXT}"
        await _drop_index(conn, target)  # what an interrupted build left under that name
        await conn.execute(
            f"CREATE INDEX CONCURRENTLY {target} ON agent_memories USING {method}"
            f" WHERE {agent_predicate(account_id, action_id)}"
        )
        if target != name:
            await _drop_index(conn, name)
            await conn.execute(f"ALTER INDEX {target} RENAME TO {name}")
            dropped.append(name)
        built.append(name)
    vectors = next(iter(methods))
    if vectors in built:
        rows = await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE account_id = $1 AND action_id = $2",
            account_id,
            action_id,
        )
        await hnsw.note_built(conn, vectors, rows)
    await hnsw.lower(conn, [vectors])
    await _list(conn, account_id, action_id)
    if built:
        log.info(_BUILD_DONE, action_id, time.monotonic() - started)
    return built, dropped


async def _list(conn: asyncpg.Connection, account_id: UUID, action_id: UUID) -> None:
    """Lists the agent with its records counted now (vector search widens a large agent's
    HNSW search by them, app/memory/search.py LARGE_AGENT_RECORDS), and counts its words, in one
    transaction: a listed agent's search weighs words by its counts."""
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO agent_indexes (account_id, action_id, vectors_index, words_index, "
            "records) SELECT $1, $2, $3, $4, count(*) FROM agent_memories "
            "WHERE account_id = $1::uuid AND action_id = $2::uuid "
            "ON CONFLICT (account_id, action_id) DO NOTHING",
            account_id,
            action_id,
            *index_names(account_id, action_id),
        )
        await conn.fetchval("SELECT count_agent_words($1, $2)", account_id, action_id)


def _places(
    sizes: dict[AgentKey, int], listed: list[AgentKey], min_records: int, max_agents: int | None
) -> tuple[list[AgentKey], list[AgentKey], AgentKey | None]:
    """Which agents have their own indexes after this round (`index_agents` says the rule): the
    listed ones that keep their place, largest first; the new ones; and the listed one that
    gives its place up to the last new one once that one is built (None: none does)."""
    places = len(sizes) if max_agents is None else max_agents
    largest = sorted(sizes, key=lambda agent: (-sizes[agent], agent))
    keep = [agent for agent in largest if agent in listed][:places]
    waiting = [agent for agent in largest if sizes[agent] >= min_records and agent not in listed]
    new, waiting = waiting[: places - len(keep)], waiting[places - len(keep) :]
    # Full: the smallest listed agent gives its place up to a waiting one of TRADE times its
    # records, one a round, and only once the newcomer's indexes are built (index_agents).
    traded = None  # it keeps its upkeep (counts, repairs) while it is listed
    if waiting and keep and sizes[waiting[0]] >= TRADE * sizes[keep[-1]]:
        traded = keep[-1]
        new.append(waiting[0])
    return keep, new, traded


async def index_agents(
    conn: asyncpg.Connection, min_records: int, max_agents: int | None = None
) -> tuple[int, list[str], list[str], list[UUID]]:
    """Gives every agent of `min_records` or more its own HNSW and GIN indexes, the largest
    first and no more than `max_agents` agents (None: no limit), and takes them from agents
    now under half that or beyond the limit (unlisted first, so searches stop choosing them).
    An agent keeps its indexes against a larger one that has none unless that one holds at
    least TRADE times its records (a build reads the whole table: places are not traded back
    and forth, but a large agent is not left out for good by the first agents to cross the
    threshold); then, one agent a round, it is unlisted and its indexes dropped once the
    newcomer is built and listed (meanwhile the table holds one agent's indexes over
    `max_agents`, and for a moment both agents are listed).

    An agent's words are counted when it is listed, and a kept agent's again when `_recount`
    says (before the builds, each on its own: a failed count is logged and retried next round).

    Outside any transaction (CREATE INDEX CONCURRENTLY). One agent's failed build does not stop
    the others'; it is retried next round. Returns how many agents' words were counted, the
    indexes built and dropped, and the agents whose build (or listing) failed."""
    rows = await conn.fetch(
        "SELECT account_id, action_id, count(*) AS records, count(*) FILTER (WHERE "
        "scope = 'AGENT' AND live) AS counted, count(*) FILTER (WHERE live) AS counted_any, "
        f"count(*) FILTER (WHERE {visibility.gone()}) AS gone "
        f"FROM (SELECT *, {visibility.counted()} AS live FROM agent_memories m) m "
        "GROUP BY account_id, action_id HAVING count(*) >= $1",
        (min_records + 1) // 2,
    )
    sizes = {(r["account_id"], r["action_id"]): r["records"] for r in rows}
    # Now, and when the words were counted (None: never): the records counted (agent scope,
    # every scope), and the rows deleted or replaced.
    now = {(r["account_id"], r["action_id"]): _counts(r) for r in rows}
    then = {
        (r["account_id"], r["action_id"]): _counts(r, "words_")
        for r in await conn.fetch("SELECT * FROM agent_indexes")
    }
    states = await _agent_index_states(conn)
    listed = list(then)
    keep, new, traded = _places(sizes, listed, min_records, max_agents)
    leaving = sorted(set(listed) - set(keep))
    await conn.execute(
        "DELETE FROM agent_indexes a USING unnest($1::uuid[], $2::uuid[]) AS d(account, action) "
        "WHERE a.account_id = d.account AND a.action_id = d.action",
        [account for account, _ in leaving],
        [action for _, action in leaving],
    )
    await conn.execute(
        "UPDATE agent_indexes a SET records = k.records "
        "FROM unnest($1::uuid[], $2::uuid[], $3::bigint[]) AS k(account, action, records) "
        "WHERE a.account_id = k.account AND a.action_id = k.action",
        [account for account, _ in keep],
        [action for _, action in keep],
        [sizes[agent] for agent in keep],
    )
    owned = {name for agent in [*keep, *new] for name in index_names(*agent)}
    await hnsw.finish_replacements(conn, states, owned)
    dropped = await _drop_indexes(conn, sorted(set(states) - owned))
    states = {name: current for name, current in states.items() if name in owned}
    built: list[str] = []
    failed: list[UUID] = []
    counted: list[AgentKey] = []  # counted again, or listed (and so counted) by `_list`
    # Not one this round builds anyway; one built again goes beside the old one.
    vectors = {index_names(*a)[0]: sizes[a] for a in keep if states.get(index_names(*a)[0])}
    for name in await hnsw.outgrown(conn, vectors):
        states[name] = False
    ready = {a for a in keep + new if all(states.get(name) for name in index_names(*a))}
    await hnsw.lower(conn, [index_names(*agent)[0] for agent in ready])  # built at 256 before
    for agent in keep:
        # Before the builds (which may take minutes), and not an agent about to be rebuilt,
        # whose build lists it again.
        if agent in ready and _recount(now[agent], then[agent]):
            try:
                await conn.fetchval("SELECT count_agent_words($1, $2)", *agent)
                counted.append(agent)
            except asyncpg.PostgresError:
                # Searched with the older counts (or counting itself) until the next round.
                log.exception("counting the words of agent %s failed", agent[1])
    for agent in keep + new:
        if agent in ready:
            if agent in new:
                try:
                    await _list(conn, *agent)
                    counted.append(agent)
                except asyncpg.PostgresError:
                    log.exception("listing agent %s failed", agent[1])
                    failed.append(agent[1])
            continue
        log.info("building search indexes for agent %s (%d records)", agent[1], sizes[agent])
        try:
            made, replaced = await _build(conn, *agent, states)
            built += made
            dropped += replaced
            counted.append(agent)
        except asyncpg.PostgresError:
            # Left invalid or half built: the next round drops what it left and retries.
            log.exception("building search indexes for agent %s failed", agent[1])
            failed.append(agent[1])
    if traded is not None and new[-1] in counted:  # the newcomer is built and listed
        await conn.execute(
            "DELETE FROM agent_indexes WHERE account_id = $1 AND action_id = $2", *traded
        )
        present = await _agent_index_states(conn)
        dropped += await _drop_indexes(conn, [n for n in index_names(*traded) if n in present])
    return len(counted), built, dropped, failed


async def _drop_indexes(conn: asyncpg.Connection, names: Sequence[str]) -> list[str]:
    """Drops the indexes and returns them; one that fails to drop is logged and left to the
    next round (whose listed agents do not own it)."""
    dropped = []
    for name in names:
        try:
            await _drop_index(conn, name)
            dropped.append(name)
        except asyncpg.PostgresError:
            # Unlisted, so the next round tries again; the builds go on.
            log.exception("dropping search index %s failed", name)
    return dropped


async def count_sessions(conn: asyncpg.Connection) -> int:
    """Counts the words of every listed agent's sessions of SESSION_WORDS_MIN live records or
    more (`count_session_words`, migration 0020), again as `_recount` says, and drops the
    counts of a session now under half that. Returns how many sessions were counted; a failed
    count is logged and retried next round."""
    rows = await conn.fetch(
        "SELECT m.account_id, m.action_id, m.session_id, "
        f"count(*) FILTER (WHERE {visibility.counted()}) AS counted, "
        f"count(*) FILTER (WHERE {visibility.gone()}) AS gone "
        "FROM agent_indexes a JOIN agent_memories m ON m.account_id = a.account_id "
        "AND m.action_id = a.action_id AND m.scope = 'SESSION' "
        "GROUP BY 1, 2, 3 HAVING count(*) >= $1",
        SESSION_WORDS_MIN // 2,
    )
    # Now, and when its words were counted: the session's live records, and its rows deleted
    # or replaced.
    now = {
        (r["account_id"], r["action_id"], r["session_id"]): (r["counted"], r["gone"]) for r in rows
    }
    then = {
        (r["account_id"], r["action_id"], r["session_id"]): (r["counted"], r["gone"])
        for r in await conn.fetch("SELECT * FROM session_counts")
    }
    kept = {
        key
        for key, (counted, _) in now.items()
        if counted >= (SESSION_WORDS_MIN if key not in then else SESSION_WORDS_MIN // 2)
    }
    gone = [key for key in then if key not in kept]
    if gone:
        accounts, actions, sessions = (list(column) for column in zip(*gone, strict=True))
        for table in ("session_counts", "session_words"):
            await conn.execute(
                f"DELETE FROM {table} t USING unnest($1::uuid[], $2::uuid[], $3::text[]) "
                "AS d(account, action, session) WHERE t.account_id = d.account "
                "AND t.action_id = d.action AND t.session_id = d.session",
                accounts,
                actions,
                sessions,
            )
    counted = 0
    for key in sorted(kept):
        if key in then and not _recount(now[key], then[key]):
            continue
        try:
            await conn.fetchval("SELECT count_session_words($1, $2, $3)", *key)
            counted += 1
        except asyncpg.PostgresError:
            log.exception("counting the words of session %s of agent %s failed", key[2], key[1])
    return counted


def _counts(row: asyncpg.Record, prefix: str = "") -> tuple[int | None, ...]:
    """An agent's live records counted in agent scope and in every scope, and its rows
    deleted or replaced: now (`index_agents`' tally) or when its words were counted
    (`agent_indexes`, prefix `words_`)."""
    return tuple(row[f"{prefix}{name}"] for name in ("counted", "counted_any", "gone"))


def _recount(now: tuple[int | None, ...], then: tuple[int | None, ...]) -> bool:
    """Whether a listed agent's words are counted again: never counted, a record deleted or
    replaced since (its words must not outlive it by more than a round), or the records
    counted in either scope changed by WORDS_RECOUNT."""
    if None in then:
        return True
    # Counts (`now`'s are count(*)s; `then`'s, none None as just checked).
    *counts, gone = cast(tuple[int, ...], now)
    *were, was_gone = cast(tuple[int, ...], then)
    return gone != was_gone or any(
        c < was or c - was > WORDS_RECOUNT * was for c, was in zip(counts, were, strict=True)
    )


async def agent_records(conn: asyncpg.Connection, key: AgentKey, limit: int) -> int | None:
    """The agent's records, counted up to `limit`; None when it is listed (has its own
    indexes)."""
    return await conn.fetchval(
        """
        SELECT CASE WHEN EXISTS (
            SELECT FROM agent_indexes WHERE account_id = $1 AND action_id = $2) THEN NULL
        ELSE (SELECT count(*) FROM (
            SELECT FROM agent_memories WHERE account_id = $1 AND action_id = $2 LIMIT $3) s) END
        """,
        *key,
        limit,
    )


async def index_agent(conn: asyncpg.Connection, key: AgentKey, max_agents: int | None) -> list[str]:
    """Builds the agent's own indexes and lists it, unless it is listed or `max_agents` agents
    are (then it is searched by scoring every record until a round finds it a place); under
    the round's lock, outside any transaction. Returns the indexes built."""
    listed, mine = await conn.fetchrow(
        "SELECT count(*), count(*) FILTER (WHERE account_id = $1 AND action_id = $2) "
        "FROM agent_indexes",
        *key,
    )
    if mine or (max_agents is not None and listed >= max_agents):
        return []
    log.info("building search indexes for agent %s", key[1])
    built, _ = await _build(conn, *key, await _agent_index_states(conn))
    return built


MAX_KEYS = 100_000  # IndexBuilds: agents and sessions remembered between rounds, at most


class IndexBuilds:
    """Builds an agent's own indexes, or a session's, soon after a write of this process
    takes it past its threshold, rather than at the next round (up to
    `search_maintenance_seconds` later, meanwhile searched by scoring every record).

    `wrote` is called after a commit, never inside it: it only counts, and when the key may
    have crossed, starts a task (one per key at a time) that counts its rows up to the
    threshold and, past it, builds under the round's lock (one builder in the database at a
    time; while another process holds it, the task tries again every `retry_seconds`). A key
    found with its own indexes, or beyond the cap, is left alone until the next round
    (`forget`; without rounds, for the life of the process), which keeps or takes them as it
    does for any other. Writes of other processes
    are not counted here; their own process, or the next round, sees them."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        min_records: int,
        max_agents: int | None,
        min_parts: int | None,
        max_sessions: int | None,
        build_memory: str = "",
        retry_seconds: float = 5.0,
    ) -> None:
        self._pool = pool
        self._thresholds = {2: min_records, 3: min_parts}  # by the key's length
        self._caps = {2: max_agents, 3: max_sessions}
        self._build_memory = build_memory
        self._retry = retry_seconds
        self._counted: dict[Key, int] = {}  # rows at the last count, and written since
        # Has its own indexes, is beyond the cap, or its build failed: left to the rounds.
        self._settled: set[Key] = set()
        self._tasks: dict[Key, asyncio.Task[None]] = {}

    def wrote(self, key: Key, rows: int) -> None:
        """`rows` were committed for the agent (account, action) or the session (account,
        action, session)."""
        threshold = self._thresholds[len(key)]
        if threshold is None or key in self._settled or key in self._tasks:
            return
        if len(self._counted) + len(self._settled) >= MAX_KEYS:
            self.forget()  # bounded: a key forgotten is counted again at its next write
        if key in self._counted:
            self._counted[key] += rows
            if self._counted[key] < threshold:
                return
        # Upkeep, not the writer's own work: its connections are not drawn on the account's share.
        with drawing_on(None):
            task = asyncio.create_task(self._check(key, threshold), name=f"engram index {key}")
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _check(self, key: Key, threshold: int) -> None:
        waiting = False
        try:
            while True:
                async with self._pool.acquire() as conn:
                    if len(key) == 2:
                        count = await agent_records(conn, key, threshold)
                    else:
                        count = await history_indexes.session_parts(conn, key, threshold)
                    if count is not None and count < threshold:
                        self._counted[key] = count
                        return
                    if count is None or await self._build(conn, key, threshold):
                        self._settled.add(key)
                        self._counted.pop(key, None)
                        return
                if not waiting:  # said once: `engram import` would otherwise wait silently
                    waiting = True
                    log.info(
                        "search indexes for %s wait: another process is running search "
                        "maintenance (a round or a build); trying again every %g s (if this "
                        "process stops first, the next maintenance round builds them)",
                        "/".join(map(str, key)),
                        self._retry,
                    )
                await asyncio.sleep(self._retry)  # another process holds the lock
        except Exception:
            # Not retried at each write (a build that keeps failing would hold the rounds'
            # lock back to back): the next round retries it, and forgets this.
            self._counted.pop(key, None)
            self._settled.add(key)
            log.exception("building search indexes for %s failed", "/".join(map(str, key)))

    async def _build(self, conn: asyncpg.Connection, key: Key, threshold: int) -> bool:
        """Builds under the round's lock; False when another process holds it."""
        session_changed(conn)  # a session lock, and maintenance_work_mem
        if not await conn.fetchval(f"SELECT pg_try_advisory_lock({ROUND_LOCK})"):
            return False
        try:
            await lift_bounds(conn)  # a build takes minutes, and waits for older transactions
            if self._build_memory:
                await conn.execute(
                    "SELECT set_config('maintenance_work_mem', $1, false)", self._build_memory
                )
            cap = self._caps[len(key)]
            if len(key) == 2:
                await index_agent(conn, key, cap)
            else:
                await history_indexes.index_session(
                    conn, key, min_parts=threshold, max_sessions=cap
                )
            return True
        finally:
            await _unlock(conn)

    async def settle(self) -> None:
        """Waits for the checks and builds in flight (a command that wrote, before it ends)."""
        await asyncio.gather(*self._tasks.values())

    def forget(self) -> None:
        """Counts every key afresh (after a round, which may have taken or given indexes)."""
        self._counted.clear()
        self._settled.clear()

    async def aclose(self) -> None:
        """Cancels the builds in flight (CREATE INDEX CONCURRENTLY leaves an invalid index,
        which the next build or round replaces) and waits until they have ended."""
        for task in list(self._tasks.values()):
            await tasks.stop(task)


# The builds of each running service, by its pool: writes reach them through `wrote`.
_BUILDS: dict[asyncpg.Pool, IndexBuilds] = {}


def wrote(pool: asyncpg.Pool, key: Key, rows: int) -> None:
    """Tells the service's IndexBuilds that a commit on `pool` added `rows` rows to the agent
    (account_id, action_id) or the session (account_id, action_id, session_id); without a
    service running on that pool (a command), nothing."""
    builds = _BUILDS.get(pool)
    if builds is not None and rows > 0:
        builds.wrote(key, rows)


async def _unlock(conn: asyncpg.Connection) -> None:
    """Lets the round's lock go. A connection the server ended took it with its session: the
    error that ended it, not this call's ("released back to the pool"), is the one to say."""
    with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
        await conn.execute(f"SELECT pg_advisory_unlock({ROUND_LOCK})")


async def _hold_round(conn: asyncpg.Connection, doing: str) -> None:
    """Takes the round's lock for the connection's session, once no round or build holds it;
    says once that `doing` waits. Asked for again every HOLD_RETRY_SECONDS, never waited for
    in a statement: a waiting statement holds a snapshot, which the build's CREATE INDEX
    CONCURRENTLY waits out while its round holds the lock (deadlock, one of them undone)."""
    session_changed(conn)
    waiting = False
    while not await conn.fetchval(f"SELECT pg_try_advisory_lock({ROUND_LOCK})"):
        if not waiting:
            waiting = True
            log.info(
                "%s waits for the search maintenance in flight (a round or an index build, "
                "maybe of another process); trying again every %g s",
                doing,
                HOLD_RETRY_SECONDS,
            )
        await asyncio.sleep(HOLD_RETRY_SECONDS)


@contextlib.asynccontextmanager
async def holding_round(conn: asyncpg.Connection, doing: str) -> AsyncIterator[None]:
    """Holds the round's lock for the connection's session while the block runs, taken once
    no round or build holds it (`_hold_round`): outside any transaction."""
    await _hold_round(conn, doing)
    try:
        yield
    finally:
        await _unlock(conn)


def dropping_agent_indexes(
    conn: asyncpg.Connection, doing: str
) -> contextlib.AbstractAsyncContextManager[None]:
    """The round's lock, held around the transaction that calls `drop_agent_indexes` (or may:
    a resumed `engram reembed` drops none); `doing`, what waits for it, if it waits."""
    return holding_round(conn, doing)


async def reorder(conn: asyncpg.Connection) -> None:
    """Rewrites agent_memories in agent order, so that an agent's records share pages (the
    exact plan reads a quarter of them, bench/README.md). Holds the table's lock while it
    runs: memory reads and writes wait. Outside a transaction (VACUUM sets all-visible).

    Waits first for a round or an index build in flight, and holds the round's lock until it
    is done (`holding_round`): the table's lock, asked for during CREATE INDEX CONCURRENTLY, is
    granted only once the build has ended, and every read and write of memory queues behind
    it meanwhile (minutes for a large agent).

    CLUSTER builds every index again with its options: agents' HNSW indexes are set back to
    the build's ef_construction for it, and lowered again after (as `hnsw.lower` does), in its
    transaction. The table is locked first, as CLUSTER alone did: a statement on it locks the
    table, then its indexes, and an index locked before the table deadlocks with one that comes
    between."""
    async with holding_round(conn, "reordering the memory records"):
        async with conn.transaction():
            await conn.execute("LOCK TABLE agent_memories IN ACCESS EXCLUSIVE MODE")
            states = await _agent_index_states(conn)
            names = [name for name in states if name.startswith(_PREFIXES[0])]
            for name in names:
                await hnsw.set_ef_construction(conn, name, OPTIONS[0]["ef_construction"])
            await conn.execute("CLUSTER agent_memories USING agent_memories_created")
            for name in names:
                await hnsw.note_built(conn, name)
                await hnsw.set_ef_construction(conn, name, hnsw.INSERT_EF_CONSTRUCTION)
        await conn.execute("VACUUM (ANALYZE) agent_memories")


async def _record_round(conn: asyncpg.Connection, *, finished: bool) -> None:
    """Records this process's round in `deployment` (ROUND_KEY), under the round's lock."""
    await conn.execute(
        """
        INSERT INTO deployment (key, value, modified)
        VALUES ($1, jsonb_build_object('process', $2::text, 'started', clock_timestamp(),
                                       'finished', null), clock_timestamp())
        ON CONFLICT (key) DO UPDATE
        SET value = CASE WHEN $3 THEN jsonb_set(deployment.value, '{finished}',
                                                to_jsonb(clock_timestamp()))
                         ELSE excluded.value END,
            modified = excluded.modified
        """,
        ROUND_KEY,
        PROCESS,
        finished,
    )


async def run_round(
    pool: asyncpg.Pool,
    min_records: int,
    build_memory: str = "",
    max_agents: int | None = None,
    min_parts: int | None = None,
    max_sessions: int | None = None,
) -> Round | None:
    """One round of the jobs; None when another process holds the round. `build_memory` is
    the index builds' maintenance_work_mem (an HNSW graph that does not fit in it is built
    far more slowly); empty: the server's. `max_agents`: see `index_agents`. With
    `min_parts`, large sessions' own indexes too (app/history/indexes.py; `max_sessions`)."""
    async with pool.acquire() as conn:
        session_changed(conn)  # a session lock, and maintenance_work_mem
        if not await conn.fetchval(f"SELECT pg_try_advisory_lock({ROUND_LOCK})"):
            return None
        try:
            # Builds take minutes and wait for older transactions; counts read whole agents.
            await lift_bounds(conn)
            await _record_round(conn, finished=False)
            if build_memory:
                # Session-wide for this connection; the pool resets it on release.
                await conn.execute(
                    "SELECT set_config('maintenance_work_mem', $1, false)", build_memory
                )
            done = Round(*await index_agents(conn, min_records, max_agents))
            try:
                done = replace(done, sessions=await count_sessions(conn))
            except asyncpg.PostgresError:
                # The sessions' turns count their words as they search until the next round.
                log.exception("counting the words of large sessions failed")
            if min_parts is not None:
                built, dropped, _ = await history_indexes.index_sessions(
                    conn, min_parts, max_sessions
                )
                done.built.extend(built)
                done.dropped.extend(dropped)
            await _record_round(conn, finished=True)
            return done
        finally:
            await _unlock(conn)


class SearchMaintenance:
    """With an interval, runs a round at once and every `interval` seconds until closed
    (AppState.services[SEARCH_MAINTENANCE])."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        interval: float,
        min_records: int,
        build_memory: str = "",
        max_agents: int | None = None,
        min_parts: int | None = None,
        max_sessions: int | None = None,
    ) -> None:
        self._pool = pool
        self._min_parts = min_parts
        self._max_sessions = max_sessions
        self._interval = interval
        self._min_records = min_records
        self._build_memory = build_memory
        self._max_agents = max_agents
        self._task: asyncio.Task[None] | None = None
        self.rounds = Rounds()
        self.builds = IndexBuilds(
            pool,
            min_records=min_records,
            max_agents=max_agents,
            min_parts=min_parts,
            max_sessions=max_sessions,
            build_memory=build_memory,
        )

    async def start(self) -> None:
        _BUILDS[self._pool] = self.builds
        if self._interval > 0:
            self._task = asyncio.create_task(self._loop(), name="engram search maintenance")

    async def _loop(self) -> None:
        while True:
            outcome = "failed"
            try:
                done = await run_round(
                    self._pool,
                    self._min_records,
                    self._build_memory,
                    self._max_agents,
                    min_parts=self._min_parts,
                    max_sessions=self._max_sessions,
                )
                outcome = "skipped" if done is None else "done"
                if done is not None and (done.built or done.dropped):
                    log.info("search maintenance: built %s, dropped %s", done.built, done.dropped)
            except Exception:
                # Search goes on without it (older word counts, the shared index).
                log.exception("search maintenance failed; next round in %s s", self._interval)
            self.rounds.count(outcome)
            self.builds.forget()
            await asyncio.sleep(self._interval)

    async def aclose(self) -> None:
        if _BUILDS.get(self._pool) is self.builds:
            del _BUILDS[self._pool]
        await tasks.stop(self._task)
        self._task = None
        await self.builds.aclose()


SEARCH_MAINTENANCE: ServiceKey[SearchMaintenance] = ServiceKey("search_maintenance")
