"""Renaming and deleting accounts (tenants): `updateAccount`, `deleteAccount`, `engram account
rename` and `engram account delete`. A tenant renames its own account; the operator renames any
and deletes one that holds nothing, never the default account."""

import asyncio
import json
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest
from factories import (
    allow,
    caller,
    deny,
    make_account,
    make_agent,
    record_turn,
    remember,
    token_for,
    writer,
)
from helpers import eventually, holding

from app import cli
from app.auth import service, store
from app.auth.caller import Caller
from app.auth.policies import parse_policies
from app.errors import Conflict

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")
RENAME = """mutation($a: UUID!, $name: String!, $expected: String) {
  updateAccount(accountId: $a, input: {name: $name, expectedName: $expected}) {
    id accountId name isDefault } }"""
DELETE = "mutation($a: UUID!) { deleteAccount(accountId: $a) { accountId name isDefault } }"
NAMES = "{ accounts(first: 100) { nodes { accountId name } } }"


def operator(account_id: UUID, *policies: dict) -> Caller:
    """A client of the default account holding `policies`."""
    return Caller(account_id, "operator", parse_policies(policies), in_default_account=True)


async def names(state) -> dict[str, str]:
    async with state.pool.acquire() as conn:
        rows = await conn.fetch("SELECT account_id, name FROM accounts")
    return {str(r["account_id"]): r["name"] for r in rows}


async def test_the_operator_renames_an_account_over_http(state, admin, base_url):
    account = await make_account(state, "acme")
    token = await token_for(state, admin, "operator", allow(["SELECT", "UPDATE"], "financial.*"))
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as http:
        answer = http.post(
            "/graphql",
            json={"query": RENAME, "variables": {"a": str(account), "name": "  Acme Corp  "}},
        ).json()
        assert "errors" not in answer, answer
        renamed = answer["data"]["updateAccount"]
        assert renamed["accountId"] == str(account) and renamed["name"] == "Acme Corp"
        assert renamed["isDefault"] is False
        listed = http.post("/graphql", json={"query": NAMES}).json()["data"]["accounts"]["nodes"]
    assert {"accountId": str(account), "name": "Acme Corp"} in listed
    assert (await names(state))[str(account)] == "Acme Corp"


async def test_the_default_accounts_name_changes_for_the_operator(gql, admin, state):
    renamed = (await gql(admin, RENAME, a=str(admin.account_id), name="operator")).ok()
    assert renamed["updateAccount"]["isDefault"] is True
    assert (await names(state))[str(admin.account_id)] == "operator"


async def test_a_tenant_renames_its_own_account_alone_with_its_grant(gql, state):
    own = await make_account(state, "acme")
    other = await make_account(state, "other")
    tenant = caller(own, allow(["UPDATE"], "financial.Account.document"))
    assert (await gql(tenant, RENAME, a=str(own), name="acme eu")).ok()["updateAccount"][
        "name"
    ] == "acme eu"
    # Another tenant's account is not there for it, whatever its grants.
    hidden = await gql(caller(own, EVERYTHING), RENAME, a=str(other), name="taken")
    assert hidden.codes == ["NOT_FOUND"] and hidden.data is None
    refused = await gql(
        caller(own, EVERYTHING, deny(["UPDATE"], "financial.Account.document")),
        RENAME,
        a=str(own),
        name="sneaky",
    )
    assert refused.codes == ["ACCESS_DENIED"]
    assert "UPDATE financial.Account.document" in refused.errors[0]["message"]
    assert (await names(state))[str(own)] == "acme eu"
    assert (await names(state))[str(other)] == "other"


async def test_a_new_name_is_checked_as_a_new_accounts_is(gql, admin, state):
    account = await make_account(state, "acme")
    for wrong, said in [
        ("   ", "account name must be 1 to 200 characters"),
        ("x" * 201, "account name must be 1 to 200 characters"),
        ("acme\nevil", "account name"),
        ("acme\u202eevil", "account name"),
        ("acme\x00", "NUL character"),
    ]:
        refused = await gql(admin, RENAME, a=str(account), name=wrong)
        assert refused.codes == ["BAD_REQUEST"], wrong
        assert said in refused.errors[0]["message"], wrong
    # Names need not be unique, as createAccount's.
    await make_account(state, "twin")
    assert (await gql(admin, RENAME, a=str(account), name="twin")).ok()
    assert (await gql(admin, RENAME, a=str(uuid4()), name="x")).codes == ["NOT_FOUND"]
    assert (await names(state))[str(account)] == "twin"


