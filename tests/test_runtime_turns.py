"""Agent turns end to end: GraphQL `executeAction` -> the runtime -> a scripted
OpenAI-compatible model on loopback -> the real database.

Covers atomic turns (commit whole or not at all, retries as the next invocation, concurrent
turns), the model client's contract with the server (purpose header, usage, misbehaviour,
the bound on calls), sessions, executions and transcripts.
"""

import asyncio
import json
import logging
import socket
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from factories import allow, caller, make_agent_id, make_running_turn, memory_harness
from helpers import GQL
from openai_server import OpenAIServer
from runtime_support import (
    EXECUTE,
    RUNNER_POLICIES,
    chat,
    events,
    memories,
    memory,
    run,
    tool_names,
    tool_results,
    tool_runs,
)

from app.auth.caller import Caller
from app.db.cursors import pack, unpack
from app.executions import liveness_store
from app.graphql.relay import global_id
from app.memory.service import MemoryWork
from app.runtime import turns
from app.runtime.model import ModelClient, ToolCall
from app.runtime.tools import NativeTools, ToolResult
from app.state import AppState

MAX_CALLS = 6
CREATE = "mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"
UPDATE = (
    "mutation($id: UUID!, $input: ActionInput!) "
    "{ updateAction(actionId: $id, input: $input) { version } }"
)


pytestmark = [
    pytest.mark.usefixtures("model_server"),
    pytest.mark.settings(
        model_name="scripted", model_max_retries=2, max_model_calls_per_turn=MAX_CALLS
    ),
]


def runner(admin: Caller) -> Caller:
    return caller(admin.account_id, *RUNNER_POLICIES, principal="runner")


async def runner_reads(gql: GQL, admin: Caller, action_id: str, memory_id: str) -> list[str]:
    """The error codes of the runner reading one of the agent's records."""
    read = await gql(
        runner(admin),
        "query($a: UUID!, $m: UUID!) { agentMemory(actionId: $a, id: $m) { status } }",
        a=action_id,
        m=memory_id,
    )
    return read.codes


# Provenance, atomicity, retries


