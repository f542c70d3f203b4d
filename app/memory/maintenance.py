"""Search upkeep: word frequencies for the index plan, and search indexes of large agents.

Two jobs, run when the service starts and then every `search_maintenance_seconds`, by one
process at a time (a session advisory lock; other processes skip the round):

- `refresh_search_words()` (migration 0005) copies ANALYZE's word frequencies into
  `search_words`, where the index plan looks up which query words are rare or common.
- Agents with at least `agent_index_min_records` records get an HNSW and a GIN index of their
  own, partial indexes on `(account_id, action_id)`, built with CREATE INDEX CONCURRENTLY
  (writes go on meanwhile; each build reads the whole table once). The shared HNSW index
  serves a filtered search by reading past other agents' rows: in a 1,230,000-record table it
  found 0.92 of a 200,000-record agent's exact top-10, and 0.88 of a 5,000-record agent's in
  130 ms; an agent's own index found 0.97 at 200,000 records (vector search p50 9 ms) and 0.99
  at 25,000 (7 ms), see bench/README.md. The planner picks a partial index by
  itself once it sees the agent's key as constants, which the index plan's custom plans give
  it (search_store.prepare); `agent_indexes` tells the plan choice that the agent has them.
  An agent under half the threshold (deleted records, a deleted agent) loses its indexes, so
  there are at most 2 x 2 x records / threshold of them; an index of this naming that no
  agent keeps (an interrupted build) is dropped by the next round.

`engram maintain-search` runs one round by hand (e.g. after a bulk import).
"""

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from uuid import UUID

import asyncpg

log = logging.getLogger(__name__)

# Also taken by app/embeddings/store.py reset_vectors, which drops these indexes.
_LOCK = "hashtext('engram.search_maintenance')"
# Storage options of an agent's HNSW and GIN indexes. Measured at 200,000 records
# (bench/README.md), recall of the exact top-10 at hnsw.ef_search 60 (the search's): 0.95
# with ef_construction 128, 0.97 with 256 (build about twice as long); pgvector's default of 64
# gave 0.93 at ef_search 100. An index built with other options is rebuilt by the next round.
OPTIONS = ({"m": "16", "ef_construction": "256"}, {"fastupdate": "off"})
_PREFIXES = ("agent_memories_vectors_", "agent_memories_words_")


@dataclass(frozen=True)
class Round:
    """What one maintenance round did."""

    words: int  # lexemes with a frequency in search_words
    built: list[str]  # agent indexes created
    dropped: list[str]  # agent indexes removed
    failed: list[UUID]  # agents whose build failed (logged)


def index_names(account_id: UUID, action_id: UUID) -> tuple[str, str]:
    """The agent's HNSW and GIN indexes: a prefix and a digest of its key (PostgreSQL's names
    are at most 63 bytes)."""
    digest = hashlib.md5(f"{account_id}/{action_id}".encode()).hexdigest()
    return f"{_PREFIXES[0]}{digest}", f"{_PREFIXES[1]}{digest}"


async def refresh_words(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT refresh_search_words()")


async def _agent_index_states(conn: asyncpg.Connection) -> dict[str, bool]:
    """Every index of agent_memories named like an agent's, and whether it is current: it
    answers queries (an index left invalid by an interrupted build does not, but is still
    written to) and was built with today's OPTIONS."""
    rows = await conn.fetch(
        "SELECT c.relname, i.indisvalid, coalesce(c.reloptions, '{}') AS options "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = 'agent_memories'::regclass "
        "AND (c.relname LIKE $1 || '%' OR c.relname LIKE $2 || '%')",
        *(prefix.replace("_", "\\_") for prefix in _PREFIXES),
    )
    wanted = [sorted(f"{k}={v}" for k, v in options.items()) for options in OPTIONS]
    return {
        r["relname"]: r["indisvalid"]
        and sorted(r["options"]) == wanted[0 if r["relname"].startswith(_PREFIXES[0]) else 1]
        for r in rows
    }


async def _drop_index(conn: asyncpg.Connection, name: str) -> None:
    quoted = await conn.fetchval("SELECT quote_ident($1)", name)
    await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quoted}")


async def _build(conn: asyncpg.Connection, account_id: UUID, action_id: UUID) -> list[str]:
    vectors, words = index_names(account_id, action_id)
    # UUIDs printed by Python: hex digits and dashes. A predicate cannot take parameters.
    agent = f"account_id = '{UUID(str(account_id))}' AND action_id = '{UUID(str(action_id))}'"
    hnsw, gin = (", ".join(f"{k} = {v}" for k, v in options.items()) for options in OPTIONS)
    methods = {
        vectors: f"hnsw (embedding vector_cosine_ops) WITH ({hnsw})",
        words: f"gin (tsv) WITH ({gin})",
    }
    for name, method in methods.items():
        await conn.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON agent_memories "
            f"USING {method} WHERE {agent}"
        )
    await conn.execute(
        "INSERT INTO agent_indexes (account_id, action_id, vectors_index, words_index) "
        "VALUES ($1, $2, $3, $4) ON CONFLICT (account_id, action_id) DO NOTHING",
        account_id,
        action_id,
        vectors,
        words,
    )
    return [vectors, words]


