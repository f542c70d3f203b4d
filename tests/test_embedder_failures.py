"""An embedding provider that fails: a search over GraphQL is UNAVAILABLE (HTTP 503; the log
names the provider's address and HTTP status, never its words, which may quote the texts sent),
and a turn's search_memory reads the failure as a tool error and goes on. The provider is the
scripted OpenAI-compatible server on loopback, on a database of its own (its vectors have the
server's dimensions)."""

import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import GQL, database_copy, db_settings, running_state
from openai_server import OpenAIServer, word_count
from runtime_support import candidates, events, run, tool_runs
from servers import serving

from app.auth.caller import Caller
from app.auth.policies import ADMIN_POLICIES
from app.auth.service import ensure_default_account
from app.db import migrate
from app.embeddings.openai import OpenAIEmbedder
from app.state import AppState

pytestmark = pytest.mark.usefixtures("model_server")

SEARCH = """query($a: UUID!) { action(actionId: $a) {
  searchMemories(query: "Ada's plan", first: 5) { nodes { summary } } } }"""
EMBED = "/v1/embeddings"
CREATE = """mutation($i: ActionInput!) { createAction(input: $i) { actionId } }"""
REMEMBER = """mutation($input: RememberConversationInput!) { rememberConversation(input: $input) {
    executionId status error } }"""


async def new_agent(
    remote: AppState, harness: dict[str, Any], name: str = "s"
) -> tuple[GQL, Caller, str]:
    """A new agent of the default account: the API, an admin, the agent's ID."""
    async with remote.pool.acquire() as conn:
        account_id = await ensure_default_account(conn)
    admin = Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)
    gql = GQL(remote)
    created = await gql(admin, CREATE, i={"name": name, "harness": harness})
    return gql, admin, created.ok()["createAction"]["actionId"]


@pytest.fixture
async def remote(pg_server, model_server: OpenAIServer) -> AsyncIterator[AppState]:
    """A deployment whose embedder is the scripted server's /v1/embeddings, without retries."""
    name = f"engram_remote_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url)
        settings = db_settings(url, model_base_url=model_server.url, model_max_retries=0)
        embedder = OpenAIEmbedder(
            url=model_server.url,
            model=model_server.embedding_model,
            dimensions=model_server.embedding_dimensions,
            max_retries=0,
        )
        try:
            async with running_state(settings, url, embedder, model=True) as state:
                yield state
        finally:
            await embedder.aclose()


async def test_a_failing_embedder_is_unavailable_over_graphql_and_a_tool_error_in_a_turn(
    remote: AppState, model_server: OpenAIServer
) -> None:
    gql, admin, action_id = await new_agent(remote, {"memory": {"enabled": True}}, "support")

    model_server.fail_next(1, status=500, message=f"upstream at {model_server.url} exploded")
    failed = await gql(admin, SEARCH, a=action_id)
    assert failed.codes == ["UNAVAILABLE"], failed.errors
    message = failed.errors[0]["message"]
    assert "embedding model could not embed" in message
    assert model_server.url not in message and "exploded" not in message

    # In a turn: the recall embeds the input (served), then the tool's search fails; the
    # model reads why, and the turn goes on to its answer.
    model_server.call_tools(("search_memory", {"query": "Ada's plan"}))
    model_server.say("I could not look it up, sorry.")
    model_server.stall_next(1, 0.0, path="/v1/embeddings")  # answered as usual
    model_server.fail_next(1, status=503, message="the model is gone", path="/v1/embeddings")
    executed = await run(gql, admin, action_id, "What is Ada's plan?")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    (searched,) = tool_runs(executed, "search_memory")
    assert searched["error"].startswith("search_memory could not run: the embedding model failed")
    assert "try again later" in searched["error"] and "gone" not in searched["error"]
    # A refusal no retry mends (an unknown model) is not "try again later".
    model_server.call_tools(("search_memory", {"query": "Ada's plan"}))
    model_server.say("I could not look it up, sorry.")
    model_server.stall_next(1, 0.0, path="/v1/embeddings")
    model_server.fail_next(1, status=404, message="no such model", path="/v1/embeddings")
    executed = await run(gql, admin, action_id, "What is Ada's plan, then?")
    (searched,) = tool_runs(executed, "search_memory")
    assert "refused the text" in searched["error"] and "retrying will not help" in searched["error"]
    assert "try again" not in searched["error"] and "no such model" not in searched["error"]

    # A memory review whose embedding fails keeps the turn, and its event says why without the
    # provider's words (they name its endpoint; the log has them).
    model_server.say("Noted.")
    candidates(model_server, {"summary": "Ada's plan is Basic"})
    model_server.stall_next(1, 0.0, path="/v1/embeddings")  # the recall's
    model_server.fail_next(1, status=400, message=f"{model_server.url} says no", path=EMBED)
    reviewed = await run(gql, admin, action_id, "My plan is Basic")
    assert reviewed["status"] == "SUCCEEDED", reviewed["error"]
    (review,) = events(reviewed, "memory.review")
    assert review["error"] == "the embedding model failed (logged by the service)"
    assert "says no" not in json.dumps(reviewed) and model_server.url not in json.dumps(reviewed)

    # A recall that cannot embed fails the turn, saying so (not an internal error), and says
    # to retry only when a retry can succeed.
    model_server.fail_next(1, status=502, message="the model is gone", path="/v1/embeddings")
    failed_turn = await run(gql, admin, action_id, "And now?")
    assert failed_turn["status"] == "FAILED"
    assert failed_turn["error"].startswith("the embedding model failed")
    assert failed_turn["error"].endswith("retry the execution")
    model_server.fail_next(1, status=401, message="bad key", path="/v1/embeddings")
    failed_turn = await run(gql, admin, action_id, "And now?")
    assert failed_turn["status"] == "FAILED"
    assert failed_turn["error"].startswith("the embedding model refused the text")
    assert "retry the execution" not in failed_turn["error"]


