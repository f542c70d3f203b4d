"""Which failures mean the database cannot be reached (answered 503 UNAVAILABLE, retry later),
and which mean a transaction met another at the same moment (answered CONFLICT, retry)."""

import errno
import socket
from collections.abc import Iterator

import asyncpg

# Seconds a client is told to wait (Retry-After) when the database is unavailable.
RETRY_AFTER_SECONDS = 5

# SQLSTATE classes and codes of a server that is down, restarting, in recovery, full, or a
# standby: 08 connection exceptions, 57P01-57P05 (shutdown, crash, cannot connect now, database
# dropped, idle timeout), 53300 too many connections, 25006 read-only transaction.
_STATES = ("08", "57P0", "53300", "25006")

_SOCKET_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH}


def _socket_error(error: BaseException) -> bool:
    if isinstance(error, ConnectionError | TimeoutError | socket.gaierror):
        return True
    if isinstance(error, FileNotFoundError):
        return error.filename is None  # a Unix socket with no server behind it, not a file
    return isinstance(error, OSError) and error.errno in _SOCKET_ERRNOS


def _causes(error: BaseException | None) -> Iterator[BaseException]:
    """`error` and what it was raised from (`raise ... from`), at most 8 deep. Not an error
    that was being handled when it was raised (`__context__`): a bug of the handler's own
    (a mistyped name in an `except TimeoutError:` block) was not caused by the timeout."""
    seen = 0
    while error is not None and seen < 8:
        yield error
        error = error.__cause__
        seen += 1


def is_unavailable(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) says the database is down or not accepting work."""
    for cause in _causes(error):
        if isinstance(cause, asyncpg.PostgresError):
            if (getattr(cause, "sqlstate", None) or "").startswith(_STATES):
                return True
        elif isinstance(cause, asyncpg.InterfaceError):
            if "closed" in str(cause) or "closing" in str(cause):
                return True
        elif isinstance(cause, asyncpg.exceptions.InternalClientError):
            # A pooled connection whose backend was terminated while idle can be left in a
            # protocol state it cannot leave (asyncpg issues 784, 1069); the pool discards it
            # when it comes back, so the retry gets a fresh connection.
            return True
        elif _socket_error(cause):
            return True
    return False


# A serialization failure or a deadlock: PostgreSQL rolled the transaction back because another
# one ran into it at the same moment. Retrying it may pass.
_CONFLICT_STATES = ("40001", "40P01")


def is_conflict(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) is a transaction rolled back for meeting another."""
    for cause in _causes(error):
        if isinstance(cause, asyncpg.PostgresError):
            return getattr(cause, "sqlstate", None) in _CONFLICT_STATES
    return False
