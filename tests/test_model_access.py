"""Model keys and endpoints the operator gives to some accounts only: ENGRAM_MODEL_ALLOWED_KEY_ENVS
and ENGRAM_MODEL_ALLOWED_BASE_URLS as JSON objects from each variable (or URL) to the accounts
that may use it. Another account's agent may not name it, neither when saved nor when it runs,
and a run whose account lost it sends nothing to the model server. Two accounts, TEAM_A and
TEAM_B, named beforehand so the module's settings can list them."""

import asyncio
import json
import logging
from typing import Any
from uuid import UUID

import pytest
from factories import allow, make_account, make_agent_id, memory_harness, token_for
from helpers import GQL, eventually
from mcp_support import mcp_session, mcp_url, refused
from openai_server import CHAT, OpenAIServer
from runtime_support import EXECUTE, chat, events, run

from app.actions.model import ModelConfig
from app.auth.caller import Caller
from app.auth.policies import ADMIN_POLICIES
from app.config import Settings
from app.errors import BadInput
from app.runtime.context import ContextWindow
from app.runtime.model import MODEL, Completion
from app.runtime.transcript import Transcript
from app.state import AppState

TEAM_A = UUID("a0000000-0000-4000-8000-00000000000a")
TEAM_B = UUID("b0000000-0000-4000-8000-00000000000b")
NOT_ALLOWED = "which is not allowed for this account"

pytestmark = [
    pytest.mark.usefixtures("model_server"),
    pytest.mark.settings(
        model_allowed_key_envs=json.dumps({"KEY_A": [str(TEAM_A)], "SHARED_KEY": ["*"]})
    ),
]

CREATE = "mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"
UPDATE = (
    "mutation($id: UUID!, $input: ActionInput!) "
    "{ updateAction(actionId: $id, input: $input) { version } }"
)
REMEMBER = """mutation($input: RememberConversationInput!) {
    rememberConversation(input: $input) { executionId status error } }"""


@pytest.fixture
async def teams(state: AppState, monkeypatch: pytest.MonkeyPatch) -> tuple[Caller, Caller]:
    """The admins of TEAM_A and TEAM_B; KEY_A and SHARED_KEY set where Engram runs."""
    monkeypatch.setenv("KEY_A", "sk-team-a")
    monkeypatch.setenv("SHARED_KEY", "sk-shared")
    for name, account in (("team a", TEAM_A), ("team b", TEAM_B)):
        await make_account(state, name, account)
    return Caller(TEAM_A, "admin-a", ADMIN_POLICIES), Caller(TEAM_B, "admin-b", ADMIN_POLICIES)


def operator_sets(state: AppState, **values: Any) -> None:
    """The operator restarts with these allow-lists (as ENGRAM_* text, validated as at start);
    the running app and its model client read the same settings object."""
    given = Settings(**{name: json.dumps(value) for name, value in values.items()})
    for name in values:
        setattr(state.settings, name, getattr(given, name))


async def _versions(state: AppState, account: UUID) -> int:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(
            "SELECT count(*) FROM action_versions WHERE account_id = $1", account
        )


async def _saved(gql: GQL, who: Caller, model: dict[str, Any]) -> str:
    created = await gql(who, CREATE, input={"name": "agent", "model": model})
    return created.ok()["createAction"]["actionId"]


async def test_a_key_given_to_one_account_is_refused_to_another_when_an_agent_is_saved(
    gql: GQL, state: AppState, teams: tuple[Caller, Caller], model_server: OpenAIServer
) -> None:
    team_a, team_b = teams
    action_a = await _saved(gql, team_a, {"apiKeyEnv": "KEY_A"})
    executed = await run(gql, team_a, action_a, "hi")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert chat(model_server)[0].headers["authorization"] == "Bearer sk-team-a"

    plain_b = await make_agent_id(state, team_b, harness=None)
    told = {}
    for name in ("KEY_A", "NO_SUCH_KEY"):
        change = {"name": "b", "model": {"apiKeyEnv": name}}
        for refusal in (
            await gql(team_b, CREATE, input=change),
            await gql(team_b, UPDATE, id=plain_b, input=change),
        ):
            assert refusal.codes == ["BAD_REQUEST"], refusal.errors
            told.setdefault(name, set()).add(refusal.errors[0]["message"])
    (message,) = told["KEY_A"]
    assert "model.apiKeyEnv names KEY_A" in message and NOT_ALLOWED in message
    # Word for word what a variable no account may use gets: B learns nothing of A's.
    assert told["NO_SUCH_KEY"] == {message.replace("KEY_A", "NO_SUCH_KEY")}
    # Nothing of B's refused saves was written, and only A's turn reached the model.
    assert await _versions(state, TEAM_B) == 1
    assert len(chat(model_server, None)) == 1


