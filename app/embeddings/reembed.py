"""`engram reembed`: moves every stored vector to the configured embedding model.

It drops the old vectors and fixes the columns to the new dimension, then embeds every row
in batches (read a batch, embed it outside any transaction, write it in a short one), builds
the HNSW indexes once all rows have vectors (faster than maintaining them row by row), and
records the new model, after which the service starts. Run it with the service stopped: a
service still serving would search the new vectors with its old model, so a run refuses while
one has a live heartbeat in `service_processes` (app/runtime/liveness.py).

An interrupted run is resumed by running it again with the same model: the model it was
moving to is recorded before any vector is dropped, and only rows still without a vector
are embedded. The service refuses to start while a run is unfinished.
"""

import asyncio
import contextlib
import socket
import sys
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
import psutil
from tqdm import tqdm

from app.config import Settings
from app.embeddings import store
from app.embeddings.base import Embedder
from app.embeddings.setup import check_dimensions


class ReembedBusy(RuntimeError):
    pass


class ServiceRunning(ReembedBusy):
    """A service process serves this database: it would search new vectors with its old model."""


async def _refuse_while_serving(conn: asyncpg.Connection, lease_seconds: float) -> None:
    """Refuses while a service process beat within its lease (its own, as it recorded it; for
    a process of a release that recorded none, `lease_seconds`): the signal the services'
    own sweeps trust. A process of this host that no longer exists is not waited for (a
    killed service's row stays fresh until its lease runs out)."""
    here = socket.gethostname()
    for row in await store.live_processes(conn, lease_seconds):
        if row["host"] == here and not psutil.pid_exists(row["pid"]):
            continue
        raise ServiceRunning(
            f"`engram serve` is running on this database (process {row['pid']} on "
            f"{row['host']}, heartbeat {float(row['age']):.0f} s ago): stop the service first, "
            "then run `engram reembed`"
        )


async def _unlock_model(conn: asyncpg.Connection) -> None:
    # A connection that is gone took its session lock with it.
    with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
        await store.unlock_model(conn)


@dataclass(frozen=True)
class ReembedResult:
    model: str
    dimensions: int
    records: int  # rows embedded by this run
    tokens: int
    resumed: bool  # continued an interrupted run to the same model


async def _reembed_table(
    conn: asyncpg.Connection,
    table: store.VectorTable,
    embedder: Embedder,
    batch_size: int,
    bar: tqdm,
) -> tuple[int, int]:
    """Embeds the table's rows that have no vector; returns (rows, tokens).

    Each batch is embedded while the one before it is written, so the provider and the
    database work at the same time; neither waits inside a transaction for the other.
    """
    records = tokens = 0
    written: tuple[list[tuple[Any, ...]], np.ndarray] | None = None
    after: tuple[Any, ...] | None = None
    while True:
        rows = await store.unembedded_batch(conn, table, after, batch_size)
        texts = [table.text(*(row[c] for c in table.columns)) for row in rows]
        embedding = asyncio.ensure_future(embedder.embed(texts)) if rows else None
        try:
            if written is not None:
                async with conn.transaction():
                    await store.write_vectors(conn, table, *written)
                bar.update(len(written[0]))
            if embedding is None:
                return records, tokens
            embedded = await embedding
        except BaseException:
            if embedding is not None:
                embedding.cancel()
            raise
        keys = [tuple(row[c] for c in table.key) for row in rows]
        written, after = (keys, embedded.vectors), keys[-1]
        records += len(rows)
        tokens += embedded.tokens


_RESUMING = "resuming `engram reembed`, which drops no index,"


async def reembed(
    pool: asyncpg.Pool,
    embedder: Embedder,
    vectors: store.VectorColumns,
    *,
    batch_size: int = 256,
    progress: bool = False,
    lease_seconds: float | None = None,
) -> ReembedResult:
    """`lease_seconds`: how long a silent service process counts as serving (default the
    configured ENGRAM_TURN_LEASE_SECONDS, which the service's heartbeat keeps within)."""
    if batch_size < 1:
        raise ValueError("the re-embedding batch size must be at least 1")
    check_dimensions(embedder)
    target = {"name": embedder.name, "dimensions": embedder.dimensions}
    async with pool.acquire() as conn, contextlib.AsyncExitStack() as held:
        # Only what it says while it waits below (a resumed run drops nothing): whether it
        # resumes is read again under the locks.
        resuming = await store.reembed_target(conn) == target
        doing = _RESUMING if resuming else store.DROPPING_INDEXES
        # What keeps the other indexes from being built while they are dropped, then the
        # embedding lock: in the order a service's first start takes them (ensure_model), or
        # each could wait for the other. The first is held until the vectors are dropped.
        async with vectors.hold_indexes(conn, doing):
            if not await store.try_lock_model(conn):
                raise ReembedBusy(
                    "another `engram reembed` (or a service start) holds this database's "
                    "embedding lock; wait for it to finish and run this again"
                )
            held.push_async_callback(_unlock_model, conn)
            if lease_seconds is None:
                lease_seconds = Settings().turn_lease_seconds
            await _refuse_while_serving(conn, lease_seconds)
            async with conn.transaction():
                resumed = await store.reembed_target(conn) == target
                if not resumed:
                    await store.set_reembed_target(conn, embedder.name, embedder.dimensions)
                    await store.reset_vectors(conn, embedder.dimensions, vectors)
        total = 0
        for table in vectors.tables:
            total += await store.count_unembedded(conn, table)
        records = tokens = 0
        with tqdm(
            total=total,
            unit="record",
            desc=f"re-embedding with {embedder.name}",
            disable=not progress,
            file=sys.stderr,
        ) as bar:
            for table in vectors.tables:
                done, used = await _reembed_table(conn, table, embedder, batch_size, bar)
                records += done
                tokens += used
            if progress:
                bar.set_postfix_str("building vector indexes")
            async with conn.transaction():
                await store.build_indexes(conn, vectors)
                await store.record_model(conn, embedder.name, embedder.dimensions)
                await store.clear_reembed_target(conn)
    return ReembedResult(embedder.name, embedder.dimensions, records, tokens, resumed)
