"""A listing's cursor belongs to the list that issued it and to the arguments it was asked with
(its parent, filters and order), as a ranked search's does: sent with others it is BAD_REQUEST
saying to start from the first page, where it used to page the other list from a place it never
reached, silently leaving out everything that sorts before. Over HTTP, for every connection."""

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from factories import FULL_MEMORY, make_account, make_agent, token_for
from helpers import database_copy, db_settings, default_admin, running_state
from runtime_support import scripted_model
from servers import serving

from app.auth import service as auth_service
from app.graphql.relay import global_id

PAGE_INFO = "pageInfo { hasNextPage endCursor }"
ACTIONS = f"query($after: String) {{ actions(first: 1, after: $after) {{ {PAGE_INFO} }} }}"
CLIENTS = f"""query($after: String, $account: UUID) {{
  clients(first: 1, after: $after, accountId: $account) {{ {PAGE_INFO} }} }}"""
TOKENS = f"""query($after: String, $principal: String!) {{
  client(principal: $principal) {{ tokens(first: 1, after: $after) {{ {PAGE_INFO} }} }} }}"""
SESSIONS = f"""query($after: String, $a: UUID!) {{
  action(actionId: $a) {{ sessions(first: 1, after: $after) {{ {PAGE_INFO} }} }} }}"""
EXECUTIONS = f"""query($after: String, $a: UUID!) {{
  action(actionId: $a) {{ executions(first: 1, after: $after) {{ {PAGE_INFO} }} }} }}"""
SESSION_EXECUTIONS = f"""query($after: String, $session: ID!) {{
  node(id: $session) {{ ... on ActionSession {{ executions(first: 1, after: $after) {{
    {PAGE_INFO} }} }} }} }}"""
SESSION_HISTORY = f"""query($after: String, $session: ID!) {{
  node(id: $session) {{ ... on ActionSession {{ history(first: 1, after: $after) {{
    {PAGE_INFO} }} }} }} }}"""
TRANSCRIPT = f"""query($after: String, $e: UUID!) {{
  execution(executionId: $e) {{ transcript(first: 1, after: $after) {{ {PAGE_INFO} }} }} }}"""
RECORD_HISTORY = f"""query($after: String, $a: UUID!, $m: UUID!) {{
  agentMemory(actionId: $a, id: $m) {{ history(first: 1, after: $after) {{ {PAGE_INFO} }} }} }}"""
MEMORIES = f"""query($after: String, $a: UUID!, $kind: String, $labels: [AgentMemoryLabelInput!],
    $scope: ActionAgentMemoryScope, $preview: Boolean, $status: [ActionAgentMemoryStatus!],
    $sessionId: String, $sort: SortOrder) {{
  action(actionId: $a) {{ memories(first: 1, after: $after, kind: $kind, labels: $labels,
    scope: $scope, preview: $preview, status: $status, sessionId: $sessionId, sort: $sort) {{
    {PAGE_INFO} }} }} }}"""
LISTED = f"""query($after: String, $a: UUID!, $kind: String, $labels: [AgentMemoryLabelInput!],
    $ids: [UUID!]) {{
  action(actionId: $a) {{ searchMemories(first: 1, after: $after, kind: $kind, labels: $labels,
    ids: $ids) {{ {PAGE_INFO} }} }} }}"""
TURN = """mutation($a: UUID!, $s: String!) {
  executeAction(input: {actionId: $a, sessionId: $s, input: "Where is my parcel?"}) {
    executionId status } }"""
