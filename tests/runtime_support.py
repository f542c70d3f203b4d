"""Shared by the runtime tests: turns through GraphQL, transcript, memory and history look-ups,
and the scripted memory review."""

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from factories import allow
from helpers import GQL, eventually
from openai_server import ChatReply, OpenAIServer, Recorded

from app.auth.caller import Caller
from app.state import AppState

EXECUTION_FIELDS = """
    executionId actionId actionVersion sessionId turn invocationNumber status preview
    input output error
    transcript(first: 500) { nodes { sequence invocationNumber type data } }
"""
EXECUTE = (
    "mutation($input: ExecuteActionInput!) { executeAction(input: $input) {"
    + EXECUTION_FIELDS
    + "} }"
)
MEMORY_FIELDS = """
    memoryId version summary content status scope kind source pinned preview replaces replacedBy
    executionId invocationNumber actionVersion sessionId modifiedBy
    labels { number value }
"""

# What the scripted model answers a memory review (purpose `memory`) that a test does not
# script: nothing worth keeping.
NOTHING_TO_KEEP = ChatReply(tool_calls=[("remember", {"candidates": []})], purpose="memory")


@contextmanager
def scripted_model() -> Iterator[OpenAIServer]:
    """The scripted OpenAI-compatible server (the `model_server` fixture's): a memory review it
    is not told about keeps nothing. A reply scripted to wait for a count of requests that
    never came fails the test (it lined nothing up, and took 30 s)."""
    with OpenAIServer() as server:
        server.chat_defaults["memory"] = NOTHING_TO_KEEP
        yield server
    assert not server.unmet, server.unmet


# What a client that only runs turns and reads their executions holds: nothing on memory.
RUNNER_POLICIES = (
    allow(["INSERT"], "financial.ActionExecution.document"),
    allow(["SELECT"], "financial.ActionExecution.*"),
)


async def run(
    gql: GQL,
    caller: Caller,
    action_id: str,
    input: Any = "hello",
    *,
    session: str | None = "s1",
    preview: bool = False,
    execution_id: str | None = None,
) -> dict[str, Any]:
    """One turn; returns the execution (the test asserts its status)."""
    request: dict[str, Any] = {"actionId": action_id, "sessionId": session, "preview": preview}
    if input is not None:
        request["input"] = input
    if execution_id is not None:
        request["executionId"] = execution_id
    return (await gql(caller, EXECUTE, input=request)).ok()["executeAction"]


async def at_its_model_call(
    gql: GQL, admin: Caller, action_id: str, model_server: OpenAIServer, delay: float = 10.0
) -> asyncio.Future[Any]:
    """A turn of the agent, started and waiting on its model call (answered after `delay`)."""
    model_server.say("Hello.", delay=delay)
    turn = asyncio.ensure_future(run(gql, admin, action_id, "hi"))
    await eventually(
        lambda: any(r.path.endswith("/chat/completions") for r in model_server.requests),
        "the model call to be under way",
    )
    return turn


async def refuse_failure_records(state: AppState) -> None:
    """The database refuses every turn's record of its failure (its turn.failed event)."""
    async with state.pool.acquire() as conn:
        await conn.execute("""
            CREATE FUNCTION refused() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused'; END $$;
            CREATE TRIGGER refused BEFORE INSERT ON transcript_events
                FOR EACH ROW WHEN (NEW.type = 'turn.failed') EXECUTE FUNCTION refused();
        """)


def events(execution: dict[str, Any], type: str) -> list[dict[str, Any]]:
    return [e["data"] for e in execution["transcript"]["nodes"] if e["type"] == type]


def tool_runs(execution: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events(execution, "tool.execution") if name is None or e["name"] == name]


def recalls(execution: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in tool_runs(execution, "search_memory") if e["input"].get("recall")]


def chat(server: OpenAIServer, purpose: str | None = "turn") -> list[Recorded]:
    """The chat requests of one purpose (the agent's own: `turn`); None: all of them."""
    return server.chat_requests(purpose)


def system_message(request: Recorded) -> str:
    return next(m["content"] for m in request.body["messages"] if m["role"] == "system")


def memory_blocks(request: Recorded) -> list[str]:
    return [
        m["content"]
        for m in request.body["messages"]
        if m["role"] == "user" and m["content"].startswith("<memory>")
    ]


def tool_names(request: Recorded) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools", [])]


def tool_results(request: Recorded) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "tool"]


async def memory(gql: GQL, admin: Caller, action_id: str, memory_id: str) -> dict[str, Any] | None:
    result = await gql(
        admin,
        "query($a: UUID!, $m: UUID!) { agentMemory(actionId: $a, id: $m) {" + MEMORY_FIELDS + "} }",
        a=action_id,
        m=memory_id,
    )
    return result.ok()["agentMemory"]


async def memories(gql: GQL, admin: Caller, action_id: str) -> list[dict[str, Any]]:
    result = await gql(
        admin,
        "query($a: UUID!) { action(actionId: $a) { memories(first: 100) { nodes {"
        + MEMORY_FIELDS
        + "} } } }",
        a=action_id,
    )
    return result.ok()["action"]["memories"]["nodes"]


# Session history: what a session keeps, and a turn whose model searches it

SESSION = """query($a: UUID!) { action(actionId: $a) { sessions(first: 10) { nodes { sessionId
    history(first: 100) { nodes { id eventId turn who header text callId tool executionId
        sequence parts preview data } } } } } }"""


async def history_of(gql: GQL, who: Caller, action_id: str, session: str = "s1") -> list[dict]:
    result = await gql(who, SESSION, a=action_id)
    sessions = result.ok()["action"]["sessions"]["nodes"]
    return next(s["history"]["nodes"] for s in sessions if s["sessionId"] == session)


async def searched(
    server: OpenAIServer,
    gql: GQL,
    admin: Caller,
    action_id: str,
    arguments: dict[str, Any],
    *,
    session: str | None = "s1",
    preview: bool = False,
    message: str = "What did I tell you before?",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A turn whose model calls search_history once; returns (execution, its tool run)."""
    server.call_tools(("search_history", arguments))
    server.say("Found it.")
    executed = await run(gql, admin, action_id, message, session=session, preview=preview)
    assert executed["status"] == "SUCCEEDED", executed["error"]
    (searching,) = tool_runs(executed, "search_history")
    return executed, searching


def texts(searching: dict[str, Any]) -> str:
    return json.dumps(searching.get("output", {}).get("events", []))


# The end-of-turn memory review, scripted: its candidate call, then its decide call

CANDIDATE_CALL = '"name": "remember"'
DECIDE_CALL = '"name": "decide"'


def candidates(server: OpenAIServer, *items: dict[str, Any], **match: Any) -> None:
    """Scripts the next candidate call's answer (facts: summary and kind `fact` by default)."""
    listed = [{"kind": "fact", **item} for item in items]
    server.call_tools(
        ("remember", {"candidates": listed}), purpose="memory", when=CANDIDATE_CALL, **match
    )


def decide(server: OpenAIServer, *decisions: dict[str, Any], **match: Any) -> None:
    server.call_tools(
        ("decide", {"decisions": list(decisions)}), purpose="memory", when=DECIDE_CALL, **match
    )


def review_requests(server: OpenAIServer, tool: str = CANDIDATE_CALL) -> list[Recorded]:
    return [r for r in chat(server, "memory") if tool in json.dumps(r.body)]
