"""The `engram` command: account and client management against a database, and `engram serve`
on its embedded PostgreSQL, stopped and started again with every row kept."""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from urllib.parse import quote
from uuid import UUID

import asyncpg
import pytest
from helpers import database_copy, scratch_dir
from psycopg.conninfo import conninfo_to_dict
from servers import Served, clean_env, free_port, post_graphql, run, run_closed

from app import cli, config
from app.auth import service
from app.errors import Unauthenticated


def output(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


# --- engram account / client ------------------------------------------------------------------


async def test_cli_manages_accounts_and_clients(db_url, state, admin, tmp_path):
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))
    policy = {
        "effect": "ALLOW",
        "actions": ["SELECT", "INSERT"],
        "resources": ["financial.Action.*"],
    }

    def commands() -> list[dict]:
        account = output(run(env, "account", "create", "  acme  "))
        account_id = account["accountId"]
        created = output(
            run(
                env,
                "client",
                "create",
                "bot",
                "--account",
                account_id,
                "--name",
                "Bot",
                "--policy",
                json.dumps(policy),
            )
        )
        deny = {"effect": "DENY", "actions": ["INSERT"], "resources": ["financial.Action.document"]}
        updated = output(
            run(
                env,
                "client",
                "update",
                "bot",
                "--account",
                account_id,
                "--policy",
                json.dumps(policy),
                "--policy",
                json.dumps(deny),
            )
        )
        token = output(run(env, "client", "token", "bot", "--account", account_id))
        return [account, created, updated, token]

    account, created, updated, token = await asyncio.to_thread(commands)
    assert account["name"] == "acme"
    assert created == {
        "accountId": account["accountId"],
        "principal": "bot",
        "name": "Bot",
        "policies": [policy],
    }
    # What it prints is the client as stored: the name --name gave it, which update kept.
    assert (updated["name"], updated["policies"][1]["effect"]) == ("Bot", "DENY")

    # The printed token authenticates as that client, with the updated policies.
    bot = await service.authenticate(state.pool, f"Bearer {token['token']}")
    assert (str(bot.account_id), bot.principal) == (account["accountId"], "bot")
    assert [p.effect for p in bot.policies] == ["ALLOW", "DENY"]
    stored = await service.get_client(state.pool, admin, account_id=bot.account_id, principal="bot")
    assert stored is not None and stored.name == "Bot"

    deleted = await asyncio.to_thread(
        run, env, "client", "delete", "bot", "--account", account["accountId"]
    )
    assert output(deleted) == {"deleted": "bot"}
    with pytest.raises(Unauthenticated):
        await service.authenticate(state.pool, f"Bearer {token['token']}")


async def test_cli_default_account_client_and_admin_token_note(db_url, state, tmp_path):
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))
    created = await asyncio.to_thread(run, env, "client", "create", "ops")
    assert (output(created)["name"], output(created)["policies"]) == ("ops", [])
    # The first command on a fresh database creates the admin token and says so, once, on stderr.
    assert "Engram admin token (shown once" in created.stderr
    token = await asyncio.to_thread(run, env, "client", "token", "ops")
    assert "admin token" not in token.stderr
    assert "alembic" not in token.stderr  # no migration chatter around the token
    ops = await service.authenticate(state.pool, f"Bearer {output(token)['token']}")
    assert ops.principal == "ops" and ops.in_default_account


async def test_an_empty_client_name_is_refused_by_create_as_by_update(
    db_url, state, admin, tmp_path
):
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))
    made = await asyncio.to_thread(run, env, "client", "create", "blank", "--name", "")
    assert made.returncode == 2 and "Traceback" not in made.stderr, made.stderr
    assert "BAD_REQUEST" in made.stderr and "name" in made.stderr, made.stderr
    assert await service.get_client(state.pool, admin, account_id=None, principal="blank") is None


async def test_serve_shows_the_admin_token_as_its_start_commits_it(
    settings, embedder, state, capsys
):
    """`engram serve`'s start (`start_state`) shows the admin token it made on a fresh database
    as soon as it is stored, before the app serves: a start that fails or is stopped after it
    has shown the token all the same (it was shown by the lifespan, later)."""
    from app.main import start_state

    started = await start_state(settings, embedder)
    try:
        shown = capsys.readouterr().out
        again = await start_state(settings, embedder)  # a second start finds a token: none shown
        await again.stop()
    finally:
        await started.stop()
    prefix = "Engram admin token (shown once, keep it safe): "
    [token] = [line.removeprefix(prefix) for line in shown.splitlines() if prefix in line]
    admin = await service.authenticate(state.pool, f"Bearer {token}")
    assert admin.principal == "admin" and admin.in_default_account
    assert prefix not in capsys.readouterr().out


