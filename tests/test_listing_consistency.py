"""An operator pages through an agent's lists over HTTP while other clients keep writing: each
item that stayed unchanged for the whole paging run comes back exactly once, no item twice,
pages in the list's order, and `hasNextPage` with `endCursor` lead to the end without an empty
page that promises more. Many rows share a `created` timestamp (written in one transaction, or
set to one instant), so the cursor's tie-break is what keeps them apart."""

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from factories import T0, allow, make_agent, make_search_agent, token_for

from app.memory import maintenance
from app.state import AppState

PAGE = 7  # small pages: many page boundaries fall inside runs of tied rows


class Api:
    def __init__(self, http: httpx.AsyncClient, token: str) -> None:
        self.http, self.token = http, token

    async def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = await self.http.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        body = answer.json()
        assert "errors" not in body, body["errors"]
        return body["data"]


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def page_through(
    api: Api, query: str, path: Callable[[dict[str, Any]], dict[str, Any]], **variables: Any
) -> tuple[list[dict[str, Any]], int]:
    """Every node of one paging run, and how many pages it took; checks each page's pageInfo."""
    nodes: list[dict[str, Any]] = []
    after = None
    pages = 0
    while True:
        connection = path(await api(query, after=after, **variables))
        edges = connection["edges"]
        info = connection["pageInfo"]
        pages += 1
        assert info["hasPreviousPage"] is (after is not None)
        if edges:
            assert info["startCursor"] == edges[0]["cursor"]
            assert info["endCursor"] == edges[-1]["cursor"]
        else:
            assert info["endCursor"] is None
            assert not info["hasNextPage"], "an empty page says more follows"
        nodes += [e["node"] for e in edges]
        if not info["hasNextPage"]:
            return nodes, pages
        assert info["endCursor"] != after, "the next page's cursor is this page's"
        after = info["endCursor"]
        assert pages < 10_000, "paging does not end"
        await asyncio.sleep(0)  # the writers run between pages


def check_run(
    nodes: list[dict[str, Any]],
    key: Callable[[dict[str, Any]], Any],
    ident: str,
    unchanged: set[str],
    descending: bool,
) -> None:
    ids = [n[ident] for n in nodes]
    twice = {i for i in ids if ids.count(i) > 1}
    assert not twice, f"{len(twice)} items came back twice"
    missing = unchanged - set(ids)
    assert not missing, f"{len(missing)} items unchanged all along were never returned"
    keys = [key(n) for n in nodes]
    assert keys == sorted(keys, reverse=descending), "pages are out of order"


MEMORIES = """
query($a: UUID!, $after: String, $sort: SortOrder, $kind: String, $scope: ActionAgentMemoryScope,
      $labels: [AgentMemoryLabelInput!], $status: [ActionAgentMemoryStatus!], $preview: Boolean) {
  action(actionId: $a) {
    memories(first: 7, after: $after, sort: $sort, kind: $kind, scope: $scope, labels: $labels,
             status: $status, preview: $preview) {
      edges { cursor node { memoryId created kind scope status } }
      pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    }
  }
}"""

SEED = """
mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { memoryIds }
}"""

ADD = """
mutation($a: UUID!, $input: AgentMemoryInput!) {
  addAgentMemory(actionId: $a, input: $input) { memoryId }
}"""

DELETE = """
mutation($a: UUID!, $m: UUID!) { deleteAgentMemory(actionId: $a, id: $m) { memoryId } }"""


def seed_input(i: int) -> dict[str, Any]:
    scoped = {"scope": "SESSION", "sessionId": f"s{i % 5}"} if i % 2 else {"scope": "AGENT"}
    return {
        "summary": f"seeded fact {i}",
        "kind": "fact" if i % 3 else "event",
        "labels": [{"name": "customer_id", "value": str(i % 4)}],
        **scoped,
    }


# Each run's filter, and which seeded inputs (by index) it lists while unchanged.
RUNS: list[tuple[dict[str, Any], Callable[[int], bool]]] = [
    ({"sort": "DESC"}, lambda i: True),
    ({"sort": "ASC"}, lambda i: True),
    ({"kind": "event"}, lambda i: i % 3 == 0),
    ({"kind": "fact", "sort": "ASC"}, lambda i: i % 3 != 0),
    ({"scope": "SESSION"}, lambda i: i % 2 == 1),
    ({"scope": "AGENT", "sort": "ASC"}, lambda i: i % 2 == 0),
    ({"labels": [{"name": "customer_id", "value": "1"}]}, lambda i: i % 4 == 1),
    ({"labels": [{"name": "customer_id", "value": "2"}], "sort": "ASC"}, lambda i: i % 4 == 2),
    ({"status": ["ACTIVE", "SUPERSEDED", "DELETED"]}, lambda i: True),
    ({"status": ["ACTIVE"], "sort": "ASC"}, lambda i: True),
    ({"preview": False}, lambda i: True),
]


