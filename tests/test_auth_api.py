"""Accounts, clients and tokens through GraphQL: grants, tenant isolation, token life cycle."""

import asyncio
import base64
import hashlib
import json
from uuid import UUID

import pytest
from factories import allow, caller, deny, make_account, make_agent
from helpers import eventually

from app.auth import service
from app.auth.caller import Caller
from app.auth.policies import parse_policies
from app.auth.resources import KNOWN
from app.errors import Unauthenticated
from app.graphql.relay import global_id

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")

CLIENT_FIELDS = "accountId principal name policies { effect actions resources }"
CREATE_ACCOUNT = (
    "mutation($name: String!) { createAccount(input: {name: $name}) { accountId name } }"
)
CREATE_CLIENT = (
    f"mutation($input: ClientInput!) {{ createClient(input: $input) {{ {CLIENT_FIELDS} }} }}"
)
UPDATE_CLIENT = f"""
mutation($principal: String!, $accountId: UUID, $input: ClientUpdateInput!) {{
  updateClient(principal: $principal, accountId: $accountId, input: $input) {{ {CLIENT_FIELDS} }}
}}"""
DELETE_CLIENT = """
mutation($principal: String!, $accountId: UUID, $expectedModified: Timestamp) {
  deleteClient(principal: $principal, accountId: $accountId, expectedModified: $expectedModified) {
    principal
  }
}"""
CREATE_TOKEN = """
mutation($principal: String!, $accountId: UUID) {
  createClientToken(principal: $principal, accountId: $accountId) { accountId principal token }
}"""
CLIENT = f"""
query($principal: String!, $accountId: UUID) {{
  client(principal: $principal, accountId: $accountId) {{ id {CLIENT_FIELDS} }}
}}"""
NODE = "query($id: ID!) { node(id: $id) { id ... on Client { principal accountId } } }"
VIEWER = "{ viewer { accountId principal } }"

POLICY = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}


def in_default(account_id: UUID, *policies: dict) -> Caller:
    return Caller(account_id, "operator", parse_policies(policies), in_default_account=True)


async def add_client(gql, who: Caller, principal: str, account_id: UUID | None = None) -> dict:
    data = {"principal": principal, "name": principal.title(), "policies": [POLICY]}
    if account_id is not None:
        data["accountId"] = str(account_id)
    return (await gql(who, CREATE_CLIENT, input=data)).ok()["createClient"]


async def signed_in(state, admin: Caller, account_id: UUID, principal: str) -> Caller:
    """The client as a request authenticates it, with a new token of its own."""
    token = await service.create_client_token(
        state.pool, admin, account_id=account_id, principal=principal
    )
    return await service.authenticate(state.pool, f"Bearer {token}")


async def set_policies(gql, admin: Caller, account_id: UUID, principal: str, policies) -> None:
    """An administrator's change of the client's policies (they replace all it held)."""
    update = {"policies": policies}
    (
        await gql(
            admin, UPDATE_CLIENT, principal=principal, accountId=str(account_id), input=update
        )
    ).ok()


async def token_count(state, account_id: UUID, principal: str) -> int:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(
            "SELECT count(*) FROM client_tokens WHERE account_id = $1 AND principal = $2",
            account_id,
            principal,
        )


# --- each operation needs its grant -----------------------------------------------------------

# (operation, variables, the grants it needs); `target` is a client of the caller's account.
OPERATIONS = [
    (
        CREATE_CLIENT,
        {"input": {"principal": "new", "name": "New", "policies": [POLICY]}},
        [("INSERT", "financial.Client.document")],
    ),
    (
        UPDATE_CLIENT,
        {"principal": "target", "input": {"name": "Renamed"}},
        [("UPDATE", "financial.Client.document")],
    ),
    (DELETE_CLIENT, {"principal": "target"}, [("DELETE", "financial.Client.document")]),
    (CREATE_TOKEN, {"principal": "target"}, [("INSERT", "financial.Client.token")]),
    (CLIENT, {"principal": "target"}, [("SELECT", "financial.Client.document")]),
]
IDS = ["createClient", "updateClient", "deleteClient", "createClientToken", "client"]


@pytest.mark.parametrize(("operation", "variables", "grants"), OPERATIONS, ids=IDS)
async def test_operation_refused_without_its_grant(gql, state, admin, operation, variables, grants):
    account = await make_account(state)
    await add_client(gql, admin, "target", account)
    for verb, resource in grants:
        # Everything allowed except exactly this grant.
        who = caller(account, EVERYTHING, deny([verb], resource))
        result = await gql(who, operation, **variables)
        assert result.codes == ["ACCESS_DENIED"], result.errors
        assert result.data is None
        assert f"{verb} {resource}" in result.errors[0]["message"]
    assert (await gql(caller(account), operation, **variables)).codes == ["ACCESS_DENIED"]
    # Nothing changed: the target is still there, untouched, with no token.
    target = await service.get_client(state.pool, admin, account_id=account, principal="target")
    assert target is not None and target.name == "Target"
    assert await token_count(state, account, "target") == 0


