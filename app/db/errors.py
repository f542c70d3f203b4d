"""Which failures mean the database cannot be reached (answered 503 UNAVAILABLE, retry later),
which mean a transaction met another at the same moment (answered CONFLICT, retry), which
mean a statement or a lock wait ran past the pool's bounds (app/db/pool.py `bounds`), and which
mean the account written into was deleted meanwhile (answered NOT_FOUND); and what a client is
told of each (`database_refusal`: GraphQL, MCP and the HTTP edge alike)."""

import errno
import re
import socket
from collections.abc import Iterator

import asyncpg


class SchemaMissing(Exception):
    """A connection to a database without pgvector's type `vector` (app/db/pool.py): one being
    restored, created again empty, or never migrated."""


class MigrationFailed(Exception):
    """A migration the database refused or could not finish (out of disk, a duplicate, its
    connection ended); the migrations before it kept (app/db/migrate.py)."""


# Seconds a client is told to wait (Retry-After) when the database is unavailable.
RETRY_AFTER_SECONDS = 5

# The SQLSTATEs of class 53 a server that ran out of disk space or memory (its locks' shared
# memory included) rolls the work back with: 53000, 53100 disk full, 53200 out of memory. Not
# 53300, too many connections (the server is not reached), nor 53400, a limit the operator
# configured (temp_file_limit), which the same work meets again at every retry: an internal
# error, logged with its statement.
_OUT_OF_RESOURCES = ("53000", "53100", "53200")

# SQLSTATE classes and codes of a server that is down, restarting, in recovery, full, or a
# standby: 08 connection exceptions, 57P01-57P05 (shutdown, crash, cannot connect now, database
# dropped, idle timeout), 53300 too many connections and the server out of a resource
# (`_OUT_OF_RESOURCES`), 25006 read-only transaction; and 25P03, a session the server ended for
# idling in its transaction past its bound (a stalled process).
# And a server that lets the service in no more, which only a new connection meets: 3D000, its
# database does not exist (dropped, as a restore does, until the restored one takes its name),
# and 28, its role may not log in (a password changed, LOGIN revoked, pg_hba.conf).
_STATES = ("08", "57P0", "53300", *_OUT_OF_RESOURCES, "25006", "25P03", "3D000", "28")

# A table of Engram's that the database does not hold (42P01): the service's statements name
# only tables its migrations made, so the database is not the one they made: being restored
# (dropped, created again empty, then filled by pg_restore, which makes the extension, types
# and functions before the tables: docs/operations.md), or changed under the service. Not a
# missing column, function or type (42703, 42883, 42704), which no restore leaves alone and a
# mistake in a statement does; nor 42P01's other sense, a FROM entry a statement lacks or names
# wrongly (`_FROM_ENTRY`, PostgreSQL's words in English, its default), a statement's own mistake.
_SCHEMA_STATES = ("42P01",)
_FROM_ENTRY = ("missing FROM-clause entry", "invalid reference to FROM-clause entry")

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


def is_schema_missing(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) met a database without part of Engram's schema
    (`_SCHEMA_STATES`, `SchemaMissing`): it serves again once restored whole."""
    if _sqlstate(error) in _SCHEMA_STATES:
        table = next(c for c in _causes(error) if isinstance(c, asyncpg.PostgresError))
        return not str(table).startswith(_FROM_ENTRY)
    return any(isinstance(cause, SchemaMissing) for cause in _causes(error))


def is_lost(error: BaseException) -> bool:
    """True for asyncpg's error when a pooled connection is used after its server ended it
    (restarted, or `pg_terminate_backend`) while it was held but idle: asyncpg then detaches the
    holder's proxy (`Connection._cleanup`), and every call on it says the connection "has been
    released back to the pool", which it never was."""
    return isinstance(error, asyncpg.InterfaceError) and "released back to the pool" in str(error)


