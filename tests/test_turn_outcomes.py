"""How a turn's end is told to operators: `engram_turns_total{status,kind}` counts every turn
that starts once, however it ends (answered, failed, cut short by its request's cancellation,
or ended by the liveness sweep before it could record its own failure), executeAction's as
kind TURN and a conversation handed in (rememberConversation, MCP's remember_conversation) as
INGEST; and a turn failed by its model logs one WARNING line naming its execution, within its
request's ID. The scripted model on loopback, the real database."""

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from factories import allow, make_agent_id, memory_harness, token_for
from helpers import GQL, eventually
from mcp_support import call, mcp_session, mcp_url
from openai_server import OpenAIServer
from prometheus_client.parser import text_string_to_metric_families
from runtime_support import (
    EXECUTE,
    RUNNER_POLICIES,
    at_its_model_call,
    candidates,
    chat,
    decide,
    refuse_failure_records,
    run,
)

from app.auth.caller import Caller
from app.executions import liveness_store
from app.observability.logs import RequestIdFilter
from app.observability.metrics import Metrics, using
from app.runtime import turns
from app.runtime.model import ModelClient
from app.state import AppState

pytestmark = [
    pytest.mark.usefixtures("model_server"),
    pytest.mark.settings(model_name="scripted", turn_timeout_seconds=0),
]


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    """The metrics this test's turns count in, as a request's are (its middleware sets them)."""
    counted = Metrics()
    with using(counted):
        yield counted


def turns_counted(metrics: Metrics, kind: str = "TURN") -> dict[str, float]:
    """The turns of one kind counted, by status: TURN (executeAction) or INGEST (a
    conversation handed in)."""
    return {
        sample.labels["status"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "engram_turns"
        for sample in family.samples
        if sample.name == "engram_turns_total" and sample.labels.get("kind") == kind
    }


REMEMBER = """mutation($input: RememberConversationInput!) {
    rememberConversation(input: $input) { executionId status } }"""


async def remember(
    gql: GQL, caller: Caller, action_id: str, said: str, **extra: Any
) -> dict[str, Any]:
    """Hands in a conversation of one message; returns the ingest's execution."""
    messages = [{"role": "user", "content": said}]
    request = {"actionId": action_id, "sessionId": "s1", "messages": messages, **extra}
    return (await gql(caller, REMEMBER, input=request)).ok()["rememberConversation"]


async def status_of(state: AppState, action_id: str) -> list[str]:
    async with state.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT status FROM executions WHERE action_id = $1 ORDER BY created",
            uuid.UUID(action_id),
        )
    return [r["status"] for r in rows]


async def test_a_turn_that_answers_or_fails_is_counted_once_by_its_status(
    gql: GQL, admin: Caller, model_server: OpenAIServer, metrics: Metrics
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=None)
    model_server.say("Hello.")
    assert (await run(gql, admin, action_id, "hi"))["status"] == "SUCCEEDED"
    model_server.chat_error(500)
    assert (await run(gql, admin, action_id, "hi"))["status"] == "FAILED"
    assert turns_counted(metrics) == {"SUCCEEDED": 1, "FAILED": 1}


async def test_a_turn_cancelled_during_its_model_call_is_counted_failed(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, metrics: Metrics
) -> None:
    """Its request cancelled (its client gone, the server stopping): the turn records its
    failure, and is counted so; it was counted nowhere."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    turn = await at_its_model_call(gql, admin, action_id, model_server)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn, 30)
    assert await status_of(state, action_id) == ["FAILED"]
    assert turns_counted(metrics) == {"FAILED": 1}


async def test_a_turn_cancelled_whose_failure_cannot_be_recorded_is_counted_failed(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, metrics: Metrics
) -> None:
    """The database refuses the record of its failure: the liveness sweep fails it later,
    which counts nothing; the turn is counted as it ends, once."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    await refuse_failure_records(state)
    turn = await at_its_model_call(gql, admin, action_id, model_server)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn, 30)
    assert await status_of(state, action_id) == ["RUNNING"]  # until the sweep fails it
    assert turns_counted(metrics) == {"FAILED": 1}