@pytest.mark.parametrize(("operation", "variables", "grants"), OPERATIONS, ids=IDS)
async def test_operation_allowed_with_exactly_its_grant(
    gql, state, admin, operation, variables, grants
):
    account = await make_account(state)
    await add_client(gql, admin, "target", account)
    # Its grant, and the grants of the client it acts on (POLICY): no more.
    who = caller(account, *[allow([verb], resource) for verb, resource in grants], POLICY)
    result = await gql(who, operation, **variables)
    data = result.ok()
    assert next(iter(data.values())) is not None


async def test_create_account_needs_its_grant_and_the_default_account(gql, state, admin):
    without = in_default(
        admin.account_id, EVERYTHING, deny(["INSERT"], "financial.Account.document")
    )
    refused = await gql(without, CREATE_ACCOUNT, name="acme")
    assert refused.codes == ["ACCESS_DENIED"]
    assert "INSERT financial.Account.document" in refused.errors[0]["message"]

    exact = in_default(admin.account_id, allow(["INSERT"], "financial.Account.document"))
    created = (await gql(exact, CREATE_ACCOUNT, name="  acme  ")).ok()["createAccount"]
    assert created["name"] == "acme"
    UUID(created["accountId"])

    # A client of any other account cannot create accounts, whatever its policies.
    tenant = caller(await make_account(state), EVERYTHING)
    other = await gql(tenant, CREATE_ACCOUNT, name="sneaky")
    assert other.codes == ["ACCESS_DENIED"]
    assert "default account" in other.errors[0]["message"]


async def test_create_account_name_is_validated(gql, admin):
    result = await gql(admin, CREATE_ACCOUNT, name="   ")
    assert result.codes == ["BAD_REQUEST"]
    assert "account name must be 1 to 200 characters" in result.errors[0]["message"]


async def test_viewer_needs_no_grant_and_names_the_caller(gql, state):
    account = await make_account(state)
    result = await gql(caller(account, principal="me"), VIEWER)
    assert result.ok()["viewer"] == {"accountId": str(account), "principal": "me"}


async def test_client_node_needs_select_on_clients(gql, state, admin):
    account = await make_account(state)
    created = await add_client(gql, admin, "target", account)
    node_id = global_id("Client", account, "target")
    refused = await gql(
        caller(account, EVERYTHING, deny(["SELECT"], "financial.Client.*")), NODE, id=node_id
    )
    assert refused.codes == ["ACCESS_DENIED"]
    found = await gql(
        caller(account, allow(["SELECT"], "financial.Client.document")), NODE, id=node_id
    )
    assert found.ok()["node"] == {
        "id": node_id,
        "principal": "target",
        "accountId": created["accountId"],
    }


ACCOUNT_OR_TOKEN_NODE = """query($id: ID!) { node(id: $id) { id
  ... on Account { accountId name }
  ... on ClientTokenInfo { tokenId prefix } } }"""


async def test_accounts_and_tokens_are_nodes_behind_their_grants(gql, state, admin):
    """DESIGN: every object with an identity implements Node; node(id) reads it back."""
    made = (
        await gql(admin, 'mutation { createAccount(input: {name: "acme"}) { id accountId } }')
    ).ok()["createAccount"]
    account = UUID(made["accountId"])
    assert made["id"] == global_id("Account", account)
    # The default account's clients read any account; a tenant its own, with SELECT on it.
    read = (await gql(admin, ACCOUNT_OR_TOKEN_NODE, id=made["id"])).ok()["node"]
    assert read == {"id": made["id"], "accountId": str(account), "name": "acme"}
    own = caller(account, allow(["SELECT"], "financial.Account.document"))
    assert (await gql(own, ACCOUNT_OR_TOKEN_NODE, id=made["id"])).ok()["node"] == read
    refused = await gql(
        caller(account, EVERYTHING, deny(["SELECT"], "financial.Account.*")),
        ACCOUNT_OR_TOKEN_NODE,
        id=made["id"],
    )
    assert refused.codes == ["ACCESS_DENIED"]
    other = caller(await make_account(state, "other"), EVERYTHING)
    assert (await gql(other, ACCOUNT_OR_TOKEN_NODE, id=made["id"])).codes == ["NOT_FOUND"]

    await add_client(gql, admin, "bot", account)
    issued = (
        await gql(
            admin,
            """mutation($a: UUID!) { createClientToken(principal: "bot", accountId: $a) {
                id tokenId prefix token } }""",
            a=str(account),
        )
    ).ok()["createClientToken"]
    assert issued["id"] == global_id("ClientToken", account, "bot", issued["tokenId"])
    # Read back without its secret, with SELECT on tokens; gone once revoked.
    tokens = caller(account, allow(["SELECT", "DELETE"], "financial.Client.token"))
    back = (await gql(tokens, ACCOUNT_OR_TOKEN_NODE, id=issued["id"])).ok()["node"]
    assert back == {"id": issued["id"], "tokenId": issued["tokenId"], "prefix": issued["prefix"]}
    assert (await gql(own, ACCOUNT_OR_TOKEN_NODE, id=issued["id"])).codes == ["ACCESS_DENIED"]
    assert (await gql(other, ACCOUNT_OR_TOKEN_NODE, id=issued["id"])).codes == ["NOT_FOUND"]
    revoke = """mutation($t: UUID!) { revokeClientToken(principal: "bot", tokenId: $t) { id } }"""
    assert (await gql(tokens, revoke, t=issued["tokenId"])).ok()["revokeClientToken"] == {
        "id": issued["id"]
    }
    assert (await gql(tokens, ACCOUNT_OR_TOKEN_NODE, id=issued["id"])).codes == ["NOT_FOUND"]


