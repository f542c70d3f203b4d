"""Deployment defaults (issue 11, item 9): compose publishes no known admin token and runs
with the production checks, the image keeps its data in a volume, and introspection is a
setting, for authenticated clients only."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import get_args

import httpx
import pytest
from helpers import db_settings
from pydantic import SecretStr
from servers import serving

from app.config import Settings

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "a" * 64
INTROSPECT = {"query": "{ __schema { queryType { name } } }"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::([?-])([^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}`."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise LookupError(rest)
        return rest if kind == "-" else ""

    return _VARIABLE.sub(one, value)


def compose_seconds(duration: str) -> float:
    """A compose duration ("2m", "150s", "1m30s", "1h") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 0.000001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def engram_environment(env: dict[str, str]) -> dict[str, str]:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["engram"]
    return {k: interpolate(str(v), env) for k, v in service["environment"].items()}


def test_compose_gives_the_admin_token_as_a_secret_and_runs_in_production(monkeypatch, tmp_path):
    """The token is no variable of the container's (`docker inspect` and /proc/PID/environ show
    those): compose makes ENGRAM_BOOTSTRAP_TOKEN where it runs, which has no default, a secret,
    a file in the container that only the image's user may read, and names that file."""
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text
    compose = yaml.safe_load(text)
    engram = compose["services"]["engram"]
    env = engram_environment({})
    assert env["ENGRAM_ENVIRONMENT"] == "production"
    assert not {"ENGRAM_BOOTSTRAP_TOKEN", "ENGRAM_DATABASE_URL_FILE"} & set(env)
    [secret] = engram["secrets"]
    assert compose["secrets"][secret["source"]] == {"environment": "ENGRAM_BOOTSTRAP_TOKEN"}
    assert env["ENGRAM_BOOTSTRAP_TOKEN_FILE"] == f"/run/secrets/{secret['source']}"
    assert "target" not in secret
    image = (ROOT / "Dockerfile").read_text()
    uid = re.search(r"useradd .*--uid (\d+)", image)[1]
    gid = re.search(r"groupadd .*--gid (\d+)", image)[1]
    assert (secret["uid"], secret["gid"], secret["mode"]) == (uid, gid, 0o400)
    # The image's own settings plus compose's, the secret's file where the container has it,
    # pass the production checks...
    for key in list(os.environ):
        if key.startswith("ENGRAM_"):
            monkeypatch.delenv(key)
    for key, value in {**dockerfile_env(), **env}.items():
        monkeypatch.setenv(key, value)
    token = tmp_path / secret["source"]
    token.write_text(TOKEN)  # the variable's value alone, as compose writes it
    monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN_FILE", str(token))
    settings = Settings()
    assert settings.environment == "production" and settings.host == "0.0.0.0"
    assert settings.bootstrap_token_value() == TOKEN
    # ...which refuse a short token.
    token.write_text("short")
    with pytest.raises(ValueError, match="at least 32 characters"):
        Settings()


def dockerfile_env() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text()
    block = re.search(r"^ENV (.*?)(?:\n\n|\n[A-Z])", text, re.S | re.M)
    assert block is not None
    return dict(re.findall(r"(ENGRAM_\w+)=(\S+)", block.group(1)))


