"""Migrating while others serve or start: processes starting together migrate one at a time
(docs/scaling.md, an advisory lock), and one that waits for another's migration says so, and
stops at once on SIGTERM; migration 0032 holds the service's reads up 5 s at most, and 0033
its writes."""

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


async def test_migration_0032_holds_reads_up_seconds_at_most_and_runs_again(pg_server):
    """Migration 0032 swaps an index of agent_memories in one transaction. Its DROP INDEX
    waited for every transaction already on the table (here one left open, as an export's or
    a long search's), and every read of the table queued behind it, refused past the service's
    lock bound (CONFLICT, 10 s) for as long as that transaction ran. It now waits 5 s at most,
    fails and is rolled back, and runs once that transaction has ended."""
    name = f"engram_swap_0032_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url, "0031")
        reader = await asyncpg.connect(url)
        other = await asyncpg.connect(url, server_settings={"lock_timeout": "10s"})
        try:
            running = reader.transaction()
            await running.start()
            await reader.fetchval("SELECT count(*) FROM agent_memories")
            migrating = asyncio.ensure_future(asyncio.to_thread(migrate.upgrade, url))
            deadline = time.monotonic() + 60
            while not await other.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INDEX%agent_memories_session%'"
            ):
                assert not migrating.done(), migrating.result()
                assert time.monotonic() < deadline, "the migration never waited"
                await asyncio.sleep(0.05)
            # A read waits for the swap, within the service's lock bound.
            assert await other.fetchval("SELECT count(*) FROM agent_memories") == 0
            with pytest.raises(MigrationFailed) as failed:
                await asyncio.wait_for(migrating, 60)
            assert "migration 0032 failed (canceling statement due to lock timeout)" in str(
                failed.value
            )
            assert await other.fetchval("SELECT version_num FROM alembic_version") == "0031"
            await running.rollback()
            assert await asyncio.to_thread(migrate.upgrade, url) == HEAD
            columns = await other.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'agent_memories_session'"
            )
            assert "(account_id, action_id, session_id, created, memory_id)" in columns
        finally:
            await reader.close()
            await other.close()


async def test_migration_0033_holds_writes_up_seconds_at_most_and_runs_again(pg_server):
    """Migration 0033 builds an index of agent_memories, which waits for the writes already
    running (here a transaction left open after its write, as an import's or a turn's), while
    the writes that come meanwhile queue behind it. It waits 5 s at most, fails and is rolled
    back, and runs once that transaction has ended; reads go on meanwhile."""
    name = f"engram_build_0033_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url, "0032")
        writer = await asyncpg.connect(url)
        other = await asyncpg.connect(url, server_settings={"lock_timeout": "10s"})
        try:
            running = writer.transaction()
            await running.start()
            await writer.execute("UPDATE agent_memories SET version = version WHERE false")
            migrating = asyncio.ensure_future(asyncio.to_thread(migrate.upgrade, url))
            deadline = time.monotonic() + 60
            while not await other.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INDEX%agent_memories_kind%'"
            ):
                assert not migrating.done(), migrating.result()
                assert time.monotonic() < deadline, "the migration never waited"
                await asyncio.sleep(0.05)
            # A read goes on while the build waits.
            assert await other.fetchval("SELECT count(*) FROM agent_memories") == 0
            with pytest.raises(MigrationFailed) as failed:
                await asyncio.wait_for(migrating, 60)
            assert "migration 0033 failed (canceling statement due to lock timeout)" in str(
                failed.value
            )
            assert await other.fetchval("SELECT version_num FROM alembic_version") == "0032"
            await running.rollback()
            assert await asyncio.to_thread(migrate.upgrade, url) == HEAD
            columns = await other.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'agent_memories_kind'"
            )
            assert "(account_id, action_id, kind, created, memory_id)" in columns
        finally:
            await writer.close()
            await other.close()