def is_unavailable(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) says the database is down or not accepting work."""
    for cause in _causes(error):
        if isinstance(cause, asyncpg.PostgresError):
            if (getattr(cause, "sqlstate", None) or "").startswith(_STATES):
                return True
        elif isinstance(cause, asyncpg.InterfaceError):
            if "closed" in str(cause) or "closing" in str(cause) or is_lost(cause):
                return True
        elif isinstance(cause, asyncpg.exceptions.InternalClientError):
            # A pooled connection whose backend was terminated while idle can be left in a
            # protocol state it cannot leave (asyncpg issues 784, 1069); the pool discards it
            # when it comes back, so the retry gets a fresh connection.
            return True
        elif _socket_error(cause):
            return True
    return is_schema_missing(error)


# A serialization failure or a deadlock: PostgreSQL rolled the transaction back because another
# one ran into it at the same moment. Retrying it may pass.
_CONFLICT_STATES = ("40001", "40P01")


def _sqlstate(error: BaseException | None) -> str | None:
    """The SQLSTATE of the first database error among `error` and what caused it."""
    for cause in _causes(error):
        if isinstance(cause, asyncpg.PostgresError):
            return getattr(cause, "sqlstate", None)
    return None


def is_conflict(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) is a transaction rolled back for meeting another."""
    return _sqlstate(error) in _CONFLICT_STATES


def is_out_of_resources(error: BaseException | None) -> bool:
    """True when the server ran out of disk space or memory for the work and rolled it back
    (`_OUT_OF_RESOURCES`): unavailable, but reached (a command says the database stopped its
    work, not that it went away)."""
    return _sqlstate(error) in _OUT_OF_RESOURCES


def is_lock_timeout(error: BaseException | None) -> bool:
    """True when a statement waited for a lock (rows or a table another transaction holds)
    past lock_timeout (55P03 lock_not_available, asyncpg's LockNotAvailableError): its
    transaction is rolled back. The app takes no lock with NOWAIT, the other source of 55P03."""
    return _sqlstate(error) == "55P03"


def is_statement_timeout(error: BaseException | None) -> bool:
    """True when a statement was cancelled by the server (57014 query_canceled, asyncpg's
    QueryCanceledError): it ran past statement_timeout, or an operator cancelled it
    (pg_cancel_backend). Its transaction is rolled back. (A task cancelled while it waits for
    a statement raises CancelledError, not this.)"""
    return _sqlstate(error) == "57014"


# What a server error names, as a log line says it: the schema's own names, never a row's.
_NAMED = (
    ("schema_name", "schema"),
    ("table_name", "table"),
    ("column_name", "column"),
    ("constraint_name", "constraint"),
    ("data_type_name", "type"),
)
# A table the database does not hold (42P01) is named only in its words, PostgreSQL's.
_NO_TABLE = re.compile(r'relation "([^"]+)" does not exist')


def described(error: BaseException | None) -> str:
    """What a log line says of a database's failure: the class of each error of its chain
    (`_causes`), a server error's SQLSTATE and the table, column or constraint it names (a
    table missing, from its words), and an OS error's words (an address, a file); never a
    server error's message or detail, nor asyncpg's own, which may quote a row's values (a
    duplicate key's `Key (x)=(...)`, a text that is no valid input, a trigger's, a query's
    argument): `SerializationError (SQLSTATE 40001, table "client_tokens")`,
    `ConnectionRefusedError ([Errno 111] Connection refused)`."""
    said = []
    for cause in _causes(error):
        what = kind_of(cause)
        said.append(f"{type(cause).__name__} ({what})" if what else type(cause).__name__)
    return " from ".join(said)