async def test_memory_listings_page_whole_while_records_are_added_superseded_and_deleted(
    state: AppState, admin, base_url: str
) -> None:
    token = await token_for(
        state, admin, "operator", allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.*")
    )
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        api = Api(http, token)
        seeded: list[str] = []
        for batch in range(4):
            inputs = [seed_input(i) for i in range(batch * 150, (batch + 1) * 150)]
            ids = (await api(SEED, a=a, inputs=inputs))["addAgentMemories"]["memoryIds"]
            seeded += ids
            # Ties: each batch's records at one instant (addAgentMemories times each record
            # apart, as a turn's writes are not).
            async with state.pool.acquire() as conn:
                await conn.execute(
                    "UPDATE agent_memories SET created = $2 WHERE memory_id = any($1::uuid[])",
                    ids,
                    datetime(2026, 6, 1, batch, tzinfo=UTC),
                )
        first = (await api(MEMORIES, a=a, sort="ASC"))["action"]["memories"]["edges"]
        assert len({e["node"]["created"] for e in first}) == 1, "the seed's records are not tied"

        touched: set[str] = set()
        pool = list(range(len(seeded)))
        random.Random(145).shuffle(pool)
        stop = asyncio.Event()
        writes = {"added": 0, "superseded": 0, "deleted": 0}

        async def write() -> None:
            for n in itertools.count():
                if stop.is_set() or not pool:
                    return
                if n % 3 == 0:
                    await api(ADD, a=a, input={**seed_input(n), "summary": f"new fact {n}"})
                    writes["added"] += 1
                elif n % 3 == 1:
                    i = pool.pop()
                    touched.add(seeded[i])
                    replaced = {**seed_input(i), "summary": f"corrected {i}", "replaces": seeded[i]}
                    await api(ADD, a=a, input=replaced)
                    writes["superseded"] += 1
                else:
                    i = pool.pop()
                    touched.add(seeded[i])
                    await api(DELETE, a=a, m=seeded[i])
                    writes["deleted"] += 1
                await asyncio.sleep(0.005)

        writers = [asyncio.create_task(write()) for _ in range(2)]
        try:
            for filters, listed in RUNS:
                nodes, pages = await page_through(
                    api, MEMORIES, lambda d: d["action"]["memories"], a=a, **filters
                )
                unchanged = {m for i, m in enumerate(seeded) if listed(i)} - touched
                check_run(
                    nodes,
                    lambda n: (instant(n["created"]), n["memoryId"]),
                    "memoryId",
                    unchanged,
                    descending=filters.get("sort", "DESC") == "DESC",
                )
                assert pages >= len(unchanged) // PAGE
        finally:
            stop.set()
            await asyncio.gather(*writers)
        assert all(writes.values()), writes


SESSIONS = """
query($a: UUID!, $after: String) {
  action(actionId: $a) {
    sessions(first: 7, after: $after) {
      edges { cursor node { sessionId created } }
      pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    }
  }
}"""

EXECUTIONS = """
query($a: UUID!, $after: String) {
  action(actionId: $a) {
    executions(first: 7, after: $after) {
      edges { cursor node { executionId created } }
      pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    }
  }
}"""

SESSION_EXECUTIONS = """
query($a: UUID!, $after: String) {
  action(actionId: $a) {
    sessions(first: 1) {
      nodes {
        executions(first: 7, after: $after) {
          edges { cursor node { executionId created } }
          pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
        }
      }
    }
  }
}"""


