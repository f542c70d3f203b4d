"""The API additions the console needs (issue 17), for every client: `clients(first, after)`,
filters on `Action.memories`, and `viewer.allowed(operations)`."""

from uuid import uuid4

import httpx
from factories import (
    allow,
    caller,
    forget,
    make_account,
    make_agent,
    record_turn,
    remember,
    token_for,
    writer,
)
from helpers import db_settings
from servers import serving

from app.auth import operations, service
from app.auth import resources as r
from app.auth.caller import Caller
from app.auth.policies import ADMIN_POLICIES
from app.auth.resources import KNOWN
from app.web.console import STATIC

CLIENTS = """query($first: Int!, $after: String, $a: UUID) {
  clients(first: $first, after: $after, accountId: $a) {
    edges { cursor node { principal name policies { effect actions resources } } }
    pageInfo { hasNextPage hasPreviousPage endCursor } } }"""
CREATE_CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { principal } }"
MEMORIES = """query($id: UUID!, $first: Int!, $after: String, $kind: String,
  $labels: [AgentMemoryLabelInput!], $scope: ActionAgentMemoryScope, $preview: Boolean,
  $status: [ActionAgentMemoryStatus!]) {
  action(actionId: $id) {
    memories(first: $first, after: $after, kind: $kind, labels: $labels, scope: $scope,
             preview: $preview, status: $status) {
      nodes { summary status } pageInfo { hasNextPage endCursor } } } }"""
ALLOWED = """query($ops: [String!]!) { viewer { allowed(operations: $ops) {
  operation allowed reason } } }"""
READER = allow(["SELECT"], "financial.*")
EVERY_VERB = ["SELECT", "INSERT", "UPDATE", "DELETE"]
COVERED = "{ clients(first: 20) { nodes { principal coveredByViewer } } }"


