"""The asyncpg pool: one per process, created in the app's lifespan."""

import asyncio
import json
import math
from collections import deque
from collections.abc import AsyncIterator, Generator, Hashable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import asyncpg
from pgvector.asyncpg import register_vector

from app.db.errors import SchemaMissing

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
    try:
        await register_vector(conn)
    except ValueError as e:  # asyncpg's "unknown type: public.vector"
        raise SchemaMissing(f"the database has no type vector (pgvector's): {e}") from e
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class Share:
    """The connections some work may hold at once (app/fairness.py: an account's, `key` its
    ID): at most `limit`."""

    __slots__ = ("key", "limit")

    def __init__(self, key: Hashable, limit: int) -> None:
        self.key, self.limit = key, limit


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


# Connections that work already holding some of its share leaves free: one for the next
# account holding none, so that two accounts at their share (half the pool each, by default)
# cannot fill the pool between them and keep a third waiting for one of theirs to end.
RESERVE = 1


class Connections:
    """Who takes the pool's `size` connections, and in what order.

    A connection is taken at once when one is free and no waiter comes first; otherwise the
    acquire waits, and every connection given back goes to the first waiter that may take it:
    - work without a share (upkeep, a token's check) and a task's second connection while it
      holds one (`_holding`) first, in arrival order: never bounded, so a task holding a
      connection never waits for more than the pool to free one;
    - then the waiter whose share holds the fewest connections (max-min fairness), the
      earliest of those that hold as few; each share's waiters in arrival order.
    A share's waiter may take one only while it holds fewer than its limit, and, holding some
    already, only if more than `RESERVE` are free. So an account holding none finds a free
    connection at once whatever the others hold, unless as many acquires of accounts holding
    none (or of work without a share) hold the reserve; then it takes one of the first given
    back, after work without a share and accounts holding none that waited longer.

    Every `async with pool.acquire()` passes here first (`SharedPool`), so an acquire given
    leave finds a connection free in asyncpg's own queue, which never has to choose: that queue
    lets a task arriving while a woken waiter has not yet run take the connection it was woken
    for, and sends the waiter to the back of the line.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self._held: dict[Hashable, int] = {}
        self._first: deque[asyncio.Future[None]] = deque()
        self._waiting: dict[Hashable, deque[tuple[int, Share, asyncio.Future[None]]]] = {}
        self._arrivals = 0

    def held(self, key: Hashable) -> int:
        """Connections the share `key` holds (a task's second ones are not counted)."""
        return self._held.get(key, 0)

    def _may(self, share: Share | None) -> bool:
        if self.in_use >= self.size:
            return False
        if share is None:
            return True
        held = self._held.get(share.key, 0)
        return held < share.limit and (held == 0 or self.size - self.in_use > RESERVE)

    def _take(self, share: Share | None) -> None:
        self.in_use += 1
        if share is not None:
            self._held[share.key] = self._held.get(share.key, 0) + 1

    async def take(self, share: Share | None) -> None:
        queue = self._first if share is None else self._waiting.get(share.key)
        if not queue and self._may(share):
            self._take(share)
            return
        turn = asyncio.get_running_loop().create_future()
        if share is None:
            self._first.append(turn)
        else:
            self._arrivals += 1
            self._waiting.setdefault(share.key, deque()).append((self._arrivals, share, turn))
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give_back(share)  # given leave just as it gave up: the next one takes it
            else:
                turn.cancel()
                self._forget(share)
                self._pass_on()
            raise

    def give_back(self, share: Share | None) -> None:
        self.in_use -= 1
        if share is not None:
            held = self._held[share.key] - 1
            if held:
                self._held[share.key] = held
            else:
                del self._held[share.key]
        self._pass_on()

    def _forget(self, share: Share | None) -> None:
        """Drops the cancelled waiters of `share`'s queue."""
        if share is None:
            self._first = deque(t for t in self._first if not t.done())
            return
        queue = self._waiting.get(share.key)
        if queue is not None:
            kept = deque(w for w in queue if not w[2].done())
            if kept:
                self._waiting[share.key] = kept
            else:
                del self._waiting[share.key]

    def _pass_on(self) -> None:
        """Free connections to the waiters that come first, while they may take them."""
        while self.in_use < self.size:
            if self._first:
                turn = self._first.popleft()
                if not turn.done():
                    self._take(None)
                    turn.set_result(None)
                continue
            best: tuple[int, int] | None = None
            chosen = None
            for key, queue in self._waiting.items():
                arrival, share, _ = queue[0]
                if self._may(share):
                    rank = (self._held.get(key, 0), arrival)
                    if best is None or rank < best:
                        best, chosen = rank, key
            if best is None:
                return
            queue = self._waiting[chosen]
            _, share, turn = queue.popleft()
            if not queue:
                del self._waiting[chosen]
            if not turn.done():  # cancelled, and not yet gone from its queue
                self._take(share)
                turn.set_result(None)


class _SharedAcquire:
    def __init__(self, pool: "SharedPool", timeout: float | None) -> None:
        self._pool, self._timeout = pool, timeout
        self._share = None if _holding.get() else _share.get()

    async def __aenter__(self) -> asyncpg.Connection:
        connections = self._pool.connections
        if self._timeout is None:
            await connections.take(self._share)
        else:
            async with asyncio.timeout(self._timeout):
                await connections.take(self._share)
        try:
            self._acquiring = asyncpg.Pool.acquire(self._pool, timeout=self._timeout)
            conn = await self._acquiring.__aenter__()
        except BaseException:
            connections.give_back(self._share)
            raise
        self._token = _holding.set(True) if self._share is not None else None
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
            if self._token is not None:
                _holding.reset(self._token)
            self._pool.connections.give_back(self._share)

    def __await__(self) -> Generator[Any, None, asyncpg.Connection]:
        # `await pool.acquire()` and `pool.release(conn)` (bench only) pass the shares by.
        return asyncpg.Pool.acquire(self._pool, timeout=self._timeout).__await__()


class SharedPool(asyncpg.Pool):
    """The pool, whose `acquire()` (`async with`) first waits for leave from `connections`:
    one account's work then holds at most its share of the connections (`drawing_on`), leaves
    one free for an account holding none, and a connection given back goes to the account
    waiting that holds the fewest."""

    def __init__(self, *args: Any, max_size: int, **kwargs: Any) -> None:
        super().__init__(*args, max_size=max_size, **kwargs)
        self.connections = Connections(max_size)

    def acquire(self, *, timeout: float | None = None) -> Any:
        return _SharedAcquire(self, timeout)


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