SEARCH_FOR = """query($a: UUID!, $q: String!) { action(actionId: $a) {
  searchMemories(query: $q, first: 5) { nodes { summary } } } }"""
ADD = """mutation($a: UUID!, $i: AgentMemoryInput!) { addAgentMemory(actionId: $a, input: $i) {
  memoryId } }"""


@pytest.mark.parametrize("status", [503, 400], ids=["failed", "refused"])
async def test_the_log_names_the_provider_and_its_status_never_the_texts_it_quotes(
    remote: AppState, model_server: OpenAIServer, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    """A provider whose error quotes the texts it was sent (a search's query, a record's text, a
    turn's input): each failure is logged as one warning naming the provider's address and the
    HTTP status, and no line holds those texts, nor the provider's own words. Its failures
    logged them: a GraphQL search's and write's, a turn's tool call's, its memory review's, its
    recall's."""
    gql, admin, action_id = await new_agent(remote, {"memory": {"enabled": True}})
    endpoint = f"{model_server.url}/embeddings"

    def fail() -> None:
        model_server.fail_next(1, status=status, message="cannot embed", path=EMBED, quoting=True)

    def warned(logger: str) -> list[str]:
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == logger]
        return [r.getMessage() for r in lines]

    with caplog.at_level(logging.INFO):
        fail()
        searched = await gql(admin, SEARCH_FOR, a=action_id, q="where is the zebra quartz")
        fail()
        added = await gql(
            admin,
            ADD,
            a=action_id,
            i={"summary": "the zebra quartz is in Oslo", "kind": "fact", "sessionId": "s1"},
        )
        assert searched.codes == added.codes == ["UNAVAILABLE"], added.errors
        assert len(warned("app.graphql.errors")) == 2, warned("app.graphql.errors")

        model_server.call_tools(("search_memory", {"query": "the zebra quartz"}))
        model_server.say("I could not look it up.")
        model_server.stall_next(1, 0.0, path=EMBED)  # the recall's, answered
        fail()
        called = await run(gql, admin, action_id, "Where is it?")
        assert called["status"] == "SUCCEEDED", called["error"]
        (tool_line,) = warned("app.runtime.tools")

        model_server.say("Noted.")
        candidates(model_server, {"summary": "the zebra quartz is in Oslo"})
        model_server.stall_next(1, 0.0, path=EMBED)
        fail()  # the review's search for the candidate's neighbours
        reviewed = await run(gql, admin, action_id, "It is in Oslo")
        assert reviewed["status"] == "SUCCEEDED", reviewed["error"]
        (review_line,) = warned("app.runtime.review")

        fail()  # the recall of the turn's input
        recalled = await run(gql, admin, action_id, "And the zebra quartz?")
        assert recalled["status"] == "FAILED"
        (turn_line,) = warned("app.runtime.turns")

    for line in [*warned("app.graphql.errors"), tool_line, review_line, turn_line]:
        assert endpoint in line and f"HTTP {status}" in line, line
    assert "zebra" not in caplog.text and "cannot embed" not in caplog.text, caplog.text