async def test_clients_pages_by_principal_and_needs_select_on_client_documents(gql, admin, state):
    account = await make_account(state)
    for principal in ["carol", "alice", "bob"]:
        client = {
            "accountId": str(account),
            "principal": principal,
            "name": principal.title(),
            "policies": [READER],
        }
        (await gql(admin, CREATE_CLIENT, input=client)).ok()

    first = (await gql(admin, CLIENTS, first=2, a=str(account))).ok()["clients"]
    assert [e["node"]["principal"] for e in first["edges"]] == ["alice", "bob"]
    assert first["edges"][0]["node"]["policies"] == [
        {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.*"]}
    ]
    assert first["pageInfo"]["hasNextPage"] is True
    rest = (
        await gql(admin, CLIENTS, first=2, after=first["pageInfo"]["endCursor"], a=str(account))
    ).ok()["clients"]
    assert [e["node"]["principal"] for e in rest["edges"]] == ["carol"]
    assert rest["pageInfo"] == {
        "hasNextPage": False,
        "hasPreviousPage": True,
        "endCursor": rest["edges"][0]["cursor"],
    }

    # A tenant's client sees its own account only, and only with the grant.
    tenant = caller(account, allow(["SELECT"], r.CLIENT))
    own = (await gql(tenant, CLIENTS, first=10)).ok()["clients"]["edges"]
    assert [e["node"]["principal"] for e in own] == ["alice", "bob", "carol"]
    other = await gql(tenant, CLIENTS, first=10, a=str(admin.account_id))
    assert other.codes == ["NOT_FOUND"]
    refused = await gql(caller(account, allow(["SELECT"], r.ACTION)), CLIENTS, first=10)
    assert refused.codes == ["ACCESS_DENIED"]
    assert "financial.Client.document" in refused.errors[0]["message"]
    bad = await gql(admin, CLIENTS, first=10, after="nonsense")
    assert bad.codes == ["BAD_REQUEST"]


async def test_memories_filters_narrow_the_listing_and_status_widens_it(gql, admin, state):
    agent = await make_agent(state, admin)
    a = await remember(state, agent, "a fact for c-1", labels={"customer_id": "c-1"})
    await remember(state, agent, "an event", kind="event", scope="AGENT")
    await remember(state, agent, "a preview fact", preview=True)
    gone = await remember(state, agent, "deleted fact")
    await forget(state, agent, gone.memory_id)
    aid = str(agent.action_id)

    async def summaries(**filters) -> list[str]:
        result = (await gql(admin, MEMORIES, id=aid, first=10, **filters)).ok()
        return [n["summary"] for n in result["action"]["memories"]["nodes"]]

    # The default keeps the spec's listing: live records, newest first, the deleted one omitted.
    assert await summaries() == ["a preview fact", "an event", "a fact for c-1"]
    assert await summaries(kind="event") == ["an event"]
    assert await summaries(scope="SESSION") == ["a preview fact", "a fact for c-1"]
    assert await summaries(preview=True) == ["a preview fact"]
    assert await summaries(preview=False) == ["an event", "a fact for c-1"]
    assert await summaries(labels=[{"name": "customer_id", "value": "c-1"}]) == [a.summary]
    assert await summaries(labels=[{"number": 5, "value": "c-2"}]) == []
    assert await summaries(status=["DELETED"]) == ["deleted fact"]
    assert await summaries(status=["ACTIVE", "DELETED"], kind="fact", preview=False) == [
        "deleted fact",
        "a fact for c-1",
    ]
    # Filters page like the listing.
    page = (await gql(admin, MEMORIES, id=aid, first=1, kind="fact")).ok()
    cursor = page["action"]["memories"]["pageInfo"]["endCursor"]
    assert await summaries(kind="fact", after=cursor) == ["a fact for c-1"]

    unknown = await gql(admin, MEMORIES, id=aid, first=5, labels=[{"name": "nope", "value": "x"}])
    assert unknown.codes == ["BAD_REQUEST"] and "customer_id" in unknown.errors[0]["message"]
    empty = await gql(admin, MEMORIES, id=aid, first=5, status=[])
    assert empty.codes == ["BAD_REQUEST"]


async def test_viewer_allowed_says_which_operations_the_grants_permit(gql, state):
    account = await make_account(state)
    reader = caller(account, allow(["SELECT"], "financial.AgentMemory.*"))
    result = (
        await gql(reader, ALLOWED, ops=["Action.memories", "deleteAgentMemory", "createAccount"])
    ).ok()["viewer"]["allowed"]
    assert result == [
        {"operation": "Action.memories", "allowed": True, "reason": None},
        {
            "operation": "deleteAgentMemory",
            "allowed": False,
            "reason": "this client is not allowed to UPDATE financial.AgentMemory.document",
        },
        {
            "operation": "createAccount",
            "allowed": False,
            "reason": "this client is not allowed to INSERT financial.Account.document",
        },
    ]
    # A DENY wins, as it does when the operation runs.
    denied = caller(
        account,
        allow(["SELECT", "UPDATE"], "financial.*"),
        {"effect": "DENY", "actions": ["UPDATE"], "resources": ["financial.AgentMemory.*"]},
    )
    answer = (await gql(denied, ALLOWED, ops=["deleteAgentMemory"])).ok()["viewer"]["allowed"]
    assert answer[0]["allowed"] is False
    # Every grant but an account's creation: a tenant's admin still cannot create accounts.
    tenant_admin = Caller(account, "root", ADMIN_POLICIES)
    answer = (await gql(tenant_admin, ALLOWED, ops=["createAccount", "clients"])).ok()
    assert [a["allowed"] for a in answer["viewer"]["allowed"]] == [False, True]

    unknown = await gql(reader, ALLOWED, ops=["dropEverything"])
    assert unknown.codes == ["BAD_REQUEST"]
    assert "deleteAgentMemory" in unknown.errors[0]["message"]


def test_viewer_allowed_knows_every_root_operation():
    """Each query and mutation of the schema is one `viewer.allowed` answers for (the grants in
    app/auth/operations.py), but `node`, `nodes` and `viewer`, which need none of their own."""
    from app.graphql.schema import build_schema

    schema = build_schema()._schema
    unknown = [
        f"{kind}.{name}"
        for kind in ("Query", "Mutation")
        for name in schema.type_map[kind].fields
        if name not in operations.OPERATIONS and name not in ("node", "nodes", "viewer")
    ]
    assert unknown == [], (
        "give each the grants its service checks in app/auth/operations.py's OPERATIONS, so that "
        "viewer.allowed (and the console) can tell a client before it calls"
    )


async def test_viewer_allowed_agrees_with_the_services_for_every_operation(gql, admin, state):
    """The table mirrors the services' checks: a client holding exactly an operation's grants
    is allowed it, and one lacking any of them is refused by the operation itself. Among them
    what the console offers or hides by it: creating agents and clients, deleting clients,
    erasing sessions, revoking the tokens a token issued, read first, and accounts' names, and
    renaming one's own."""
    agent = await make_agent(state, admin)
    kept = await remember(state, agent, "kept")
    await record_turn(state, writer(agent, session="s1"))
    aid = str(agent.action_id)
    account = admin.account_id
    await service.create_client(
        state.pool, admin, account_id=None, principal="doomed", name="Doomed", policies=[]
    )
    runs = {
        "Action.memories": (
            "query($a: UUID!) { action(actionId: $a) { memories(first: 1) "
            "{ nodes { memoryId } } } }",
            {"a": aid},
        ),
        "deleteAgentMemory": (
            "mutation($a: UUID!, $m: UUID!) { deleteAgentMemory(actionId: $a, id: $m) { status } }",
            {"a": aid, "m": str(kept.memory_id)},
        ),
        "clients": ("{ clients(first: 1) { nodes { principal } } }", {}),
        "accounts": ("{ accounts(first: 1) { nodes { name } } }", {}),
        "updateAccount": (
            'mutation($a: UUID!) { updateAccount(accountId: $a, input: {name: "renamed"}) '
            "{ name } }",
            {"a": str(account)},
        ),
        "actions": ("{ actions(first: 1) { nodes { name } } }", {}),
        "createAction": ('mutation { createAction(input: {name: "made"}) { version } }', {}),
        "createClient": (
            'mutation { createClient(input: {principal: "made", name: "Made", policies: []}) '
            "{ principal } }",
            {},
        ),
        "deleteClient": ('mutation { deleteClient(principal: "doomed") { principal } }', {}),
        "eraseSession": (
            'mutation($a: UUID!) { eraseSession(actionId: $a, sessionId: "s1") '
            "{ erasedExecutions } }",
            {"a": aid},
        ),
        "revokeTokensIssuedBy": (
            "mutation($t: UUID!) { revokeTokensIssuedBy(tokenId: $t) { tokenId } }",
            {"t": str(uuid4())},
        ),
        "tokensIssuedBy": (
            "query($t: UUID!) { tokensIssuedBy(tokenId: $t, first: 1) { nodes { tokenId } } }",
            {"t": str(uuid4())},
        ),
        "adminEvents": ("{ adminEvents(first: 1) { nodes { operation } } }", {}),
        "executions": (
            "query($t: UUID!) { executions(tokenId: $t, first: 1) { nodes { tokenId } } }",
            {"t": str(uuid4())},
        ),
    }
    for name, (query, variables) in runs.items():
        grants = operations.OPERATIONS[name]
        for missing in range(len(grants)):
            partial = [g for i, g in enumerate(grants) if i != missing]
            who = caller(account, *[allow([v], res) for v, res in partial])
            answer = (await gql(who, ALLOWED, ops=[name])).ok()["viewer"]["allowed"][0]
            assert answer["allowed"] is False, name
            assert (await gql(who, query, **variables)).codes == ["ACCESS_DENIED"], name
        who = caller(account, *[allow([v], res) for v, res in grants])
        assert (await gql(who, ALLOWED, ops=[name])).ok()["viewer"]["allowed"][0]["allowed"]
        assert (await gql(who, query, **variables)).ok(), name


def test_the_console_is_served_from_the_package_with_nothing_from_elsewhere(db_url, embedder):
    """Issue 17: /console serves the shipped files, under a policy that lets the page load and
    call nothing but this server; the files name no other host and never parse data as HTML."""
    with serving(db_settings(db_url), embedder) as url, httpx.Client(base_url=url) as http:
        moved = http.get("/console")
        assert moved.status_code == 308 and moved.headers["location"] == "/console/"
        page = http.get("/console/")
        assert page.status_code == 200 and 'src="app.js"' in page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        # Browsers that predate frame-ancestors honour X-Frame-Options (as on GraphiQL's page).
        assert page.headers["x-frame-options"] == "DENY"
        assert http.get("/console/app.js").headers["x-frame-options"] == "DENY"
        script = http.get("/console/app.js")
        assert script.headers["content-type"].startswith(("text/javascript", "application/"))
        assert http.get("/console/nothing.js").status_code == 404
        assert http.get("/console/index.html").status_code == 200
        # A file named as a folder: its page would load its scripts and styles from under it.
        for path in ("/console/index.html/", "/console/app.js/"):
            missing = http.get(path)
            assert missing.status_code == 404, path
            assert missing.json()["errors"][0]["extensions"]["code"] == "NOT_FOUND", path
        # Names no file may have, as folders: refused as they are without the slash.
        for path in ("/console/a%00b/", f"/console/{'x' * 300}/"):
            assert http.get(path).status_code == 404, path
    for path in STATIC.iterdir():
        text = path.read_text()
        assert "http://" not in text and "https://" not in text, path.name
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text, path.name


async def test_client_covered_by_viewer_says_which_clients_it_may_issue_tokens_for(
    state, admin, base_url
):
    """Over HTTP: `Client.coveredByViewer` is true for a client holding no more than the viewer
    and false for a wider one (also one wider only by a pattern, which grants what a later
    release adds), and createClientToken and updateClient then do as it said."""
    account = await make_account(state)
    memory_names = sorted(name for name in KNOWN if name.startswith("financial.AgentMemory."))
    manager = await token_for(
        state,
        admin,
        "manager",
        allow(EVERY_VERB, "financial.Client.*"),
        allow(["SELECT"], *memory_names),
        account_id=account,
    )
    boss = await token_for(state, admin, "boss", allow(EVERY_VERB, "*"), account_id=account)
    for principal, policy in [
        ("reader", allow(["SELECT"], memory_names[0])),
        ("patterned", allow(["SELECT"], "financial.AgentMemory.*")),
    ]:
        await service.create_client(
            state.pool,
            admin,
            account_id=account,
            principal=principal,
            name=principal,
            policies=[policy],
        )
    token = """mutation($p: String!) { createClientToken(principal: $p) { token } }"""
    rename = """mutation($p: String!) { updateClient(principal: $p, input: {name: "Renamed"})
      { principal } }"""

    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:

        async def ask(bearer: str, query: str, **variables) -> dict:
            answer = await http.post(
                "/graphql",
                json={"query": query, "variables": variables},
                headers={"Authorization": f"Bearer {bearer}"},
            )
            return answer.json()

        async def covered(bearer: str) -> dict[str, bool]:
            nodes = (await ask(bearer, COVERED))["data"]["clients"]["nodes"]
            return {n["principal"]: n["coveredByViewer"] for n in nodes}

        seen = await covered(manager)
        assert seen == {"boss": False, "manager": True, "patterned": False, "reader": True}
        for principal, answer in seen.items():
            for mutation in (token, rename):
                done = await ask(manager, mutation, p=principal)
                if answer:
                    assert not done.get("errors"), (principal, done)
                else:
                    assert done["data"] is None, (principal, done)
                    assert done["errors"][0]["extensions"]["code"] == "ACCESS_DENIED"
                    assert f"client {principal!r} holds" in done["errors"][0]["message"]
        # A client holding every grant covers every client, itself included.
        assert set((await covered(boss)).values()) == {True}
        one = await ask(boss, '{ client(principal: "manager") { coveredByViewer } }')
        assert one["data"]["client"] == {"coveredByViewer": True}