@pytest.mark.parametrize("principal", ["a\u0000b", "\ud800", "a\udfffb"])
async def test_a_crafted_text_cursor_that_no_row_could_hold_is_bad_request(gql, admin, principal):
    """A NUL or a lone surrogate in a cursor's text: BAD_REQUEST, never the driver's error."""
    raw = json.dumps([principal]).encode()  # \u escapes: json.loads gives the lone surrogate
    after = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    result = await gql(
        admin, "query($a: String) { clients(first: 5, after: $a) { nodes { id } } }", a=after
    )
    assert result.codes == ["BAD_REQUEST"] and "cursor" in result.errors[0]["message"]


# --- the operations themselves ----------------------------------------------------------------


async def test_client_life_cycle(gql, state, admin):
    account = await make_account(state)
    who = caller(account, EVERYTHING)
    created = await add_client(gql, who, "svc.reader@acme")
    assert created == {
        "accountId": str(account),
        "principal": "svc.reader@acme",
        "name": "Svc.Reader@Acme",
        "policies": [POLICY],
    }
    read = (await gql(who, CLIENT, principal="svc.reader@acme")).ok()["client"]
    assert read["id"] == global_id("Client", account, "svc.reader@acme")
    deny_all = {"effect": "DENY", "actions": ["DELETE"], "resources": ["*"]}
    updated = await gql(
        who, UPDATE_CLIENT, principal="svc.reader@acme", input={"policies": [deny_all]}
    )
    assert updated.ok()["updateClient"]["policies"] == [deny_all]
    assert updated.ok()["updateClient"]["name"] == "Svc.Reader@Acme"  # name kept when not given
    renamed = await gql(who, UPDATE_CLIENT, principal="svc.reader@acme", input={"name": "Reader"})
    assert renamed.ok()["updateClient"]["name"] == "Reader"
    assert renamed.ok()["updateClient"]["policies"] == [deny_all]  # policies kept when not given
    deleted = await gql(who, DELETE_CLIENT, principal="svc.reader@acme")
    assert deleted.ok()["deleteClient"] == {"principal": "svc.reader@acme"}
    assert (await gql(who, CLIENT, principal="svc.reader@acme")).ok()["client"] is None
    again = await gql(who, DELETE_CLIENT, principal="svc.reader@acme")
    assert again.codes == ["NOT_FOUND"]


async def test_update_client_with_expected_modified_refuses_a_change_made_meanwhile(gql, state):
    """A form sends the `modified` it was filled from: once someone else changed the client,
    updateClient is CONFLICT and changes nothing; a refused update leaves the name as well."""
    who = caller(await make_account(state), EVERYTHING)
    await add_client(gql, who, "svc")
    read = 'query { client(principal: "svc") { name modified policies { resources } } }'
    before = (await gql(who, read)).ok()["client"]
    wide = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.*"]}
    change = {"name": "Mine", "policies": [wide], "expectedModified": before["modified"]}
    theirs = await gql(who, UPDATE_CLIENT, principal="svc", input={"name": "Theirs"})
    assert theirs.ok()["updateClient"]["name"] == "Theirs"
    mine = await gql(who, UPDATE_CLIENT, principal="svc", input=change)
    assert mine.codes == ["CONFLICT"]
    assert "client 'svc' was changed at" in mine.errors[0]["message"]
    now = (await gql(who, read)).ok()["client"]
    assert now["name"] == "Theirs" and now["policies"] == before["policies"]
    assert now["modified"] != before["modified"]
    # Based on what it holds now, the change is made.
    redone = await gql(
        who, UPDATE_CLIENT, principal="svc", input={**change, "expectedModified": now["modified"]}
    )
    assert redone.ok()["updateClient"]["name"] == "Mine"
    # A refused policy refuses the name given with it.
    bad = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.nothing"]}
    refused = await gql(
        who, UPDATE_CLIENT, principal="svc", input={"name": "Half", "policies": [bad]}
    )
    assert refused.codes == ["BAD_REQUEST"]
    assert (await gql(who, read)).ok()["client"]["name"] == "Mine"


