"""rememberConversation: a conversation an agent had elsewhere, reviewed as a turn's would be
(the scripted model answers the review's calls, purpose `memory`), as an execution of kind
INGEST whose records have source EXTRACTION."""

import asyncio
import json
import logging
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from factories import allow, caller, make_agent_id, memory_harness, token_for
from helpers import GQL
from mcp_support import call, mcp_session, mcp_url, refused
from openai_server import OpenAIServer
from runtime_support import (
    DECIDE_CALL,
    EXECUTE,
    candidates,
    chat,
    decide,
    history_of,
    memories,
    review_requests,
    run,
    searched,
    texts,
)

from app.auth.caller import Caller
from app.runtime import review as review_module
from app.state import AppState

# Every turn here talks to the scripted model server.
pytestmark = pytest.mark.usefixtures("model_server")

REMEMBER = """mutation($input: RememberConversationInput!) { rememberConversation(input: $input) {
    executionId status error reviewedMessages
    decisions { candidate action summary kind memoryId targetId note }
    records { memoryId version summary status source sessionId modifiedBy executionId replaces }
} }"""
EXECUTION = """query($e: UUID!) { execution(executionId: $e) {
    kind status sessionId preview input output
    transcript(first: 50) { nodes { type data } } } }"""
TALK = [
    {"role": "user", "content": "Hi, I'm Ada. I moved to Berlin last week.", "time": None},
    {"role": "assistant", "content": "Welcome to Berlin, Ada!"},
]


def _talk(*said: str) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text}
        for i, text in enumerate(said)
    ]


