"""Each token names who issued it (`issuedBy`, `issuedByAccountId`, `issuedByTokenId`), so that
an operator auditing an account after a leak can tell which client's createClientToken made a
token, with which of its tokens, or that the command line, the bootstrap setting or the first
start did; a token issued before migration 0037 names no one."""

import asyncio
import json
import uuid
from typing import Any

import pytest
from factories import make_account
from helpers import upgraded_from
from servers import clean_env, posted_graphql, run, serving

from app.auth import service

BOOTSTRAP = "issuer-bootstrap-token-value-0123456789"
ISSUED = "issuedBy issuedByAccountId issuedByTokenId"
CREATE_CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { principal } }"
CREATE_TOKEN = f"""mutation($p: String!, $a: UUID) {{
  createClientToken(principal: $p, accountId: $a) {{ id token tokenId {ISSUED} }} }}"""
TOKENS = f"""query($p: String!, $a: UUID) {{
  client(principal: $p, accountId: $a) {{
    tokens(first: 20) {{ nodes {{ id tokenId bootstrap {ISSUED} }} }} }} }}"""
CLIENTS = f"""query($a: UUID) {{
  clients(first: 20, accountId: $a) {{
    nodes {{ principal tokens(first: 20) {{ nodes {{ tokenId {ISSUED} }} }} }} }} }}"""
NODE = f"query($id: ID!) {{ node(id: $id) {{ ... on ClientTokenInfo {{ tokenId {ISSUED} }} }} }}"
NODES = f"""query($ids: [ID!]!) {{
  nodes(ids: $ids) {{ ... on ClientTokenInfo {{ tokenId {ISSUED} }} }} }}"""
REVOKE = f"""mutation($p: String!, $t: UUID!) {{
  revokeClientToken(principal: $p, tokenId: $t) {{ tokenId {ISSUED} }} }}"""
VIEWER = "{ viewer { accountId principal tokenId } }"
ALL_OF_IT = {
    "effect": "ALLOW",
    "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"],
    "resources": ["financial.*"],
}
SOME = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}

pytestmark = pytest.mark.settings(bootstrap_token=BOOTSTRAP)


async def client(url: str, token: str, principal: str, account: str | None, *policies: dict):
    """A new client, made over HTTP by the client of `token`."""
    made = {"principal": principal, "name": principal, "policies": list(policies)}
    if account is not None:
        made["accountId"] = account
    await posted_graphql(url, token, CREATE_CLIENT, input=made)


async def tenant(url: str) -> tuple[str, str]:
    """An account `acme` with its own administrator, `acme-admin`, whose token the default
    account's admin issued over HTTP (with the bootstrap token): (the account's ID, that
    token)."""
    acme = await posted_graphql(
        url, BOOTSTRAP, 'mutation { createAccount(input: {name: "acme"}) { accountId } }'
    )
    account = acme["createAccount"]["accountId"]
    await client(url, BOOTSTRAP, "acme-admin", account, ALL_OF_IT)
    issued = await posted_graphql(url, BOOTSTRAP, CREATE_TOKEN, p="acme-admin", a=account)
    return account, issued["createClientToken"]["token"]


def tokens_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    return data["client"]["tokens"]["nodes"]


async def test_a_token_names_the_client_whose_create_client_token_issued_it(base_url):
    operator = (await posted_graphql(base_url, BOOTSTRAP, VIEWER))["viewer"]
    account, acme_admin = await tenant(base_url)
    theirs = (await posted_graphql(base_url, acme_admin, VIEWER))["viewer"]
    await client(base_url, acme_admin, "bot", None, SOME)

    issued = (await posted_graphql(base_url, acme_admin, CREATE_TOKEN, p="bot"))[
        "createClientToken"
    ]
    named = {"issuedBy": "acme-admin", "issuedByAccountId": account}
    expected = {"tokenId": issued["tokenId"], **named, "issuedByTokenId": theirs["tokenId"]}
    assert {k: issued[k] for k in expected} == expected

    # Each listing of the token says the same: the client's tokens, the account's clients'
    # tokens, and node(id).
    (listed,) = tokens_of(await posted_graphql(base_url, acme_admin, TOKENS, p="bot"))
    clients = (await posted_graphql(base_url, BOOTSTRAP, CLIENTS, a=account))["clients"]["nodes"]
    by_client = {c["principal"]: c["tokens"]["nodes"] for c in clients}
    node = (await posted_graphql(base_url, acme_admin, NODE, id=issued["id"]))["node"]
    assert {k: listed[k] for k in expected} == expected
    assert by_client["bot"] == [expected]
    assert node == expected

    # The tenant's administrator, issued its token by the operator's `admin` across accounts:
    # the account tells that `admin` from a client of acme that might be named so.
    assert operator["principal"] == "admin" and operator["accountId"] != account
    assert by_client["acme-admin"] == [
        {
            "tokenId": theirs["tokenId"],
            "issuedBy": "admin",
            "issuedByAccountId": operator["accountId"],
            "issuedByTokenId": operator["tokenId"],
        }
    ]


