"""Plumbing shared by the tests: in-process GraphQL, test databases and settings, and waiting
for what a background task or another process does."""

import asyncio
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from app.auth.caller import Caller
from app.auth.policies import ADMIN_POLICIES
from app.auth.service import ensure_default_account
from app.config import Settings
from app.db import migrate
from app.db.embedded import EmbeddedPostgres
from app.db.pool import create_pool
from app.embeddings.base import Embedder
from app.graphql.context import Context
from app.graphql.schema import schema
from app.main import request_bounds
from app.observability import logs
from app.runtime.model import MODEL, ModelClient
from app.services import start_services, stop_services
from app.state import AppState


@dataclass
class Result:
    data: dict[str, Any] | None
    errors: list[dict[str, Any]]

    @property
    def codes(self) -> list[str]:
        return [e["extensions"]["code"] for e in self.errors]

    def ok(self) -> dict[str, Any]:
        assert not self.errors, self.errors
        assert self.data is not None
        return self.data


class GQL:
    """Runs GraphQL operations in process, as a given caller."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    async def __call__(self, caller: Caller, query: str, **variables: Any) -> Result:
        result = await schema.execute(
            query, variable_values=variables, context_value=Context(self.state, caller)
        )
        errors = [e.formatted for e in result.errors or []]
        return Result(
            json.loads(json.dumps(result.data, default=str)) if result.data else None, errors
        )


@contextmanager
def logging_kept() -> Iterator[None]:
    """Logging as it was before, put back on exit. `app.cli.main` called in the test process
    configures it as the command does (app.observability.logs.configure: the root logger at
    INFO, writing to stderr); left, every later test's request logged its `INFO app.access`
    line to stderr, and one logged after the test ended (the server's thread logs once the
    answer is sent) landed between pytest's dots, the capture being suspended between a test's
    phases."""
    root = logging.getLogger()
    named = [logging.getLogger(name) for name in (*logs.QUIET_LOGGERS, "uvicorn.access")]
    handlers, level = list(root.handlers), root.level
    levels = [(logger, logger.level, logger.disabled) for logger in named]
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        for logger, was, disabled in levels:
            logger.setLevel(was)
            logger.disabled = disabled


# tmpfs when the machine gives it room: on this project's test host, copying a test's database
# from the template and dropping it took ~0.35 s on the ext4 disk and ~0.02 s in /dev/shm, and
# every test does both (and each `engram serve` test runs initdb).
_SHM = Path("/dev/shm")
_SHM_ROOM = 4 * 1024**3


def scratch_dir(prefix: str) -> Path:
    """A new directory for an embedded PostgreSQL's data: in /dev/shm when it is writable with
    4 GiB free, else in /tmp. Not pytest's tmp_path: pytest sessions running beside this one make
    /tmp/pytest-of-<user> private again, and the embedded server runs as its own system user,
    who must reach the directory. The caller removes it."""
    parent = None
    if os.access(_SHM, os.W_OK) and shutil.disk_usage(_SHM).free >= _SHM_ROOM:
        parent = _SHM
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


@asynccontextmanager
async def database_copy(
    server: EmbeddedPostgres, template: str | None, name: str
) -> AsyncIterator[str]:
    """A database copied from `template` (None: an empty one, not migrated), dropped on exit;
    yields its URL."""
    # FILE_COPY copies the template's files rather than writing each block to the WAL: half the
    # time for a template this small (on tmpfs, 0.015 s against 0.03 s).
    copy = f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else ""
    conn = await asyncpg.connect(server.uri())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"{copy}')
    finally:
        await conn.close()
    try:
        yield server.uri(name)
    finally:
        conn = await asyncpg.connect(server.uri())
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@asynccontextmanager
async def running_state(
    settings: Settings, db_url: str, embedder: Embedder, *, model: bool
) -> AsyncIterator[AppState]:
    """The app's state on `db_url`, its services started (the `state` fixture's); `model`: its
    turns talk to the scripted model server at settings.model_base_url."""
    # Bounded as the service's pool is (app/main.py), by the test's settings.
    pool = await create_pool(db_url, min_size=1, max_size=8, limits=request_bounds(settings))
    state = AppState(settings=settings, pool=pool, embedder=embedder)
    await start_services(state)
    if model:
        # A retried model call waits 10 ms, not half a second.
        state.services[MODEL] = ModelClient(settings, backoff_seconds=0.01)
    try:
        yield state
    finally:
        await stop_services(state)
        await pool.close()


async def default_admin(state: AppState) -> Caller:
    """The default account's admin: every action on every resource."""
    async with state.pool.acquire() as conn:
        account_id = await ensure_default_account(conn)
    return Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)