def dockerfile_steps() -> list[tuple[str, str]]:
    """The image's COPY and RUN instructions in order, each RUN as its shell gets it (the lines
    a backslash continues joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", "")
    return re.findall(r"^(COPY|RUN) (.*)$", text, re.M)


def run_with_pip_recorded(command: str, where: Path) -> list[str]:
    """`command` run by a shell in `where`, `python` this interpreter and `pip` a stand-in that
    records its arguments (and the requirements file it is given) instead of installing."""
    bin_dir = where / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "python").symlink_to(sys.executable)
        pip = bin_dir / "pip"
        pip.write_text(
            "#!/bin/sh\n"
            'echo "$*" >> pip-calls\n'
            '[ "$1 $2" = "install -r" ] && cp "$3" pip-requirements\n'
            "exit 0\n"
        )
        pip.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", command], cwd=where, env=env, check=True, timeout=60)
    return (where / "pip-calls").read_text().splitlines()


def test_the_image_installs_the_dependencies_in_a_layer_the_code_leaves(tmp_path):
    """A change to the code reinstalls the package, not every dependency: the dependencies are
    installed when pyproject.toml is all the image has copied (a layer only it changes), as
    pyproject.toml lists them (its build backend and dependencies, no extra: tests, otel and
    minilm stay optional); the code is copied after, and installed without dependencies
    (`pip check` fails the build should one be missing)."""
    steps = dockerfile_steps()
    installs = [i for i, (kind, line) in enumerate(steps) if kind == "RUN" and "pip" in line]
    assert len(installs) == 2, installs
    dependencies, package = installs
    assert [line for kind, line in steps[:dependencies] if kind == "COPY"] == ["pyproject.toml ./"]
    copied = [line.split()[0] for kind, line in steps[dependencies:package] if kind == "COPY"]
    assert sorted(copied) == ["README.md", "app", "migrations"], copied

    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert run_with_pip_recorded(steps[dependencies][1], tmp_path) == [
        "install -r requirements.txt"
    ]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = project["build-system"]["requires"] + project["project"]["dependencies"]
    assert (tmp_path / "pip-requirements").read_text().splitlines() == listed
    assert not (tmp_path / "requirements.txt").exists()  # not left in the image

    (tmp_path / "pip-calls").unlink()
    assert run_with_pip_recorded(steps[package][1], tmp_path) == [
        "install --no-deps --no-build-isolation -e .",
        "check",
    ]


def test_the_image_declares_the_data_volume_its_settings_name():
    text = (ROOT / "Dockerfile").read_text()
    data_dir = dockerfile_env()["ENGRAM_DATA_DIR"]
    assert re.search(rf'^VOLUME \["?{re.escape(data_dir)}"?\]$', text, re.M)


def test_the_image_runs_unprivileged_and_checks_the_port_it_serves():
    text = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)$", text, re.M)
    assert user is not None and user.group(1) not in ("root", "0")
    assert re.search(rf"chown {user.group(1)}:\S+ {dockerfile_env()['ENGRAM_DATA_DIR']}", text)
    check = re.search(r"^HEALTHCHECK .*?\n\s+CMD (.*)$", text, re.M)
    assert check is not None and "ENGRAM_PORT" in check.group(1)


def dockerignore_sends(path: str, patterns: list[str]) -> bool:
    """Whether Docker sends `path` (relative, with '/') in the build context: the last pattern
    of .dockerignore matching it or a folder above it decides ('!' lets it in)."""

    def regex(pattern: str) -> re.Pattern[str]:
        parts = re.split(r"(\*\*/|\*\*|\*|\?|\[[^]]*\])", pattern.strip("/"))
        glob = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        return re.compile(
            "".join(glob.get(p) or (p if p.startswith("[") else re.escape(p)) for p in parts)
        )

    folders = path.split("/")
    candidates = ["/".join(folders[: i + 1]) for i in range(len(folders))]
    sent = True
    for line in patterns:
        exception = line.startswith("!")
        if any(regex(line.removeprefix("!")).fullmatch(c) for c in candidates):
            sent = exception
    return sent


def test_the_build_context_holds_what_the_image_copies_and_nothing_else():
    text = (ROOT / "Dockerfile").read_text()
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    copied = {name for line in re.findall(r"^COPY (.+) \S+$", text, re.M) for name in line.split()}
    assert copied == {"pyproject.toml", "README.md", "app", "migrations"}, copied
    for name in copied:
        for file in [ROOT / name, *(ROOT / name).rglob("*")]:
            if not file.is_file():
                continue
            path = file.relative_to(ROOT).as_posix()
            assert dockerignore_sends(path, patterns) == ("__pycache__" not in path), path
    # History, tests, benchmarks, caches, and what a developer keeps beside the code.
    for path in [
        ".git/HEAD",
        "tests/test_deployment.py",
        "bench/README.md",
        "docs/README.md",
        ".mypy_cache/3.11/app/config.meta.json",
        ".hypothesis/examples/0/1",
        ".pytest_cache/v/cache/lastfailed",
        "engram.egg-info/PKG-INFO",
        ".env",
        ".venv/bin/python",
        ".data/pgdata/PG_VERSION",
        "app/__pycache__/config.cpython-311.pyc",
        "app/memory/__pycache__/store.cpython-311.pyc",
        "app/stray.pyc",
    ]:
        assert not dockerignore_sends(path, patterns), path


def test_compose_restarts_the_service_and_waits_for_a_database_that_serves_tcp():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    db, engram = compose["services"]["db"], compose["services"]["engram"]
    assert engram["restart"] == db["restart"] == "unless-stopped"
    assert "-h 127.0.0.1" in " ".join(db["healthcheck"]["test"])
    assert engram["depends_on"]["db"]["condition"] == "service_healthy"
    # Time for running turns to finish when stopped: a turn's deadline, and its commit.
    grace = compose_seconds(engram["stop_grace_period"])
    assert grace > Settings().turn_timeout_seconds, engram["stop_grace_period"]
    # Room in /dev/shm for an index build of the default build memory.
    build = Settings.model_fields["agent_index_build_memory"].default
    assert build.endswith("GB") and db["shm_size"].endswith("gb")
    assert int(db["shm_size"][:-2]) >= int(build[:-2])


async def test_introspection_is_for_authenticated_clients_and_can_be_turned_off(db_url, embedder):
    admin = {"Authorization": f"Bearer {TOKEN}"}
    on = db_settings(db_url, bootstrap_token=TOKEN)
    with serving(on, embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            anonymous = await http.post("/graphql", json=INTROSPECT)
            assert anonymous.status_code == 401
            assert anonymous.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
            allowed = await http.post("/graphql", json=INTROSPECT, headers=admin)
            assert allowed.json() == {"data": {"__schema": {"queryType": {"name": "Query"}}}}
            page = await http.get("/graphql", headers={"accept": "text/html"})
            assert "introspection is turned off" not in page.text

    off = db_settings(db_url, bootstrap_token=TOKEN, introspection=False)
    with serving(off, embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            refused = await http.post("/graphql", json=INTROSPECT, headers=admin)
            body = refused.json()
            assert body["data"] is None
            (error,) = body["errors"]
            assert error["extensions"]["code"] == "BAD_REQUEST"
            assert "ENGRAM_INTROSPECTION" in error["message"]
            by_type = {"query": '{ __type(name: "Query") { name } }'}
            refused = await http.post("/graphql", json=by_type, headers=admin)
            assert refused.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"
            # Queries run, __typename included; GraphiQL says why it has no schema.
            typename = {"query": "{ __typename viewer { principal } }"}
            ran = await http.post("/graphql", json=typename, headers=admin)
            assert ran.json() == {"data": {"__typename": "Query", "viewer": {"principal": "admin"}}}
            page = await http.get("/graphql", headers={"accept": "text/html"})
            assert page.status_code == 200 and "GraphiQL" in page.text
            assert "introspection is turned off on this server" in page.text


def test_the_image_and_compose_name_what_the_code_has():
    """Read against the code, as docker cannot run here: the image runs `engram serve`, a
    command the CLI has, exposes and publishes the port its ENGRAM_PORT names, probes /healthz,
    a route of the app, on that port, and every ENGRAM_* variable the image and compose set is
    a setting, or a secret setting's file."""
    from app.cli import parser
    from app.main import create_app

    yaml = pytest.importorskip("yaml")
    text = (ROOT / "Dockerfile").read_text()
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    engram = compose["services"]["engram"]
    env = dockerfile_env()

    command = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M)[1])
    assert command[0] == "engram"
    parser().parse_args(command[1:])  # exits on a command the CLI does not have
    assert command[1:] == ["serve"]

    port = env["ENGRAM_PORT"]
    assert re.search(rf"^EXPOSE {port}$", text, re.M)
    assert [p.split(":")[-1] for p in engram["ports"]] == [port]
    routes = {getattr(r, "path", None) for r in create_app(Settings()).routes}
    probes = [
        re.search(r"HEALTHCHECK .*?CMD (.*)$", text, re.S | re.M)[1],
        " ".join(engram["healthcheck"]["test"]),
    ]
    for probe in probes:
        path = re.search(r"127\.0\.0\.1:(?:%s|(\d+))(/\w+)", probe)
        assert path and path[2] in routes, probe
        assert path[1] in (None, port), probe  # %s: ENGRAM_PORT, read in the probe

    named = set(env) | {k for k in engram["environment"] if k.startswith("ENGRAM_")}
    secrets = {
        f"ENGRAM_{name.upper()}_FILE"
        for name, field in Settings.model_fields.items()
        if SecretStr in get_args(field.annotation)
    }
    assert {
        n for n in named - secrets if n.removeprefix("ENGRAM_").lower() not in Settings.model_fields
    } == set()