async def test_a_start_after_every_admin_token_was_revoked_shows_none(
    settings, embedder, state, admin, capsys
):
    """The first start shows the admin token once. A later start whose admin held no token (an
    operator had revoked each, a leaked one among them) made another and showed it, as `first
    start`, into the service's output, which a process manager keeps as a log: it shows none,
    and `engram client token admin` issues the admin one (docs/access.md)."""
    from app.main import start_state

    prefix = "Engram admin token (shown once, keep it safe): "
    first = await start_state(settings, embedder)
    await first.stop()
    assert prefix in capsys.readouterr().out
    for token in await service.list_client_tokens(
        state.pool, admin, account_id=None, principal="admin"
    ):
        await service.revoke_client_token(
            state.pool, admin, account_id=None, principal="admin", token_id=token.token_id
        )
    again = await start_state(settings, embedder)
    await again.stop()
    assert prefix not in capsys.readouterr().out
    assert (
        await service.list_client_tokens(state.pool, admin, account_id=None, principal="admin")
        == []
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["client", "create", "x", "--policy", "{not json"],
            "error (BAD_REQUEST): --policy '{not json' is not JSON",
        ),
        (
            ["client", "create", "x", "--policy", '"ALLOW"'],
            "error (BAD_REQUEST): policies[0] must be an object",
        ),
        (
            [
                "client",
                "create",
                "x",
                "--policy",
                '{"effect":"ALLOW","actions":["READ"],"resources":["*"]}',
            ],
            "error (BAD_REQUEST): policies[0].actions: 'READ' is not one of",
        ),
        (
            ["client", "token", "x", "--account", "not-a-uuid"],
            "error (BAD_REQUEST): --account 'not-a-uuid' is not an account ID",
        ),
        (["export", "--action", "nope"], "error (BAD_REQUEST): 'nope' is not an action ID"),
        (
            ["client", "revoke-token", "admin", "nope"],
            "error (BAD_REQUEST): 'nope' is not a token ID (a UUID)",
        ),
        (
            ["client", "revoke-issued", "nope"],
            "error (BAD_REQUEST): 'nope' is not a token ID (a UUID)",
        ),
        (
            ["client", "token", "ghost"],
            "error (NOT_FOUND): client 'ghost' not found in the default account: a client of "
            "another account needs --account ID",
        ),
        (["client", "delete", "ghost"], "error (NOT_FOUND): client 'ghost' not found"),
        # Listing only reads: on this database, which no start of the service made the default
        # account of, it is refused, and makes none (tests/test_transfer.py).
        (
            ["client", "tokens", "ghost"],
            "error (NOT_FOUND): this database has no default account yet",
        ),
        (["client", "delete", "admin"], "error (BAD_REQUEST): a client cannot delete itself"),
        (
            ["account", "create", " "],
            "error (BAD_REQUEST): account name must be 1 to 200 characters",
        ),
        (
            ["client", "create", "x", "--account", "00000000-0000-0000-0000-000000000000"],
            "error (NOT_FOUND): account 00000000-0000-0000-0000-000000000000 not found",
        ),
    ],
)
async def test_cli_errors_are_one_line_and_exit_2(db_url, monkeypatch, capsys, args, message):
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    code = await asyncio.to_thread(cli.main, args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err


async def test_listing_the_admins_tokens_before_any_start_made_the_admin_says_what_makes_it(
    db_url, admin, tmp_path
):
    """An import on a new deployment makes the default account, not its admin (a start does).
    `engram client tokens admin` then said the admin was not in the default account and that
    "a client of another account needs --account ID", which sent the operator looking for the
    admin elsewhere."""
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))
    done = await asyncio.to_thread(run, env, "client", "tokens", "admin")
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error (NOT_FOUND): client 'admin' not found in the default account: `engram serve`, or "
        "a client or account command that writes, makes it (docs/access.md)"
    ), done.stderr


async def test_cli_policy_takes_a_list_as_access_md_writes_several(db_url, monkeypatch, capsys):
    """`--policy` given a JSON list, such as docs/access.md's "everything but deleting clients",
    gives the client each policy of it, alongside those of other `--policy` flags."""
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    every = ["SELECT", "INSERT", "UPDATE", "DELETE"]
    listed = [
        {"effect": "ALLOW", "actions": every, "resources": ["financial.*"]},
        {"effect": "DENY", "actions": ["DELETE"], "resources": ["financial.Client.*"]},
    ]
    one = {"effect": "DENY", "actions": ["UPDATE"], "resources": ["financial.Client.token"]}
    args = ["client", "create", "ops", "--policy", json.dumps(listed), "--policy", json.dumps(one)]
    code = await asyncio.to_thread(cli.main, args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["policies"] == [*listed, one]


async def test_cli_printing_what_only_it_can_tell_refuses_standard_output_closed(db_url, tmp_path):
    """Started with standard output closed (`>&-`), which Python makes None: `engram client
    token` issued a token whose secret nobody saw, `engram account create` made an account
    whose ID it never told (print to None writes nothing), exit status 0; `engram schema`
    ended in a traceback (`'NoneType' object has no attribute 'write'`)."""
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))
    output(run(env, "client", "create", "bot"))

    def closed(*args: str) -> subprocess.CompletedProcess[str]:
        return run_closed(env, 1, *args)

    conn = await asyncpg.connect(db_url)
    try:
        accounts = await conn.fetchval("SELECT count(*) FROM accounts")
        said = {
            ("client", "token", "bot"): "the command prints its result there",
            ("account", "create", "acme"): "the command prints its result there",
            ("schema",): "name the file to write with -o FILE",
        }
        for args, why in said.items():
            result = await asyncio.to_thread(closed, *args)
            assert result.returncode == 2, result.stderr
            assert result.stderr == f"engram: standard output is closed: {why}\n", args
        assert await conn.fetchval("SELECT count(*) FROM accounts") == accounts
    finally:
        await conn.close()
    assert output(run(env, "client", "tokens", "bot"))["tokens"] == []
    schema = tmp_path / "schema.graphql"
    assert closed("schema", "-o", str(schema)).returncode == 0
    assert "type Query" in schema.read_text()


def test_version_with_standard_output_closed_says_so():
    """`engram --version` started with standard output closed (`>&-`) printed nothing and
    exited 0, as if it had told the release: it says so in one line, exit status 2, as the
    other commands that print their result do (docs/access.md)."""
    result = run_closed(clean_env(), 1, "--version")
    assert result.returncode == 2, result.stderr
    said = "engram: standard output is closed: the command prints its result there\n"
    assert result.stderr == said
    assert run(clean_env(), "--version").stdout.startswith("engram ")


def test_serve_with_an_empty_host_listens_where_engram_host_says(db_url, tmp_path):
    """`engram serve --host ""` (a script's `--host "$HOST"` with HOST unset) listened on every
    interface, asyncio's reading of an empty host, and said `http://:PORT`; an empty
    ENGRAM_HOST counts as unset (docs/operations.md), and so does the empty flag: it listens
    where ENGRAM_HOST says, 127.0.0.1 by default. An IPv6 address is said in brackets."""
    port = free_port()
    env = clean_env(database_url=db_url, search_maintenance_seconds="0")
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--host", "", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60
        while f"http://127.0.0.1:{port}/graphql" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        # The line comes as the app starts, before uvicorn listens: connect once it does.
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10):
                    break  # listening on loopback
            except ConnectionRefusedError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert "http://:" not in log.read_text()
    assert cli.listen_url("::1", 8000) == "http://[::1]:8000/graphql"
    assert cli.listen_url("127.0.0.1", 8000) == "http://127.0.0.1:8000/graphql"


