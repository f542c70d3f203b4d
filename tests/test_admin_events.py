"""Who changed accounts, clients and tokens, and when (`adminEvents`, `engram account events`):
each admin mutation writes its event in its own transaction, naming the client, its account and
the token its request sent (or the command line, the bootstrap setting, the first start), the
operation and the target; a change that fails leaves none; a tenant reads its own account's
alone, the operator's changes there without the operator's IDs; after a leak, the leaked
token's ID lists exactly what it changed."""

import asyncio
import json
from typing import Any
from uuid import UUID

import httpx
import pytest
from factories import allow, caller

from app import cli
from app.auth import events_store, service

BOOTSTRAP = "admin-events-bootstrap-token-0123456789"
ALL_OF_IT = {
    "effect": "ALLOW",
    "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"],
    "resources": ["financial.*"],
}
SOME = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}
EVENTS = """query($a: UUID, $t: UUID, $n: Int!, $after: String) {
  adminEvents(accountId: $a, tokenId: $t, first: $n, after: $after) {
    nodes { eventId accountId at actor actorAccountId actorTokenId operation targetKind target
            principal changes }
    pageInfo { hasNextPage endCursor } } }"""
VIEWER = "{ viewer { accountId tokenId } }"
CREATE_ACCOUNT = "mutation($n: String!) { createAccount(input: {name: $n}) { accountId } }"
RENAME = """mutation($a: UUID!, $n: String!) {
  updateAccount(accountId: $a, input: {name: $n}) { name } }"""
DELETE_ACCOUNT = "mutation($a: UUID!) { deleteAccount(accountId: $a) { accountId } }"
CREATE_CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { modified } }"
UPDATE_CLIENT = """mutation($p: String!, $a: UUID, $input: ClientUpdateInput!) {
  updateClient(principal: $p, accountId: $a, input: $input) { modified } }"""
DELETE_CLIENT = """mutation($p: String!, $a: UUID) {
  deleteClient(principal: $p, accountId: $a) { principal } }"""
CREATE_TOKEN = """mutation($p: String!, $a: UUID, $e: Timestamp) {
  createClientToken(principal: $p, accountId: $a, expires: $e) { token tokenId } }"""
REVOKE = """mutation($p: String!, $t: UUID!, $a: UUID) {
  revokeClientToken(principal: $p, tokenId: $t, accountId: $a) { tokenId } }"""
REVOKE_ISSUED = "mutation($t: UUID!) { revokeTokensIssuedBy(tokenId: $t) { tokenId } }"

pytestmark = pytest.mark.settings(bootstrap_token=BOOTSTRAP)


async def send(url: str, token: str, query: str, **variables: Any) -> dict[str, Any]:
    """A GraphQL operation over HTTP: its JSON answer."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        answer = await http.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
        )
    return answer.json()


async def post(url: str, token: str, query: str, **variables: Any) -> dict[str, Any]:
    """An operation that must succeed: its data."""
    answer = await send(url, token, query, **variables)
    assert not answer.get("errors"), answer
    return answer["data"]


async def code(url: str, token: str, query: str, **variables: Any) -> str:
    """The code of an operation that must fail."""
    answer = await send(url, token, query, **variables)
    assert answer.get("errors"), answer
    return answer["errors"][0]["extensions"]["code"]


async def events(url: str, token: str, **arguments: Any) -> list[dict[str, Any]]:
    """Every event adminEvents answers with these arguments (a: account, t: token), newest
    first, a page of 2 at a time."""
    found: list[dict[str, Any]] = []
    after = None
    while True:
        page = (await post(url, token, EVENTS, n=2, after=after, **arguments))["adminEvents"]
        found += page["nodes"]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]


def said(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What each event says, but its ID and time: operation, target, actor and changes."""
    return [
        (
            e["operation"],
            e["targetKind"],
            e["target"],
            e["principal"],
            e["actor"],
            e["actorAccountId"],
            e["actorTokenId"],
            e["changes"],
        )
        for e in found
    ]


async def client(url: str, token: str, principal: str, account: str | None, *policies: dict):
    made: dict[str, Any] = {"principal": principal, "name": principal, "policies": list(policies)}
    if account is not None:
        made["accountId"] = account
    await post(url, token, CREATE_CLIENT, input=made)


