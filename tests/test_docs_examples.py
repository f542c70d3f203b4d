"""docs/graphql.md can be followed in order: every example of the guide is sent, as the guide
writes it and in the guide's order, over HTTP to a served app, with the token the guide says
and with the IDs it names taken from earlier answers (STEPS), and answers without `errors`.
Turns talk to the scripted model server (`model_script`).

The README's examples (its curl request, `rememberConversation`, the MCP address), harness.md's
and what the guide says of errors (each code, the HTTP statuses, lookups of nothing) are run the
same way, against a served app."""

import json
import re
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from helpers import db_settings
from openai_server import OpenAIServer
from runtime_support import NOTHING_TO_KEEP, candidates, review_requests
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
    # Twice: the first account, which nothing is created in, is the one DeleteTenant deletes.
    "NewTenant": Step("admin", runs=2),
    "Accounts": Step("admin"),  # the operator finds the new tenant's accountId by its name
    "RenameTenant": Step("admin", {"account": ACCOUNT}),
    "DeleteTenant": Step("admin", {"account": "NewTenant[0].createAccount.accountId"}),
    "NewTenantAdmin": Step("admin", {"account": ACCOUNT}),
    "TenantAdminToken": Step("admin", {"account": ACCOUNT}),
    "NewClient": Step(ACME_ADMIN),
    "IssueToken": Step(ACME_ADMIN, runs=2),  # "issue the next one (IssueToken again)"
    "Tokens": Step(ACME_ADMIN),
    # What the tenant's admin token changed, read by the operator as after a leak.
    "WhatItChanged": Step("admin", {"leaked": "TenantAdminToken.createClientToken.tokenId"}),
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
    "SessionMemories": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Search": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Seed": Step(SUPPORT, {"id": LISTED_AGENT}),
    "SeedMany": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Forget": Step(SUPPORT, {"id": LISTED_AGENT, "memory": "Seed.addAgentMemory.memoryId"}),
    "Sessions": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Transcript": Step(SUPPORT, {"execution": "Retry.executeAction.executionId"}),
    "WhatItRan": Step(SUPPORT, {"leaked": "TenantAdminToken.createClientToken.tokenId"}),
    "History": Step(SUPPORT, {"id": LISTED_AGENT}),
    "SearchHistory": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Erase": Step(SUPPORT, {"id": LISTED_AGENT}),
    "Refetch": Step(SUPPORT, {"id": "Agents.actions.nodes[0].id"}),
    "RefetchMany": Step(
        SUPPORT,
        {"agent": "Agents.actions.nodes[0].id", "record": "Memories.action.memories.nodes[0].id"},
    ),
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