# --- engram serve on the embedded database ----------------------------------------------------


def test_serve_on_the_embedded_database_keeps_data_across_restarts(data_root):
    data_dir = data_root / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env(data_dir=str(data_dir), port=str(port), host="127.0.0.1")
    policy = {
        "effect": "ALLOW",
        "actions": ["SELECT", "INSERT", "UPDATE"],
        "resources": ["financial.Action.*"],
    }

    first = Served(env, data_root / "first.log")
    try:
        first.wait_healthy(url)
        [admin] = first.admin_tokens()
        account_id = post_graphql(
            url, admin, 'mutation { createAccount(input: {name: "acme"}) { accountId } }'
        )["createAccount"]["accountId"]
        post_graphql(
            url,
            admin,
            "mutation($input: ClientInput!) { createClient(input: $input) { principal } }",
            input={
                "accountId": account_id,
                "principal": "bot",
                "name": "Bot",
                "policies": [policy],
            },
        )
        bot = post_graphql(
            url,
            admin,
            'mutation($a: UUID) { createClientToken(principal: "bot", accountId: $a) { token } }',
            a=account_id,
        )["createClientToken"]["token"]
        action_id = post_graphql(
            url,
            bot,
            'mutation { createAction(input: {name: "support", instructions: "v1"}) { actionId } }',
        )["createAction"]["actionId"]
        post_graphql(
            url,
            bot,
            "mutation($id: UUID!) { updateAction(actionId: $id, "
            'input: {name: "support", instructions: "v2"}) { version } }',
            id=action_id,
        )
        # uvicorn shuts down gracefully, then dies of the signal it was sent, as is conventional.
        assert first.stop(signal.SIGTERM) == -signal.SIGTERM
        assert "Engram stopped" in first.log.read_text()
    finally:
        first.kill()
    # The embedded server stopped with the service.
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()

    second = Served(env, data_root / "second.log")
    try:
        second.wait_healthy(url)
        assert second.admin_tokens() == []  # the first start's token was shown once
        assert (
            post_graphql(url, admin, "{ viewer { principal } }")["viewer"]["principal"] == "admin"
        )
        client = post_graphql(
            url,
            admin,
            'query($a: UUID) { client(principal: "bot", accountId: $a) '
            "{ policies { resources } } }",
            a=account_id,
        )
        assert client["client"]["policies"] == [{"resources": ["financial.Action.*"]}]
        read = (
            "query($id: UUID!, $v: Int) { action(actionId: $id, version: $v) "
            "{ version instructions } }"
        )
        assert post_graphql(url, bot, read, id=action_id)["action"] == {
            "version": 2,
            "instructions": "v2",
        }
        assert post_graphql(url, bot, read, id=action_id, v=1)["action"] == {
            "version": 1,
            "instructions": "v1",
        }
        assert second.stop(signal.SIGINT) == 0
    finally:
        second.kill()
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()


# --- a refused start ------------------------------------------------------------------------


async def test_an_embedder_mismatch_stops_serve_with_one_line_naming_the_command(db_url, state):
    # The database holds another model's vectors (as after a change of ENGRAM_EMBEDDER).
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE deployment SET value = jsonb_set(value, '{name}', '\"other-model\"') "
            "WHERE key = 'embedding'"
        )
    env = clean_env(database_url=db_url, port=str(free_port()), search_maintenance_seconds="0")
    result = await asyncio.to_thread(run, env, "serve")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "other-model" in x]
    assert line.startswith("engram: ") and "run `engram reembed`" in line


