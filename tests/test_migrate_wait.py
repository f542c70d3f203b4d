"""Processes starting together migrate one at a time (docs/scaling.md, an advisory lock): one
that waits for another's migration says so, and SIGTERM ends its wait at once."""

import asyncio
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from alembic.script import ScriptDirectory
from servers import Served, clean_env, engram_command, free_port

from app.db import migrate

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
