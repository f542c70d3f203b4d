"""The `engram` command: serve, migrate, re-embed, maintain search, export and import an agent,
print the schema, and manage accounts and clients from a terminal (`parser` holds every command
and flag)."""

# Annotations are not evaluated: the types they name (settings, pydantic's errors) are imported
# where used, so that `main` starts, and handles interrupts, before the modules that take time.
from __future__ import annotations

import errno
import fcntl
import gc
import io
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    import argparse
    from datetime import datetime
    from uuid import UUID

    import asyncpg
    from pydantic_settings import SettingsError

    from app.auth.caller import Caller
    from app.config import Settings
    from app.embeddings.reembed import ReembedResult
    from app.memory.maintenance import IndexBuilds, Round

T = TypeVar("T")


def _tracing_missing(settings: Settings) -> str | None:
    """Why the app could not trace to ENGRAM_OTEL_ENDPOINT (the `otel` extra is not installed),
    found before the database starts: create_app would find it only after."""
    from app.observability import tracing

    if not settings.otel_endpoint:
        return None
    try:
        tracing.middleware()
        tracing.tracer_provider(settings.otel_endpoint).shutdown()
    except RuntimeError as e:
        return str(e)
    return None


def _json_log(command: str | None) -> bool:
    """Whether `engram serve` runs with ENGRAM_LOG_FORMAT=json, read as Settings reads it (the
    name and the word in any case) but from the environment itself: also when another setting
    is refused."""
    return command == "serve" and any(
        name.upper() == "ENGRAM_LOG_FORMAT" and value.lower() == "json"
        for name, value in os.environ.items()
    )


def _say(line: str, command: str | None) -> None:
    """A line saying why a command stopped, on stderr. `engram serve` under
    ENGRAM_LOG_FORMAT=json says it as its log does, one JSON object (level ERROR, logger
    `engram`), so that what reads the service's log parses its refusal to start as well; other
    commands speak to a person at a terminal, in text whatever the log's format."""
    if not _json_log(command):
        print(line, file=sys.stderr)
        return
    import logging

    from app.observability import logs

    record = logging.makeLogRecord(
        {"name": "engram", "levelno": logging.ERROR, "levelname": "ERROR", "msg": line}
    )
    print(logs.JsonFormatter().format(record), file=sys.stderr)


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    import asyncio
    import logging

    import uvicorn

    from app.db.embedded import adopt_orphans
    from app.main import create_app, start_state

    missing = _tracing_missing(settings)
    if missing is not None:
        _say(f"engram: {missing}", "serve")
        return 2
    # The settings' own check, for the flag that overrides ENGRAM_HOST.
    exposed = (
        None if args.host is None else settings.exposed_refusal(args.host, f"--host {args.host}")
    )
    if exposed is not None:
        _say(f"engram: {exposed}", "serve")
        return 2

    class _Draining(uvicorn.Server):
        """Says in a line when a stop begins and what it waits for: with turns running it
        takes minutes, and uvicorn's own lines are kept out of the log."""

        async def shutdown(self, sockets: list[Any] | None = None) -> None:
            running = len(self.server_state.tasks)
            log = logging.getLogger("app.cli")
            if running:
                log.info(
                    "stopping: taking no new requests, finishing the %d in progress (a turn "
                    "ends by ENGRAM_TURN_TIMEOUT_SECONDS)",
                    running,
                )
            else:
                log.info("stopping: taking no new requests, none in progress")
            await super().shutdown(sockets)

    if settings.database_url_value() is None:
        # The embedded server's postmaster becomes this process's child, which the supervisor
        # reaps should it die (app/db/embedded.py).
        adopt_orphans()
    terminated = False

    async def serve() -> bool:
        # Until uvicorn handles signals, SIGTERM ends the start as Ctrl-C does (the task is
        # cancelled, and what started is stopped): by default it would kill the process and
        # leave the embedded PostgreSQL running.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def terminate() -> None:
            nonlocal terminated
            if not terminated:
                terminated = True
                task.cancel()

        loop.add_signal_handler(signal.SIGTERM, terminate)  # until the loop closes, or below
        # Started before uvicorn so that a refusal (the embedder does not match the database)
        # ends the command with one line, not a lifespan traceback.
        started = await start_state(settings)
        try:
            app = create_app(settings, started=started)
            # What startup made (schema, models, pools) lives as long as the process: kept out
            # of the collector's passes, which otherwise walk it again and again while serving.
            gc.collect()
            gc.freeze()
            host = settings.host if args.host is None else args.host
            port = settings.port if args.port is None else args.port
            logging.getLogger("app.cli").info(
                "Engram starting on %s (GraphiQL in a browser; the admin console at /console; "
                "metrics at /metrics)",
                listen_url(host, port),
            )
            # log_config=None: uvicorn keeps our logging (quiet libraries, JSON when asked for).
            server = _Draining(uvicorn.Config(app, host=host, port=port, log_config=None))
            loop.remove_signal_handler(signal.SIGTERM)  # uvicorn's from here
            try:
                await server.serve()
            except SystemExit:
                # uvicorn exits (status 3) when it cannot start, a port in use, having logged
                # why and stopped the app: a refused start, status 2 as the others. Its line
                # names the address, but for a name that does not resolve only the resolver's
                # words (`Name or service not known`): said again naming the host and setting.
                unresolved = None if server.started else _unresolved(host)
                if unresolved is not None:
                    _say(
                        f"engram: cannot listen on {host} (ENGRAM_HOST, or --host): {unresolved}",
                        "serve",
                    )
                return False
            except UnicodeError as e:
                # A host name the resolver cannot even encode (`127.0.0..1`), which uvicorn
                # lets through, unlike the OSError of a port in use.
                if server.started:
                    raise
                await server.lifespan.shutdown()  # as uvicorn does after an OSError
                _say(
                    f"engram: cannot listen on {host} (ENGRAM_HOST, or --host): {e}",
                    "serve",
                )
                return False
            return server.started
        finally:
            # The lifespan's end stopped it, unless uvicorn failed before or around the
            # lifespan: then here, not at exit (or never, were the process killed).
            await started.stop()

    # `main`'s SIGTERM handler, read before `_run` (serve's loop puts back the default as it
    # ends): one that came before `serve`'s own is said by `main`, status 143.
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return 0 if _run(serve) else 2
    except KeyboardInterrupt:
        if isinstance(handler, _Termination) and handler.came:
            raise
        return 0
    except asyncio.CancelledError:
        if not terminated:
            raise
        _say("engram: stopped by SIGTERM while starting", "serve")
        return 128 + signal.SIGTERM


def listen_url(host: str, port: int) -> str:
    """The GraphQL address `engram serve` says it listens on (an IPv6 address in brackets)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/graphql"


def _host(value: str) -> str | None:
    """`--host`: an empty one counts as not given, as an empty ENGRAM_HOST counts as unset
    (asyncio listens on every interface for an empty host)."""
    return value if value.strip() else None


def _unresolved(host: str) -> str | None:
    """Why `host` names no address to listen on, or None when it resolves."""
    import socket

    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        return str(e)
    return None


def _migrate(settings: Settings, args: argparse.Namespace) -> int:
    from app.db import migrate
    from app.db.embedded import embedded_uri

    url = settings.database_url_value()
    server = None
    if url is None:
        server, url = embedded_uri(settings.data_dir)
    try:
        revision = migrate.upgrade(url)
    finally:
        if server is not None:
            server.stop()
    print(f"database is at the latest migration ({revision})")
    return 0


@asynccontextmanager
async def _database(settings: Settings, *, reads: str | None = None) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the migrated database (the embedded server unless a URL is set). A command
    that only reads (`reads`, its name) makes no database where ENGRAM_DATA_DIR holds none
    (`_no_database`: there would be nothing to read), and migrates none: a database an older
    release migrated is refused as it is (`_behind`), since the export an operator takes
    before an upgrade must not itself upgrade the database, for good."""
    import asyncio

    from app.db import migrate
    from app.db.embedded import embedded_uri, holds_database
    from app.db.pool import create_pool

    server = None
    url = settings.database_url_value()
    if url is None and reads is not None and not holds_database(settings.data_dir):
        raise _no_database(reads, settings.data_dir)
    if url is None:
        # (Unpacked apart: mypy does not narrow `url` through an awaited call's tuple.)
        started = await asyncio.to_thread(embedded_uri, settings.data_dir)
        server, url = started
    try:
        if reads is None:
            await migrate.upgrade_in_thread(url)
        else:
            stands = await asyncio.to_thread(migrate.behind, url)
            if stands is not None:
                raise _behind(reads, settings, *stands)
        pool = await create_pool(url, min_size=1, max_size=2)
        try:
            yield pool
        finally:
            await pool.close()
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


