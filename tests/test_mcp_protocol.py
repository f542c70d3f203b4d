"""MCP at /mcp/{actionId}: JSON-RPC as each protocol version takes it, over real HTTP (the app
served by uvicorn on loopback), posted by hand as a client library's developer would see it.

A refusal says what is wrong and what it takes: which member or parameter, of what type, what
the method or protocol version takes instead. Never a Python or pydantic text."""

import asyncio
import json
import logging
import re
import uuid
from typing import Any

import httpx
import pytest
from factories import allow, full_memory, make_agent_id, memory_harness, token_for
from helpers import GQL, eventually
from openai_server import CHAT, OpenAIServer

from app.auth import service as auth_service
from app.auth.caller import Caller
from app.state import AppState

pytestmark = pytest.mark.usefixtures("model_server")

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
POLICIES = (
    allow(["INSERT"], "financial.ActionExecution.document"),
    allow(["SELECT", "INSERT", "UPDATE"], "financial.AgentMemory.*"),
)
PYDANTIC = ("validation error", "pydantic", "input_value", "type=", "Invalid request parameters")


async def _client(gql: GQL, admin: Caller, state: AppState, name: str) -> tuple[str, str]:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    return action_id, await token_for(state, admin, name, *POLICIES)


def _headers(token: str, version: str | None, body: Any = None) -> dict[str, str]:
    headers = {
        "Authorization": f"Bearer {token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
    }
    if version is not None:
        headers["mcp-protocol-version"] = version
    if version == MODERN and isinstance(body, dict):  # the modern routing headers
        headers["mcp-method"] = str(body.get("method"))
        name = (body.get("params") or {}).get("name")
        if isinstance(name, str):
            headers["mcp-name"] = name
    return headers


async def _post(
    http: httpx.AsyncClient, action_id: str, token: str, version: str | None, body: Any
) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = _headers(token, version, body)
    return await http.post(f"/mcp/{action_id}?session=s1", content=content, headers=headers)


def _plain(text: str) -> None:
    """No Python or pydantic text in an answer."""
    assert not any(word in text for word in PYDANTIC), text


async def _executions(state: AppState, action_id: str) -> int:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(
            "SELECT count(*) FROM executions WHERE action_id = $1", uuid.UUID(action_id)
        )