async def test_delete_client_with_expected_modified_refuses_a_client_changed_or_made_again(
    gql, state
):
    """A page sends the `modified` of the client it showed: a client deleted and created again
    with the same principal since, or changed since, is CONFLICT and stays, with its tokens;
    the `modified` it has now deletes it; without one, deleteClient deletes as it always did."""
    account = await make_account(state)
    who = caller(account, EVERYTHING)
    read = 'query { client(principal: "svc") { name modified } }'
    await add_client(gql, who, "svc")
    shown = (await gql(who, read)).ok()["client"]["modified"]
    # Someone else deletes it and makes another client with the same principal, with a token.
    assert (await gql(who, DELETE_CLIENT, principal="svc")).ok()
    remade = {"principal": "svc", "name": "Second", "policies": [POLICY]}
    assert (await gql(who, CREATE_CLIENT, input=remade)).ok()
    assert (await gql(who, CREATE_TOKEN, principal="svc")).ok()
    stale = await gql(who, DELETE_CLIENT, principal="svc", expectedModified=shown)
    assert stale.codes == ["CONFLICT"]
    message = stale.errors[0]["message"]
    assert "client 'svc' was changed or re-created since" in message
    assert "nothing was deleted" in message
    now = (await gql(who, read)).ok()["client"]
    assert now["name"] == "Second" and now["modified"] != shown
    assert await token_count(state, account, "svc") == 1
    # Changed (renamed) since: refused too.
    renamed = await gql(who, UPDATE_CLIENT, principal="svc", input={"name": "Third"})
    later = await gql(who, DELETE_CLIENT, principal="svc", expectedModified=now["modified"])
    assert later.codes == ["CONFLICT"]
    assert (await gql(who, read)).ok()["client"]["name"] == renamed.ok()["updateClient"]["name"]
    # The `modified` it has now deletes it, tokens and all.
    current = (await gql(who, read)).ok()["client"]["modified"]
    deleted = await gql(who, DELETE_CLIENT, principal="svc", expectedModified=current)
    assert deleted.ok()["deleteClient"] == {"principal": "svc"}
    assert (await gql(who, read)).ok()["client"] is None
    assert await token_count(state, account, "svc") == 0
    # Gone: NOT_FOUND, whatever `modified` is given.
    gone = await gql(who, DELETE_CLIENT, principal="svc", expectedModified=current)
    assert gone.codes == ["NOT_FOUND"]


async def test_duplicate_principal_is_a_conflict(gql, state):
    who = caller(await make_account(state), EVERYTHING)
    await add_client(gql, who, "dup")
    result = await gql(who, CREATE_CLIENT, input={"principal": "dup", "name": "x", "policies": []})
    assert result.codes == ["CONFLICT"]
    assert "'dup' already exists" in result.errors[0]["message"]


@pytest.mark.parametrize("principal", ["", " lead", "-x", "a b", "x" * 201, "naïve"])
async def test_bad_principal_is_bad_request(gql, admin, principal):
    result = await gql(
        admin, CREATE_CLIENT, input={"principal": principal, "name": "x", "policies": []}
    )
    assert result.codes == ["BAD_REQUEST"]
    assert "principal must be 1 to 200 characters" in result.errors[0]["message"]


@pytest.mark.parametrize("principal", ["action:{agent}", "Action:{agent}", "ACTION:ops"])
async def test_a_principal_an_agent_would_have_is_bad_request(gql, state, admin, principal):
    """An agent's principal is `action:<actionId>`, what `modifiedBy` says of the records it
    writes: a client given one would delete records as the agent, to anyone reading their
    history (M59)."""
    agent = await make_agent(state, admin)
    principal = principal.format(agent=agent.action_id)
    result = await gql(
        admin, CREATE_CLIENT, input={"principal": principal, "name": "x", "policies": []}
    )
    assert result.codes == ["BAD_REQUEST"]
    assert (
        "principal must not start with 'action:', which names an agent"
        in (result.errors[0]["message"])
    )
    # A name that only begins like it is a client's as ever.
    for taken in ("actions-bot", "action", "action.ops"):
        await add_client(gql, admin, taken)


async def test_blank_client_name_is_bad_request(gql, admin):
    result = await gql(admin, CREATE_CLIENT, input={"principal": "p", "name": " ", "policies": []})
    assert result.codes == ["BAD_REQUEST"]
    assert "client name must be 1 to 200 characters" in result.errors[0]["message"]


async def test_update_or_token_of_a_missing_client_is_not_found(gql, admin):
    assert (await gql(admin, UPDATE_CLIENT, principal="ghost", input={"name": "x"})).codes == [
        "NOT_FOUND"
    ]
    assert (await gql(admin, CREATE_TOKEN, principal="ghost")).codes == ["NOT_FOUND"]


async def test_a_client_cannot_delete_itself(gql, state):
    account = await make_account(state)
    me = caller(account, EVERYTHING, principal="me")
    result = await gql(me, DELETE_CLIENT, principal="me")
    assert result.codes == ["BAD_REQUEST"]
    assert "cannot delete itself" in result.errors[0]["message"]


