"""A token revoked while work it started runs keeps none of it: a turn (executeAction) or an
ingest (rememberConversation) that a request sending the token started, waiting on its model
when the token is revoked (revokeClientToken, revokeTokensIssuedBy), its client deleted, or its
grants narrowed so it may no longer run turns, ends FAILED with nothing written in its name:
no memory (its tools' or its review's), no session history, no turn counted. Its commit checks
the token and its grants in the transaction that would write, with both rows locked, so a
revocation either committed first (the turn fails) or waits for the commit (the turn was done
before it). Over HTTP, on the scripted model server."""

import asyncio
import threading
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from factories import allow, make_agent_id, memory_harness, token_for
from helpers import eventually
from openai_server import OpenAIServer
from runtime_support import EXECUTE, candidates, chat, events
from servers import clean_env, post_graphql, posted_graphql, run

from app.auth import service as auth_service
from app.auth.caller import Caller
from app.state import AppState

pytestmark = pytest.mark.usefixtures("model_server")

HARNESS = {
    **memory_harness(scope={"read": ["agent"], "write": ["agent"]}, tools=["add_memory"]),
    "history": {"index": "messages"},
}
EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.*")
RUNNER = (
    allow(["INSERT"], "financial.ActionExecution.document"),
    allow(["SELECT"], "financial.ActionExecution.*"),
)
REVOKE = """mutation($p: String!, $t: UUID!) {
  revokeClientToken(principal: $p, tokenId: $t) { tokenId } }"""
REVOKE_ISSUED = "mutation($t: UUID!) { revokeTokensIssuedBy(tokenId: $t) { tokenId } }"
DELETE_CLIENT = "mutation($p: String!) { deleteClient(principal: $p) { principal } }"
NARROW = """mutation($p: String!, $policies: [PolicyInput!]!) {
  updateClient(principal: $p, input: {policies: $policies}) { principal } }"""
RENAME = """mutation($p: String!) {
  updateClient(principal: $p, input: {name: "Renamed"}) { principal } }"""
REMEMBER = """mutation($input: RememberConversationInput!) {
  rememberConversation(input: $input) { executionId status error } }"""

# Each way a token stops acting for its client, as the operator's request: (operation, its
# variables given the runner's token ID), and the error code the work's failure maps to.
REVOCATIONS: dict[str, tuple[str, Any]] = {
    "revoke": (REVOKE, lambda t: {"p": "runner", "t": t}),
    "revoke-issued": (REVOKE_ISSUED, lambda t: {"t": t}),
    "delete-client": (DELETE_CLIENT, lambda t: {"p": "runner"}),
    "narrow": (NARROW, lambda t: {"p": "runner", "policies": [RUNNER[1]]}),
}
REVOKED = (
    "the API token that started this {what} was revoked, or its client deleted, while the "
    "{what} ran; nothing of this {what} was kept"
)
NARROWED = (
    "the client whose API token started this {what} is no longer allowed to INSERT "
    "financial.ActionExecution.document (its grants changed while the {what} ran); nothing of "
    "this {what} was kept"
)


def said(way: str, what: str) -> str:
    return (NARROWED if way == "narrow" else REVOKED).format(what=what)


async def tokens(state: AppState, admin: Caller) -> tuple[str, str, str]:
    """The operator's token, and the runner's with its ID."""
    operator = await token_for(state, admin, "operator", EVERYTHING)
    runner = await token_for(state, admin, "runner", *RUNNER)
    found = await auth_service.authenticate(state.pool, f"Bearer {runner}")
    return operator, runner, str(found.token_id)


async def stored(state: AppState, sql: str) -> int:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(sql)


async def nothing_kept(state: AppState) -> None:
    """No memory record (committed or staged), no session history and no turn counted, of
    any agent."""
    assert await stored(state, "SELECT count(*) FROM agent_memories") == 0
    assert await stored(state, "SELECT count(*) FROM history_events") == 0
    assert await stored(state, "SELECT coalesce(sum(turns), 0) FROM sessions") == 0


@pytest.mark.parametrize("way", list(REVOCATIONS))
async def test_a_turn_whose_token_is_revoked_during_its_memory_review_keeps_nothing(
    admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str, way: str
) -> None:
    """Its tool's record, its review's record and its history were all staged when the
    revocation committed, during the review's (last) model call; the turn ends FAILED saying
    why, its transcript kept."""
    action_id = await make_agent_id(state, admin, harness=HARNESS)
    operator, runner, token_id = await tokens(state, admin)
    query, variables = REVOCATIONS[way]
    model_server.call_tools(("add_memory", {"summary": "The vault code is walrus", "kind": "fact"}))
    model_server.say("Noted.")
    candidates(
        model_server,
        {"summary": "The user likes walruses"},
        then=lambda: post_graphql(base_url, operator, query, **variables(token_id)),
    )
    turn = {"actionId": action_id, "sessionId": "s1", "input": "The code is walrus."}
    executed = (await posted_graphql(base_url, runner, EXECUTE, input=turn))["executeAction"]
    assert executed["status"] == "FAILED"
    assert executed["error"] == said(way, "turn")
    assert executed["output"] is None
    # It ran to its end: the tool wrote, the review kept a record; the commit refused them.
    assert [c["purpose"] for c in events(executed, "model.call")] == ["turn", "turn", "memory"]
    tools = events(executed, "tool.execution")
    assert tools and not [t for t in tools if "error" in t]  # its record staged
    assert events(executed, "turn.failed") == [{"error": said(way, "turn")}]
    await nothing_kept(state)  # the staged records too