SEED = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { memoryIds } }"""
CORRECT = """mutation($a: UUID!, $r: UUID!) {
  addAgentMemory(actionId: $a, input: {summary: "corrected", kind: "fact", scope: AGENT,
    replaces: $r}) { memoryId } }"""
DELETE = """mutation($a: UUID!, $r: UUID!) { deleteAgentMemory(actionId: $a, id: $r) { status } }"""
START_OVER = "leave `after` out to start again from the first page"


def connection(data: dict[str, Any]) -> dict[str, Any]:
    """The one connection an answer holds, however deep."""
    while "pageInfo" not in data:
        (data,) = data.values()
    return data


@dataclass
class Api:
    http: httpx.AsyncClient
    tokens: dict[str, str]

    async def __call__(self, who: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        answer = await self.http.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {self.tokens[who]}"},
        )
        return answer.json()

    async def ok(self, who: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        body = await self(who, query, variables)
        assert "errors" not in body, body["errors"]
        return body["data"]


async def world(state, admin, http: httpx.AsyncClient) -> tuple[Api, dict[str, Any]]:
    """Two agents of the admin's account with sessions, turns, history and records of every
    kind, scope, session, status and version; clients with tokens; another account with
    clients."""
    tenant = await make_account(state, "tenant")
    tokens = {
        "admin": await token_for(
            state,
            admin,
            "lister",
            {
                "effect": "ALLOW",
                "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"],
                "resources": ["financial.*"],
            },
        ),
        "tenant": await token_for(
            state,
            admin,
            "t-admin",
            {"effect": "ALLOW", "actions": ["SELECT", "INSERT"], "resources": ["financial.*"]},
            account_id=tenant,
        ),
    }
    for principal in ("t-one", "t-two"):
        await auth_service.create_client(
            state.pool, admin, account_id=tenant, principal=principal, name=principal, policies=[]
        )
    for principal in ("c1", "c2"):
        await token_for(state, admin, principal)
        await auth_service.issue_client_token(
            state.pool, admin, account_id=None, principal=principal
        )
    api = Api(http, tokens)
    with_history = {**FULL_MEMORY, "history": {}}
    a, b = [str((await make_agent(state, admin, harness=with_history)).action_id) for _ in "ab"]
    await make_agent(state, admin)  # a third agent of the account
    await make_agent(state, admin, name="theirs")  # and one of the tenant's:
    await api.ok("tenant", 'mutation { createAction(input: {name: "t"}) { actionId } }', {})
    executions = []
    for agent in (a, b):
        for session in ("s1", "s1", "s2", "s2"):
            turn = await api.ok("admin", TURN, {"a": agent, "s": session})
            assert turn["executeAction"]["status"] == "SUCCEEDED", turn
            executions.append(turn["executeAction"]["executionId"])
    labelled = [{"name": "customer_id", "value": "42"}]
    inputs = [
        {"summary": f"record {i}", "kind": ("fact", "event")[i % 2], "labels": labelled}
        | ({"scope": "SESSION", "sessionId": f"s{1 + i % 2}"} if i % 3 else {"scope": "AGENT"})
        for i in range(12)
    ]
    ids = {}
    for agent in (a, b):
        ids[agent] = (await api.ok("admin", SEED, {"a": agent, "inputs": inputs}))[
            "addAgentMemories"
        ]["memoryIds"]
    for r in ids[a][:2]:
        corrected = await api.ok("admin", CORRECT, {"a": a, "r": r})
        await api.ok("admin", CORRECT, {"a": a, "r": corrected["addAgentMemory"]["memoryId"]})
    await api.ok("admin", DELETE, {"a": a, "r": ids[a][3]})
    await api.ok("admin", DELETE, {"a": a, "r": ids[a][6]})
    session = {s: global_id("ActionSession", a, s) for s in ("s1", "s2")}
    w = {"a": a, "b": b, "tenant": tenant, "executions": executions, "session": session}
    return api, w | {"deleted": [ids[a][3], ids[a][6]]}  # two versions each


FILTERS = {
    "kind": {"kind": "fact"},
    "label": {"labels": [{"name": "customer_id", "value": "42"}]},
    "scope": {"scope": "SESSION"},
    "preview": {"preview": False},
    "status": {"status": ["ACTIVE", "SUPERSEDED", "DELETED"]},
    "session": {"sessionId": "s1"},
    "sort": {"sort": "ASC"},
}


def _memories_with(filters: dict[str, Any]) -> Any:
    return lambda w: (MEMORIES, "admin", {"a": w["a"]}, "admin", {"a": w["a"], **filters})


# (query, who issues, its variables, who reuses, the other variables); `w` is the world.
CASES = {
    "actions of another account": lambda w: (ACTIONS, "admin", {}, "tenant", {}),
    "clients of another account": lambda w: (
        CLIENTS,
        "admin",
        {},
        "admin",
        {"account": str(w["tenant"])},
    ),
    "tokens of another client": lambda w: (
        TOKENS,
        "admin",
        {"principal": "c1"},
        "admin",
        {"principal": "c2"},
    ),
    "sessions of another agent": lambda w: (
        SESSIONS,
        "admin",
        {"a": w["a"]},
        "admin",
        {"a": w["b"]},
    ),
    "executions of another agent": lambda w: (
        EXECUTIONS,
        "admin",
        {"a": w["a"]},
        "admin",
        {"a": w["b"]},
    ),
    "a session's executions of another session": lambda w: (
        SESSION_EXECUTIONS,
        "admin",
        {"session": w["session"]["s1"]},
        "admin",
        {"session": w["session"]["s2"]},
    ),
    "history of another session": lambda w: (
        SESSION_HISTORY,
        "admin",
        {"session": w["session"]["s1"]},
        "admin",
        {"session": w["session"]["s2"]},
    ),
    "transcript of another execution": lambda w: (
        TRANSCRIPT,
        "admin",
        {"e": w["executions"][0]},
        "admin",
        {"e": w["executions"][1]},
    ),
    "versions of another record": lambda w: (
        RECORD_HISTORY,
        "admin",
        {"a": w["a"], "m": w["deleted"][0]},
        "admin",
        {"a": w["a"], "m": w["deleted"][1]},
    ),
    "memories of another agent": lambda w: (
        MEMORIES,
        "admin",
        {"a": w["a"]},
        "admin",
        {"a": w["b"]},
    ),
    **{
        f"memories with another {name}": _memories_with(filters)
        for name, filters in FILTERS.items()
    },
    # searchMemories without a query lists the newest records: its cursor is bound alike.
    "a query-less search of another agent": lambda w: (
        LISTED,
        "admin",
        {"a": w["a"]},
        "admin",
        {"a": w["b"]},
    ),
    "a query-less search with another kind": lambda w: (
        LISTED,
        "admin",
        {"a": w["a"]},
        "admin",
        {"a": w["a"], "kind": "fact"},
    ),
    "a query-less search with other labels": lambda w: (
        LISTED,
        "admin",
        {"a": w["a"], "kind": "fact"},
        "admin",
        {"a": w["a"], "kind": "fact", "labels": [{"name": "customer_id", "value": "42"}]},
    ),
}
# A cursor of one list passed to a list of the same shape (its parent's other list).
ACROSS = {
    "an agent's executions to one of its sessions'": lambda w: (
        EXECUTIONS,
        "admin",
        {"a": w["a"]},
        SESSION_EXECUTIONS,
        {"session": w["session"]["s1"]},
    ),
    "an agent's memories to its executions": lambda w: (
        MEMORIES,
        "admin",
        {"a": w["a"]},
        EXECUTIONS,
        {"a": w["a"]},
    ),
    "an agent's executions to the account's agents": lambda w: (
        EXECUTIONS,
        "admin",
        {"a": w["a"]},
        ACTIONS,
        {},
    ),
}


@pytest.fixture(scope="module")
async def api_world(pg_server, template_db, embedder) -> AsyncIterator[tuple[Api, dict[str, Any]]]:
    """One world for the module's tests (a worker's share of them), served over HTTP: each
    only reads (a page, then the cursor sent again), so none changes what another finds. Built
    per test it was ~2 s of each one's ~2.3."""
    name = f"engram_cursors_{os.getpid()}"
    with scripted_model() as model:
        async with database_copy(pg_server, template_db, name) as url:
            settings = db_settings(url, model_base_url=model.url, model_max_retries=0)
            async with running_state(settings, url, embedder, model=True) as state:
                admin = await default_admin(state)
                with serving(settings, embedder) as base_url:
                    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
                        yield await world(state, admin, http)


