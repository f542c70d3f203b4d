"""`engram reembed`: moves every stored vector to the configured embedding model.

It drops the old vectors and fixes the columns to the new dimension, then embeds every row
in batches (read a batch, embed it outside any transaction, write it in a short one), builds
the HNSW indexes once all rows have vectors (faster than maintaining them row by row), and
records the new model, after which the service starts. Run it with the service stopped.

An interrupted run is resumed by running it again with the same model: the model it was
moving to is recorded before any vector is dropped, and only rows still without a vector
are embedded. The service refuses to start while a run is unfinished.
"""

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
from tqdm import tqdm

from app.embeddings import store
from app.embeddings.base import Embedder


class ReembedBusy(RuntimeError):
    pass


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
    bar: tqdm,  # type: ignore[type-arg]
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


async def reembed(
    pool: asyncpg.Pool,
    embedder: Embedder,
    vectors: store.VectorColumns,
    *,
    batch_size: int = 256,
    progress: bool = False,
) -> ReembedResult:
    if batch_size < 1:
        raise ValueError("the re-embedding batch size must be at least 1")
    target = {"name": embedder.name, "dimensions": embedder.dimensions}
    async with pool.acquire() as conn:
        if not await store.try_lock_model(conn):
            raise ReembedBusy(
                "another `engram reembed` (or a service start) holds this database's embedding "
                "lock; wait for it to finish and run this again"
            )
        try:
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
        finally:
            # A connection that is gone took its session lock with it.
            with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
                await store.unlock_model(conn)
    return ReembedResult(embedder.name, embedder.dimensions, records, tokens, resumed)