async def _as_admin(
    settings: Settings,
    work: Callable[[asyncpg.Pool, Caller], Awaitable[T]],
    *,
    reads: str | None = None,
    account: UUID | None = None,
) -> T:
    """Runs `work(pool, caller)` as the default account's admin, for people at a terminal: made
    first (with the admin's client, and its token shown once) if no start of the service made
    them yet, unless the command only reads (`reads`, its name: `client tokens`), which makes
    no account: without the default account it reads as the admin of the account it names
    (`account`, given --account) if that exists, and is refused otherwise (`_unstarted`)."""
    from app.auth.caller import Caller
    from app.auth.policies import ADMIN_POLICIES
    from app.auth.service import (
        ADMIN_PRINCIPAL,
        bootstrap_admin,
        default_account,
        ensure_default_account,
    )

    # Accounts and clients need only the database: no web app, no embedding model to load.
    async with _database(settings, reads=reads) as pool:
        if reads is None:
            created = await bootstrap_admin(pool, settings.bootstrap_token_value())
            if created is not None:
                print(f"Engram admin token (shown once, keep it safe): {created}", file=sys.stderr)
            async with pool.acquire() as conn:
                account_id = await ensure_default_account(conn)
            in_default = True
        else:
            async with pool.acquire() as conn:
                found = await default_account(conn)
                account_id = found or await _named_account(conn, reads, account)
            in_default = found is not None
        caller = Caller(account_id, ADMIN_PRINCIPAL, ADMIN_POLICIES, in_default_account=in_default)
        return await work(pool, caller)


async def _named_account(conn: asyncpg.Connection, command: str, account: UUID | None) -> UUID:
    """The account a command that only reads acts in on a database without the default account
    (whose admin it acts as otherwise): the one it names, once found, as the admin of it alone
    (not of the default account, reaching no other). The operator at the terminal acts as admin
    already; the service's API is not concerned: this caller has no token, and is made only
    here."""
    from app.auth import store

    if account is None:
        raise _unstarted(command, account=None)
    if await store.get_account(conn, account) is None:
        raise _unstarted(command, account=account)
    return account


# What a command that only reads says on a database whose default account no start of the
# service made yet: it makes no account (nor the admin and its token) just to read nothing.
_UNSTARTED = "this database has no default account yet (the service makes it when it first starts)"


# What a command that only reads says where ENGRAM_DATA_DIR holds no database: it makes none
# (no embedded server started there, no database made and migrated) just to read nothing.
_NO_DATABASE = "no database yet in ENGRAM_DATA_DIR"


# What a command that only reads says on a database no migration has run on (a URL naming one
# just created): it makes no Engram tables there just to read nothing.
_NO_TABLES = "the database holds no Engram tables yet (no migration has run on it)"


def _no_database(command: str, data_dir: Path) -> Exception:
    from app.errors import NotFound

    return NotFound(
        f"{_NO_DATABASE} ({data_dir}): `engram {command}` only reads, and makes none: point "
        "ENGRAM_DATA_DIR (or ENGRAM_DATABASE_URL) at the service's database, or start the "
        "service first (`engram serve`)"
    )


def _behind(command: str, settings: Settings, at: str | None, newest: str) -> Exception:
    from app.errors import Conflict, NotFound

    if at is None:  # a database no migration has run on: no Engram database yet
        return NotFound(
            f"{_NO_TABLES}: `engram {command}` only reads, and migrates nothing: point "
            "ENGRAM_DATABASE_URL (or ENGRAM_DATA_DIR) at the service's database, or start the "
            "service first (`engram serve`)"
        )
    backup = (
        f"the data directory ({settings.data_dir})"
        if settings.database_url_value() is None
        else "the database (docs/operations.md, Backup and restore)"
    )
    return Conflict(
        f"the database is at revision {at}, this engram needs {newest}: `engram {command}` only "
        f"reads, and migrates nothing: back up {backup} and run `engram migrate` (or run "
        f"`engram {command}` with the release that wrote it)"
    )


def _unstarted(command: str, *, account: UUID | None) -> Exception:
    """`account`: the account the command named (--account), which this database does not hold
    either."""
    from app.errors import NotFound

    if account is None:
        # `account list` and `client issued` take no --account: there is no account the first
        # could name, and the second reads from the default account, every account.
        named = (
            ""
            if command in ("account list", "client issued")
            else ", or name the account with --account ID"
        )
        return NotFound(
            f"{_UNSTARTED}: `engram {command}` only reads, and makes no account; start the "
            f"service first (`engram serve`){named}"
        )
    return NotFound(
        f"{_UNSTARTED}, nor account {account}: `engram {command}` only reads, and makes no "
        "account; check the account ID (`engram account create` printed it), or start the "
        "service first (`engram serve`)"
    )


async def _reembed_database(settings: Settings, batch_size: int) -> ReembedResult:
    from app.embeddings.reembed import reembed
    from app.embeddings.setup import open_embedder
    from app.memory.vectors import VECTOR_COLUMNS

    async with _database(settings) as pool:
        embedder = await open_embedder(settings)
        try:
            return await reembed(
                pool,
                embedder,
                VECTOR_COLUMNS,
                batch_size=batch_size,
                progress=True,
                lease_seconds=settings.turn_lease_seconds,
            )
        finally:
            await embedder.aclose()


# What a reembed stopped part way (failed, or interrupted: _INTERRUPTED) is told to do: what it
# wrote stays.
_REEMBED_AGAIN = (
    "run `engram reembed` again to finish (it embeds only the records still without a new vector)"
)


def _reembed(settings: Settings, args: argparse.Namespace) -> int:
    import asyncpg

    from app.embeddings.errors import EmbedderUnavailable, EmbeddingFailed
    from app.embeddings.reembed import ReembedBusy

    try:
        result = _run(partial(_reembed_database, settings, args.batch_size))
    except (EmbedderUnavailable, ReembedBusy) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EmbeddingFailed as e:
        # Its address and status, not the provider's words, which may quote the records sent.
        print(f"error: {e.logged}; once it answers, {_REEMBED_AGAIN}", file=sys.stderr)
        return 2
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        if _database_gone(e) or _database_stopped(e):
            raise  # told by `_command`, as for every command (a statement cancelled too)
        # Any other failure of the database: what was written stays, and a run again goes on
        # from there.
        reason = " ".join(str(e).split()) or type(e).__name__
        print(
            f"error: the database failed while re-embedding ({reason}); {_REEMBED_AGAIN}",
            file=sys.stderr,
        )
        return 2
    resumed = ", resuming an interrupted run" if result.resumed else ""
    print(
        f"re-embedded {result.records} records with {result.model} "
        f"({result.dimensions} dimensions, {result.tokens} tokens{resumed}); the service can start"
    )
    return 0


def _index_builds(settings: Settings, pool: asyncpg.Pool) -> IndexBuilds:
    """Builds of large agents' and sessions' own search indexes, with the settings' limits."""
    from app.memory.maintenance import IndexBuilds

    return IndexBuilds(
        pool,
        min_records=settings.agent_index_min_records,
        max_agents=settings.agent_index_max_agents,
        min_parts=settings.history_index_min_parts,
        max_sessions=settings.history_index_max_sessions,
        build_memory=settings.agent_index_build_memory,
    )