async def _remember(
    gql: GQL, who: Caller, action_id: str, messages: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    request = {"actionId": action_id, "sessionId": "s1", "messages": messages, **extra}
    return (await gql(who, REMEMBER, input=request)).ok()["rememberConversation"]


async def test_m10_facts_of_a_conversation_become_extraction_records(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada lives in Berlin since late November 2026"})
    messages = [
        {**TALK[0], "time": "2026-11-24T09:30:00+01:00"},
        {**TALK[1], "time": "2026-11-24T08:31:00Z"},
        {"role": "tool", "content": "weather(Berlin): 4 C, rain"},
    ]
    done = await _remember(gql, admin, action_id, messages)
    assert done["status"] == "SUCCEEDED" and done["error"] is None
    assert done["reviewedMessages"] == 3  # every message
    (decision,) = done["decisions"]
    assert decision["action"] == "ADD" and decision["kind"] == "fact"
    assert decision["summary"] == "Ada lives in Berlin since late November 2026"
    (record,) = done["records"]
    assert record["memoryId"] == decision["memoryId"]
    assert record["source"] == "EXTRACTION" and record["status"] == "ACTIVE"
    assert record["executionId"] == done["executionId"] and record["sessionId"] == "s1"
    assert record["modifiedBy"] == f"action:{action_id}"
    assert [m["memoryId"] for m in await memories(gql, admin, action_id)] == [record["memoryId"]]

    # The review read the messages with their times (in UTC), as purpose `memory`.
    (asked,) = chat(model_server, "memory")
    said = asked.body["messages"][1]["content"]
    assert "[2026-11-24 08:30 UTC] user: \"Hi, I'm Ada. I moved" in said
    assert '[2026-11-24 08:31 UTC] assistant: "Welcome to Berlin, Ada!"' in said
    assert 'tool: "weather(Berlin): 4 C, rain"' in said
    # One execution of kind INGEST, with the messages and the review in its transcript.
    execution = (await gql(admin, EXECUTION, e=done["executionId"])).ok()["execution"]
    assert execution["kind"] == "INGEST" and execution["status"] == "SUCCEEDED"
    assert execution["input"]["messages"][0]["time"] == "2026-11-24T08:30:00+00:00"
    assert execution["input"]["client"] == {"principal": "admin"}
    types = [e["type"] for e in execution["transcript"]["nodes"]]
    assert types[0] == "model.call" and types[-1] == "memory.review"
    assert set(types) == {"model.call", "embedding", "memory.review"}
    assert chat(model_server, "turn") == []  # no turn ran


async def test_m11_restated_facts_do_not_pile_up(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada lives in Paris"})
    first = await _remember(gql, admin, action_id, _talk("I live in Paris", "Noted."))
    (kept,) = first["records"]

    # Word for word again: skipped without a decide call.
    candidates(model_server, {"summary": "ada lives in  Paris."})
    again = await _remember(gql, admin, action_id, _talk("As I said, I live in Paris"))
    assert [(d["action"], d["note"]) for d in again["decisions"]] == [("SKIP", "duplicate")]
    assert again["records"] == []
    # In other words: the decide call sees the record and skips.
    candidates(model_server, {"summary": "Ada's home is in Paris"})
    decide(model_server, {"candidate": "c1", "action": "skip"})
    third = await _remember(gql, admin, action_id, _talk("Paris is my home"))
    assert [d["action"] for d in third["decisions"]] == ["SKIP"]
    # A correction replaces the record it corrects.
    candidates(model_server, {"summary": "Ada lives in Berlin"})
    decide(model_server, {"candidate": "c1", "action": "replace", "record": "r1"})
    moved = await _remember(gql, admin, action_id, _talk("I moved to Berlin"))
    (decision,) = moved["decisions"]
    assert decision["action"] == "REPLACE" and decision["targetId"] == kept["memoryId"]
    assert {(r["summary"], r["status"]) for r in moved["records"]} == {
        ("Ada lives in Berlin", "ACTIVE"),
        ("Ada lives in Paris", "SUPERSEDED"),
    }
    assert len(review_requests(model_server, DECIDE_CALL)) == 2
    assert [m["summary"] for m in await memories(gql, admin, action_id)] == ["Ada lives in Berlin"]


async def test_m12_an_ingest_and_a_turn_at_once_that_learn_the_same_fact_keep_it_once(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """A turn of session s1 and a conversation handed in for s2 at once, whose reviews both
    add "Ada lives in Berlin" at agent scope, each decided before either commits; the ingest's
    decision is answered only once the turn committed. The ingest drops its copy and answers
    the decision as a skip: the fact is kept once, the turn's."""
    scope = {"read": ["session", "agent"], "write": ["session", "agent"]}
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(scope=scope))
    # A record near the fact, so that each review asks the model to decide.
    candidates(model_server, {"summary": "Ada lives in Paris", "scope": "agent"})
    assert (await run(gql, admin, action_id, "I live in Paris", session="s0"))["status"] == (
        "SUCCEEDED"
    )  # 2 chat requests: the turn's, the review's candidates
    for said, where in (("Berlin it is now", "from the turn"), ("I moved to", "from the ingest")):
        fact = {"summary": "Ada lives in Berlin", "kind": "fact", "scope": "agent"}
        found = {"candidates": [fact | {"content": where}]}
        model_server.call_tools(("remember", found), purpose="memory", when=said)
    add = ("decide", {"decisions": [{"candidate": "c1", "action": "add"}]})
    # The turn's decision once both reviews asked for theirs (the turn's three calls and the
    # ingest's two): neither review saw the other's record. The ingest's once a turn started
    # after the first committed.
    model_server.call_tools(add, purpose="memory", when="from the turn", after_requests=7)
    model_server.call_tools(add, purpose="memory", when="from the ingest", after_requests=8)

    async def turn_then_another() -> dict[str, Any]:
        first = await run(gql, admin, action_id, "Berlin it is now", session="s1")
        await run(gql, admin, action_id, "Anything else?", session="s3")
        return first

    request = {
        "actionId": action_id,
        "sessionId": "s2",
        "messages": _talk("I moved to Berlin"),
        "idempotencyKey": "berlin",
    }
    turn, ingest = await asyncio.gather(turn_then_another(), gql(admin, REMEMBER, input=request))
    ingest = ingest.ok()["rememberConversation"]
    assert (turn["status"], ingest["status"]) == ("SUCCEEDED", "SUCCEEDED"), ingest["error"]
    berlin = [m for m in await memories(gql, admin, action_id) if "Berlin" in m["summary"]]
    assert len(berlin) == 1, berlin
    assert berlin[0]["executionId"] == turn["executionId"]
    (decision,) = ingest["decisions"]
    assert decision["action"] == "SKIP" and decision["memoryId"] is None
    assert "committed it meanwhile" in decision["note"] and ingest["records"] == []
    execution = (await gql(admin, EXECUTION, e=ingest["executionId"])).ok()["execution"]
    (dropped,) = [
        e["data"]
        for e in execution["transcript"]["nodes"]
        if e["type"] == ("memory.review.dropped")
    ]
    (record,) = dropped["records"]  # the ingest's copy, never committed
    assert record["id"] != berlin[0]["memoryId"]
    # Sent again with its key: answered as it committed (the skip), with nothing asked or kept.
    asked = len(chat(model_server, "memory"))
    again = (await gql(admin, REMEMBER, input=request)).ok()["rememberConversation"]
    assert again == ingest and len(chat(model_server, "memory")) == asked


async def test_a_retry_with_the_same_idempotency_key_writes_nothing_new(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada prefers email"})
    messages = _talk("Please email me, never call")
    first = await _remember(gql, admin, action_id, messages, idempotencyKey="ingest-1")
    again = await _remember(gql, admin, action_id, messages, idempotencyKey="ingest-1")
    assert again == first
    assert len(chat(model_server, "memory")) == 1  # the retry asked the model nothing
    assert len(await memories(gql, admin, action_id)) == 1
    # The same key with other messages is a conflict, naming the key.
    other = await gql(
        admin,
        REMEMBER,
        input={
            "actionId": action_id,
            "sessionId": "s1",
            "messages": _talk("other"),
            "idempotencyKey": "ingest-1",
        },
    )
    assert other.codes == ["CONFLICT"] and "ingest-1" in other.errors[0]["message"]


async def test_requests_with_the_same_key_at_once_answer_as_the_first_though_it_replaced_a_record(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """Two requests with one key, both reviewed before either commits, both replacing the
    record they read: the second finds the record replaced by the first, and answers as the
    first did (it answered FAILED, 'another turn changed this agent's memory')."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada lives in Paris"})
    paris = await _remember(gql, admin, action_id, _talk("I live in Paris"))
    for _ in range(2):
        candidates(model_server, {"summary": "Ada lives in Berlin"})
        # Answered once both reviews asked (the first ingest's call, then two each): both
        # read the Paris record before either commits.
        replace = {"candidate": "c1", "action": "replace", "record": "r1"}
        decide(model_server, replace, after_requests=5)
    messages = _talk("I moved to Berlin")
    first, second = await asyncio.gather(
        *(_remember(gql, admin, action_id, messages, idempotencyKey="k") for _ in range(2))
    )
    assert first == second and first["status"] == "SUCCEEDED", (first, second)
    (decision,) = first["decisions"]
    assert decision["targetId"] == paris["records"][0]["memoryId"]
    assert [m["summary"] for m in await memories(gql, admin, action_id)] == ["Ada lives in Berlin"]


async def test_a_request_with_the_same_key_that_lost_keeps_no_drop_it_never_committed(
    gql: GQL, admin: Caller, model_server: OpenAIServer, state: AppState
) -> None:
    """Two requests with one key at once, both reviews adding "Ada lives in Berlin" decided
    before either commits. The second to commit finds the first's record and drops its copy,
    then loses the key to the first and fails: its transcript ends FAILED and holds no
    `memory.review.dropped` (written only by a commit), as a turn's failed commit holds none."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada lives in Paris"})
    await _remember(gql, admin, action_id, _talk("I live in Paris"))
    for _ in range(2):
        candidates(model_server, {"summary": "Ada lives in Berlin"})
        # Answered once both reviews asked (the first ingest's call, then two each).
        decide(model_server, {"candidate": "c1", "action": "add"}, after_requests=5)
    messages = _talk("I moved to Berlin")
    first, second = await asyncio.gather(
        *(_remember(gql, admin, action_id, messages, idempotencyKey="k") for _ in range(2))
    )
    assert first == second and first["status"] == "SUCCEEDED", (first, second)
    berlin = [m for m in await memories(gql, admin, action_id) if "Berlin" in m["summary"]]
    assert len(berlin) == 1, berlin
    lost = await state.pool.fetchval(
        "SELECT execution_id FROM executions WHERE action_id = $1 AND status = 'FAILED'",
        UUID(action_id),
    )
    assert lost is not None  # the second lost the key to the first
    execution = (await gql(admin, EXECUTION, e=str(lost))).ok()["execution"]
    types = [e["type"] for e in execution["transcript"]["nodes"]]
    assert types[-1] == "turn.failed" and "memory.review.dropped" not in types, types


async def test_a_review_that_fails_fails_the_ingest_and_keeps_no_key(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.chat_error(500, purpose="memory")
    messages = _talk("Remember that I am vegetarian")
    failed = await _remember(gql, admin, action_id, messages, idempotencyKey="k")
    assert failed["status"] == "FAILED" and failed["error"]
    assert failed["decisions"] == [] and failed["records"] == []
    assert failed["reviewedMessages"] == 0  # nothing of it kept
    execution = (await gql(admin, EXECUTION, e=failed["executionId"])).ok()["execution"]
    assert execution["kind"] == "INGEST" and execution["status"] == "FAILED"
    assert await memories(gql, admin, action_id) == []
    # The failed ingest recorded no key: sent again, the conversation is reviewed.
    candidates(model_server, {"summary": "The user is vegetarian"})
    again = await _remember(gql, admin, action_id, messages, idempotencyKey="k")
    assert again["status"] == "SUCCEEDED" and again["executionId"] != failed["executionId"]
    assert [m["summary"] for m in await memories(gql, admin, action_id)] == [
        "The user is vegetarian"
    ]


@pytest.mark.settings(model_allowed_key_envs=["TEAM_MODEL_KEY"])
async def test_m10_m15_an_ingest_whose_key_file_is_refused_fails_naming_the_variable_alone(
    gql: GQL,
    admin: Caller,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The review is the ingest's work: a key file the service refuses fails the ingest, in
    the words a turn's failure has (the variable and its file, never the path, what the file
    holds or a key), sending nothing; the service's log says the path and the reason. Sent
    again once the file is fixed, the conversation is reviewed with the file's new key."""
    path = tmp_path / "team_model_key"
    path.write_bytes(b"sk-S3CRET\xff\n")
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", str(path))
    action_id = await make_agent_id(
        gql.state, admin, harness=memory_harness(), model={"apiKeyEnv": "TEAM_MODEL_KEY"}
    )
    messages = _talk("Remember that I am vegetarian")
    with caplog.at_level(logging.WARNING):
        failed = await _remember(gql, admin, action_id, messages, idempotencyKey="k")
    said = (
        "model.apiKeyEnv names TEAM_MODEL_KEY, whose key file TEAM_MODEL_KEY_FILE the service "
        "refused (logged by the service)"
    )
    assert failed["status"] == "FAILED" and failed["error"] == said
    execution = (await gql(admin, EXECUTION, e=failed["executionId"])).ok()["execution"]
    assert str(tmp_path) not in json.dumps(execution) and "S3CRET" not in json.dumps(execution)
    assert chat(model_server, None) == []
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "app.runtime.model",
            logging.WARNING,
            f"a model call of account {admin.account_id} failed: model.apiKeyEnv names "
            f"TEAM_MODEL_KEY: TEAM_MODEL_KEY_FILE ({path}) is not UTF-8 text",
        ),
        (
            "app.runtime.turns",
            logging.WARNING,
            f"conversation {failed['executionId']} failed: {said}",
        ),
    ]
    assert "S3CRET" not in caplog.text

    path.write_text("sk-team-2\n")
    candidates(model_server, {"summary": "The user is vegetarian"})
    again = await _remember(gql, admin, action_id, messages, idempotencyKey="k")
    assert again["status"] == "SUCCEEDED", again["error"]
    assert {r.headers["authorization"] for r in chat(model_server, None)} == {"Bearer sk-team-2"}


async def test_without_the_memory_read_grants_record_text_is_not_shown(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    runner = caller(
        admin.account_id,
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.ActionExecution.*"),
    )
    candidates(model_server, {"summary": "Ada's card ends in 4242"})
    done = await _remember(gql, runner, action_id, _talk("My card ends in 4242"))
    assert done["records"] is None
    (decision,) = done["decisions"]
    assert decision["action"] == "ADD" and decision["summary"] is None
    assert decision["memoryId"] is not None
    execution = (await gql(runner, EXECUTION, e=done["executionId"])).ok()["execution"]
    assert "ends in" not in json.dumps(execution["output"])  # (a bare 4242 can be in a UUID)
    # Nor can a client without INSERT on executions hand in a conversation.
    reader = caller(admin.account_id, allow(["SELECT"], "*"))
    refused = await gql(
        reader, REMEMBER, input={"actionId": action_id, "sessionId": "s1", "messages": TALK[1:]}
    )
    assert refused.codes == ["ACCESS_DENIED"]


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"role": "user", "content": "  "}, "messages[0].content must be non-empty text"),
        ({"role": "system", "content": "hi"}, "role must be one of user, assistant, tool"),
        ({"role": "user", "content": "a\x00b"}, "messages[0].content contains a NUL character"),
        ({"role": "user", "content": "x" * 70_000}, "messages[0].content is 70000 bytes"),
        ({"role": "user", "content": "hi", "time": "yesterday"}, "messages[0].time: expected"),
        ({"role": "user", "content": "hi", "time": "2026-11-24T08:30:00"}, "with an offset"),
        ({"role": "user", "content": "hi", "time": "2026-11-24"}, "an RFC 3339 time"),
        ({"role": "user", "content": "hi", "time": "20261124T083000Z"}, "an RFC 3339 time"),
        ({"role": "user", "content": "hi", "time": "2026-02-30T08:30:00Z"}, "no such day"),
        (
            {"role": "user", "content": "hi", "time": "0001-01-01T00:00:00+00:00"},
            "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z in UTC, both excluded",
        ),
    ],
)
async def test_bad_messages_are_refused_with_bad_request(
    gql: GQL, admin: Caller, message: dict[str, Any], problem: str
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    result = await gql(
        admin, REMEMBER, input={"actionId": action_id, "sessionId": "s1", "messages": [message]}
    )
    assert result.codes == ["BAD_REQUEST"] and problem in result.errors[0]["message"], result.errors


async def test_bad_conversations_are_refused_with_bad_request(gql: GQL, admin: Caller) -> None:
    with_memory = await make_agent_id(gql.state, admin, harness=memory_harness())
    without = await make_agent_id(gql.state, admin, harness=None)
    for action_id, session, messages, problem in [
        (with_memory, "s1", [], "messages must hold 1 to 500 messages"),
        (with_memory, None, TALK[1:], "without a sessionId"),
        (without, "s1", TALK[1:], "has no long-term memory"),
        (with_memory, "s1", TALK[1:] * 501, "not 501"),
    ]:
        result = await gql(
            admin,
            REMEMBER,
            input={"actionId": action_id, "sessionId": session, "messages": messages},
        )
        assert result.codes == ["BAD_REQUEST"], result.errors
        assert problem in result.errors[0]["message"]


async def test_remember_conversation_over_mcp(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    token = await token_for(
        state,
        admin,
        "agent-runner",
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.AgentMemory.*"),
    )
    candidates(model_server, {"summary": "Ada's flight leaves on 2026-12-03"})
    async with mcp_session(mcp_url(base_url, action_id), token) as session:
        done = await call(
            session,
            "remember_conversation",
            messages=[{"role": "user", "content": "My flight is the day after tomorrow"}],
            idempotencyKey="k1",
        )
        again = await call(
            session,
            "remember_conversation",
            messages=[{"role": "user", "content": "My flight is the day after tomorrow"}],
            idempotencyKey="k1",
        )
    assert again == done and done["status"] == "SUCCEEDED"  # the key's answer, whole
    assert done["reviewedMessages"] == 1
    (decision,) = done["decisions"]
    assert decision["action"] == "add"
    (kept,) = await memories(gql, admin, action_id)
    assert kept["memoryId"] == decision["memoryId"] == done["memories"][0]["id"]
    assert kept["source"] == "EXTRACTION" and kept["executionId"] == done["executionId"]
    execution = (await gql(admin, EXECUTION, e=done["executionId"])).ok()["execution"]
    assert execution["kind"] == "INGEST"
    assert execution["input"]["client"]["principal"] == "agent-runner"


async def test_remember_conversation_over_mcp_shows_no_record_text_without_the_read_grants(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str
) -> None:
    """Over MCP as over GraphQL, a client that may hand in a conversation but not read the
    agent's memory gets the decisions without their text (summary and note null), the IDs of
    the records written kept; the tool answered with the summaries, which are the records'."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    token = await token_for(
        state, admin, "runner", allow(["INSERT"], "financial.ActionExecution.document")
    )
    candidates(model_server, {"summary": "Ada's card ends in 4242"})
    async with mcp_session(mcp_url(base_url, action_id), token) as session:
        done = await call(
            session,
            "remember_conversation",
            messages=[{"role": "user", "content": "My card ends in 4242"}],
        )
    assert done["status"] == "SUCCEEDED"
    (decision,) = done["decisions"]
    assert decision["action"] == "add" and decision["summary"] is None
    (kept,) = await memories(gql, admin, action_id)
    assert kept["memoryId"] == decision["memoryId"] == done["memories"][0]["id"]
    assert "ends in" not in json.dumps(done)


# Issue 15 item 2: an ingest keeps its messages as session history when the agent keeps it.

WITH_HISTORY = {**memory_harness(), "history": {"index": "messages_and_tools"}}
SESSION_TURNS = """query($a: UUID!) { action(actionId: $a) { sessions(first: 10) {
    nodes { sessionId turns } } } }"""


async def _turns(gql: GQL, who: Caller, action_id: str) -> int:
    result = (await gql(who, SESSION_TURNS, a=action_id)).ok()
    (session,) = result["action"]["sessions"]["nodes"]
    return session["turns"]


async def test_h2_an_ingested_conversation_is_history_a_later_turn_searches(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=WITH_HISTORY)
    candidates(model_server, {"summary": "Ada's locker code is 4471"})
    messages = [
        {"role": "user", "content": "My locker code at the gym is 4471."},
        {"role": "assistant", "content": "Got it, locker 4471."},
        {"role": "tool", "content": "gym_lookup: Ada, member since 2024"},
    ]
    done = await _remember(gql, admin, action_id, messages)
    assert done["status"] == "SUCCEEDED", done["error"]
    # The ingest is the session's first turn, and keeps each message as that turn's.
    execution = (await gql(admin, EXECUTION, e=done["executionId"])).ok()["execution"]
    assert execution["kind"] == "INGEST"
    assert await _turns(gql, admin, action_id) == 1
    kept = await history_of(gql, admin, action_id)
    assert [(e["turn"], e["who"], e["sequence"]) for e in kept] == [
        (1, "USER", 1),
        (1, "AGENT", 2),
        (1, "TOOL", 3),
    ]
    assert {e["executionId"] for e in kept} == {done["executionId"]}
    assert kept[2]["text"] == "gym_lookup: Ada, member since 2024"
    assert not any(e["preview"] for e in kept)

    # A later turn (turn 2) finds it with search_history, and its window is unharmed.
    second, searching = await searched(
        model_server, gql, admin, action_id, {"query": "locker code gym"}
    )
    assert second["status"] == "SUCCEEDED"
    found = searching["output"]["events"]
    user = next(e for e in found if e["text"].startswith("turn 1, user\n"))
    assert user["text"] == "turn 1, user\nMy locker code at the gym is 4471."
    assert user["execution"] == done["executionId"]
    # A handed-in tool message answers no call the conversation names: none is shown.
    tool = next(e for e in found if e["text"].startswith("turn 1, tool\n"))
    assert "call" not in tool, tool
    assert await _turns(gql, admin, action_id) == 2
    assert [(e["turn"], e["who"]) for e in await history_of(gql, admin, action_id)][3] == (
        2,
        "USER",
    )


async def test_h12_an_ingest_is_not_a_turn_and_is_not_replayed(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """The refusal says what is wrong: the kind, not a status the ingest has (SUCCEEDED)."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server)
    done = await _remember(gql, admin, action_id, _talk("I like tea.", "Noted."))
    assert done["status"] == "SUCCEEDED", done["error"]
    refused = await gql(
        admin, EXECUTE, input={"actionId": action_id, "replayOf": done["executionId"]}
    )
    assert refused.codes == ["BAD_REQUEST"]
    assert refused.errors[0]["message"] == (
        f"execution {done['executionId']} is of kind INGEST, not a turn; only a turn "
        "(kind TURN) can be replayed"
    )


async def test_a_later_turn_of_the_session_reads_the_ingested_conversation_in_its_window(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """The ingest counts as the session's turn 1, so turn 2's model call reads it as it would
    an earlier turn: user and assistant messages as they were, a tool's result as a user
    message saying so (it answers no call), its disguising characters removed. Another
    session's turn reads none of it."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server)
    messages = [
        {"role": "user", "content": "My locker code at the gym is 4471."},
        {"role": "assistant", "content": "Got it, locker 4471."},
        {"role": "tool", "content": "gym_lookup: Ada\u202e, member since 2024"},
    ]
    done = await _remember(gql, admin, action_id, messages)
    assert done["status"] == "SUCCEEDED", done["error"]
    model_server.say("It is 4471.")
    executed = await run(gql, admin, action_id, "What is my locker code?", session="s1")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    sent = [(m["role"], m["content"]) for m in chat(model_server)[-1].body["messages"][1:]]
    assert sent == [
        ("user", "My locker code at the gym is 4471."),
        ("assistant", "Got it, locker 4471."),
        ("user", "(a tool's result) gym_lookup: Ada, member since 2024"),
        ("user", "What is my locker code?"),
    ]
    model_server.say("I don't know.")
    await run(gql, admin, action_id, "What is my locker code?", session="s2")
    assert "4471" not in json.dumps(chat(model_server)[-1].body["messages"])


async def test_h2_messages_mode_keeps_no_tool_messages_and_preview_stays_preview(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    harness = {**memory_harness(), "history": {"index": "messages"}}
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    candidates(model_server, {"summary": "Ada likes tea"})
    messages = [
        {"role": "user", "content": "I like tea."},
        {"role": "tool", "content": "tea_shop: open"},
    ]
    done = await _remember(gql, admin, action_id, messages, preview=True)
    assert done["status"] == "SUCCEEDED", done["error"]
    kept = await history_of(gql, admin, action_id)
    assert [(e["who"], e["preview"]) for e in kept] == [("USER", True)]
    # A live turn does not find a preview ingest's messages (H13).
    _, searching = await searched(model_server, gql, admin, action_id, {"query": "tea"})
    assert "I like tea" not in texts(searching)


async def test_h5_without_history_or_when_the_ingest_fails_nothing_is_kept(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    # History off: the ingest counts a turn of its session, and keeps no history.
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada is vegetarian"})
    done = await _remember(gql, admin, action_id, _talk("I am vegetarian", "Noted."))
    assert done["status"] == "SUCCEEDED", done["error"]
    assert await history_of(gql, admin, action_id) == []

    # History on, the review fails: no history, no turn counted.
    action_id = await make_agent_id(gql.state, admin, harness=WITH_HISTORY)
    model_server.chat_error(500, purpose="memory")
    failed = await _remember(gql, admin, action_id, _talk("I am vegetarian", "Noted."))
    assert failed["status"] == "FAILED"
    assert await history_of(gql, admin, action_id) == []
    assert await _turns(gql, admin, action_id) == 0


async def test_a_handed_in_conversation_of_another_shape_fails_no_later_turn(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """An INGEST execution's input is stored as given (`engram import` takes an edited file's):
    a message that is no object is skipped when a later turn's window reads the conversation;
    every turn of the session failed on it (INTERNAL)."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server)
    done = await _remember(gql, admin, action_id, _talk("I like tea.", "Noted."))
    assert done["status"] == "SUCCEEDED", done["error"]
    edited = {"messages": ["I like coffee.", None, {"role": "user", "content": "I like tea."}]}
    async with gql.state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE executions SET input = $1 WHERE execution_id = $2",
            edited,
            UUID(done["executionId"]),
        )
    model_server.say("Tea.")
    executed = await run(gql, admin, action_id, "What do I like?", session="s1")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    sent = [(m["role"], m["content"]) for m in chat(model_server)[-1].body["messages"][1:]]
    assert sent == [("user", "I like tea."), ("user", "What do I like?")]


LONG = 100_000


@pytest.mark.parametrize(
    ("arguments", "quoted"),
    [
        ({"messages": [], "p" * LONG: 1}, "unknown parameter 'pppp"),
        ({"messages": [{"role": "user", "content": "hi", "f" * LONG: 1}]}, "field 'ffff"),
        ({"messages": [{"role": "r" * LONG, "content": "hi"}]}, "not 'rrrr"),
        ({"messages": [{"role": "user", "content": "hi", "time": "t" * LONG}]}, "got 'tttt"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi", "time": f"2026-02-30T00:00:00.{'0' * LONG}Z"}
                ]
            },
            "'2026-02-30T00:00:00.0000",
        ),
    ],
    ids=["parameter", "field", "role", "time", "day"],
)
async def test_remember_conversation_refusals_quote_only_the_start_of_a_long_value(
    gql: GQL, admin: Caller, state: AppState, base_url: str, arguments: dict, quoted: str
) -> None:
    """As the native tools' refusals do: the MCP client's model reads them too."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    token = await token_for(
        state, admin, "agent-runner", allow(["INSERT"], "financial.ActionExecution.document")
    )
    async with mcp_session(mcp_url(base_url, action_id), token) as session:
        body = await refused(session, "remember_conversation", **arguments)
    assert body["code"] == "BAD_REQUEST", body
    assert quoted in body["error"] and "…" in body["error"], body["error"][:300]
    assert len(body["error"]) < 400, len(body["error"])


async def test_an_ingest_whose_review_took_all_its_candidates_says_what_was_not_read(
    gql: GQL, admin: Caller, model_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review stops reading once it holds the candidates it takes. A turn's unread messages
    wait for the session's next review; an ingest's have no next review (it is no turn whose
    messages wait), so its event says to hand them in again rather than that a review will
    read them."""
    monkeypatch.setattr(review_module, "CALL_CHARS", 400)  # each message a part
    monkeypatch.setattr(review_module, "MAX_CANDIDATES", 1)
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada likes tea"})
    done = await _remember(
        gql, admin, action_id, _talk("I'm Ada: " + "tea " * 80, "Bob here: " + "cake " * 80)
    )
    assert done["status"] == "SUCCEEDED", done["error"]
    assert len(review_requests(model_server)) == 1  # the first part's call only
    assert done["reviewedMessages"] == 1  # the answer says where to send again from
    execution = (await gql(admin, EXECUTION, e=done["executionId"])).ok()["execution"]
    (review,) = [
        e["data"] for e in execution["transcript"]["nodes"] if e["type"] == "memory.review"
    ]
    assert review["dropped"] == [
        "parts 2 to 2 of the conversation were not read: the review had taken the 1 candidates "
        "it takes; send their messages again, in another rememberConversation"
    ]