def kind_of(error: BaseException) -> str:
    """What `described` says of one error beside its class: a server error's SQLSTATE and the
    names it gives, an OS error's words; "" for any other."""
    what: list[str] = []
    if isinstance(error, asyncpg.PostgresError):
        if sqlstate := getattr(error, "sqlstate", None):
            what.append(f"SQLSTATE {sqlstate}")
        what += [
            f'{word} "{name}"' for field, word in _NAMED if (name := getattr(error, field, None))
        ]
        if sqlstate in _SCHEMA_STATES and (missing := _NO_TABLE.fullmatch(str(error.args[0]))):
            what.append(f'table "{missing[1]}"')
    elif isinstance(error, OSError) and str(error):
        what.append(" ".join(str(error).split()))
    return ", ".join(what)


def is_account_gone(error: BaseException | None) -> bool:
    """True when `error` (or what caused it) is a row written into an account that is not
    there: a foreign-key violation of a table's own key to accounts, which PostgreSQL names
    `<table>_account_id_fkey` (every other key to an account's rows spans more columns:
    `(account_id, principal)`, `(account_id, action_id)`). The service writes only into an
    account it found (the caller's as it authenticated, one it looked up), so the account was
    deleted meanwhile (deleteAccount), and every row of it with it: nothing written is kept."""
    violation = next(
        (c for c in _causes(error) if isinstance(c, asyncpg.ForeignKeyViolationError)), None
    )
    return violation is not None and (
        violation.constraint_name == f"{violation.table_name}_account_id_fkey"
    )


UNAVAILABLE_MESSAGE = (
    "The database is unavailable (restarting, in recovery, or out of connections or disk "
    "space); "
    f"retry in {RETRY_AFTER_SECONDS} seconds."
)
SCHEMA_MISSING_MESSAGE = (
    "The database does not hold all of Engram's tables (it is being restored, or was changed "
    f"under the service); retry in {RETRY_AFTER_SECONDS} seconds."
)
CONFLICT_MESSAGE = (
    "This request ran into another change made at the same moment, and the database rolled "
    "its transaction back; retry it."
)
# The pool's bounds (app/db/pool.py `bounds`): a lock wait past its bound met another change
# holding the rows, as a deadlock does (CONFLICT: retry); a statement past its bound met a
# database too busy to finish it in time (UNAVAILABLE, 503 with Retry-After).
LOCK_TIMEOUT_MESSAGE = (
    "This request waited longer than the service allows (ENGRAM_LOCK_TIMEOUT_SECONDS) for data "
    "another change was holding, and the database rolled its transaction back; retry it."
)
STATEMENT_TIMEOUT_MESSAGE = (
    "The database did not finish this request's work within the time the service allows "
    "(ENGRAM_STATEMENT_TIMEOUT_SECONDS), and rolled its transaction back; "
    f"retry in {RETRY_AFTER_SECONDS} seconds."
)

ACCOUNT_GONE_MESSAGE = (
    "account not found: it was deleted while this request ran, and nothing the request wrote "
    "into it was kept"
)


# The HTTP status each code database_refusal answers is sent with outside GraphQL (the MCP
# endpoint, the HTTP edge: app/main.py `_refused`); UNAVAILABLE's with a Retry-After.
REFUSAL_STATUS = {"UNAVAILABLE": 503, "CONFLICT": 409, "NOT_FOUND": 404}


def database_refusal(error: BaseException | None) -> tuple[str, str] | None:
    """The code and the message for a failure of the database that is no fault of ours (it is
    unavailable, or rolled the work back: a conflict, a bound reached, the account deleted
    meanwhile); None for others."""
    if is_schema_missing(error):
        return "UNAVAILABLE", SCHEMA_MISSING_MESSAGE
    if is_unavailable(error):
        return "UNAVAILABLE", UNAVAILABLE_MESSAGE
    if is_conflict(error):
        return "CONFLICT", CONFLICT_MESSAGE
    if is_lock_timeout(error):
        return "CONFLICT", LOCK_TIMEOUT_MESSAGE
    if is_statement_timeout(error):
        return "UNAVAILABLE", STATEMENT_TIMEOUT_MESSAGE
    if is_account_gone(error):
        return "NOT_FOUND", ACCOUNT_GONE_MESSAGE
    return None
