"""`GET /metrics` (issue 16, item 3): Prometheus text to a token with SELECT on
financial.Deployment.metrics in the default account; after a few requests and a turn it counts
requests by operation and code with their latency, turns by status, model calls and tokens by
purpose, searches by mode, embedding time and pool usage, and no label names an account or a
principal. Every response carries an X-Request-ID."""

import re
import time
from itertools import combinations

import asyncpg
import httpx
import pytest
from helpers import db_settings, eventually
from openai_server import OpenAIServer
from prometheus_client.parser import text_string_to_metric_families
from servers import serving

from app.config import Settings
from app.memory import maintenance
from app.observability.metrics import MAX_OPERATION_SETS, SEVERAL, Metrics

ADMIN_TOKEN = "metrics-test-admin-token"
METRICS = "financial.Deployment.metrics"
LABELS = {"operation", "code", "status", "purpose", "outcome", "kind", "mode", "state", "le"}


@pytest.fixture
def model_server():
    with OpenAIServer() as server:
        yield server


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def ok(http: httpx.AsyncClient, query: str, token: str = ADMIN_TOKEN, **variables) -> dict:
    response = await http.post(
        "/graphql", json={"query": query, "variables": variables}, headers=bearer(token)
    )
    body = response.json()
    assert response.status_code == 200 and not body.get("errors"), body
    return body["data"]


