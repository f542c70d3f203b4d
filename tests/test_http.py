"""Full HTTP round trips: the app served by uvicorn on a loopback port, against the test database.

Every refused request must come back as JSON with `extensions.code`, never as a 500 or a stack.
"""

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from helpers import database_copy
from servers import serving

from app.actions import service as actions_service
from app.config import Settings
from app.graphql.relay import global_id

ADMIN_TOKEN = "test-bootstrap-admin-token"
MAX_BODY = 4096
MAX_DEPTH = 2  # the root field is depth 0
MAX_TOKENS = 200


@pytest.fixture(scope="module")
async def module_db_url(pg_server, template_db) -> AsyncIterator[str]:
    """One database for this module's server: starting a server per test costs a second each."""
    async with database_copy(pg_server, template_db, f"engram_http_{os.getpid()}") as url:
        yield url


@pytest.fixture(scope="module")
def base_url(module_db_url, embedder) -> Iterator[str]:
    # Settings come from the environment, as `engram serve` reads them.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ENGRAM_DATABASE_URL", module_db_url)
        env.setenv("ENGRAM_BOOTSTRAP_TOKEN", ADMIN_TOKEN)
        env.setenv("ENGRAM_MAX_BODY_BYTES", str(MAX_BODY))
        env.setenv("ENGRAM_MAX_QUERY_DEPTH", str(MAX_DEPTH))
        env.setenv("ENGRAM_MAX_QUERY_TOKENS", str(MAX_TOKENS))
        settings = Settings()
    with serving(settings, embedder) as url:
        yield url


@pytest.fixture
async def http(base_url) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ADMIN = bearer(ADMIN_TOKEN)


async def post(http: httpx.AsyncClient, query: str, headers=ADMIN, **variables) -> httpx.Response:
    return await http.post(
        "/graphql", json={"query": query, "variables": variables}, headers=headers
    )


def error_code(response: httpx.Response) -> str:
    """The one error's code; checks the body is the GraphQL error shape with no stack trace."""
    assert response.status_code != 500
    assert response.headers["content-type"].startswith("application/json"), response.text
    assert "Traceback" not in response.text and 'File "' not in response.text
    body = response.json()
    assert body["data"] is None
    assert len(body["errors"]) == 1, body
    assert body["errors"][0]["message"]
    return body["errors"][0]["extensions"]["code"]


# --- health, GraphiQL, authentication ---------------------------------------------------------


async def test_healthz_is_200_once_the_database_answers(http):
    response = await http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_graphiql_on_get(http):
    response = await http.get("/graphql", headers={"accept": "text/html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "GraphiQL" in response.text
    # It names its icon (none), as the console does: a browser would otherwise ask for
    # /favicon.ico, which the service does not serve (a 404 in the log at each page load).
    assert '<link rel="icon" href="data:," />' in response.text


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("{ viewer { principal } }", "queries"),
        ('mutation { createAccount(input: {name: "x"}) { name } }', "mutations"),
    ],
)
async def test_queries_over_get_are_refused_clearly(http, query, kind):
    response = await http.get("/graphql", params={"query": query}, headers=ADMIN)
    assert response.status_code == 400
    assert error_code(response) == "BAD_REQUEST"
    # Strawberry's words ("queries are not allowed when using GET") said not how to send one.
    assert response.json()["errors"][0]["message"] == (
        f"{kind} are not run over GET, which serves GraphiQL: POST the request as "
        'application/json, {"query": ..., "variables": {...}}'
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("eng_not-a-real-token"),
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
        {"Authorization": "Bearer"},
    ],
    ids=["no token", "unknown token", "wrong scheme", "empty bearer"],
)
async def test_without_a_valid_token_unauthenticated(http, headers):
    response = await post(http, "{ viewer { principal } }", headers=headers)
    assert response.status_code == 401
    assert error_code(response) == "UNAUTHENTICATED"
    assert "Authorization: Bearer" in response.text or "not valid" in response.text


async def test_bearer_said_twice_is_told_so(http):
    """A client that puts the scheme before a value holding it already is told that, not that
    its token is not valid (which sends a person to ask for a new one)."""
    response = await post(
        http, "{ viewer { principal } }", headers={"Authorization": f"Bearer Bearer {ADMIN_TOKEN}"}
    )
    assert response.status_code == 401
    assert error_code(response) == "UNAUTHENTICATED"
    assert response.json()["errors"][0]["message"] == (
        "the Authorization header says `Bearer` twice: send `Authorization: Bearer <token>`, "
        "the word once"
    )


