"""SQL for the deployment's embedding model and the vector columns it fixes."""

from typing import Any

import asyncpg

# Every table with an embedding column; each gets an HNSW index named <table>_embedding.
VECTOR_TABLES = ("agent_memories",)


async def recorded_model(conn: asyncpg.Connection) -> dict[str, Any] | None:
    return await conn.fetchval("SELECT value FROM deployment WHERE key = 'embedding'")


async def record_model(conn: asyncpg.Connection, name: str, dimensions: int) -> None:
    await conn.execute(
        """
        INSERT INTO deployment (key, value) VALUES ('embedding', $1)
        ON CONFLICT (key) DO UPDATE SET value = excluded.value, modified = now()
        """,
        {"name": name, "dimensions": dimensions},
    )


async def set_dimensions(conn: asyncpg.Connection, dimensions: int) -> None:
    """Fixes every vector column to `dimensions` (dropping stored vectors) and indexes it."""
    if not isinstance(dimensions, int) or not 1 <= dimensions <= 16_000:
        raise ValueError(f"bad embedding dimensions {dimensions!r}")
    for table in VECTOR_TABLES:
        # Identifiers come from the constant above and the int check: no input reaches here.
        await conn.execute(f"DROP INDEX IF EXISTS {table}_embedding")
        await conn.execute(
            f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector({dimensions}) USING NULL"
        )
        await conn.execute(
            f"CREATE INDEX {table}_embedding ON {table} USING hnsw (embedding vector_cosine_ops)"
        )
