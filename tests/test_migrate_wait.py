"""Migrating while others serve or start: processes starting together migrate one at a time
(docs/scaling.md, an advisory lock), and one that waits for another's migration says so, and
stops at once on SIGTERM; migration 0032 holds the service's reads up 5 s at most, 0033 its
writes, and 0035 (dropping session_recalls) those of sessions."""

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
from alembic.script import ScriptDirectory
from helpers import database_copy
from servers import Served, clean_env, engram_command, free_port

from app.db import migrate
from app.db.errors import MigrationFailed

HEAD = ScriptDirectory.from_config(migrate.alembic_config("")).get_current_head()
WAITING = "INFO app.db.migrate: another process is migrating the database: waiting for it to finish"


@asynccontextmanager
async def another_process_migrating(db_url: str) -> AsyncIterator[None]:
    """The migration lock held, as by another process migrating the database."""
    holder = await asyncpg.connect(db_url)
    try:
        await holder.execute("SELECT pg_advisory_lock(hashtext('engram.migrate'))")
        yield
    finally:
        await holder.close()


async def _said(log: Path, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while WAITING not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        await asyncio.sleep(0.05)
    return log.read_text()


async def test_a_process_waiting_for_another_ones_migration_says_so(db_url, tmp_path):
    """The one that waits says why it is not starting, rather than nothing for as long as the
    other migrates, and goes on once the other is done."""
    log = tmp_path / "migrate.log"
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))
    async with another_process_migrating(db_url):
        with log.open("w") as stderr:
            waiting = subprocess.Popen(
                [*engram_command(), "migrate"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        try:
            await _said(log)
            assert waiting.poll() is None  # still waiting for the lock
        except BaseException:
            waiting.kill()
            raise
    out, _ = await asyncio.to_thread(waiting.communicate, timeout=60)
    assert waiting.returncode == 0, log.read_text()
    assert out == f"database is at the latest migration ({HEAD})\n"


async def test_sigterm_ends_a_start_waiting_for_another_ones_migration(db_url, tmp_path):
    """operations.md: SIGTERM while starting ends the start. While `engram serve` waited for
    another process's migration, the wait went on in a thread that nothing could stop, and the
    process ended only once the other released the lock (a long migration: minutes)."""
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"), port=str(free_port()))
    async with another_process_migrating(db_url):
        served = Served(env, tmp_path / "serve.log")
        try:
            await _said(served.log)
            served.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(served.proc.wait, 15)  # the lock still held
        finally:
            served.kill()
    log = served.log.read_text()
    assert code == 128 + signal.SIGTERM, log
    assert "Traceback" not in log, log
    assert log.splitlines()[-1] == "engram: stopped by SIGTERM while starting", log


# Each migration that builds an index of agent_memories in one transaction, with what it waits
# for: (revision, the one before, what an open transaction has done, the index, its columns).
INDEX_BUILDS = [
    # 0032 swaps an index: its DROP INDEX waited for every transaction already on the table
    # (one left open, as an export's or a long search's), and every read of the table queued
    # behind it, refused past the service's lock bound (CONFLICT, 10 s) for as long as that
    # transaction ran.
    pytest.param(
        "0032",
        "0031",
        "SELECT count(*) FROM agent_memories",
        "agent_memories_session",
        "(account_id, action_id, session_id, created, memory_id)",
        id="0032 holds reads up",
    ),
    # 0033 builds an index: it waits for the writes already running (a transaction left open
    # after its write, as an import's or a turn's), while the writes that come meanwhile queue
    # behind it; reads go on.
    pytest.param(
        "0033",
        "0032",
        "UPDATE agent_memories SET version = version WHERE false",
        "agent_memories_kind",
        "(account_id, action_id, kind, created, memory_id)",
        id="0033 holds writes up",
    ),
]


async def waits_for_a_lock(
    conn: asyncpg.Connection, migrating: asyncio.Future, statement: str
) -> None:
    """Returns once the migration's statement (its text LIKE `statement`) waits for a lock."""
    deadline = time.monotonic() + 60
    while not await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        statement,
    ):
        assert not migrating.done(), migrating.result()
        assert time.monotonic() < deadline, "the migration never waited"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(("revision", "before", "held", "index", "columns"), INDEX_BUILDS)
async def test_an_index_build_waits_seconds_at_most_and_runs_again(
    pg_server, revision, before, held, index, columns
):
    """A migration that builds an index of agent_memories waits 5 s at most for a transaction
    already on the table, fails and is rolled back (the database stays at the revision before),
    and runs once that transaction has ended; a read goes on, or waits within the service's lock
    bound, meanwhile."""
    name = f"engram_build_{revision}_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url, before)
        holder = await asyncpg.connect(url)
        other = await asyncpg.connect(url, server_settings={"lock_timeout": "10s"})
        try:
            running = holder.transaction()
            await running.start()
            await holder.execute(held)
            migrating = asyncio.ensure_future(asyncio.to_thread(migrate.upgrade, url))
            await waits_for_a_lock(other, migrating, f"%INDEX%{index}%")
            assert await other.fetchval("SELECT count(*) FROM agent_memories") == 0
            with pytest.raises(MigrationFailed) as failed:
                await asyncio.wait_for(migrating, 60)
            assert f"migration {revision} failed (canceling statement due to lock timeout)" in str(
                failed.value
            )
            assert await other.fetchval("SELECT version_num FROM alembic_version") == before
            await running.rollback()
            assert await asyncio.to_thread(migrate.upgrade, url) == HEAD
            made = await other.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE indexname = $1", index
            )
            assert columns in made
        finally:
            await holder.close()
            await other.close()


async def test_0035_drops_session_recalls_waiting_seconds_at_most(pg_server):
    """Migration 0035 drops `session_recalls`, which nothing reads or writes. The drop takes the
    ACCESS EXCLUSIVE lock of `sessions` too (its foreign key's triggers are there): it waits 5 s
    at most for a transaction already on `sessions`, the reads that come meanwhile wait behind it
    within the service's lock bound, and it fails and is rolled back (the table still there),
    then runs once that transaction has ended, and the table is gone."""
    name = f"engram_drop_0035_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url, "0034")
        holder = await asyncpg.connect(url)
        other = await asyncpg.connect(url, server_settings={"lock_timeout": "10s"})
        try:
            assert await other.fetchval("SELECT to_regclass('session_recalls')") is not None
            running = holder.transaction()
            await running.start()
            await holder.execute("SELECT count(*) FROM sessions")  # as a turn's or an export's
            migrating = asyncio.ensure_future(asyncio.to_thread(migrate.upgrade, url))
            await waits_for_a_lock(other, migrating, "%DROP TABLE%session_recalls%")
            # A read of sessions queues behind the drop, and goes on once it gives up.
            assert await other.fetchval("SELECT count(*) FROM sessions") == 0
            with pytest.raises(MigrationFailed) as failed:
                await asyncio.wait_for(migrating, 60)
            assert "migration 0035 failed (canceling statement due to lock timeout)" in str(
                failed.value
            )
            assert await other.fetchval("SELECT version_num FROM alembic_version") == "0034"
            assert await other.fetchval("SELECT to_regclass('session_recalls')") is not None
            await running.rollback()
            assert await asyncio.to_thread(migrate.upgrade, url) == HEAD
            assert await other.fetchval("SELECT to_regclass('session_recalls')") is None
        finally:
            await holder.close()
            await other.close()