def _maintain_search(settings: Settings, args: argparse.Namespace) -> int:
    import time

    from app.memory.maintenance import reorder, run_round

    min_records = args.min_records or settings.agent_index_min_records

    reordered = ""

    async def work() -> Round | None:
        nonlocal reordered
        async with _database(settings) as pool:
            if args.reorder:
                began = time.monotonic()
                async with pool.acquire() as conn:
                    await reorder(conn)
                reordered = (
                    f"stored the memory records in agent order again in "
                    f"{time.monotonic() - began:.1f} s; "
                )
            return await run_round(
                pool,
                min_records,
                settings.agent_index_build_memory,
                settings.agent_index_max_agents,
                min_parts=settings.history_index_min_parts,
                max_sessions=settings.history_index_max_sessions,
            )

    done = _run(work)
    if done is None and reordered:
        # The reorder is done; the round that another process began since does the rest.
        print(f"{reordered}another process is maintaining search: the round is left to it")
        return 0
    if done is None:
        print("error: another process is maintaining search; try again", file=sys.stderr)
        return 2
    print(
        f"{reordered}agents of {min_records}+ records: built {len(done.built)} search indexes, "
        f"dropped {len(done.dropped)}, counted the words of {done.counted} agents and "
        f"{done.sessions} sessions"
    )
    return 0


def _policies(values: list[str] | None) -> list[Any] | None:
    import json

    from app.errors import BadInput

    if values is None:
        return None
    policies: list[Any] = []
    for value in values:
        try:
            policy = json.loads(value)
        except ValueError:
            raise BadInput(
                f"--policy {value!r} is not JSON; write it like "
                '\'{"effect":"ALLOW","actions":["SELECT"],"resources":["financial.*"]}\''
            ) from None
        # A list (as docs/access.md writes several) gives each of its policies.
        policies.extend(policy if isinstance(policy, list) else [policy])
    return policies


def _uuid(value: str, what: str) -> UUID:
    from uuid import UUID

    from app.errors import BadInput

    try:
        return UUID(value)
    except ValueError:
        raise BadInput(f"{value!r} is not {what} (a UUID)") from None


def _expires(value: str | None) -> datetime | None:
    from app.errors import BadInput
    from app.text import rfc3339

    if value is None:
        return None
    try:
        return rfc3339(value)
    except ValueError as e:
        raise BadInput(f"--expires {value!r}: {e}") from None


def _token(info: Any) -> dict[str, Any]:
    """A token as `engram client tokens` prints it: never its secret."""
    return {
        "tokenId": str(info.token_id),
        "prefix": info.prefix,
        "created": info.created.isoformat(),
        "expires": info.expires.isoformat() if info.expires else None,
        "lastUsed": info.last_used.isoformat() if info.last_used else None,
        "bootstrap": info.bootstrap,
        "issuedBy": info.issued_by,
        "issuedByAccountId": str(info.issued_by_account) if info.issued_by_account else None,
        "issuedByTokenId": str(info.issued_by_token) if info.issued_by_token else None,
    }


def _chain_token(info: Any) -> dict[str, Any]:
    """A token of what a token issued, as `client issued` and `client revoke-issued` print it:
    its client, then what `engram client tokens` prints."""
    return {"accountId": str(info.account_id), "principal": info.principal, **_token(info)}


def _account_id(value: str | None, what: str = "--account") -> UUID | None:
    from uuid import UUID

    from app.errors import BadInput

    if value is None:
        return None
    try:
        return UUID(value)
    except ValueError:
        raise BadInput(f"{what} {value!r} is not an account ID (a UUID)") from None


_STDOUT_CLOSED = "standard output is closed: the command prints its result there"


def _printed_result() -> None:
    """Refuses, before anything is made, a command whose result is printed (a token's secret,
    shown only then; a new account's ID) started with standard output closed (`>&-`): Python
    makes it None, which print writes nothing to."""
    if sys.stdout is None:
        raise OSError(errno.EBADF, _STDOUT_CLOSED)


def _client(settings: Settings, args: argparse.Namespace) -> int:
    import json

    from app.auth import service
    from app.auth.service import ADMIN_PRINCIPAL
    from app.errors import NotFound

    _printed_result()
    # Checked before the database starts, so a typo fails at once.
    account = _account_id(getattr(args, "account", None))
    policies = _policies(getattr(args, "policy", None))

    async def work(pool: asyncpg.Pool, caller: Caller) -> dict[str, Any]:
        command = args.client_command
        if command == "revoke-issued":
            token_id = _uuid(args.token_id, "a token ID")
            gone = await service.revoke_tokens_issued_by(pool, caller, token_id=token_id)
            return {"revoked": [_chain_token(t) for t in gone]}
        if command == "issued":
            token_id = _uuid(args.token_id, "a token ID")
            found = await service.list_tokens_issued_by(pool, caller, token_id=token_id)
            return {"issued": [_chain_token(t) for t in found]}
        named = {"account_id": account, "principal": args.principal}
        if command in ("create", "update"):
            if command == "create":
                client = await service.create_client(
                    pool,
                    caller,
                    **named,
                    # An empty --name is refused as update refuses it, not taken as not given.
                    name=args.principal if args.name is None else args.name,
                    policies=policies or [],
                )
            else:
                client = await service.update_client(
                    pool, caller, **named, name=args.name, policies=policies
                )
            return {
                "accountId": str(client.account_id),
                "principal": client.principal,
                "name": client.name,
                "policies": client.policies,
            }
        if command == "delete":
            client = await service.delete_client(pool, caller, **named)
            return {"deleted": client.principal}
        if command == "token":
            issued = await service.issue_client_token(
                pool, caller, **named, expires=_expires(args.expires)
            )
            return {"principal": args.principal, "token": issued.token, **_token(issued.info)}
        if command == "tokens":
            # An unknown client is NOT_FOUND, as for the other commands, not an empty list.
            if await service.get_client(pool, caller, **named) is None:
                raise NotFound(f"client {args.principal!r} not found")
            listed = await service.list_client_tokens(pool, caller, **named)
            return {"principal": args.principal, "tokens": [_token(t) for t in listed]}
        if command == "revoke-token":
            token_id = _uuid(args.token_id, "a token ID")
            revoked = await service.revoke_client_token(pool, caller, **named, token_id=token_id)
            return {"principal": args.principal, "revoked": _token(revoked)}
        raise AssertionError(args.client_command)

    async def told(pool: asyncpg.Pool, caller: Caller) -> dict[str, Any]:
        try:
            return await work(pool, caller)
        except NotFound as e:
            if account is not None or not str(e).endswith(" not found"):
                raise
            if args.principal == ADMIN_PRINCIPAL:
                # Listing only reads: the default account an import made has no admin yet.
                raise NotFound(
                    f"{e} in the default account: `engram serve`, or a client or account "
                    "command that writes, makes it (docs/access.md)"
                ) from None
            raise NotFound(
                f"{e} in the default account: a client of another account needs --account ID"
            ) from None

    # Listing tokens only reads: on a database no start of the service made the default
    # account of, it lists in the account --account names, if that exists, and is refused
    # otherwise, the account not made (with the admin and its token) to list nothing; so does
    # listing what a token issued, which takes no --account.
    reads = {"tokens": "client tokens", "issued": "client issued"}.get(args.client_command)
    run = partial(_as_admin, settings, told, reads=reads, account=account)
    print(json.dumps(_run(run), indent=2))
    return 0


_ACCOUNTS_PAGE = 1000  # accounts `engram account list` reads a query: the most `accounts` pages