async def index_agents(
    conn: asyncpg.Connection, min_records: int
) -> tuple[list[str], list[str], list[UUID]]:
    """Gives every agent of `min_records` or more its own HNSW and GIN indexes; drops those of
    agents now under half that, and any of their naming that no agent keeps. Outside any
    transaction (CREATE INDEX CONCURRENTLY). One agent's failed build does not stop the
    others'; it is retried next round. Returns the indexes built and dropped, and the agents
    whose build failed."""
    sizes = {
        (r["account_id"], r["action_id"]): r["records"]
        for r in await conn.fetch(
            "SELECT account_id, action_id, count(*) AS records FROM agent_memories "
            "GROUP BY account_id, action_id HAVING count(*) >= $1",
            (min_records + 1) // 2,
        )
    }
    states = await _agent_index_states(conn)
    listed = [
        (r["account_id"], r["action_id"])
        for r in await conn.fetch("SELECT account_id, action_id FROM agent_indexes")
    ]
    # An agent keeps its indexes while it is large enough and both are current.
    kept = {
        agent
        for agent in listed
        if agent in sizes and all(states.get(name) for name in index_names(*agent))
    }
    stale = sorted(set(listed) - kept)
    await conn.execute(
        "DELETE FROM agent_indexes a USING unnest($1::uuid[], $2::uuid[]) AS d(account, action) "
        "WHERE a.account_id = d.account AND a.action_id = d.action",
        [account for account, _ in stale],
        [action for _, action in stale],
    )
    keep = {name for agent in kept for name in index_names(*agent)}
    dropped: list[str] = []
    for name in sorted(set(states) - keep):
        try:
            await _drop_index(conn, name)
            dropped.append(name)
        except asyncpg.PostgresError:
            # Unlisted already, so the next round tries again; the builds go on.
            log.exception("dropping search index %s failed", name)
    built: list[str] = []
    failed: list[UUID] = []
    for agent, records in sorted(sizes.items(), key=lambda s: -s[1]):
        if records >= min_records and agent not in kept:
            log.info("building search indexes for agent %s (%d records)", agent[1], records)
            try:
                built += await _build(conn, *agent)
            except asyncpg.PostgresError:
                # Left invalid or half built: the next round drops what it left and retries.
                log.exception("building search indexes for agent %s failed", agent[1])
                failed.append(agent[1])
    return built, dropped, failed


async def run_round(pool: asyncpg.Pool, min_records: int, build_memory: str = "") -> Round | None:
    """One round of both jobs; None when another process holds the round. `build_memory` is
    the index builds' maintenance_work_mem (an HNSW graph that does not fit in it is built
    far more slowly); empty: the server's."""
    async with pool.acquire() as conn:
        if not await conn.fetchval(f"SELECT pg_try_advisory_lock({_LOCK})"):
            return None
        try:
            words = await refresh_words(conn)
            if build_memory:
                # Session-wide for this connection; the pool resets it on release.
                await conn.execute(
                    "SELECT set_config('maintenance_work_mem', $1, false)", build_memory
                )
            return Round(words, *await index_agents(conn, min_records))
        finally:
            await conn.execute(f"SELECT pg_advisory_unlock({_LOCK})")


class SearchMaintenance:
    """Refreshes word frequencies at start; then, with an interval, runs a round at once and
    every `interval` seconds until closed (AppState.services)."""

    def __init__(
        self, pool: asyncpg.Pool, *, interval: float, min_records: int, build_memory: str = ""
    ) -> None:
        self._pool = pool
        self._interval = interval
        self._min_records = min_records
        self._build_memory = build_memory
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Cheap, and what lexical search at scale relies on even with no background rounds.
        async with self._pool.acquire() as conn:
            await refresh_words(conn)
        if self._interval > 0:
            self._task = asyncio.create_task(self._loop(), name="engram search maintenance")

    async def _loop(self) -> None:
        while True:
            try:
                done = await run_round(self._pool, self._min_records, self._build_memory)
                if done is not None and (done.built or done.dropped):
                    log.info("search maintenance: built %s, dropped %s", done.built, done.dropped)
            except Exception:
                # Search goes on without it (older word frequencies, the shared index).
                log.exception("search maintenance failed; next round in %s s", self._interval)
            await asyncio.sleep(self._interval)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