async def test_two_authorization_headers_are_refused_whatever_they_say(http):
    """The header takes one value: of two, the service read the first, where a proxy in front
    may have checked or logged the other; so none is read. The same at /graphql, /mcp and
    /metrics, even when both say the same."""
    for second in (ADMIN_TOKEN, "eng_not-a-real-token"):
        headers = [
            ("authorization", f"Bearer {ADMIN_TOKEN}"),
            ("authorization", f"Bearer {second}"),
        ]
        said = (
            "the request sends 2 Authorization headers: send one, `Authorization: Bearer <token>`"
        )
        response = await post(http, "{ viewer { principal } }", headers=headers)
        assert response.status_code == 401
        assert error_code(response) == "UNAUTHENTICATED"
        assert response.json()["errors"][0]["message"] == said
        metrics = await http.get("/metrics", headers=headers)
        assert metrics.status_code == 401 and metrics.json()["errors"][0]["message"] == said
        mcp = await http.post("/mcp/00000000-0000-4000-8000-000000000000", json={}, headers=headers)
        assert mcp.status_code == 401 and mcp.headers["www-authenticate"] == "Bearer"
        assert mcp.json()["error"]["data"] == {"code": "UNAUTHENTICATED"}
        assert mcp.json()["error"]["message"] == said
    # One header, in any case, is read as ever.
    for name in ("authorization", "AUTHORIZATION"):
        response = await post(
            http, "{ viewer { principal } }", headers=[(name, f"bearer {ADMIN_TOKEN}")]
        )
        assert response.json() == {"data": {"viewer": {"principal": "admin"}}}


async def test_bootstrap_token_is_an_admin_token(http):
    response = await post(http, "{ viewer { principal } }")
    assert response.status_code == 200
    assert response.json() == {"data": {"viewer": {"principal": "admin"}}}


async def test_round_trip_account_client_token_action(http):
    account = (
        await post(http, 'mutation { createAccount(input: {name: "acme"}) { accountId } }')
    ).json()
    account_id = account["data"]["createAccount"]["accountId"]
    policy = {
        "effect": "ALLOW",
        "actions": ["SELECT", "INSERT", "UPDATE"],
        "resources": ["financial.Action.*"],
    }
    client = await post(
        http,
        "mutation($input: ClientInput!) { createClient(input: $input) { principal } }",
        input={"accountId": account_id, "principal": "bot", "name": "Bot", "policies": [policy]},
    )
    assert client.json() == {"data": {"createClient": {"principal": "bot"}}}
    token = (
        await post(
            http,
            """mutation($a: UUID) {
                 createClientToken(principal: "bot", accountId: $a) { token tokenId } }""",
            a=account_id,
        )
    ).json()["data"]["createClientToken"]
    bot = bearer(token["token"])
    # The viewer names the token the request sent: a console tells its own token by it.
    viewer = await post(http, "{ viewer { accountId principal tokenId } }", headers=bot)
    assert viewer.json()["data"]["viewer"] == {
        "accountId": account_id,
        "principal": "bot",
        "tokenId": token["tokenId"],
    }
    admins = (await post(http, "{ viewer { tokenId } }")).json()["data"]["viewer"]["tokenId"]
    assert admins not in (None, token["tokenId"])
    created = await post(
        http, 'mutation { createAction(input: {name: "a"}) { actionId version } }', headers=bot
    )
    assert created.json()["data"]["createAction"]["version"] == 1
    # Its policies name only actions: clients are out of reach.
    refused = await post(http, '{ client(principal: "bot") { name } }', headers=bot)
    assert refused.status_code == 200
    assert error_code(refused) == "ACCESS_DENIED"
    # The admin of the default account does not see the tenant's action in its own account.
    action_id = created.json()["data"]["createAction"]["actionId"]
    mine = await post(http, "{ actions(first: 1000) { nodes { actionId } } }")
    assert action_id not in [n["actionId"] for n in mine.json()["data"]["actions"]["nodes"]]

    deleted = await post(
        http,
        'mutation($a: UUID) { deleteClient(principal: "bot", accountId: $a) { principal } }',
        a=account_id,
    )
    assert deleted.json()["data"]["deleteClient"] == {"principal": "bot"}
    gone = await post(http, "{ viewer { principal } }", headers=bot)
    assert gone.status_code == 401
    assert error_code(gone) == "UNAUTHENTICATED"