def _account(settings: Settings, args: argparse.Namespace) -> int:
    import json

    from app.auth import service

    if args.account_command == "list":

        async def listed(pool: asyncpg.Pool, caller: Caller) -> dict[str, Any]:
            found: list[service.Account] = []
            after = None
            while True:
                page = await service.list_accounts(pool, caller, after=after, limit=_ACCOUNTS_PAGE)
                found += page
                if len(page) < _ACCOUNTS_PAGE:
                    break
                after = (page[-1].name, page[-1].account_id)
            return {
                "accounts": [
                    {
                        "accountId": str(a.account_id),
                        "name": a.name,
                        "created": a.created.isoformat(),
                        "isDefault": a.is_default,
                    }
                    for a in found
                ]
            }

        # Listing only reads: it makes neither the default account nor the admin's token.
        run = partial(_as_admin, settings, listed, reads="account list")
        print(json.dumps(_run(run), indent=2))
        return 0

    if args.account_command == "events":
        return _account_events(settings, args)

    _printed_result()
    account_id = _account_id(getattr(args, "account_id", None), "ACCOUNT_ID")

    async def work(pool: asyncpg.Pool, caller: Caller) -> dict[str, str]:
        if args.account_command == "rename":
            account = await service.update_account(
                pool,
                caller,
                account_id=account_id,
                name=args.name,
                expected_name=args.expected_name,
            )
        elif args.account_command == "delete":
            assert account_id is not None
            account = await service.delete_account(pool, caller, account_id=account_id)
        else:
            account = await service.create_account(pool, caller, name=args.name)
        return {"accountId": str(account.account_id), "name": account.name}

    print(json.dumps(_run(partial(_as_admin, settings, work)), indent=2))
    return 0


def _account_events(settings: Settings, args: argparse.Namespace) -> int:
    """`engram account events`: who changed accounts, clients and tokens, newest first, as
    adminEvents answers them, at most --limit."""
    import json

    from app.auth import service

    account = _account_id(args.account)
    token_id = _uuid(args.token, "a token ID") if args.token is not None else None

    async def listed(pool: asyncpg.Pool, caller: Caller) -> dict[str, Any]:
        found: list[service.AdminEvent] = []
        after = None
        while len(found) <= args.limit:
            page = await service.list_admin_events(
                pool,
                caller,
                account_id=account,
                token_id=token_id,
                after=after,
                limit=min(_ACCOUNTS_PAGE, args.limit + 1 - len(found)),
            )
            found += page
            if not page or len(found) > args.limit:
                break
            after = (page[-1].at, page[-1].event_id)
        return {
            "events": [
                {
                    "eventId": str(e.event_id),
                    "accountId": str(e.account_id),
                    "at": e.at.isoformat(),
                    "actor": e.actor,
                    "actorAccountId": str(e.actor_account) if e.actor_account else None,
                    "actorTokenId": str(e.actor_token) if e.actor_token else None,
                    "operation": e.operation,
                    "targetKind": e.target_kind.upper(),
                    "target": e.target,
                    "principal": e.target_principal,
                    "changes": e.changes,
                }
                for e in found[: args.limit]
            ],
            "more": len(found) > args.limit,
        }

    # Listing only reads: it makes neither the default account nor the admin's token.
    run = partial(_as_admin, settings, listed, reads="account events", account=account)
    print(json.dumps(_run(run), indent=2))
    return 0


def _schema(settings: Settings, args: argparse.Namespace) -> int:
    from app.graphql.schema import schema

    sdl = schema.as_str() + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(sdl)
    elif sys.stdout is None:  # closed when the command started (`>&-`)
        raise OSError(errno.EBADF, _CLOSED[True])
    else:
        sys.stdout.write(sdl)
    return 0


def _in_account(
    settings: Settings,
    account: UUID | None,
    work: Callable[..., Awaitable[T]],
    *,
    reads: str | None = None,
) -> T:
    """Runs `work(pool, account_id=...)` on the migrated database, in `account` or else the default
    account (export and import need no admin token). A command that only reads (`reads`, its
    name: export) is refused when there is no default account yet, and makes no account
    (`_unstarted`); one that writes is given None for it, and makes it only once it writes (an
    import refused changes nothing)."""
    import logging

    from app.auth.service import default_account

    logging.getLogger("alembic").setLevel(logging.WARNING)

    async def run() -> T:
        async with _database(settings, reads=reads) as pool:
            account_id = account
            if account_id is None and reads is not None:
                async with pool.acquire() as conn:
                    account_id = await default_account(conn)
                if account_id is None:
                    raise _unstarted(reads, account=None)
            return await work(pool, account_id=account_id)

    return _run(run)


_CLOSED = {
    False: "standard input is closed: name the file to read instead of -",
    True: "standard output is closed: name the file to write with -o FILE",
}


@contextmanager
def _file_or_std(path: str | None, mode: str, placed: _Placed | None = None) -> Iterator[IO[str]]:
    """The named file, or standard input or output for `-` (or no name). A file written is
    written beside it first and takes its name only when the work succeeds: a failed export
    leaves a file already there as it was. A link is followed (it stays a link); what is not a
    file (a FIFO, a device such as /dev/stdout) is written straight into. `placed`, given,
    tells whether the file written took its name."""
    # Read, a byte that is not UTF-8 becomes a lone surrogate, which the import names by line
    # (a decoding error names a byte of the block being decoded, not of the file).
    errors = "strict" if "w" in mode else "surrogateescape"
    if path in (None, "-"):
        std = sys.stdout if "w" in mode else sys.stdin
        if std is None:  # closed when the command started (`>&-`, `<&-`): Python's None
            raise OSError(errno.EBADF, _CLOSED["w" in mode])
        if isinstance(std, io.TextIOWrapper) and "w" not in mode:
            std.reconfigure(errors=errors)
        yield std
        return
    # A name ending in a slash is opened as it is (refused: a folder or "Not a directory"),
    # where `Path.resolve` dropped the slash and the file of that name was written.
    if "w" in mode and path.endswith(os.sep) and os.path.isfile(path.rstrip(os.sep)):
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    if "w" in mode and _a_held_stream(path):  # (else written into /dev/null, said done)
        raise OSError(errno.EBADF, _CLOSED[True], path)
    not_a_file = os.path.exists(path) and not os.path.isfile(path)
    if "w" not in mode or not_a_file or path.endswith(os.sep):
        with open(path, mode, encoding="utf-8", errors=errors) as f:
            yield f
        return
    try:
        target = Path(path).resolve()
    except RuntimeError:  # links that lead back to themselves (Python 3.11; later ones: OSError)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
    partial_file = target.with_name(target.name + ".partial")
    held, ours = _partial_held(partial_file, path)
    try:
        try:
            # Written through the descriptor locked, made writable: reopened by its name, one
            # made under a umask without the owner's write (0222) could not be written.
            os.ftruncate(held, 0)
            with open(os.dup(held), mode, encoding="utf-8") as f:
                if placed is not None:
                    placed.target, placed.written = target, ours
                yield f
            os.replace(partial_file, target)
        finally:
            if _names(partial_file, ours):  # not another export's, made since the rename
                partial_file.unlink(missing_ok=True)
    finally:
        os.close(held)


_WRITING = "another export is writing it now ({name} is in use): run this one once it has ended"


# `_partial_held`'s passes: each one more needs another export to end just as it opens the file.
_PARTIAL_TRIES = 20

_NOT_A_FILE = "{}, which the export writes first, is {}: remove it, or name another file"
_NO_FILE = {errno.ELOOP: "a link", errno.EISDIR: "a directory"}


