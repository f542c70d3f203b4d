"""MCP at /mcp/{actionId}, end to end: the app served by uvicorn on loopback, the official SDK's
streamable-HTTP client, clients authenticated by their bearer tokens.

The tools are the agent's native tools (app/runtime/tools.py), offered as its harness offers
them; each call is an execution of kind MCP committed like a turn."""

import asyncio
import json
import logging
import uuid
from typing import Any

import httpx
import pytest
from factories import (
    allow,
    caller,
    make_account,
    make_agent,
    make_agent_id,
    memory_harness,
    token_for,
)
from helpers import GQL, eventually
from mcp.shared.exceptions import MCPError
from mcp_support import call, mcp_session, mcp_url, refused, result_json
from openai_server import OpenAIServer
from runtime_support import memories, memory, run

from app.actions.harness import parse_harness
from app.auth.caller import Caller
from app.auth.policies import ADMIN_POLICIES
from app.executions import liveness_store
from app.executions import store as executions_store
from app.idempotency.keys import MAX_KEY_LENGTH
from app.runtime.calls import WHEN_TO_USE
from app.runtime.tools import tool_schemas
from app.state import AppState

# Every turn here talks to the scripted model server.
pytestmark = pytest.mark.usefixtures("model_server")

EXECUTION = "financial.ActionExecution.document"
MEMORY_ALL = ("financial.AgentMemory.*",)
# An agent that runs elsewhere and uses every tool: it starts executions and reads and
# changes its memory.
AGENT_POLICIES = (allow(["INSERT"], EXECUTION), allow(["SELECT", "INSERT", "UPDATE"], *MEMORY_ALL))
FULL_TOOLS = memory_harness(
    tools=["add_memory", "read_memory", "delete_memory"],
    scope={"read": ["session", "agent"], "write": ["session", "agent"]},
    kinds=["fact", "preference"],
    labels={"customer_id": {"number": 5, "description": "The customer it is about."}},
)
HELLO = {"role": "user", "content": "Hello"}
EXECUTION_QUERY = """query($e: UUID!) { execution(executionId: $e) {
    executionId kind status preview sessionId input output error
    transcript(first: 50) { nodes { type data } } } }"""


async def _execution(gql: GQL, admin: Caller, execution_id: str) -> dict[str, Any]:
    return (await gql(admin, EXECUTION_QUERY, e=execution_id)).ok()["execution"]


async def _executions(state: AppState, action_id: str) -> list[dict[str, Any]]:
    async with state.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT execution_id, kind, status, principal FROM executions "
            "WHERE action_id = $1 ORDER BY created",
            uuid.UUID(action_id),
        )
    return [dict(r) for r in rows]


