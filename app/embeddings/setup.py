"""Chooses the embedding provider and checks it against the model the database holds."""

import asyncpg

from app.config import Settings
from app.embeddings import store
from app.embeddings.base import Embedder


class EmbeddingModelMismatch(RuntimeError):
    pass


def make_embedder(settings: Settings) -> Embedder:
    if settings.embedder == "static":
        from app.embeddings.static import StaticEmbedder

        return StaticEmbedder()
    raise RuntimeError(f"embedder {settings.embedder!r} is not available in this build")


async def ensure_model(pool: asyncpg.Pool, embedder: Embedder) -> None:
    """First start: fix the vector columns to this model. Later: refuse a different model."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('engram.embedding'))")
        recorded = await store.recorded_model(conn)
        if recorded is None:
            await store.set_dimensions(conn, embedder.dimensions)
            await store.record_model(conn, embedder.name, embedder.dimensions)
            return
    if recorded["name"] != embedder.name or recorded["dimensions"] != embedder.dimensions:
        raise EmbeddingModelMismatch(
            f"the database holds vectors of {recorded['name']} ({recorded['dimensions']} dimensions) "
            f"but the service is configured for {embedder.name} ({embedder.dimensions}); "
            "run `engram reembed` to re-embed every record with the configured model"
        )