def _partial_held(partial_file: Path, path: str) -> tuple[int, os.stat_result]:
    """`partial_file` opened (made if need be) and locked (flock), with the file it is, held
    until the export's file has its name: another export to the same file meanwhile is
    refused, where it emptied this one's .partial and wrote into it too. One a killed export
    left is taken (its lock went with its process). Locked once its name no longer named it
    (the export that held it ended as this one opened it: its file took its name, or it
    removed its .partial), it is opened again: the lock held that other file, and the .partial
    this export then made by that name was held by none. One left that cannot be written (made
    under a umask without the owner's write, its export killed) is removed once locked, and
    made again: it was refused "Permission denied" at every export after."""
    for _ in range(_PARTIAL_TRIES):
        try:
            # Not through a link (the export went into the file it points at, and the link took
            # FILE's place), nor waiting on a FIFO for a writer (for ever).
            flags = os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
            try:
                held, writable = os.open(partial_file, os.O_RDWR | flags, 0o666), True
            except PermissionError:  # still told when another export holds it
                held, writable = os.open(partial_file, os.O_RDONLY | flags, 0o666), False
        except OSError as e:
            if e.errno in _NO_FILE:  # (the folder it is in has no link: resolved)
                said = _NOT_A_FILE.format(partial_file.name, _NO_FILE[e.errno])
                raise OSError(e.errno, said, path) from None
            # Told as the file asked for: the .partial beside it is ours, not the user's.
            raise OSError(e.errno, e.strerror, path) from None
        try:
            mode = os.fstat(held).st_mode
            if not stat.S_ISREG(mode):
                kind = "a FIFO" if stat.S_ISFIFO(mode) else "not a file"
                raise OSError(errno.EEXIST, _NOT_A_FILE.format(partial_file.name, kind), path)
            os.set_blocking(held, True)
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            ours = os.fstat(held)
            if _names(partial_file, ours):
                if writable:
                    return held, ours
                try:  # a stale one, held by none but this export: made anew
                    partial_file.unlink()
                except OSError as e:
                    raise OSError(e.errno, e.strerror, path) from None
        except BlockingIOError:
            os.close(held)
            raise OSError(errno.EBUSY, _WRITING.format(name=partial_file.name), path) from None
        except BaseException:
            os.close(held)
            raise
        os.close(held)
    # Each pass met another export ending just then: others keep writing it.
    raise OSError(errno.EBUSY, _WRITING.format(name=partial_file.name), path)


def _names(path: Path, known: os.stat_result) -> bool:
    """`path` still names the file `known` was taken of."""
    try:
        now = os.stat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (known.st_dev, known.st_ino)


class _Placed:
    """Whether the file `_file_or_std` wrote took its name, asked once a stop (Ctrl-C, SIGTERM)
    came: of the file (its inode), not of the line reached, since the stop may be raised as
    `os.replace` returns, or in the cleanup after it (the .partial name removed), with the new
    file in place."""

    def __init__(self) -> None:
        self.target: Path | None = None
        self.written: os.stat_result | None = None

    def __bool__(self) -> bool:
        if self.target is None or self.written is None:
            return False
        return _names(self.target, self.written)


class _Output:
    """The export's output, which remembers the error of a write that failed (a full disk) so
    that it is told as the output's, not as one of the database's (both are OSErrors), and
    whether it was flushed (`flushed`: what was written to it is all out of the process)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.failed: OSError | None = None
        self.flushed = False

    def write(self, text: str) -> int:
        return self._tried(self.out.write, text)

    def flush(self) -> None:
        self._tried(self.out.flush)
        self.flushed = True

    def _tried(self, call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except BrokenPipeError:
            raise  # the reader went away: `main` exits quietly
        except OSError as e:
            self.failed = e
            raise


def _stdout_to_devnull() -> None:
    """Standard output, which failed, pointed at /dev/null: what is left in its buffer is
    written there at exit rather than failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _counted(n: int, kind: str) -> str:
    """`n` rows of an export's `kind` (its lines' `type`), in English: "1 memory", "0 action
    versions", "2 memories"."""
    name = kind.replace("_", " ")
    if n != 1:
        consonant_y = name.endswith("y") and name[-2:-1] not in "aeiou"
        name = name[:-1] + "ies" if consonant_y else name + "s"
    return f"{n} {name}"


def _export(settings: Settings, args: argparse.Namespace) -> int:
    from app.errors import BadInput, NotFound
    from app.transfer.service import export_action

    action_id = _uuid(args.action, "an action ID")
    account = _account_id(args.account)
    if args.output == "":  # (taken for the folder it runs in, once the export was written)
        raise BadInput("-o names no file: give the file to write, or - for standard output")
    to_std = args.output in (None, "-")
    output: _Output | None = None
    placed = _Placed()
    try:
        with _file_or_std(args.output, "w", placed) as out:
            output = _Output(out)
            work = partial(
                export_action,
                action_id=action_id,
                out=output,
                embeddings=not args.no_embeddings,
                progress=sys.stderr.isatty(),
                notice=lambda text: print(f"engram export: {text}", file=sys.stderr),
            )
            try:
                counts = _in_account(settings, account, work, reads="export")
            except NotFound as e:
                said = (_UNSTARTED, _NO_DATABASE, _NO_TABLES)
                if account is not None or e.message.startswith(said):
                    raise
                raise NotFound(
                    f"{e}, the default account: an agent of another account needs --account ID"
                ) from None
            output.flush()  # here, where its error is told, not at Python's exit
        rows = ", ".join(_counted(n, kind) for kind, n in counts.items())
        print(f"exported action {action_id}: {rows}", file=sys.stderr)
    except KeyboardInterrupt:
        # Written in full: the file took its name, or what is not a file (standard output, a
        # FIFO, a device), written straight into, was flushed once the export was.
        if placed.target is not None:
            written = bool(placed)
        else:
            written = output is not None and output.flushed
        if not written:
            raise
        where = "the export was written in full to standard output"
        if not to_std:
            where = f"{args.output} was written in full"
        raise _StoppedAfter(f"it came after {where}") from None
    except OSError as e:  # (a file's close, after a write failed, fails as it did)
        if output is None or output.failed is None:
            raise
        if to_std:  # what is left in the buffer, written at exit, would fail again
            _stdout_to_devnull()
        where = "standard output" if to_std else args.output
        print(f"error: cannot write {where}: {output.failed.strerror or e}", file=sys.stderr)
        return 2
    return 0


