"""/healthz's own connection to the database, apart from the pool.

The pool may be full of accounts' work (each account holds at most its share, app/fairness.py,
and leaves one connection for an account holding none, but a few accounts together fill it) or
of background rounds: a health check waiting for a pooled connection would report a busy
process as a hung one, or hang until the load balancer gives up. One connection kept for the
checks answers in milliseconds however busy the pool is, and a check that gets no answer within
`TIMEOUT_SECONDS` reports the database unavailable rather than waiting longer than a load
balancer's probe does.
"""

import asyncio

import asyncpg
from asyncpg.exceptions import InternalClientError

# The database answers, and holds Engram's schema: its migrations' record (a restore under a
# running service makes the database again empty, then its tables, then copies their rows; every
# request meanwhile is refused UNAVAILABLE, app/db/errors.py, and so is the probe).
_ASK = "SELECT EXISTS (SELECT FROM alembic_version)"

# Below the usual probe timeouts (Kubernetes' default is 1 s, load balancers' 2 to 10 s), and
# far above a `SELECT 1` on a connection of its own, a few milliseconds even under load.
TIMEOUT_SECONDS = 0.9


async def _asked(conn: asyncpg.Connection) -> bool:
    """`_ASK` on `conn`: False, not an error, when the database answers without the table
    (no need to connect again)."""
    try:
        return await conn.fetchval(_ASK) is True
    except asyncpg.UndefinedTableError:
        return False


class Health:
    """Whether the database answers, asked on a connection of its own (opened at the first
    check, and again after one fails); checks made at the same moment take turns on it.

    Opening it goes on past a check's timeout (up to asyncpg's connect timeout), and the next
    check uses it: a server slower than the timeout to let a client in (far away, TLS, busy
    starting backends) yet quick to answer on an open connection would otherwise have every
    check start a new connection and give it up, and be reported unavailable for good."""

    def __init__(self, url: str, timeout: float = TIMEOUT_SECONDS) -> None:
        self.url, self.timeout = url, timeout
        self._conn: asyncpg.Connection | None = None
        self._connecting: asyncio.Task[asyncpg.Connection] | None = None
        self._lock = asyncio.Lock()

    async def answers(self) -> bool:
        """True when the database answered within the timeout, its migrations recorded (`_ASK`),
        waiting for a check in progress included."""
        try:
            async with asyncio.timeout(self.timeout), self._lock:
                try:
                    return await self._ask()
                except BaseException:
                    self._drop()  # failed, or timed out mid-statement: its state is unknown
                    raise
        except Exception:  # refused, reset, timed out, or the server is starting or stopping
            return False

    async def _ask(self) -> bool:
        if self._conn is not None and not self._conn.is_closed():
            try:
                return await _asked(self._conn)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, InternalClientError):
                # E.g. the server restarted since the last check: ask again. (Its FATAL read but
                # its hanging up not yet seen, asyncpg refuses the statement with an
                # InternalClientError of its own, "cannot switch to state".)
                self._drop()
        connecting = self._connecting
        if connecting is None:
            connecting = self._connecting = asyncio.create_task(asyncpg.connect(self.url))
            connecting.add_done_callback(_retrieved)
        try:
            # A check out of time leaves it opening, for the next one.
            conn = await asyncio.shield(connecting)
        except Exception:
            self._connecting = None  # failed: the next check opens another
            raise
        self._connecting, self._conn = None, conn
        return await _asked(conn)

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    async def close(self) -> None:
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
            await asyncio.wait([connecting])
            if not connecting.cancelled() and connecting.exception() is None:
                connecting.result().terminate()  # opened as it was cancelled
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close(timeout=self.timeout)
            except Exception:
                conn.terminate()


def _retrieved(task: asyncio.Task[asyncpg.Connection]) -> None:
    """Marks a failed connect's error as seen: a check, or none, says so (False)."""
    if not task.cancelled():
        task.exception()