async def test_a_turn_whose_token_this_process_revoked_stops_after_the_model_call_under_way(
    admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str
) -> None:
    """Revoked through the process running the turn, the token is checked again after the
    model call under way: no further model call (the agent's next, its memory review) is sent."""
    action_id = await make_agent_id(state, admin, harness=HARNESS)
    operator, runner, token_id = await tokens(state, admin)
    model_server.call_tools(
        ("add_memory", {"summary": "The vault code is walrus", "kind": "fact"}),
        then=lambda: post_graphql(base_url, operator, REVOKE, p="runner", t=token_id),
    )
    model_server.say("Noted.")  # never asked for
    turn = {"actionId": action_id, "sessionId": "s1", "input": "The code is walrus."}
    executed = (await posted_graphql(base_url, runner, EXECUTE, input=turn))["executeAction"]
    assert executed["status"] == "FAILED"
    assert executed["error"] == said("revoke", "turn")
    assert len(chat(model_server, None)) == 1
    await nothing_kept(state)


async def test_a_turn_whose_token_another_process_revoked_is_refused_at_its_commit(
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    base_url: str,
    db_url: str,
    tmp_path: Path,
) -> None:
    """`engram client revoke-token` revokes in a process of its own, which the turn's never
    hears from: its commit, here the one statement of a turn that writes nothing but its end
    (no memory, no history), checks the token."""
    action_id = await make_agent_id(state, admin, harness={})
    _, runner, token_id = await tokens(state, admin)
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))

    def revoke() -> None:
        ran = run(env, "client", "revoke-token", "runner", token_id)
        assert ran.returncode == 0, ran.stderr

    model_server.say("Hello.", then=revoke)
    turn = {"actionId": action_id, "sessionId": "s1", "input": "hi"}
    executed = (await posted_graphql(base_url, runner, EXECUTE, input=turn))["executeAction"]
    assert executed["status"] == "FAILED"
    assert executed["error"] == said("revoke", "turn")
    await nothing_kept(state)


async def test_a_turn_failed_so_is_retried_by_its_execution_id_with_another_token(
    admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str
) -> None:
    """What the failure says: the turn can be retried with a token that may run it (here a new
    token of the same client); the retry commits its tool's record, its history and its turn,
    and the failed attempt's transcript stays."""
    action_id = await make_agent_id(state, admin, harness=HARNESS)
    operator, runner, token_id = await tokens(state, admin)
    model_server.call_tools(
        ("add_memory", {"summary": "The vault code is walrus", "kind": "fact"}),
        then=lambda: post_graphql(base_url, operator, REVOKE, p="runner", t=token_id),
    )
    turn = {"actionId": action_id, "sessionId": "s1", "input": "The code is walrus."}
    failed = (await posted_graphql(base_url, runner, EXECUTE, input=turn))["executeAction"]
    assert failed["status"] == "FAILED" and failed["error"] == said("revoke", "turn")
    renewed = await auth_service.create_client_token(
        state.pool, admin, account_id=None, principal="runner"
    )
    model_server.call_tools(("add_memory", {"summary": "The vault code is walrus", "kind": "fact"}))
    model_server.say("Noted.")
    candidates(model_server)
    retry = {**turn, "executionId": failed["executionId"]}
    retried = (await posted_graphql(base_url, renewed, EXECUTE, input=retry))["executeAction"]
    assert retried["status"] == "SUCCEEDED", retried["error"]
    assert retried["executionId"] == failed["executionId"]
    assert retried["invocationNumber"] == 2
    assert not [t for t in events(retried, "tool.execution") if "error" in t]
    assert events(retried, "turn.failed") == [{"error": said("revoke", "turn")}]
    assert await stored(state, "SELECT count(*) FROM agent_memories") == 1
    assert await stored(state, "SELECT sum(turns) FROM sessions") == 1
    assert await stored(state, "SELECT count(*) FROM history_events") > 0


