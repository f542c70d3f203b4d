"""M55: memory text reaches no one without the memory grants, not even through the transcripts
and executions of the turns that recalled, searched, read or wrote it."""

import json
import uuid
from typing import Any

import pytest
from factories import allow, caller, make_agent, make_agent_id, memory_harness
from helpers import GQL
from openai_server import OpenAIServer
from runtime_support import RUNNER_POLICIES, run, tool_runs

from app.auth.caller import Caller
from app.executions import store as executions_store
from app.state import AppState

# Every turn here talks to the scripted model server.
pytestmark = pytest.mark.usefixtures("model_server")

READ_MEMORY = allow(["SELECT"], "financial.AgentMemory.indexes.*", "financial.AgentMemory.document")
LABELS = {"customer_id": {"number": 5, "description": "The customer the memory is about."}}
# Words that appear only in the records' text, never in what the turns were asked.
SUMMARY = "Ada prefers zebramail"
CONTENT = "Evidence: quokka call on 3 May"
LABEL = "cust-narwhal"
SECRETS = ("zebramail", "quokka", "narwhal")
EXECUTION = "query($id: UUID!) { execution(executionId: $id) { input output } }"
TRANSCRIPT = """query($id: UUID!) { execution(executionId: $id) {
    transcript(first: 500) { nodes { type data } } } }"""


def runner(admin: Caller) -> Caller:
    """Starts turns and reads their executions and transcripts; no grant on memory."""
    return caller(admin.account_id, *RUNNER_POLICIES, principal="runner")


def auditor(admin: Caller) -> Caller:
    """Reads executions and transcripts, and holds the grants that read memory."""
    return caller(admin.account_id, *RUNNER_POLICIES, READ_MEMORY, principal="auditor")


async def transcript(gql: GQL, who: Caller, execution_id: str) -> list[dict[str, Any]]:
    result = await gql(who, TRANSCRIPT, id=execution_id)
    return result.ok()["execution"]["transcript"]["nodes"]


def leaked(value: Any) -> list[str]:
    text = json.dumps(value)
    return [s for s in SECRETS if s in text]