async def test_a_rename_based_on_an_old_name_is_conflict(gql, admin, state):
    account = await make_account(state, "acme")
    first = await gql(admin, RENAME, a=str(account), name="Acme A", expected="acme")
    assert first.ok()["updateAccount"]["name"] == "Acme A"
    # Another operator's form, filled from the old name.
    late = await gql(admin, RENAME, a=str(account), name="Acme B", expected="acme")
    assert late.codes == ["CONFLICT"] and late.data is None
    message = late.errors[0]["message"]
    assert "'Acme A'" in message and "nothing was changed" in message
    assert (await names(state))[str(account)] == "Acme A"


async def test_a_rename_waits_for_another_and_names_what_it_renamed_to(gql, admin, state, db_url):
    """Two renames from the same name at once: the second waits for the first, then is
    CONFLICT naming the name the first gave, as it is now."""
    account = await make_account(state, "acme")
    first = "UPDATE accounts SET name = 'Acme A' WHERE account_id = $1"
    async with holding(db_url, first, account):
        late = asyncio.create_task(
            gql(admin, RENAME, a=str(account), name="Acme B", expected="acme")
        )
        await eventually(lambda: _waiting_on_a_lock(db_url), "the rename waits for the other")
        assert not late.done()
    refused = await late
    assert refused.codes == ["CONFLICT"]
    assert (
        "was renamed to 'Acme A' after the name this change was based on ('acme')"
        in (refused.errors[0]["message"])
    )
    assert (await names(state))[str(account)] == "Acme A"


