"""A stored vector without a direction (of zeros, or of values whose squares pgvector's float4
sums cannot hold) has no cosine: pgvector makes it NaN. Such a vector is not stored any more
(the embedders and the import), and one a release before stored is read as no vector: its
record or history part is found by its words alone, and every search of its agent answers."""

import io
import json
from typing import Any

import pytest
from factories import (
    allow,
    list_agents,
    make_account,
    make_agent,
    make_agent_id,
    remember,
    token_for,
)
from runtime_support import run
from servers import posted_graphql

from app.memory import search as search_module
from app.transfer.service import export_action, import_file

SEARCH = """query($a: UUID!, $q: String!, $m: ActionAgentMemorySearchMode) {
  action(actionId: $a) { searchMemories(query: $q, mode: $m, first: 10) {
    edges { score node { memoryId } } pageInfo { hasNextPage endCursor } } } }"""
HISTORY = """query($a: UUID!, $q: String!) { action(actionId: $a) { sessions(first: 5) {
  nodes { searchHistory(query: $q, first: 10) { score text event { eventId } } } } } }"""
EVERY_VERB = ["SELECT", "INSERT", "UPDATE", "DELETE"]


# M20 M21
@pytest.mark.parametrize("plan", ["exact", "index"])
async def test_m20_a_record_whose_vector_has_no_direction_is_found_by_its_words(
    state, admin, base_url, monkeypatch, plan
):
    # A NaN cosine ranked the record first, with a NaN score no answer carries: every hybrid
    # and vector search of the agent that read it failed ("Float cannot represent non numeric
    # value: nan").
    if plan == "index":
        monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 0)
    agent = await make_agent(state, admin)
    texts = ("the office is in Oslo", "the office moved to Bergen", "Oslo has a fjord")
    zero, *others = [await remember(state, agent, t, scope="AGENT") for t in texts]
    async with state.pool.acquire() as conn:  # as a release before may have stored it
        await conn.execute(
            "UPDATE agent_memories SET embedding = array_fill(0::real,"
            " ARRAY[vector_dims(embedding)])::vector WHERE memory_id = $1",
            zero.memory_id,
        )
    if plan == "index":
        await list_agents(state)  # own indexes: an agent without them is ranked exactly
    token = await token_for(state, admin, "console", allow(EVERY_VERB, "*"))
    a = str(agent.action_id)
    hybrid = await posted_graphql(base_url, token, SEARCH, a=a, q="office Oslo", m="HYBRID")
    edges = hybrid["action"]["searchMemories"]["edges"]
    assert {e["node"]["memoryId"] for e in edges} == {str(r.memory_id) for r in (zero, *others)}
    # Found by its words: its score is the text part of the fusion alone, at most one half.
    scored = {e["node"]["memoryId"]: e["score"] for e in edges}
    assert 0 < scored[str(zero.memory_id)] <= 0.5
    vector = await posted_graphql(base_url, token, SEARCH, a=a, q="office Oslo", m="VECTOR")
    found = [e["node"]["memoryId"] for e in vector["action"]["searchMemories"]["edges"]]
    assert sorted(found) == sorted(str(r.memory_id) for r in others)


# H6
@pytest.mark.usefixtures("model_server")
async def test_h6_a_history_part_whose_vector_has_no_direction_is_found_by_its_words(
    state, admin, gql, base_url
):
    action_id = await make_agent_id(state, admin, harness={"history": {"index": "messages"}})
    for message in ("The lighthouse is white.", "The harbour is small."):
        assert (await run(gql, admin, action_id, message))["status"] == "SUCCEEDED"
    async with state.pool.acquire() as conn:
        zeroed = await conn.fetchval(
            "UPDATE history_parts SET embedding = array_fill(0::real,"
            " ARRAY[vector_dims(embedding)])::vector WHERE text LIKE '%lighthouse%'"
            " RETURNING event_id"
        )
    token = await token_for(state, admin, "console", allow(EVERY_VERB, "*"))
    found = await posted_graphql(base_url, token, HISTORY, a=action_id, q="lighthouse")
    (session,) = found["action"]["sessions"]["nodes"]
    results = session["searchHistory"]
    assert results[0]["event"]["eventId"] == str(zeroed)
    assert 0 < results[0]["score"] <= 0.5  # its words' part of the fusion alone
    assert all(r["score"] == r["score"] for r in results)  # no NaN


SEARCH_ONE = """query($a: UUID!, $q: String!) { action(actionId: $a) {
  searchMemories(query: $q, mode: VECTOR, first: 10) { edges { score node { memoryId } } } } }"""


@pytest.mark.parametrize("values", [0.0, 1e20])
async def test_an_import_embeds_again_a_record_whose_vector_has_no_direction(
    state, admin, base_url, values
):
    # An edited file (or one a release before exported with such a vector) whose record's
    # vector is zeros, or values whose squares pass float4: it was copied, and every vector
    # or hybrid search of the imported agent failed on its NaN cosine. It is embedded again,
    # as a record the file has no vector for is, and found by meaning.
    agent = await make_agent(state, admin)
    kept, edited = [
        await remember(state, agent, text, scope="AGENT")
        for text in ("the office is in Oslo", "the invoice goes out by post")
    ]
    out = io.StringIO()
    await export_action(state.pool, account_id=admin.account_id, action_id=agent.action_id, out=out)
    lines = []
    for line in out.getvalue().splitlines():
        item = json.loads(line)
        if item["type"] == "memory" and item["row"]["memory_id"] == str(edited.memory_id):
            dimensions = len(json.loads(item["row"]["embedding"]))
            item["row"]["embedding"] = "[" + ",".join([repr(values)] * dimensions) + "]"
            line = json.dumps(item)
        lines.append(line)
    other = await make_account(state, "other")

    async def embedder() -> Any:
        return state.embedder

    result = await import_file(state.pool, account_id=other, lines=lines, open_embedder=embedder)
    assert result.vectors == "copied" and result.reembedded == 1
    async with state.pool.acquire() as conn:
        stored = {
            r["memory_id"]: r["pointless"]
            for r in await conn.fetch(
                "SELECT memory_id, (embedding <=> embedding) = 'NaN' AS pointless"
                " FROM agent_memories WHERE account_id = $1",
                other,
            )
        }
    assert stored == {kept.memory_id: False, edited.memory_id: False}
    token = await token_for(state, admin, "console", allow(EVERY_VERB, "*"), account_id=other)
    found = await posted_graphql(
        base_url, token, SEARCH_ONE, a=str(agent.action_id), q="invoice by post"
    )
    edges = found["action"]["searchMemories"]["edges"]
    assert edges[0]["node"]["memoryId"] == str(edited.memory_id) and edges[0]["score"] > 0.5