def post(
    url: str, token: str, query: str, variables: dict[str, Any], operation: str | None = None
) -> httpx.Response:
    return httpx.post(
        f"{url}/graphql",
        json={"query": query, "variables": variables, "operationName": operation},
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
                    response = post(url, token, query, variables, name)
                    body = response.json()
                    assert response.status_code == 200 and not body.get("errors"), f"{name}: {body}"
                    answers.setdefault(name, []).append(body["data"])

            # What the guide says of these answers.
            assert answers["Turn"][0]["executeAction"]["status"] == "FAILED"
            retried = answers["Retry"][0]["executeAction"]
            assert (retried["status"], retried["invocationNumber"]) == ("SUCCEEDED", 2)
            assert answers["Replay"][0]["executeAction"]["preview"] is True
            in_session = answers["SessionMemories"][0]["action"]["memories"]["nodes"]
            assert [n["summary"] for n in in_session] == ["Customer 42 wants the invoice by post"]
            found = answers["Search"][0]["action"]["searchMemories"]["edges"]
            assert [e["node"]["summary"] for e in found] == [
                "Customer 42 wants the invoice by post"
            ]
            changed = answers["WhatItChanged"][0]["adminEvents"]["nodes"]
            assert [(e["operation"], e["actor"]) for e in changed] == [
                ("createClientToken", "acme-admin"),
                ("createClientToken", "acme-admin"),
                ("createClient", "acme-admin"),
            ]
            ran = answers["WhatItRan"][0]["executions"]["nodes"]
            assert [(e["kind"], e["principal"]) for e in ran] == [
                ("INGEST", "acme-admin"),
                ("TURN", "acme-admin"),
                ("TURN", "acme-admin"),
            ]
            assert ran[-1]["executionId"] == pick(answers, "Retry.executeAction.executionId")
            revoked = pick(answers, "IssueToken[0].createClientToken.token")
            refused = post(url, revoked, "{ viewer { principal } }", {})
            assert refused.status_code == 401


# --- the README's and harness.md's examples, and what the guide says of errors ---------------

ROOT = GUIDE.parents[1]
README = ROOT / "README.md"
HARNESS = ROOT / "docs" / "harness.md"
EXAMPLE_ACTION = "3f2a9c1e-0000-4000-8000-000000000001"  # the README's placeholder agent


def curl_body(doc: Path) -> dict[str, Any]:
    """The JSON the first `curl ... -d '...'` example of `doc` sends."""
    found = re.search(r"-d '(\{\"query\".*?\})'", doc.read_text(), re.S)
    assert found, f"{doc.name} has no curl example"
    return json.loads(found[1])


def fenced(doc: Path, operation: str) -> str:
    """The one ```graphql example of `doc` that runs `operation` (wherever it stands, so that
    an example added before it moves nothing here)."""
    found = [e for e in _FENCE.findall(doc.read_text()) if re.search(rf"\b{operation}\(", e)]
    assert len(found) == 1, f"{doc.name}: {len(found)} graphql examples run {operation}"
    return found[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answer(url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    response = post(url, token, body["query"], body.get("variables") or {})
    data = response.json()
    assert response.status_code == 200 and not data.get("errors"), data
    return data["data"]


def test_the_readme_and_harness_examples_run(db_url: str, embedder: StaticEmbedder):
    """The README's curl example creates an agent; its `rememberConversation` example, sent to
    that agent, keeps what the review found and answers a repeat of its idempotency key with the
    first ingest; the MCP address it shows answers a GET 405; harness.md's example, with the
    variables it gives, returns the harness with every default filled in."""
    with OpenAIServer() as model:
        candidates(model, {"summary": "The customer lives in Berlin since November 2026"})
        settings = db_settings(
            db_url, bootstrap_token=ADMIN_TOKEN, model_base_url=model.url, model_max_retries=0
        )
        with serving(settings, embedder) as url:
            created = answer(url, ADMIN_TOKEN, curl_body(README))["createAction"]
            assert created["version"] == 1
            agent = created["actionId"]

            remember = fenced(README, "rememberConversation").replace(EXAMPLE_ACTION, agent)
            first = answer(url, ADMIN_TOKEN, {"query": remember})["rememberConversation"]
            assert first["status"] == "SUCCEEDED", first
            assert [d["action"] for d in first["decisions"]] == ["ADD"]
            (record,) = first["records"]
            assert record["summary"] == "The customer lives in Berlin since November 2026"
            assert record["status"] == "ACTIVE"
            again = answer(url, ADMIN_TOKEN, {"query": remember})["rememberConversation"]
            assert again == first
            assert len(review_requests(model)) == 1  # the repeat ran no review

            listening = httpx.get(
                f"{url}/mcp/{agent}?session=customer-42",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=30,
            )
            assert listening.status_code == 405

            example = fenced(HARNESS, "createAction")
            variables = json.loads(
                re.search(r"with variables such as `(.*?)`", HARNESS.read_text())[1]
            )
            made = answer(url, ADMIN_TOKEN, {"query": example, "variables": variables})
            made = made["createAction"]
            assert made["harness"] == {
                "memory": {
                    "enabled": True,
                    "scope": {"read": ["session"], "write": ["session"]},
                    "extraction": {"every": "turn"},
                    "search": {"mode": "hybrid", "max_results": 5},
                    "tools": [],
                    "kinds": ["guidance", "fact", "event", "reference"],
                    "labels": {},
                }
            }
            assert made["model"] == variables["model"]


def test_without_a_model_turns_fail_saying_so_and_the_rest_works(
    db_url: str, embedder: StaticEmbedder
):
    """README: until a model answers, turns and `rememberConversation` end FAILED saying so
    (naming ENGRAM_MODEL_BASE_URL), and everything else works without one."""
    settings = db_settings(
        db_url,
        bootstrap_token=ADMIN_TOKEN,
        model_base_url=f"http://127.0.0.1:{closed_port()}/v1",
        model_max_retries=0,
    )
    named = dict(guide_examples())
    with serving(settings, embedder) as url:

        def run(name: str, **variables: Any) -> dict[str, Any]:
            return answer(url, ADMIN_TOKEN, {"query": named[name], "variables": variables})

        agent = run("NewAgent")["createAction"]["actionId"]
        turn = run("Turn", id=agent)["executeAction"]
        assert turn["status"] == "FAILED" and "ENGRAM_MODEL_BASE_URL" in turn["error"], turn
        ingest = run("Remember", id=agent)["rememberConversation"]
        assert ingest["status"] == "FAILED" and "ENGRAM_MODEL_BASE_URL" in ingest["error"]
        # Memory needs no model: an operator seeds a record, lists it and deletes it.
        seeded = run("Seed", id=agent)["addAgentMemory"]
        listed = run("Memories", id=agent)["action"]["memories"]["nodes"]
        assert [m["memoryId"] for m in listed] == [seeded["memoryId"]]
        gone = run("Forget", id=agent, memory=seeded["memoryId"])["deleteAgentMemory"]
        assert gone["status"] == "DELETED"


def test_errors_answer_as_the_guide_says(db_url: str, embedder: StaticEmbedder):
    """graphql.md's account of errors: each code, and the HTTP status of each refusal before a
    request runs; a lookup of nothing answers null, a mutation or `node(id)` naming nothing or
    another account's object NOT_FOUND."""
    settings = db_settings(db_url, bootstrap_token=ADMIN_TOKEN)
    named = dict(guide_examples())
    with serving(settings, embedder) as url:

        def refused(token: str, query: str, **variables: Any) -> tuple[int, str, str]:
            response = post(url, token, query, variables)
            body = response.json()
            assert body["data"] is None, body
            (error,) = body["errors"]
            return response.status_code, error["extensions"]["code"], error["message"]

        status, code, message = refused("not-a-token", "{ viewer { principal } }")
        assert (status, code) == (401, "UNAUTHENTICATED")
        assert "ask for a new one" in message  # says what to do, as an expired token's does
        status, code, message = refused(ADMIN_TOKEN, "{ actions(first: 0) { nodes { name } } }")
        assert (status, code) == (200, "BAD_REQUEST")
        assert message.startswith("`first` must be from 1 to 1000")
        two = (
            'mutation { a: createAccount(input: {name: "a"}) { name } '
            'b: createAccount(input: {name: "b"}) { name } }'
        )
        assert refused(ADMIN_TOKEN, two)[:2] == (200, "BAD_REQUEST")
        big = httpx.post(
            f"{url}/graphql",
            content=b'{"query": "' + b" " * settings.max_body_bytes + b'{ viewer { principal } }"}',
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"},
            timeout=60,
        )
        assert (big.status_code, big.json()["errors"][0]["extensions"]["code"]) == (
            413,
            "BAD_REQUEST",
        )
        broken = httpx.post(
            f"{url}/graphql",
            content=b"{not json",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"},
            timeout=60,
        )
        assert (broken.status_code, broken.json()["errors"][0]["extensions"]["code"]) == (
            400,
            "BAD_REQUEST",
        )
        # The rest of the guide's 400s, refused before anything runs; a NUL the query writes as
        # GraphQL's escape is refused as the query runs, 200.
        deep: Any = []
        for _ in range(settings.max_json_depth + 1):
            deep = [deep]
        lookup = "query($n: String!) { client(principal: $n) { name } }"
        for body in (
            {"query": lookup, "variables": [1]},
            {"query": lookup, "variables": {"n": deep}},
            {"query": lookup, "variables": {"n": "a\u0000b"}},
            {"query": lookup, "variables": {"n": "\ud800"}},
            {"query": lookup, "variables": {"n": "a"}, "operationName": "Other"},
        ):
            sent = httpx.post(
                f"{url}/graphql",
                content=json.dumps(body).encode(),
                headers={
                    "Authorization": f"Bearer {ADMIN_TOKEN}",
                    "content-type": "application/json",
                },
                timeout=60,
            )
            code = sent.json()["errors"][0]["extensions"]["code"]
            assert (sent.status_code, code) == (400, "BAD_REQUEST"), (body, sent.text)
        escaped = '{ client(principal: "a\\u0000b") { name } }'
        assert refused(ADMIN_TOKEN, escaped)[:2] == (200, "BAD_REQUEST")

        # Another tenant, and its agent.
        account = answer(url, ADMIN_TOKEN, {"query": named["NewTenant"]})["createAccount"][
            "accountId"
        ]
        answer(
            url, ADMIN_TOKEN, {"query": named["NewTenantAdmin"], "variables": {"account": account}}
        )
        tenant = answer(
            url,
            ADMIN_TOKEN,
            {"query": named["TenantAdminToken"], "variables": {"account": account}},
        )["createClientToken"]["token"]
        theirs = answer(url, tenant, {"query": named["NewAgent"]})["createAction"]["actionId"]
        their_id = answer(
            url,
            tenant,
            {
                "query": "query($a: UUID!) { action(actionId: $a) { id } }",
                "variables": {"a": theirs},
            },
        )["action"]["id"]

        nothing = str(uuid.uuid4())
        lookups = """query($a: UUID!, $n: UUID!) {
          a: action(actionId: $a) { name }
          m: agentMemory(actionId: $a, id: $n) { summary }
          e: execution(executionId: $n) { status }
          c: client(principal: "nobody") { name }
        }"""
        for agent in (nothing, theirs):
            found = answer(
                url, ADMIN_TOKEN, {"query": lookups, "variables": {"a": agent, "n": nothing}}
            )
            assert found == {"a": None, "m": None, "e": None, "c": None}
        ours = answer(url, ADMIN_TOKEN, curl_body(README))["createAction"]["actionId"]
        memory = (
            "query($a: UUID!, $n: UUID!) { action(actionId: $a) { memory(id: $n) { summary } } }"
        )
        found = answer(url, ADMIN_TOKEN, {"query": memory, "variables": {"a": ours, "n": nothing}})
        assert found == {"action": {"memory": None}}
        assert (
            refused(ADMIN_TOKEN, "query($id: ID!) { node(id: $id) { id } }", id=their_id)[1]
            == "NOT_FOUND"
        )
        assert refused(ADMIN_TOKEN, '{ node(id: "abc") { id } }')[1] == "BAD_REQUEST"
        for agent in (nothing, theirs):
            status, code, _ = refused(ADMIN_TOKEN, named["Forget"], id=agent, memory=nothing)
            assert (status, code) == (200, "NOT_FOUND")