T = TypeVar("T")


async def upgraded_from(
    server: EmbeddedPostgres,
    revision: str,
    account: uuid.UUID,
    action: uuid.UUID,
    written: Callable[[asyncpg.Connection], Awaitable[None]],
    read: Callable[[asyncpg.Connection], Awaitable[T]],
) -> T:
    """What `read` finds once a database at migration `revision`, holding an account, its
    action (version 1) and what `written` wrote there, is upgraded to the newest migration."""
    name = f"engram_from_{revision}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    async with database_copy(server, None, name) as url:
        migrate.upgrade(url, revision)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'a')", account)
            await conn.execute(
                "INSERT INTO actions (account_id, action_id, current_version) VALUES ($1, $2, 1)",
                account,
                action,
            )
            await written(conn)
        finally:
            await conn.close()
        migrate.upgrade(url)
        conn = await asyncpg.connect(url)
        try:
            return await read(conn)
        finally:
            await conn.close()


def db_settings(db_url: str, **values: Any) -> Settings:
    """A test's settings: its own database, and no background search maintenance (tests that
    need a round run it themselves)."""
    return Settings(database_url=db_url, search_maintenance_seconds=0, **values)


def wait_until(
    check: Callable[[], bool], what: str, seconds: float = 30.0, every: float = 0.02
) -> None:
    """Polls `check` (a thread or a process with no event to wait on) until true; fails after
    `seconds`."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(every)


@asynccontextmanager
async def holding(url: str, sql: str, *args: object) -> AsyncIterator[asyncpg.Connection]:
    """Another client's transaction holding the locks `sql` takes, until the block ends."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(sql, *args)
            yield conn
    finally:
        await conn.close()


async def stored_earlier(url: str, session_id: str, earlier: str) -> None:
    """Renames the session `session_id` to `earlier` in every table that holds session IDs
    (foreign keys and triggers off for the transaction): a session an earlier release stored
    under an ID that a new session may no longer have."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            tables = await conn.fetch(
                "SELECT c.table_name FROM information_schema.columns c"
                " JOIN information_schema.tables t USING (table_schema, table_name)"
                " WHERE c.table_schema = 'public' AND c.column_name = 'session_id'"
                " AND t.table_type = 'BASE TABLE'"
            )
            for row in tables:
                await conn.execute(
                    f'UPDATE "{row[0]}" SET session_id = $2 WHERE session_id = $1',
                    session_id,
                    earlier,
                )
    finally:
        await conn.close()


async def end_other_backends(url: str) -> int:
    """Ends every backend of the database at `url` but the asking one, as a restart of
    PostgreSQL ends its clients' connections; returns how many."""
    conn = await asyncpg.connect(url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity, pg_terminate_backend(pid)"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    finally:
        await conn.close()


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], what: str, seconds: float = 10.0
) -> None:
    """Awaits `check` (a predicate, sync or async) until true, for what a background task or
    another process does with no event to wait on (a sweep, a maintenance round, a request to
    the scripted model server); fails after `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds

    async def holds() -> bool:
        result = check()
        return bool(await result) if inspect.isawaitable(result) else bool(result)

    while not await holds():
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within {seconds} s"
        await asyncio.sleep(0.05)