async def test_a_tenant_reads_the_operators_issue_as_the_default_accounts_alone(base_url):
    """A client outside the default account reads a token the operator's `admin` issued in its
    account as issued by the default account, without the operator's account ID or token ID,
    however it reads the token; the operator still reads them."""
    operator = (await posted_graphql(base_url, BOOTSTRAP, VIEWER))["viewer"]
    account, acme_admin = await tenant(base_url)
    theirs = (await posted_graphql(base_url, acme_admin, VIEWER))["viewer"]
    spare = (await posted_graphql(base_url, BOOTSTRAP, CREATE_TOKEN, p="acme-admin", a=account))[
        "createClientToken"
    ]
    hidden = {"issuedBy": "default account", "issuedByAccountId": None, "issuedByTokenId": None}

    listed = tokens_of(await posted_graphql(base_url, acme_admin, TOKENS, p="acme-admin"))
    clients = (await posted_graphql(base_url, acme_admin, CLIENTS))["clients"]["nodes"]
    (by_client,) = [c["tokens"]["nodes"] for c in clients if c["principal"] == "acme-admin"]
    ids = [t["id"] for t in listed]
    node = (await posted_graphql(base_url, acme_admin, NODE, id=ids[0]))["node"]
    nodes = (await posted_graphql(base_url, acme_admin, NODES, ids=ids))["nodes"]
    revoked = (
        await posted_graphql(base_url, acme_admin, REVOKE, p="acme-admin", t=spare["tokenId"])
    )["revokeClientToken"]
    for seen in [*listed, *by_client, node, *nodes, revoked]:
        assert {k: seen[k] for k in hidden} == hidden, seen
    assert {t["tokenId"] for t in listed} == {theirs["tokenId"], spare["tokenId"]}
    assert operator["tokenId"] not in str([listed, by_client, node, nodes, revoked])

    # The operator reads who issued it, and the tenant what its own clients issue.
    (token,) = tokens_of(
        await posted_graphql(base_url, BOOTSTRAP, TOKENS, p="acme-admin", a=account)
    )
    assert (token["issuedBy"], token["issuedByAccountId"], token["issuedByTokenId"]) == (
        "admin",
        operator["accountId"],
        operator["tokenId"],
    )
    own = (await posted_graphql(base_url, acme_admin, CREATE_TOKEN, p="acme-admin"))[
        "createClientToken"
    ]
    assert (own["issuedBy"], own["issuedByAccountId"], own["issuedByTokenId"]) == (
        "acme-admin",
        account,
        theirs["tokenId"],
    )


async def test_a_token_the_command_line_issued_names_the_command_line(base_url, db_url, tmp_path):
    account, acme_admin = await tenant(base_url)
    await client(base_url, acme_admin, "bot", None, SOME)
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))

    made = await asyncio.to_thread(run, env, "client", "token", "bot", "--account", account)
    assert made.returncode == 0, made.stderr
    printed = json.loads(made.stdout)
    # Not `admin`, whom the command acts as: no request of the admin's client issued it.
    assert (printed["issuedBy"], printed["issuedByAccountId"]) == ("command line", None)
    assert printed["issuedByTokenId"] is None

    (listed,) = tokens_of(await posted_graphql(base_url, acme_admin, TOKENS, p="bot"))
    assert (listed["tokenId"], listed["issuedBy"]) == (printed["tokenId"], "command line")
    assert listed["issuedByAccountId"] is None and listed["issuedByTokenId"] is None
    shown = await asyncio.to_thread(run, env, "client", "tokens", "bot", "--account", account)
    assert shown.returncode == 0, shown.stderr
    assert [t["issuedBy"] for t in json.loads(shown.stdout)["tokens"]] == ["command line"]