# --- bad input is BAD_REQUEST, never a 500 ----------------------------------------------------


async def test_malformed_uuid_literal(http):
    """The refusal names the scalar and shows a UUID, and points at the literal (it said
    "Value cannot represent a UUID", Value being the JSON scalar, with no location)."""
    response = await post(http, '{ action(actionId: "not-a-uuid") { name } }')
    assert error_code(response) == "BAD_REQUEST"
    [error] = response.json()["errors"]
    assert "'UUID'" in error["message"] and "Value cannot" not in error["message"]
    assert "0a1b2c3d-0000-4000-8000-00000000000a" in error["message"]
    assert error["locations"] == [{"line": 1, "column": 20}]


async def test_malformed_uuid_variable(http):
    response = await post(http, "query($id: UUID!) { action(actionId: $id) { name } }", id="12345")
    assert error_code(response) == "BAD_REQUEST"
    [error] = response.json()["errors"]
    assert "$id" in error["message"] and "Value cannot" not in error["message"]
    assert "not a UUID" in error["message"]


async def test_a_variable_declared_with_another_type_says_the_declaration_to_write(http):
    """A turn's `input` declared `String!` (the schema's `Value` goes there) was refused in
    graphql-core's words alone; the refusal now says the declaration that is right."""
    turn = (
        "mutation($id: UUID!, $input: String!) { executeAction(input: {actionId: $id, "
        'sessionId: "s", input: $input}) { status } }'
    )
    response = await post(http, turn, id="0a1b2c3d-0000-4000-8000-00000000000a", input="hi")
    assert error_code(response) == "BAD_REQUEST"
    [error] = response.json()["errors"]
    assert error["message"] == (
        "Variable '$input' of type 'String!' used in position expecting type 'Value': "
        "declare it as `$input: Value`"
    )
    nullable = "query($id: UUID) { action(actionId: $id) { name } }"
    response = await post(http, nullable, id="0a1b2c3d-0000-4000-8000-00000000000a")
    assert error_code(response) == "BAD_REQUEST"
    assert response.json()["errors"][0]["message"].endswith("declare it as `$id: UUID!`")


async def test_a_global_id_where_a_uuid_goes_says_which_to_pass(http):
    """A record's `id` (global, for node) passed as agentMemory's `id` (its memoryId)."""
    memory_id = "0a1b2c3d-0000-4000-8000-00000000000a"
    record = global_id("ActionAgentMemory", memory_id, memory_id)
    query = "query($a: UUID!, $m: UUID!) { agentMemory(actionId: $a, id: $m) { memoryId } }"
    for variables in ({"a": memory_id, "m": record}, {"a": record, "m": memory_id}):
        response = await post(http, query, **variables)
        assert error_code(response) == "BAD_REQUEST"
        [error] = response.json()["errors"]
        assert (
            "not a UUID but a global `id` (of ActionAgentMemory): pass the object's UUID here "
            "(its memoryId, actionId, executionId, tokenId or accountId field), or read it with "
            "node(id)"
        ) in error["message"]
    action = global_id("Action", memory_id, 1)
    answer = (await post(http, '{ action(actionId: "' + action + '") { name } }')).json()
    assert "a global `id` (of Action)" in answer["errors"][0]["message"]


async def test_a_uuid_where_a_global_id_goes_says_which_to_pass(http):
    """An agent's actionId passed to node(id), which takes its global `id`: the refusal said only
    that it is not a global ID."""
    action_id = "0a1b2c3d-0000-4000-8000-00000000000a"
    for query in (
        "query($i: ID!) { node(id: $i) { id } }",
        "query($i: ID!) { nodes(ids: [$i]) { id } }",
    ):
        response = await post(http, query, i=action_id)
        assert error_code(response) == "BAD_REQUEST"
        [error] = response.json()["errors"]
        assert (
            f"'{action_id}' is not a global ID but a UUID (an object's memoryId, actionId, "
            "executionId, tokenId or accountId field): pass the object's `id` field here, or read "
            "it by its UUID with the field of its type (`action(actionId)`, "
            "`agentMemory(actionId, id)`, `execution(executionId)`)"
        ) in error["message"]
    # Another string is refused as before, naming no UUID.
    response = await post(http, "query($i: ID!) { node(id: $i) { id } }", i="not an id")
    assert response.json()["errors"][0]["message"] == "'not an id' is not a global ID"