@pytest.mark.parametrize("way", ["revoke", "narrow"])
async def test_an_ingest_whose_token_is_revoked_during_its_review_keeps_nothing(
    admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str, way: str
) -> None:
    action_id = await make_agent_id(state, admin, harness=HARNESS)
    operator, runner, token_id = await tokens(state, admin)
    query, variables = REVOCATIONS[way]
    model_server.call_tools(
        ("remember", {"candidates": [{"kind": "fact", "summary": "The code is walrus"}]}),
        purpose="memory",
        then=lambda: post_graphql(base_url, operator, query, **variables(token_id)),
    )
    handed = {
        "actionId": action_id,
        "sessionId": "s1",
        "messages": [
            {"role": "user", "content": "The vault code is walrus."},
            {"role": "assistant", "content": "Noted."},
        ],
    }
    ingested = (await posted_graphql(base_url, runner, REMEMBER, input=handed))[
        "rememberConversation"
    ]
    assert ingested["status"] == "FAILED"
    assert ingested["error"] == said(way, "conversation")
    await nothing_kept(state)


async def test_a_change_that_leaves_the_grants_and_another_tokens_revocation_spare_a_turn(
    admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str
) -> None:
    """Renaming the client, or revoking another of its tokens, takes nothing from this one."""
    action_id = await make_agent_id(state, admin, harness=HARNESS)
    operator, runner, _ = await tokens(state, admin)
    other = await token_for(state, admin, "runner-2", *RUNNER)  # a client's token apart
    sibling = await auth_service.authenticate(state.pool, f"Bearer {other}")

    def meanwhile() -> None:
        post_graphql(base_url, operator, RENAME, p="runner")
        post_graphql(base_url, operator, REVOKE, p="runner-2", t=str(sibling.token_id))

    model_server.say("Noted.", then=meanwhile)
    candidates(model_server, {"summary": "The user likes walruses"})
    turn = {"actionId": action_id, "sessionId": "s1", "input": "I like walruses."}
    executed = (await posted_graphql(base_url, runner, EXECUTE, input=turn))["executeAction"]
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert await stored(state, "SELECT count(*) FROM agent_memories") == 1
    assert await stored(state, "SELECT sum(turns) FROM sessions") == 1


@pytest.mark.parametrize("harness", [HARNESS, {}], ids=["memory", "no-memory"])
@pytest.mark.parametrize("change", ["wider", "saved-again"])
async def test_a_turn_whose_clients_grants_changed_but_still_let_it_run_commits(
    admin: Caller,
    state: AppState,
    model_server: OpenAIServer,
    base_url: str,
    harness: dict[str, Any],
    change: str,
) -> None:
    """Policies other than those the request read, which still allow turns, are checked
    again: the turn commits (a turn writing nothing but its end, in a second try). So does
    one whose client's policies were saved again as they were (an edit form saved unchanged)."""
    action_id = await make_agent_id(state, admin, harness=harness)
    operator, runner, token_id = await tokens(state, admin)
    policies = [*RUNNER, allow(["SELECT"], "financial.Action.*")] if change == "wider" else RUNNER
    model_server.say(
        "Noted.",
        then=lambda: post_graphql(base_url, operator, NARROW, p="runner", policies=policies),
    )
    turn = {"actionId": action_id, "sessionId": "s1", "input": "I like walruses."}
    executed = (await posted_graphql(base_url, runner, EXECUTE, input=turn))["executeAction"]
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert executed["output"] == "Noted."
    assert await stored(state, "SELECT sum(turns) FROM sessions") == 1


async def test_a_revocation_waits_for_a_commit_under_way_and_never_deadlocks(
    admin: Caller, state: AppState, model_server: OpenAIServer, base_url: str, db_url: str
) -> None:
    """A commit that checked the token holds it (and its client) until it ends: the
    revocation waits for it, and the turn it let through was done before the token went. A
    commit waiting for the session a revocation does not hold, and a revocation waiting on
    the commit, end both: no cycle of locks between them."""
    action_id = await make_agent_id(state, admin, harness=HARNESS)
    operator, runner, token_id = await tokens(state, admin)
    answered = threading.Event()
    model_server.say("Noted.", then=answered.wait)  # until the session is held
    candidates(model_server, {"summary": "The user likes walruses"})
    holder = await asyncpg.connect(db_url)
    try:
        turn = asyncio.ensure_future(
            posted_graphql(
                base_url,
                runner,
                EXECUTE,
                input={"actionId": action_id, "sessionId": "s1", "input": "I like walruses."},
            )
        )
        await eventually(lambda: len(chat(model_server)) == 1, "the model call is under way")
        # The session locked by another transaction: the commit waits there, past its check.
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT FROM sessions FOR UPDATE")
        answered.set()
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted"
        await eventually(lambda: stored(state, waiting), "the commit waits for the session")
        revocation = asyncio.ensure_future(
            posted_graphql(base_url, operator, REVOKE, p="runner", t=token_id)
        )
        await eventually(
            lambda: stored(state, waiting + " HAVING count(*) >= 2"), "the revocation waits too"
        )
        assert not revocation.done()
        await transaction.rollback()
        executed = (await turn)["executeAction"]
        await revocation
    finally:
        await holder.close()
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert await stored(state, "SELECT count(*) FROM agent_memories") == 1
    assert await stored(state, "SELECT count(*) FROM client_tokens WHERE principal = 'runner'") == 0