async def test_the_operator_deletes_an_empty_account_over_http(state, admin, base_url):
    account = await make_account(state, "gone soon")
    # A client created and deleted: the account holds nothing again.
    await token_for(state, admin, "briefly", account_id=account)
    await service.delete_client(state.pool, admin, account_id=account, principal="briefly")
    token = await token_for(state, admin, "operator", allow(["SELECT", "DELETE"], "financial.*"))
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as http:
        answer = http.post("/graphql", json={"query": DELETE, "variables": {"a": str(account)}})
        gone = {"accountId": str(account), "name": "gone soon", "isDefault": False}
        assert answer.json() == {"data": {"deleteAccount": gone}}
        listed = http.post("/graphql", json={"query": NAMES}).json()["data"]["accounts"]["nodes"]
        assert str(account) not in [a["accountId"] for a in listed]
        again = http.post(
            "/graphql", json={"query": DELETE, "variables": {"a": str(account)}}
        ).json()
        assert again["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert str(account) not in await names(state)


async def test_an_account_that_holds_anything_is_not_deleted_and_says_what(gql, admin, state):
    account = await make_account(state, "busy")
    await token_for(state, admin, "acme-admin", EVERYTHING, account_id=account)
    await token_for(state, admin, "acme-bot", account_id=account)
    refused = await gql(admin, DELETE, a=str(account))
    assert refused.codes == ["CONFLICT"] and refused.data is None
    message = refused.errors[0]["message"]
    assert "still holds 2 clients;" in message and "'busy'" in message
    assert "delete its clients first (deleteClient" in message

    tenant = Caller(account, "acme-admin", parse_policies([EVERYTHING]))
    agent = await make_agent(state, tenant)
    await remember(state, agent, "prefers email")
    await remember(state, agent, "lives in Oslo", session="s2")
    for session in ("s1", "s2"):
        await record_turn(state, writer(agent, session=session))
    refused = await gql(admin, DELETE, a=str(account))
    message = refused.errors[0]["message"]
    assert refused.codes == ["CONFLICT"]
    assert "2 clients, 1 agent, 2 memory records, 2 sessions and 2 executions" in message, message
    assert "an agent is never deleted" in message
    # Its clients gone, the agent and what it holds still keep it.
    for principal in ("acme-admin", "acme-bot"):
        await service.delete_client(state.pool, admin, account_id=account, principal=principal)
    message = (await gql(admin, DELETE, a=str(account))).errors[0]["message"]
    assert "still holds 1 agent, 2 memory records" in message and "clients" not in message
    assert (await names(state))[str(account)] == "busy"


async def test_only_the_default_accounts_clients_delete_and_never_the_default(gql, admin, state):
    account = await make_account(state, "acme")
    tenant = caller(account, EVERYTHING)
    refused = await gql(tenant, DELETE, a=str(account))
    assert refused.codes == ["ACCESS_DENIED"]
    assert "only by clients of the default account" in refused.errors[0]["message"]
    allowed = """{ viewer { allowed(operations: ["deleteAccount", "updateAccount"]) {
      allowed reason } } }"""
    answer = (await gql(tenant, allowed)).ok()["viewer"]["allowed"]
    assert answer == [
        {
            "allowed": False,
            "reason": "accounts can be deleted only by clients of the default account",
        },
        {"allowed": True, "reason": None},
    ]
    without = operator(admin.account_id, EVERYTHING, deny(["DELETE"], "financial.Account.*"))
    refused = await gql(without, DELETE, a=str(account))
    assert refused.codes == ["ACCESS_DENIED"]
    assert "DELETE financial.Account.document" in refused.errors[0]["message"]
    default = await gql(admin, DELETE, a=str(admin.account_id))
    assert default.codes == ["BAD_REQUEST"]
    assert "the default account cannot be deleted" in default.errors[0]["message"]
    exact = operator(admin.account_id, allow(["DELETE"], "financial.Account.document"))
    # viewer.allowed says as much to the operator's clients, before they call.
    told = [(await gql(who, allowed)).ok()["viewer"]["allowed"][0] for who in (without, exact)]
    assert told == [
        {
            "allowed": False,
            "reason": "this client is not allowed to DELETE financial.Account.document",
        },
        {"allowed": True, "reason": None},
    ]
    assert (await gql(exact, DELETE, a=str(account))).ok()["deleteAccount"]["name"] == "acme"
    assert set(await names(state)) == {str(admin.account_id)}


async def test_a_client_being_created_keeps_the_account(gql, admin, state, db_url):
    """A client written in the account, not yet committed, when the deletion starts: the
    deletion waits for it, counts it and refuses; the client is not left without its account."""
    account = await make_account(state, "acme")
    insert = (
        "INSERT INTO clients (account_id, principal, name, policies) "
        "VALUES ($1, 'late', 'Late', '[]')"
    )
    async with holding(db_url, insert, account):
        deleting = asyncio.create_task(gql(admin, DELETE, a=str(account)))
        await eventually(lambda: _waiting_on_a_lock(db_url), "the deletion waits for the insert")
        assert not deleting.done()
    refused = await deleting
    assert refused.codes == ["CONFLICT"]
    assert "still holds 1 client;" in refused.errors[0]["message"]
    assert str(account) in await names(state)


async def test_a_client_created_while_its_account_is_deleted_is_not_found(
    gql, admin, state, db_url
):
    """The account's deletion, not yet committed, when a client is created in it: the creation
    waits for it and finds no account, and no client is left without one."""
    account = await make_account(state, "acme")
    create = """mutation($a: UUID!) { createClient(input: {accountId: $a, principal: "late",
      name: "Late", policies: []}) { principal } }"""
    async with holding(db_url, "DELETE FROM accounts WHERE account_id = $1", account):
        creating = asyncio.create_task(gql(admin, create, a=str(account)))
        await eventually(lambda: _waiting_on_a_lock(db_url), "the creation waits for the deletion")
        assert not creating.done()
    refused = await creating
    assert refused.codes == ["NOT_FOUND"], refused.errors
    assert f"account {account} not found" in refused.errors[0]["message"]
    async with state.pool.acquire() as conn:
        left = await conn.fetchval("SELECT count(*) FROM clients WHERE account_id = $1", account)
    assert left == 0


async def test_an_agent_created_while_its_account_is_deleted_is_not_found(gql, state, db_url):
    """A request that authenticated before its client and then its account were deleted: its
    createAction waits for the deletion and finds no account (was INTERNAL, a foreign-key
    violation), and nothing of the agent is written."""
    account = await make_account(state, "acme")
    tenant = caller(account, EVERYTHING)
    create = 'mutation { createAction(input: {name: "late"}) { actionId } }'
    async with holding(db_url, "DELETE FROM accounts WHERE account_id = $1", account):
        creating = asyncio.create_task(gql(tenant, create))
        await eventually(lambda: _waiting_on_a_lock(db_url), "the creation waits for the deletion")
        assert not creating.done()
    refused = await creating
    assert refused.codes == ["NOT_FOUND"] and refused.data is None, refused.errors
    assert refused.errors[0]["message"] == (
        "account not found: it was deleted while this request ran, and nothing the request "
        "wrote into it was kept"
    )
    async with state.pool.acquire() as conn:
        for table in ("actions", "action_versions"):
            left = await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE account_id = $1",  # one of two names
                account,
            )
            assert left == 0, table