async def test_a_key_given_to_every_account_and_the_list_form_serve_every_account(
    gql: GQL, state: AppState, teams: tuple[Caller, Caller], model_server: OpenAIServer
) -> None:
    _, team_b = teams
    shared = await _saved(gql, team_b, {"apiKeyEnv": "SHARED_KEY"})
    executed = await run(gql, team_b, shared, "hi")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert chat(model_server)[-1].headers["authorization"] == "Bearer sk-shared"

    # A JSON list means what it always meant: every account may use each variable.
    operator_sets(state, model_allowed_key_envs=["KEY_A"])
    assert state.settings.model_allowed_key_envs == ["KEY_A"]
    own = await _saved(gql, team_b, {"apiKeyEnv": "KEY_A"})
    executed = await run(gql, team_b, own, "hi")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert chat(model_server)[-1].headers["authorization"] == "Bearer sk-team-a"


async def test_an_endpoint_given_to_one_account_is_refused_to_another(
    gql: GQL, state: AppState, teams: tuple[Caller, Caller], model_server: OpenAIServer
) -> None:
    team_a, team_b = teams
    with OpenAIServer() as team_server:
        operator_sets(state, model_allowed_base_urls={team_server.url: [str(TEAM_A)]})
        action_a = await _saved(gql, team_a, {"baseUrl": team_server.url})
        executed = await run(gql, team_a, action_a, "hi")
        assert executed["status"] == "SUCCEEDED", executed["error"]
        assert len(team_server.requests_to(CHAT)) == 1

        told = set()
        for url in (team_server.url, "https://unknown.example/v1"):
            refusal = await gql(team_b, CREATE, input={"name": "b", "model": {"baseUrl": url}})
            assert refusal.codes == ["BAD_REQUEST"], refusal.errors
            told.add(refusal.errors[0]["message"].replace(url, "<url>"))
        (message,) = told
        assert "not an endpoint allowed for this account" in message
        # The deployment's own endpoint stays every account's.
        default = await _saved(gql, team_b, {"baseUrl": model_server.url})
        assert (await run(gql, team_b, default, "hi"))["status"] == "SUCCEEDED"
        assert len(team_server.requests_to(CHAT)) == 1


async def test_an_agent_whose_account_lost_its_key_runs_no_more_and_sends_nothing(
    gql: GQL,
    state: AppState,
    admin: Caller,
    teams: tuple[Caller, Caller],
    model_server: OpenAIServer,
    base_url: str,
) -> None:
    team_a, _ = teams
    action_a = await make_agent_id(
        state, team_a, harness=memory_harness(), model={"apiKeyEnv": "KEY_A"}
    )
    # While allowed: a committed turn (to replay) and a failed one (to retry).
    original = await run(gql, team_a, action_a, "hi")
    assert original["status"] == "SUCCEEDED", original["error"]
    model_server.chat_error(400)
    failed = await run(gql, team_a, action_a, "again")
    assert failed["status"] == "FAILED"
    token = await token_for(
        state,
        admin,
        "runner-a",
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.AgentMemory.*"),
        account_id=TEAM_A,
    )
    sent = len(model_server.requests_to(CHAT))

    # The operator gives KEY_A to team B instead; A's saved agent still names it.
    operator_sets(state, model_allowed_key_envs={"KEY_A": [str(TEAM_B)]})
    base = {"actionId": action_a, "sessionId": "s1"}
    for what, mutation, request in (
        ("a turn", EXECUTE, {**base, "input": "hello"}),
        ("a retry", EXECUTE, {**base, "executionId": failed["executionId"]}),
        ("a replay", EXECUTE, {"actionId": action_a, "replayOf": original["executionId"]}),
        ("an ingest", REMEMBER, {**base, "messages": [{"role": "user", "content": "I'm Ada"}]}),
    ):
        refusal = await gql(team_a, mutation, input=request)
        assert refusal.codes == ["BAD_REQUEST"], (what, refusal.errors)
        message = refusal.errors[0]["message"]
        assert "model.apiKeyEnv names KEY_A" in message and NOT_ALLOWED in message, what
    async with mcp_session(mcp_url(base_url, action_a), token) as session:
        said = [{"role": "user", "content": "I'm Ada"}]
        error = (await refused(session, "remember_conversation", messages=said))["error"]
    assert "KEY_A" in error and NOT_ALLOWED in error
    assert len(model_server.requests_to(CHAT)) == sent
    async with state.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM executions") == 2


