"""Which failures mean the database cannot be reached (answered 503 UNAVAILABLE, retry later),
and which mean a transaction met another at the same moment (answered CONFLICT, retry)."""

import errno
import socket

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


def is_unavailable(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) says the database is down or not accepting work."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, asyncpg.PostgresError):
            if (getattr(error, "sqlstate", None) or "").startswith(_STATES):
                return True
        elif isinstance(error, asyncpg.InterfaceError):
            if "closed" in str(error) or "closing" in str(error):
                return True
        elif isinstance(error, asyncpg.exceptions.InternalClientError):
            # A pooled connection whose backend was terminated while idle can be left in a
            # protocol state it cannot leave (asyncpg issues 784, 1069); the pool discards it
            # when it comes back, so the retry gets a fresh connection.
            return True
        elif _socket_error(error):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


# A serialization failure or a deadlock: PostgreSQL rolled the transaction back because another
# one ran into it at the same moment. Retrying it may pass.
_CONFLICT_STATES = ("40001", "40P01")


def is_conflict(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) is a transaction rolled back for meeting another."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, asyncpg.PostgresError):
            return getattr(error, "sqlstate", None) in _CONFLICT_STATES
        error = error.__cause__ or error.__context__
        seen += 1
    return False