async def test_sessions_and_executions_page_whole_while_others_are_written(
    state: AppState, admin, base_url: str
) -> None:
    token = await token_for(
        state, admin, "operator", allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.*")
    )
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        api = Api(http, token)
        for i in range(120):  # an execution each; 40 sessions of 3
            memory = {"summary": f"fact {i}", "kind": "fact", "sessionId": f"s{i % 40}"}
            await api(ADD, a=a, input=memory)
        # Ties: half the sessions and executions at one instant, as rows written in one
        # transaction would be.
        async with state.pool.acquire() as conn:
            await conn.execute(
                "UPDATE sessions SET created = '2026-06-01T00:00:00Z' WHERE action_id = $1"
                " AND session_id < 's3'",
                agent.action_id,
            )
            await conn.execute(
                "UPDATE executions SET created = '2026-06-01T00:00:00Z' WHERE action_id = $1"
                " AND session_id < 's3'",
                agent.action_id,
            )
        sessions = {
            n["sessionId"]
            for n in (await page_through(api, SESSIONS, lambda d: d["action"]["sessions"], a=a))[0]
        }
        executions = {
            n["executionId"]
            for n in (
                await page_through(api, EXECUTIONS, lambda d: d["action"]["executions"], a=a)
            )[0]
        }
        assert len(sessions) == 40 and len(executions) == 120

        stop = asyncio.Event()

        async def write() -> None:
            for n in itertools.count():
                if stop.is_set():
                    return
                memory = {"summary": f"new {n}", "kind": "fact", "sessionId": f"new-{n % 9}"}
                await api(ADD, a=a, input=memory)
                await asyncio.sleep(0.005)

        writers = [asyncio.create_task(write()) for _ in range(2)]
        try:
            for _ in range(3):
                nodes, _ = await page_through(api, SESSIONS, lambda d: d["action"]["sessions"], a=a)
                check_run(
                    nodes,
                    lambda n: (instant(n["created"]), n["sessionId"]),
                    "sessionId",
                    sessions,
                    descending=True,
                )
                nodes, _ = await page_through(
                    api, EXECUTIONS, lambda d: d["action"]["executions"], a=a
                )
                check_run(
                    nodes,
                    lambda n: (instant(n["created"]), n["executionId"]),
                    "executionId",
                    executions,
                    descending=True,
                )
        finally:
            stop.set()
            await asyncio.gather(*writers)


CLIENTS = """
query($after: String) {
  clients(first: 7, after: $after) {
    edges { cursor node { principal } }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
  }
}"""

TOKENS = """
query($p: String!, $after: String) {
  client(principal: $p) {
    tokens(first: 7, after: $after) {
      edges { cursor node { tokenId created } }
      pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    }
  }
}"""

NEW_CLIENT = """
mutation($p: String!) { createClient(input: {principal: $p, name: $p, policies: []}) { principal } }
"""
DROP_CLIENT = """mutation($p: String!) { deleteClient(principal: $p) { principal } }"""
NEW_TOKEN = """mutation($p: String!) { createClientToken(principal: $p) { tokenId } }"""
REVOKE = """
mutation($p: String!, $t: UUID!) { revokeClientToken(principal: $p, tokenId: $t) { tokenId } }"""


async def test_clients_and_tokens_page_whole_while_others_are_created_and_deleted(
    state: AppState, admin, base_url: str
) -> None:
    token = await token_for(
        state, admin, "operator", allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.*")
    )
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        api = Api(http, token)
        # Principals whose order differs between byte order and a language's collation.
        principals = [f"{p}-{i}" for i in range(12) for p in ("a", "B", "z", "A_x", "0x", "a.b")]
        for p in principals:
            await api(NEW_CLIENT, p=p)
        tokens = [
            (await api(NEW_TOKEN, p="a-0"))["createClientToken"]["tokenId"] for _ in range(60)
        ]
        async with state.pool.acquire() as conn:
            await conn.execute(
                "UPDATE client_tokens SET created = '2026-06-01T00:00:00Z' WHERE principal = 'a-0'"
            )
        stop = asyncio.Event()
        doomed = [p for p in principals if p.endswith(("-3", "-7"))]
        revoked = tokens[::5]

        async def write() -> None:
            for n in itertools.count():
                if stop.is_set():
                    return
                await api(NEW_CLIENT, p=f"new-{n}-{random.random():.6f}")
                if doomed:
                    await api(DROP_CLIENT, p=doomed.pop())
                if revoked:
                    await api(REVOKE, p="a-0", t=revoked.pop())
                await api(NEW_TOKEN, p="a-0")
                await asyncio.sleep(0.005)

        steady_clients = set(principals) - set(doomed)
        steady_tokens = set(tokens) - set(revoked)
        writer = asyncio.create_task(write())
        try:
            for _ in range(3):
                nodes, _ = await page_through(api, CLIENTS, lambda d: d["clients"])
                ids = [n["principal"] for n in nodes]
                assert len(ids) == len(set(ids))
                assert steady_clients - {p for p in principals if p in doomed} <= set(ids)
                nodes, _ = await page_through(api, TOKENS, lambda d: d["client"]["tokens"], p="a-0")
                check_run(
                    nodes,
                    lambda n: (instant(n["created"]), n["tokenId"]),
                    "tokenId",
                    steady_tokens - set(revoked),
                    descending=True,
                )
        finally:
            stop.set()
            await writer