def _call(id_: Any, name: Any = "search_memory", **params: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": {"query": "parcel"}, **params}
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


async def test_mcp_a_batch_at_2025_03_26_is_served_message_by_message(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """2025-03-26 (also a request without MCP-Protocol-Version, which a server "SHOULD assume"
    is 2025-03-26): implementations "MUST support receiving JSON-RPC batches". The SDK answered
    any batch -32602 with pydantic's validation text. Each message is now served as if posted
    alone, the answers to its requests in one array, in order; a message that is none, and
    `initialize` ("MUST NOT be part of a JSON-RPC batch"), answered its own Invalid Request."""
    action_id, token = await _client(gql, admin, state, "batcher")
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        _call("call-2"),
        {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {}},
        7,
        {"jsonrpc": "2.0", "id": 4, "method": "ping"},
    ]
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for version in ("2025-03-26", None):
            response = await _post(http, action_id, token, version, batch)
            assert response.status_code == 200, (version, response.text)
            answers = response.json()
            assert [a["id"] for a in answers] == [1, "call-2", 3, None, 4], answers
            assert [t["name"] for t in answers[0]["result"]["tools"]] == [
                "search_memory",
                "remember_conversation",
            ]
            assert answers[1]["result"]["isError"] is False, answers[1]
            assert answers[2]["error"]["code"] == -32600
            assert answers[2]["error"]["message"] == (
                "Invalid Request: initialize must not be part of a JSON-RPC batch (MCP "
                "2025-03-26): send it on its own"
            )
            assert answers[3]["error"] == {
                "code": -32600,
                "message": "Invalid Request: a JSON-RPC message is an object, not a number "
                "(message 5 of the batch)",
                "data": {"code": "BAD_REQUEST"},
            }
            assert answers[4]["result"] == {}
        assert await _executions(state, action_id) == 2  # each call in a batch is one

        # Notifications (and responses) only: 202 and no body, as for one posted alone.
        only = [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
        response = await _post(http, action_id, token, "2025-03-26", only)
        assert response.status_code == 202 and response.content == b"", response.text
        # Nothing taken: HTTP 400, each message's refusal in the array.
        response = await _post(http, action_id, token, None, [{"id": 1}])
        assert response.status_code == 400, response.text
        assert response.json() == [
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": -32600,
                    "message": 'Invalid Request: a JSON-RPC 2.0 message has "jsonrpc": "2.0" '
                    "(it is missing) (message 1 of the batch)",
                    "data": {"code": "BAD_REQUEST"},
                },
            }
        ]
        # An empty batch is an Invalid Request (JSON-RPC 2.0), and so is one past the bound.
        for body, words in (
            ([], "an empty batch: a batch is an array of one or more messages"),
            ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}] * 21, "at most 20 messages"),
        ):
            response = await _post(http, action_id, token, "2025-03-26", body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == -32600 and words in error["message"], error
    assert await _executions(state, action_id) == 2


def _add(id_: Any, summary: str) -> dict[str, Any]:
    arguments = {"summary": summary, "kind": "fact", "scope": "agent"}
    params = {"name": "add_memory", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


REMEMBER = {
    "jsonrpc": "2.0",
    "id": "remember",
    "method": "tools/call",
    "params": {
        "name": "remember_conversation",
        "arguments": {"messages": [{"role": "user", "content": "the parcel came"}]},
    },
}


async def _waiting_on_a_lock(state: AppState) -> int:
    async with state.pool.acquire() as conn:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
        )


# Held by the test, it makes each add_memory wait at its write (SHARE lets reads through, so
# the memory review of remember_conversation, which keeps nothing here, does not wait).
HOLD_WRITES = "LOCK TABLE agent_memories IN SHARE MODE"


@pytest.mark.settings(max_requests_per_account=1, account_queue_seconds=0)
async def test_mcp_each_message_of_a_batch_runs_holding_the_accounts_place(
    gql: GQL, admin: Caller, state: AppState, base_url: str, model_server: OpenAIServer
) -> None:
    """A batch holds one of the account's places (ENGRAM_MAX_REQUESTS_PER_ACCOUNT) while its
    messages run. remember_conversation gives its request's place back for its turn
    (app/fairness.py `turn`): the messages after it ran holding none, so any number of batches
    could run at once past a first remember_conversation. The next message takes the place
    again, or it and the requests after it are refused TOO_MANY_REQUESTS in the array."""
    action_id = await make_agent_id(gql.state, admin, harness=full_memory())
    token = await token_for(state, admin, "fair-batcher", *POLICIES)
    listing = {"jsonrpc": "2.0", "id": "other", "method": "tools/list"}
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        async with state.pool.acquire() as lock, lock.transaction():
            await lock.execute(HOLD_WRITES)
            batch = asyncio.create_task(
                _post(http, action_id, token, "2025-03-26", [REMEMBER, _add(2, "after")])
            )
            await eventually(lambda: _waiting_on_a_lock(state), "the batch's add_memory waits")
            # The account's one place is the batch's, running its add_memory.
            other = await _post(http, action_id, token, "2025-03-26", listing)
            assert other.status_code == 429, other.text
            assert other.json()["error"]["data"]["code"] == "TOO_MANY_REQUESTS"
        answered = await batch
        assert answered.status_code == 200, answered.text
        assert [a["result"]["isError"] for a in answered.json()] == [False, False]

        # A request that took the place meanwhile (it waits at its write): the batch's next
        # message is refused, as the request would be, and said so in the array.
        model_server.stall_next(1, 3, path=CHAT)
        asked = len(model_server.requests_to(CHAT))
        async with state.pool.acquire() as lock, lock.transaction():
            await lock.execute(HOLD_WRITES)
            batch = asyncio.create_task(
                _post(
                    http,
                    action_id,
                    token,
                    "2025-03-26",
                    [REMEMBER, _add(2, "refused"), {"jsonrpc": "2.0", "id": 3, "method": "ping"}],
                )
            )
            await eventually(
                lambda: len(model_server.requests_to(CHAT)) > asked, "the review's model call"
            )
            single = asyncio.create_task(
                _post(http, action_id, token, "2025-03-26", _add(1, "single"))
            )
            await eventually(lambda: _waiting_on_a_lock(state), "the single add_memory waits")
            answered = await batch
        assert (await single).status_code == 200
    assert answered.status_code == 200, answered.text
    assert answered.headers["retry-after"] == "1"
    first, *refused = answered.json()
    assert first["id"] == "remember" and first["result"]["isError"] is False, first
    assert [(a["id"], a["error"]["code"], a["error"]["data"]) for a in refused] == [
        (2, -32000, {"code": "TOO_MANY_REQUESTS"}),
        (3, -32000, {"code": "TOO_MANY_REQUESTS"}),
    ]
    assert "1 requests in progress here" in refused[0]["error"]["message"]
    async with state.pool.acquire() as conn:
        kept = await conn.fetch(
            "SELECT summary FROM agent_memories WHERE action_id = $1 ORDER BY summary",
            uuid.UUID(action_id),
        )
    assert [r["summary"] for r in kept] == ["after", "single"]


async def test_mcp_a_batch_whose_client_leaves_runs_no_message_after_the_one_running(
    gql: GQL, admin: Caller, state: AppState, base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that leaves mid-batch is answered by no one: the message running ends as a
    request posted alone would (committed), and the messages after it are not run (all of
    them ran, writing what no one would be told of). Logged as closed by the client, 499."""
    action_id = await make_agent_id(gql.state, admin, harness=full_memory())
    token = await token_for(state, admin, "leaver", *POLICIES)
    batch = [_add(1, "first"), _add(2, "second"), _add(3, "third")]
    with caplog.at_level(logging.INFO):
        async with state.pool.acquire() as lock, lock.transaction():
            await lock.execute(HOLD_WRITES)
            async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
                posted = asyncio.create_task(_post(http, action_id, token, "2025-03-26", batch))
                await eventually(lambda: _waiting_on_a_lock(state), "the first add_memory waits")
                posted.cancel()  # the client leaves, closing its connection
                with pytest.raises(asyncio.CancelledError):
                    await posted

        def closed() -> bool:
            return any(" 499 " in r.getMessage() for r in caplog.records)

        await eventually(closed, "the batch logged as closed by its client")
    async with state.pool.acquire() as conn:
        runs = await conn.fetch(
            "SELECT status FROM executions WHERE action_id = $1", uuid.UUID(action_id)
        )
        kept = await conn.fetch(
            "SELECT summary FROM agent_memories WHERE action_id = $1", uuid.UUID(action_id)
        )
    assert [r["status"] for r in runs] == ["SUCCEEDED"]
    assert [r["summary"] for r in kept] == ["first"]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_mcp_a_batch_runs_no_message_after_its_token_is_revoked_or_narrowed(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """Each message of a batch is served as if posted alone, so each is checked as a request
    is: a token revoked while the batch runs (a leaked one, whose batch of 20 calls could run
    for ENGRAM_TURN_TIMEOUT_SECONDS after) starts none of the messages after the one running,
    each request left answered UNAUTHENTICATED in its place; grants narrowed meanwhile hold for
    the messages after, as for a request sent then. The message running is checked again as it
    commits, and keeps nothing (docs/access.md)."""
    action_id = await make_agent_id(gql.state, admin, harness=full_memory())
    for principal, change, refusal, failed in [
        (
            "revoked-batcher",
            "revoke",
            (-32000, {"code": "UNAUTHENTICATED"}),
            "the API token that started this tool call was revoked, or its client deleted, "
            "while the tool call ran; nothing of this tool call was kept",
        ),
        (
            "narrowed-batcher",
            "narrow",
            None,
            "the client whose API token started this tool call is no longer allowed to INSERT "
            "financial.AgentMemory.document (its grants changed while the tool call ran); "
            "nothing of this tool call was kept",
        ),
    ]:
        token = await token_for(state, admin, principal, *POLICIES)
        batch = [_add(1, f"{change} first"), _add(2, f"{change} second"), _add(3, "third")]
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            async with state.pool.acquire() as lock, lock.transaction():
                await lock.execute(HOLD_WRITES)
                posted = asyncio.create_task(_post(http, action_id, token, "2025-03-26", batch))
                await eventually(lambda: _waiting_on_a_lock(state), "the first add_memory waits")
                if change == "revoke":
                    (issued,) = await auth_service.list_client_tokens(
                        state.pool, admin, account_id=None, principal=principal
                    )
                    await auth_service.revoke_client_token(
                        state.pool,
                        admin,
                        account_id=None,
                        principal=principal,
                        token_id=issued.token_id,
                    )
                else:  # it may run turns, and no longer write memory
                    await auth_service.update_client(
                        state.pool,
                        admin,
                        account_id=None,
                        principal=principal,
                        name=None,
                        policies=[POLICIES[0]],
                    )
            answered = await posted
        assert answered.status_code == 200, answered.text
        first, *rest = answered.json()
        assert first["id"] == 1 and first["result"]["isError"] is True, first
        assert json.loads(first["result"]["content"][0]["text"]) == {"error": failed}
        if refusal is not None:
            assert [(a["id"], a["error"]["code"], a["error"]["data"]) for a in rest] == [
                (2, *refusal),
                (3, *refusal),
            ]
            assert rest[0]["error"]["message"] == auth_service.NOT_VALID
        else:  # the tool's refusal, as for a call sent alone now
            for later in rest:
                assert later["result"]["isError"] is True, later
                assert json.loads(later["result"]["content"][0]["text"])["code"] == "ACCESS_DENIED"
    async with state.pool.acquire() as conn:
        kept = await conn.fetch(
            "SELECT summary FROM agent_memories WHERE action_id = $1 ORDER BY summary",
            uuid.UUID(action_id),
        )
    assert [r["summary"] for r in kept] == []
    assert await _executions(state, action_id) == 2


@pytest.mark.settings(turn_timeout_seconds=1)
async def test_mcp_a_batch_starts_no_message_past_one_calls_bound(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """A batch of 20 messages, run one after another, could hold its HTTP request for 20 times
    the longest one call may take (ENGRAM_TURN_TIMEOUT_SECONDS, a remember_conversation's
    bound). Once it has run that long it starts no more: each request left is answered in its
    place, -32000 TOO_MANY_REQUESTS saying it was not run and to send it again, alone or in a
    later request; a notification left is not run; a message refused as no message is
    answered as ever. The message running when the bound passes ends as it would alone."""
    action_id = await make_agent_id(gql.state, admin, harness=full_memory())
    token = await token_for(state, admin, "slow-batcher", *POLICIES)
    batch = [
        _add(1, "first"),
        _add(2, "second"),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "ping", "method": "ping"},
        7,
        _add(3, "third"),
    ]
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        async with state.pool.acquire() as lock, lock.transaction():
            await lock.execute(HOLD_WRITES)
            posted = asyncio.create_task(_post(http, action_id, token, "2025-03-26", batch))
            await eventually(lambda: _waiting_on_a_lock(state), "the first add_memory waits")
            await asyncio.sleep(1.2)  # past the bound, the first message still running
        answered = await posted
        assert answered.status_code == 200, answered.text
        assert "retry-after" not in answered.headers
        first, *rest = answered.json()
        assert first["id"] == 1 and first["result"]["isError"] is False, first
        assert [(a["id"], a["error"]["code"], a["error"]["data"]) for a in rest] == [
            (2, -32000, {"code": "TOO_MANY_REQUESTS"}),
            ("ping", -32000, {"code": "TOO_MANY_REQUESTS"}),
            (None, -32600, {"code": "BAD_REQUEST"}),
            (3, -32000, {"code": "TOO_MANY_REQUESTS"}),
        ]
        message = rest[0]["error"]["message"]
        # How long it had run: past the bound (more on a loaded machine than the 1.2 s held).
        ran = re.match(r"Not run: the batch had run (\d+\.\d) seconds when", message)
        assert ran is not None and float(ran[1]) >= 1.0, message
        assert message.endswith(
            "seconds when message 2 of 6 came up, past ENGRAM_TURN_TIMEOUT_SECONDS (1 seconds), "
            "the longest one message may run, after which a batch starts no more; nothing of it "
            "ran: send it again, alone or in a later request"
        ), message
        assert "message 6 of 6" in rest[3]["error"]["message"]

        # Within the bound, every message runs.
        answered = await _post(
            http, action_id, token, "2025-03-26", [_add(4, "fourth"), _add(5, "fifth")]
        )
        assert [a["result"]["isError"] for a in answered.json()] == [False, False], answered.text
    async with state.pool.acquire() as conn:
        kept = await conn.fetch(
            "SELECT summary FROM agent_memories WHERE action_id = $1 ORDER BY summary",
            uuid.UUID(action_id),
        )
    assert [r["summary"] for r in kept] == ["fifth", "first", "fourth"]
    assert await _executions(state, action_id) == 3


async def test_mcp_a_batch_where_the_protocol_version_takes_none_says_so(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """2025-06-18 removed batching ("Remove support for JSON-RPC batching"; the body "MUST be a
    single JSON-RPC request, notification, or response"), and 2024-11-05 predates it: a batch
    is an Invalid Request saying so (it was -32602 with pydantic's text). 2026-07-28's is the
    SDK's own refusal, which says what the body takes."""
    action_id, token = await _client(gql, admin, state, "no-batches")
    batch = [_call(1)]
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for version, why in (
            ("2025-06-18", "MCP removed batching in 2025-06-18"),
            ("2025-11-25", "MCP removed batching in 2025-06-18"),
            ("2024-11-05", "batches came with 2025-03-26"),
        ):
            response = await _post(http, action_id, token, version, batch)
            assert response.status_code == 400, (version, response.text)
            error = response.json()["error"]
            assert error["code"] == -32600
            assert error["message"] == (
                f"Invalid Request: protocol version {version} takes one JSON-RPC message per "
                f"request, not a batch (a JSON array): {why}. POST each message on its own"
            )
        modern = [{**_call(1), "params": {**_call(1)["params"], "_meta": META}}]
        response = await _post(http, action_id, token, MODERN, modern)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == {
            "code": -32600,
            "message": "Body must be a single JSON-RPC request or notification object",
        }
    assert await _executions(state, action_id) == 0


async def test_mcp_a_body_that_is_no_json_rpc_message_names_what_is_wrong(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """JSON that is no JSON-RPC message is an Invalid Request (-32600, "The JSON sent is not a
    valid Request object") naming the member at fault and what it takes: the SDK answered
    -32602, Invalid params, with pydantic's validation text for each member of its union."""
    action_id, token = await _client(gql, admin, state, "envelopes")
    cases = [
        (
            {"id": 1, "method": "ping"},
            'a JSON-RPC 2.0 message has "jsonrpc": "2.0" (it is missing)',
        ),
        (
            {"jsonrpc": "1.0", "id": 1, "method": "ping"},
            'a JSON-RPC 2.0 message has "jsonrpc": "2.0", not "1.0"',
        ),
        (
            {"jsonrpc": "2.0", "id": 1, "method": 5},
            '"method" must be a string (the method\'s name, such as "tools/call"), not a number',
        ),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "search_memory"},
            '"params" must be an object (the method\'s parameters by name), not a string',
        ),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["search_memory"]},
            '"params" must be an object (the method\'s parameters by name), not an array',
        ),
        ("5", "a JSON-RPC message is an object, not a number"),
        (
            {"jsonrpc": "2.0", "id": 1},
            'a JSON-RPC message has a "method" (a request or a notification), or a "result" '
            'or an "error" (a response): this has none',
        ),
        (
            {"jsonrpc": "2.0", "result": {}},
            'a response has the "id" of the request it answers (it is missing)',
        ),
    ]
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for version in ("2025-06-18", None):
            for body, words in cases:
                response = await _post(http, action_id, token, version, body)
                assert response.status_code == 400, (body, response.text)
                _plain(response.text)
                assert response.json()["error"] == {
                    "code": -32600,
                    "message": f"Invalid Request: {words}",
                    "data": {"code": "BAD_REQUEST"},
                }
    assert await _executions(state, action_id) == 0


async def test_mcp_params_of_the_wrong_shape_name_the_parameter_and_what_it_takes(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """Parameters a method does not take are -32602 Invalid params, as the SDK answers them, but
    saying which parameter, what it takes and what came: the SDK said "Invalid request
    parameters" and nothing else. On 2026-07-28 the same words, with its HTTP 400 ("A request
    missing any required field is malformed; the server MUST reject it with JSON-RPC error code
    -32602 (Invalid params). On HTTP, the response status MUST be 400 Bad Request"), a
    `tools/call` whose name is no string included: the SDK compared its Mcp-Name header with
    the name first, and answered -32020 HeaderMismatch whatever the header said."""
    action_id, token = await _client(gql, admin, state, "params")
    call = _call(1)
    cases = [
        (
            {**call, "params": {"name": 5, "arguments": {}}},
            "params.name must be a string (the tool's name, as tools/list gives it), not 5",
        ),
        (
            {**call, "params": {"name": {"tool": "search_memory"}, "arguments": {}}},
            "params.name must be a string (the tool's name, as tools/list gives it), not an object",
        ),
        (
            {**call, "params": {"name": True, "arguments": {}}},
            "params.name must be a string (the tool's name, as tools/list gives it), not true",
        ),
        (
            {**call, "params": {"name": None, "arguments": {}}},
            "params.name must be a string (the tool's name, as tools/list gives it), not null",
        ),
        (
            {**call, "params": {"name": "search_memory", "arguments": ["parcel"]}},
            "params.arguments must be an object (the tool's arguments by name), not an array",
        ),
        (
            {**call, "params": {"arguments": {}}},
            "params.name is required (the tool's name, as tools/list gives it)",
        ),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call"},
            'params is required (the tool and its arguments: {"name": ..., "arguments": {...}})',
        ),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": 5}},
            "params.cursor must be a string (the nextCursor of the listing before), not 5",
        ),
    ]
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for version in ("2025-06-18", MODERN):
            for body, words in cases:
                if version == MODERN:
                    if "params" not in body:  # (2026-07-28's params hold at least its _meta)
                        words = "params.name is required (the tool's name, as tools/list gives it)"
                    body = {**body, "params": {**body.get("params", {}), "_meta": META}}
                # At 2026-07-28 a name that is no string has no Mcp-Name header a client could
                # send (_headers sends none); one that renders it as text is answered the same.
                name = body.get("params", {}).get("name")
                named = [{}, {"mcp-name": json.dumps(name)}] if version == MODERN else [{}]
                for header in named if name is not None and not isinstance(name, str) else [{}]:
                    headers = {**_headers(token, version, body), **header}
                    response = await http.post(
                        f"/mcp/{action_id}?session=s1", content=json.dumps(body), headers=headers
                    )
                    assert response.status_code == (400 if version == MODERN else 200), (
                        version,
                        body,
                        response.text,
                    )
                    _plain(response.text)
                    assert response.json() == {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "error": {
                            "code": -32602,
                            "message": f"Invalid params: {words}",
                            "data": {"code": "BAD_REQUEST"},
                        },
                    }, (version, body, header)

        # A real mismatch stays the SDK's -32020 HeaderMismatch, which 2026-07-28 requires ("a
        # required standard header (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`) is
        # missing", "a header value does not match the corresponding request body value"):
        # a string name and an Mcp-Name header saying another or none; and a name that is no
        # string with another header wrong (its Mcp-Method).
        body = {**call, "params": {**call["params"], "_meta": META}}
        wrong = {**body, "params": {**body["params"], "name": 5}}
        for sent, header in (
            (body, {"mcp-name": "add_memory"}),
            (body, {"mcp-name": None}),
            (wrong, {"mcp-method": "tools/list"}),
        ):
            headers = {**_headers(token, MODERN, sent), **header}
            headers = {k: v for k, v in headers.items() if v is not None}
            response = await http.post(
                f"/mcp/{action_id}?session=s1", content=json.dumps(sent), headers=headers
            )
            assert response.status_code == 400, response.text
            assert response.json()["error"]["code"] == -32020, (header, response.text)

        # initialize's parameters, of the handshake's versions.
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": 5,
                "clientInfo": {"name": "c", "version": "1"},
            },
        }
        response = await _post(http, action_id, token, None, initialize)
        assert response.json()["error"]["message"] == (
            "Invalid params: params.capabilities must be an object (the client's capabilities,"
            " {} for none), not 5"
        )
    assert await _executions(state, action_id) == 0


