"""The `engram` command: account and client management against a database, and `engram serve`
on its embedded PostgreSQL, stopped and started again with every row kept."""

import asyncio
import json
import signal
import subprocess

import pytest
from servers import Served, clean_env, free_port, post_graphql, run

from app import cli
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
    assert created == {"accountId": account["accountId"], "principal": "bot", "policies": [policy]}
    assert updated["policies"][1]["effect"] == "DENY"

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
    assert output(created)["policies"] == []
    # The first command on a fresh database creates the admin token and says so, once, on stderr.
    assert "Engram admin token (shown once" in created.stderr
    token = await asyncio.to_thread(run, env, "client", "token", "ops")
    assert "admin token" not in token.stderr
    assert "alembic" not in token.stderr  # no migration chatter around the token
    ops = await service.authenticate(state.pool, f"Bearer {output(token)['token']}")
    assert ops.principal == "ops" and ops.in_default_account


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
        (["client", "token", "ghost"], "error (NOT_FOUND): client 'ghost' not found"),
        (["client", "delete", "ghost"], "error (NOT_FOUND): client 'ghost' not found"),
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