SEARCH = """
query($a: UUID!, $q: String, $mode: ActionAgentMemorySearchMode, $after: String) {
  action(actionId: $a) {
    searchMemories(query: $q, mode: $mode, first: 5, after: $after) {
      edges { cursor score node { memoryId created } }
      pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    }
  }
}"""


async def search_pages(
    http: httpx.AsyncClient,
    token: str,
    a: str,
    query: str | None,
    mode: str | None,
    between: Callable[[int], Awaitable[None]],
) -> list[dict[str, Any]]:
    """Every node (with its score) of one paging run of `searchMemories`, 5 at a time;
    `between(pages)` runs after each page that promises another."""
    api = Api(http, token)
    nodes: list[dict[str, Any]] = []
    after = None
    pages = 0
    while True:
        page = (await api(SEARCH, a=a, q=query, mode=mode, after=after))["action"]["searchMemories"]
        nodes += [{**e["node"], "score": e["score"]} for e in page["edges"]]
        pages += 1
        if not page["pageInfo"]["hasNextPage"]:
            return nodes
        after = page["pageInfo"]["endCursor"]
        await between(pages)
        assert pages < 100, "paging does not end"


def ranked_key(node: dict[str, Any]) -> tuple[float, datetime, str]:
    return node["score"], instant(node["created"]), node["memoryId"]