async def test_a_cursor_where_a_uuid_goes_is_not_called_a_global_id(http):
    """A listing's cursor is base64 JSON too, its binding a hex digest first: one starting with
    a letter (as a `clients` cursor's might) is no object's global `id`, and is refused as any
    other string that is not a UUID, not as `a global id (of e3b0c44298fc1c14)`."""
    from app.db import cursors

    for cursor in (
        cursors.pack(["e3b0c44298fc1c14", "p-1"]),
        cursors.pack(["abcdef0123456789", {"t": "2026-01-01T00:00:00+00:00"}, {"u": "x"}]),
    ):
        answer = (await post(http, '{ action(actionId: "' + cursor + '") { name } }')).json()
        message = answer["errors"][0]["message"]
        assert "not a UUID: write it as 32 hex digits" in message, message
        assert "global" not in message, message


async def test_unknown_field(http):
    response = await post(http, "{ viewer { principal password } }")
    assert error_code(response) == "BAD_REQUEST"
    assert "password" in response.json()["errors"][0]["message"]


async def test_unknown_input_field(http):
    response = await post(
        http, 'mutation { createAction(input: {name: "a", owner: "x"}) { version } }'
    )
    assert error_code(response) == "BAD_REQUEST"
    assert "owner" in response.json()["errors"][0]["message"]


async def test_unknown_variable_input_field(http):
    response = await post(
        http,
        "mutation($i: ActionInput!) { createAction(input: $i) { version } }",
        i={"name": "a", "owner": "x"},
    )
    assert error_code(response) == "BAD_REQUEST"


async def test_unknown_harness_field(http):
    response = await post(
        http,
        "mutation($i: ActionInput!) { createAction(input: $i) { version } }",
        i={"name": "a", "harness": {"memory": {"enabled": True, "recall": "always"}}},
    )
    assert error_code(response) == "BAD_REQUEST"
    assert "unknown field 'recall'" in response.json()["errors"][0]["message"]


async def test_syntax_error(http):
    response = await post(http, "{ viewer { principal ")
    assert error_code(response) == "BAD_REQUEST"


TOO_BIG = (
    f"request bodies are limited to {MAX_BODY} bytes (ENGRAM_MAX_BODY_BYTES): nothing ran; send "
    "less in one request (fewer records or messages at once), or have the operator raise the "
    "limit"
)


async def test_oversized_body_with_content_length(http):
    padding = "x" * MAX_BODY
    response = await http.post(
        "/graphql",
        json={"query": "{ viewer { principal } }", "variables": {"pad": padding}},
        headers=ADMIN,
    )
    assert response.status_code == 413
    assert error_code(response) == "BAD_REQUEST"
    assert response.json()["errors"][0]["message"] == TOO_BIG


async def test_oversized_chunked_body(http):
    async def chunks():
        yield b'{"query": "{ viewer { principal } }", "pad": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    response = await http.post(
        "/graphql", content=chunks(), headers={**ADMIN, "content-type": "application/json"}
    )
    assert response.status_code == 413
    assert error_code(response) == "BAD_REQUEST"
    assert response.json()["errors"][0]["message"] == TOO_BIG


async def test_body_just_under_the_limit_is_served(http):
    query = "{ viewer { principal } }"
    pad = "x" * (MAX_BODY - 200)
    response = await http.post(
        "/graphql", json={"query": query, "variables": {"pad": pad}}, headers=ADMIN
    )
    assert response.status_code == 200
    assert response.json()["data"]["viewer"]["principal"] == "admin"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b"\xff\xfe", b'{"query": "{ viewer { principal } }"'],
    ids=["garbage", "empty", "not utf-8", "truncated"],
)
async def test_invalid_json(http, body):
    response = await http.post(
        "/graphql", content=body, headers={**ADMIN, "content-type": "application/json"}
    )
    assert response.status_code == 400
    assert error_code(response) == "BAD_REQUEST"
    assert "not valid JSON" in response.text