async def issue(url: str, token: str, principal: str, account: str | None = None) -> dict:
    return (await post(url, token, CREATE_TOKEN, p=principal, a=account))["createClientToken"]


async def test_each_admin_mutation_records_who_made_it_and_what_it_changed(base_url):
    url = base_url
    me = (await post(url, BOOTSTRAP, VIEWER))["viewer"]
    default, boot = me["accountId"], me["tokenId"]
    by_me = ("admin", default, boot)

    acme = (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n="acme"))["createAccount"]["accountId"]
    await post(url, BOOTSTRAP, RENAME, a=acme, n="Acme Corp")
    await client(url, BOOTSTRAP, "ops", acme, SOME)
    await post(
        url,
        BOOTSTRAP,
        UPDATE_CLIENT,
        p="ops",
        a=acme,
        input={"name": "Operations", "policies": [ALL_OF_IT]},
    )
    first = await issue(url, BOOTSTRAP, "ops", acme)
    second = (await post(url, BOOTSTRAP, CREATE_TOKEN, p="ops", a=acme, e="2099-01-01T00:00:00Z"))[
        "createClientToken"
    ]
    await post(url, BOOTSTRAP, REVOKE, p="ops", a=acme, t=second["tokenId"])
    # `first` issues a token of its own; revoking what `first` issued takes both.
    issued = await issue(url, first["token"], "ops")
    revoked = (await post(url, BOOTSTRAP, REVOKE_ISSUED, t=first["tokenId"]))[
        "revokeTokensIssuedBy"
    ]
    assert [t["tokenId"] for t in revoked] == [first["tokenId"], issued["tokenId"]]

    chain = {"tokenId": first["tokenId"]}
    ops = ("CLIENT", "ops", "ops")
    listed = await events(url, BOOTSTRAP, a=acme)
    # The events of one transaction share its time: those two in either order.
    assert listed[0]["at"] == listed[1]["at"]
    assert sorted(said(listed[:2])) == sorted(
        [
            ("revokeTokensIssuedBy", "TOKEN", issued["tokenId"], "ops", *by_me, chain),
            ("revokeTokensIssuedBy", "TOKEN", first["tokenId"], "ops", *by_me, chain),
        ]
    )
    assert said(listed[2:]) == [
        (
            "createClientToken",
            "TOKEN",
            issued["tokenId"],
            "ops",
            "ops",
            acme,
            first["tokenId"],
            {"expires": None},
        ),
        ("revokeClientToken", "TOKEN", second["tokenId"], "ops", *by_me, {}),
        (
            "createClientToken",
            "TOKEN",
            second["tokenId"],
            "ops",
            *by_me,
            {"expires": "2099-01-01T00:00:00Z"},
        ),
        ("createClientToken", "TOKEN", first["tokenId"], "ops", *by_me, {"expires": None}),
        (
            "updateClient",
            *ops,
            *by_me,
            {
                "name": "Operations",
                "previousName": "ops",
                "policies": [ALL_OF_IT],
                "previousPolicies": [SOME],
            },
        ),
        ("createClient", *ops, *by_me, {"name": "ops", "policies": [SOME]}),
        (
            "updateAccount",
            "ACCOUNT",
            acme,
            None,
            *by_me,
            {"name": "Acme Corp", "previousName": "acme"},
        ),
        ("createAccount", "ACCOUNT", acme, None, *by_me, {"name": "acme"}),
    ]
    # The events of the token `first`, as its ID finds them: the one token it issued.
    assert said(await events(url, BOOTSTRAP, t=first["tokenId"])) == said(
        (await events(url, BOOTSTRAP, a=acme))[2:3]
    )

    await post(url, BOOTSTRAP, DELETE_CLIENT, p="ops", a=acme)
    deleted = (await events(url, BOOTSTRAP, a=acme))[0]
    assert said([deleted]) == [("deleteClient", *ops, *by_me, {"name": "Operations"})]
    # A deleted account's events go with it; its deletion is in the deleting client's account.
    await post(url, BOOTSTRAP, DELETE_ACCOUNT, a=acme)
    newest = (await post(url, BOOTSTRAP, EVENTS, n=1))["adminEvents"]["nodes"]
    assert said(newest) == [("deleteAccount", "ACCOUNT", acme, None, *by_me, {"name": "Acme Corp"})]
    assert newest[0]["accountId"] == default
    assert await events(url, BOOTSTRAP, a=acme) == []
    # Each event is at its transaction's time: newest first, and never a secret.
    times = [e["at"] for e in await events(url, BOOTSTRAP)]
    assert times == sorted(times, reverse=True)
    everything = json.dumps(await events(url, BOOTSTRAP))
    for token in (BOOTSTRAP, first["token"], second["token"], issued["token"]):
        assert token not in everything and token[:8] not in everything