async def test_the_bootstrap_token_names_the_bootstrap_setting(base_url):
    (token,) = tokens_of(await posted_graphql(base_url, BOOTSTRAP, TOKENS, p="admin"))
    assert token["bootstrap"] and token["issuedBy"] == "bootstrap setting"
    assert token["issuedByAccountId"] is None and token["issuedByTokenId"] is None


async def test_a_token_made_the_bootstrap_token_keeps_its_issuer(base_url, state):
    bootstrap = (await posted_graphql(base_url, BOOTSTRAP, VIEWER))["viewer"]["tokenId"]
    issued = (await posted_graphql(base_url, BOOTSTRAP, CREATE_TOKEN, p="admin"))[
        "createClientToken"
    ]
    # Restarted with that token as ENGRAM_BOOTSTRAP_TOKEN: it was the admin's request that made it.
    await service.bootstrap_admin(state.pool, issued["token"])
    (token,) = tokens_of(await posted_graphql(base_url, issued["token"], TOKENS, p="admin"))
    assert token["tokenId"] == issued["tokenId"] and token["bootstrap"]
    # (The token that issued it, the setting's before, is gone: its ID stays.)
    assert (token["issuedBy"], token["issuedByTokenId"]) == ("admin", bootstrap)


@pytest.mark.settings(bootstrap_token=None)
async def test_the_first_starts_admin_token_names_the_first_start(settings, embedder, state):
    created = await service.bootstrap_admin(state.pool, None)  # what the first start prints
    assert created is not None
    with serving(settings, embedder) as url:
        (token,) = tokens_of(await posted_graphql(url, created, TOKENS, p="admin"))
    assert not token["bootstrap"] and token["issuedBy"] == "first start"
    assert token["issuedByAccountId"] is None and token["issuedByTokenId"] is None


async def test_a_token_issued_before_issuers_were_recorded_names_no_one(base_url, state):
    # As a process of the release before migration 0037 stores one, during a rolling upgrade.
    account = await make_account(state)
    async with state.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO clients (account_id, principal, name, policies) "
            "VALUES ($1, 'old', 'Old', '[]')",
            account,
        )
        await conn.execute(
            "INSERT INTO client_tokens (token_hash, account_id, principal, prefix) "
            "VALUES ($1, $2, 'old', 'eng_old0')",
            service.hash_token("an earlier release's token"),
            account,
        )
    (token,) = tokens_of(await posted_graphql(base_url, BOOTSTRAP, TOKENS, p="old", a=str(account)))
    named = {"issuedBy": None, "issuedByAccountId": None, "issuedByTokenId": None}
    assert {k: token[k] for k in named} == named
    node = (await posted_graphql(base_url, BOOTSTRAP, NODE, id=token["id"]))["node"]
    assert node == {"tokenId": token["tokenId"], **named}


async def test_migration_0037_names_the_bootstrap_tokens_issuer_and_no_others(pg_server):
    account, action = uuid.uuid4(), uuid.uuid4()

    async def written(conn) -> None:
        await conn.execute(
            "INSERT INTO clients (account_id, principal, name, policies) "
            "VALUES ($1, 'admin', 'Administrator', '[]')",
            account,
        )
        for value, bootstrap in (("bootstrap", True), ("issued", False)):
            await conn.execute(
                "INSERT INTO client_tokens (token_hash, account_id, principal, bootstrap) "
                "VALUES ($1, $2, 'admin', $3)",
                service.hash_token(value),
                account,
                bootstrap,
            )

    async def read(conn) -> list[tuple[bool, str | None, Any]]:
        rows = await conn.fetch(
            "SELECT bootstrap, issued_by, issued_by_account, issued_by_token FROM client_tokens"
            " ORDER BY bootstrap"
        )
        return [tuple(r) for r in rows]

    found = await upgraded_from(pg_server, "0036", account, action, written, read)
    assert found == [(False, None, None, None), (True, "bootstrap setting", None, None)]


async def test_no_client_can_be_named_as_the_service_names_an_issuer(gql, admin):
    for issuer in service.ISSUERS:
        made = {"principal": issuer, "name": "x", "policies": []}
        assert (await gql(admin, CREATE_CLIENT, input=made)).codes == ["BAD_REQUEST"]