async def test_mcp_a_protocol_version_mcp_has_not_is_refused_naming_the_versions_served(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """A client that sends MCP-Protocol-Version with a version MCP has not (a typo, a version
    of its own making) was told "params._meta must be an object carrying ..." (the SDK took it
    for a 2026-07-28 request), a parameter no client of the handshake's versions sends; it is
    told the versions served. One sending 2026-07-28's envelope stays the SDK's -32022."""
    action_id, token = await _client(gql, admin, state, "typo")
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        response = await _post(http, action_id, token, "2025-06-17", listing)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == {
            "code": -32600,
            "message": 'Invalid Request: the MCP-Protocol-Version header says "2025-06-17", a '
            "protocol version this server does not serve: it serves 2024-11-05, 2025-03-26, "
            "2025-06-18, 2025-11-25 (opened by initialize, whose answer names the version to "
            "send) and 2026-07-28",
            "data": {"code": "BAD_REQUEST"},
        }
        meta = {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
        enveloped = {**listing, "params": {"_meta": meta}}
        headers = {**_headers(token, "2099-01-01"), "mcp-method": "tools/list"}
        response = await http.post(
            f"/mcp/{action_id}?session=s1", content=json.dumps(enveloped), headers=headers
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == -32022
        assert (await _post(http, action_id, token, "2025-06-18", listing)).status_code == 200
    assert await _executions(state, action_id) == 0


async def test_mcp_a_routing_header_missing_or_wrong_says_which_and_what_to_send(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """A client written by hand for 2026-07-28 that leaves Mcp-Method out read the SDK's
    "mcp-method header does not match the request body's method", as if it had sent another;
    each refusal now says which header is missing or what it says, and the value to send. It
    stays -32020 HeaderMismatch, HTTP 400, with the request's id, and nothing runs."""
    action_id, token = await _client(gql, admin, state, "by-hand")
    listing = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": META}}
    call = _call(8, _meta=META)
    cases = [
        (
            listing,
            {"mcp-method": None},
            "the Mcp-Method header is missing, but the request's method is 'tools/list': at "
            "protocol version 2026-07-28 every request names its method in the Mcp-Method "
            "header (Mcp-Method: tools/list)",
        ),
        (
            call,
            {"mcp-method": "tools/list"},
            "the Mcp-Method header says 'tools/list', but the request's method is 'tools/call':"
            " at protocol version 2026-07-28 every request names its method in the Mcp-Method"
            " header (Mcp-Method: tools/call)",
        ),
        (
            call,
            {"mcp-name": None},
            "the Mcp-Name header is missing, but the tool called is 'search_memory': at "
            "protocol version 2026-07-28 a tools/call names its tool in the Mcp-Name header "
            "(Mcp-Name: search_memory)",
        ),
        (
            call,
            {"mcp-name": "add_memory"},
            "the Mcp-Name header says 'add_memory', but the tool called is 'search_memory': at "
            "protocol version 2026-07-28 a tools/call names its tool in the Mcp-Name header "
            "(Mcp-Name: search_memory)",
        ),
    ]
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for body, header, words in cases:
            headers = {**_headers(token, MODERN, body), **header}
            headers = {k: v for k, v in headers.items() if v is not None}
            response = await http.post(
                f"/mcp/{action_id}?session=s1", content=json.dumps(body), headers=headers
            )
            assert response.status_code == 400, response.text
            assert response.json() == {
                "jsonrpc": "2.0",
                "id": body["id"],
                "error": {"code": -32020, "message": words, "data": {"code": "BAD_REQUEST"}},
            }, header
        # With its headers right, the same requests are served.
        for body in (listing, call):
            response = await _post(http, action_id, token, MODERN, body)
            assert response.status_code == 200 and "result" in response.json(), response.text
    assert await _executions(state, action_id) == 1  # the one call served


async def test_mcp_methods_a_client_library_sends_are_answered_as_each_version_takes_them(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """What an MCP client library sends besides tools: `initialize` with capabilities this
    server does not know (taken), `notifications/initialized` and `notifications/cancelled`
    (202: "If the server accepts the input, the server MUST return HTTP status code 202"),
    `ping` (an empty result up to 2025-11-25). What it does not answer is -32601 Method not
    found, as the SDK answered, but saying why and what it answers at that version: resources,
    prompts, logging and completion, which its capabilities do not name; and `ping` at
    2026-07-28, which removed it ("Remove `ping`, `logging/setLevel`, and
    `notifications/roots/list_changed`"), with the HTTP 404 that version requires ("If the
    server does not implement the requested RPC method, it MUST respond with 404 Not Found and
    a JSON-RPC error with code -32601")."""
    action_id, token = await _client(gql, admin, state, "library")
    handshake = "initialize, ping, tools/call and tools/list at protocol version 2025-06-18"
    modern = "server/discover, tools/call and tools/list at protocol version 2026-07-28"
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {"roots": {"listChanged": True}, "x-unknown": {"a": 1}},
                "clientInfo": {"name": "c", "version": "1"},
            },
        }
        response = await _post(http, action_id, token, None, initialize)
        result = response.json()["result"]
        assert result["protocolVersion"] == "2025-06-18"
        assert result["capabilities"] == {"tools": {"listChanged": False}}

        for body in (
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
        ):
            response = await _post(http, action_id, token, "2025-06-18", body)
            assert response.status_code == 202 and response.content == b"", response.text

        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        response = await _post(http, action_id, token, "2025-06-18", ping)
        assert response.json() == {"jsonrpc": "2.0", "id": 2, "result": {}}

        for method, params in (
            ("resources/list", {}),
            ("resources/templates/list", {}),
            ("prompts/list", {}),
            ("logging/setLevel", {"level": "info"}),
            (
                "completion/complete",
                {
                    "ref": {"type": "ref/prompt", "name": "p"},
                    "argument": {"name": "a", "value": ""},
                },
            ),
        ):
            body = {"jsonrpc": "2.0", "id": 3, "method": method, "params": params}
            response = await _post(http, action_id, token, "2025-06-18", body)
            assert response.status_code == 200, response.text
            assert response.json()["error"] == {
                "code": -32601,
                "message": f'Method not found: this server does not offer "{method}" (its '
                f"capabilities name tools only); this server answers {handshake}",
                "data": method,
            }
        for method, why in (
            (
                "server/discover",
                "is not part of protocol version 2025-06-18 (it came with 2026-07-28)",
            ),
            (
                "notifications/cancelled",
                "is a notification, not a request: send it without an id (and nothing answers it)",
            ),
            ("roots/list", "is a request a server sends its client, not one it answers"),
            ("tools/delete", "is no method this server knows"),
        ):
            body = {"jsonrpc": "2.0", "id": 4, "method": method, "params": {"requestId": 1}}
            response = await _post(http, action_id, token, "2025-06-18", body)
            assert response.json()["error"]["message"] == (
                f'Method not found: "{method}" {why}; this server answers {handshake}'
            )

        for method in ("ping", "logging/setLevel", "initialize"):
            body = {"jsonrpc": "2.0", "id": 5, "method": method, "params": {"_meta": META}}
            response = await _post(http, action_id, token, MODERN, body)
            assert response.status_code == 404, response.text
            assert response.json()["error"] == {
                "code": -32601,
                "message": f'Method not found: "{method}" is not part of protocol version '
                f"2026-07-28, which removed it; this server answers {modern}",
                "data": method,
            }
        body = {"jsonrpc": "2.0", "id": 6, "method": "resources/list", "params": {"_meta": META}}
        response = await _post(http, action_id, token, MODERN, body)
        assert response.status_code == 404, response.text
        assert "does not offer" in response.json()["error"]["message"]
        body = {"jsonrpc": "2.0", "id": 7, "method": "server/discover", "params": {"_meta": META}}
        response = await _post(http, action_id, token, MODERN, body)
        assert response.json()["result"]["supportedVersions"] == [MODERN]


async def test_mcp_an_http_method_but_post_is_405_naming_post(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """Only POST carries JSON-RPC to this stateless endpoint. DELETE, which a client sends to
    end its session ("The server MAY respond to this request with HTTP 405 Method Not
    Allowed"), had the SDK's 405 without the Allow header HTTP requires of a 405; PUT and the
    rest had one naming GET and DELETE, which this endpoint refuses too."""
    action_id, token = await _client(gql, admin, state, "methods")
    headers = _headers(token, "2025-06-18")
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for method, words in (
            ("DELETE", "it gives no session to end"),
            ("PUT", "this MCP endpoint takes POST only"),
            ("PATCH", "this MCP endpoint takes POST only"),
            ("GET", "it opens no stream on GET"),
        ):
            response = await http.request(method, f"/mcp/{action_id}?session=s1", headers=headers)
            assert response.status_code == 405, (method, response.text)
            assert response.headers["allow"] == "POST", (method, response.headers)
            error = response.json()["error"]
            assert error["data"] == {"code": "BAD_REQUEST"}
            assert words in error["message"] and "POST each JSON-RPC request" in error["message"]
        # Whatever the address: without the ?session= this agent needs, with a preview that is
        # no boolean, or of no agent, the method is what is refused (it was 400 or 404, the
        # address's refusal a POST meets).
        for address in (
            f"/mcp/{action_id}",
            f"/mcp/{action_id}?session=s1&preview=maybe",
            f"/mcp/{uuid.uuid4()}?session=s1",
        ):
            for method in ("GET", "DELETE"):
                response = await http.request(method, address, headers=headers)
                assert response.status_code == 405, (method, address, response.text)
                assert response.headers["allow"] == "POST", (method, address, response.headers)
        response = await http.get(f"/mcp/{action_id}", headers=_headers("wrong", "2025-06-18"))
        assert response.status_code == 401, response.text  # the token is checked first