async def test_a_client_gives_no_grant_it_does_not_hold(gql, state, admin):
    """Managing clients is not a way to more rights: a client creates or updates a client only
    with policies it holds, and changes or issues a token only for a client that holds no more
    than it does. Revoking and deleting take rights away and are not held back."""
    account = await make_account(state)
    client_admin = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.Client.*")
    read_memory = allow(["SELECT"], "financial.AgentMemory.*")
    for principal, policies in (("boss", [EVERYTHING]), ("manager", [client_admin, read_memory])):
        data = {"principal": principal, "name": principal.title(), "policies": policies}
        (await gql(admin, CREATE_CLIENT, input={**data, "accountId": str(account)})).ok()
    manager = caller(account, client_admin, read_memory, principal="manager")

    async def refused(operation: str, naming: str, **variables) -> None:
        result = await gql(manager, operation, **variables)
        assert result.codes == ["ACCESS_DENIED"], result.errors
        message = result.errors[0]["message"]
        assert naming in message and "which this client does not hold" in message, message

    # A new client, or new policies for one, holding a grant the manager does not.
    await refused(
        CREATE_CLIENT,
        "allow SELECT financial.Account.document, INSERT financial.Account.document",
        input={"principal": "x", "name": "X", "policies": [EVERYTHING]},
    )
    assert await service.get_client(state.pool, admin, account_id=account, principal="x") is None
    reader = {"principal": "reader", "name": "Reader", "policies": [read_memory]}
    (await gql(manager, CREATE_CLIENT, input=reader)).ok()
    wider = [allow(["SELECT", "UPDATE"], "financial.AgentMemory.*")]
    await refused(
        UPDATE_CLIENT,
        "UPDATE financial.AgentMemory.document",
        principal="reader",
        input={"policies": wider},
    )
    await refused(
        UPDATE_CLIENT,
        "UPDATE financial.AgentMemory",
        principal="manager",
        input={"policies": wider},
    )
    # A client holding more than the manager: not renamed, and no token issued for it.
    await refused(UPDATE_CLIENT, "client 'boss' holds", principal="boss", input={"name": "Bossed"})
    await refused(CREATE_TOKEN, "client 'boss' holds", principal="boss")
    boss = await service.get_client(state.pool, admin, account_id=account, principal="boss")
    assert boss.name == "Boss" and boss.policies == [EVERYTHING]
    assert await token_count(state, account, "boss") == 0
    for principal in ("reader", "manager"):
        policies = (
            await service.get_client(state.pool, admin, account_id=account, principal=principal)
        ).policies
        assert policies == ([read_memory] if principal == "reader" else [client_admin, read_memory])
    # What it holds it may give and manage: a token for the reader, fewer grants for itself.
    assert (await gql(manager, CREATE_TOKEN, principal="reader")).ok()["createClientToken"]["token"]
    narrower = {"policies": [client_admin]}
    (await gql(manager, UPDATE_CLIENT, principal="manager", input=narrower)).ok()
    # A pattern wider than the names it holds would also grant what a later release adds.
    listed = caller(
        account,
        client_admin,
        allow(["SELECT"], *sorted(r for r in KNOWN if r.startswith("financial.AgentMemory."))),
    )
    widened = {"principal": "w", "name": "W", "policies": [read_memory]}
    result = await gql(listed, CREATE_CLIENT, input=widened)
    assert result.codes == ["ACCESS_DENIED"]
    assert (
        "SELECT financial.AgentMemory.* (resources a later release adds there)"
        in (result.errors[0]["message"])
    )
    # Taking rights away is not held back: the boss's token is revoked, the boss deleted.
    issued = await service.issue_client_token(
        state.pool, admin, account_id=account, principal="boss"
    )
    revoke = """mutation($t: UUID!) { revokeClientToken(principal: "boss", tokenId: $t) { id } }"""
    (await gql(manager, revoke, t=str(issued.info.token_id))).ok()
    assert await token_count(state, account, "boss") == 0
    (await gql(manager, DELETE_CLIENT, principal="boss")).ok()


