"""The asyncpg pool: one per process, created in the app's lifespan."""

import json
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol

import asyncpg
from pgvector.asyncpg import register_vector

# Every connection's session defaults, which RESET ALL (run by the pool on release after
# `session_changed`) returns to: the HNSW settings of every scan that does not set its own, so
# that a search is one statement, with no settings to send first. (Memory search's index plan
# sets its `hnsw.ef_search` inside its statement, app/memory/search_store.py; EF_SEARCH in
# app/memory/search.py is this default.)
SESSION_SETTINGS = {"hnsw.ef_search": "80", "hnsw.iterative_scan": "relaxed_order"}

# The bounds on a request's database work (`create_pool`), PostgreSQL's settings for them, set
# at connect like SESSION_SETTINGS (no statement sent per acquire) and so kept by RESET ALL.
BOUNDS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def bounds(statement: float = 0, lock: float = 0, idle_in_transaction: float = 0) -> dict[str, str]:
    """The server settings for those bounds, each in seconds, as whole milliseconds
    (PostgreSQL's unit for them; a bound under one is one, not none). 0 sets none: the
    server's own applies (none, unless the database or role sets one)."""
    seconds = (statement, lock, idle_in_transaction)
    return {name: str(math.ceil(s * 1000)) for name, s in zip(BOUNDS, seconds, strict=True) if s}


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


async def lift_bounds(conn: asyncpg.Connection) -> None:
    """Lifts the pool's bounds (BOUNDS) for `conn` until it is released: for upkeep that is
    long by design (CREATE INDEX CONCURRENTLY over a large table, which also waits for every
    older transaction to end), never for a request's work."""
    session_changed(conn)  # the pool's RESET ALL brings the bounds back on release
    await conn.execute(
        "SELECT set_config('statement_timeout', '0', false), "
        "set_config('lock_timeout', '0', false), "
        "set_config('idle_in_transaction_session_timeout', '0', false)"
    )


async def init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class Share(Protocol):
    """A bound on the connections some work holds at once (app/fairness.py: an account's)."""

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


_share: ContextVar[Share | None] = ContextVar("engram_connection_share", default=None)
# Whether this task (or the one that started it) holds a connection of its share: a second
# connection taken meanwhile is not counted again, or work holding the whole share while it
# waited for one more connection would wait for itself.
_holding: ContextVar[bool] = ContextVar("engram_holding_share", default=False)


@contextmanager
def drawing_on(share: Share | None) -> Iterator[None]:
    """Connections acquired in this block, and in the tasks it starts, count against `share`
    (None: against nothing but the pool)."""
    token = _share.set(share)
    try:
        yield
    finally:
        _share.reset(token)


class _SharedAcquire:
    def __init__(self, acquiring: Any, share: Share) -> None:
        self._acquiring, self._share = acquiring, share

    async def __aenter__(self) -> asyncpg.Connection:
        await self._share.acquire()
        try:
            conn = await self._acquiring.__aenter__()
        except BaseException:
            self._share.release()
            raise
        self._token = _holding.set(True)
        return conn

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            await self._acquiring.__aexit__(kind, error, trace)
        finally:
            _holding.reset(self._token)
            self._share.release()


class SharedPool(asyncpg.Pool):
    """The pool, whose `acquire()` first waits for a place in the share of the work it is
    acquired for (`drawing_on`), when that work has one: one account's requests then hold at
    most their share of the connections, and the others' requests find one."""

    def acquire(self, *, timeout: float | None = None) -> Any:
        acquiring = super().acquire(timeout=timeout)
        share = _share.get()
        if share is None or _holding.get():
            return acquiring
        return _SharedAcquire(acquiring, share)


async def create_pool(
    url: str, *, min_size: int = 2, max_size: int = 10, limits: dict[str, str] | None = None
) -> asyncpg.Pool:
    """`limits`: `bounds(...)` for the connections' statements, lock waits and idle
    transactions (None: none, for the command line's own work)."""
    # asyncpg.create_pool's defaults, but for those set here; the class is ours.
    return await SharedPool(
        url,
        min_size=min_size,
        max_size=max_size,
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        init=init_connection,
        server_settings={**SESSION_SETTINGS, **(limits or {})},
        connection_class=PooledConnection,
        record_class=asyncpg.Record,
        loop=None,
    )


@asynccontextmanager
async def transaction(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A connection inside one short transaction, committed on exit."""
    async with pool.acquire() as conn, conn.transaction():
        yield conn