async def test_over_http_a_refusal_no_retry_mends_has_no_retry_after(
    pg_server, model_server: OpenAIServer
) -> None:
    """503 UNAVAILABLE either way; Retry-After and "retry" only when the provider's failure is
    one a later attempt may not meet (unreachable, overloaded, failing on its side)."""
    name = f"engram_remote_http_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    token = "eng_embedder-failures-over-http"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url)
        embedder = OpenAIEmbedder(
            url=model_server.url,
            model=model_server.embedding_model,
            dimensions=model_server.embedding_dimensions,
            max_retries=0,
        )
        settings = db_settings(url, bootstrap_token=token)
        with serving(settings, embedder) as base:
            headers = {"authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
                harness = {"memory": {"enabled": True}}
                created = await http.post(
                    "/graphql",
                    json={"query": CREATE, "variables": {"i": {"name": "s", "harness": harness}}},
                )
                action_id = created.json()["data"]["createAction"]["actionId"]
                search = {"query": SEARCH, "variables": {"a": action_id}}

                model_server.fail_next(1, status=500, path="/v1/embeddings")
                transient = await http.post("/graphql", json=search)
                model_server.fail_next(1, status=404, message="no such model")
                refused = await http.post("/graphql", json=search)

    assert transient.status_code == refused.status_code == 503
    assert int(transient.headers["retry-after"]) > 0
    assert "retry-after" not in refused.headers
    (failed,), (refusal,) = transient.json()["errors"], refused.json()["errors"]
    assert failed["extensions"]["code"] == refusal["extensions"]["code"] == "UNAVAILABLE"
    assert "retry in" in failed["message"]
    assert "refused the text" in refusal["message"] and "will not help" in refusal["message"]
    assert "no such model" not in refusal["message"]


async def _review_whose_embedding_fails(
    remote: AppState, model_server: OpenAIServer, answered: int
) -> tuple[GQL, Caller, str, dict[str, Any]]:
    """A turn of a new agent with memory whose review takes two candidates, its embeddings
    answered `answered` times (the recall's first) before one fails: the turn committed."""
    gql, admin, action_id = await new_agent(remote, {"memory": {"enabled": True}})
    model_server.say("Noted.")
    candidates(model_server, {"summary": "Ada's plan is Basic"}, {"summary": "Ada lives in Oslo"})
    model_server.stall_next(answered, 0.0, path=EMBED)
    model_server.fail_next(1, status=503, message="gone", path=EMBED)
    executed = await run(gql, admin, action_id, "My plan is Basic and I live in Oslo")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    return gql, admin, action_id, executed


@pytest.mark.parametrize("answered", [2, 4])
async def test_m24_every_embedding_a_failed_review_made_is_recorded_as_usage(
    remote: AppState, model_server: OpenAIServer, answered: int
) -> None:
    """After the recall's embedding, the review embeds its first candidate's neighbour search,
    its second's, its first record, its second: the `answered`th embedding fails (the second
    search's, or the second record's), and those made are still usage of purpose `embed` in
    the transcript, as many tokens as the provider answered for."""
    gql, admin, action_id, executed = await _review_whose_embedding_fails(
        remote, model_server, answered
    )
    (review,) = events(executed, "memory.review")
    assert "embedding model failed" in review["error"]

    recall, *reviewed = model_server.requests_to(EMBED)[:answered]
    usage = events(executed, "embedding")
    assert {u["purpose"] for u in usage} == {"embed"}
    assert [u["tokens"] for u in usage if u["for"] == "recall"] == [
        sum(map(word_count, recall.body["input"]))
    ]
    assert sum(u["tokens"] for u in usage if u["for"] == "memory.review") == sum(
        word_count(t) for r in reviewed for t in r.body["input"]
    )


async def test_a_review_that_fails_partway_keeps_none_of_its_records(
    remote: AppState, model_server: OpenAIServer
) -> None:
    """The review stages its first record, then the embedding of its second fails: the turn
    commits its answer, the review's event says why, and none of the review's records is kept
    (its messages wait for the next review whole, which would otherwise restate the first)."""
    # The recall's, the review's two neighbour searches and its first record's answered.
    gql, admin, action_id, executed = await _review_whose_embedding_fails(remote, model_server, 4)
    (review,) = events(executed, "memory.review")
    assert review["error"] == "the embedding model failed (logged by the service)"
    staged = [d for d in review["decisions"] if d.get("memoryId")]
    assert staged, "the review had staged a record before it failed"
    listed = await gql(
        admin, "query($a: UUID!) { action(actionId: $a) { memories(first: 10) { nodes { "
        "summary } } } }", a=action_id,
    )  # fmt: skip
    assert listed.ok()["action"]["memories"]["nodes"] == []
    async with remote.pool.acquire() as conn:
        marks = await conn.fetch(
            "SELECT reviewed_by, review_messages FROM executions WHERE action_id = $1",
            uuid.UUID(action_id),
        )
        staged_left = await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE action_id = $1", uuid.UUID(action_id)
        )
    assert [(m["reviewed_by"], m["review_messages"]) for m in marks] == [(None, 2)]
    assert staged_left == 0


