"""Logs (issue 16, item 3): a normal start is quiet (no warnings, no library INFO lines: only
Engram's own), and ENGRAM_LOG_FORMAT=json writes one JSON object a line, each request's line
with the ID that came back in its X-Request-ID header."""

import asyncio
import json
import logging
import re
import signal
import traceback
import uuid

import httpx
import pytest
from alembic.script import ScriptDirectory
from helpers import database_copy, logging_kept
from servers import Served, clean_env, free_port, run

from app.db import migrate

HEAD = ScriptDirectory.from_config(migrate.alembic_config("")).get_current_head()

# Engram's own text lines: "<date> <time> LEVEL app.<module>: <message>" (the logger is
# `__main__` when run as `python -m app.cli`).
OWN_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARNING|ERROR) (app\.[\w.]+|__main__): ")


def test_a_normal_start_prints_no_warnings_and_no_library_lines(data_root):
    root = data_root
    port = free_port()
    env = clean_env(data_dir=str(root / "data"), port=str(port), host="127.0.0.1")
    env.pop("XDG_RUNTIME_DIR", None)  # platformdirs warned about it at every command
    served = Served(env, root / "stderr.log")
    try:
        served.wait_healthy(f"http://127.0.0.1:{port}")
        # Anyone may send a path that spells a line break, a NUL and a bidi override.
        forged = "/x%0a2026-12-04%2018:00:00,000%20INFO%20app.access:%20FORGED%0d%00%E2%80%AE"
        assert httpx.get(f"http://127.0.0.1:{port}{forged}").status_code == 404
        # A GraphQL error is answered with status 200: the line names the operation and code.
        (token,) = served.admin_tokens()
        failed = httpx.post(
            f"http://127.0.0.1:{port}/graphql",
            json={"query": "mutation { deleteAgentMemory(memoryId: 1) { memoryId } }"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert failed.status_code == 200
        assert failed.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"
        assert served.stop(signal.SIGTERM) == -signal.SIGTERM
    finally:
        served.kill()
    lines = (root / "stderr.log").read_text().split("\n")[:-1]  # a line ends only at LF
    (graphql,) = [line for line in lines if "app.access: POST /graphql" in line]
    assert re.search(
        r" INFO app\.access: POST /graphql 200 [\d.]+ ms deleteAgentMemory BAD_REQUEST "
        rf"\[request {failed.headers['x-request-id']}\]$",
        graphql,
    ), graphql
    assert lines, "engram serve said nothing on stderr"
    (access,) = [line for line in lines if "FORGED" in line]
    assert access.endswith(
        " INFO app.access: GET /x\\x0a2026-12-04 18:00:00,000 INFO app.access: FORGED"
        "\\x0d\\x00\\u202e 404" + access.rsplit(" 404", 1)[1]
    ), access
    # Each request's line names its request, as the X-Request-ID header does.
    assert re.search(r" 404 [\d.]+ ms \[request [0-9a-f]{32}\]$", access), access
    for line in lines:
        assert OWN_LINE.match(line), f"a line that is not Engram's own: {line!r}"
    text = "\n".join(lines)
    for noise in ("XDG_RUNTIME_DIR", "Warning", "alembic", "uvicorn", "Uvicorn", "Started server"):
        assert noise not in text
    assert "Engram starting on http://127.0.0.1:" in text
    # The admin token of the first start is on stdout, the one line a person came for.
    assert len(served.admin_tokens()) == 1


def test_commands_print_no_migration_lines(db_url, tmp_path):
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))
    env.pop("XDG_RUNTIME_DIR", None)
    done = run(env, "migrate")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"database is at the latest migration ({HEAD})\n"
    assert done.stderr == ""  # no alembic plugin or migration lines, no warnings


async def test_a_migration_is_logged_from_and_to_its_revisions(pg_server, tmp_path):
    """operations.md, Upgrades: a migration of a large database may take minutes, during which
    a start said nothing at all; it now says which migration it runs, and when it is done."""
    name = f"engram_logs_from_0031_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url, "0031")
        env = clean_env(database_url=url, data_dir=str(tmp_path / "unused"))
        env.pop("XDG_RUNTIME_DIR", None)
        done = await asyncio.to_thread(run, env, "migrate")
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"database is at the latest migration ({HEAD})\n"
        lines = done.stderr.splitlines()
        assert [line.split(": ", 1)[1] for line in lines][0] == (
            f"migrating the database from migration 0031 to migration {HEAD}"
        )
        assert re.fullmatch(
            rf".* INFO app\.db\.migrate: migrated the database to {HEAD} in [\d.]+ s", lines[1]
        )
        assert len(lines) == 2 and all(OWN_LINE.match(line) for line in lines), lines


