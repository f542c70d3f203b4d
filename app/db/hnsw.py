"""The own HNSW indexes of large agents (app/memory/maintenance.py) and of large sessions
(app/history/indexes.py): built at BUILD_EF_CONSTRUCTION, then lowered to
INSERT_EF_CONSTRUCTION for the rows written after (`lower`), and built again, beside the old
one, once the agent or session has grown to REBUILD_GROWTH times the rows the index was built
over (its comment, `note_built` and `built_over`). The caller holds the search maintenance
round's lock.
"""

import logging
import re
from collections.abc import Sequence

import asyncpg

log = logging.getLogger(__name__)

# An own HNSW index's ef_construction as built: for recall at the searches' ef_search.
BUILD_EF_CONSTRUCTION = "256"
# Its ef_construction once built (`lower`): pgvector reads it at each insert, and a row written
# into an agent or session with its own index walks that many candidates. An agent's records:
# inserts at 128 run 1.9-2.0x faster than at 256 (scratch, the 25,000-record agent's vectors: 543
# against 272 rows/s), and an index whose every record went in at 128 still finds 0.986 of the
# exact vector top-10 at 25,000 records (ef_search 80) and 0.986 at 200,000 (150), against 0.994
# and 0.993 built at 256; at 64, 0.978 at 25,000 (bench/README.md, fifty-second session). With
# half a graph inserted (the most REBUILD_GROWTH leaves), 200,000 records found 0.9885 at 128,
# 0.978 at 80 and 0.972 at 64, whose inserts ran 1.3-1.9x faster (sixtieth session). A
# session's parts (m 16, ef_search 80): a turn of 3 parts into a 40,000-part session took 24.7
# against 33.3 ms to write (11.8 without its own index), and its search's overlap with the
# exact top-10 was 0.996 with half the parts inserted at 128, 0.9955 with all, against 0.998
# built at 256 (bench/README.md, `history.py`, "Writes into a large session"). No release
# built an index at 128, so one with these options was built at 256 and lowered.
INSERT_EF_CONSTRUCTION = "128"
# An own HNSW index is built again (beside the old one, as for other options) once its agent or
# session holds REBUILD_GROWTH times the rows the index was built over (its comment says how
# many, `note_built`): at most half its graph then went in at INSERT_EF_CONSTRUCTION. A graph
# built wholly at 128 found 0.974-0.988 of an agent's exact vector top-10 at 200,000 records,
# against 0.996-0.998 built at 256 (bench/README.md, fifty-second session). Rebuilds at each
# doubling read the table about as often again as the builds at the sizes reached.
REBUILD_GROWTH = 2
# The comment also names the index's file (pg_class.relfilenode) as the build left it: an index
# that PostgreSQL built again itself since (a restore from pg_dump, REINDEX, VACUUM FULL, a
# CLUSTER other than app/memory/maintenance.py `reorder`'s, a migration that rewrites the table)
# was built wholly at its options' INSERT_EF_CONSTRUCTION, in a new file, and is built again
# beside it.
_BUILT = "engram: built over {} rows in file {}"
# How long lowering waits for its lock (ACCESS EXCLUSIVE on the index once the backend has
# loaded pgvector, which statements on its table queue behind while it waits): past it, the
# round lowers no more (what holds one index's lock, a transaction that read the table, holds
# every one's), and the next round tries again.
LOWER_LOCK_TIMEOUT = "500ms"
NEXT = "_next"  # an own index's replacement, built beside the one it replaces


def spelled(options: dict[str, str]) -> list[str]:
    """Options as pg_class.reloptions holds them, sorted."""
    return sorted(f"{k}={v}" for k, v in options.items())


def current(options: dict[str, str]) -> list[list[str]]:
    """The reloptions (`spelled`) of an own HNSW index built with `options`: as built, and as
    lowered (`lower`)."""
    return [spelled(options), spelled({**options, "ef_construction": INSERT_EF_CONSTRUCTION})]


async def note_built(conn: asyncpg.Connection, name: str, rows: int | None = None) -> None:
    """Writes in the HNSW index's comment how many rows it was built over (`rows`, or the
    index's own count as its build, or CLUSTER, left it) and its file now."""
    said = await conn.fetchrow(
        "SELECT quote_ident(relname) AS quoted, relfilenode, "
        "greatest(reltuples, 0)::bigint AS tuples FROM pg_class WHERE relname = $1",
        name,
    )
    rows = said["tuples"] if rows is None else rows
    # COMMENT takes no parameters; the text is this module's, with integers.
    text = _BUILT.format(int(rows or 0), int(said["relfilenode"]))
    await conn.execute(f"COMMENT ON INDEX {said['quoted']} IS '{text}'")


