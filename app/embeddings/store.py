"""SQL for the deployment's embedding model, the vector columns it fixes, and re-embedding
(and the service processes a run refuses to overlap: `live_processes`).

It knows no table of records: the owners of the rows describe their vector columns
(app/memory/vectors.py) and pass them in."""

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
from pgvector import Vector

from app.db.pool import session_changed


@dataclass(frozen=True)
class VectorTable:
    """A table with an `embedding` column, indexed by HNSW as `<name>_embedding` if `indexed`."""

    name: str  # reaches the SQL below as an identifier: a constant, never input
    key: tuple[str, ...]  # its primary key, which orders re-embedding batches
    key_types: tuple[str, ...]  # the SQL type of each key column
    columns: tuple[str, ...]  # the columns its embedded text is built from
    text: Callable[..., str]  # builds the embedded text from those columns, in order
    # False: the table's owner indexes its vectors itself (its VectorTable says why).
    indexed: bool = True


@dataclass(frozen=True)
class VectorColumns:
    """Every vector column of the deployment, and what else a new dimension makes stale."""

    tables: tuple[VectorTable, ...]
    # Drops, inside the caller's transaction, the other indexes over these columns (their
    # owners rebuild them later).
    drop_indexes: Callable[[asyncpg.Connection], Awaitable[None]]
    # Held around that transaction, entered before it: keeps their owners from building them
    # meanwhile, once no build is in flight (waiting for one inside the transaction deadlocks
    # with it). Its second argument says what waits, if it waits (`DROPPING_INDEXES`).
    hold_indexes: Callable[[asyncpg.Connection, str], AbstractAsyncContextManager[None]]


# What waits for a build in flight, said by `VectorColumns.hold_indexes` if it waits.
DROPPING_INDEXES = "dropping the search indexes for new embedding dimensions"


_LOCK = "hashtext('engram.embedding')"


# Deployment keys holding a model as {"name", "dimensions"}.
_MODEL = "embedding"
_REEMBED_TARGET = "embedding.reembed"


async def _read_model(conn: asyncpg.Connection, key: str) -> dict[str, Any] | None:
    return await conn.fetchval("SELECT value FROM deployment WHERE key = $1", key)


async def _write_model(conn: asyncpg.Connection, key: str, name: str, dimensions: int) -> None:
    await conn.execute(
        """
        INSERT INTO deployment (key, value) VALUES ($1, $2)
        ON CONFLICT (key) DO UPDATE SET value = excluded.value, modified = now()
        """,
        key,
        {"name": name, "dimensions": dimensions},
    )


async def recorded_model(conn: asyncpg.Connection) -> dict[str, Any] | None:
    return await _read_model(conn, _MODEL)


async def record_model(conn: asyncpg.Connection, name: str, dimensions: int) -> None:
    await _write_model(conn, _MODEL, name, dimensions)


async def lock_model_xact(conn: asyncpg.Connection) -> None:
    """Serializes changes to the recorded model until the transaction ends. A service's start
    waits past the pool's bounds (app/db/pool.py `bounds`) for an `engram reembed` holding it,
    as before there were bounds: it is no request."""
    await conn.execute(
        "SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0; "
        f"SELECT pg_advisory_xact_lock({_LOCK})"
    )


async def try_lock_model(conn: asyncpg.Connection) -> bool:
    """Holds the same lock for the connection's session: a re-embed spans many transactions."""
    session_changed(conn)
    return bool(await conn.fetchval(f"SELECT pg_try_advisory_lock({_LOCK})"))


async def unlock_model(conn: asyncpg.Connection) -> None:
    await conn.execute(f"SELECT pg_advisory_unlock({_LOCK})")


async def reembed_target(conn: asyncpg.Connection) -> dict[str, Any] | None:
    """The model an unfinished `engram reembed` was moving to, if one was interrupted."""
    return await _read_model(conn, _REEMBED_TARGET)


async def set_reembed_target(conn: asyncpg.Connection, name: str, dimensions: int) -> None:
    await _write_model(conn, _REEMBED_TARGET, name, dimensions)


async def clear_reembed_target(conn: asyncpg.Connection) -> None:
    await conn.execute("DELETE FROM deployment WHERE key = $1", _REEMBED_TARGET)


