"""The app served for a test: in a thread of this process (`serving`), or as `engram serve`
child processes (`Served`) and `engram` commands (`run`) with an environment of their own."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from helpers import wait_until
from openai_server import loopback_socket

from app.config import Settings
from app.embeddings.static import StaticEmbedder
from app.main import create_app


@contextmanager
def serving(settings: Settings, embedder: StaticEmbedder) -> Iterator[str]:
    """Runs the app in a background thread (its own event loop) until the block ends."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(settings, embedder=embedder), log_level="warning", log_config=None
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server failed to start"
        return server.started

    wait_until(started, "the server started")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


_CHECKOUT = str(Path(__file__).resolve().parents[1])


def engram_command() -> list[str]:
    script = shutil.which("engram")
    return [script] if script else [sys.executable, "-m", "app.cli"]


def clean_env(**engram: str) -> dict[str, str]:
    """This process's environment without any ENGRAM_* setting, plus `engram`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update({f"ENGRAM_{k.upper()}": v for k, v in engram.items()})
    # The command runs this checkout's code, not whichever one `pip install -e` pointed at.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_CHECKOUT, env.get("PYTHONPATH")]))
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*engram_command(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run_closed(env: dict[str, str], closed: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`engram ARGS` started with descriptor `closed` (0, 1 or 2) closed, as a shell's `<&-`,
    `>&-` or `2>&-` leaves it, the other two of stdin/stdout/stderr captured where open. Run as
    `python -m app.cli`, not the `engram` script, which may be a shell script (pyenv's) that
    takes the closed descriptor for itself."""
    captured = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    captured.pop({1: "stdout", 2: "stderr"}.get(closed, ""), None)
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        preexec_fn=lambda: os.close(closed),
        text=True,
        timeout=120,
        check=False,
        **captured,
    )


# A parent that adopts what its descendants leave behind and never reaps it, as an init that
# does not reap (Linux): it runs the command given, passes SIGTERM on, and ends as it ended.
# Should it die, its child is killed (PR_SET_PDEATHSIG), not left serving.
NON_REAPING_PARENT = [
    sys.executable,
    "-c",
    """
import ctypes, os, signal, subprocess, sys
prctl = ctypes.CDLL(None).prctl
prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
child = subprocess.Popen(sys.argv[1:], preexec_fn=lambda: prctl(1, signal.SIGKILL, 0, 0, 0))
signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
code = child.wait()  # waits for this child only
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
""",
]


class Served:
    """`engram serve` as a child process (or a child of `parent`, a command that runs the one
    it is given), its stdout collected line by line."""

    def __init__(self, env: dict[str, str], log: Path, parent: Sequence[str] = ()) -> None:
        self.lines: list[str] = []
        self._stderr = log.open("w")
        self.log = log
        self.proc = subprocess.Popen(
            [*parent, *engram_command(), "serve"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_healthy(self, url: str, timeout: float = 60) -> None:
        def healthy() -> bool:
            assert self.proc.poll() is None, f"engram serve exited: {self.log.read_text()}"
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(healthy, "engram serve healthy", timeout, every=0.1)
        except AssertionError as failed:
            raise AssertionError(f"{failed}: {self.log.read_text()}") from None

    def admin_tokens(self) -> list[str]:
        prefix = "Engram admin token (shown once, keep it safe): "
        return [line.strip()[len(prefix) :] for line in self.lines if line.startswith(prefix)]

    def stop(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self._reader.join(timeout=5)
            self._stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_graphql(url: str, token: str, query: str, **variables: Any) -> dict[str, Any]:
    """A GraphQL operation over HTTP that must succeed; returns its data."""
    response = httpx.post(
        f"{url}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    return _data(response)


async def posted_graphql(url: str, token: str, query: str, **variables: Any) -> dict[str, Any]:
    """`post_graphql` awaited, from a test's event loop (which may be serving the app)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        response = await http.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
        )
    return _data(response)


def _data(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]
