"""docs/graphql.md can be followed in order: every example of the guide is sent, as the guide
writes it and in the guide's order, over HTTP to a served app, with the token the guide says
and with the IDs it names taken from earlier answers (STEPS), and answers without `errors`.
Turns talk to the scripted model server (`model_script`)."""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from helpers import db_settings
from openai_server import OpenAIServer
from runtime_support import NOTHING_TO_KEEP
from servers import serving

from app.embeddings.static import StaticEmbedder

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "graphql.md"
_FENCE = re.compile(r"^```graphql\n(.*?)^```", re.S | re.M)
_OPERATION = re.compile(r"^(?:query|mutation) (\w+)")
_PART = re.compile(r"(\w+)(?:\[(\d+)\])?")  # a field, or an example, and an optional [index]
ADMIN_TOKEN = "docs-examples-bootstrap-admin-token"


@dataclass
class Step:
    """How one example is sent: `token`, "admin" (the bootstrap token) or the path of an
    earlier answer holding one; `variables`, each the path of an earlier answer holding its
    value (a variable left out is null); `runs`, how many times it is sent.

    A path is `Example.field.field`, `[n]` picking an item of a list; `Example[0]` reads the
    first of an example's runs, `Example` alone its latest."""

    token: str
    variables: dict[str, str] = field(default_factory=dict)
    runs: int = 1


ACCOUNT = "NewTenant.createAccount.accountId"
ACME_ADMIN = "TenantAdminToken.createClientToken.token"
SUPPORT = "IssueToken.createClientToken.token"  # the latest: the guide rotates it
AGENT = "NewAgent.createAction.actionId"
LISTED_AGENT = "Agents.actions.nodes[0].actionId"  # the operator finds it by listing

# Every example of the guide, in its order (the test checks that order against the guide).
STEPS = {
    "Viewer": Step("admin"),
    "Allowed": Step("admin"),
    "NewTenant": Step("admin"),
    "NewTenantAdmin": Step("admin", {"account": ACCOUNT}),
    "TenantAdminToken": Step("admin", {"account": ACCOUNT}),
    "NewClient": Step(ACME_ADMIN),
    "IssueToken": Step(ACME_ADMIN, runs=2),  # "issue the next one (IssueToken again)"
    "Tokens": Step(ACME_ADMIN),
    "Clients": Step(ACME_ADMIN),
    # By principal: acme-admin, then support-console.
    "ChangeClient": Step(ACME_ADMIN, {"modified": "Clients.clients.nodes[1].modified"}),
    "Revoke": Step(ACME_ADMIN, {"tokenId": "IssueToken[0].createClientToken.tokenId"}),
    "NewAgent": Step(ACME_ADMIN),
    "ChangeAgent": Step(ACME_ADMIN, {"id": AGENT}),
    "Turn": Step(ACME_ADMIN, {"id": AGENT}),  # FAILED: the model answers 500 (model_script)
    "Retry": Step(ACME_ADMIN, {"id": AGENT, "execution": "Turn.executeAction.executionId"}),
    "Replay": Step(ACME_ADMIN, {"id": AGENT, "original": "Retry.executeAction.executionId"}),
    "Remember": Step(ACME_ADMIN, {"id": AGENT}),
    "Agents": Step(SUPPORT),
    "Memories": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Memory": Step(
        SUPPORT, {"id": LISTED_AGENT, "memory": "Memories.action.memories.nodes[0].memoryId"}
    ),
    "Search": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Seed": Step(SUPPORT, {"id": LISTED_AGENT}),
    "SeedMany": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Forget": Step(SUPPORT, {"id": LISTED_AGENT, "memory": "Seed.addAgentMemory.memoryId"}),
    "Sessions": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Transcript": Step(SUPPORT, {"execution": "Retry.executeAction.executionId"}),
    "History": Step(SUPPORT, {"id": LISTED_AGENT}),
    "SearchHistory": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Erase": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Refetch": Step(SUPPORT, {"id": "Agents.actions.nodes[0].id"}),
}


def model_script(server: OpenAIServer) -> None:
    """What the model answers, call by call: Turn fails (the model answers 500), so that Retry
    has a failed turn to retry; the retry saves a record with `add_memory` (which Memories lists
    and Search finds) and answers; every other turn answers "done", every memory review keeps
    nothing."""
    server.chat_defaults["memory"] = NOTHING_TO_KEEP
    server.chat_error(500, message="the model is down")
    server.call_tools(
        (
            "add_memory",
            {
                "summary": "Customer 42 wants the invoice by post",
                "kind": "fact",
                "labels": {"customer_id": "42"},
            },
        )
    )
    server.say("Your invoice goes out by post on the 1st.")


def guide_examples() -> list[tuple[str, str]]:
    """(operation name, text) of each ```graphql block of the guide, in its order."""
    found = []
    for block in _FENCE.findall(GUIDE.read_text()):
        named = _OPERATION.match(block)
        assert named, f"an example without an operation name: {block[:60]!r}"
        found.append((named.group(1), block))
    return found


def _part(text: str) -> tuple[str, int | None]:
    matched = _PART.fullmatch(text)
    assert matched, f"not a path: {text!r}"
    return matched[1], None if matched[2] is None else int(matched[2])


def pick(answers: dict[str, list[dict[str, Any]]], path: str) -> Any:
    """The value at `path` (as Step says) among the answers so far."""
    head, *fields = path.split(".")
    name, run = _part(head)
    assert name in answers, f"{path}: {name} has not run yet"
    value: Any = answers[name][-1 if run is None else run]
    for part in fields:
        key, index = _part(part)
        value = value[key]
        if index is not None:
            assert len(value) > index, f"{path}: {key} has no item {index}"
            value = value[index]
    return value


def post(url: str, token: str, query: str, variables: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{url}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def test_the_steps_follow_the_guide():
    assert [name for name, _ in guide_examples()] == list(STEPS)


def test_the_guide_runs_in_order(db_url: str, embedder: StaticEmbedder):
    with OpenAIServer() as model:
        model_script(model)
        settings = db_settings(
            db_url, bootstrap_token=ADMIN_TOKEN, model_base_url=model.url, model_max_retries=0
        )
        with serving(settings, embedder) as url:
            answers: dict[str, list[dict[str, Any]]] = {}
            for name, query in guide_examples():
                step = STEPS[name]
                token = ADMIN_TOKEN if step.token == "admin" else pick(answers, step.token)
                variables = {v: pick(answers, path) for v, path in step.variables.items()}
                for _ in range(step.runs):
                    response = post(url, token, query, variables)
                    body = response.json()
                    assert response.status_code == 200 and not body.get("errors"), f"{name}: {body}"
                    answers.setdefault(name, []).append(body["data"])

            # What the guide says of these answers.
            assert answers["Turn"][0]["executeAction"]["status"] == "FAILED"
            retried = answers["Retry"][0]["executeAction"]
            assert (retried["status"], retried["invocationNumber"]) == ("SUCCEEDED", 2)
            assert answers["Replay"][0]["executeAction"]["preview"] is True
            found = answers["Search"][0]["action"]["searchMemories"]["edges"]
            assert [e["node"]["summary"] for e in found] == [
                "Customer 42 wants the invoice by post"
            ]
            revoked = pick(answers, "IssueToken[0].createClientToken.token")
            refused = post(url, revoked, "{ viewer { principal } }", {})
            assert refused.status_code == 401
