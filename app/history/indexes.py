"""Large sessions' own HNSW indexes on `history_parts`, kept by the search maintenance round
(app/memory/maintenance.py run_round: the same lock, interval and build memory).

The shared HNSW index serves a session's search by reading past other sessions' parts (its
filter), which a large session among many pays for; its own index spares it that
(bench/README.md, `history.py`, has the figures). Sessions of at least
`history_index_min_parts` parts, the largest `history_index_max_sessions` of them, get a
partial index on their key, built with CREATE INDEX CONCURRENTLY (writes go on meanwhile;
each build reads the whole table once); one under half the threshold, or beyond the limit
against larger ones, loses it. Nothing in the search has to know: the index plan writes the
session's key into its SQL as constants (store.SessionKey), so the planner proves the partial
index covers it and prefers it, and a dropped index only makes PostgreSQL plan the statement
again. Every statement that plans a query on history_parts or writes to it locks each of its
indexes, hence the limit (max_locks_per_transaction x connections).

As an agent's own HNSW index (app/db/hnsw.py): built at ef_construction 256, then lowered to
128 for the parts later turns write into it, and built again, beside the old one, once the
session holds twice the parts it was built over (the index's comment).
"""

import hashlib
import logging
from uuid import UUID

import asyncpg

from app.db import hnsw
from app.history.store import text_literal

log = logging.getLogger(__name__)

PREFIX = "history_parts_vectors_"
# An index built with other options is rebuilt by the next round, as an agent's own HNSW index
# is (app/memory/maintenance.py OPTIONS, whose m 12 was measured on memory records only); its
# ef_construction is lowered once built (hnsw.lower).
OPTIONS = {"m": "16", "ef_construction": hnsw.BUILD_EF_CONSTRUCTION}

Key = tuple[UUID, UUID, str]


def index_name(key: Key) -> str:
    """A prefix and a digest of the session's key (PostgreSQL's names are at most 63 bytes)."""
    account_id, action_id, session_id = key
    digest = hashlib.md5(f"{account_id}/{action_id}/{session_id}".encode()).hexdigest()
    return f"{PREFIX}{digest}"


async def _states(conn: asyncpg.Connection) -> dict[str, bool]:
    """Every index of history_parts of this naming, and whether it is current: valid (an
    interrupted build leaves an invalid one, still written to) and built with OPTIONS (its
    ef_construction since lowered or not)."""
    rows = await conn.fetch(
        "SELECT c.relname, i.indisvalid, coalesce(c.reloptions, '{}') AS options "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = 'history_parts'::regclass AND c.relname LIKE $1 || '%'",
        PREFIX.replace("_", "\\_"),
    )
    wanted = hnsw.current(OPTIONS)
    return {r["relname"]: r["indisvalid"] and sorted(r["options"]) in wanted for r in rows}


async def _drop(conn: asyncpg.Connection, name: str, concurrently: bool = True) -> None:
    quoted = await conn.fetchval("SELECT quote_ident($1)", name)
    await conn.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS {quoted}")


async def _drop_each(conn: asyncpg.Connection, names: list[str]) -> list[str]:
    """Drops the indexes one by one; a failure is logged, and the next round tries again.
    Returns those dropped."""
    dropped: list[str] = []
    for name in names:
        try:
            await _drop(conn, name)
        except asyncpg.PostgresError:
            log.exception("dropping session index %s failed", name)
        else:
            dropped.append(name)
    return dropped


async def drop_session_indexes(conn: asyncpg.Connection) -> None:
    """Drops them all, inside the caller's transaction (new embedding dimensions make them
    stale; app/embeddings/store.py reset_vectors, after taking the round's lock)."""
    for name in await _states(conn):
        await _drop(conn, name, concurrently=False)


async def _sizes(conn: asyncpg.Connection, min_parts: int) -> dict[Key, int]:
    """The parts of each session of at least half `min_parts` (one that may keep its index)."""
    return {
        (r["account_id"], r["action_id"], r["session_id"]): r["parts"]
        for r in await conn.fetch(
            "SELECT account_id, action_id, session_id, count(*) AS parts FROM history_parts "
            "GROUP BY account_id, action_id, session_id HAVING count(*) >= $1",
            (min_parts + 1) // 2,
        )
    }


def _holding(sizes: dict[Key, int], states: dict[str, bool]) -> list[Key]:
    """The sessions of `sizes` with an index of their own name, current or not (one built
    again keeps its place), the largest first: those a round keeps, up to its cap. A
    replacement left beside one (NEXT) and the index of a session under half the threshold
    hold no place: the round drops them."""
    largest = sorted(sizes, key=lambda key: (-sizes[key], key))
    return [key for key in largest if index_name(key) in states]