def _import(settings: Settings, args: argparse.Namespace) -> int:
    from app.embeddings.errors import EmbedderUnavailable, EmbeddingFailed
    from app.embeddings.setup import EmbeddingModelMismatch, open_embedder
    from app.transfer.service import ImportResult, import_file, seekable

    account = _account_id(args.account)

    async def work(
        pool: asyncpg.Pool, *, account_id: UUID | None, lines: Iterable[str]
    ) -> ImportResult:
        result = await import_file(
            pool,
            account_id=account_id,
            lines=lines,
            open_embedder=partial(open_embedder, settings),
            batch_rows=args.batch_size,
            progress=sys.stderr.isatty(),
        )
        # Agents the import took past the threshold get their own search indexes now, not at
        # the service's next maintenance round.
        builds = _index_builds(settings, pool)
        for action_id, records in result.records.items():
            builds.wrote((result.account_id, action_id), records)
        await builds.settle()
        return result

    try:
        # Standard input from a pipe copied here, before the work's event loop: copied in it
        # (`import_file` would), a writer that stalled kept the import waiting past SIGTERM
        # (the loop cancels its work at its next wait, which a read that does not return never
        # reaches).
        with _file_or_std(args.file, "r") as given, seekable(given) as lines:
            result = _in_account(settings, account, partial(work, lines=lines))
    except OSError as e:
        print(f"error: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:
        print(f"error: {args.file} is not UTF-8 text (byte {e.start})", file=sys.stderr)
        return 2
    except EmbeddingFailed as e:
        # As `engram reembed` says it: not the provider's words, which may quote the records.
        print(f"error: {e.logged}", file=sys.stderr)
        return 2
    except (EmbedderUnavailable, EmbeddingModelMismatch) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not result.inserted:  # all there already (an import run again), or the file is empty
        vectors = "no record written, so no vector copied or embedded"
    elif not result.records_written:  # rows written (an execution, a session...), no record
        vectors = "no record needed embedding"
    elif result.vectors == "copied":
        vectors = "vectors copied" + (
            f" ({result.reembedded} records the file has no vector for: embedded again)"
            if result.reembedded
            else ""
        )
    else:
        vectors = f"vectors re-embedded ({result.reembedded} records)"
    print(f"imported {result.inserted} rows, {result.present} already there unchanged; {vectors}")
    if result.missing:
        told = ", ".join(f"{got} of {n} {kind} rows" for kind, (got, n) in result.missing.items())
        print(
            f"error: the file is cut short: it held {told} its header counts. The rows it held "
            "are imported; importing the whole file adds the rest.",
            file=sys.stderr,
        )
        return 2
    return 0


class _StoppedAfter(KeyboardInterrupt):
    """A stop (Ctrl-C, SIGTERM) that came once the command's work was done, with what it left
    (`said`), told in place of what the command leaves when stopped part way."""

    def __init__(self, said: str) -> None:
        super().__init__(said)
        self.said = said


# What an interrupted command (Ctrl-C, or SIGTERM) leaves, said in one line after its name.
_INTERRUPTED = {
    "reembed": f"the records re-embedded so far keep their new vectors; {_REEMBED_AGAIN}: the "
    "service does not start on a database that is half re-embedded",
    "export": "no file was written (a file already there is as it was); what went to standard "
    "output is cut short, and an import refuses it as such",
    "import": "the batches stored stay; run the same import again to continue (rows already "
    "there are skipped). Search indexes not built yet are built by the service's next "
    "maintenance round, or by that import.",
}


_ACCOUNT_HELP = "account ID (default: the default account)"


def _at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from `low` (to `high`)."""

    def parse(text: str) -> int:
        import argparse

        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, not {value}")
        return value

    return parse


def _print_version() -> None:
    """The release, and the migration a database is at once this release has started on it
    (what an operator compares with `engram migrate`'s before an upgrade)."""
    from importlib.metadata import version

    from app.db import migrate

    print(f"engram {version('engram')} (database migrations up to {migrate.latest_revision()})")


def _version_action() -> type:
    import argparse

    class Version(argparse.Action):
        """--version, read only when asked (the migrations' directory is not read at every
        command's start)."""

        def __init__(self, option_strings: list[str], dest: str, help: str) -> None:
            super().__init__(option_strings, dest, nargs=0, help=help)

        def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
            if sys.stdout is None:  # (`>&-`: print would write nothing, and exit 0)
                parser.exit(2, f"engram: {_STDOUT_CLOSED}\n")
            _print_version()
            parser.exit()

    return Version


def parser() -> argparse.ArgumentParser:
    import argparse

    class Parser(argparse.ArgumentParser):
        """`engram`'s parser and each command's (`engram import`, `engram client create`): an
        argument it does not know is refused by the command's own parser, with its usage and
        its name, as its other wrong arguments are (argparse leaves it to the top-level parser,
        whose usage lists every command and names none). It is refused before a missing
        required argument is, which argparse checks first and stops at: `engram import --bogus`
        names `--bogus`, as `engram import FILE --bogus` does. `engram serve`'s wrong option is
        said as its other refusals are (`_say`)."""

        def error(self, message: str) -> NoReturn:
            if self.prog.endswith(" serve") and _json_log("serve"):
                _say(f"{self.prog}: error: {message}", "serve")
                raise SystemExit(2)
            super().error(message)

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            given = list(sys.argv[1:] if args is None else args)
            # Help is printed by the pass that runs it, which in the lenient pass showed every
            # required option as optional (`[--action ACTION]`); it refuses nothing anyway.
            if not any(arg == "-h" or len(arg) > 3 and "--help".startswith(arg) for arg in given):
                lenient, unknown = self._unknown(given)
                if unknown:
                    self._unrecognized(unknown, lenient)
            parsed, extras = super().parse_known_args(given, namespace)
            if extras:
                self._unrecognized(extras, parsed)
            return parsed, extras

        def _unrecognized(self, extras: list[str], parsed: argparse.Namespace) -> NoReturn:
            """The refusal of arguments no parser knew, as `engram serve`'s are said when they
            came before its name (`engram --bogus serve`, `parsed` naming the command)."""
            message = f"unrecognized arguments: {' '.join(extras)}"
            if getattr(parsed, "command", None) == "serve" and _json_log("serve"):
                _say(f"{self.prog}: error: {message}", "serve")
                raise SystemExit(2)
            self.error(message)

        def _unknown(self, given: list[str]) -> tuple[argparse.Namespace, list[str]]:
            """The arguments of `given` no parser knows, found in a pass that requires none
            (a subcommand's own pass as well: `engram --bogus import` named only import's
            missing file, as its pass ran inside this one), and that pass's namespace (the
            command it names, for `_unrecognized`), to be thrown away."""
            required = list(self._required())
            for action in required:
                action.required = False
            try:
                parsed, extras = super().parse_known_args(list(given), argparse.Namespace())
            finally:
                for action in required:
                    action.required = True
            return parsed, list(extras)

        def _required(self) -> Iterator[argparse.Action]:
            """The required arguments of this parser and of its commands', theirs included."""
            for action in self._actions:
                if action.required:
                    yield action
                if isinstance(action, argparse._SubParsersAction):
                    for command in action.choices.values():
                        if isinstance(command, Parser):
                            yield from command._required()

    p = Parser(prog="engram", description="Durable memory for AI agents.")
    p.add_argument(
        "--version",
        action=_version_action(),
        help="print the release and the newest database migration it brings, then exit",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(
        name: str, run: Callable[[Settings, argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help)
        c.set_defaults(run=run)
        return c

    serve = command(
        "serve", _serve, "start the service (embedded PostgreSQL unless ENGRAM_DATABASE_URL)"
    )
    serve.add_argument(
        "--host", type=_host, help="address to listen on (default: ENGRAM_HOST, 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=_at_least(1, 65535), help="port to listen on (default: ENGRAM_PORT, 8000)"
    )

    command("migrate", _migrate, "bring the database to the latest migration")

    reembed = command(
        "reembed",
        _reembed,
        "re-embed every record with the configured embedding model (stop serving)",
    )
    reembed.add_argument(
        "--batch-size",
        type=_at_least(1),
        default=256,
        help="records read and embedded at a time (default: 256)",
    )

    maintain = command(
        "maintain-search",
        _maintain_search,
        "build large agents' search indexes and count their words now "
        "(the service does it every ENGRAM_SEARCH_MAINTENANCE_SECONDS)",
    )
    maintain.add_argument(
        "--min-records",
        type=_at_least(1),
        help="index agents of this many records or more, at least 1 "
        "(default: ENGRAM_AGENT_INDEX_MIN_RECORDS, 2000)",
    )
    maintain.add_argument(
        "--reorder",
        action="store_true",
        help="first store memory records in agent order again, once no round or index build "
        "is running (locks the table while it runs); a round another process begins "
        "meanwhile is left to it",
    )

    export = command(
        "export",
        _export,
        "write an agent, every version of every record, and the sessions and executions "
        "they name, as JSONL",
    )
    export.add_argument("--action", required=True, help="the agent's action ID")
    export.add_argument("--account", help=_ACCOUNT_HELP)
    export.add_argument("-o", "--output", help="the file to write (default: standard output)")
    export.add_argument(
        "--no-embeddings",
        action="store_true",
        help="leave the vectors out (smaller; the import embeds the records again)",
    )

    imp = command(
        "import",
        _import,
        "recreate an exported agent with the same IDs; identical rows are skipped, so it "
        "can run again after an interruption",
    )
    imp.add_argument("file", help="an `engram export` file (- for standard input)")
    imp.add_argument("--account", help=_ACCOUNT_HELP)
    imp.add_argument(
        "--batch-size",
        type=_at_least(1),
        default=1000,
        help="rows written per transaction (default: 1000)",
    )

    schema = command("schema", _schema, "print the GraphQL schema (SDL)")
    schema.add_argument("-o", "--output", help="write it to this file, e.g. schema.graphql")

    account = command("account", _account, "manage accounts (tenants)")
    account_sub = account.add_subparsers(dest="account_command", required=True)
    create_account = account_sub.add_parser(
        "create", help="create an account; prints its accountId (needs the default account)"
    )
    create_account.add_argument("name", help="the account's name, 1 to 200 characters")
    account_sub.add_parser(
        "list",
        help="list every account (accountId, name, created, isDefault) by name; only reads",
    )
    rename_account = account_sub.add_parser(
        "rename", help="rename an account (the default one too); prints its accountId and name"
    )
    rename_account.add_argument("account_id", help="the account's accountId")
    rename_account.add_argument("name", help="its new name, 1 to 200 characters")
    rename_account.add_argument(
        "--expected-name",
        help="the name it should have now: if it is named otherwise, nothing changes (CONFLICT)",
    )
    account_sub.add_parser(
        "delete",
        help="delete an account that holds nothing (no client, no agent); prints what it was",
    ).add_argument("account_id", help="the account's accountId")
    events = account_sub.add_parser(
        "events",
        help="list who changed accounts, clients and tokens, and when, newest first; only reads",
    )
    events.add_argument(
        "--account", help="the account's accountId; by default the default account's"
    )
    events.add_argument(
        "--token",
        help="a tokenId: only what requests sending it changed, in every account unless "
        "--account (after a leak, what the leaked token did)",
    )
    events.add_argument(
        "--limit",
        type=_at_least(1),
        default=1000,
        help="the most events printed, newest first; `more` says if others follow (default: 1000)",
    )

    client = command("client", _client, "manage clients (principals), policies and tokens")
    client_sub = client.add_subparsers(dest="client_command", required=True)
    policy_help = (
        "a policy as JSON, e.g. "
        '\'{"effect":"ALLOW","actions":["SELECT"],"resources":["financial.*"]}\', or a JSON '
        "list of them"
    )
    helps = {
        "create": "create a client with its policies",
        "update": "change a client's name or replace its policies",
        "delete": "delete a client and its tokens",
        "token": "issue an API token for a client (printed once; only its hash is kept)",
        "tokens": "list a client's tokens (never their secrets)",
        "revoke-token": "revoke one of a client's tokens",
    }
    for name, text in helps.items():
        c = client_sub.add_parser(name, help=text)
        c.add_argument("principal", help="the client's name in its account, e.g. admin")
        if name == "revoke-token":
            c.add_argument("token_id", help="the tokenId `engram client tokens` lists")
        c.add_argument("--account", help=_ACCOUNT_HELP)
        if name in ("create", "update"):
            c.add_argument("--name", help="a display name (create: default the principal)")
            c.add_argument(
                "--policy",
                action="append",
                help=policy_help
                + "; repeat it for several (create: none, a client that may do nothing, when"
                " not given; update: replaces them all)",
            )
        if name == "token":
            c.add_argument("--expires", help="when it stops working, e.g. 2027-01-31T12:00:00Z")
    for name, text in (
        (
            "revoke-issued",
            "revoke a token, if it is still there, and every token it issued, in turn (after a "
            "leak), in every account",
        ),
        (
            "issued",
            "list, revoking nothing, what revoke-issued would revoke: a token, if it is still "
            "there, and every token it issued, in turn, in every account",
        ),
    ):
        client_sub.add_parser(name, help=text).add_argument(
            "token_id", help="the token's tokenId (what it issued names it as issuedByTokenId)"
        )
    for commands in (account_sub, client_sub):
        # A missing one is said by what it may be, as the usage says it, not by its dest
        # ("required: client_command").
        commands.metavar = "{" + ",".join(commands.choices or ()) + "}"
    return p


def _settings_error(error: SettingsError) -> str:
    """One line for a value pydantic-settings could not decode (JSON, for complex fields)."""
    field = re.search(r'field "(\w+)"', str(error))
    name = f"ENGRAM_{field[1].upper()}: " if field else ""
    return f"engram: {name}not valid JSON ({error.__cause__ or error})"


def _unreachable(settings: Settings, error: Exception) -> str:
    """One line for a database that refused the first connection: where, and why, never the
    password."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    reason = " ".join(str(error).split())
    url = settings.database_url_value()
    if url is None:
        return f"engram: cannot connect to the embedded PostgreSQL in {settings.data_dir}: {reason}"
    reason = reason.replace(url, "the URL")  # libpq quotes a URL it cannot read, password too
    try:
        info = conninfo_to_dict(url)
    except ProgrammingError:
        return f"engram: ENGRAM_DATABASE_URL cannot be read as a PostgreSQL URL: {reason}"
    password = str(info.get("password") or "")
    if password and re.search(rf"(?<![^\W_]){re.escape(password)}(?![^\W_])", reason):
        # Not masked in place: a short password masked inside the message's words ("c***necti***
        # refused") would spell itself.
        reason = "(the driver's message is not shown: it holds the password)"
    where = f"{info.get('host') or 'localhost'}:{info.get('port') or 5432}"
    return f"engram: cannot connect to the database at {where} (ENGRAM_DATABASE_URL): {reason}"


def _command(args: argparse.Namespace) -> int:
    """Runs the command parsed, with the settings: a wrong setting, bad input or an error the
    user can act on told in one line."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from app.config import SecretFileRefused, Settings, variable_of
    from app.observability import logs

    try:
        settings = Settings()
    except SecretFileRefused as e:
        _say(f"engram: {e}", args.command)
        return 2
    except ValidationError as e:
        # One line per wrong setting, named as it is set: no traceback.
        told: set[object] = set()
        for error in e.errors():
            field, *item = error["loc"] or [None]
            if field in told:
                continue  # a list's first wrong item is enough
            told.add(field)
            message = error["msg"].removeprefix("Value error, ")
            if item:
                message = f"item {'.'.join(str(part) for part in item)}: {message}"
            _say(
                f"engram: {variable_of(str(field))}: {message}" if field else f"engram: {message}",
                args.command,
            )
        return 2
    except SettingsError as e:
        _say(_settings_error(e), args.command)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    from psycopg import OperationalError, ProgrammingError

    from app.db.embedded import StartFailed
    from app.db.errors import MigrationFailed
    from app.embeddings.errors import EmbedderUnavailable
    from app.embeddings.setup import EmbeddingModelMismatch
    from app.errors import DomainError
    from app.text import is_storable

    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and not is_storable(text):
                _say(
                    f"engram: {name.replace('_', '-')} is not valid text (a NUL, or bytes "
                    "that are not UTF-8)",
                    args.command,
                )
                return 2
    try:
        return int(args.run(settings, args))
    except DomainError as e:
        _say(f"error ({e.code}): {e.message}", args.command)
        return 2
    except BrokenPipeError:
        # The reader went away (`engram export ... | head`): as other tools, quietly.
        _stdout_to_devnull()
        return 1
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _say(f"engram: {where}{e.strerror or e}", args.command)
        return 2
    except (EmbeddingModelMismatch, EmbedderUnavailable, MigrationFailed, StartFailed) as e:
        # What to run or set is in the message: nothing else is worth printing.
        _say(f"engram: {e}", args.command)
        return 2
    except (OperationalError, ProgrammingError) as e:
        # Raised by the first connection, the migrations' (psycopg; the service's pool is
        # asyncpg); ProgrammingError: a URL libpq cannot parse, which it quotes, password too.
        _say(_unreachable(settings, e), args.command)
        return 2
    except Exception as e:
        # The database went away while the command ran (restarted; its connection ended by an
        # operator, a bound, or the network): said with what is left, as for an interruption.
        # Or it rolled the command's work back: its statement cancelled (an operator, or a
        # statement_timeout or lock_timeout the database or its role sets), a deadlock.
        stopped = _database_stopped(e)
        gone = not stopped and _database_gone(e)
        if gone and _schema_missing(e):
            what, again = _SCHEMA_MISSING, "run it again once the database is restored whole"
        elif gone:
            what, again = _DATABASE_GONE, "run it again once the database answers"
        elif stopped:
            what = f"the database stopped its work ({' '.join(str(e).split())})"
            again = "run it again"
        else:
            raise
        after = _INTERRUPTED.get(args.command, again)
        _say(f"engram {args.command}: {what}: {after}", args.command)
        return 2


_DATABASE_GONE = (
    "the database became unavailable while it ran (restarting, or its connection was ended)"
)


_SCHEMA_MISSING = (
    "the database does not hold all of Engram's tables (it is being restored, or was changed "
    "under the command)"
)


def _schema_missing(error: BaseException) -> bool:
    from app.db.errors import is_schema_missing

    return is_schema_missing(error)


def _database_gone(error: BaseException) -> bool:
    """An error of the database driver (asyncpg) saying the database cannot be reached, or the
    pool's refusal of a connection to a database without pgvector's type (`SchemaMissing`)."""
    import asyncpg
    from asyncpg.exceptions import InternalClientError

    from app.db.errors import SchemaMissing, is_unavailable

    driver = (asyncpg.PostgresError, asyncpg.InterfaceError, InternalClientError, SchemaMissing)
    return isinstance(error, driver) and is_unavailable(error)


def _database_stopped(error: BaseException) -> bool:
    """An error of the database driver saying the database rolled the work back, no fault of
    the command's: a conflict (deadlock, serialization), a lock wait or a statement past its
    bound, a statement an operator cancelled, a disk or memory the server ran out of."""
    import asyncpg

    from app.db.errors import (
        is_conflict,
        is_lock_timeout,
        is_out_of_resources,
        is_statement_timeout,
    )

    return isinstance(error, asyncpg.PostgresError) and (
        is_conflict(error)
        or is_lock_timeout(error)
        or is_statement_timeout(error)
        or is_out_of_resources(error)
    )


def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(work())`, a SIGTERM cancelling the work as asyncio.run's Ctrl-C does (a
    second one stops it where it is held, should the loop not have turned for a second since,
    as a second Ctrl-C does); `main` then says the command was stopped by it. `_Termination`
    raised a KeyboardInterrupt wherever the main thread was when Ctrl-C is ignored (a command a
    shell started in the background): inside the loop's own code it left the command hanging as
    the loop closed, or killed by SIGSEGV, its partial file left behind; and one while the loop
    was made left it half made ("Exception ignored" on stderr at exit). The work is made in the
    loop, so that no signal finds it made and never run ("coroutine ... was never awaited")."""
    import asyncio

    terminate = signal.getsignal(signal.SIGTERM)
    if not isinstance(terminate, _Termination):  # not `main`'s (a test calling a command)
        return asyncio.run(work())
    import time

    task: asyncio.Task[T] | None = None
    cancelled: float | None = None  # when the work was cancelled, until the loop turned since

    def turned() -> None:
        nonlocal cancelled
        cancelled = None

    def cancel() -> None:  # in the main thread, as asyncio.run's Ctrl-C handler
        nonlocal cancelled
        if task is not None and not task.done():
            task.cancel()
            cancelled = time.monotonic()
            task.get_loop().call_soon_threadsafe(turned)  # wakes the loop from its wait

    def stuck() -> bool:
        """The loop has not turned for a second since the work was cancelled: its thread is
        held in a call (a write to a pipe nobody reads), which the cancel cannot reach."""
        return cancelled is not None and time.monotonic() - cancelled >= 1

    async def cancellable() -> T:
        nonlocal task
        task = asyncio.current_task()
        if terminate.came:  # before the work began
            raise asyncio.CancelledError
        return await work()

    terminate.cancel, terminate.stuck = cancel, stuck
    try:
        with asyncio.Runner() as runner:
            done = runner.run(cancellable())
    except asyncio.CancelledError:
        if not terminate.came:
            raise
        raise KeyboardInterrupt from None
    finally:
        terminate.cancel = terminate.stuck = None
    if terminate.came:  # as the loop closed: stopped all the same, the result unused
        raise KeyboardInterrupt
    return done


class _Termination:
    """SIGTERM handled as Ctrl-C: the work is cancelled and what it opened closed (a partial
    export file removed, the embedded PostgreSQL stopped), where SIGTERM's default would kill
    the process and leave them. `came`: it was received. `cancel`: what cancels the work of the
    command's event loop, while it runs (`_run`); `stuck`: whether that cancel cannot reach it."""

    def __init__(self) -> None:
        self.came = False
        self.cancel: Callable[[], None] | None = None
        self.stuck: Callable[[], bool] | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.came:  # a second SIGTERM changes nothing (nor cuts the first one's cleanup)...
            if self.stuck is not None and self.stuck():
                raise KeyboardInterrupt  # ...unless the first one's cancel cannot reach the work
            return
        self.came = True
        if self.cancel is not None:
            self.cancel()
            return
        interrupt = signal.getsignal(signal.SIGINT)
        if callable(interrupt):  # Python's, or asyncio.run's (which cancels its task)
            interrupt(signal.SIGINT, frame)
        else:  # Ctrl-C ignored (a command started in the background by a shell)
            raise KeyboardInterrupt


# The standard streams `_closed_streams_held` holds on /dev/null.
_HELD_ON_DEVNULL: set[int] = set()


def _a_held_stream(path: str) -> bool:
    """`path` names (through its links) a standard stream closed when the command started,
    now held on /dev/null: /dev/stdout, /dev/fd/1, /proc/self/fd/1 with `>&-`."""
    name = os.path.abspath(path)
    for _ in range(40):  # (as the system follows links)
        fd = re.fullmatch(r"/(?:proc/self|dev)/fd/(\d+)", name)
        if fd:
            return int(fd[1]) in _HELD_ON_DEVNULL
        if not os.path.islink(name):
            return False
        name = os.path.normpath(os.path.join(os.path.dirname(name), os.readlink(name)))
    return False


def _closed_streams_held() -> None:
    """Standard streams closed when the command started (`<&-`, `>&-`, `2>&-`), which Python
    makes None, held open on /dev/null: no file, socket or pipe the command opens takes their
    descriptor, which a library or a child process (PostgreSQL) writes to as standard error or
    output. Standard error becomes a stream that writes nowhere, where `print(file=None)` wrote
    to standard output (into an export written there) and `sys.stderr.isatty()` failed (the
    export, the import, `engram reembed` once it had reset the vectors, without a word).
    Standard input and output stay None: a command that needs one says it is closed."""
    for fd, stream in enumerate((sys.stdin, sys.stdout, sys.stderr)):
        if stream is not None:
            continue
        try:
            os.fstat(fd)
            continue  # open again since (taken by what Python opened first): left as it is
        except OSError:
            pass
        held = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if held != fd:
            os.dup2(held, fd)
            os.close(held)
        _HELD_ON_DEVNULL.add(fd)
        os.set_inheritable(fd, True)  # as a standard stream is, for the children
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (until exit)


def main(argv: list[str] | None = None) -> int:
    # First, before the modules the command needs are imported (a tenth of a second or more):
    # Ctrl-C or SIGTERM while they are is told in one line too, not as a KeyboardInterrupt
    # traceback or a silent kill. (A signal handler is the main thread's.) `engram serve`
    # replaces it with its own once its event loop runs (`_serve`).
    _closed_streams_held()
    terminate = _Termination()
    handled = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, terminate) if handled else None
    args: argparse.Namespace | None = None
    try:
        from app.observability import logs

        logs.configure()  # quiet libraries (alembic, uvicorn) from the first line
        args = parser().parse_args(argv)
        return _command(args)
    except KeyboardInterrupt as e:
        how = "stopped by SIGTERM" if terminate.came else "interrupted"
        if args is None:
            print(f"engram {how} while starting", file=sys.stderr)
        else:
            after = e.said if isinstance(e, _StoppedAfter) else _INTERRUPTED.get(args.command)
            _say(f"engram {args.command} {how}" + (f": {after}" if after else ""), args.command)
        return 128 + (signal.SIGTERM if terminate.came else signal.SIGINT)
    finally:
        if handled:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


if __name__ == "__main__":
    raise SystemExit(main())