async def keeper(remote: AppState, harness: dict[str, Any]) -> tuple[GQL, Caller, str]:
    """An agent keeping its history, on a service whose turns have 1.5 s: the API, an admin,
    the agent's ID."""
    remote.settings.turn_timeout_seconds = 1.5
    return await new_agent(remote, harness, "keeper")


async def test_a_turn_whose_history_embedding_runs_past_the_deadline_fails_at_it(
    remote: AppState, model_server: OpenAIServer
) -> None:
    """ENGRAM_TURN_TIMEOUT_SECONDS bounds a turn from its start to its commit: the embedding of
    the history it keeps (before the commit's transaction) is cut at the deadline too, and the
    turn fails naming the setting, keeping nothing but its transcript. It ran past it, as long as
    the provider took (a stop's grace period, docker-compose.yml, counts on the deadline)."""
    gql, admin, action_id = await keeper(remote, {"history": {"index": "messages"}})
    model_server.say("Hello.")
    model_server.stall_next(1, 6.0, path=EMBED)  # the history's embedding, within its timeout

    started = time.monotonic()
    failed = await run(gql, admin, action_id, "hi")
    took = time.monotonic() - started

    assert failed["status"] == "FAILED", (failed["status"], round(took, 2))
    setting = "ENGRAM_TURN_TIMEOUT_SECONDS (1.5 seconds)"
    assert setting in failed["error"] and "history" in failed["error"], failed["error"]
    assert took < 4.0, took
    assert events(failed, "turn.failed") == [{"error": failed["error"]}]
    assert [e["type"] for e in failed["transcript"]["nodes"]] == [
        "turn.input",
        "model.call",
        "turn.failed",
    ]


async def test_a_review_cut_at_the_deadline_still_costs_the_turn_neither_answer_nor_history(
    remote: AppState, model_server: OpenAIServer
) -> None:
    """The history is embedded once the turn answered, before its memory review: a review
    that the deadline cuts leaves the turn its answer and the history it keeps, which an
    embedding after the review, past the deadline, would have cost it."""
    gql, admin, action_id = await keeper(
        remote, {"memory": {"enabled": True}, "history": {"index": "messages"}}
    )
    model_server.say("Got it, Lisbon.")
    candidates(model_server, {"summary": "Ada lives in Lisbon"}, delay=10.0)

    answered = await run(gql, admin, action_id, "I live in Lisbon")

    assert answered["status"] == "SUCCEEDED", answered["error"]
    assert answered["output"] == "Got it, Lisbon."
    (review,) = events(answered, "memory.review")
    assert "stopped at the turn's deadline" in review["error"], review
    async with remote.pool.acquire() as conn:
        kept = await conn.fetchval(
            "SELECT count(*) FROM history_events WHERE execution_id = $1",
            uuid.UUID(answered["executionId"]),
        )
    assert kept == 2  # the input and the answer


async def test_an_ingest_whose_history_embedding_runs_past_the_deadline_fails_at_it(
    remote: AppState, model_server: OpenAIServer
) -> None:
    """As a turn's: an ingest's deadline bounds the embedding of the history it keeps, and the
    ingest fails at it naming the setting, keeping nothing."""
    gql, admin, action_id = await keeper(
        remote, {"memory": {"enabled": True}, "history": {"index": "messages"}}
    )
    model_server.stall_next(1, 6.0, path=EMBED)  # the history's embedding (the review keeps none)
    request = {
        "actionId": action_id,
        "sessionId": "s1",
        "messages": [{"role": "user", "content": "I'm Ada and I live in Berlin."}],
    }

    started = time.monotonic()
    failed = (await gql(admin, REMEMBER, input=request)).ok()["rememberConversation"]
    took = time.monotonic() - started

    assert failed["status"] == "FAILED", (failed["status"], round(took, 2))
    setting = "ENGRAM_TURN_TIMEOUT_SECONDS (1.5 seconds)"
    assert setting in failed["error"] and "history" in failed["error"], failed["error"]
    assert took < 4.0, took
    async with remote.pool.acquire() as conn:
        kept = await conn.fetchval(
            "SELECT count(*) FROM history_events WHERE execution_id = $1",
            uuid.UUID(failed["executionId"]),
        )
    assert kept == 0