@pytest.mark.parametrize(
    "payload",
    [[{"query": "{ viewer { principal } }"}], "query", 5, {}, {"query": 5}, {"variables": {}}],
    ids=["batch", "string", "number", "empty object", "query not a string", "no query"],
)
async def test_json_that_is_not_a_graphql_request(http, payload):
    response = await http.post("/graphql", json=payload, headers=ADMIN)
    assert response.status_code == 400
    assert error_code(response) == "BAD_REQUEST"


async def test_a_batch_of_requests_is_refused_saying_to_send_each_alone(http):
    """A client that batches (an array of requests, as some GraphQL clients do) read "send a
    JSON object such as ...", as if its JSON were no request at all."""
    batch = [{"query": "{ viewer { principal } }"}, {"query": "{ viewer { accountId } }"}]
    response = await http.post("/graphql", json=batch, headers=ADMIN)
    assert response.status_code == 400
    assert error_code(response) == "BAD_REQUEST"
    assert response.json()["errors"][0]["message"] == (
        "a batch (a JSON array of requests) is not taken: send each request alone, as a JSON "
        'object such as {"query": "{ viewer { principal } }"}'
    )


async def test_variables_not_an_object(http):
    response = await http.post(
        "/graphql", json={"query": "{ viewer { principal } }", "variables": [1]}, headers=ADMIN
    )
    assert response.status_code == 400
    assert error_code(response) == "BAD_REQUEST"


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("operationName", 5, "operationName must be a string or null"),
        ("operationName", ["Q"], "operationName must be a string or null"),
        ("extensions", "x", "extensions must be an object or null"),
        ("variables", "{}", "variables must be an object or null"),
        # The variables sent as their JSON text (serialized twice).
        (
            "variables",
            '{"id": "x"}',
            "variables must be an object or null, not a string holding its JSON: send the "
            "object itself, not its text",
        ),
    ],
)
async def test_request_fields_of_the_wrong_type_are_refused_by_name(http, field, value, said):
    """(`operationName: 5` was read as the name "5".)"""
    payload = {"query": "query Q { viewer { principal } }", field: value}
    response = await http.post("/graphql", json=payload, headers=ADMIN)
    assert response.status_code == 400
    assert error_code(response) == "BAD_REQUEST"
    assert said in response.json()["errors"][0]["message"]
    named = {"query": "query Q { viewer { principal } }", "operationName": "Q", "extensions": None}
    assert (await http.post("/graphql", json=named, headers=ADMIN)).json()["data"]["viewer"]


async def test_query_at_the_depth_limit_is_served(http):
    response = await post(http, "{ actions(first: 1) { pageInfo { hasNextPage } } }")
    assert response.status_code == 200
    assert "errors" not in response.json()
    assert isinstance(response.json()["data"]["actions"]["pageInfo"]["hasNextPage"], bool)


async def test_deeply_nested_query(http):
    response = await post(http, "{ actions(first: 1) { edges { node { actionId } } } }")
    assert error_code(response) == "BAD_REQUEST"
    message = response.json()["errors"][0]["message"]
    assert "exceeds maximum operation depth of 2 (ENGRAM_MAX_QUERY_DEPTH)" in message
    assert "it nests fields 3 deep, and nothing ran; ask for less nesting" in message


async def test_a_query_past_the_token_limit_names_the_setting_and_what_to_do(http):
    """The limit counts the query's own tokens: the same values passed as variables fit."""
    names = ["executeAction"] * 100  # as many as `allowed` takes; twice, past MAX_TOKENS
    asked = json.dumps(names)
    literal = f"{{ viewer {{ a: allowed(operations: {asked}) {{ allowed }} "
    literal += f"b: allowed(operations: {asked}) {{ allowed }} }} }}"
    response = await post(http, literal)
    assert response.status_code == 200
    assert error_code(response) == "BAD_REQUEST"
    assert response.json()["errors"][0]["message"] == (
        f"the request's query holds more than {MAX_TOKENS:,} tokens (names, punctuation and "
        f"values); a query may hold at most {MAX_TOKENS:,} (ENGRAM_MAX_QUERY_TOKENS): nothing "
        "ran; pass long values and lists as variables, which do not count, or split the request"
    )
    variables = """query($o: [String!]!) {
      viewer { a: allowed(operations: $o) { allowed } b: allowed(operations: $o) { allowed } } }"""
    response = await http.post(
        "/graphql", json={"query": variables, "variables": {"o": names}}, headers=ADMIN
    )
    assert len(response.json()["data"]["viewer"]["b"]) == 100, response.json()