async def client_token(http, principal: str, policies: list, account: str | None = None) -> str:
    await ok(
        http,
        "mutation($input: ClientInput!) { createClient(input: $input) { principal } }",
        input={
            "accountId": account,
            "principal": principal,
            "name": principal,
            "policies": policies,
        },
    )
    issued = await ok(
        http,
        "mutation($p: String!, $a: UUID) { createClientToken(principal: $p, accountId: $a) "
        "{ token } }",
        p=principal,
        a=account,
    )
    return issued["createClientToken"]["token"]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_requests_turns_model_calls_searches_and_pool(
    db_url, embedder, model_server
):
    settings = db_settings(
        db_url,
        bootstrap_token=ADMIN_TOKEN,
        model_base_url=model_server.url,
        model_max_retries=0,
    )
    model_server.say("Hello from the scripted model.")
    grant = {"effect": "ALLOW", "actions": ["SELECT"], "resources": [METRICS]}
    with serving(settings, embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            account = (await ok(http, "{ viewer { accountId } }"))["viewer"]["accountId"]
            watcher = await client_token(http, "watcher", [grant])
            nosy = await client_token(
                http,
                "nosy",
                [{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Client.*"]}],
            )
            other = (
                await ok(http, 'mutation { createAccount(input: {name: "acme"}) { accountId } }')
            )["createAccount"]["accountId"]
            tenant = await client_token(http, "tenant-admin", [grant], account=other)

            action = (
                await ok(
                    http,
                    "mutation($input: ActionInput!) { createAction(input: $input) { actionId } }",
                    input={"name": "agent", "harness": {"memory": {"enabled": True}}},
                )
            )["createAction"]["actionId"]
            await ok(
                http,
                "mutation($a: UUID!) { addAgentMemory(actionId: $a, input: {scope: SESSION, "
                'sessionId: "s1", kind: "fact", summary: "prefers email", '
                'content: "the customer prefers email"}) { memoryId } }',
                a=action,
            )
            for mode in ("HYBRID", "LEXICAL"):
                await ok(
                    http,
                    "query($a: UUID!, $m: ActionAgentMemorySearchMode) { action(actionId: $a) { "
                    'searchMemories(query: "email", mode: $m, first: 5) { nodes { memoryId } } } }',
                    a=action,
                    m=mode,
                )
            turn = await ok(
                http,
                "mutation($input: ExecuteActionInput!) { executeAction(input: $input) "
                "{ status output } }",
                input={"actionId": action, "sessionId": "s1", "input": "How should we reach me?"},
            )
            assert turn["executeAction"]["status"] == "SUCCEEDED"
            # A refused query, a syntax error and a request without a token.
            denied = await http.post(
                "/graphql",
                json={"query": "{ actions(first: 1) { nodes { actionId } } }"},
                headers=bearer(nosy),
            )
            assert denied.json()["errors"][0]["extensions"]["code"] == "ACCESS_DENIED"
            await http.post("/graphql", json={"query": "{ viewer {"}, headers=bearer(ADMIN_TOKEN))
            # A field the schema lacks is no label value (it could name anyone).
            await http.post("/graphql", json={"query": "{ watcher }"}, headers=bearer(ADMIN_TOKEN))
            await http.post("/graphql", json={"query": "{ viewer { principal } }"})

            # Who may read them: the grant in the default account; no token is 401.
            anonymous = await http.get("/metrics")
            assert anonymous.status_code == 401
            assert anonymous.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
            for token, what in ((nosy, "without the grant"), (tenant, "of another account")):
                refused = await http.get("/metrics", headers=bearer(token))
                assert refused.status_code == 403, what
                assert refused.json()["errors"][0]["extensions"]["code"] == "ACCESS_DENIED"
                assert METRICS in refused.json()["errors"][0]["message"]
            response = await http.get("/metrics", headers=bearer(watcher))
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/plain")
            text = response.text

    found = samples(text)
    # Requests by operation (root fields) and outcome code, with latency histograms.
    assert value(found, "engram_requests_total", operation="executeAction", code="OK") == 1
    assert value(found, "engram_requests_total", operation="action", code="OK") == 2
    assert value(found, "engram_requests_total", operation="actions", code="ACCESS_DENIED") == 1
    assert value(found, "engram_requests_total", operation="invalid", code="BAD_REQUEST") == 2
    assert value(found, "engram_requests_total", operation="-", code="UNAUTHENTICATED") == 1
    assert value(found, "engram_request_seconds_count", operation="executeAction") == 1
    assert value(found, "engram_request_seconds_bucket", operation="executeAction", le="+Inf") == 1
    assert value(found, "engram_request_seconds_sum", operation="executeAction") > 0
    # Turns by status; model calls and tokens by purpose.
    assert value(found, "engram_turns_total", status="SUCCEEDED", kind="TURN") == 1
    assert value(found, "engram_model_calls_total", purpose="turn", outcome="ok") == 1
    assert value(found, "engram_model_tokens_total", purpose="turn", kind="prompt") > 0
    assert value(found, "engram_model_tokens_total", purpose="turn", kind="completion") > 0
    assert value(found, "engram_model_call_seconds_count", purpose="turn") == 1
    # The record, the hybrid search and the turn's recall were embedded (the lexical one not).
    assert value(found, "engram_model_calls_total", purpose="embed", outcome="ok") >= 3
    assert value(found, "engram_model_tokens_total", purpose="embed", kind="input") > 0
    assert value(found, "engram_embedding_seconds_count") >= 3
    # Searches by mode, with latency.
    assert value(found, "engram_search_seconds_count", mode="lexical") == 1
    assert value(found, "engram_search_seconds_count", mode="hybrid") >= 1
    # Pool usage.
    assert value(found, "engram_pool_max_connections") == settings.pool_max_size
    assert ("engram_pool_connections", frozenset({("state", "idle")})) in found
    assert ("engram_pool_connections", frozenset({("state", "in_use")})) in found

    # No label names an account or a principal.
    for name, labels in found:
        assert {k for k, _ in labels} <= LABELS, name
    values = " ".join(v for _, labels in found for _, v in labels)
    for secret in (account, other, "admin", "watcher", "nosy", "tenant-admin", ADMIN_TOKEN):
        assert secret not in values
    assert account not in text and other not in text and "watcher" not in text


async def test_a_model_call_that_could_not_be_sent_counts_as_failed(
    db_url, embedder, model_server, monkeypatch
):
    """An action whose allowed key is unset: its turn's model call is never sent, and counts
    as a failed call (an operator's alert on failed calls sees a key gone missing), with no
    time of its own in the latency histogram."""
    monkeypatch.delenv("TEAM_MODEL_KEY", raising=False)
    monkeypatch.delenv("TEAM_MODEL_KEY_FILE", raising=False)
    settings = db_settings(
        db_url,
        bootstrap_token=ADMIN_TOKEN,
        model_base_url=model_server.url,
        model_max_retries=0,
        model_allowed_key_envs=["TEAM_MODEL_KEY"],
    )
    with serving(settings, embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            action = (
                await ok(
                    http,
                    "mutation($input: ActionInput!) { createAction(input: $input) { actionId } }",
                    input={"name": "agent", "model": {"apiKeyEnv": "TEAM_MODEL_KEY"}},
                )
            )["createAction"]["actionId"]
            turn = await ok(
                http,
                "mutation($input: ExecuteActionInput!) { executeAction(input: $input) "
                "{ status error } }",
                input={"actionId": action, "sessionId": "s1", "input": "Hello"},
            )
            assert turn["executeAction"]["status"] == "FAILED"
            assert "TEAM_MODEL_KEY" in turn["executeAction"]["error"]
            response = await http.get("/metrics", headers=bearer(ADMIN_TOKEN))
            assert response.status_code == 200
    found = samples(response.text)
    assert model_server.requests == []
    assert value(found, "engram_model_calls_total", purpose="turn", outcome="failed") == 1
    assert value(found, "engram_model_calls_total", purpose="turn", outcome="ok") == 0
    assert value(found, "engram_model_call_seconds_count", purpose="turn") == 0
    assert value(found, "engram_turns_total", status="FAILED", kind="TURN") == 1


async def test_metrics_count_search_upkeep_rounds_by_outcome(db_url, embedder):
    """The search upkeep runs outside any request: its rounds are counted by outcome, and the
    last one done is dated, so that upkeep that stopped shows (rounds failing, or skipped while
    another process holds their lock and never finishes one)."""
    settings = Settings(
        database_url=db_url, bootstrap_token=ADMIN_TOKEN, search_maintenance_seconds=0.05
    )
    found: dict = {}
    conn = await asyncpg.connect(db_url)
    try:
        # Each round fails at its first write, its row in `deployment`.
        await conn.execute(
            "ALTER TABLE deployment ADD CONSTRAINT no_rounds "
            f"CHECK (key <> '{maintenance.ROUND_KEY}') NOT VALID"
        )
        began = time.time()
        with serving(settings, embedder) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:

                async def rounds(outcome: str) -> float:
                    response = await http.get("/metrics", headers=bearer(ADMIN_TOKEN))
                    assert response.status_code == 200
                    found.update(samples(response.text))
                    return value(found, "engram_search_upkeep_rounds_total", outcome=outcome)

                await eventually(lambda: rounds("failed"), "failed rounds counted")
                assert value(found, "engram_search_upkeep_rounds_total", outcome="done") == 0
                assert value(found, "engram_search_upkeep_last_done_timestamp_seconds") == 0
                await conn.execute("ALTER TABLE deployment DROP CONSTRAINT no_rounds")
                await conn.execute(f"SELECT pg_advisory_lock({maintenance.ROUND_LOCK})")
                await eventually(lambda: rounds("skipped"), "skipped rounds counted")
                await conn.execute(f"SELECT pg_advisory_unlock({maintenance.ROUND_LOCK})")
                await eventually(lambda: rounds("done"), "a round done counted")
    finally:
        await conn.close()
    last_done = value(found, "engram_search_upkeep_last_done_timestamp_seconds")
    assert began < last_done <= time.time()
    assert {labels for name, labels in found if name.startswith("engram_search_upkeep")} == {
        frozenset({("outcome", outcome)}) for outcome in ("done", "failed", "skipped")
    } | {frozenset()}


async def test_every_response_carries_a_request_id(db_url, embedder):
    with serving(db_settings(db_url, bootstrap_token=ADMIN_TOKEN), embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            made = await http.get("/healthz")
            assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
            kept = await http.post(
                "/graphql",
                json={"query": "{ viewer { principal } }"},
                headers={**bearer(ADMIN_TOKEN), "X-Request-ID": "client-42.a:b"},
            )
            assert kept.headers["x-request-id"] == "client-42.a:b"
            # A refused request too; an ID that is not plain is replaced, not echoed.
            refused = await http.post(
                "/graphql",
                json={"query": "{ viewer { principal } }"},
                headers={"X-Request-ID": "bad id\twith spaces " + "x" * 200},
            )
            assert refused.status_code == 401
            assert re.fullmatch(r"[0-9a-f]{32}", refused.headers["x-request-id"])


def test_operation_labels_of_several_root_fields_are_bounded():
    """A client naming its own sets of root fields gets at most MAX_OPERATION_SETS labels of
    their own; later sets count as `several`, and a single root field keeps its own label."""
    metrics = Metrics()
    roots = [f"field{i}" for i in range(12)]
    sets = [",".join(c) for n in (2, 3) for c in combinations(roots, n)]
    assert len(sets) > 2 * MAX_OPERATION_SETS
    for operation in sets:
        metrics.request(operation, "OK", 0.01)
    metrics.request("viewer", "OK", 0.01)

    found = samples(metrics.render().decode())
    operations = {
        dict(labels)["operation"] for name, labels in found if name == "engram_requests_total"
    }
    assert len(operations) == MAX_OPERATION_SETS + 2  # the first sets, `several` and `viewer`
    assert SEVERAL in operations and "viewer" in operations
    assert set(sets[:MAX_OPERATION_SETS]) < operations
    counted = value(found, "engram_requests_total", operation=SEVERAL, code="OK")
    assert counted == len(sets) - MAX_OPERATION_SETS


def test_search_upkeep_rounds_counted_again_from_a_tally_that_started_over():
    """The upkeep's tally is read at each scrape; one that starts again (a second lifespan of
    the app) adds its rounds rather than failing the scrape on a negative increment."""
    metrics = Metrics()
    metrics.search_upkeep({"done": 5}, 1.0)
    metrics.search_upkeep({"done": 2, "failed": 1}, 2.0)

    found = samples(metrics.render().decode())
    assert value(found, "engram_search_upkeep_rounds_total", outcome="done") == 7
    assert value(found, "engram_search_upkeep_rounds_total", outcome="failed") == 1