async def test_a_deleted_clients_tokens_each_name_the_deletion_that_revoked_them(base_url):
    """A token that went with its client is found by its ID (`target`) as a revoked one is:
    before, only the client's deletion was recorded, and nothing said what ended its tokens."""
    url = base_url
    me = (await post(url, BOOTSTRAP, VIEWER))["viewer"]
    by_me = ("admin", me["accountId"], me["tokenId"])
    await client(url, BOOTSTRAP, "bot", None, SOME)
    kept, revoked = await issue(url, BOOTSTRAP, "bot"), await issue(url, BOOTSTRAP, "bot")
    await post(url, BOOTSTRAP, REVOKE, p="bot", t=revoked["tokenId"])
    await post(url, BOOTSTRAP, DELETE_CLIENT, p="bot")
    deletion = [e for e in await events(url, BOOTSTRAP) if e["operation"] == "deleteClient"]
    assert sorted(said(deletion)) == [
        ("deleteClient", "CLIENT", "bot", "bot", *by_me, {"name": "bot"}),
        # The one revoked before is not said to have gone again.
        ("deleteClient", "TOKEN", kept["tokenId"], "bot", *by_me, {}),
    ]
    assert len({e["at"] for e in deletion}) == 1  # in the deletion's transaction


async def test_a_change_that_fails_leaves_no_event(base_url):
    url = base_url
    acme = (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n="acme"))["createAccount"]["accountId"]
    await client(url, BOOTSTRAP, "ops", acme, SOME)
    before = await events(url, BOOTSTRAP, a=acme)
    assert [e["operation"] for e in before] == ["createClient", "createAccount"]
    modified = "2020-01-01T00:00:00Z"
    # A principal taken, a stale change, an account still holding a client, an unknown token,
    # an account a tenant cannot reach, a policy the caller does not hold.
    assert (
        await code(
            url,
            BOOTSTRAP,
            CREATE_CLIENT,
            input={"principal": "ops", "name": "again", "policies": [], "accountId": acme},
        )
        == "CONFLICT"
    )
    assert (
        await code(
            url,
            BOOTSTRAP,
            UPDATE_CLIENT,
            p="ops",
            a=acme,
            input={"name": "x", "expectedModified": modified},
        )
        == "CONFLICT"
    )
    assert await code(url, BOOTSTRAP, DELETE_ACCOUNT, a=acme) == "CONFLICT"
    unknown = "00000000-0000-4000-8000-000000000000"
    assert await code(url, BOOTSTRAP, REVOKE, p="ops", a=acme, t=unknown) == "NOT_FOUND"
    assert await code(url, BOOTSTRAP, DELETE_CLIENT, p="nobody", a=acme) == "NOT_FOUND"
    narrow = await issue(url, BOOTSTRAP, "ops", acme)
    assert (
        await code(
            url,
            narrow["token"],
            CREATE_CLIENT,
            input={"principal": "wider", "name": "wider", "policies": [ALL_OF_IT]},
        )
        == "ACCESS_DENIED"
    )
    # Revoking what an unknown token issued revokes nothing, and records nothing.
    assert (await post(url, BOOTSTRAP, REVOKE_ISSUED, t=unknown))["revokeTokensIssuedBy"] == []
    after = await events(url, BOOTSTRAP, a=acme)
    assert [e["operation"] for e in after] == ["createClientToken", "createClient", "createAccount"]
    assert after[1:] == before