async def test_a_grant_taken_from_the_caller_meanwhile_is_not_passed_on(gql, state, admin):
    """A request's caller was read when it authenticated (or up to a second before, from
    memory, in another process): what the coverage rule checks is the caller's client as it is
    when the change is written, so a grant an administrator has just taken from it cannot be
    given to a client, or reached through a token, in that window."""
    account = await make_account(state)
    client_admin = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.Client.*")
    read_memory = allow(["SELECT"], "financial.AgentMemory.*")
    manager = {"principal": "manager", "name": "M", "policies": [client_admin, read_memory]}
    reader = {"principal": "reader", "name": "R", "policies": [read_memory]}
    see_clients = allow(["SELECT"], "financial.Client.*")
    plain = {"principal": "plain", "name": "P", "policies": [see_clients]}
    for data in (manager, reader, plain):
        (await gql(admin, CREATE_CLIENT, input={**data, "accountId": str(account)})).ok()
    authenticated = await signed_in(state, admin, account, "manager")
    await set_policies(gql, admin, account, "manager", [client_admin])

    for operation, variables in (
        (UPDATE_CLIENT, {"principal": "plain", "input": {"policies": [read_memory]}}),
        (CREATE_CLIENT, {"input": {"principal": "new", "name": "N", "policies": [read_memory]}}),
        (CREATE_TOKEN, {"principal": "reader"}),
        (UPDATE_CLIENT, {"principal": "reader", "input": {"name": "Renamed"}}),
    ):
        result = await gql(authenticated, operation, **variables)
        assert result.codes == ["ACCESS_DENIED"], (operation, result.errors)
        assert "SELECT financial.AgentMemory" in result.errors[0]["message"]
    clients = {
        c.principal: c
        for c in await service.list_clients(
            state.pool, admin, account_id=account, after=None, limit=10
        )
    }
    assert set(clients) == {"manager", "reader", "plain"}
    assert clients["plain"].policies == [see_clients] and clients["reader"].name == "R"
    assert await token_count(state, account, "reader") == 0
    # What it still holds it still manages.
    (await gql(authenticated, UPDATE_CLIENT, principal="plain", input={"name": "Plainer"})).ok()
    # Nor may it still do what it may no longer do at all.
    await set_policies(gql, admin, account, "manager", [see_clients])
    result = await gql(authenticated, UPDATE_CLIENT, principal="plain", input={"name": "Later"})
    assert result.codes == ["ACCESS_DENIED"], result.errors
    assert "UPDATE financial.Client.document" in result.errors[0]["message"]
    await set_policies(gql, admin, account, "manager", [client_admin])
    # A token revoked meanwhile acts no more.
    assert authenticated.token_id is not None
    await service.revoke_client_token(
        state.pool, admin, account_id=account, principal="manager", token_id=authenticated.token_id
    )
    result = await gql(authenticated, UPDATE_CLIENT, principal="plain", input={"name": "Later"})
    assert result.codes == ["UNAUTHENTICATED"], result.errors
    # A client deleted meanwhile changes nothing with the token it had.
    authenticated = await signed_in(state, admin, account, "manager")
    (await gql(admin, DELETE_CLIENT, principal="manager", accountId=str(account))).ok()
    result = await gql(authenticated, CREATE_TOKEN, principal="plain")
    assert result.codes == ["UNAUTHENTICATED"], result.errors
    assert await token_count(state, account, "plain") == 0
    clients = await service.list_clients(state.pool, admin, account_id=account, after=None, limit=9)
    assert {c.principal: c.name for c in clients}["plain"] == "Plainer"


async def test_a_grant_to_delete_taken_from_the_caller_meanwhile_deletes_nothing(gql, state, admin):
    """deleteClient, revokeClientToken and revokeTokensIssuedBy read the caller's grants as
    they are when they write, locked, as the coverage mutations do: a caller whose DELETE grants
    an administrator has just taken (its request verified before, or up to a second before from
    memory) deletes no client and revokes no token."""
    account = await make_account(state)
    manage = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.Client.*")
    see_clients = allow(["SELECT"], "financial.Client.*")
    for principal, policies in (("manager", [manage]), ("plain", [see_clients])):
        data = {"principal": principal, "name": principal, "policies": policies}
        (await gql(admin, CREATE_CLIENT, input={**data, "accountId": str(account)})).ok()
    plain = await service.issue_client_token(
        state.pool, admin, account_id=account, principal="plain"
    )
    authenticated = await signed_in(state, admin, account, "manager")
    await set_policies(gql, admin, account, "manager", [see_clients])

    revoke = """mutation($t: UUID!) { revokeClientToken(principal: "plain", tokenId: $t) { id } }"""
    revoke_issued = """mutation($t: UUID!) { revokeTokensIssuedBy(tokenId: $t) { id } }"""
    for operation, variables, needed in (
        (DELETE_CLIENT, {"principal": "plain"}, "DELETE financial.Client.document"),
        (revoke, {"t": str(plain.info.token_id)}, "DELETE financial.Client.token"),
        (revoke_issued, {"t": str(plain.info.token_id)}, "DELETE financial.Client.token"),
    ):
        result = await gql(authenticated, operation, **variables)
        assert result.codes == ["ACCESS_DENIED"], (operation, result.errors)
        assert needed in result.errors[0]["message"]
    assert await token_count(state, account, "plain") == 1
    found = await service.get_client(state.pool, admin, account_id=account, principal="plain")
    assert found is not None
    # Given back, the same caller deletes; revoked meanwhile, its token deletes nothing.
    await set_policies(gql, admin, account, "manager", [manage])
    (await gql(authenticated, revoke, t=str(plain.info.token_id))).ok()
    assert await token_count(state, account, "plain") == 0
    assert authenticated.token_id is not None
    await service.revoke_client_token(
        state.pool, admin, account_id=account, principal="manager", token_id=authenticated.token_id
    )
    result = await gql(authenticated, DELETE_CLIENT, principal="plain")
    assert result.codes == ["UNAUTHENTICATED"], result.errors
    found = await service.get_client(state.pool, admin, account_id=account, principal="plain")
    assert found is not None