async def test_a_key_withdrawn_while_a_turn_runs_keeps_its_memory_review_from_the_model(
    gql: GQL, state: AppState, teams: tuple[Caller, Caller], model_server: OpenAIServer
) -> None:
    team_a, _ = teams
    action_a = await make_agent_id(
        state, team_a, harness=memory_harness(), model={"apiKeyEnv": "KEY_A"}
    )
    assert (await run(gql, team_a, action_a, "hi"))["status"] == "SUCCEEDED"
    assert len(chat(model_server, "memory")) == 1  # a turn of this agent is reviewed

    model_server.say("Noted.", delay=0.5)
    running = asyncio.create_task(run(gql, team_a, action_a, "I moved to Berlin"))
    await eventually(lambda: len(chat(model_server)) == 2, "the second turn's model call")
    operator_sets(state, model_allowed_key_envs={"KEY_A": [str(TEAM_B)]})
    executed = await running
    # A review that fails never fails its turn: its event says why, and it sent nothing.
    assert executed["status"] == "SUCCEEDED", executed["error"]
    (review,) = events(executed, "memory.review")
    assert "KEY_A" in review["error"] and NOT_ALLOWED in review["error"]
    assert len(chat(model_server, "memory")) == 1


async def test_a_summary_call_uses_only_keys_its_account_may(
    state: AppState, teams: tuple[Caller, Caller], model_server: OpenAIServer
) -> None:
    async def recorded(completion: Completion) -> None:
        pass

    def window(account: UUID) -> ContextWindow:
        opened = ContextWindow(
            400,
            0,
            None,
            state.services[MODEL],
            ModelConfig(api_key_env="KEY_A"),
            account,
            Transcript(1),
            recorded,
            [],
        )
        for turn in range(1, 6):
            said = [
                {"role": "user", "content": f"question {turn} " + "words " * 60},
                {"role": "assistant", "content": f"answer {turn} " + "words " * 60},
            ]
            opened.add_turn(turn, said)
        return opened

    system = {"role": "system", "content": "You help."}
    asked = {"role": "user", "content": "and now?"}
    with pytest.raises(BadInput, match=f"KEY_A, {NOT_ALLOWED}"):
        await window(TEAM_B).prompt(system, [], None, asked, [])
    assert chat(model_server, None) == []

    model_server.say("SUMMARY.", purpose="context")
    await window(TEAM_A).prompt(system, [], None, asked, [])
    summarized = chat(model_server, "context")
    assert summarized and {r.headers["authorization"] for r in summarized} == {"Bearer sk-team-a"}


async def test_a_key_the_operator_allows_that_cannot_be_read_is_said_at_start(
    settings: Settings,
    embedder: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Any,
) -> None:
    """Said where the operator looks, at start, rather than first by an agent's failed turn:
    each allowed key neither NAME nor NAME_FILE gives, or whose file is refused; never a key."""
    from app.main import start_state

    key = tmp_path / "key"
    key.write_text("sk-team-a\n")
    monkeypatch.setenv("KEY_A", "sk-team-a")
    monkeypatch.setenv("KEY_A_FILE", str(key))
    monkeypatch.delenv("SHARED_KEY", raising=False)

    async def said_at_start() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="app.services"):
            started = await start_state(settings, embedder)
            await started.stop()
        return [r.getMessage() for r in caplog.records if r.name == "app.services"]

    unread = "a model key ENGRAM_MODEL_ALLOWED_KEY_ENVS allows cannot be read: "
    fails = " (the turns of agents whose model.apiKeyEnv names it fail until it can)"
    assert await said_at_start() == [
        f"{unread}KEY_A: KEY_A and KEY_A_FILE are both set: set one or the other{fails}",
        f"{unread}SHARED_KEY is not set where Engram runs (neither SHARED_KEY nor "
        f"SHARED_KEY_FILE){fails}",
    ]
    assert "sk-team-a" not in caplog.text
    monkeypatch.delenv("KEY_A")
    monkeypatch.setenv("SHARED_KEY", "sk-shared")
    assert await said_at_start() == []