async def test_a_change_and_its_event_commit_together_or_not_at_all(state, admin, monkeypatch):
    """The event is written in the change's transaction: an event that cannot be written (here
    one that fails once written) takes the change with it, and the change's failure its event."""
    pool = state.pool

    async def written_then_failing(*args: Any, **kwargs: Any) -> None:
        await real(*args, **kwargs)
        raise RuntimeError("the event's write failed")

    real = events_store.record_tokens
    monkeypatch.setattr(events_store, "record_tokens", written_then_failing)
    await service.create_client(
        pool, admin, account_id=None, principal="bot", name="bot", policies=[]
    )
    with pytest.raises(RuntimeError):
        await service.issue_client_token(pool, admin, account_id=None, principal="bot")
    assert await service.list_client_tokens(pool, admin, account_id=None, principal="bot") == []
    real_record = events_store.record
    monkeypatch.setattr(events_store, "record", written_then_failing)
    real = real_record
    with pytest.raises(RuntimeError):
        await service.delete_client(pool, admin, account_id=None, principal="bot")
    assert await service.get_client(pool, admin, account_id=None, principal="bot") is not None
    async with pool.acquire() as conn:
        made = await conn.fetch("SELECT operation, target FROM admin_events ORDER BY at")
    assert [(r["operation"], r["target"]) for r in made][-1:] == [("createClient", "bot")]
    assert "createClientToken" not in [r["operation"] for r in made if r["target"] != "admin"]


async def test_a_tenant_reads_its_own_accounts_events_without_the_operators_ids(base_url):
    url = base_url
    default = (await post(url, BOOTSTRAP, VIEWER))["viewer"]["accountId"]
    acme = (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n="acme"))["createAccount"]["accountId"]
    other = (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n="other"))["createAccount"]["accountId"]
    await client(url, BOOTSTRAP, "acme-admin", acme, ALL_OF_IT)
    await client(url, BOOTSTRAP, "bot", other, SOME)
    tenant = await issue(url, BOOTSTRAP, "acme-admin", acme)
    await client(url, tenant["token"], "bot", None, SOME)
    boot = (await post(url, BOOTSTRAP, VIEWER))["viewer"]["tokenId"]
    # The operator revokes the tenant's token with what it issued: none, but its own.
    await post(url, BOOTSTRAP, REVOKE_ISSUED, t=tenant["tokenId"])
    again = await issue(url, BOOTSTRAP, "acme-admin", acme)

    seen = await events(url, again["token"])
    operator = ("default account", None, None)
    assert said(seen) == [
        (
            "createClientToken",
            "TOKEN",
            again["tokenId"],
            "acme-admin",
            *operator,
            {"expires": None},
        ),
        # The operator's revocation, without the token it was given (the operator's ID here
        # could as well be one of the operator's own tokens).
        ("revokeTokensIssuedBy", "TOKEN", tenant["tokenId"], "acme-admin", *operator, {}),
        (
            "createClient",
            "CLIENT",
            "bot",
            "bot",
            "acme-admin",
            acme,
            tenant["tokenId"],
            {"name": "bot", "policies": [SOME]},
        ),
        (
            "createClientToken",
            "TOKEN",
            tenant["tokenId"],
            "acme-admin",
            *operator,
            {"expires": None},
        ),
        (
            "createClient",
            "CLIENT",
            "acme-admin",
            "acme-admin",
            *operator,
            {"name": "acme-admin", "policies": [ALL_OF_IT]},
        ),
        ("createAccount", "ACCOUNT", acme, None, *operator, {"name": "acme"}),
    ]
    assert all(e["accountId"] == acme for e in seen)
    assert boot not in json.dumps(seen) and default not in json.dumps(seen)
    # The same, named: its own account; another's is not there for it.
    assert await events(url, again["token"], a=acme) == seen
    for account in (other, default):
        assert await code(url, again["token"], EVENTS, a=account, n=5) == "NOT_FOUND"
    # Its own token's events, by its ID; the operator's token finds nothing.
    assert said(await events(url, again["token"], t=tenant["tokenId"])) == said(seen[2:3])
    assert await events(url, again["token"], t=boot) == []
    assert await events(url, again["token"], t=boot, a=acme) == []
    # The operator reads them with its IDs.
    told = await events(url, BOOTSTRAP, a=acme)
    assert told[0]["actor"] == "admin" and told[0]["actorTokenId"] == boot
    assert told[1]["changes"] == {"tokenId": tenant["tokenId"]}


