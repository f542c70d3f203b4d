"""Test fixtures: one embedded PostgreSQL per test session, a fresh database per test.

The schema is migrated once into a template database; each test's database is a copy of
it (CREATE DATABASE ... TEMPLATE), so tests never share rows and need no clean-up.

A test that names `model_server` (or a module marked `usefixtures("model_server")`) gets an app
whose turns talk to that scripted model server; `@pytest.mark.settings(name=value, ...)` on a
test or a module sets the test's settings beyond the defaults.
"""

import asyncio
import itertools
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from browser import stop_shared_browser
from helpers import (
    GQL,
    database_copy,
    db_settings,
    default_admin,
    logging_kept,
    running_state,
    scratch_dir,
)
from openai_server import OpenAIServer
from runtime_support import scripted_model
from servers import serving

from app.auth.caller import Caller
from app.config import Settings
from app.db import migrate
from app.db.embedded import EmbeddedPostgres
from app.db.pool import create_pool
from app.embeddings.static import StaticEmbedder
from app.services import start_services, stop_services
from app.state import AppState

_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "settings(**values): the test's settings beyond defaults")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker a core this process may run on, at most four. Each worker starts
    its own embedded PostgreSQL (and the browser tests a Chromium); most of a test's time is
    waiting on them, so two workers on two cores take the suite from ~14 to ~6.5 minutes, and
    more buy little."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(4, cores or 1)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test calling `app.cli.main` in this process configures logging as the command does:
    put back after it (helpers.logging_kept)."""
    with logging_kept():
        yield


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    root = scratch_dir("engram-test-")
    server = EmbeddedPostgres(root / "pgdata")
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
async def _shared_browser_stopped() -> AsyncIterator[None]:
    """The browser tests' shared Chromium (browser.py), stopped once the session ends."""
    yield
    await stop_shared_browser()


@pytest.fixture(scope="session")
def embedder() -> StaticEmbedder:
    return StaticEmbedder()


@pytest.fixture(scope="session")
def template_db(pg_server: EmbeddedPostgres, embedder: StaticEmbedder) -> str:
    """A migrated database, with the embedding model fixed, to copy for each test."""

    async def create() -> None:
        conn = await asyncpg.connect(pg_server.uri())
        try:
            await conn.execute("DROP DATABASE IF EXISTS engram_template")
            await conn.execute("CREATE DATABASE engram_template")
        finally:
            await conn.close()

    asyncio.run(create())
    url = pg_server.uri("engram_template")
    migrate.upgrade(url)

    async def fix_embedding() -> None:
        pool = await create_pool(url, min_size=1, max_size=1)
        settings = Settings(database_url=url, search_maintenance_seconds=0)
        state = AppState(settings=settings, pool=pool, embedder=embedder)
        await start_services(state)
        await stop_services(state)
        await pool.close()

    asyncio.run(fix_embedding())
    return "engram_template"


@pytest.fixture
async def db_url(pg_server: EmbeddedPostgres, template_db: str) -> AsyncIterator[str]:
    name = f"engram_test_{os.getpid()}_{next(_counter)}"
    async with database_copy(pg_server, template_db, name) as url:
        yield url


@pytest.fixture
def model_server() -> Iterator[OpenAIServer]:
    """The scripted model server (runtime_support.scripted_model)."""
    with scripted_model() as server:
        yield server


def _uses_model_server(request: pytest.FixtureRequest) -> bool:
    return "model_server" in request.fixturenames


@pytest.fixture
def settings(request: pytest.FixtureRequest, db_url: str) -> Settings:
    """The test's own database; the scripted model server, without retries, when the test uses
    it; then the values of its `settings` markers (the closest wins)."""
    values: dict[str, Any] = {}
    if _uses_model_server(request):
        server: OpenAIServer = request.getfixturevalue("model_server")
        values.update(model_base_url=server.url, model_max_retries=0)
    for mark in reversed(list(request.node.iter_markers("settings"))):
        values.update(mark.kwargs)
    return db_settings(db_url, **values)


@pytest.fixture
async def state(
    request: pytest.FixtureRequest, settings: Settings, db_url: str, embedder: StaticEmbedder
) -> AsyncIterator[AppState]:
    async with running_state(settings, db_url, embedder, model=_uses_model_server(request)) as s:
        yield s


@pytest.fixture
async def admin(state: AppState) -> Caller:
    """The default account's admin: every action on every resource."""
    return await default_admin(state)


@pytest.fixture
def gql(state: AppState) -> GQL:
    return GQL(state)


@pytest.fixture
def base_url(settings: Settings, embedder: StaticEmbedder, state: AppState) -> Iterator[str]:
    """The test's app (its settings, on its database) served over HTTP on loopback."""
    with serving(settings, embedder) as url:
        yield url


@pytest.fixture
def data_root() -> Iterator[Path]:
    """A directory for `engram serve`'s data and logs (helpers.scratch_dir), removed after the
    test."""
    root = scratch_dir("engram-serve-")
    yield root
    shutil.rmtree(root, ignore_errors=True)