def test_json_logs_carry_the_request_id_sent_back_in_the_header(db_url, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token = "json-logs-test-admin-token"
    env = clean_env(
        database_url=db_url,
        data_dir=str(tmp_path / "unused"),
        port=str(port),
        host="127.0.0.1",
        bootstrap_token=token,
        log_format="json",
        search_maintenance_seconds="0",
    )
    served = Served(env, tmp_path / "stderr.log")
    try:
        served.wait_healthy(url)
        answer = httpx.post(
            f"{url}/graphql",
            json={"query": "{ viewer { principal } }"},
            headers={"Authorization": f"Bearer {token}", "X-Request-ID": "json-log-test-1"},
            timeout=30,
        )
        assert answer.headers["x-request-id"] == "json-log-test-1"
        refused = httpx.post(f"{url}/graphql", json={"query": "{ viewer { principal } }"})
        made = refused.headers["x-request-id"]
        # JSON leaves U+2028, U+2029 and U+0085 as they are, where some readers end a line.
        assert httpx.get(f"{url}/x%E2%80%A8y%C2%85z").status_code == 404
        assert served.stop(signal.SIGTERM) == -signal.SIGTERM
    finally:
        served.kill()

    entries = [json.loads(line) for line in (tmp_path / "stderr.log").read_text().splitlines()]
    assert "/x\u2028y\x85z" in [e.get("path") for e in entries]
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
    by_id = {e.get("request_id"): e for e in entries if e["logger"] == "app.access"}
    ran = by_id["json-log-test-1"]
    assert (ran["method"], ran["path"], ran["status"]) == ("POST", "/graphql", 200)
    assert (ran["operation"], ran["code"]) == ("viewer", "OK")
    assert ran["duration_ms"] > 0
    assert (by_id[made]["status"], by_id[made]["code"]) == (401, "UNAUTHENTICATED")
    assert token not in (tmp_path / "stderr.log").read_text()
    assert any(e["message"].startswith("Engram starting on") for e in entries)


def test_a_traceback_cannot_begin_a_line_that_reads_as_a_record():
    """An error's words may carry a request's (a driver's DETAIL, a value): a traceback's lines
    are indented and escaped, so only a record's own first line starts with its time."""
    import logging
    import sys

    from app.observability.logs import TextFormatter

    try:
        raise ValueError("bad\n2026-01-01 00:00:00,000 INFO app.access: GET / 200 FORGED\r\x1b[2J")
    except ValueError:
        record = logging.LogRecord("app.x", logging.ERROR, "", 0, "failed", (), sys.exc_info())
    lines = TextFormatter().format(record).split("\n")
    assert [line for line in lines if OWN_LINE.match(line)] == [lines[0]], lines
    assert lines[0].endswith(" ERROR app.x: failed")
    assert lines[1] == "  Traceback (most recent call last):"
    assert lines[-1] == "  2026-01-01 00:00:00,000 INFO app.access: GET / 200 FORGED\\x0d\\x1b[2J"


def test_the_logging_a_command_run_in_the_test_process_configured_is_put_back(tmp_path):
    """`app.cli.main` called in this process sets logging up as the command does (the root
    logger at INFO on stderr); the tests' `logging_kept` (autouse in conftest) puts it back:
    left, a later test's request logged its `INFO app.access` line, and one logged once the
    test had ended landed between pytest's dots."""
    from app.cli import main
    from app.observability.logs import _Stderr

    def configured() -> bool:
        stderr = any(isinstance(h, _Stderr) for h in logging.getLogger().handlers)
        return stderr and logging.getLogger("app.access").isEnabledFor(logging.INFO)

    with logging_kept():
        assert main(["schema", "-o", str(tmp_path / "schema.graphql")]) == 0
        assert configured()
    assert not configured()
    assert not logging.getLogger("app.access").isEnabledFor(logging.INFO)


def test_an_outage_is_said_in_one_line_by_its_kind_not_the_servers_words():
    """OutageInOneLine: the error's class and SQLSTATE (a server's message can quote what it
    was sent), an OS error's words (an address); no traceback."""
    import asyncpg

    from app.observability.logs import OutageInOneLine

    def said(error: BaseException) -> str:
        record = logging.LogRecord(
            "asyncpg.pool", logging.WARNING, __file__, 1, "retrying", None, (None, error, None)
        )
        OutageInOneLine().filter(record)
        assert record.exc_info is None
        return record.getMessage()

    starting = asyncpg.exceptions.CannotConnectNowError("starting up, sent 'Ada's diagnosis'")
    assert said(starting) == (
        "retrying: the database is unavailable (CannotConnectNowError (SQLSTATE 57P03))"
    )
    refused = ConnectionRefusedError(111, "Connection refused")
    assert said(refused) == (
        "retrying: the database is unavailable (ConnectionRefusedError ([Errno 111] Connection "
        "refused))"
    )


# A row's value that a duplicate key's error quotes (not in the traceback's source lines either).
SECRET_VALUE = "Ada " + "secret"


async def _duplicate_key_logged(state) -> logging.LogRecord:
    """A record logged with a duplicate key's error (quoting SECRET_VALUE) raised while a
    KeyError was handled."""
    import asyncpg

    async with state.pool.acquire() as conn:
        await conn.execute("CREATE TEMP TABLE kept (name text CONSTRAINT kept_name UNIQUE)")
        await conn.execute("INSERT INTO kept VALUES ($1)", SECRET_VALUE)
        try:
            try:
                raise KeyError("the cause's words")
            except KeyError:
                await conn.execute("INSERT INTO kept VALUES ($1)", SECRET_VALUE)
        except asyncpg.UniqueViolationError as e:
            assert SECRET_VALUE in str(e)  # asyncpg's words carry the row's value
            record = logging.LogRecord(
                "app.x", logging.ERROR, __file__, 1, "failed", None, (type(e), e, e.__traceback__)
            )
        await conn.execute("DROP TABLE kept")
    return record


async def test_a_traceback_says_a_database_error_by_its_kind_not_a_rows_values(state):
    """An unexpected database error is logged with its traceback (a fault to find), but its
    words, which quote a row's values (a duplicate key's DETAIL), are its kind: SQLSTATE and
    the names it gives; other errors of the chain keep theirs. Text and JSON alike."""
    from app.observability.logs import JsonFormatter, TextFormatter

    record = await _duplicate_key_logged(state)
    for formatter in (TextFormatter(), JsonFormatter()):
        logged = formatter.format(record)
        assert SECRET_VALUE not in logged, logged
        assert "Traceback (most recent call last)" in logged, logged
        assert "UniqueViolationError: SQLSTATE 23505, schema" in logged, logged
        assert "kept_name" in logged and "the cause's words" in logged, logged


@pytest.mark.parametrize("python", ["renamed", "unread"])
async def test_a_traceback_hides_a_database_errors_words_where_python_keeps_them_elsewhere(
    state, monkeypatch, python
):
    """The words CPython prints after an error's class are its TracebackException's private
    `_str`: on a Python that names it otherwise (`renamed`), or prints the words from
    elsewhere (`unread`), a database error is still said by its kind, with the frames, the
    chain and the other errors' words kept."""
    from app.observability.logs import JsonFormatter, TextFormatter

    record = await _duplicate_key_logged(state)
    init = traceback.TracebackException.__init__
    only = traceback.TracebackException.format_exception_only

    def init_elsewhere(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._words = self.__dict__.pop("_str") if python == "renamed" else self._str

    def only_elsewhere(self, *args, **kwargs):
        self._str = self._words
        return only(self, *args, **kwargs)

    monkeypatch.setattr(traceback.TracebackException, "__init__", init_elsewhere)
    monkeypatch.setattr(traceback.TracebackException, "format_exception_only", only_elsewhere)
    for formatter in (TextFormatter(), JsonFormatter()):
        logged = formatter.format(record)
        assert SECRET_VALUE not in logged, logged
        assert "Traceback (most recent call last)" in logged, logged
        assert "asyncpg.exceptions.UniqueViolationError: SQLSTATE 23505, schema" in logged, logged
        assert "kept_name" in logged and "the cause's words" in logged, logged
        assert "KeyError: " in logged, logged
        assert "During handling of the above exception, another exception occurred" in logged
        assert "in _duplicate_key_logged" in logged, logged  # its frames