async def test_a_turn_whose_failure_cannot_be_recorded_is_counted_failed(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, metrics: Metrics
) -> None:
    """Not cancelled: the model fails, and the database refuses both records of the failure,
    whose error the request answers (INTERNAL); the turn is counted FAILED all the same."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    await refuse_failure_records(state)
    model_server.chat_error(500)
    request = {"actionId": action_id, "sessionId": "s1", "input": "hi"}
    answered = await gql(admin, EXECUTE, input=request)
    assert answered.codes == ["INTERNAL"], answered.errors
    assert turns_counted(metrics) == {"FAILED": 1}


async def test_an_attempt_swept_and_retried_while_it_ran_is_counted_failed_once(
    gql: GQL,
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
) -> None:
    """Swept as stale before it commits and retried meanwhile, its failure finds it no longer
    running (CONFLICT): it is counted FAILED, and its retry as it ends."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.say("noted")
    retried: dict[str, Any] = {}

    async def sweep_and_retry(context: turns.TurnContext, client: ModelClient) -> None:
        monkeypatch.setattr(turns, "END_OF_TURN_STEPS", [])  # the retry's end: no step
        e = context.execution
        async with state.pool.acquire() as conn:
            await conn.execute(
                "UPDATE executions SET modified = now() - interval '1 day' WHERE execution_id = $1",
                e.execution_id,
            )
            swept = await liveness_store.fail_stale_turns(conn, e.account_id, e.action_id, 3600)
        assert swept == [e.execution_id]
        model_server.say("retried")
        execution_id = str(e.execution_id)
        retried.update(await run(gql, admin, action_id, "note it", execution_id=execution_id))

    monkeypatch.setattr(turns, "END_OF_TURN_STEPS", [sweep_and_retry])
    first = await gql(
        admin, EXECUTE, input={"actionId": action_id, "sessionId": "s1", "input": "note it"}
    )
    assert first.codes == ["CONFLICT"]
    assert retried["status"] == "SUCCEEDED"
    assert turns_counted(metrics) == {"FAILED": 1, "SUCCEEDED": 1}


async def test_a_conversation_handed_in_is_counted_once_as_an_ingest_by_its_status(
    gql: GQL, admin: Caller, model_server: OpenAIServer, metrics: Metrics
) -> None:
    """rememberConversation is a turn (ENGRAM_MAX_TURNS_PER_ACCOUNT holds it): counted as it
    ends, with kind INGEST, apart from executeAction's (kind TURN). It was counted nowhere."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.say("Hello.")
    assert (await run(gql, admin, action_id, "hi"))["status"] == "SUCCEEDED"
    candidates(model_server, {"summary": "Ada lives in Berlin"})
    assert (await remember(gql, admin, action_id, "I live in Berlin"))["status"] == "SUCCEEDED"
    model_server.chat_error(500, purpose="memory")
    assert (await remember(gql, admin, action_id, "I am vegetarian"))["status"] == "FAILED"
    assert turns_counted(metrics, "INGEST") == {"SUCCEEDED": 1, "FAILED": 1}
    assert turns_counted(metrics) == {"SUCCEEDED": 1}


async def test_an_ingest_that_lost_its_key_is_counted_failed_though_it_answers_as_the_first(
    gql: GQL, admin: Caller, model_server: OpenAIServer, metrics: Metrics
) -> None:
    """Two requests with one key, both reviewed before either commits: the second to commit
    fails, and answers with the first's execution (SUCCEEDED); it is counted by its own."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada lives in Paris"})
    await remember(gql, admin, action_id, "I live in Paris")
    for _ in range(2):
        candidates(model_server, {"summary": "Ada lives in Berlin"})
        # Answered once both reviews asked (the first ingest's call, then two each).
        decide(model_server, {"candidate": "c1", "action": "add"}, after_requests=5)
    first, second = await asyncio.gather(
        *(remember(gql, admin, action_id, "I moved to Berlin", idempotencyKey="k") for _ in "12")
    )
    assert first == second and first["status"] == "SUCCEEDED", (first, second)
    assert turns_counted(metrics, "INGEST") == {"SUCCEEDED": 2, "FAILED": 1}


