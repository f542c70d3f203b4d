"""The asyncpg pool: one per process, created in the app's lifespan."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgvector.asyncpg import register_vector

# Every connection's session defaults, which RESET ALL (run by the pool on release) returns
# to: memory search's HNSW settings for a large agent's own index (app/memory/search.py), so
# that such a search is one statement, with no settings to send first. They apply to every
# HNSW scan the connection runs.
SESSION_SETTINGS = {"hnsw.ef_search": "80", "hnsw.iterative_scan": "relaxed_order"}


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(url: str, *, min_size: int = 2, max_size: int = 10) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        url,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        server_settings=SESSION_SETTINGS,
    )
    assert pool is not None
    return pool


@asynccontextmanager
async def transaction(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A connection inside one short transaction, committed on exit."""
    async with pool.acquire() as conn, conn.transaction():
        yield conn