def test_a_wrong_setting_is_one_line_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("ENGRAM_PORT", "eighty")
    assert cli.main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("engram: ENGRAM_PORT: ") and len(err.splitlines()) == 1, err
    monkeypatch.delenv("ENGRAM_PORT")
    monkeypatch.setenv("ENGRAM_TURN_LEASE_SECONDS", "1")
    assert cli.main(["migrate"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "ENGRAM_TURN_LEASE_SECONDS must be at least twice" in line


def test_a_wrong_secret_file_is_one_line_naming_it_never_its_content(monkeypatch, capsys, tmp_path):
    path = tmp_path / "database_url"
    path.write_text("mysql://engram:s3cret@db/engram\n")
    monkeypatch.setenv("ENGRAM_DATABASE_URL_FILE", str(path))
    assert cli.main(["schema", "-o", "/dev/null"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    told = f"engram: ENGRAM_DATABASE_URL_FILE ({path}): must be a postgresql:// URL"
    assert line.startswith(told) and "s3cret" not in line, line
    missing = tmp_path / "missing"
    monkeypatch.setenv("ENGRAM_DATABASE_URL_FILE", str(missing))
    assert cli.main(["schema", "-o", "/dev/null"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"engram: ENGRAM_DATABASE_URL_FILE ({missing}) cannot be read: No such file or directory"
    )


UNSENDABLE = (
    "holds a character no HTTP header may carry (a line break or another control character, or "
    "one that is not ASCII)"
)


@pytest.mark.parametrize("name", ["MODEL_API_KEY", "EMBEDDING_API_KEY"])
def test_a_key_no_header_may_carry_is_refused_naming_its_variable(
    monkeypatch, capsys, tmp_path, name
):
    """A file's second line, or a letter that is not ASCII: the service started, and each call
    failed (as a model server that did not answer, or as an internal error)."""
    path = tmp_path / "key"
    path.write_bytes(b"sk-S3CRET\nsk-other\n")
    monkeypatch.setenv(f"ENGRAM_{name}_FILE", str(path))
    assert cli.main(["schema", "-o", "/dev/null"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"engram: ENGRAM_{name}_FILE ({path}): {UNSENDABLE}"
    monkeypatch.delenv(f"ENGRAM_{name}_FILE")
    monkeypatch.setenv(f"ENGRAM_{name}", "sk-S3CRÉT")
    assert cli.main(["schema", "-o", "/dev/null"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"engram: ENGRAM_{name}: {UNSENDABLE}"


PRODUCTION = {"environment": "production", "bootstrap_token": "t" * 32}


@pytest.mark.parametrize(
    ("settings", "told"),
    [
        (
            {"model_allowed_key_envs": "notjson"},
            "ENGRAM_MODEL_ALLOWED_KEY_ENVS: must be a JSON list",
        ),
        ({"model_allowed_key_envs": "FOO"}, "ENGRAM_MODEL_ALLOWED_KEY_ENVS: must be a JSON list"),
        ({"model_allowed_key_envs": "[1, 2]"}, "ENGRAM_MODEL_ALLOWED_KEY_ENVS: item 0: "),
        ({"model_allowed_base_urls": '["x"]'}, "ENGRAM_MODEL_ALLOWED_BASE_URLS: item 0 is not"),
        (
            {"model_allowed_key_envs": '{"TEAM_KEY": ["team-a"]}'},
            "ENGRAM_MODEL_ALLOWED_KEY_ENVS: TEAM_KEY: account 0 is not an account ID (a UUID)",
        ),
        (
            {"model_allowed_base_urls": '{"https://s3cret@team.example": "*"}'},
            "ENGRAM_MODEL_ALLOWED_BASE_URLS: entry 0: must be a list of the account IDs",
        ),
        (
            {"model_allowed_base_urls": '{"http://127.0.0.1:11434/v1": []}'},
            "ENGRAM_MODEL_ALLOWED_BASE_URLS: entry 0 is ENGRAM_MODEL_BASE_URL",
        ),
        ({"model_base_url": "localhost:11434"}, "ENGRAM_MODEL_BASE_URL: must be an http://"),
        ({"pool_min_size": "-1"}, "ENGRAM_POOL_MIN_SIZE: Input should be greater than or"),
        ({"pool_max_size": "0"}, "ENGRAM_POOL_MAX_SIZE: Input should be greater than or"),
        ({"pool_min_size": "11"}, "ENGRAM_POOL_MIN_SIZE must not be more than ENGRAM_POOL_MAX"),
        (
            {"max_connections_per_account": "11"},
            "ENGRAM_MAX_CONNECTIONS_PER_ACCOUNT must not be more than ENGRAM_POOL_MAX_SIZE",
        ),
        ({"account_queue_seconds": "inf"}, "ENGRAM_ACCOUNT_QUEUE_SECONDS: Input should be a fin"),
        ({"max_body_bytes": "0"}, "ENGRAM_MAX_BODY_BYTES: Input should be greater than or"),
        ({"port": "-1"}, "ENGRAM_PORT: Input should be greater than or equal to 1"),
        ({"port": "99999999"}, "ENGRAM_PORT: Input should be less than or equal to 65535"),
        (
            {"model_timeout_seconds": "nan"},
            "ENGRAM_MODEL_TIMEOUT_SECONDS: Input should be a finite",
        ),
        ({"model_timeout_seconds": "1e300"}, "ENGRAM_MODEL_TIMEOUT_SECONDS: Input should be less"),
        ({"model_timeout_seconds": "0"}, "ENGRAM_MODEL_TIMEOUT_SECONDS: Input should be greater"),
        ({"turn_lease_seconds": "1e300"}, "ENGRAM_TURN_LEASE_SECONDS: Input should be less than"),
        ({"turn_timeout_seconds": "-1"}, "ENGRAM_TURN_TIMEOUT_SECONDS: Input should be greater"),
        ({"turn_timeout_seconds": "86401"}, "ENGRAM_TURN_TIMEOUT_SECONDS: Input should be less"),
        ({"turn_timeout_seconds": "inf"}, "ENGRAM_TURN_TIMEOUT_SECONDS: Input should be a finite"),
        ({"turn_heartbeat_seconds": "inf"}, "ENGRAM_TURN_HEARTBEAT_SECONDS: Input should be a fin"),
        ({"search_maintenance_seconds": "inf"}, "ENGRAM_SEARCH_MAINTENANCE_SECONDS: Input should"),
        ({"model_max_retries": "-1"}, "ENGRAM_MODEL_MAX_RETRIES: Input should be greater than"),
        (
            {"model_max_retries": "99999999999"},
            "ENGRAM_MODEL_MAX_RETRIES: Input should be less than or equal to 10",
        ),
        ({"max_tool_calls_per_reply": "0"}, "ENGRAM_MAX_TOOL_CALLS_PER_REPLY: Input should be"),
        ({"max_tool_calls_per_reply": "1025"}, "ENGRAM_MAX_TOOL_CALLS_PER_REPLY: Input should"),
        ({"model_max_reply_bytes": "9999"}, "ENGRAM_MODEL_MAX_REPLY_BYTES: Input should be"),
        ({"model_max_reply_bytes": "1e9"}, "ENGRAM_MODEL_MAX_REPLY_BYTES: Input should be"),
        ({"max_model_calls_per_turn": "0"}, "ENGRAM_MAX_MODEL_CALLS_PER_TURN: Input should be"),
        ({"max_model_calls_per_turn": "1025"}, "ENGRAM_MAX_MODEL_CALLS_PER_TURN: Input should"),
        ({"model_name": " "}, "ENGRAM_MODEL_NAME: must name a model"),
        ({"embedding_model": ""}, "ENGRAM_EMBEDDING_MODEL: must name a model"),
        ({"embedding_batch_size": "0"}, "ENGRAM_EMBEDDING_BATCH_SIZE: Input should be greater"),
        ({"embedding_timeout_seconds": "-1"}, "ENGRAM_EMBEDDING_TIMEOUT_SECONDS: Input should be"),
        ({"embedding_timeout_seconds": "nan"}, "ENGRAM_EMBEDDING_TIMEOUT_SECONDS: Input should be"),
        ({"embedding_dimensions": "0"}, "ENGRAM_EMBEDDING_DIMENSIONS: Input should be greater"),
        ({"max_query_tokens": "0"}, "ENGRAM_MAX_QUERY_TOKENS: Input should be greater than"),
        ({"max_query_depth": "-1"}, "ENGRAM_MAX_QUERY_DEPTH: Input should be greater than"),
        ({"max_json_depth": "257"}, "ENGRAM_MAX_JSON_DEPTH: Input should be less than or equal"),
        ({"max_json_depth": "3"}, "ENGRAM_MAX_JSON_DEPTH: Input should be greater than or equal"),
        ({"agent_index_build_memory": "99999999GB"}, "ENGRAM_AGENT_INDEX_BUILD_MEMORY: must be a"),
        ({"otel_endpoint": "collector:4318"}, "ENGRAM_OTEL_ENDPOINT: must be an http://"),
        ({"database_url": "mysql://engram:s3cret@db/engram"}, "ENGRAM_DATABASE_URL: must be a"),
        # An '@' of a password not percent-encoded: libpq took the rest of it for the host, and
        # the refusal to connect showed it ("cannot connect to the database at s3cret@db...").
        (
            {"database_url": "postgresql://engram:pa@s3cret@db/engram"},
            "ENGRAM_DATABASE_URL: holds '@' more than once before its host",
        ),
        # A '/' of a password not percent-encoded: libpq read "u" as the host and "se" as the
        # port, and the refusal to connect showed them ("... at u:se").
        (
            {"database_url": "postgresql://u:se/cret@127.0.0.1:1/db"},
            "ENGRAM_DATABASE_URL: has a port that is not a number",
        ),
        ({"bootstrap_token": " \n"}, "ENGRAM_BOOTSTRAP_TOKEN: is empty"),
        ({"bootstrap_token": "s3cret\udcff" * 6}, "ENGRAM_BOOTSTRAP_TOKEN: is not valid text"),
        ({"model_name": "gpt\udcff"}, "ENGRAM_MODEL_NAME: is not valid text"),
        (
            {"embedding_dimensions": "3072"},
            "ENGRAM_EMBEDDING_DIMENSIONS: Input should be less than or equal to 2000",
        ),
        (
            {"environment": "test"},
            "ENGRAM_ENVIRONMENT: Input should be 'development' or 'production'",
        ),
        # The production guard: an empty URL is no URL, and any address but loopback is exposed.
        ({**PRODUCTION, "host": "0.0.0.0", "database_url": ""}, "must set ENGRAM_DATABASE_URL"),
        ({**PRODUCTION, "host": "::"}, "(ENGRAM_HOST=::) must set ENGRAM_DATABASE_URL"),
        ({**PRODUCTION, "host": "0"}, "(ENGRAM_HOST=0) must set ENGRAM_DATABASE_URL"),
        ({**PRODUCTION, "host": "192.168.1.5"}, "must set ENGRAM_DATABASE_URL"),
    ],
)
def test_a_wrong_setting_stops_the_command_with_one_line_and_status_2(settings, told):
    result = run(clean_env(**settings), "schema", "-o", "/dev/null")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("engram: ") and told in line, line
    assert "s3cret" not in line


def test_a_value_pydantic_settings_cannot_decode_is_one_line(monkeypatch, capsys):
    # No setting of Engram's is decoded by pydantic-settings now; one added later would be.
    class WithMap(config.Settings):
        labels: dict[str, str] = {}

    monkeypatch.setattr(config, "Settings", WithMap)
    monkeypatch.setenv("ENGRAM_LABELS", "notjson")
    assert cli.main(["schema", "-o", "/dev/null"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("engram: ENGRAM_LABELS: not valid JSON"), line


@pytest.mark.parametrize(
    "args", [["migrate"], ["client", "tokens", "admin"], ["export", "--action", str(UUID(int=1))]]
)
def test_an_unreachable_database_is_one_line_naming_the_host_not_the_password(args):
    url = f"postgresql://engram:s3cret@127.0.0.1:{free_port()}/engram"
    result = run(clean_env(database_url=url), *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "s3cret" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("engram: cannot connect to the database at 127.0.0.1:"), line
    assert "(ENGRAM_DATABASE_URL)" in line


async def test_a_url_naming_its_socket_directory_as_its_host_migrates_and_serves(
    pg_server, tmp_path
):
    """libpq takes a Unix socket's directory, percent-encoded, as a URL's host
    (`postgresql://engram@%2Fvar%2Frun%2Fpostgresql/engram`), and so did every connection of
    the service but the migrations': SQLAlchemy passed `%2Fvar...` on as a host name to
    resolve, and the first command on a new database failed, saying `migration 0001 failed
    (failed to resolve host ...)`."""
    async with database_copy(pg_server, None, "engram_socket_host") as url:
        socket_dir = conninfo_to_dict(url)["host"]
        assert socket_dir.startswith("/")
        url = f"postgresql://postgres@{quote(socket_dir, safe='')}/engram_socket_host"
        env = clean_env(database_url=url, search_maintenance_seconds="0", port=str(free_port()))
        done = await asyncio.to_thread(run, env, "migrate")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("database is at the latest migration ("), done.stdout
        served = Served(env, tmp_path / "serve.log")
        try:
            base = f"http://127.0.0.1:{env['ENGRAM_PORT']}"
            await asyncio.to_thread(served.wait_healthy, base)
            (token,) = served.admin_tokens()
            data = await asyncio.to_thread(post_graphql, base, token, "{ viewer { principal } }")
            assert data == {"viewer": {"principal": "admin"}}
        finally:
            assert served.stop(signal.SIGINT) == 0


def test_a_short_password_is_neither_shown_nor_spelled_by_masking():
    """("on" masked inside the message's words read "c***necti*** refused".) A password inside
    the driver's words is no password there; one that stands as a word of its own withholds
    the message."""
    lines = {}
    for password in ("nec", "on"):
        url = f"postgresql://engram:{password}@127.0.0.1:{free_port()}/engram"
        (lines[password],) = run(clean_env(database_url=url), "migrate").stderr.splitlines()
    for line in lines.values():
        assert "***" not in line, line
        assert line.startswith("engram: cannot connect to the database at 127.0.0.1:"), line
    assert "Connection refused" in lines["nec"]
    assert lines["on"].endswith("(the driver's message is not shown: it holds the password)")


def test_a_database_that_never_answers_is_given_up_on_in_seconds():
    """A server that accepts the connection and never answers (or a firewall that drops it)
    would hold the command for the system's TCP timeout: 10 s, then one line, status 2."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"postgresql://engram@127.0.0.1:{silent.getsockname()[1]}/engram"
        started = time.monotonic()
        result = run(clean_env(database_url=url), "migrate")
        took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("engram: cannot connect to the database at 127.0.0.1:"), line
    assert "timeout" in line and took < 60, (line, took)


@pytest.mark.parametrize(
    ("module", "command"),
    [
        # `main`'s first import, before the arguments are read; the settings' (pydantic's, the
        # slowest); the database driver's, once the settings are read.
        ("app.observability", None),
        ("pydantic_settings", "export"),
        ("psycopg", "export"),
    ],
)
@pytest.mark.parametrize(
    ("sig", "status", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
def test_a_command_interrupted_while_importing_is_one_line(
    tmp_path, module, command, sig, status, said
):
    """Ctrl-C or SIGTERM in the command's first tenth of a second, while Python imports what it
    needs, is told as later: one line, status 130 or 143. The signal is the process's own, sent
    when it first looks for `module`, so that it comes at that point of every run."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        "            sys.meta_path.remove(self)\n"
        f"            os.kill(os.getpid(), {int(sig)})\n"
        "sys.meta_path.insert(0, Interrupt())\n"
    )
    env = clean_env(database_url=f"postgresql://engram@127.0.0.1:{free_port()}/engram")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    out = tmp_path / "agent.jsonl"
    result = run(env, "export", "--action", str(UUID(int=1)), "-o", str(out))
    assert result.returncode == status and "Traceback" not in result.stderr, result
    (line,) = result.stderr.splitlines()
    if command is None:
        assert line == f"engram {said} while starting"
    else:
        assert line == f"engram {command} {said}: {cli._INTERRUPTED[command]}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("sig", "status", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
def test_serve_interrupted_while_importing_after_its_arguments_is_one_line(
    tmp_path, sig, status, said
):
    """`engram serve` stopped while it imports the web server (its arguments read, its own
    handler not yet in place) says so in one line, status 130 or 143, as other commands do:
    SIGTERM killed it silently."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'uvicorn':\n"
        "            sys.meta_path.remove(self)\n"
        f"            os.kill(os.getpid(), {int(sig)})\n"
        "sys.meta_path.insert(0, Interrupt())\n"
    )
    env = clean_env(database_url=f"postgresql://engram@127.0.0.1:{free_port()}/engram")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    result = run(env, "serve", "--port", str(free_port()))
    assert result.returncode == status and "Traceback" not in result.stderr, result
    assert result.stderr.splitlines() == [f"engram serve {said}"]


def _json_lines(stderr: str) -> list[dict]:
    """Each line of `stderr` read as a JSON log object, with the JSON log's fields."""
    entries = [json.loads(line) for line in stderr.splitlines()]
    for entry in entries:
        assert set(entry) == {"time", "level", "logger", "message"}, entry
        assert entry["level"] == "ERROR" and entry["logger"] == "engram", entry
        assert datetime.fromisoformat(entry["time"]).tzinfo is not None, entry
    return entries


async def test_serve_refusals_are_json_log_lines_under_the_json_format(db_url):
    """`engram serve` with ENGRAM_LOG_FORMAT=json says why it does not start as its log does,
    one JSON object a line, where a log collector found text among its JSON: a wrong setting,
    a wrong option, a database a newer release migrated. The exit status is the text format's,
    2; the text format and other commands (read by a person) keep text."""
    port = str(free_port())
    # The word in any case, as the settings read it.
    said = _json_lines(run(clean_env(log_format="JSON", port="abc"), "serve").stderr)
    assert [e["message"] for e in said] == [
        "engram: ENGRAM_PORT: Input should be a valid integer, unable to parse string as an integer"
    ]
    done = run(clean_env(log_format="json", database_url=db_url), "serve", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert [e["message"] for e in _json_lines(done.stderr)] == [
        "engram serve: error: argument --port: must be an integer from 1 to 65535, not 0"
    ]

    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("UPDATE alembic_version SET version_num = '0099_future'")
    finally:
        await conn.close()
    env = clean_env(database_url=db_url, port=port, search_maintenance_seconds="0")
    newer = "revision 0099_future, newer than this release's latest"
    for log_format in ("json", "text"):
        env["ENGRAM_LOG_FORMAT"] = log_format
        done = await asyncio.to_thread(run, env, "serve")
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        if log_format == "json":
            (entry,) = _json_lines(line)
            assert entry["message"].startswith("error (CONFLICT): the database is at revision")
            assert newer in entry["message"]
        else:
            assert line.startswith("error (CONFLICT): the database is at ") and newer in line
    env["ENGRAM_LOG_FORMAT"] = "json"
    done = await asyncio.to_thread(run, env, "migrate")
    assert done.returncode == 2 and done.stderr.startswith("error (CONFLICT): the database is at")


async def test_serve_on_a_database_missing_a_table_says_so_in_one_line(db_url):
    """`engram serve` on a database at the newest migration that lacks one of its tables (a
    restore not finished): one line saying so and what to do, exit status 2, where its start
    ended in a lifespan traceback ("Application startup failed")."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DROP TABLE client_tokens CASCADE")
    finally:
        await conn.close()
    env = clean_env(database_url=db_url, port=str(free_port()), search_maintenance_seconds="0")
    done = await asyncio.to_thread(run, env, "serve")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "engram serve: the database does not hold all of Engram's tables (it is being restored, "
        "or was changed under the command): run it again once the database is restored whole"
    ]


async def test_commands_on_a_database_without_pgvector_say_so_in_one_line(db_url):
    """A database at the newest migration without pgvector's type `vector` (restored onto a
    server where its CREATE EXTENSION failed, or the extension dropped under it): `engram
    serve`, and the commands that open a pool, end in one line saying so, exit status 2, where
    each ended in the traceback of the pool's refusal (SchemaMissing is no driver error)."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DROP EXTENSION vector CASCADE")
    finally:
        await conn.close()
    env = clean_env(database_url=db_url, port=str(free_port()), search_maintenance_seconds="0")
    missing = (
        "the database does not hold all of Engram's tables (it is being restored, or was "
        "changed under the command)"
    )
    for command in ("serve", "maintain-search", "reembed"):
        done = await asyncio.to_thread(run, env, command)
        assert done.returncode == 2, done.stderr
        said = done.stderr.splitlines()
        assert len(said) == 1 and said[0].startswith(f"engram {command}: {missing}: "), said


def test_serve_with_an_unknown_option_says_so_as_a_json_log_line_under_the_json_format():
    """An option `engram serve` does not know is refused by its parser, in words that are JSON
    too under ENGRAM_LOG_FORMAT=json: a log collector reads one object, not a usage text; other
    commands keep text."""
    done = run(clean_env(log_format="json"), "serve", "--bogus", "x")
    assert done.returncode == 2, done.stderr
    assert [e["message"] for e in _json_lines(done.stderr)] == [
        "engram serve: error: unrecognized arguments: --bogus x"
    ]
    # Before the command's name too (`engram --reload serve`): the top-level parser's
    # refusal, as JSON (it was text since that parser refuses what it does not know itself).
    before = run(clean_env(log_format="json"), "--reload", "serve")
    assert before.returncode == 2, before.stderr
    assert [e["message"] for e in _json_lines(before.stderr)] == [
        "engram: error: unrecognized arguments: --reload"
    ]
    text = run(clean_env(), "serve", "--bogus")
    assert text.returncode == 2
    assert text.stderr.splitlines()[-1] == "engram serve: error: unrecognized arguments: --bogus"
    other = run(clean_env(log_format="json"), "migrate", "--bogus")
    assert other.returncode == 2
    assert other.stderr.splitlines()[-1] == "engram migrate: error: unrecognized arguments: --bogus"


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["import", "agent.jsonl", "--bogus"],
            "engram import: error: unrecognized arguments: --bogus",
        ),
        (["import", "a.jsonl", "b.jsonl"], "engram import: error: unrecognized arguments: b.jsonl"),
        # An argument it does not know is told before a required one that is missing, which
        # argparse checks first: it named only the file, and the wrong argument went unsaid.
        (["import", "--bogus"], "engram import: error: unrecognized arguments: --bogus"),
        (["export", "--bogus", "x"], "engram export: error: unrecognized arguments: --bogus x"),
        (
            ["client", "create", "--bogus"],
            "engram client create: error: unrecognized arguments: --bogus",
        ),
        (["client", "--bogus"], "engram client: error: unrecognized arguments: --bogus"),
        (
            ["client", "--bogus", "tokens"],
            "engram client: error: unrecognized arguments: --bogus",
        ),
        (["import"], "engram import: error: the following arguments are required: file"),
        (
            ["import", "a.jsonl", "--batch-size", "0"],
            "engram import: error: argument --batch-size: must be an integer at least 1, not 0",
        ),
        (
            ["export", "--action", "x", "--bogus"],
            "engram export: error: unrecognized arguments: --bogus",
        ),
        (
            ["client", "create", "bot", "--bogus", "x"],
            "engram client create: error: unrecognized arguments: --bogus x",
        ),
        (
            ["account", "create", "a", "b"],
            "engram account create: error: unrecognized arguments: b",
        ),
        (["reembed", "--bogus"], "engram reembed: error: unrecognized arguments: --bogus"),
    ],
)
def test_a_commands_wrong_argument_is_told_by_the_command_with_its_usage(args, said):
    """Every wrong argument of a command, one it does not know too, is told as argparse tells
    the others (`engram import: error: argument --batch-size: ...`): the command's usage, then
    one line naming the command and what is wrong, exit status 2. An argument it did not know
    was left to the top-level parser, which printed its usage of every command (three lines)
    and named no command (`engram: error: unrecognized arguments: --bogus`)."""
    done = run(clean_env(), *args)
    assert done.returncode == 2, done.stderr
    command = said.split(":")[0]
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"usage: {command} [-h]"), lines
    assert lines[-1] == said and "{serve," not in done.stderr, lines
    assert done.stdout == ""


@pytest.mark.parametrize(
    "args, usage",
    [
        (["export", "--help"], "usage: engram export [-h] --action ACTION [--account ACCOUNT]"),
        (["export", "-h"], "usage: engram export [-h] --action ACTION [--account ACCOUNT]"),
        (["--help"], "usage: engram [-h] [--version]"),
    ],
)
def test_help_shows_a_required_option_as_required(args, usage):
    """`engram export --help` shows `--action ACTION` without brackets, as its refusal without
    it does (docs/access.md: `--action ID` (required)): its usage read `[--action ACTION]`,
    printed by the pass that looks for unknown arguments with every argument made optional."""
    done = run(clean_env(), *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(usage), done.stdout


@pytest.mark.parametrize(
    "args, said",
    [
        # An option before any command was told as a missing command, --bogus unsaid.
        (["--bogus"], "engram: error: unrecognized arguments: --bogus"),
        (["--bogus", "serve"], "engram: error: unrecognized arguments: --bogus"),
        # Before a command that is missing a required argument: its own pass ran inside the
        # top level's, and named only what it missed (import's file, client's command).
        (["--bogus", "import"], "engram: error: unrecognized arguments: --bogus"),
        (["--bogus", "client", "tokens"], "engram: error: unrecognized arguments: --bogus"),
        ([], "engram: error: the following arguments are required: command"),
    ],
)
def test_the_top_level_wrong_argument_is_named(args, said):
    """`engram` with an option it does not know names the option, with the usage of every
    command, exit status 2; with no command at all, says one is required."""
    done = run(clean_env(), *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("usage: engram [-h]") and "{serve," in done.stderr, lines
    assert lines[-1] == said, lines


@pytest.mark.parametrize("command", ["client", "account"])
def test_a_missing_subcommand_is_said_by_what_it_may_be(command):
    """`engram client` alone names the commands it takes, not the parser's field for them
    (`client_command`)."""
    done = run(clean_env(), command)
    assert done.returncode == 2, done.stderr
    said = done.stderr.splitlines()[-1]
    assert said.startswith(f"engram {command}: error: the following arguments are required: {{")
    assert "create" in said and "_command" not in said, said


def test_serve_refuses_port_0(tmp_path):
    # An unreachable database: without the refusal the command would go on to connect.
    url = f"postgresql://engram@127.0.0.1:{free_port()}/engram"
    result = run(clean_env(database_url=url), "serve", "--port", "0")
    assert result.returncode == 2, result.stderr
    assert "--port: must be an integer from 1 to 65535, not 0" in result.stderr


def test_serve_host_is_held_to_the_production_check():
    """`--host` overrides ENGRAM_HOST, and is refused as ENGRAM_HOST would be: a production
    service listening beyond this machine needs its own database, not the embedded one."""
    data = str(scratch_dir("engram-test-host-"))
    try:
        env = clean_env(environment="production", bootstrap_token="t" * 40, data_dir=data)
        result = run(env, "serve", "--host", "0.0.0.0", "--port", str(free_port()))
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.splitlines()
        assert "(--host 0.0.0.0) must set ENGRAM_DATABASE_URL" in line
        assert not os.listdir(data)  # refused before the embedded database started
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def test_a_port_in_use_stops_serve_with_status_2(db_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = clean_env(database_url=db_url, port=str(port), search_maintenance_seconds="0")
        result = await asyncio.to_thread(run, env, "serve")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "address already in use" in result.stderr


def test_a_data_directory_that_cannot_be_made_is_one_line_naming_the_setting(tmp_path):
    """A file where ENGRAM_DATA_DIR should be: the line named the path alone
    (`engram: .../pgdata: Not a directory`), not the setting that chose it."""
    data = tmp_path / "data"
    data.write_text("not a directory")
    for command in (["migrate"], ["serve", "--port", str(free_port())]):
        result = run(clean_env(data_dir=str(data)), *command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"engram: {data}/pgdata: Not a directory (ENGRAM_DATA_DIR is {data})"
        ], result.stderr


async def test_a_host_that_does_not_resolve_stops_serve_naming_it(db_url):
    """uvicorn's line said only the resolver's words (`Name or service not known`), naming
    neither the host nor the setting; `.invalid` never resolves (RFC 6761)."""
    env = clean_env(
        database_url=db_url,
        host="engram.invalid",
        port=str(free_port()),
        search_maintenance_seconds="0",
    )
    result = await asyncio.to_thread(run, env, "serve")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("engram: cannot listen on engram.invalid (ENGRAM_HOST, or --host): ")


async def test_serve_logs_as_app_cli_however_it_is_run(db_url):
    """Run as `python -m app.cli`, the module is `__main__`: its lines were logged as that
    (`"logger": "__main__"` in JSON), not as `app.cli` as under the `engram` command."""
    env = clean_env(
        database_url=db_url,
        port=str(free_port()),
        host="engram.invalid",  # stops the start once it has said it is starting
        log_format="json",
        search_maintenance_seconds="0",
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    starting = [line for line in lines if line["message"].startswith("Engram starting on ")]
    assert [line["logger"] for line in starting] == ["app.cli"], lines


async def test_serve_without_the_otel_extra_is_one_line(db_url, tmp_path):
    # The extra's modules made unimportable, as where it is not installed.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Missing:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith(('opentelemetry.sdk', 'opentelemetry.exporter',\n"
        "                            'opentelemetry.instrumentation')):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Missing())\n"
    )
    env = clean_env(
        database_url=db_url,
        port=str(free_port()),
        otel_endpoint="http://127.0.0.1:4318/v1/traces",
        search_maintenance_seconds="0",
    )
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    result = await asyncio.to_thread(run, env, "serve")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (
        "engram: ENGRAM_OTEL_ENDPOINT is set, but OpenTelemetry is not installed: "
        "pip install -e '.[otel]' (or unset ENGRAM_OTEL_ENDPOINT)"
    )


def test_maintain_search_refuses_min_records_0(tmp_path):
    # argparse refuses it, so `args.min_records or the setting` never reads 0 as "unset"; an
    # unreachable database: without the refusal the command would go on to connect.
    url = f"postgresql://engram@127.0.0.1:{free_port()}/engram"
    result = run(clean_env(database_url=url), "maintain-search", "--min-records", "0")
    assert result.returncode == 2, result.stderr
    assert "--min-records: must be an integer at least 1, not 0" in result.stderr


def test_version_names_the_release_and_its_newest_migration():
    """An operator compares it with `engram migrate`'s revision before an upgrade: the newest
    migration of the release's own migrations directory, with no database needed."""
    from importlib.metadata import version
    from pathlib import Path

    migrations = Path(__file__).resolve().parents[1] / "migrations" / "versions"
    newest = max(p.name.split("_", 1)[0] for p in migrations.glob("[0-9][0-9][0-9][0-9]_*.py"))
    done = run(clean_env(), "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"engram {version('engram')} (database migrations up to {newest})\n"


def test_commands_that_only_read_make_no_database_where_there_is_none(tmp_path):
    """`engram export` and `engram client tokens` in an ENGRAM_DATA_DIR that holds no database
    (a mistyped directory, a machine the service never ran on) are refused in one line that says
    what to do, and leave nothing there: they started an embedded server in it, made its
    cluster (initdb) and migrated it, to read nothing."""
    data_dir = tmp_path / "no-such-engram"
    said = (
        f"error (NOT_FOUND): no database yet in ENGRAM_DATA_DIR ({data_dir}): `engram {{}}` "
        "only reads, and makes none: point ENGRAM_DATA_DIR (or ENGRAM_DATABASE_URL) at the "
        "service's database, or start the service first (`engram serve`)"
    )
    action = "00000000-0000-0000-0000-000000000001"
    for args, command in [
        (["export", "--action", action], "export"),
        (["export", "--action", action, "--account", action], "export"),
        (["client", "tokens", "admin"], "client tokens"),
    ]:
        done = run(clean_env(data_dir=str(data_dir)), *args)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr.splitlines() == [said.format(command)], args
        assert not data_dir.exists(), args