async def test_two_clients_changing_each_other_at_once_both_succeed(gql, state, admin):
    """Each change locks both clients' rows (the caller's, to read its grants as they are, and
    the other's), in one order: two clients renaming each other at once wait, never deadlock."""
    account = await make_account(state)
    everything = [EVERYTHING]
    callers = []
    for principal in ("a", "b"):
        data = {"principal": principal, "name": principal, "policies": everything}
        (await gql(admin, CREATE_CLIENT, input={**data, "accountId": str(account)})).ok()
        callers.append(await signed_in(state, admin, account, principal))
    for n in range(15):
        results = await asyncio.gather(
            gql(callers[0], UPDATE_CLIENT, principal="b", input={"name": f"b{n}"}),
            gql(callers[1], UPDATE_CLIENT, principal="a", input={"name": f"a{n}"}),
        )
        for result in results:
            result.ok()


async def test_a_deadlock_is_a_conflict_to_retry_not_an_internal_error(gql, state, admin):
    """A transaction PostgreSQL rolls back for meeting another (here a deadlock with another
    session's locks) answers CONFLICT, saying to retry, and changes nothing."""
    account = await make_account(state)
    for principal in ("a", "b"):
        data = {"principal": principal, "name": principal, "policies": [EVERYTHING]}
        (await gql(admin, CREATE_CLIENT, input={**data, "accountId": str(account)})).ok()
    a = await signed_in(state, admin, account, "a")
    lock = "SELECT FROM clients WHERE account_id = $1 AND principal = $2 FOR UPDATE"
    async with state.pool.acquire() as other, other.transaction():
        # This session waits long before looking for a deadlock: the request's finds it first.
        await other.execute("SET LOCAL deadlock_timeout = '30s'")
        await other.execute(lock, account, "b")
        request = asyncio.create_task(
            gql(a, UPDATE_CLIENT, principal="b", input={"name": "renamed"})
        )
        await eventually(lambda: _waiting_for_a_lock(state.pool), "the request waits for b")
        await other.execute(lock, account, "a")  # the request holds "a" and waits for "b"
        result = await request
    assert result.codes == ["CONFLICT"], result.errors
    assert "retry it" in result.errors[0]["message"]
    b = await service.get_client(state.pool, admin, account_id=account, principal="b")
    assert b.name == "b"
    (await gql(a, UPDATE_CLIENT, principal="b", input={"name": "renamed"})).ok()


async def _waiting_for_a_lock(pool) -> bool:
    """(Read on a connection of its own: a transaction sees one snapshot of the activity.)"""
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        )
    )


async def test_token_is_shown_once_and_stored_hashed(gql, state, admin):
    account = await make_account(state)
    await add_client(gql, admin, "bot", account)
    issued = (await gql(admin, CREATE_TOKEN, principal="bot", accountId=str(account))).ok()
    token = issued["createClientToken"]["token"]
    assert issued["createClientToken"]["accountId"] == str(account)
    assert token.startswith("eng_") and len(token) > 40
    async with state.pool.acquire() as conn:
        stored = await conn.fetch("SELECT token_hash FROM client_tokens WHERE principal = 'bot'")
    assert [r["token_hash"] for r in stored] == [hashlib.sha256(token.encode()).digest()]
    me = await service.authenticate(state.pool, f"Bearer {token}")
    assert (me.account_id, me.principal) == (account, "bot")
    assert me.policies == parse_policies([POLICY])
    # A second token is a new one; both work.
    second = (await gql(admin, CREATE_TOKEN, principal="bot", accountId=str(account))).ok()
    assert second["createClientToken"]["token"] != token
    assert (await service.authenticate(state.pool, f"bearer {token}")).principal == "bot"


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Bearer   ", "Basic abc", "Bearer eng_nope", "eng_x"]
)
async def test_missing_or_bad_tokens_are_unauthenticated(state, header):
    with pytest.raises(Unauthenticated):
        await service.authenticate(state.pool, header)


async def test_deleted_clients_tokens_stop_working(gql, state, admin):
    account = await make_account(state)
    await add_client(gql, admin, "temp", account)
    token = await service.create_client_token(
        state.pool, admin, account_id=account, principal="temp"
    )
    assert (await service.authenticate(state.pool, f"Bearer {token}")).principal == "temp"
    (await gql(admin, DELETE_CLIENT, principal="temp", accountId=str(account))).ok()
    with pytest.raises(Unauthenticated):
        await service.authenticate(state.pool, f"Bearer {token}")
    # Re-creating the principal does not revive the old token.
    await add_client(gql, admin, "temp", account)
    with pytest.raises(Unauthenticated):
        await service.authenticate(state.pool, f"Bearer {token}")