async def test_mcp_offers_the_tools_of_the_agents_harness(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    token = await token_for(state, admin, "agent-runner", *AGENT_POLICIES)
    full = await make_agent_id(gql.state, admin, harness=FULL_TOOLS)
    searching = await make_agent_id(gql.state, admin, harness=memory_harness())
    forgetful = await make_agent_id(gql.state, admin, harness=None)

    async with mcp_session(mcp_url(base_url, full), token) as session:
        listed = (await session.list_tools()).tools
    expected = tool_schemas(parse_harness(FULL_TOOLS).memory)
    assert [t.name for t in listed] == [*expected, "remember_conversation"]
    for tool in listed[:-1]:
        # The same JSON schema and description as the agent's own model is offered.
        function = expected[tool.name]["function"]
        assert tool.input_schema == function["parameters"]
        # The description the agent's model reads, and when to use the tool (what a turn's
        # system instructions tell the agent's own model).
        assert tool.description == f"{function['description']} {WHEN_TO_USE[tool.name]}"
    assert "scope" in listed[1].input_schema["properties"]  # add_memory: writes agent scope
    # Each description says when to use the tool.
    assert all("Use it" in (t.description or "") for t in listed)

    async with mcp_session(mcp_url(base_url, searching), token) as session:
        names = [t.name for t in (await session.list_tools()).tools]
    assert names == ["search_memory", "remember_conversation"]
    async with mcp_session(mcp_url(base_url, forgetful, session=None), token) as session:
        assert (await session.list_tools()).tools == []
        # A tool the harness does not offer is refused with the native tools' message.
        error = await refused(session, "search_memory", query="x")
        assert error == {
            "error": "search_memory is not available: this agent's memory is not enabled"
        }
        # remember_conversation too says why it is not there, not that no such tool exists;
        # a name that is no tool lists the tools offered: none.
        off = await refused(session, "remember_conversation", messages=[HELLO])
        assert "has no long-term memory (harness.memory.enabled is false)" in off["error"]
        unknown = await refused(session, "no_such_tool")
        assert unknown["error"].endswith("your tools are: none"), unknown


async def test_mcp_remember_conversation_schema_states_the_bounds_it_enforces(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """What the schema allows is accepted, and what it refuses is refused: the key is 1 to
    MAX_KEY_LENGTH characters and a message's content is not empty."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    token = await token_for(state, admin, "agent-runner", *AGENT_POLICIES)
    async with mcp_session(mcp_url(base_url, action_id), token) as session:
        (tool,) = [t for t in (await session.list_tools()).tools if t.name.startswith("remember")]
        key = tool.input_schema["properties"]["idempotencyKey"]
        assert (key["minLength"], key["maxLength"]) == (1, MAX_KEY_LENGTH)
        content = tool.input_schema["properties"]["messages"]["items"]["properties"]["content"]
        assert content["minLength"] == 1
        for bad, said in [
            ({"idempotencyKey": "k" * (MAX_KEY_LENGTH + 1)}, f"1 to {MAX_KEY_LENGTH} characters"),
            ({"idempotencyKey": ""}, f"1 to {MAX_KEY_LENGTH} characters"),
            ({"messages": [{"role": "user", "content": ""}]}, "content must be non-empty"),
        ]:
            error = await refused(session, "remember_conversation", **{"messages": [HELLO], **bad})
            assert said in error["error"] and error["code"] == "BAD_REQUEST", error


async def test_h6_h15_mcp_offers_search_history_of_the_named_session(
    gql: GQL, admin: Caller, state: AppState, base_url: str, model_server: OpenAIServer
) -> None:
    """search_history over MCP: offered when the agent keeps history and the client names a
    session; it finds that session's committed turns, never another session's, and needs the
    grant that reads transcripts."""
    harness = {**memory_harness(), "history": {"index": "messages"}}
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    model_server.say("Noted.")
    assert (await run(gql, admin, action_id, "My locker code is 4417."))["status"] == "SUCCEEDED"
    model_server.say("Noted too.")
    other = await run(gql, admin, action_id, "The vault code is 9931.", session="s2")
    assert other["status"] == "SUCCEEDED"

    reader = await token_for(
        state,
        admin,
        "history-reader",
        *AGENT_POLICIES,
        allow(["SELECT"], "financial.ActionExecution.transcript"),
    )
    async with mcp_session(mcp_url(base_url, action_id), reader) as session:
        names = [t.name for t in (await session.list_tools()).tools]
        assert "search_history" in names
        found = await call(session, "search_history", query="locker code")
    texts = [e["text"] for e in found["events"]]
    assert any("4417" in t and t.startswith("turn 1, user") for t in texts), texts
    assert not any("9931" in t for t in texts)  # another session's history (H15)

    # The other session's client finds only its own; without the transcript grant, nothing.
    async with mcp_session(mcp_url(base_url, action_id, session="s2"), reader) as session:
        found = await call(session, "search_history", query="locker code")
    texts = [e["text"] for e in found["events"]]
    assert any("9931" in t for t in texts) and not any("4417" in t for t in texts), texts
    plain = await token_for(state, admin, "memory-only", *AGENT_POLICIES)
    async with mcp_session(mcp_url(base_url, action_id), plain) as session:
        error = await refused(session, "search_history", query="locker code")
    assert error["code"] == "ACCESS_DENIED"


async def test_h13_mcp_search_history_finds_preview_turns_only_for_a_preview_client(
    gql: GQL, admin: Caller, state: AppState, base_url: str, model_server: OpenAIServer
) -> None:
    """What a preview turn kept is searched only in preview mode: a live client over MCP finds
    nothing of it, by query or by ID; a preview client finds it, and the live turns too."""
    harness = {**memory_harness(), "history": {"index": "messages"}}
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    model_server.say("Noted.")
    assert (await run(gql, admin, action_id, "The live code is 1357."))["status"] == "SUCCEEDED"
    model_server.say("Noted too.")
    tried = await run(gql, admin, action_id, "The preview code is 2468.", preview=True)
    assert tried["status"] == "SUCCEEDED"
    reader = await token_for(
        state,
        admin,
        "history-reader",
        *AGENT_POLICIES,
        allow(["SELECT"], "financial.ActionExecution.transcript"),
    )
    async with mcp_session(mcp_url(base_url, action_id, preview=True), reader) as session:
        found = await call(session, "search_history", query="what is the code", limit=10)
    texts = [e["text"] for e in found["events"]]
    assert any("1357" in t for t in texts) and any("2468" in t for t in texts), texts
    (kept,) = [e for e in found["events"] if "2468" in e["text"]]
    assert kept["preview"] is True
    async with mcp_session(mcp_url(base_url, action_id), reader) as session:
        found = await call(session, "search_history", query="what is the code", limit=10)
        by_id = await call(session, "search_history", ids=[kept["id"]])
    texts = [e["text"] for e in found["events"]]
    assert any("1357" in t for t in texts) and not any("2468" in t for t in texts), texts
    assert by_id == {"events": []}


async def test_m55_mcp_search_history_leaves_out_memory_text_without_the_memory_grants(
    gql: GQL, admin: Caller, state: AppState, base_url: str, model_server: OpenAIServer
) -> None:
    """History keeps a memory tool's call and result: a client that may read transcripts but
    not memory records is not shown them, nor that they matched; with the grants, it is."""
    harness = {**memory_harness(tools=["add_memory"]), "history": {"index": "messages_and_tools"}}
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    model_server.call_tools(
        ("add_memory", {"summary": "Ada's PIN is zebramail", "kind": "fact"}),
        content="Keeping the lighthouse rota in mind.",
    )
    model_server.say("Saved it.")
    assert (await run(gql, admin, action_id, "Remember my PIN"))["status"] == "SUCCEEDED"
    transcripts = allow(["SELECT"], "financial.ActionExecution.transcript")
    without = await token_for(state, admin, "no-memory", allow(["INSERT"], EXECUTION), transcripts)
    with_grants = await token_for(state, admin, "with-memory", *AGENT_POLICIES, transcripts)
    for token, shown in ((without, False), (with_grants, True)):
        async with mcp_session(mcp_url(base_url, action_id), token) as session:
            found = await call(session, "search_history", query="Ada PIN zebramail")
        texts = [e["text"] for e in found["events"]]
        assert any(t.startswith("turn 1, user") for t in texts), texts
        assert any("zebramail" in t for t in texts) is shown
        assert any(e.get("call", {}).get("name") == "add_memory" for e in found["events"]) is shown
        # Left out of the ranking itself: a short page would tell that a hidden event matched.
        async with mcp_session(mcp_url(base_url, action_id), token) as session:
            first = await call(session, "search_history", query="zebramail", limit=1)
        (only,) = first["events"]
        assert ("zebramail" in only["text"]) is shown
        # The agent's words beside the call are found by either, the call's text only with
        # the grants, whether ranked or read whole by ID.
        async with mcp_session(mcp_url(base_url, action_id), token) as session:
            found = await call(session, "search_history", query="lighthouse rota", limit=1)
            (words,) = found["events"]
            (whole,) = (await call(session, "search_history", ids=[words["id"]]))["events"]
        assert words["text"] == "turn 1, agent\nKeeping the lighthouse rota in mind."
        assert whole["text"].startswith(words["text"] + "\ncalled add_memory {")
        assert ("zebramail" in whole["text"]) is shown


async def test_mcp_tool_calls_change_memory_as_the_agent_with_provenance(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=FULL_TOOLS)
    token = await token_for(state, admin, "agent-runner", *AGENT_POLICIES)
    async with mcp_session(mcp_url(base_url, action_id), token) as session:
        added = await call(
            session,
            "add_memory",
            summary="Customer c-7 prefers email",
            kind="preference",
            labels={"customer_id": "c-7"},
        )
        (record,) = added["memories"]
        found = await call(session, "search_memory", query="how to contact customer c-7")
        assert [r["id"] for r in found["records"]] == [record["id"]]
        read = await call(session, "read_memory", id=record["id"])
        assert read["sources"][0]["summary"] == "Customer c-7 prefers email"
        fixed = await call(
            session,
            "add_memory",
            summary="Customer c-7 prefers phone calls",
            kind="preference",
            replaces=record["id"],
        )
        new_id = fixed["memories"][0]["id"]
        assert fixed["memories"][1] == {**fixed["memories"][1], "status": "SUPERSEDED"}

        # Refusals: the native tools' messages; nothing changes.
        bad_kind = await refused(session, "add_memory", summary="x", kind="event")
        assert bad_kind == {"error": "kind 'event' is not one of your kinds: fact, preference"}
        assert await refused(session, "read_memory", id="not-a-uuid") == {
            "error": "id must be a record ID (a UUID such as 3f2a...), got 'not-a-uuid'"
        }
        assert (
            "unknown parameter 'nope'" in (await refused(session, "search_memory", nope=1))["error"]
        )
        # A pin where this agent has none is the tool's refusal (as its own model reads it),
        # not a missing grant's; an unknown name lists every tool the client was offered.
        pinned = await refused(session, "add_memory", summary="x", kind="fact", pinned=True)
        assert "nothing can be pinned" in pinned["error"] and "code" not in pinned
        offered = ", ".join(t.name for t in (await session.list_tools()).tools)
        assert "remember_conversation" in offered
        assert await refused(session, "no_such_tool") == {
            "error": f"there is no tool named 'no_such_tool'; your tools are: {offered}",
            "code": "BAD_REQUEST",
        }
        # Text that cannot be stored is made storable, as the native tools do: never INTERNAL.
        assert (await call(session, "search_memory", query="a\x00b"))["records"] is not None
        deleted = await call(session, "delete_memory", id=new_id)
        assert deleted["memories"][0]["status"] == "DELETED"

    assert await memories(gql, admin, action_id) == []
    kept = await memory(gql, admin, action_id, new_id)
    assert kept is not None and kept["status"] == "DELETED"
    first = await memory(gql, admin, action_id, record["id"])
    assert first is not None
    # Provenance: source MCP, the agent's principal, the MCP execution that wrote it.
    assert first["source"] == "MCP" and first["modifiedBy"] == f"action:{action_id}"
    assert first["sessionId"] == "s1" and first["scope"] == "SESSION"
    assert first["status"] == "SUPERSEDED" and first["replacedBy"] == new_id
    execution = await _execution(gql, admin, first["executionId"])
    assert execution["kind"] == "MCP" and execution["status"] == "SUCCEEDED"
    assert execution["sessionId"] == "s1" and execution["preview"] is False
    assert execution["input"]["tool"] == "add_memory"
    client = execution["input"]["client"]
    assert client["principal"] == "agent-runner"
    assert client["userAgent"].startswith("python-httpx")
    assert execution["output"]["memories"][0]["id"] == record["id"]
    # A reader of executions without the memory grants sees no record text in it.
    runner = caller(admin.account_id, allow(["SELECT"], "financial.ActionExecution.*"))
    redacted = await _execution(gql, runner, first["executionId"])
    # (The text and the label value, quoted: a bare "c-7" can occur inside a random UUID.)
    shown = json.dumps(redacted)
    assert "prefers" not in shown and '"c-7"' not in shown and "customer_id" not in shown
    assert redacted["input"]["arguments"] == {"kind": "preference"}
    assert redacted["output"]["memories"][0] == {"id": record["id"], "version": 1}
    (ran,) = [e["data"] for e in execution["transcript"]["nodes"] if e["type"] == "tool.execution"]
    assert ran["name"] == "add_memory" and ran["output"] == execution["output"]

    # Every call of a tool was one execution of kind MCP by the client, refused ones FAILED;
    # the unknown name ran nothing.
    runs = await _executions(state, action_id)
    assert [r["kind"] for r in runs] == ["MCP"] * 10
    assert {r["principal"] for r in runs} == {"agent-runner"}
    assert [r["status"] for r in runs] == ["SUCCEEDED"] * 4 + ["FAILED"] * 4 + ["SUCCEEDED"] * 2
    failed = await _execution(gql, admin, str(runs[4]["execution_id"]))
    assert failed["error"] == "kind 'event' is not one of your kinds: fact, preference"
    # The search is an execution of search_memory listing what it returned (M28), a RETRIEVED
    # use of those records (M32), and its embedding is usage of purpose embed (M24).
    searched = await _execution(gql, admin, str(runs[1]["execution_id"]))
    logged = {e["type"]: e["data"] for e in searched["transcript"]["nodes"]}
    assert logged["tool.execution"]["name"] == "search_memory"
    assert [r["id"] for r in logged["tool.execution"]["output"]["records"]] == [record["id"]]
    assert logged["output.use"]["use"] == "RETRIEVED"
    assert logged["output.use"]["records"] == [{"id": record["id"], "version": 1}]
    embedding = logged["embedding"]
    assert (embedding["purpose"], embedding["for"]) == ("embed", "search_memory")
    assert embedding["tokens"] > 0


async def test_mcp_preview_calls_never_reach_live_ones(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=FULL_TOOLS)
    token = await token_for(state, admin, "agent-runner", *AGENT_POLICIES)
    async with mcp_session(mcp_url(base_url, action_id), token) as live:
        (kept,) = (await call(live, "add_memory", summary="Ada likes tea", kind="fact"))["memories"]
    async with mcp_session(mcp_url(base_url, action_id, preview=True), token) as preview:
        tried = await call(preview, "add_memory", summary="Ada likes coffee", kind="fact")
        assert tried["memories"][0]["preview"] is True
        seen = await call(preview, "search_memory", query="what Ada likes to drink")
        assert {r["summary"] for r in seen["records"]} == {"Ada likes tea", "Ada likes coffee"}
        # Deleting the live record in preview writes a preview deletion; the live one stays.
        await call(preview, "delete_memory", id=kept["id"])
        assert [r["summary"] for r in (await call(preview, "search_memory"))["records"]] == [
            "Ada likes coffee"
        ]
    async with mcp_session(mcp_url(base_url, action_id), token) as live:
        found = await call(live, "search_memory", query="what Ada likes to drink")
        assert [r["summary"] for r in found["records"]] == ["Ada likes tea"]
        coffee = tried["memories"][0]["id"]
        assert "no memory record" in (await refused(live, "read_memory", id=coffee))["error"]
    live_record = await memory(gql, admin, action_id, kept["id"])
    assert live_record is not None and live_record["status"] == "ACTIVE"


async def test_mcp_refuses_other_tenants_and_clients_without_the_grants(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=FULL_TOOLS)
    other_account = await make_account(state)
    stranger = await token_for(
        state,
        Caller(other_account, "admin", ADMIN_POLICIES),
        "stranger",
        allow(["SELECT", "INSERT", "UPDATE"], "*"),
    )
    nobody = "00000000-0000-4000-8000-000000000000"
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "probe", "version": "1"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}

        async def post(path: str, token: str | None) -> httpx.Response:
            auth = {"Authorization": f"Bearer {token}"} if token else {}
            return await http.post(path, json=initialize, headers={**headers, **auth})

        # Another tenant's agent answers exactly as an agent that does not exist.
        theirs = await post(f"/mcp/{action_id}?session=s1", stranger)
        missing = await post(f"/mcp/{nobody}?session=s1", stranger)
        # Each refusal is its HTTP status and a JSON-RPC error (what an MCP client reports),
        # whose data names Engram's code.
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json()["jsonrpc"] == "2.0" and theirs.json()["id"] is None
        assert theirs.json()["error"]["code"] == -32000
        assert theirs.json()["error"]["data"]["code"] == "NOT_FOUND"
        assert (
            theirs.json()["error"]["message"].replace(action_id, nobody)
            == (missing.json()["error"]["message"])
        )
        unauthenticated = await post(f"/mcp/{action_id}?session=s1", None)
        assert unauthenticated.status_code == 401
        assert unauthenticated.headers["www-authenticate"] == "Bearer"
        assert unauthenticated.json()["error"]["data"]["code"] == "UNAUTHENTICATED"
        # Without INSERT on executions a client is refused before anything runs.
        reader = await token_for(
            state, admin, "reader", allow(["SELECT"], *MEMORY_ALL, "financial.ActionExecution.*")
        )
        denied = await post(f"/mcp/{action_id}?session=s1", reader)
        assert denied.status_code == 403
        assert denied.json()["error"]["data"]["code"] == "ACCESS_DENIED"
        # The session rules are a turn's: this agent has session scope, so it needs one.
        agent = await token_for(state, admin, "agent", *AGENT_POLICIES)
        bad = await post(f"/mcp/{action_id}", agent)
        assert bad.status_code == 400
        assert "without a ?session= parameter" in bad.json()["error"]["message"]
        assert "pass a ?session= parameter or change the scopes" in bad.json()["error"]["message"]
        nul = await post(f"/mcp/{action_id}?session=a%00b", agent)
        assert nul.status_code == 400 and "NUL" in nul.json()["error"]["message"]
        # Bytes that are not UTF-8 are refused, not read as U+FFFD (`%FF` and `%FE` were then
        # one session); UTF-8 is read as it is.
        for latin1 in ("Jos%E9", "%FF", "%ED%A0%80", "a&session=%FE"):
            refused_session = await post(f"/mcp/{action_id}?session={latin1}", agent)
            assert refused_session.status_code == 400, latin1
            assert "not UTF-8" in refused_session.json()["error"]["message"]
        assert (await post(f"/mcp/{action_id}?session=Jos%C3%A9", agent)).status_code == 200
        broken = await post(f"/mcp/{action_id}?session=a%0Ab", agent)
        assert broken.status_code == 400
        assert "?session= parameter contains U+000A" in broken.json()["error"]["message"]
    # The SDK's client reports the message.
    for url, token, said in [
        (mcp_url(base_url, action_id), stranger, "not found"),
        (mcp_url(base_url, action_id, session=None), agent, "without a ?session= parameter"),
        (
            f"{base_url}/mcp/{action_id}?session=",
            agent,
            "a turn without a non-empty ?session= parameter is an agent without a session",
        ),
    ]:
        with pytest.raises(Exception) as raised:  # noqa: B017 - in the SDK's task group
            async with mcp_session(url, token):
                pass
        found = raised.value
        while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
            found = found.exceptions[0]
        assert isinstance(found, MCPError) and said in found.error.message

    # A client that may start executions but not read or change memory: each tool refused.
    runner = await token_for(state, admin, "runner", allow(["INSERT"], EXECUTION))
    async with mcp_session(mcp_url(base_url, action_id), runner) as session:
        assert len((await session.list_tools()).tools) == 5
        for name, arguments in [
            ("search_memory", {"query": "x"}),
            ("read_memory", {"id": nobody}),
            ("add_memory", {"summary": "x", "kind": "fact"}),
            ("delete_memory", {"id": nobody}),
        ]:
            error = await refused(session, name, **arguments)
            assert error["code"] == "ACCESS_DENIED", error
    # Adding but not reading: a replacement also needs UPDATE (and SELECT) on memory.
    writer = await token_for(
        state,
        admin,
        "writer",
        allow(["INSERT"], EXECUTION, "financial.AgentMemory.document"),
    )
    async with mcp_session(mcp_url(base_url, action_id), writer) as session:
        (added,) = (await call(session, "add_memory", summary="a fact", kind="fact"))["memories"]
        error = await refused(
            session, "add_memory", summary="b fact", kind="fact", replaces=added["id"]
        )
        assert error["code"] == "ACCESS_DENIED"
    # Nothing ran for the refused calls: one execution, the add.
    runs = await _executions(state, action_id)
    assert [(r["kind"], r["principal"]) for r in runs] == [("MCP", "writer")]
    assert json.dumps(runs, default=str).count("SUCCEEDED") == 1


async def test_an_mcp_call_whose_process_died_is_failed_like_a_turn(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    """The liveness sweeps end RUNNING executions of every kind a process runs (not OPERATOR
    writes, which run in one transaction)."""
    action_id = (await make_agent(gql.state, admin, harness=FULL_TOOLS)).action_id
    async with state.pool.acquire() as conn:
        for kind in ("MCP", "INGEST", "OPERATOR"):
            await executions_store.insert_execution(
                conn,
                account_id=admin.account_id,
                action_id=action_id,
                execution_id=uuid.uuid4(),
                action_version=1,
                session_id=None,
                turn=None,
                kind=kind,
                status="RUNNING",
                preview=False,
                principal="agent-runner",
                token_id=None,
                input={},
            )
        await conn.execute("UPDATE executions SET modified = now() - interval '1 day'")
        failed = await liveness_store.fail_stale_turns(conn, admin.account_id, action_id, 60)
        kinds = await conn.fetch(
            "SELECT kind, status FROM executions WHERE action_id = $1 ORDER BY kind", action_id
        )
    assert len(failed) == 2
    assert [tuple(r) for r in kinds] == [
        ("INGEST", "FAILED"),
        ("MCP", "FAILED"),
        ("OPERATOR", "RUNNING"),
    ]


async def test_an_mcp_client_gone_mid_body_is_no_fault_of_the_service(
    gql: GQL, admin: Caller, state: AppState, base_url: str, caplog
) -> None:
    """A client that closes the connection halfway through its body (a crash after it
    authenticated) is logged as closed by the client (499), with no error logged; a body over
    the limit is refused before the SDK reads it."""
    action_id = await make_agent_id(gql.state, admin, harness=FULL_TOOLS)
    token = await token_for(state, admin, "gone", *AGENT_POLICIES)
    host, port = base_url.removeprefix("http://").split(":")
    with caplog.at_level(logging.INFO):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /mcp/{action_id}?session=s1 HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token}\r\ncontent-type: application/json\r\n"
            "accept: application/json, text/event-stream\r\n"
            'content-length: 1000\r\n\r\n{"jsonrpc": "2.0", "id": 1, "meth'.encode()
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        for _ in range(100):
            if any(" 499 " in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
    assert [r.getMessage() for r in caplog.records if " 499 " in r.getMessage()]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # A body over the limit is refused before the SDK reads it, as GraphQL refuses one.
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        big = await http.post(
            f"/mcp/{action_id}?session=s1",
            content=b"x" * (gql.state.settings.max_body_bytes + 1),
            headers={"Authorization": f"Bearer {token}", "content-type": "application/json"},
        )
    assert big.status_code == 413
    assert big.json()["error"]["data"]["code"] == "BAD_REQUEST"
    assert "request bodies are limited to" in big.json()["error"]["message"]
    assert "(ENGRAM_MAX_BODY_BYTES): nothing ran" in big.json()["error"]["message"]


async def _raw_client(
    gql: GQL, admin: Caller, state: AppState, name: str
) -> tuple[str, dict[str, str]]:
    """An agent with every tool, and the headers of a client that posts JSON-RPC by hand."""
    action_id = await make_agent_id(gql.state, admin, harness=FULL_TOOLS)
    token = await token_for(state, admin, name, *AGENT_POLICIES)
    headers = {
        "Authorization": f"Bearer {token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-06-18",
    }
    return action_id, headers


async def test_mcp_arguments_no_json_column_holds_are_refused_before_anything_runs(
    gql: GQL, admin: Caller, state: AppState, base_url: str, caplog
) -> None:
    """Python's JSON, which the SDK reads requests with, takes NaN, Infinity and 1e400 for
    numbers: such an argument is the call's refusal naming it, recorded nowhere, with no error
    logged (it reached the execution's insert before, which failed with the database's words)."""
    action_id, headers = await _raw_client(gql, admin, state, "numbers")
    body = (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "%s",'
        ' "arguments": {"query": "parcel", %s}}}'
    )
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for name, argument in (
            ("search_memory", '"limit": NaN'),
            ("search_memory", '"limit": 1e400'),
            ("search_history", '"junk": [-Infinity]'),
        ):
            with caplog.at_level(logging.INFO):
                response = await http.post(
                    f"/mcp/{action_id}?session=s1",
                    content=body % (name, argument),
                    headers=headers,
                )
            result = response.json()["result"]
            assert result["isError"] is True, result
            refusal = json.loads(result["content"][0]["text"])
            assert refusal["code"] == "BAD_REQUEST"
            assert refusal["error"].startswith("arguments.")
            assert "numbers must be finite" in refusal["error"]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert await _executions(state, action_id) == []


async def test_mcp_a_request_whose_id_json_rpc_refuses_is_answered_invalid(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """JSON-RPC ids are strings, integers or null: an object, a fraction, 1e400 or a boolean
    is an Invalid Request answered 400 (the SDK took them for notifications: 202, no answer,
    the call run or not unseen by the client)."""
    action_id, headers = await _raw_client(gql, admin, state, "ids")
    body = (
        '{"jsonrpc": "2.0", "id": %s, "method": "tools/call", "params": {"name": '
        '"search_memory", "arguments": {"query": "parcel"}}}'
    )
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for id_ in ('{"a": 1}', "1e400", "1.5", "true", "[]"):
            response = await http.post(
                f"/mcp/{action_id}?session=s1", content=body % id_, headers=headers
            )
            assert response.status_code == 400, (id_, response.status_code, response.text)
            error = response.json()["error"]
            assert error["code"] == -32600
            assert "id must be a string, an integer or null" in error["message"]
        assert await _executions(state, action_id) == []
        fine = await http.post(
            f"/mcp/{action_id}?session=s1", content=body % '"call-1"', headers=headers
        )
        assert fine.status_code == 200 and fine.json()["id"] == "call-1"


async def test_mcp_a_request_whose_id_is_null_is_answered_invalid(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """MCP, unlike JSON-RPC, refuses a null id for a request: the SDK took it for a
    notification, answered 202 and ran nothing, so the client waited for an answer that never
    came. It is an Invalid Request answered 400, alone or in a batch (where 2025-03-26 takes
    one); a notification (no id) is still accepted."""
    action_id, headers = await _raw_client(gql, admin, state, "null-ids")
    call = (
        '{"jsonrpc": "2.0", "id": null, "method": "tools/call", "params": {"name": '
        '"search_memory", "arguments": {"query": "parcel"}}}'
    )
    refused = (
        "Invalid Request: an MCP request's id must be a string or an integer, not null"
        " (a notification has no id)"
    )
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for body, version in ((call, "2025-06-18"), (f"[{call}]", "2025-03-26")):
            response = await http.post(
                f"/mcp/{action_id}?session=s1",
                content=body,
                headers={**headers, "mcp-protocol-version": version},
            )
            assert response.status_code == 400, (body, response.status_code, response.text)
            answer = response.json()
            error = answer[0]["error"] if isinstance(answer, list) else answer["error"]
            assert error["code"] == -32600
            assert error["message"] == refused + (
                " (message 1 of the batch)" if isinstance(answer, list) else ""
            )
        notification = '{"jsonrpc": "2.0", "method": "notifications/initialized"}'
        response = await http.post(
            f"/mcp/{action_id}?session=s1", content=notification, headers=headers
        )
        assert response.status_code == 202, response.text
    assert await _executions(state, action_id) == []


async def test_mcp_an_unpaired_surrogate_escape_is_a_parse_error_that_says_so(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """JSON may escape half of a UTF-16 pair (`\\ud800`), which no Unicode text holds; the
    SDK's parser answered "unexpected end of hex escape", which names neither the string nor
    the fix. Answered as a Parse error that says what it is, and nothing is run."""
    action_id, headers = await _raw_client(gql, admin, state, "surrogates")
    body = (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": '
        '"search_memory", "arguments": {"query": "%s"}}}'
    )
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for text in ("parcel \\ud800", "\\udfff tail", "\\udc00\\ud800"):
            response = await http.post(
                f"/mcp/{action_id}?session=s1", content=body % text, headers=headers
            )
            assert response.status_code == 400, (text, response.status_code, response.text)
            error = response.json()["error"]
            assert error["code"] == -32700, error
            assert "unpaired surrogate" in error["message"], error
        assert await _executions(state, action_id) == []
        paired = await http.post(  # an escaped pair is one character, and fine
            f"/mcp/{action_id}?session=s1", content=body % "\\ud83d\\ude00", headers=headers
        )
        assert paired.status_code == 200 and paired.json()["id"] == 7, paired.text


async def test_mcp_a_deeply_nested_body_is_looked_through_without_recursion(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """The look for unpaired surrogates walks the decoded body: a walk that recursed ran out of
    stack on arguments nested a few hundred deep, which Python's JSON parser takes (HTTP 500).
    A surrogate at the bottom is still found; without one, the SDK answers as it does."""
    action_id, headers = await _raw_client(gql, admin, state, "nested")
    body = (
        '{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": '
        '"search_memory", "arguments": {"query": %s}}}'
    )
    deep = '{"a": ' * 900 + "%s" + "}" * 900
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        hidden = await http.post(
            f"/mcp/{action_id}?session=s1", content=body % (deep % '"\\ud800"'), headers=headers
        )
        assert hidden.status_code == 400, (hidden.status_code, hidden.text)
        assert hidden.json()["error"]["code"] == -32700
        plain = await http.post(
            f"/mcp/{action_id}?session=s1", content=body % (deep % '"x"'), headers=headers
        )
        assert plain.status_code < 500, (plain.status_code, plain.text)
    assert await _executions(state, action_id) == []


@pytest.mark.settings(max_requests_per_account=1, account_queue_seconds=0)
async def test_mcp_a_get_is_refused_at_once_rather_than_held_open(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """A GET opened the SDK's stream for messages of the server's own, which this stateless
    endpoint never sends: it stayed open until the client left, holding one of the account's
    places all along (here its only one). It is answered 405 at once, saying to POST."""
    action_id, headers = await _raw_client(gql, admin, state, "getter")
    url = f"/mcp/{action_id}?session=s1"
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        got = await http.get(url, headers={**headers, "accept": "text/event-stream"})
        assert got.status_code == 405, got.text
        assert got.headers["allow"] == "POST"
        error = got.json()["error"]
        assert error["data"]["code"] == "BAD_REQUEST"
        assert "POST each JSON-RPC request" in error["message"]
        listed = await http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers
        )
        assert listed.status_code == 200, listed.text
        assert listed.json()["result"]["tools"]


async def test_mcp_an_address_that_names_no_agent_says_where_agents_are(
    gql: GQL, admin: Caller, state: AppState, base_url: str
) -> None:
    """A client pointed at /mcp (the agent's ID left out of its configuration) read the
    GraphQL refusal "GraphQL is at /graphql", which the SDK reports as "Not Found"; it is a
    JSON-RPC error naming the address of an agent's MCP server."""
    _, headers = await _raw_client(gql, admin, state, "lost")
    token = headers["Authorization"].removeprefix("Bearer ")
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for path in ["/mcp", "/mcp/", "/mcp/?session=s1"]:
            got = await http.post(path, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert got.status_code == 404, (path, got.text)
            assert got.json()["error"]["data"]["code"] == "NOT_FOUND"
            assert "/mcp/<actionId>" in got.json()["error"]["message"], path
    with pytest.raises(Exception) as raised:  # noqa: B017 - in the SDK's task group
        async with mcp_session(f"{base_url}/mcp/?session=s1", token):
            pass
    found = raised.value
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    assert isinstance(found, MCPError), found
    assert "each agent is an MCP server at /mcp/<actionId>" in found.error.message


@pytest.mark.settings(turn_heartbeat_seconds=0.2, turn_lease_seconds=5)
async def test_an_mcp_call_whose_failure_the_database_refuses_is_an_error_and_ends_failed(
    gql: GQL, admin: Caller, state: AppState, base_url: str, caplog
) -> None:
    """A tool call fails (the database refuses its record), and then the database refuses the
    call's failure record too (here triggers do, as a full disk or a constraint might): the
    client is answered with an error it can read, at once, and the execution, left RUNNING,
    is ended FAILED by the liveness sweep once the database takes writes again. Its error and
    the log name it a tool call, not a turn."""
    action_id = await make_agent_id(gql.state, admin, harness=FULL_TOOLS)
    token = await token_for(state, admin, "refused-runner", *AGENT_POLICIES)
    async with state.pool.acquire() as conn:
        await conn.execute("""
            CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.summary LIKE '%POISON%' THEN RAISE EXCEPTION 'refused record'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_poison BEFORE INSERT ON agent_memories
                FOR EACH ROW EXECUTE FUNCTION refuse_poison();
            CREATE FUNCTION refuse_failure() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.kind = 'MCP' AND NEW.status = 'FAILED' THEN
                    RAISE EXCEPTION 'refused failure';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_failure BEFORE UPDATE ON executions
                FOR EACH ROW EXECUTE FUNCTION refuse_failure();
        """)
    async with mcp_session(mcp_url(base_url, action_id), token) as session:
        result = await asyncio.wait_for(
            session.call_tool("add_memory", {"summary": "POISON", "kind": "fact"}), 30
        )
        assert result.is_error, result
        (run,) = await _executions(state, action_id)
        assert (run["kind"], run["status"]) == ("MCP", "RUNNING")
        assert result_json(result) == {
            "error": "the tool call failed on an internal error (logged by the service); send it "
            "again (its failure could not be recorded, logged by the service: execution "
            f"{run['execution_id']} shows RUNNING until the service ends it FAILED, within "
            "about 0.4 s of the database taking writes again)"
        }
        # The session still serves: the next call is answered as usual.
        assert (await call(session, "search_memory", query="anything"))["records"] == []

    async with state.pool.acquire() as conn:
        await conn.execute("DROP TRIGGER refuse_failure ON executions")

    async def ended() -> bool:
        runs = {r["execution_id"]: r["status"] for r in await _executions(state, action_id)}
        return runs[run["execution_id"]] == "FAILED"

    await eventually(ended, "the sweep ended the call whose failure was refused")
    async with state.pool.acquire() as conn:
        error = await conn.fetchval(
            "SELECT error FROM executions WHERE execution_id = $1", run["execution_id"]
        )
    assert error == (
        "the tool call failed but its end could not be recorded (the database was "
        "unreachable); send it again"
    )
    logged = [r.getMessage() for r in caplog.records]
    assert f"tool call {run['execution_id']} failed" in logged, logged
    assert any(
        m.startswith(f"tool call {run['execution_id']}: its failure could not be recorded")
        for m in logged
    ), logged


async def test_mcp_a_handler_that_fails_unexpectedly_answers_internal_error_in_no_words_of_its_own(
    gql: GQL, admin: Caller, state: AppState, base_url: str, monkeypatch, caplog
) -> None:
    """A fault of the service's in a tool call or a tool listing (one no refusal covers) was
    answered, on the 2025 protocol versions, with JSON-RPC code 0 and the exception's own words,
    which may name the database, its address or a file (the SDK's legacy answer; its modern
    path says -32603). It is -32603 Internal error, the same words for any fault, logged with
    its traceback."""
    from app.mcp import endpoint

    secret = "connection to postgresql://engram:s3cret@db.internal failed"

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(secret)

    action_id, headers = await _raw_client(gql, admin, state, "faults")
    monkeypatch.setattr(endpoint.calls, "call_tool", fail)
    monkeypatch.setattr(endpoint.calls, "offered_tools", fail)
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for method, params in (
            ("tools/call", {"name": "search_memory", "arguments": {"query": "parcel"}}),
            ("tools/list", {}),
        ):
            with caplog.at_level(logging.ERROR):
                response = await http.post(
                    f"/mcp/{action_id}?session=s1",
                    json={"jsonrpc": "2.0", "id": 3, "method": method, "params": params},
                    headers=headers,
                )
            assert "s3cret" not in response.text, response.text
            body = response.json()
            assert body["id"] == 3, body
            assert body["error"] == {
                "code": -32603,
                "message": "Internal error (logged by the service)",
                "data": {"code": "INTERNAL"},
            }
    faults = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert [str(r.exc_info[1]) for r in faults if r.exc_info] == [secret, secret]


async def test_mcp_arguments_nested_deep_are_refused_before_they_are_walked(
    gql: GQL, admin: Caller, state: AppState, base_url: str, caplog
) -> None:
    """Arguments nested deeper than a few hundred levels (which the modern protocol's parser
    takes) ran out of stack where the call makes their text storable, a walk that recurses: an
    internal error, logged with its RecursionError; from 33 levels they were the tool's
    refusal, recorded as a failed execution. Deeper than 32 levels (what a model may send) they
    are the call's refusal, and nothing runs or is recorded; on the 2025 versions the SDK's
    parser refuses the deepest itself."""
    action_id, headers = await _raw_client(gql, admin, state, "deep-arguments")
    modern = {
        **headers,
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "add_memory",
    }
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for depth in (33, 150, 400, 900):
            labels = '{"a":' * depth + '"x"' + "}" * depth
            for sent, meta in ((headers, ""), (modern, f', "_meta": {json.dumps(envelope)}')):
                body = (
                    '{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": '
                    f'"add_memory", "arguments": {{"summary": "s", "kind": "fact", "labels": '
                    f"{labels}}}{meta}}}}}"
                )
                with caplog.at_level(logging.ERROR):
                    response = await http.post(
                        f"/mcp/{action_id}?session=s1", content=body, headers=sent
                    )
                answer = response.json()
                if "error" in answer:  # the SDK's parser refused it: too deep for it
                    assert answer["error"]["code"] == -32700, (depth, answer)
                    continue
                result = answer["result"]
                assert result["isError"] is True, (depth, result)
                assert json.loads(result["content"][0]["text"]) == {
                    "error": "the arguments nest deeper than 32 levels; send flatter JSON",
                    "code": "BAD_REQUEST",
                }
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert await _executions(state, action_id) == []