# Each change a client makes in an account while the same client deletes it: the deletion
# waits for it, whichever lock the change took first. (The change, in the operator's name.)
SAME_CLIENT_CHANGES = {
    "createClientToken": lambda pool, who, account: service.issue_client_token(
        pool, who, account_id=account, principal="bot"
    ),
    "createClient": lambda pool, who, account: service.create_client(
        pool, who, account_id=account, principal="late", name="Late", policies=[]
    ),
    "updateAccount": lambda pool, who, account: service.update_account(
        pool, who, account_id=account, name="Acme B"
    ),
}


@pytest.mark.parametrize("change", list(SAME_CLIENT_CHANGES))
async def test_a_deletion_waits_for_a_change_the_same_client_makes_in_the_account(
    state, admin, db_url, monkeypatch, change
):
    """The operator's client changes the account (a token issued there, a client created, a
    rename) and, meanwhile, deletes it. Each takes the caller's client before the account (a
    token's lookup row and a client hold the account by their foreign keys, after the
    client's lock): no cycle, so the change commits and the deletion, waiting for it, is
    CONFLICT. Taken the other way round by the deletion, one of them was rolled back by
    PostgreSQL's deadlock detector (DeadlockDetectedError)."""
    account = await make_account(state, "acme")
    await token_for(state, admin, "bot", account_id=account)
    token = await token_for(state, admin, "operator", EVERYTHING)
    operator_ = await service.authenticate(state.pool, f"Bearer {token}")
    changing: asyncio.Task | None = None
    locked, go = asyncio.Event(), asyncio.Event()

    def pausing(lock):
        async def paused(*args, **kwargs):
            held = await lock(*args, **kwargs)
            if asyncio.current_task() is changing and not locked.is_set():
                locked.set()  # the change's first lock taken
                await go.wait()
            return held

        return paused

    for name in ("lock_clients", "lock_account"):
        monkeypatch.setattr(store, name, pausing(getattr(store, name)))
    changing = asyncio.create_task(SAME_CLIENT_CHANGES[change](state.pool, operator_, account))
    await asyncio.wait_for(locked.wait(), 10)
    deleting = asyncio.create_task(
        service.delete_account(state.pool, operator_, account_id=account)
    )
    await eventually(lambda: _waiting_on_a_lock(db_url), "the deletion waits for the change")
    go.set()
    await asyncio.wait_for(changing, 30)
    with pytest.raises(Conflict, match="still holds"):
        await asyncio.wait_for(deleting, 30)
    assert str(account) in await names(state)


async def _waiting_on_a_lock(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
        )
    finally:
        await conn.close()


async def test_cli_renames_and_deletes_an_account(db_url, state, admin, monkeypatch, capsys):
    account = await make_account(state, "acme")
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)

    async def run(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(cli.main, ["account", *argv])
        printed = capsys.readouterr()
        return code, printed.out, printed.err

    code, out, err = await run("rename", str(account), "Acme Corp")
    assert code == 0, err
    assert json.loads(out) == {"accountId": str(account), "name": "Acme Corp"}
    code, out, err = await run("rename", str(account), "Acme B", "--expected-name", "acme")
    assert code == 2 and "error (CONFLICT)" in err
    code, out, err = await run("rename", "not-an-id", "x")
    assert code == 2 and "ACCOUNT_ID 'not-an-id' is not an account ID" in err

    await token_for(state, admin, "bot", account_id=account)
    code, out, err = await run("delete", str(account))
    assert code == 2 and "error (CONFLICT)" in err and "still holds 1 client" in err
    await service.delete_client(state.pool, admin, account_id=account, principal="bot")
    code, out, err = await run("delete", str(account))
    assert code == 0, err
    assert json.loads(out) == {"accountId": str(account), "name": "Acme Corp"}
    assert str(account) not in await names(state)
    code, out, err = await run("delete", str(admin.account_id))
    assert code == 2 and "error (BAD_REQUEST)" in err