async def index_sessions(
    conn: asyncpg.Connection, min_parts: int, max_sessions: int | None
) -> tuple[list[str], list[str], list[str]]:
    """Gives the largest sessions of `min_parts` parts or more their own HNSW index, no more
    than `max_sessions` (None: no limit), and takes it from sessions now under half that or
    beyond the limit. A session keeps its index against a larger one that has none (a build
    reads the whole table, so they are not traded back and forth). A kept index still at the
    build's ef_construction is lowered (hnsw.lower); one whose session has grown to
    hnsw.REBUILD_GROWTH times the parts it was built over is built again, beside it. Outside
    any transaction; one failed build does not stop the others and is retried next round.
    Returns the indexes built, dropped (an index built again is both), and the sessions whose
    build failed."""
    sizes = await _sizes(conn, min_parts)
    states = await _states(conn)
    places = len(sizes) if max_sessions is None else max_sessions
    largest = sorted(sizes, key=lambda key: (-sizes[key], key))
    keep = _holding(sizes, states)[:places]
    new = [key for key in largest if sizes[key] >= min_parts and index_name(key) not in states]
    wanted = keep + new[: places - len(keep)]
    owned = {index_name(key) for key in wanted}
    await hnsw.finish_replacements(conn, states, owned)
    dropped = await _drop_each(conn, sorted(set(states) - owned))
    ready = {index_name(key): sizes[key] for key in wanted if states.get(index_name(key))}
    for name in await hnsw.outgrown(conn, ready):
        states[name] = False  # built again, beside the old one
    await hnsw.lower(conn, [name for name in ready if states[name]])
    built: list[str] = []
    failed: list[str] = []
    for key in wanted:
        name = index_name(key)
        if states.get(name):
            continue
        log.info("building a search index for session %r (%d parts)", key[2], sizes[key])
        try:
            built.append(await _build(conn, key, beside=name in states))
        except asyncpg.PostgresError:
            log.exception("building a search index for session %r failed", key[2])
            failed.append(key[2])
        else:
            if name in states:
                dropped.append(name)  # the one it replaced
    return built, dropped, failed


def _predicate(key: Key) -> str:
    """The session's index's predicate: its key as constants (a predicate cannot take
    parameters), as the index plan's SQL writes it (SessionKey): UUIDs printed by Python, the
    session as a quoted constant."""
    account_id, action_id, session_id = key
    return (
        f"account_id = '{UUID(int=account_id.int)}'::uuid"
        f" AND action_id = '{UUID(int=action_id.int)}'::uuid"
        f" AND session_id = {text_literal(session_id)}"
    )


async def _build(conn: asyncpg.Connection, key: Key, beside: bool) -> str:
    """Builds the session's index at OPTIONS, notes the parts it was built over and lowers
    it; returns its name. `beside`: one of its name is there (other options, invalid, or
    outgrown), and is replaced only once the new one is built, so that the session's searches
    are not left without one. What an interrupted build left under the new one's name is
    dropped first."""
    name = index_name(key)
    target = f"{name}{hnsw.NEXT}" if beside else name
    options = ", ".join(f"{k} = {v}" for k, v in OPTIONS.items())
    where = _predicate(key)
    await _drop(conn, target)
    await conn.execute(
        f"CREATE INDEX CONCURRENTLY {target} ON history_parts"
        f" USING hnsw (embedding vector_cosine_ops) WITH ({options}) WHERE {where}"
    )
    if beside:
        await _drop(conn, name)
        await conn.execute(f"ALTER INDEX {target} RENAME TO {name}")
    parts = await conn.fetchval(
        "SELECT count(*) FROM history_parts "
        "WHERE account_id = $1 AND action_id = $2 AND session_id = $3",
        *key,
    )
    await hnsw.note_built(conn, name, parts)
    await hnsw.lower(conn, [name])
    return name


async def session_parts(conn: asyncpg.Connection, key: Key, limit: int) -> int | None:
    """The session's parts, counted up to `limit`; None when it has its own index (a valid
    one: app/memory/maintenance.py IndexBuilds, which asks after a write)."""
    return await conn.fetchval(
        """
        SELECT CASE WHEN EXISTS (
            SELECT FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
            WHERE c.relname = $4 AND i.indisvalid) THEN NULL
        ELSE (SELECT count(*) FROM (
            SELECT FROM history_parts
            WHERE account_id = $1 AND action_id = $2 AND session_id = $3 LIMIT $5) s) END
        """,
        *key,
        index_name(key),
        limit,
    )


async def index_session(
    conn: asyncpg.Connection, key: Key, *, min_parts: int, max_sessions: int | None
) -> list[str]:
    """Builds the session's own index unless it has one or `max_sessions` other sessions hold
    a place, as a round counts them (`_holding`; then the rounds decide, as for any other);
    under the round's lock, outside any transaction. Returns the index built, if any."""
    states = await _states(conn)
    name = index_name(key)
    if states.get(name):
        return []
    if max_sessions is not None:
        others = set(_holding(await _sizes(conn, min_parts), states)) - {key}
        if len(others) >= max_sessions:
            return []
    log.info("building a search index for session %r", key[2])
    return [await _build(conn, key, beside=name in states)]