async def test_deeply_nested_fragments(http):
    query = """
    query { actions(first: 1) { ...A } }
    fragment A on ActionConnection { edges { ...B } }
    fragment B on ActionEdge { node { actionId } }
    """
    response = await post(http, query)
    assert error_code(response) == "BAD_REQUEST"


async def test_huge_token_count(http):
    query = "{ " + " ".join(f"a{i}: viewer {{ principal }}" for i in range(60)) + " }"
    assert len(query) < MAX_BODY
    response = await post(http, query)
    assert error_code(response) == "BAD_REQUEST"
    assert "token" in response.json()["errors"][0]["message"].lower()


async def test_internal_error_over_http_is_masked(http, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("connection string postgresql://secret@db")

    monkeypatch.setattr(actions_service, "create_action", broken)
    response = await post(http, 'mutation { createAction(input: {name: "a"}) { version } }')
    assert response.status_code == 200
    assert error_code(response) == "INTERNAL"
    assert response.json()["errors"][0]["message"] == "Internal error."
    assert "secret" not in response.text


def test_graphql_over_a_websocket_is_refused(settings, embedder):
    """The schema has no subscriptions: a WebSocket on /graphql (which would build its context
    from no HTTP request, so without the token's check) is not accepted, even where the ASGI
    server speaks WebSocket."""
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    from app.main import create_app

    with TestClient(create_app(settings, embedder=embedder)) as client:
        with (
            pytest.raises(WebSocketDisconnect),
            client.websocket_connect("/graphql", subprotocols=["graphql-transport-ws"]) as ws,
        ):
            ws.send_json({"type": "connection_init"})
            ws.receive_json()
        assert client.get("/healthz").status_code == 200


async def test_a_client_gone_before_its_body_is_no_fault_of_the_service(http, base_url, caplog):
    """A client that closes the connection halfway through its body (no token needed) is
    counted and logged as closed by the client (499), never as an internal error."""
    host, port = base_url.removeprefix("http://").split(":")
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /graphql HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 1000\r\n\r\n" + b'{"query": "{ vie'
            )
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        async def logged() -> bool:
            return sum(" 499 " in r.getMessage() for r in caplog.records) >= 2

        for _ in range(100):
            if await logged():
                break
            await asyncio.sleep(0.05)
    closed = [r for r in caplog.records if r.name == "app.access" and " 499 " in r.getMessage()]
    assert len(closed) == 2, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    metrics = (await http.get("/metrics", headers=ADMIN)).text
    assert 'engram_requests_total{code="CLIENT_CLOSED",operation="-"} 2.0' in metrics
    assert 'code="INTERNAL",operation="-"' not in metrics  # a 500 before GraphQL ran


async def test_a_body_of_another_content_type_is_told_to_be_sent_as_json(http):
    body = '{"query": "{ viewer { principal } }"}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        response = await http.post(
            "/graphql", content=body, headers={**ADMIN, "content-type": content_type}
        )
        assert response.status_code == 400
        assert error_code(response) == "BAD_REQUEST"
        message = response.json()["errors"][0]["message"]
        assert "application/json" in message, message