@pytest.mark.parametrize(
    ("mode", "indexed"),
    [
        ("VECTOR", False),
        (None, False),
        ("HYBRID", False),
        ("LEXICAL", False),
        ("HYBRID", True),
        ("LEXICAL", True),
    ],
)
async def test_search_pages_whole_while_records_are_added(
    state: AppState, admin, base_url: str, mode: str | None, indexed: bool
) -> None:
    """Records unchanged while others are added come back once each, in the order of their
    scores (docs/graphql.md). A vector search's score is the record's own; a search without a
    query is the listing; hybrid and lexical scores weigh each word by how many of the agent's
    records hold it and hybrid divides by the best match's, so a later page ranks with its
    first page's weights and best match, which its cursor carries. `indexed`: the agent has
    its own indexes and counts (the index plan), recounted between pages as it grows."""
    token = await token_for(state, admin, "operator", allow(["SELECT", "INSERT"], "financial.*"))
    agent = await make_search_agent(state, admin)
    words = ["invoice", "email", "customer", "parcel", "refund", "berlin", "order", "phone"]
    rnd = random.Random(145)
    query = "customer invoice email" if mode else None
    texts = [" ".join(rnd.sample(words, 3)) for _ in range(60)]
    added = [await agent.add(t, created=T0 - timedelta(hours=i // 4)) for i, t in enumerate(texts)]
    ids = {
        str(memory_id)
        for memory_id, text in zip(added, texts, strict=True)
        # In lexical mode, those sharing a word with the query.
        if mode != "LEXICAL" or set(text.split()) & {"customer", "invoice", "email"}
    }
    a = str(agent.action_id)
    recounts = 0

    async def recount() -> None:
        nonlocal recounts
        done = await maintenance.run_round(state.pool, min_records=30)
        assert done is not None
        recounts += done.counted

    if indexed:
        await recount()
        assert recounts
    more = 0

    async def write(pages: int) -> None:
        nonlocal more
        for _ in range(3):  # between pages, records that hold the query's words
            await agent.add(" ".join(rnd.sample(words, 3)) + " customer invoice")
            more += 1
        if indexed:
            await recount()

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        nodes = await search_pages(http, token, a, query, mode, write)
    key = ranked_key if mode else (lambda n: (instant(n["created"]), n["memoryId"]))
    check_run(nodes, key, "memoryId", ids, descending=True)
    assert more
    if indexed:  # the words were counted again while paging: their weights moved
        assert recounts > 1


@pytest.mark.parametrize(
    ("mode", "query"),
    [
        ("HYBRID", "customer invoice email"),
        ("VECTOR", "customer invoice email"),
        ("LEXICAL", "customer invoice email parcel refund berlin order phone"),  # > 6 words
    ],
)
async def test_search_pages_whole_after_more_records_above_its_cursor_than_it_reads(
    state: AppState, admin, base_url: str, mode: str, query: str
) -> None:
    """On the index plan a later page reads candidates for the records before its cursor and
    its own: 60 records written above the cursor between two pages of 5 (more than the 40
    candidates each list reads) took their places, and the second page came back empty,
    ending the search with 55 unchanged records never returned. Such a page is ranked again
    as deep as the records above its cursor reach."""
    token = await token_for(state, admin, "operator", allow(["SELECT", "INSERT"], "financial.*"))
    agent = await make_search_agent(state, admin)
    words = ["invoice", "email", "customer", "parcel", "refund", "berlin", "order", "phone"]
    rnd = random.Random(149)
    ids = {
        str(await agent.add(" ".join(rnd.sample(words, 3)), created=T0 - timedelta(hours=i // 4)))
        for i in range(60)
    }
    done = await maintenance.run_round(state.pool, min_records=30)  # own indexes: index plan
    assert done is not None and done.counted
    a = str(agent.action_id)

    async def write(pages: int) -> None:
        if pages == 1:  # after the first page, records that rank above its cursor
            for i in range(60):
                await agent.add(f"{query} note {i}", created=T0 + timedelta(minutes=i))
            await maintenance.run_round(state.pool, min_records=30)

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        nodes = await search_pages(http, token, a, query, mode, write)
    key = ranked_key
    check_run(nodes, key, "memoryId", ids, descending=True)


HISTORY = """
query($a: UUID!, $after: String) {
  action(actionId: $a) {
    sessions(first: 1) {
      nodes {
        history(first: 7, after: $after) {
          edges { cursor node { eventId turn sequence } }
          pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
        }
      }
    }
  }
}"""

AGENTS = """
query($after: String) {
  actions(first: 7, after: $after) {
    edges { cursor node { actionId created } }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
  }
}"""

TURN = """
mutation($input: ExecuteActionInput!) { executeAction(input: $input) { status turn } }"""


@pytest.mark.usefixtures("model_server")
async def test_history_and_agents_page_whole_while_turns_run_and_agents_change(
    state: AppState, admin, base_url: str
) -> None:
    token = await token_for(
        state, admin, "operator", allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.*")
    )
    agent = await make_agent(state, admin, harness={"history": {"index": "messages"}})
    a = str(agent.action_id)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        api = Api(http, token)
        for i in range(25):
            turn = {"actionId": a, "sessionId": "s1", "input": f"message {i}"}
            assert (await api(TURN, input=turn))["executeAction"]["status"] == "SUCCEEDED"
        kept, _ = await page_through(
            api, HISTORY, lambda d: d["action"]["sessions"]["nodes"][0]["history"], a=a
        )
        assert len(kept) == 50  # the user's message and the agent's answer, each turn
        agents = [await make_agent(state, admin, name=f"agent {i}") for i in range(30)]
        async with state.pool.acquire() as conn:  # ties: half the agents created at one instant
            await conn.execute(
                "UPDATE actions SET created = '2026-06-01T00:00:00Z'"
                " WHERE action_id = any($1::uuid[])",
                [x.action_id for x in agents[::2]],
            )
        stop, turned = asyncio.Event(), asyncio.Event()

        async def write() -> None:
            for n in itertools.count():
                if stop.is_set():
                    return
                preview = n % 3 == 2
                turn = {"actionId": a, "sessionId": "s1", "input": f"new {n}", "preview": preview}
                await api(TURN, input=turn)
                turned.set()
                await make_agent(state, admin, name=f"new agent {n}")
                await asyncio.sleep(0.005)

        writer = asyncio.create_task(write())
        try:
            for _ in range(3):
                # A turn kept since the last paging, and more keep coming as this one pages (on
                # a loaded machine a whole paging could otherwise end before the first turn).
                await asyncio.wait_for(turned.wait(), 60)
                turned.clear()
                nodes, _ = await page_through(
                    api, HISTORY, lambda d: d["action"]["sessions"]["nodes"][0]["history"], a=a
                )
                check_run(
                    nodes,
                    lambda n: (n["turn"], n["sequence"]),
                    "eventId",
                    {n["eventId"] for n in kept},
                    descending=False,
                )
                assert len(nodes) > len(kept), "the turns kept since are not in the history"
                nodes, _ = await page_through(api, AGENTS, lambda d: d["actions"])
                check_run(
                    nodes,
                    lambda n: (instant(n["created"]), n["actionId"]),
                    "actionId",
                    {str(x.action_id) for x in agents},
                    descending=True,
                )
        finally:
            stop.set()
            await writer