# M55
async def test_m55_transcripts_show_memory_text_only_with_the_memory_grants(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(
        gql.state,
        admin,
        harness=memory_harness(tools=["add_memory", "read_memory"], labels=LABELS),
    )
    model_server.call_tools(
        (
            "add_memory",
            {
                "summary": SUMMARY,
                "content": CONTENT,
                "kind": "fact",
                "labels": {"customer_id": LABEL},
            },
        )
    )
    model_server.say("Noted.")
    wrote = await run(gql, runner(admin), action_id, "note how Ada wants to be reached")
    assert wrote["status"] == "SUCCEEDED", wrote["error"]
    (added,) = tool_runs(wrote, "add_memory")
    (record,) = added["output"]["memories"]
    assert set(record) == {"id", "version"} and record["version"] == 1

    # The next turn recalls it, searches for it and reads it.
    model_server.call_tools(("search_memory", {"query": "Ada zebramail"}))
    model_server.call_tools(("read_memory", {"id": record["id"]}))
    model_server.say("By email.")
    read = await run(gql, runner(admin), action_id, "how does Ada want to be reached?")
    assert read["status"] == "SUCCEEDED", read["error"]

    for execution in (wrote, read):
        hidden = await transcript(gql, runner(admin), execution["executionId"])
        assert leaked(hidden) == [], hidden
        assert leaked(execution["output"]) == []
        shown = await transcript(gql, auditor(admin), execution["executionId"])
        assert leaked(shown) == list(SECRETS)

    hidden = await transcript(gql, runner(admin), read["executionId"])
    runs = [e["data"] for e in hidden if e["type"] == "tool.execution"]
    assert {r["name"] for r in runs} == {"search_memory", "read_memory"}
    for r in runs:
        views = r["output"].get("records") or r["output"].get("sources")
        assert views == [{"id": record["id"], "version": 1}], r
    searched = next(
        r for r in runs if r["name"] == "search_memory" and not r["input"].get("recall")
    )
    assert "query" not in searched["input"]
    calls = [
        c
        for e in hidden
        if e["type"] == "model.call" and e["data"]["purpose"] == "turn"
        for c in e["data"]["toolCalls"]
    ]
    assert json.loads(calls[-1]["arguments"]) == {"id": record["id"]}  # IDs stay

    shown = await transcript(gql, auditor(admin), wrote["executionId"])
    (full,) = [
        e["data"]
        for e in shown
        if e["type"] == "tool.execution" and e["data"]["name"] == "add_memory"
    ]
    assert full["output"]["memories"][0]["summary"] == SUMMARY
    assert full["output"]["memories"][0]["content"] == CONTENT
    assert full["input"]["labels"] == {"customer_id": LABEL}


# M55
async def test_m55_an_operator_write_is_recorded_without_the_record_text(
    gql: GQL, admin: Caller
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    added = await gql(
        admin,
        """mutation($a: UUID!, $input: AgentMemoryInput!) {
            addAgentMemory(actionId: $a, input: $input) { memoryId executionId } }""",
        a=action_id,
        input={"summary": SUMMARY, "content": CONTENT, "kind": "fact", "sessionId": "s1"},
    )
    m = added.ok()["addAgentMemory"]
    for who in (runner(admin), auditor(admin)):
        execution = (await gql(who, EXECUTION, id=m["executionId"])).ok()["execution"]
        assert execution["input"] == {
            "operation": "addAgentMemory",
            "memoryId": m["memoryId"],
            "replaces": None,
        }


# M55
async def test_m55_records_in_an_executions_input_and_output_are_reduced_at_the_read_edge(
    state: AppState, gql: GQL, admin: Caller
) -> None:
    action_id = (await make_agent(gql.state, admin, harness=memory_harness())).action_id
    execution_id, memory_id = uuid.uuid4(), str(uuid.uuid4())
    view = {"id": memory_id, "version": 2, "summary": SUMMARY, "content": CONTENT, "kind": "fact"}
    operator_view = {"memoryId": memory_id, "version": 2, "summary": SUMMARY}
    async with state.pool.acquire() as conn:
        await executions_store.insert_execution(
            conn,
            account_id=admin.account_id,
            action_id=action_id,
            execution_id=execution_id,
            action_version=1,
            session_id=None,
            turn=None,
            kind="OPERATOR",
            status="SUCCEEDED",
            preview=False,
            principal="ops",
            token_id=None,
            input={"operation": "import", "memory": operator_view, "note": "kept"},
        )
        await conn.execute(
            "UPDATE executions SET output = $1 WHERE execution_id = $2",
            {"memories": [view], "count": 1},
            execution_id,
        )
    hidden = (await gql(runner(admin), EXECUTION, id=str(execution_id))).ok()["execution"]
    assert hidden == {
        "input": {
            "operation": "import",
            "memory": {"memoryId": memory_id, "version": 2},
            "note": "kept",
        },
        "output": {"memories": [{"id": memory_id, "version": 2}], "count": 1},
    }
    shown = (await gql(auditor(admin), EXECUTION, id=str(execution_id))).ok()["execution"]
    assert shown["input"]["memory"] == operator_view and shown["output"]["memories"] == [view]


# M55 H16
async def test_m55_a_sessions_running_summary_shows_only_with_the_memory_grants(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """The summary folds in the memory tools' calls and results (here the record add_memory
    wrote), so a reader without the grants sees neither the `context.summary` event's text nor
    the reply of the model call of purpose `context` that wrote it."""
    harness = memory_harness(tools=["add_memory"])
    action_id = await make_agent_id(
        gql.state, admin, harness=harness, model={"contextTokens": 1500}
    )
    model_server.call_tools(("add_memory", {"summary": SUMMARY, "kind": "fact"}))
    model_server.say("Noted.")
    for k in range(1, 9):
        model_server.say(f"SUMMARY-{k}: {SUMMARY}, {CONTENT}.", purpose="context")
    executed = []
    for turn in range(1, 8):
        if turn > 1:
            model_server.say(f"ANSWER-{turn} " + "answer words " * 45)
        ask = f"ASK-{turn} " + "question words " * 60
        executed.append(await run(gql, runner(admin), action_id, ask))
        assert executed[-1]["status"] == "SUCCEEDED", executed[-1]["error"]

    folded = []
    for execution in executed:
        hidden = await transcript(gql, runner(admin), execution["executionId"])
        shown = await transcript(gql, auditor(admin), execution["executionId"])
        for seen, full in zip(hidden, shown, strict=True):
            if full["type"] == "context.summary":
                folded.append(full["data"]["summary"])
                assert seen["data"] == {**full["data"], "summary": seen["data"]["summary"]}
                assert "memory read grants" in seen["data"]["summary"]
            if full["type"] == "model.call" and full["data"]["purpose"] == "context":
                assert full["data"]["content"].startswith("SUMMARY-")
                assert "memory read grants" in seen["data"]["content"]
        assert leaked(hidden) == []
    assert folded and all(SUMMARY in s for s in folded)