def test_the_image_healthcheck_passes_on_a_serving_app_and_fails_without(db_url, embedder):
    """The image's HEALTHCHECK command, run as docker runs it (a shell, the image's
    ENGRAM_PORT), exits 0 while the service serves and non-zero once nothing answers."""
    import shlex
    import subprocess
    import sys

    text = (ROOT / "Dockerfile").read_text()
    command = re.search(r"HEALTHCHECK .*?\n\s+CMD (.*)$", text, re.M)[1]
    argv = shlex.split(command)
    assert argv[0] == "python"
    argv[0] = sys.executable

    def probe(port: str) -> int:
        env = {**os.environ, "ENGRAM_PORT": port}
        return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode

    with serving(db_settings(db_url), embedder) as url:
        port = url.rsplit(":", 1)[1]
        assert probe(port) == 0
    assert probe(port) != 0


def test_sigterm_lets_a_running_turn_finish(db_url, model_server, tmp_path):
    """operations.md: once it serves, SIGTERM stops `engram serve` gracefully, taking no new
    requests and finishing those running, turns included (why compose gives it stop time)."""
    import signal
    import threading

    from helpers import wait_until
    from servers import Served, clean_env, free_port, post_graphql

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env(
        database_url=db_url,
        port=str(port),
        bootstrap_token=TOKEN,
        model_base_url=model_server.url,
        search_maintenance_seconds="0",
    )
    served = Served(env, tmp_path / "serve.log")
    try:
        served.wait_healthy(url)
        create = 'mutation { createAction(input: {name: "slow"}) { actionId } }'
        agent = post_graphql(url, TOKEN, create)["createAction"]["actionId"]
        model_server.say("done at last", delay=3)
        turn = (
            'mutation($a: UUID!) { executeAction(input: {actionId: $a, input: "hi"}) '
            "{ status output } }"
        )
        answers: list[dict] = []
        running = threading.Thread(
            target=lambda: answers.append(post_graphql(url, TOKEN, turn, a=agent)), daemon=True
        )
        running.start()
        wait_until(lambda: model_server.chat_requests(), "the turn's model call", 30, every=0.05)
        served.proc.send_signal(signal.SIGTERM)
        running.join(timeout=60)
        assert answers == [{"executeAction": {"status": "SUCCEEDED", "output": "done at last"}}]
        served.proc.wait(timeout=60)
        # The stop said when it began, and what it waited for (uvicorn's own lines are quiet).
        log = served.log.read_text()
        assert "stopping: taking no new requests, finishing the 1 in progress" in log, log
        assert log.index("stopping: ") < log.index("executeAction OK"), log
    finally:
        served.kill()