@pytest.mark.parametrize("case", list(CASES))
async def test_a_listing_cursor_is_refused_under_other_arguments(api_world, case):
    api, w = api_world
    query, issuer, issued_with, reuser, other = CASES[case](w)
    first = connection(await api.ok(issuer, query, issued_with))
    assert first["pageInfo"]["hasNextPage"], first
    cursor = first["pageInfo"]["endCursor"]
    # With the arguments it was issued under, the cursor pages on.
    await api.ok(issuer, query, {**issued_with, "after": cursor})
    # The other arguments list something, from the first page.
    await api.ok(reuser, query, other)
    # But the cursor does not page them.
    refused = await api(reuser, query, {**other, "after": cursor})
    assert refused["data"] is None, refused
    assert [e["extensions"]["code"] for e in refused["errors"]] == ["BAD_REQUEST"], refused
    assert START_OVER in refused["errors"][0]["message"]


@pytest.mark.parametrize("case", list(ACROSS))
async def test_a_listing_cursor_is_refused_by_another_list(api_world, case):
    api, w = api_world
    query, who, issued_with, other_query, other = ACROSS[case](w)
    cursor = connection(await api.ok(who, query, issued_with))["pageInfo"]["endCursor"]
    await api.ok(who, other_query, other)
    refused = await api(who, other_query, {**other, "after": cursor})
    assert [e["extensions"]["code"] for e in refused["errors"]] == ["BAD_REQUEST"], refused
    assert START_OVER in refused["errors"][0]["message"]


async def test_the_same_filters_spelled_otherwise_page_on(api_world):
    """Labels and statuses are sets: in another order, or `sort: DESC` said or left out, they
    are the same listing, and its cursor pages it to its end."""
    api, w = api_world
    label = {"name": "customer_id", "value": "42"}
    status = ["ACTIVE", "DELETED"]
    asked = {"a": w["a"], "labels": [label], "status": status}
    respelled = {"a": w["a"], "labels": [label, label], "status": status[::-1], "sort": "DESC"}
    seen, after, spelling = 0, None, [asked, respelled]
    while True:
        page = connection(await api.ok("admin", MEMORIES, {**spelling[seen % 2], "after": after}))
        seen += 1
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == 10  # records 0 to 11 hold the label; 3 and 6 are deleted, 0 and 1 corrected