async def test_policy_changes_apply_to_existing_tokens(gql, state, admin):
    account = await make_account(state)
    await add_client(gql, admin, "bot", account)
    token = await service.create_client_token(
        state.pool, admin, account_id=account, principal="bot"
    )
    before = await service.authenticate(state.pool, f"Bearer {token}")
    assert (
        await gql(before, 'mutation { createAction(input: {name: "a"}) { version } }')
    ).codes == ["ACCESS_DENIED"]
    grant = [{"effect": "ALLOW", "actions": ["INSERT"], "resources": ["financial.Action.document"]}]
    await set_policies(gql, admin, account, "bot", grant)
    after = await service.authenticate(state.pool, f"Bearer {token}")
    assert (await gql(after, 'mutation { createAction(input: {name: "a"}) { version } }')).ok()


async def test_bootstrap_admin_with_a_given_token(state):
    assert await service.bootstrap_admin(state.pool, "given-admin-token") is None
    admin = await service.authenticate(state.pool, "Bearer given-admin-token")
    assert admin.principal == "admin" and admin.in_default_account
    # Idempotent: a second start with the same token changes nothing and still works.
    assert await service.bootstrap_admin(state.pool, "given-admin-token") is None
    assert (await service.authenticate(state.pool, "Bearer given-admin-token")).principal == "admin"


async def test_bootstrap_admin_prints_a_token_only_the_first_time(state):
    created = await service.bootstrap_admin(state.pool, None)
    assert created is not None and created.startswith("eng_")
    assert (await service.authenticate(state.pool, f"Bearer {created}")).principal == "admin"
    assert await service.bootstrap_admin(state.pool, None) is None
    assert (await service.authenticate(state.pool, f"Bearer {created}")).principal == "admin"


# --- tenant isolation: a client of account B never reaches account A --------------------------


@pytest.fixture
async def two_tenants(gql, state, admin):
    a = await make_account(state, "A")
    b = await make_account(state, "B")
    await add_client(gql, admin, "alice", a)
    await service.create_client_token(state.pool, admin, account_id=a, principal="alice")
    intruder = caller(b, EVERYTHING, principal="mallory")
    return a, b, intruder


async def test_b_cannot_read_a_client(gql, two_tenants):
    a, _, intruder = two_tenants
    result = await gql(intruder, CLIENT, principal="alice", accountId=str(a))
    assert result.codes == ["NOT_FOUND"] and result.data is None
    # Without an account, the look-up is in B: A's client of that name is not there.
    assert (await gql(intruder, CLIENT, principal="alice")).ok()["client"] is None


async def test_b_cannot_node_look_up_a_client(gql, two_tenants):
    a, _, intruder = two_tenants
    result = await gql(intruder, NODE, id=global_id("Client", a, "alice"))
    assert result.codes == ["NOT_FOUND"] and result.data is None
    assert "alice" not in str(result.errors)


async def test_b_cannot_change_a_clients_or_tokens(gql, state, admin, two_tenants):
    a, _, intruder = two_tenants
    attempts = [
        (
            CREATE_CLIENT,
            {
                "input": {
                    "accountId": str(a),
                    "principal": "evil",
                    "name": "x",
                    "policies": [EVERYTHING],
                }
            },
        ),
        (
            UPDATE_CLIENT,
            {"principal": "alice", "accountId": str(a), "input": {"policies": [EVERYTHING]}},
        ),
        (DELETE_CLIENT, {"principal": "alice", "accountId": str(a)}),
        (CREATE_TOKEN, {"principal": "alice", "accountId": str(a)}),
    ]
    for operation, variables in attempts:
        result = await gql(intruder, operation, **variables)
        assert result.codes == ["NOT_FOUND"], (operation, result.errors)
        assert result.data is None
    alice = await service.get_client(state.pool, admin, account_id=a, principal="alice")
    assert alice is not None and alice.policies == [POLICY]
    assert await service.get_client(state.pool, admin, account_id=a, principal="evil") is None
    assert await token_count(state, a, "alice") == 1


async def test_b_same_principal_is_its_own_client(gql, state, admin, two_tenants):
    a, b, intruder = two_tenants
    mine = await add_client(gql, intruder, "alice")
    assert mine["accountId"] == str(b)
    (await gql(intruder, DELETE_CLIENT, principal="alice")).ok()
    assert await service.get_client(state.pool, admin, account_id=a, principal="alice") is not None


async def test_default_account_operator_manages_other_accounts(gql, state, admin):
    account = await make_account(state)
    created = await add_client(gql, admin, "ops", account)
    assert created["accountId"] == str(account)
    read = (await gql(admin, CLIENT, principal="ops", accountId=str(account))).ok()["client"]
    assert read["principal"] == "ops"
    missing = await gql(
        admin,
        CREATE_CLIENT,
        input={
            "accountId": "00000000-0000-0000-0000-000000000000",
            "principal": "x",
            "name": "x",
            "policies": [],
        },
    )
    assert missing.codes == ["NOT_FOUND"]