async def test_a_tenant_never_reads_the_operators_token_a_command_line_revocation_named(
    base_url, db_url, monkeypatch
):
    """`engram client revoke-issued` of an operator's token revokes the tokens it issued in a
    tenant's account: the tenant reads those events as `command line`, but not the operator's
    token they name. Before, an event of no client's (no actor account) was shown whole."""
    url = base_url
    acme = (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n="acme"))["createAccount"]["accountId"]
    await client(url, BOOTSTRAP, "acme-admin", acme, ALL_OF_IT)
    operators = await issue(url, BOOTSTRAP, "admin")
    issued = await issue(url, operators["token"], "acme-admin", acme)
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    revoked = await asyncio.to_thread(_cli, "client", "revoke-issued", operators["tokenId"])
    assert {t["tokenId"] for t in revoked["revoked"]} == {
        operators["tokenId"],
        issued["tokenId"],
    }

    tenant = await issue(url, BOOTSTRAP, "acme-admin", acme)
    seen = await events(url, tenant["token"])
    revocation = [e for e in seen if e["operation"] == "revokeTokensIssuedBy"]
    assert said(revocation) == [
        (
            "revokeTokensIssuedBy",
            "TOKEN",
            issued["tokenId"],
            "acme-admin",
            "command line",
            None,
            None,
            {},
        )
    ]
    assert operators["tokenId"] not in json.dumps(seen)
    # The operator reads the token it was given.
    told = await events(url, BOOTSTRAP, a=acme)
    assert [e["changes"] for e in told if e["operation"] == "revokeTokensIssuedBy"] == [
        {"tokenId": operators["tokenId"]}
    ]


async def test_the_grant_to_read_events_is_its_own(gql, state, admin):
    reader = caller(admin.account_id, allow(["SELECT"], "financial.Account.events"))
    assert (await gql(reader, "{ adminEvents(first: 1) { nodes { operation } } }")).ok()
    documents = caller(
        admin.account_id, allow(["SELECT"], "financial.Account.document", "financial.Client.*")
    )
    refused = await gql(documents, "{ adminEvents(first: 1) { nodes { operation } } }")
    assert refused.codes == ["ACCESS_DENIED"]
    assert "SELECT financial.Account.events" in refused.errors[0]["message"]


async def test_events_page_newest_first_with_cursors_bound_to_their_arguments(base_url):
    url = base_url
    acme = (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n="acme"))["createAccount"]["accountId"]
    for i in range(5):
        await client(url, BOOTSTRAP, f"c{i}", acme)
    page = (await post(url, BOOTSTRAP, EVENTS, a=acme, n=2))["adminEvents"]
    assert [e["target"] for e in page["nodes"]] == ["c4", "c3"]
    assert page["pageInfo"]["hasNextPage"] is True
    rest = await events(url, BOOTSTRAP, a=acme)
    assert [e["target"] for e in rest] == ["c4", "c3", "c2", "c1", "c0", acme]
    nxt = await post(url, BOOTSTRAP, EVENTS, a=acme, n=2, after=page["pageInfo"]["endCursor"])
    assert [e["target"] for e in nxt["adminEvents"]["nodes"]] == ["c2", "c1"]
    # A cursor of the account's events is not one of the default account's.
    cursor = page["pageInfo"]["endCursor"]
    assert await code(url, BOOTSTRAP, EVENTS, n=2, after=cursor) == "BAD_REQUEST"