async def built_over(conn: asyncpg.Connection, names: Sequence[str]) -> dict[str, int | None]:
    """How many rows each HNSW index was built over, by its comment: None without such a
    comment (an index of a release before this one, or one noted as built over no rows), 0
    when PostgreSQL built it again since in another file (`_BUILT`)."""
    rows = await conn.fetch(
        "SELECT relname, relfilenode, obj_description(oid, 'pg_class') AS said FROM pg_class "
        "WHERE relname = ANY($1::text[])",
        list(names),
    )
    over: dict[str, int | None] = {}
    for r in rows:
        match = re.fullmatch(_BUILT.format(r"(\d+)", r"(\d+)"), r["said"] or "")
        if match is None or not int(match[1]):
            over[r["relname"]] = None
        else:
            over[r["relname"]] = int(match[1]) if int(match[2]) == r["relfilenode"] else 0
    return over


async def outgrown(conn: asyncpg.Connection, rows: dict[str, int]) -> set[str]:
    """Of the HNSW indexes named in `rows`, each with its agent's or session's rows now, those
    to build again: grown REBUILD_GROWTH times the rows they were built over, or built again by
    PostgreSQL since (`built_over`). One without such a comment (of a release before this one)
    is noted as built over its rows now (`note_built`)."""
    over = await built_over(conn, list(rows))
    again = set()
    for name, now in rows.items():
        built = over.get(name)
        if built is None:
            await note_built(conn, name, now)
        elif now >= REBUILD_GROWTH * built:  # or 0: PostgreSQL built it again
            again.add(name)
    return again


async def finish_replacements(
    conn: asyncpg.Connection, states: dict[str, bool], owned: set[str]
) -> None:
    """Renames to its own name each replacement (named with NEXT) that a round finished
    building before it stopped after dropping the index it replaces, and says so in `states`
    (an index's name: whether it is current)."""
    for name in sorted(states):
        base = name.removesuffix(NEXT)
        if base != name and base in owned and base not in states and states[name]:
            await conn.execute(f"ALTER INDEX {name} RENAME TO {base}")
            states[base] = states.pop(name)


async def lower(conn: asyncpg.Connection, names: Sequence[str]) -> list[str]:
    """Sets INSERT_EF_CONSTRUCTION on those of the HNSW indexes `names` still at
    BUILD_EF_CONSTRUCTION (built just now, by a release before it, or whose lowering waited too
    long for its lock). Returns the indexes lowered; one whose lock is not had within
    LOWER_LOCK_TIMEOUT (or that fails otherwise) is logged and left to the next round: it
    answers searches all the same."""
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = ANY($1::text[]) AND i.indisvalid AND c.reloptions @> $2::text[]",
        list(names),
        [f"ef_construction={BUILD_EF_CONSTRUCTION}"],
    )
    lowered = []
    if rows:
        # pgvector loaded, so that each ALTER takes the lock pgvector declares for the option
        # (ACCESS EXCLUSIVE) on any connection: on one that has not loaded it, PostgreSQL does
        # not know the option yet when it locks, and takes a weaker lock.
        await conn.execute("SELECT '[1]'::vector")
    for name in sorted(r["relname"] for r in rows):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = '{LOWER_LOCK_TIMEOUT}'")
                await set_ef_construction(conn, name, INSERT_EF_CONSTRUCTION)
            lowered.append(name)
        except asyncpg.LockNotAvailableError:
            # Statements on the table queued behind each wait: one is enough a round.
            log.warning(
                "lowering ef_construction of %s waited too long; the next round tries", name
            )
            break
        except asyncpg.PostgresError:
            log.warning("lowering ef_construction of %s failed; the next round tries again", name)
    return lowered


async def set_ef_construction(conn: asyncpg.Connection, name: str, value: str) -> None:
    quoted = await conn.fetchval("SELECT quote_ident($1)", name)
    await conn.execute(f"ALTER INDEX {quoted} SET (ef_construction = {value})")
