"""Chooses the embedding provider and checks it against the model the database holds."""

import asyncio
import contextlib
from typing import Any

import asyncpg

from app.config import INDEXED_DIMENSIONS, Settings
from app.embeddings import store
from app.embeddings.base import Embedder


class EmbeddingModelMismatch(RuntimeError):
    pass


async def open_embedder(settings: Settings) -> Embedder:
    """The provider `settings.embedder` names, ready to embed (its dimension known)."""
    if settings.embedder == "static":
        from app.embeddings.static import StaticEmbedder

        return StaticEmbedder()
    if settings.embedder == "minilm":
        from app.embeddings.minilm import MiniLMEmbedder

        # Loading torch and the model takes seconds: keep the event loop free meanwhile.
        return await asyncio.to_thread(MiniLMEmbedder)
    if settings.embedder == "openai":
        from app.embeddings.openai import OpenAIEmbedder

        key = settings.embedding_api_key
        embedder = OpenAIEmbedder(
            url=settings.embedding_url,
            model=settings.embedding_model,
            api_key=key.get_secret_value().strip() or None if key else None,  # (as the model's)
            dimensions=settings.embedding_dimensions,
            batch_size=settings.embedding_batch_size,
            timeout_seconds=settings.embedding_timeout_seconds,
        )
        try:
            return await embedder.open()
        except BaseException:
            await embedder.aclose()
            raise
    raise ValueError(f"unknown embedder {settings.embedder!r}: use static, minilm or openai")


def check_dimensions(embedder: Embedder) -> None:
    """Refuses a model whose vectors the search indexes cannot take, before anything is
    changed for it."""
    if embedder.dimensions > INDEXED_DIMENSIONS:
        raise EmbeddingModelMismatch(
            f"{embedder.name} gives vectors of {embedder.dimensions} dimensions, more than the "
            f"{INDEXED_DIMENSIONS} the search indexes (pgvector's HNSW) take: set "
            f"ENGRAM_EMBEDDING_DIMENSIONS (1 to {INDEXED_DIMENSIONS}) for a model that shortens "
            "its vectors when asked (OpenAI's text-embedding-3 models), or choose another model"
        )


def _mismatch(recorded: dict[str, Any], embedder: Embedder) -> str:
    return (
        f"the database holds vectors of {recorded['name']} ({recorded['dimensions']} dimensions) "
        f"but the service is configured for {embedder.name} ({embedder.dimensions}); "
        "run `engram reembed` to re-embed every record with the configured model (stop the "
        "service first), or set ENGRAM_EMBEDDER back to the model the database holds"
    )


async def ensure_model(
    pool: asyncpg.Pool, embedder: Embedder, vectors: store.VectorColumns
) -> None:
    """First start: fix the vector columns to this model. Later: refuse a different model."""
    check_dimensions(embedder)
    async with pool.acquire() as conn:
        # A first start drops the columns' other indexes: what keeps them from being built is
        # held first, before the transaction and the embedding lock, as `engram reembed` takes
        # them. A model once recorded stays: a later start holds nothing of the kind.
        first = await store.recorded_model(conn) is None
        held = (
            vectors.hold_indexes(conn, store.DROPPING_INDEXES)
            if first
            else contextlib.nullcontext()
        )
        async with held, conn.transaction():
            await store.lock_model_xact(conn)
            recorded = await store.recorded_model(conn)
            if recorded is None:
                await store.set_dimensions(conn, embedder.dimensions, vectors)
                await store.record_model(conn, embedder.name, embedder.dimensions)
                await store.clear_reembed_target(conn)
                return
            unfinished = await store.reembed_target(conn)
    if recorded["name"] != embedder.name or recorded["dimensions"] != embedder.dimensions:
        raise EmbeddingModelMismatch(_mismatch(recorded, embedder))
    if unfinished is not None:
        # Vectors were dropped for another model and the re-embed stopped part way.
        raise EmbeddingModelMismatch(
            f"`engram reembed` to {unfinished['name']} was interrupted, so some records have no "
            f"vector; run `engram reembed` again with the configured model ({embedder.name})"
        )