async def test_a_leaked_tokens_id_lists_exactly_what_it_changed(base_url, db_url, monkeypatch):
    """The leak story: a token creates a client in a tenant's account and issues it a token,
    issues another in its own, and is then revoked by the operator. Its ID lists those changes,
    in every account, newest first, and nothing else; the account's events say who revoked it."""
    url = base_url
    acme = (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n="acme"))["createAccount"]["accountId"]
    await client(url, BOOTSTRAP, "ops", None, ALL_OF_IT)
    await client(url, BOOTSTRAP, "deputy", None, SOME)
    leaked = await issue(url, BOOTSTRAP, "ops")
    await client(url, leaked["token"], "evil", acme, ALL_OF_IT)
    planted = await issue(url, leaked["token"], "evil", acme)
    spare = await issue(url, leaked["token"], "deputy")
    # Others' changes meanwhile: not the leaked token's.
    await client(url, BOOTSTRAP, "bystander", acme, SOME)
    await client(url, planted["token"], "evil2", None, SOME)
    boot = (await post(url, BOOTSTRAP, VIEWER))["viewer"]["tokenId"]
    await post(url, BOOTSTRAP, REVOKE, p="ops", t=leaked["tokenId"])

    did = await events(url, BOOTSTRAP, t=leaked["tokenId"])
    assert [(e["operation"], e["accountId"], e["target"]) for e in did] == [
        ("createClientToken", did[0]["accountId"], spare["tokenId"]),
        ("createClientToken", acme, planted["tokenId"]),
        ("createClient", acme, "evil"),
    ]
    assert {(e["actor"], e["actorTokenId"]) for e in did} == {("ops", leaked["tokenId"])}
    revocation = (await post(url, BOOTSTRAP, EVENTS, n=1))["adminEvents"]["nodes"][0]
    assert (revocation["operation"], revocation["target"], revocation["principal"]) == (
        "revokeClientToken",
        leaked["tokenId"],
        "ops",
    )
    assert (revocation["actor"], revocation["actorTokenId"]) == ("admin", boot)
    # Named with an account, that account's alone.
    assert [e["target"] for e in await events(url, BOOTSTRAP, t=leaked["tokenId"], a=acme)] == [
        planted["tokenId"],
        "evil",
    ]

    # The same from the command line.
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    out = await asyncio.to_thread(
        _cli, "account", "events", "--token", leaked["tokenId"], "--limit", "2"
    )
    assert [e["target"] for e in out["events"]] == [spare["tokenId"], planted["tokenId"]]
    assert out["more"] is True and out["events"][0]["actor"] == "ops"
    out = await asyncio.to_thread(_cli, "account", "events", "--account", acme)
    assert [e["target"] for e in out["events"]][:2] == ["evil2", "bystander"]


def _cli(*argv: str) -> dict[str, Any]:
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(list(argv)) == 0
    return json.loads(printed.getvalue())


async def test_the_command_line_and_the_starts_are_named_as_token_issuers_are(
    state, db_url, monkeypatch, capsys
):
    """`engram` commands act as `command line`; a start's admin client and token as `first
    start` or `bootstrap setting`, a bootstrap token replaced by a new value revoked by it, and
    a start that changes nothing records nothing."""
    pool = state.pool
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    made = json.loads(await asyncio.to_thread(_cli_out, capsys, "account", "create", "acme"))[
        "accountId"
    ]
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT operation, actor, actor_account, actor_token, target FROM admin_events"
            " ORDER BY at, operation"
        )
    by = {(r["operation"], r["target"]): r for r in rows}
    created = by[("createAccount", made)]
    assert (created["actor"], created["actor_account"], created["actor_token"]) == (
        "command line",
        None,
        None,
    )
    # The CLI's first write made the admin and its token: the first start's.
    assert by[("createClient", "admin")]["actor"] == "first start"
    first = [r for r in rows if r["operation"] == "createClientToken"]
    assert [r["actor"] for r in first] == ["first start"]

    await service.bootstrap_admin(pool, "one-bootstrap-value-0123456789")
    await service.bootstrap_admin(pool, "two-bootstrap-value-0123456789")
    await service.bootstrap_admin(pool, "two-bootstrap-value-0123456789")
    async with pool.acquire() as conn:
        later = await conn.fetch(
            "SELECT operation, actor, target FROM admin_events WHERE actor = 'bootstrap setting'"
            " ORDER BY at, operation DESC"
        )
        tokens = {
            r["token_id"]: r["bootstrap"]
            for r in await conn.fetch("SELECT token_id, bootstrap FROM client_tokens")
        }
    one, two = (UUID(r["target"]) for r in later if r["operation"] == "createClientToken")
    assert [(r["operation"], UUID(r["target"])) for r in later] == [
        ("createClientToken", one),
        ("revokeClientToken", one),
        ("createClientToken", two),
    ]
    assert one not in tokens and tokens[two] is True


def _cli_out(capsys: Any, *argv: str) -> str:
    assert cli.main(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out
