"""The asyncpg pool: one per process, created in the app's lifespan."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from pgvector.asyncpg import register_vector

# Every connection's session defaults, which RESET ALL (run by the pool on release after
# `session_changed`) returns to: the HNSW settings of every scan that does not set its own, so
# that a search is one statement, with no settings to send first. (Memory search's index plan
# sets its `hnsw.ef_search` inside its statement, app/memory/search_store.py; EF_SEARCH in
# app/memory/search.py is this default.)
SESSION_SETTINGS = {"hnsw.ef_search": "80", "hnsw.iterative_scan": "relaxed_order"}


class PooledConnection(asyncpg.Connection):
    """A connection of the pool, returned to it with no reset statement unless its session
    changed. asyncpg's default sends `pg_advisory_unlock_all()`, `CLOSE ALL`, `UNLISTEN *` and
    `RESET ALL` on every release, a round trip each time: two a searchMemories request, whose
    p50 over HTTP they took from 11.50 to 12.35 ms (bench/README.md, nineteenth session).

    An open transaction is rolled back and listener callbacks are dropped either way
    (asyncpg's own part of the reset). What changes a session beyond its transaction, a
    setting set with `set_config(.., false)` or a session advisory lock, says so first
    (`session_changed`); LISTEN does by itself. Cursors live in transactions, and temporary
    tables are dropped on commit (tests/test_db_pool.py holds the app's code to that)."""

    _changed = False

    def session_changed(self) -> None:
        self._changed = True

    async def add_listener(self, channel: str, callback: Any) -> None:
        self._changed = True
        await super().add_listener(channel, callback)

    def get_reset_query(self) -> str:
        if not self._changed:
            return ""
        self._changed = False
        return str(super().get_reset_query())


def session_changed(conn: asyncpg.Connection) -> None:
    """Call before a statement that changes `conn`'s session past its transaction: a pooled
    connection is then reset when released (another connection is nobody else's)."""
    mark = getattr(conn, "session_changed", None)
    if mark is not None:
        mark()


async def init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(url: str, *, min_size: int = 2, max_size: int = 10) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        url,
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        server_settings=SESSION_SETTINGS,
        connection_class=PooledConnection,
    )
    assert pool is not None
    return pool


@asynccontextmanager
async def transaction(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A connection inside one short transaction, committed on exit."""
    async with pool.acquire() as conn, conn.transaction():
        yield conn