def test_a_turn_killed_with_its_process_is_failed_by_a_sweep_and_can_be_retried(
    db_url, model_server, tmp_path
):
    """operations.md: a turn still running when its process is killed (a stop past the process
    manager's grace period) stays RUNNING until a process's sweep finds the killed one silent
    past ENGRAM_TURN_LEASE_SECONDS; it is then FAILED, and retried it runs again."""
    import asyncio
    import threading

    import asyncpg
    from helpers import wait_until
    from servers import Served, clean_env, free_port, post_graphql

    from app.executions.liveness_store import DEAD_PROCESS_ERROR

    def started(name: str) -> tuple[Served, str]:
        port = free_port()
        env = clean_env(
            database_url=db_url,
            port=str(port),
            bootstrap_token=TOKEN,
            model_base_url=model_server.url,
            search_maintenance_seconds="0",
            turn_heartbeat_seconds="0.5",
            turn_lease_seconds="2",
        )
        served = Served(env, tmp_path / f"{name}.log")
        url = f"http://127.0.0.1:{port}"
        served.wait_healthy(url)
        return served, url

    def turns() -> list[asyncpg.Record]:
        async def read() -> list[asyncpg.Record]:
            conn = await asyncpg.connect(db_url)
            try:
                return await conn.fetch(
                    "SELECT execution_id, status, error, invocation_number FROM executions"
                )
            finally:
                await conn.close()

        return asyncio.run(read())

    turn = (
        'mutation($a: UUID!, $e: UUID) { executeAction(input: {actionId: $a, input: "hi", '
        "executionId: $e}) { status output invocationNumber } }"
    )
    first, url = started("first")
    second = None
    try:
        create = 'mutation { createAction(input: {name: "slow"}) { actionId } }'
        agent = post_graphql(url, TOKEN, create)["createAction"]["actionId"]
        model_server.say("never sent", delay=60)

        def ask() -> None:
            with pytest.raises(httpx.TransportError):  # its process is killed under it
                httpx.post(
                    f"{url}/graphql",
                    json={"query": turn, "variables": {"a": agent}},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=60,
                )

        running = threading.Thread(target=ask, daemon=True)
        running.start()
        wait_until(lambda: model_server.chat_requests(), "the turn's model call", 30, every=0.05)
        first.kill()  # SIGKILL, as Docker's at the end of stop_grace_period
        running.join(timeout=30)
        [killed] = turns()
        assert killed["status"] == "RUNNING"

        second, url = started("second")
        wait_until(lambda: turns()[0]["status"] == "FAILED", "the sweep", 30, every=0.2)
        assert turns()[0]["error"] == DEAD_PROCESS_ERROR
        model_server.say("done at last")
        retried = post_graphql(url, TOKEN, turn, a=agent, e=str(killed["execution_id"]))
        assert retried["executeAction"] == {
            "status": "SUCCEEDED",
            "output": "done at last",
            "invocationNumber": 2,
        }
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_ci_and_the_image_run_the_readmes_two_commands():
    """README's "The two commands": the image runs the first (its install, in two steps: the
    dependencies pyproject.toml lists, then the package without them, then its CMD), and
    .ci/run the second, as its last line under `set -euo pipefail`, so that a failed install or
    test fails the run; a change to either command fails here until they follow."""
    section = (ROOT / "README.md").read_text().split("\n## The two commands\n")[1]
    section = section.split("\n## ")[0]
    serve, test = re.findall(r"^```sh\n(.*)\n```$", section, re.M)

    text = (ROOT / "Dockerfile").read_text()
    [install] = re.findall(r"^RUN (pip install [^\\&\n]+?)\s*(?:\\|&&|$)", text, re.M)
    command = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M)[1])
    install = install.replace(" --no-deps --no-build-isolation", "")
    assert f"{install} && {' '.join(command)}" == serve

    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK)
    lines = [line for line in ci.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "set -euo pipefail" and lines[-1] == test
    assert "export CI=true" in lines  # the browser and lint tests then fail, not skip