async def live_processes(conn: asyncpg.Connection, lease_seconds: float) -> list[asyncpg.Record]:
    """The service processes that beat within their lease (`lease_seconds` for one of a release
    that recorded none), the latest first: their host, pid and the age of their beat."""
    return await conn.fetch(
        """
        SELECT host, pid, extract(epoch FROM now() - heartbeat) AS age
        FROM service_processes
        WHERE heartbeat >= now() - make_interval(secs => coalesce(lease_seconds, $1))
        ORDER BY heartbeat DESC
        """,
        lease_seconds,
    )


def _check(dimensions: int) -> None:
    if not isinstance(dimensions, int) or not 1 <= dimensions <= 16_000:
        raise ValueError(f"bad embedding dimensions {dimensions!r}")


async def reset_vectors(conn: asyncpg.Connection, dimensions: int, vectors: VectorColumns) -> None:
    """Drops every stored vector and its indexes, and fixes the columns to `dimensions`; in a
    transaction entered within `vectors.hold_indexes`."""
    _check(dimensions)
    await vectors.drop_indexes(conn)
    for table in vectors.tables:
        await conn.execute(f"DROP INDEX IF EXISTS {table.name}_embedding")
        # A new type brings its own storage: MAIN again keeps the vector in its row (0005).
        await conn.execute(
            f"ALTER TABLE {table.name} ALTER COLUMN embedding TYPE vector({dimensions}) USING NULL,"
            " ALTER COLUMN embedding SET STORAGE MAIN"
        )


async def build_indexes(conn: asyncpg.Connection, vectors: VectorColumns) -> None:
    for table in (t for t in vectors.tables if t.indexed):
        await conn.execute(
            f"CREATE INDEX IF NOT EXISTS {table.name}_embedding ON {table.name} "
            "USING hnsw (embedding vector_cosine_ops)"
        )


async def set_dimensions(conn: asyncpg.Connection, dimensions: int, vectors: VectorColumns) -> None:
    """Fixes every vector column to `dimensions` (dropping stored vectors) and indexes it."""
    await reset_vectors(conn, dimensions, vectors)
    await build_indexes(conn, vectors)


async def count_unembedded(conn: asyncpg.Connection, table: VectorTable) -> int:
    return await conn.fetchval(f"SELECT count(*) FROM {table.name} WHERE embedding IS NULL")


def _key_list(table: VectorTable) -> str:
    return ", ".join(table.key)


async def unembedded_batch(
    conn: asyncpg.Connection, table: VectorTable, after: Sequence[Any] | None, limit: int
) -> list[asyncpg.Record]:
    """The next rows without a vector, in key order after the key `after`."""
    keys = _key_list(table)
    columns = ", ".join(table.key + table.columns)
    if after is None:
        return await conn.fetch(
            f"SELECT {columns} FROM {table.name} WHERE embedding IS NULL ORDER BY {keys} LIMIT $1",
            limit,
        )
    after_params = ", ".join(f"${i + 2}" for i in range(len(table.key)))
    return await conn.fetch(
        f"SELECT {columns} FROM {table.name} "
        f"WHERE embedding IS NULL AND ({keys}) > ({after_params}) ORDER BY {keys} LIMIT $1",
        limit,
        *after,
    )


async def write_vectors(
    conn: asyncpg.Connection,
    table: VectorTable,
    keys: Sequence[Sequence[Any]],
    vectors: np.ndarray,
) -> None:
    """Stores each row's vector in one statement; a row that got one meanwhile keeps it."""
    n = len(table.key)
    arrays = ", ".join(f"${i + 1}::{kind}[]" for i, kind in enumerate(table.key_types))
    match = " AND ".join(f"t.{column} = v.{column}" for column in table.key)
    await conn.execute(
        f"UPDATE {table.name} AS t SET embedding = v.embedding "
        f"FROM unnest({arrays}, ${n + 1}::vector[]) AS v({_key_list(table)}, embedding) "
        f"WHERE {match} AND t.embedding IS NULL",
        *([key[i] for key in keys] for i in range(n)),
        # Wrapped, or asyncpg would read each ndarray as a nested array of floats.
        [Vector(vector) for vector in vectors],
    )