async def test_an_ingest_cancelled_during_its_review_is_counted_failed(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, metrics: Metrics
) -> None:
    """Its request cancelled while its review waits on the model: the ingest records its
    failure, as a turn does, and is counted so."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada lives in Berlin"}, delay=10)
    ingest = asyncio.ensure_future(remember(gql, admin, action_id, "I live in Berlin"))
    await eventually(lambda: chat(model_server, "memory") != [], "the review to be under way")
    ingest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(ingest, 30)
    assert await status_of(state, action_id) == ["FAILED"]
    assert turns_counted(metrics, "INGEST") == {"FAILED": 1}
    # No executionId retries an ingest (executeAction's retry is a turn's): it is sent again.
    async with state.pool.acquire() as conn:
        error = await conn.fetchval(
            "SELECT error FROM executions WHERE action_id = $1", uuid.UUID(action_id)
        )
    assert error == "the conversation was cancelled before it finished; send it again", error


async def test_remember_conversation_over_mcp_is_counted_as_an_ingest(
    admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str
) -> None:
    """MCP's remember_conversation, as rememberConversation: in the service's /metrics."""
    action_id = await make_agent_id(state, admin, harness=memory_harness())
    token = await token_for(
        state,
        admin,
        "agent-runner",
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.Deployment.metrics"),
    )
    candidates(model_server, {"summary": "Ada's flight leaves on 2026-12-03"})
    said = [{"role": "user", "content": "My flight is the day after tomorrow"}]
    async with mcp_session(mcp_url(base_url, action_id), token) as session:
        assert (await call(session, "remember_conversation", messages=said))["status"] == (
            "SUCCEEDED"
        )
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        text = (await http.get("/metrics", headers={"Authorization": f"Bearer {token}"})).text
    counted = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "engram_turns_total"
    ]
    assert counted == [({"status": "SUCCEEDED", "kind": "INGEST"}, 1.0)], counted


@pytest.mark.parametrize("status", [500, 400], ids=["failed", "refused"])
async def test_a_turn_failed_by_its_model_logs_one_warning_within_its_request(
    state: AppState, admin: Caller, base_url: str, model_server: OpenAIServer, caplog, status
) -> None:
    """The model server errs (a 5xx, retried; a 4xx, not): one WARNING naming the execution
    and what failed (the model's address, the HTTP status), with the request's ID; not the
    prompt, nor the server's own words, which may quote it (the execution's error keeps
    them). It logged nothing."""
    action_id = await make_agent_id(state, admin, harness=None)
    token = await token_for(state, admin, "runner", *RUNNER_POLICIES)
    model_server.chat_error(status, message="bad request: messages[0].content='the secret plan'")
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.INFO):
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            answer = await http.post(
                "/graphql",
                json={
                    "query": EXECUTE,
                    "variables": {
                        "input": {"actionId": action_id, "sessionId": "s1", "input": "the plan"}
                    },
                },
                headers={"Authorization": f"Bearer {token}", "X-Request-ID": "turn-fails-1"},
            )
    executed = answer.json()["data"]["executeAction"]
    assert executed["status"] == "FAILED", executed
    assert "the secret plan" in executed["error"]  # the execution's error keeps them
    warned = [
        r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "app.runtime.turns"
    ]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    (line,) = warned
    said = line.getMessage()
    assert line.levelno == logging.WARNING
    assert executed["executionId"] in said
    assert model_server.url in said and f"HTTP {status}" in said, said
    assert "the plan" not in said and "secret" not in said, said
    assert getattr(line, "request_id", None) == "turn-fails-1"