async def test_a_fault_before_graphql_runs_answers_500_and_is_counted_once_as_internal(
    http, monkeypatch, caplog
):
    """A fault outside GraphQL (here in the token check) answers 500 INTERNAL in the GraphQL
    shape, masked, with the request's X-Request-ID, is logged once with its traceback, and
    engram_requests_total counts it once, under INTERNAL, as the README says of its `code` (an
    error code, not the HTTP status)."""
    import app.main

    async def broken(*args, **kwargs):
        raise RuntimeError("connection string postgresql://secret@db")

    monkeypatch.setattr(app.main, "authenticate_sent", broken)
    response = await post(http, "{ viewer { principal } }")
    monkeypatch.undo()
    assert response.status_code == 500
    assert response.json() == {
        "data": None,
        "errors": [{"message": "Internal error.", "extensions": {"code": "INTERNAL"}}],
    }
    assert response.headers.get("x-request-id")  # as every answer, to find its log line
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["unhandled error on /graphql"]  # logged once
    metrics = (await http.get("/metrics", headers=ADMIN)).text
    assert 'engram_requests_total{code="INTERNAL",operation="-"} 1.0' in metrics, metrics


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
async def test_a_method_graphql_does_not_take_is_405_in_the_error_shape(http, method):
    """Answered as the service's other refusals (FastAPI's `{"detail": ...}` before), with the
    methods /graphql does take in its Allow header and its message."""
    response = await http.request(method, "/graphql", json={"query": "{ viewer { principal } }"})
    assert response.status_code == 405
    assert error_code(response) == "BAD_REQUEST"
    assert set(response.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}
    assert "/graphql takes POST" in response.json()["errors"][0]["message"]


async def test_head_on_graphql_answers_as_get_without_a_body(http):
    """Its Allow header names HEAD: a HEAD was refused 405 (strawberry's), without Allow."""
    response = await http.head("/graphql", headers={"accept": "text/html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.content == b""


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_an_address_nothing_serves_is_404_in_the_error_shape(http, method):
    response = await http.request(method, "/graphq1", headers=ADMIN)
    assert response.status_code == 404
    assert error_code(response) == "NOT_FOUND"
    assert "/graphql" in response.json()["errors"][0]["message"]
    # The root, which a person opens first in a browser, names every address served.
    root = await http.request(method, "/")
    assert root.status_code == 404
    assert root.json()["errors"][0]["message"] == (
        "nothing is served at this address: GraphQL is at /graphql (GraphiQL in a browser), "
        "the admin console at /console, health at /healthz, and each agent's MCP server at "
        "/mcp/<actionId>"
    )


async def test_a_static_file_named_as_a_folder_is_404_as_the_consoles(http):
    """GraphiQL's assets under /static, as the console's files: a file's name with a trailing
    slash (/static/README.md/) names no folder, and is 404 NOT_FOUND (StaticFiles dropped the
    slash and served the file), as are names no file may have."""
    files = ("/static/README.md", "/static/graphiql-3.8.3/graphiql.min.js")
    for path in files:
        assert (await http.get(path)).status_code == 200, path
    for path in (*(f"{path}/" for path in files), "/static/a%00b/", f"/static/{'x' * 300}/"):
        response = await http.get(path)
        assert response.status_code == 404, path
        assert error_code(response) == "NOT_FOUND", path


async def _status_as_sent(base_url: str, target: str) -> int:
    """The status a GET of `target` is answered, sent as it is (httpx resolves its dot
    segments first, as browsers do)."""
    url = httpx.URL(base_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        await writer.drain()
        return int((await asyncio.wait_for(reader.readline(), 30)).split()[1])
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_static_path_with_a_dot_segment_is_404(http, base_url):
    """A path with a segment "." or ".." (/console/index.html/.), sent so or escaped (%2e), is
    404 NOT_FOUND as a file named as a folder is: StaticFiles resolved it, serving the file or
    the console's page under a name no browser asks for."""
    files = ("/console/index.html", "/console/app.js", "/static/README.md")
    for path in files:
        assert await _status_as_sent(base_url, path) == 200, path
    for path in files:
        for tail in ("/.", "/..", "/x/..", "/./", "/x/../"):
            assert await _status_as_sent(base_url, path + tail) == 404, path + tail
        for tail in ("/%2e", "/%2E%2E", "/x/%2e%2e"):
            response = await http.get(path + tail)
            assert response.status_code == 404, path + tail
            assert error_code(response) == "NOT_FOUND", path + tail


async def test_a_method_another_address_does_not_take_is_405_naming_those_it_does(http):
    response = await http.post("/healthz")
    assert response.status_code == 405
    assert error_code(response) == "BAD_REQUEST"
    assert response.headers["allow"] == "GET"
    assert response.json()["errors"][0]["message"] == "this address takes GET only"