async def test_m40_m45_m53_m26_add_memory_commits_with_full_provenance(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(
        (
            "add_memory",
            {"summary": "Ada prefers email", "kind": "fact", "content": "Said on 3 May."},
        )
    )
    model_server.say("Noted.")

    # M26: the client running the turn holds no grant on financial.AgentMemory.
    executed = await run(gql, runner(admin), action_id, "Ada says: email me, never call")

    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert executed["output"] == "Noted."
    assert (executed["turn"], executed["invocationNumber"]) == (1, 1)
    (added,) = tool_runs(executed, "add_memory")  # M45: an execution of the native tool
    (written,) = added["output"]["memories"]  # M46
    # M55: the runner holds no memory grant, so its transcript names the record only.
    assert set(written) == {"id", "version"}
    record = await memory(gql, admin, action_id, written["id"])
    assert record is not None
    assert {k: record[k] for k in record if k not in ("memoryId", "labels")} == {
        "version": 1,
        "summary": "Ada prefers email",
        "content": "Said on 3 May.",
        "status": "ACTIVE",
        "scope": "SESSION",
        "kind": "fact",
        "source": "TOOL",
        "pinned": False,
        "preview": False,
        "replaces": None,
        "replacedBy": None,
        "executionId": executed["executionId"],
        "invocationNumber": 1,
        "actionVersion": 1,
        "sessionId": "s1",
        "modifiedBy": f"action:{action_id}",
    }


async def test_m55_running_an_agent_grants_its_caller_nothing_on_memory(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    executed = await run(gql, runner(admin), action_id, "note it")
    (written,) = tool_runs(executed, "add_memory")[0]["output"]["memories"]

    assert await runner_reads(gql, admin, action_id, written["id"]) == ["ACCESS_DENIED"]


async def test_m26_a_turn_without_memory_grants_deletes_and_replaces_its_records(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """M26 in a real turn: the client running it holds no grant on financial.AgentMemory at
    all, yet its model deletes one record and replaces another."""
    harness = memory_harness(tools=["add_memory", "delete_memory"])
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    model_server.call_tools(
        ("add_memory", {"summary": "Ada's locker is 17", "kind": "fact"}),
        ("add_memory", {"summary": "Ada's desk is 4B", "kind": "fact"}),
    )
    model_server.say("Saved.")
    saved = await run(gql, runner(admin), action_id, "Ada: locker 17, desk 4B")
    assert saved["status"] == "SUCCEEDED", saved["error"]
    (locker,), (desk,) = (r["output"]["memories"] for r in tool_runs(saved, "add_memory"))

    model_server.call_tools(
        ("delete_memory", {"id": locker["id"]}),
        ("add_memory", {"summary": "Ada's desk is 9C", "kind": "fact", "replaces": desk["id"]}),
    )
    model_server.say("Updated.")
    executed = await run(gql, runner(admin), action_id, "Ada gave up her locker; desk is 9C now")

    assert executed["status"] == "SUCCEEDED", executed["error"]
    (deleting,) = tool_runs(executed, "delete_memory")
    (adding,) = tool_runs(executed, "add_memory")
    assert "error" not in deleting and "error" not in adding, (deleting, adding)
    new, replaced = adding["output"]["memories"]
    assert replaced["id"] == desk["id"]
    # Read back with an admin: the changes were committed, made by the agent's principal.
    gone = await memory(gql, admin, action_id, locker["id"])
    assert gone is not None
    assert (gone["status"], gone["version"]) == ("DELETED", 2)
    assert gone["modifiedBy"] == f"action:{action_id}"
    old = await memory(gql, admin, action_id, desk["id"])
    assert old is not None
    assert (old["status"], old["replacedBy"]) == ("SUPERSEDED", new["id"])
    assert old["modifiedBy"] == f"action:{action_id}"
    fresh = await memory(gql, admin, action_id, new["id"])
    assert fresh is not None
    assert (fresh["status"], fresh["summary"], fresh["replaces"]) == (
        "ACTIVE",
        "Ada's desk is 9C",
        desk["id"],
    )
    assert [m["memoryId"] for m in await memories(gql, admin, action_id)] == [new["id"]]
    # The runner itself still reads none of it.
    assert await runner_reads(gql, admin, action_id, new["id"]) == ["ACCESS_DENIED"]


async def test_a_turn_whose_answer_asks_for_what_its_caller_may_not_read_does_not_run(
    gql: GQL, admin: Caller, model_server: OpenAIServer, state: AppState
) -> None:
    """A failed request answers data: null, so a turn that ran and then failed on its answer's
    selection would leave its caller no executionId, and a retry would run it twice: the
    selection is checked before the turn runs (fragments too)."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    front = caller(admin.account_id, allow(["INSERT"], "financial.ActionExecution.document"))
    execute = "mutation($i: ExecuteActionInput!) { executeAction(input: $i) { executionId %s } }"
    turn = {"actionId": action_id, "sessionId": "front", "input": "ping"}

    async def executions() -> int:
        async with state.pool.acquire() as conn:
            return await conn.fetchval(
                "SELECT count(*) FROM executions WHERE action_id = $1", uuid.UUID(action_id)
            )

    refusals = {
        "action { name }": "Action.name",
        "session { turns }": "ActionExecution.session",
        "...on ActionExecution { transcript(first: 3) { nodes { type } } }": (
            "ActionExecution.transcript"
        ),
    }
    for selection, field in refusals.items():
        refused = await gql(front, execute % selection, i=turn)
        assert refused.codes == ["ACCESS_DENIED"], refused.errors
        message = refused.errors[0]["message"]
        assert f"{field} needs: nothing ran" in message, message
    # searchMemories needs the search grants with a query, the listing's without one.
    searcher = caller(
        admin.account_id,
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.AgentMemory.indexes.search", "financial.AgentMemory.document"),
    )
    listing = "action { searchMemories(first: 2) { nodes { memoryId } } }"
    refused = await gql(searcher, execute % listing, i=turn)
    assert "financial.AgentMemory.indexes.created" in refused.errors[0]["message"]
    # A query given by a variable's default is a query: a lister without the search grant is
    # refused before the turn runs.
    lister = caller(
        admin.account_id,
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.AgentMemory.indexes.created"),
        allow(["SELECT"], "financial.AgentMemory.document"),
    )
    by_default = (
        'mutation($i: ExecuteActionInput!, $q: String = "pong") { executeAction(input: $i) {'
        " action { searchMemories(query: $q, first: 2) { nodes { memoryId } } } } }"
    )
    refused = await gql(lister, by_default, i=turn)
    assert "financial.AgentMemory.indexes.search" in refused.errors[0]["message"]
    assert await executions() == 0
    assert model_server.requests == []
    model_server.say("pong")
    ran = (await gql(front, execute % "status output action { actionId }", i=turn)).ok()
    assert ran["executeAction"]["status"] == "SUCCEEDED"
    assert await executions() == 1
    model_server.say("pong")
    query = 'action { searchMemories(query: "pong", first: 2) { nodes { memoryId } } }'
    assert (await gql(searcher, execute % query, i=turn)).ok()
    assert await executions() == 2

    # Any mutation: an agent written by a client that may only create agents reads back the
    # version it wrote, but asking for its memories is refused before anything is created.
    creator = caller(admin.account_id, allow(["INSERT"], "financial.Action.document"))
    create = 'mutation { createAction(input: {name: "x"}) { actionId name %s } }'
    refused = await gql(creator, create % "memories(first: 1) { nodes { memoryId } }")
    assert "Action.memories needs: nothing ran" in refused.errors[0]["message"]
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM actions WHERE account_id = $1 AND "
                                   "action_id IN (SELECT action_id FROM action_versions WHERE "
                                   "name = 'x')", admin.account_id) == 0  # fmt: skip
    assert (await gql(creator, create % "")).ok()["createAction"]["name"] == "x"


async def test_a_request_runs_one_mutation_so_a_later_failure_cannot_hide_an_earlier_answer(
    gql: GQL, admin: Caller, model_server: OpenAIServer, state: AppState
) -> None:
    """A failed request answers data: null: of two mutations in one request, a second that
    fails after the first ran would hide the first's answer (its executionId), and a retry
    would run it twice. A request of several mutations is refused before any runs, naming
    them; one left out by @skip or @include does not count, nor a field asked twice."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    turn = {"actionId": action_id, "sessionId": "one", "input": "ping"}

    async def executions() -> int:
        async with state.pool.acquire() as conn:
            return await conn.fetchval(
                "SELECT count(*) FROM executions WHERE action_id = $1", uuid.UUID(action_id)
            )

    both = """mutation($i: ExecuteActionInput!, $bad: UUID!, $skip: Boolean!) {
        a: executeAction(input: $i) { executionId }
        ... on Mutation { b: deleteAgentMemory(actionId: $bad, id: $bad) @skip(if: $skip) {
            version } } }"""
    refused = await gql(admin, both, i=turn, bad=str(uuid.uuid4()), skip=False)
    assert refused.codes == ["BAD_REQUEST"] and refused.data is None
    message = refused.errors[0]["message"]
    assert "a request runs one mutation" in message and "2 (a, b)" in message, message
    assert await executions() == 0 and model_server.requests == []

    model_server.say("pong")
    ran = (await gql(admin, both, i=turn, bad=str(uuid.uuid4()), skip=True)).ok()
    assert set(ran) == {"a"} and await executions() == 1
    # A condition's default counts as execution reads it, whether sent or not.
    by_default = both.replace("$skip: Boolean!", "$skip: Boolean = true")
    model_server.say("pong")
    ran = (await gql(admin, by_default, i=turn, bad=str(uuid.uuid4()))).ok()
    assert set(ran) == {"a"} and await executions() == 2
    refused = await gql(admin, by_default, i=turn, bad=str(uuid.uuid4()), skip=False)
    assert refused.codes == ["BAD_REQUEST"] and await executions() == 2
    twice = """mutation($i: ExecuteActionInput!) { executeAction(input: $i) { executionId }
        executeAction(input: $i) { status } }"""
    model_server.say("pong")
    assert (await gql(admin, twice, i=turn)).ok()["executeAction"]["status"] == "SUCCEEDED"
    assert await executions() == 3


async def test_m17_failed_turn_leaves_only_its_transcript_and_retry_is_invocation_2(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.chat_error(500, times=3)  # the first attempt and both retries of call 2

    failed = await run(gql, admin, action_id, "note that Ada prefers email")

    assert failed["status"] == "FAILED"
    assert "HTTP 500" in failed["error"]
    assert failed["output"] is None
    # What the attempt did stays in its transcript...
    (added,) = tool_runs(failed, "add_memory")
    assert added["output"]["memories"][0]["summary"] == "Ada prefers email"
    assert events(failed, "turn.failed") == [{"error": failed["error"]}]
    # ...and nothing else of it: no record, staged or committed, and no counted turn.
    assert await memories(gql, admin, action_id) == []
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 0
        assert await conn.fetchval("SELECT turns FROM sessions") == 0

    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Saved.")
    retried = await run(gql, admin, action_id, None, execution_id=failed["executionId"])

    assert retried["status"] == "SUCCEEDED", retried["error"]
    assert retried["executionId"] == failed["executionId"]
    assert retried["invocationNumber"] == 2
    assert retried["turn"] == 1
    invocations = [e["invocationNumber"] for e in retried["transcript"]["nodes"]]
    assert invocations == sorted(invocations) and set(invocations) == {1, 2}
    sequences = [e["sequence"] for e in retried["transcript"]["nodes"]]
    assert sequences == list(range(1, len(sequences) + 1))
    (kept,) = await memories(gql, admin, action_id)
    assert (kept["executionId"], kept["invocationNumber"]) == (failed["executionId"], 2)


async def test_retry_only_of_a_failed_execution_and_in_its_own_session(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    done = await run(gql, admin, action_id, "hi")
    request = {"actionId": action_id, "sessionId": "s1", "executionId": done["executionId"]}
    result = await gql(admin, EXECUTE, input=request)
    assert result.codes == ["BAD_REQUEST"]
    assert result.errors[0]["message"] == (
        f"execution {done['executionId']} is SUCCEEDED; only a FAILED execution can be retried: "
        "to run a committed turn's input again, with the agent's current version, pass its "
        "executionId as replayOf instead (a preview run)"
    )

    model_server.chat_error(400)
    failed = await run(gql, admin, action_id, "hi")
    assert failed["status"] == "FAILED"
    elsewhere = await gql(
        admin, EXECUTE, input={**request, "executionId": failed["executionId"], "sessionId": "s2"}
    )
    assert elsewhere.codes == ["BAD_REQUEST"]
    other_input = await gql(
        admin, EXECUTE, input={**request, "executionId": failed["executionId"], "input": "bye"}
    )
    assert other_input.codes == ["BAD_REQUEST"]


async def test_an_execution_still_running_is_retried_or_replayed_as_a_conflict(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """Two retries of one failed turn at once: whichever comes second is answered CONFLICT
    (the execution is running, which will change), as when both read it FAILED, never
    BAD_REQUEST; so is a replay of a turn still running."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    model_server.chat_error(400)
    failed = await run(gql, admin, action_id, "hi")
    assert failed["status"] == "FAILED"
    model_server.say("slow answer", delay=1.0)
    request = {"actionId": action_id, "sessionId": "s1", "executionId": failed["executionId"]}

    async def second() -> Any:
        await asyncio.sleep(0.4)  # the first retry is running by now
        again = await gql(admin, EXECUTE, input=request)
        replay = await gql(
            admin, EXECUTE, input={"actionId": action_id, "replayOf": failed["executionId"]}
        )
        return again, replay

    first, (again, replay) = await asyncio.gather(gql(admin, EXECUTE, input=request), second())

    assert first.ok()["executeAction"]["status"] == "SUCCEEDED"
    assert again.codes == ["CONFLICT"], again.errors
    assert "is running" in again.errors[0]["message"]
    assert replay.codes == ["CONFLICT"], replay.errors


async def test_a_tool_crash_fails_the_turn_and_keeps_no_memory(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    action_id = await make_agent_id(
        gql.state, admin, harness=memory_harness(tools=["add_memory", "delete_memory"])
    )
    model_server.call_tools(
        ("add_memory", {"summary": "Ada prefers email", "kind": "fact"}),
        ("delete_memory", {"id": str(uuid.uuid4())}),
    )

    async def crash(self: MemoryWork, memory_id: uuid.UUID) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(MemoryWork, "delete", crash)
    failed = await run(gql, admin, action_id, "note it")

    assert failed["status"] == "FAILED"
    assert "internal error" in failed["error"] and "disk on fire" not in failed["error"]
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 0


async def test_concurrent_turns_of_one_agent_cannot_lose_updates(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    harness = memory_harness(
        tools=["add_memory"], scope={"read": ["session", "agent"], "write": ["session", "agent"]}
    )
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    model_server.call_tools(
        ("add_memory", {"summary": "Ada's plan is Basic", "kind": "fact", "scope": "AGENT"})
    )
    first = await run(gql, admin, action_id, "Ada is on Basic")
    (original,) = tool_runs(first, "add_memory")[0]["output"]["memories"]

    # Both turns stage a replacement of the same record; neither model answers before both
    # have (4 chat requests after the first turn's 2), and turn A's answer comes first.
    for turn, plan in (("turn A", "Premium"), ("turn B", "Gold")):
        replacement = {"summary": f"Ada's plan is {plan}", "kind": "fact", "scope": "AGENT"}
        model_server.call_tools(
            ("add_memory", {**replacement, "replaces": original["id"]}), when=turn
        )
    model_server.say("done", when="turn A", after_requests=6)
    model_server.say("done", when="turn B", after_requests=6, delay=0.5)
    won, lost = await asyncio.gather(
        run(gql, admin, action_id, "Ada changed plan (turn A)", session="s2"),
        run(gql, admin, action_id, "Ada changed plan (turn B)", session="s3"),
    )

    assert won["status"] == "SUCCEEDED", won["error"]
    assert lost["status"] == "FAILED"
    assert "another turn changed this agent's memory" in lost["error"]
    (replacement,) = [
        m
        for m in tool_runs(won, "add_memory")[0]["output"]["memories"]
        if m["id"] != original["id"]
    ]
    replaced = await memory(gql, admin, action_id, original["id"])
    assert replaced is not None
    assert (replaced["status"], replaced["replacedBy"]) == ("SUPERSEDED", replacement["id"])
    live = await memories(gql, admin, action_id)
    assert [m["memoryId"] for m in live] == [replacement["id"]]


async def test_stale_turns_are_failed_and_their_staged_memory_dropped(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    crashed = await make_running_turn(state, admin, action_id=action_id, idle=timedelta(days=1))

    await run(gql, admin, action_id, "hello")

    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 0
        row = await conn.fetchrow(
            "SELECT status, error FROM executions WHERE execution_id = $1", crashed
        )
    assert (row["status"], row["error"]) == ("FAILED", liveness_store.DEAD_PROCESS_ERROR)


async def _sweep(state: AppState, context: turns.TurnContext) -> list[uuid.UUID]:
    """What fail_stale_turns does to a turn whose last sign of life is a day old."""
    e = context.execution
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE executions SET modified = now() - interval '1 day' WHERE execution_id = $1",
            e.execution_id,
        )
        return await liveness_store.fail_stale_turns(conn, e.account_id, e.action_id, 3600)


async def _run_swept(
    gql: GQL,
    admin: Caller,
    monkeypatch: pytest.MonkeyPatch,
    action_id: str,
    prompt: str,
    reviewed: dict[uuid.UUID, int] | None = None,
) -> dict[str, Any]:
    """Runs a turn that its end-of-turn step sweeps as stale (`_sweep`), and checks it failed
    as such. With `reviewed`, the step also leaves what a review that ran and wrote nothing
    leaves for the commit to mark: the turn itself and those turns covered."""
    swept: list[uuid.UUID] = []

    async def sweep(context: turns.TurnContext, client: ModelClient) -> None:
        swept.extend(await _sweep(gql.state, context))
        if reviewed is not None:
            context.review_messages = 2
            context.reviewed = {context.execution.execution_id: 0, **reviewed}

    monkeypatch.setattr(turns, "END_OF_TURN_STEPS", [sweep])
    executed = await run(gql, admin, action_id, prompt)
    assert swept == [uuid.UUID(executed["executionId"])]
    assert executed["status"] == "FAILED" and executed["output"] is None
    assert "failed as stale or retried" in executed["error"]
    assert events(executed, "turn.failed") == [{"error": executed["error"]}]
    return executed


async def test_a_turn_swept_as_stale_before_it_commits_fails_and_keeps_nothing(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    await _run_swept(gql, admin, monkeypatch, action_id, "note it")
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 0
        assert await conn.fetchval("SELECT turns FROM sessions") == 0


async def test_a_turn_swept_before_it_commits_its_end_alone_keeps_nothing(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, for a turn whose commit writes nothing but its end, in one statement
    (store.commit_turn): swept, it is not counted in its session, and neither its answer nor
    its review's marks are kept."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.say("hello")
    executed = await _run_swept(gql, admin, monkeypatch, action_id, "hi", reviewed={})
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT turns FROM sessions") == 0
        marks = await conn.fetchrow(
            "SELECT review_messages, reviewed_by FROM executions WHERE execution_id = $1",
            uuid.UUID(executed["executionId"]),
        )
    assert tuple(marks) == (None, None)


async def test_a_swept_turn_committing_its_end_alone_marks_no_turn_its_review_covered(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, when the review covered an earlier turn of the session too: swept before its
    one-statement commit (store.commit_turn), it leaves that turn awaiting review."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.say("first")
    earlier = uuid.UUID((await run(gql, admin, action_id, "one"))["executionId"])
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE executions SET review_messages = 2, reviewed_by = NULL, review_read = 0 "
            "WHERE execution_id = $1",
            earlier,
        )
    model_server.say("hello")
    await _run_swept(gql, admin, monkeypatch, action_id, "hi", reviewed={earlier: 0})
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT turns FROM sessions") == 1
        marked = await conn.fetchval(
            "SELECT reviewed_by FROM executions WHERE execution_id = $1", earlier
        )
    assert marked is None


async def test_an_attempt_retried_while_it_ran_ends_as_no_longer_running_and_keeps_nothing(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn swept as stale before it commits (its process stalled), and retried by its
    caller meanwhile: the first attempt, committing a record, finds its invocation no longer
    runs. It answers that, as a CONFLICT, and writes nothing: not its record (M17), nor a word
    of its transcript among the retry's (store.finish_execution writes the attempt's events
    only when it ends the attempt; the retry numbered its own from where the first stopped)."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("noted")
    retried: dict[str, Any] = {}

    async def sweep_and_retry(context: turns.TurnContext, client: ModelClient) -> None:
        monkeypatch.setattr(turns, "END_OF_TURN_STEPS", [])  # the retry's end: no step
        assert await _sweep(gql.state, context) == [context.execution.execution_id]
        model_server.say("retried")
        execution_id = str(context.execution.execution_id)
        retried.update(await run(gql, admin, action_id, "note it", execution_id=execution_id))

    monkeypatch.setattr(turns, "END_OF_TURN_STEPS", [sweep_and_retry])
    first = await gql(
        admin, EXECUTE, input={"actionId": action_id, "sessionId": "s1", "input": "note it"}
    )
    assert first.codes == ["CONFLICT"]
    assert "no longer runs invocation 1" in first.errors[0]["message"]
    assert (retried["status"], retried["invocationNumber"]) == ("SUCCEEDED", 2)
    assert retried["output"] == "retried"
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 0
        stored = await conn.fetch(
            "SELECT invocation_number, type FROM transcript_events ORDER BY sequence"
        )
    # The first attempt's events are those written while it ran (none after its last model
    # call); the retry's follow them.
    first_types = [r["type"] for r in stored if r["invocation_number"] == 1]
    assert first_types and first_types[-1] == "model.call"
    assert [r["invocation_number"] for r in stored] == sorted(
        r["invocation_number"] for r in stored
    )
    assert [r["type"] for r in stored if r["invocation_number"] == 2][-1] == "turn.output"


@pytest.mark.parametrize("memory", [False, True])
async def test_a_commit_whose_acknowledgement_was_lost_answers_the_committed_turn(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    memory: bool,
) -> None:
    """The turn's commit went through, but its connection ended before the answer came back
    (the database or the network went away for a moment): the turn answers as committed, not
    CONFLICT saying it was failed as stale or retried and nothing of it was kept."""
    harness = memory_harness(tools=["add_memory"]) if memory else None
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    if memory:  # a commit of its own transaction (`_commit`), not its end alone
        model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("noted")
    commit = turns._commit

    async def commit_then_lose_the_answer(context: turns.TurnContext) -> Any:
        await commit(context)
        raise asyncpg.ConnectionDoesNotExistError(
            "connection was closed in the middle of operation"
        )

    monkeypatch.setattr(turns, "_commit", commit_then_lose_the_answer)
    result = await gql(
        admin, EXECUTE, input={"actionId": action_id, "sessionId": "s1", "input": "note it"}
    )

    executed = result.ok()["executeAction"]
    assert (executed["status"], executed["output"], executed["turn"]) == ("SUCCEEDED", "noted", 1)
    assert events(executed, "turn.failed") == []
    assert len(await memories(gql, admin, action_id)) == (1 if memory else 0)


async def _lose_start(state: AppState, execution_id: uuid.UUID) -> None:
    """What a crash of PostgreSQL leaves of a turn whose start it lost (the start is committed
    without waiting for its WAL flush): no execution, while the turn goes on."""
    async with state.pool.acquire() as conn:
        await conn.execute("DELETE FROM executions WHERE execution_id = $1", execution_id)


@pytest.mark.parametrize("lost", ["at a sign of life", "at the commit"])
async def test_a_turn_whose_start_the_database_lost_says_so(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    lost: str,
) -> None:
    """A turn finding its execution gone, at a sign of life after a model call or at its
    commit, answers CONFLICT saying the database lost its start and to run it again, not that
    it was swept as stale or retried; nothing of it is kept."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("noted")
    if lost == "at a sign of life":
        touch = turns.store.touch_execution

        async def lose_then_touch(conn: Any, *args: Any, **kwargs: Any) -> bool:
            await _lose_start(state, args[2])  # account, action, execution, ...
            return bool(await touch(conn, *args, **kwargs))

        monkeypatch.setattr(turns.store, "touch_execution", lose_then_touch)
    else:

        async def lose(context: turns.TurnContext, client: ModelClient) -> None:
            await _lose_start(state, context.execution.execution_id)

        monkeypatch.setattr(turns, "END_OF_TURN_STEPS", [lose])
    answered = await gql(
        admin, EXECUTE, input={"actionId": action_id, "sessionId": "s1", "input": "note it"}
    )
    assert answered.codes == ["CONFLICT"], answered.errors
    message = answered.errors[0]["message"]
    assert "the database lost this turn's start" in message and "run the turn again" in message
    assert "stale" not in message
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 0
        assert await conn.fetchval("SELECT count(*) FROM executions") == 0


async def test_a_replay_committing_its_end_alone_counts_no_turn(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """A replay whose commit writes nothing but its end (store.commit_turn, without `count`)
    keeps its original's number and counts no turn in the session: the next turn is the
    second."""
    action_id = await make_agent_id(gql.state, admin)
    model_server.say("first")
    original = await run(gql, admin, action_id, "one")
    model_server.say("again")
    replay = (
        await gql(
            admin, EXECUTE, input={"actionId": action_id, "replayOf": original["executionId"]}
        )
    ).ok()["executeAction"]
    assert replay["status"] == "SUCCEEDED", replay["error"]
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT turns FROM sessions") == 1
        numbers = await conn.fetch("SELECT turn FROM executions ORDER BY created")
    assert [r["turn"] for r in numbers] == [1, 1]
    model_server.say("second")
    await run(gql, admin, action_id, "two")
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT turns FROM sessions") == 2
        last = await conn.fetchval("SELECT turn FROM executions ORDER BY created DESC LIMIT 1")
    assert last == 2


async def test_a_long_turn_stays_alive_and_a_swept_one_stops_calling_the_model(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    original = NativeTools.call
    sweep_in_tool = False

    async def slow_tool(self: NativeTools, call: ToolCall) -> ToolResult:
        # The turn has now run past the stale limit since its last model call.
        async with state.pool.acquire() as conn:
            await conn.execute(
                "UPDATE executions SET modified = now() - interval '1 day' WHERE status = 'RUNNING'"
            )
            if sweep_in_tool:
                await liveness_store.fail_stale_turns(conn, admin.account_id, action_uuid, 3600)
        return await original(self, call)

    swept: list[uuid.UUID] = []

    async def sweep(context: turns.TurnContext, client: ModelClient) -> None:
        async with state.pool.acquire() as conn:
            e = context.execution
            swept.extend(
                await liveness_store.fail_stale_turns(conn, e.account_id, e.action_id, 3600)
            )

    action_uuid = uuid.UUID(action_id)
    monkeypatch.setattr(NativeTools, "call", slow_tool)
    monkeypatch.setattr(turns, "END_OF_TURN_STEPS", [sweep])
    model_server.call_tools(("search_memory", {"query": "anything"}))
    alive = await run(gql, admin, action_id, "look it up")
    # Each model call refreshes the turn's `modified`, so the sweep spares it.
    assert alive["status"] == "SUCCEEDED", alive["error"]
    assert swept == []

    sweep_in_tool = True
    for _ in range(3):
        model_server.call_tools(("search_memory", {"query": "anything"}))
    stopped = await run(gql, admin, action_id, "look it up again")
    assert stopped["status"] == "FAILED" and "failed as stale" in stopped["error"]
    # The call after the sweep was the last: the turn did not go on to its other tool calls.
    assert len(chat(model_server)) == 2 + 2


# The model client, as the model server sees it


async def test_every_model_request_says_its_purpose_and_usage_is_recorded(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    executed = await run(gql, admin, action_id, "note it")
    await run(gql, admin, action_id, "and now?")

    requests = chat(model_server)
    assert len(requests) == 3
    for request in requests:
        assert request.headers["x-engram-purpose"] == "turn"
        assert request.body["metadata"] == {"purpose": "turn"}
        assert request.body["model"] == "scripted"
    # M15: each turn's memory review is a model call of purpose memory.
    reviews = chat(model_server, "memory")
    assert len(reviews) == 2
    assert all(r.body["metadata"] == {"purpose": "memory"} for r in reviews)
    calls = events(executed, "model.call")
    assert [c["purpose"] for c in calls] == ["turn", "turn", "memory"]
    assert all(c["usage"]["total_tokens"] > 0 for c in calls)
    # M24: embeddings are usage of purpose embed (the add, and the recalls before each call).
    embeds = events(executed, "embedding")
    assert {e["purpose"] for e in embeds} == {"embed"}
    assert {e["for"] for e in embeds} == {"recall", "add_memory"}
    assert all(e["tokens"] > 0 for e in embeds)


async def test_per_action_model_configuration_is_sent(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    model = {
        "baseUrl": model_server.url,
        "name": "house-model",
        "temperature": 0.2,
        "maxTokens": 300,
    }
    action_id = await make_agent_id(gql.state, admin, harness=None, model=model)
    await run(gql, admin, action_id, "hi")
    (request,) = chat(model_server)
    assert (request.body["model"], request.body["temperature"], request.body["max_tokens"]) == (
        "house-model",
        0.2,
        300,
    )
    assert "tools" not in request.body  # memory off: no native tools


async def test_an_action_cannot_send_a_host_secret_to_a_server_of_its_own(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    with OpenAIServer() as elsewhere:
        for model, setting in (
            ({"baseUrl": elsewhere.url}, "ENGRAM_MODEL_ALLOWED_BASE_URLS"),
            ({"apiKeyEnv": "AWS_SECRET_ACCESS_KEY"}, "ENGRAM_MODEL_ALLOWED_KEY_ENVS"),
            (
                {"baseUrl": elsewhere.url, "apiKeyEnv": "AWS_SECRET_ACCESS_KEY"},
                "ENGRAM_MODEL_ALLOWED_KEY_ENVS",
            ),
        ):
            # Refused when the action is written (createAction, updateAction), not at its
            # first turn.
            refused = await gql(admin, CREATE, input={"name": "agent", "model": model})
            assert refused.codes == ["BAD_REQUEST"], refused.errors
            assert setting in refused.errors[0]["message"]
            plain = await make_agent_id(gql.state, admin, harness=None)
            refused = await gql(admin, UPDATE, id=plain, input={"name": "agent", "model": model})
            assert refused.codes == ["BAD_REQUEST"], refused.errors
            assert setting in refused.errors[0]["message"]
        # An action written while the operator allowed its endpoint is checked again at each
        # turn: the allow-list may have shrunk meanwhile.
        state.settings.model_allowed_base_urls = [elsewhere.url]
        action_id = await make_agent_id(
            gql.state, admin, harness=None, model={"baseUrl": elsewhere.url}
        )
        state.settings.model_allowed_base_urls = []
        refused = await gql(
            admin, EXECUTE, input={"actionId": action_id, "sessionId": "s1", "input": "hi"}
        )
        assert refused.codes == ["BAD_REQUEST"]
        assert "ENGRAM_MODEL_ALLOWED_BASE_URLS" in refused.errors[0]["message"]
        assert elsewhere.requests == []
    assert chat(model_server) == []
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM executions") == 0
        # Nothing refused was written: only the plain agents and the one allowed then.
        versions = await conn.fetch("SELECT model FROM action_versions")
        assert len(versions) == 4 and sum(v["model"] != {} for v in versions) == 1

    # Once the operator lists the variable, its value goes to an allowed endpoint.
    monkeypatch.setenv("TEAM_MODEL_KEY", "sk-team")
    monkeypatch.setattr(state.settings, "model_allowed_key_envs", ["TEAM_MODEL_KEY"])
    action_id = await make_agent_id(
        gql.state,
        admin,
        harness=None,
        model={"baseUrl": model_server.url, "apiKeyEnv": "TEAM_MODEL_KEY"},
    )
    executed = await run(gql, admin, action_id, "hi")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert chat(model_server)[0].headers["authorization"] == "Bearer sk-team"


async def test_a_model_key_may_be_a_file_that_each_turn_reads_anew(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An allowed model.apiKeyEnv TEAM_MODEL_KEY may be given as the file TEAM_MODEL_KEY_FILE
    names, as the secret settings may (a variable's value shows in `docker inspect`). The file
    is read at each model call: a key rotated in it is sent from the next turn on, without a
    restart. Set both ways, or in a file that cannot be a key, the turn fails as on a key set
    neither way, naming the variable and sending nothing; the file's path and what is wrong with
    it are the operator's deployment, which the service's log says, not the turn. The key is
    never said."""
    key_file = tmp_path / "team_model_key"
    key_file.write_text("sk-team-1\n")
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", str(key_file))
    monkeypatch.setattr(state.settings, "model_allowed_key_envs", ["TEAM_MODEL_KEY"])
    action_id = await make_agent_id(
        gql.state, admin, harness=None, model={"apiKeyEnv": "TEAM_MODEL_KEY"}
    )
    first = await run(gql, admin, action_id, "hi")
    assert first["status"] == "SUCCEEDED", first["error"]
    key_file.write_text("sk-team-2\n")  # rotated in place, as a mounted secret is
    second = await run(gql, admin, action_id, "again")
    assert second["status"] == "SUCCEEDED", second["error"]
    assert [r.headers["authorization"] for r in chat(model_server)] == [
        "Bearer sk-team-1",
        "Bearer sk-team-2",
    ]

    said = (
        "model.apiKeyEnv names TEAM_MODEL_KEY, whose key file TEAM_MODEL_KEY_FILE the service "
        "refused (logged by the service)"
    )
    both = "TEAM_MODEL_KEY and TEAM_MODEL_KEY_FILE are both set: set one or the other"
    unreadable = f"TEAM_MODEL_KEY_FILE ({key_file}) is not UTF-8 text"
    for key, content, logged in (
        ("sk-team-env", b"sk-team-3\n", both),
        (None, b"sk-\xff3", unreadable),
    ):
        if key is None:
            monkeypatch.delenv("TEAM_MODEL_KEY")
        else:
            monkeypatch.setenv("TEAM_MODEL_KEY", key)
        key_file.write_bytes(content)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            failed = await run(gql, admin, action_id, "once more")
        assert failed["status"] == "FAILED"
        assert failed["error"] == said
        assert events(failed, "turn.failed") == [{"error": said}]
        assert str(key_file) not in str(failed)
        assert f"model.apiKeyEnv names TEAM_MODEL_KEY: {logged}" in caplog.text
        assert said in caplog.text
        assert "sk-team" not in caplog.text
    assert len(chat(model_server)) == 2  # neither failed turn sent anything


def _closed_port_url() -> str:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{free.getsockname()[1]}/v1"


async def test_a_model_nobody_answers_fails_the_turn_naming_the_setting_to_change(
    gql: GQL, admin: Caller, state: AppState, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The deployment's default endpoint: the message names ENGRAM_MODEL_BASE_URL.
    dead = _closed_port_url()
    monkeypatch.setattr(state.settings, "model_base_url", dead)
    executed = await run(gql, admin, await make_agent_id(gql.state, admin, harness=None), "hi")
    assert executed["status"] == "FAILED"
    assert "ENGRAM_MODEL_BASE_URL" in executed["error"], executed["error"]
    assert dead in executed["error"]
    # An action's own endpoint: the message names the action's model.baseUrl.
    other = _closed_port_url()
    monkeypatch.setattr(state.settings, "model_allowed_base_urls", [other])
    action_id = await make_agent_id(gql.state, admin, harness=None, model={"baseUrl": other})
    executed = await run(gql, admin, action_id, "hi")
    assert executed["status"] == "FAILED"
    assert "model.baseUrl" in executed["error"] and "ENGRAM_MODEL_BASE_URL" not in executed["error"]


@pytest.mark.settings(model_timeout_seconds=0.5)
async def test_a_model_that_trickles_its_reply_fails_the_turn_at_the_timeout(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """ENGRAM_MODEL_TIMEOUT_SECONDS bounds a model call's whole reply, not each read of it: a
    server that trickles its reply, each piece well within the timeout, fails the turn as a
    call that timed out does, naming the setting. The call is not retried, the turn keeps
    only its transcript, and the execution can be retried."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Saved, slowly.", trickle=0.2)  # ten pieces 0.2 s apart: 2 s in all

    failed = await run(gql, admin, action_id, "note that Ada prefers email")

    assert failed["status"] == "FAILED"
    assert "did not answer within 0.5 seconds (ENGRAM_MODEL_TIMEOUT_SECONDS)" in failed["error"]
    assert events(failed, "turn.failed") == [{"error": failed["error"]}]
    assert len(chat(model_server)) == 2  # the trickled call was not retried
    assert await memories(gql, admin, action_id) == []
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Saved.")
    retried = await run(gql, admin, action_id, None, execution_id=failed["executionId"])
    assert retried["status"] == "SUCCEEDED", retried["error"]
    assert retried["output"] == "Saved."


async def test_transient_model_errors_are_retried(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    model_server.chat_error(503)
    model_server.chat_error(429)
    model_server.say("hello back")
    executed = await run(gql, admin, action_id, "hi")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert executed["output"] == "hello back"
    assert events(executed, "model.call")[0]["attempts"] == 3


async def test_unknown_tools_and_malformed_arguments_are_told_and_the_turn_goes_on(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("launch_rockets", {"count": 3}), ("add_memory", '{"summary": "Ada'))
    model_server.say("Sorry about that.")
    executed = await run(gql, admin, action_id, "hi")

    assert executed["status"] == "SUCCEEDED", executed["error"]
    unknown, malformed = tool_results(chat(model_server)[1])
    assert "no tool named 'launch_rockets'" in unknown and "search_memory, add_memory" in unknown
    assert "not valid JSON" in malformed
    runs = tool_runs(executed)
    assert [r["name"] for r in runs] == ["launch_rockets", "add_memory"]
    assert all("error" in r and "output" not in r for r in runs)
    assert runs[1]["input"] == {"arguments": '{"summary": "Ada'}


async def test_a_reply_of_another_shape_fails_the_turn_saying_what_is_wrong(
    gql: GQL, admin: Caller, model_server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A model server's mistake is the turn's clear failure, not an internal error with a
    traceback in the log."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.answer_with(
        {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": 5}}]}
    )
    with caplog.at_level(logging.WARNING):
        executed = await run(gql, admin, action_id, "hi")

    assert executed["status"] == "FAILED"
    assert (
        "answered in an unexpected shape (message.tool_calls is a number, not a list"
        in (executed["error"])
    )
    assert "internal error" not in executed["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


DEEP = b"[" * 50_000 + b"]" * 50_000  # JSON past the parser's recursion limit


@pytest.mark.parametrize(
    ("status", "body", "headers", "said"),
    [
        # A proxy's gzip header over a plain body: httpx's DecodingError is no TransportError.
        (
            200,
            json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode(),
            {"content-encoding": "gzip"},
            "answered with a body that does not decode as its Content-Encoding (gzip) says",
        ),
        # An error body nested too deep for the JSON parser: quoted, not parsed.
        (500, DEEP, {}, "failed 3 times, last: HTTP 500: [[[["),
        (400, DEEP, {}, "refused the request for scripted (HTTP 400): [[[["),
    ],
    ids=["gzip over plain", "5xx nested deep", "4xx nested deep"],
)
async def test_an_answer_that_does_not_read_fails_the_turn_saying_so_not_internally(
    gql: GQL,
    admin: Caller,
    model_server: OpenAIServer,
    caplog: pytest.LogCaptureFixture,
    status: int,
    body: bytes,
    headers: dict[str, str],
    said: str,
) -> None:
    """A body the client cannot read (found by bench/fuzz_model.py: a DecodingError, or a
    RecursionError reading an error's message) fails the turn saying what the model did, as
    any other unusable answer does: not on an internal error with a traceback in the log."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    for _ in range(3):  # every attempt, where the answer is retried
        model_server.answer_with(body, status=status, headers=headers, purpose="turn")
    with caplog.at_level(logging.WARNING):
        executed = await run(gql, admin, action_id, "hi")

    assert executed["status"] == "FAILED"
    assert said in executed["error"], executed["error"]
    assert "internal error" not in executed["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    # The undecodable answer came whole: not asked for again.
    expected = 3 if status >= 500 else 1
    assert len(chat(model_server)) == expected


async def test_a_model_address_that_is_not_found_says_what_to_check(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """A 404 from the model's server (a base URL without /v1, one ending in /chat/completions
    already, a model the endpoint does not serve) said only "refused ... (HTTP 404): Not Found";
    it now says what the base URL is and to check the model's name."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.answer_with({"error": {"message": "Not Found"}}, status=404, purpose="turn")
    executed = await run(gql, admin, action_id, "hi")
    assert executed["status"] == "FAILED"
    assert executed["error"] == (
        f"the model at {model_server.url}/chat/completions refused the request for scripted "
        "(HTTP 404): Not Found; check ENGRAM_MODEL_BASE_URL: the API's base URL, to which "
        "/chat/completions is added (such as https://api.openai.com/v1 or "
        "http://127.0.0.1:11434/v1), and that the endpoint serves the model 'scripted'"
    )
    assert len(chat(model_server)) == 1  # not retried


# Characters a model server's error may hold that would disguise, reorder or restyle the words
# around them where an execution's error is shown (a console, a terminal, a log line), and each
# as the error shows it: written as its escape. (NEL, U+0085, is a line break: a space.)
DISGUISING = "\u202e \u202a \u2066 \u2069 \u200e \u200f \x1b[31m \x00 \x07 \x85 \ud800"
SHOWN = "\\u202e \\u202a \\u2066 \\u2069 \\u200e \\u200f \\u001b[31m \\u0000 \\u0007 \\ud800"


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (
            400,
            {"error": {"message": f"no such model {DISGUISING} (try gpt)"}},
            f"refused the request for scripted (HTTP 400): no such model {SHOWN} (try gpt)",
        ),
        (
            503,
            {"error": {"message": f"overloaded {DISGUISING} (later)"}},
            f"failed 3 times, last: HTTP 503: overloaded {SHOWN} (later)",
        ),
        (  # a body that is no JSON: its text (UTF-8, so without the surrogate)
            502,
            f"bad gateway {DISGUISING[:-2]} (proxy)".encode(),
            f"failed 3 times, last: HTTP 502: bad gateway {SHOWN[:-7]} (proxy)",
        ),
    ],
    ids=["4xx message", "5xx message", "5xx text body"],
)
async def test_a_model_servers_error_is_kept_without_the_characters_that_disguise_it(
    gql: GQL,
    admin: Caller,
    model_server: OpenAIServer,
    status: int,
    body: object,
    said: str,
) -> None:
    """The words a model server refuses a turn with are kept in the execution's error, which a
    console shows: each control (an escape sequence's ESC, a NUL, a C1 control), bidi
    override, isolate or mark, and lone surrogate written as its escape (\\u202e), where
    they were kept as sent (a NUL and a surrogate as U+FFFD) and could turn or restyle what a
    reader sees. What the model said is still there, in the order it said it."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    for _ in range(3):  # every attempt, where the answer is retried
        model_server.answer_with(body, status=status, purpose="turn")
    executed = await run(gql, admin, action_id, "hi")
    assert executed["status"] == "FAILED"
    read = await gql(
        admin,
        "query($e: UUID!) { execution(executionId: $e) { status error } }",
        e=executed["executionId"],
    )
    stored = read.ok()["execution"]
    assert stored == {"status": "FAILED", "error": executed["error"]}
    (failed,) = events(executed, "turn.failed")
    for error in (stored["error"], failed["error"]):
        assert said in error, error
        assert not [c for c in DISGUISING if c not in " [31m" and c in error], error
        assert "\ufffd" not in error, error


@pytest.mark.settings(turn_timeout_seconds=10)
async def test_a_retry_after_that_is_no_wait_is_ignored_and_the_retry_waits_its_backoff(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """`Retry-After: NaN` was waited as asyncio.sleep(nan), which never ends: the turn stalled
    until its deadline (found by bench/fuzz_model.py). A wait that is none, NaN or negative, is
    ignored."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    model_server.fail_next(1, status=503, path="/v1/chat/completions", retry_after=float("nan"))
    model_server.fail_next(1, status=429, path="/v1/chat/completions", retry_after=-5)
    model_server.say("hello back")
    started = asyncio.get_running_loop().time()
    executed = await run(gql, admin, action_id, "hi")

    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert events(executed, "model.call")[0]["attempts"] == 3
    assert asyncio.get_running_loop().time() - started < 5


@pytest.mark.settings(max_tool_calls_per_reply=2)
async def test_tool_calls_beyond_the_bound_of_a_reply_are_refused_and_the_turn_goes_on(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.call_tools(*[("search_memory", {"query": f"topic {k}"}) for k in range(4)])
    model_server.say("Two of four.")
    executed = await run(gql, admin, action_id, "look up four topics")

    assert executed["status"] == "SUCCEEDED", executed["error"]
    results = tool_results(chat(model_server)[1])
    assert len(results) == 4 and not any("not run" in r for r in results[:2])
    assert all(
        json.loads(r)["error"].startswith("not run: at most 2 tool calls run per reply")
        and "call the rest in your next reply" in r
        for r in results[2:]
    )
    searches = [r for r in tool_runs(executed, "search_memory") if not r["input"].get("recall")]
    assert [("output" in r, "error" in r) for r in searches] == [(True, False)] * 2 + [
        (False, True)
    ] * 2
    assert searches[3]["input"] == {"arguments": '{"query": "topic 3"}'}


async def test_tool_calls_without_ids_keep_each_result_with_its_call_in_a_later_turn(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """A server that sends no call IDs has each reply's calls named call_0, call_1, ...: the
    turn renames a repeated one, so each result stays paired with its own call, within the turn
    and when a later turn rebuilds it from the transcript."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    for name in ("alpha_tool", "beta_tool"):
        call = {"type": "function", "function": {"name": name, "arguments": "{}"}}
        model_server.answer_with(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": None, "tool_calls": [call]}}
                ]
            },
            purpose="turn",
        )
    model_server.say("Neither exists.")
    first = await run(gql, admin, action_id, "try two tools")
    assert first["status"] == "SUCCEEDED", first["error"]
    model_server.say("Yes.")
    second = await run(gql, admin, action_id, "did they work?")
    assert second["status"] == "SUCCEEDED", second["error"]

    for request in (chat(model_server)[2], chat(model_server)[3]):  # the turn's last; the next's
        messages = request.body["messages"]
        called = [m["tool_calls"][0] for m in messages if m.get("tool_calls")]
        answered = [m for m in messages if m["role"] == "tool"]
        assert [c["function"]["name"] for c in called] == ["alpha_tool", "beta_tool"]
        assert len({c["id"] for c in called}) == 2
        for call, result in zip(called, answered, strict=True):
            assert result["tool_call_id"] == call["id"]
            assert f"no tool named '{call['function']['name']}'" in result["content"]


async def test_model_calls_per_turn_are_bounded(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    for _ in range(MAX_CALLS):
        model_server.call_tools(("search_memory", {"query": "anything"}))
    executed = await run(gql, admin, action_id, "loop forever")

    assert executed["status"] == "FAILED"
    assert f"{MAX_CALLS} model calls" in executed["error"]
    requests = chat(model_server)
    assert len(requests) == MAX_CALLS
    assert [r.body["tool_choice"] for r in requests] == ["auto"] * (MAX_CALLS - 1) + ["none"]


# Sessions, executions, transcripts


async def test_sessions_count_turns_and_earlier_turns_reach_the_model(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    model_server.say("Nice to meet you, Ada.")
    first = await run(gql, admin, action_id, "I am Ada")
    second = await run(gql, admin, action_id, "Who am I?")
    other = await run(gql, admin, action_id, "Who am I?", session="s2")

    assert (first["turn"], second["turn"], other["turn"]) == (1, 2, 1)
    messages = chat(model_server)[1].body["messages"]
    assert [(m["role"], m["content"]) for m in messages[1:]] == [
        ("user", "I am Ada"),
        ("assistant", "Nice to meet you, Ada."),
        ("user", "Who am I?"),
    ]
    assert [m["role"] for m in chat(model_server)[2].body["messages"]] == ["system", "user"]

    page = await gql(
        admin,
        """query($a: UUID!) { action(actionId: $a) {
            sessions(first: 1) { nodes { sessionId turns } pageInfo { hasNextPage endCursor } }
        } }""",
        a=action_id,
    )
    sessions = page.ok()["action"]["sessions"]
    assert sessions["nodes"] == [{"sessionId": "s2", "turns": 1}]
    assert sessions["pageInfo"]["hasNextPage"]
    rest = await gql(
        admin,
        """query($a: UUID!, $after: String) { action(actionId: $a) {
            sessions(first: 5, after: $after) { nodes { sessionId turns
                executions(first: 5) { nodes { executionId turn status } } } }
        } }""",
        a=action_id,
        after=sessions["pageInfo"]["endCursor"],
    )
    (s1,) = rest.ok()["action"]["sessions"]["nodes"]
    assert (s1["sessionId"], s1["turns"]) == ("s1", 2)
    assert [e["executionId"] for e in s1["executions"]["nodes"]] == [
        second["executionId"],
        first["executionId"],
    ]

    everything = await gql(
        admin,
        """query($a: UUID!) { action(actionId: $a) {
            executions(first: 10) { nodes { executionId session { sessionId turns } } }
        } }""",
        a=action_id,
    )
    listed = everything.ok()["action"]["executions"]["nodes"]
    assert [e["executionId"] for e in listed] == [
        other["executionId"],
        second["executionId"],
        first["executionId"],
    ]
    assert listed[0]["session"] == {"sessionId": "s2", "turns": 1}

    # Pages continue after the cursor, for the agent's executions and for a session's (each
    # list its own cursors: tests/test_listing_cursors.py).
    paged = """query($a: UUID!, $after: String) { action(actionId: $a) {
        executions(first: 1, after: $after) { nodes { executionId }
            pageInfo { hasNextPage endCursor } } } }"""
    cursors: dict[str, str] = {}  # execution ID -> the cursor after it
    after = None
    for _ in range(len(listed)):
        page = (await gql(admin, paged, a=action_id, after=after)).ok()["action"]["executions"]
        (node,) = page["nodes"]
        after = cursors[node["executionId"]] = page["pageInfo"]["endCursor"]
    assert not page["pageInfo"]["hasNextPage"]
    assert list(cursors) == [e["executionId"] for e in listed]
    session_paged = """query($id: ID!, $after: String) { node(id: $id) { ... on ActionSession {
        executions(first: 1, after: $after) { nodes { executionId } pageInfo { endCursor } }
    } } }"""
    s1_id = global_id("ActionSession", action_id, "s1")
    newest = (await gql(admin, session_paged, id=s1_id)).ok()["node"]["executions"]
    assert [e["executionId"] for e in newest["nodes"]] == [second["executionId"]]
    after_second = newest["pageInfo"]["endCursor"]
    s1_rest = (await gql(admin, session_paged, id=s1_id, after=after_second)).ok()["node"]
    assert [e["executionId"] for e in s1_rest["executions"]["nodes"]] == [first["executionId"]]


async def test_transcripts_page_in_order_behind_their_grant(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    executed = await run(gql, admin, action_id, "hi")
    query = """query($id: UUID!, $after: String) { execution(executionId: $id) {
        transcript(first: 2, after: $after) {
            nodes { sequence type } pageInfo { hasNextPage endCursor }
        }
    } }"""
    first = (await gql(admin, query, id=executed["executionId"])).ok()["execution"]["transcript"]
    assert [e["type"] for e in first["nodes"]] == ["turn.input", "model.call"]
    second = (
        await gql(admin, query, id=executed["executionId"], after=first["pageInfo"]["endCursor"])
    ).ok()
    assert [e["type"] for e in second["execution"]["transcript"]["nodes"]] == ["turn.output"]

    reader = caller(
        admin.account_id,
        allow(["SELECT"], "financial.ActionExecution.document"),
        principal="reader",
    )
    denied = await gql(reader, query, id=executed["executionId"])
    assert denied.codes == ["ACCESS_DENIED"]


async def test_execute_action_needs_insert_on_executions(gql: GQL, admin: Caller) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    reader = caller(admin.account_id, allow(["SELECT"], "financial.*"), principal="reader")
    result = await gql(
        reader, EXECUTE, input={"actionId": action_id, "sessionId": "s1", "input": "hi"}
    )
    assert result.codes == ["ACCESS_DENIED"]
    other_tenant = await gql(
        caller(uuid.uuid4(), *RUNNER_POLICIES),
        EXECUTE,
        input={"actionId": action_id, "input": "hi"},
    )
    assert other_tenant.codes == ["NOT_FOUND"]


async def test_input_may_be_any_json_value(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    executed = await run(gql, admin, action_id, {"question": "balance?", "account": 7})
    assert executed["input"] == {"question": "balance?", "account": 7}
    asked = chat(model_server)[0].body["messages"][-1]
    assert asked["role"] == "user"
    assert json.loads(asked["content"]) == {"question": "balance?", "account": 7}
    assert tool_names(chat(model_server)[0]) == []


async def test_crafted_global_ids_and_cursors_are_bad_requests(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    executed = await run(gql, admin, action_id, "hi")
    node = "query($id: ID!) { node(id: $id) { id } }"
    for type_name in ("ActionExecution", "ActionSession"):
        one_part = await gql(admin, node, id=global_id(type_name, action_id))
        assert one_part.codes == ["BAD_REQUEST"], one_part.errors
        three_parts = await gql(admin, node, id=global_id(type_name, action_id, "s1", "x"))
        assert three_parts.codes == ["BAD_REQUEST"], three_parts.errors
    nul = await gql(admin, node, id=global_id("ActionSession", action_id, "s\x00"))
    assert nul.codes == ["BAD_REQUEST"], nul.errors
    whole = await gql(admin, node, id=global_id("ActionSession", action_id, "s1"))
    assert whole.ok()["node"]["id"] == global_id("ActionSession", action_id, "s1")

    transcript = """query($id: UUID!, $after: String) { execution(executionId: $id) {
        transcript(first: 2, after: $after) { nodes { sequence } pageInfo { endCursor } }
    } }"""
    first = await gql(admin, transcript, id=executed["executionId"])
    # A crafted sequence after the binding of one the list issued (app/db/cursors.py).
    binding = unpack(first.ok()["execution"]["transcript"]["pageInfo"]["endCursor"])[0]
    page = await gql(admin, transcript, id=executed["executionId"], after=pack([binding, 0]))
    assert page.ok()["execution"]["transcript"]["nodes"]
    for beyond in (2**31, 2**70, -1):
        after = pack([binding, beyond])
        page = await gql(admin, transcript, id=executed["executionId"], after=after)
        assert page.codes == ["BAD_REQUEST"], page.errors


TRANSCRIPT_TYPES = """
query($id: UUID!) {
  execution(executionId: $id) { status transcript(first: 50) { nodes { type } } }
}
"""


class Killed(BaseException):
    """Stands for the process dying (asyncio would re-raise SystemExit out of the loop)."""


async def test_m17_a_killed_attempt_keeps_its_transcript_up_to_its_last_model_call(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 5: a process killed mid-turn leaves no memory, but what the attempt said stays in
    its transcript; while the attempt runs, its stored events are not listed."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    action_uuid = uuid.UUID(action_id)
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    seen_while_running: dict[str, object] = {}

    async def killed(self: NativeTools, call: ToolCall) -> ToolResult:
        await original(self, call)  # the record is staged, then the process "dies"
        async with state.pool.acquire() as conn:
            running = await conn.fetchrow("SELECT execution_id FROM executions")
            seen_while_running["stored"] = await conn.fetchval(
                "SELECT array_agg(type ORDER BY sequence) FROM transcript_events"
            )
        listed = await gql(
            admin,
            TRANSCRIPT_TYPES,
            id=str(running["execution_id"]),
        )
        seen_while_running["listed"] = listed.ok()["execution"]["transcript"]["nodes"]
        raise Killed  # nothing after this point runs in a dead process

    async def dead(context: turns.TurnContext, error: BaseException) -> None:
        raise error  # a dead process records no failure

    original = NativeTools.call
    monkeypatch.setattr(NativeTools, "call", killed)
    monkeypatch.setattr(turns, "_fail", dead)
    with pytest.raises(Killed):
        await turns.execute_turn(
            state, admin, turns.TurnRequest(action_id=action_uuid, session_id="s1", input="note it")
        )

    stored = seen_while_running["stored"]
    assert isinstance(stored, list) and stored[0] == "turn.input" and stored[-1] == "model.call"
    assert seen_while_running["listed"] == []
    async with state.pool.acquire() as conn:
        await conn.execute("UPDATE executions SET modified = now() - interval '1 day'")
        [crashed] = await liveness_store.fail_stale_turns(conn, admin.account_id, action_uuid, 3600)
    listed = await gql(
        admin,
        TRANSCRIPT_TYPES,
        id=str(crashed),
    )
    execution = listed.ok()["execution"]
    assert execution["status"] == "FAILED"
    assert [e["type"] for e in execution["transcript"]["nodes"]] == stored
    monkeypatch.undo()
    await run(gql, admin, action_id, "hello")  # the next turn drops the dead attempt's staged rows
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 0
