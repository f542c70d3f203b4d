"""`searchMemories` pages forward with `after` like every other connection (issue 16, item 5:
the Relay linter's one error). A ranked search's cursor is the (score, created, memory_id) keyset
of the record it follows; a listing's is the listing's (created, memory_id). Paging through with
`after` returns exactly the records of one large page, in its order, on both plans."""

import base64
import json
from datetime import timedelta
from typing import Any

import pytest
from factories import T0, SearchAgent, list_agents, make_search_agent

from app.auth.caller import Caller
from app.memory import search as search_module
from app.state import AppState

PAGE = """
query ($a: UUID!, $q: String, $mode: ActionAgentMemorySearchMode, $first: Int!, $after: String) {
  action(actionId: $a) {
    searchMemories(query: $q, mode: $mode, first: $first, after: $after) {
      edges { cursor score node { memoryId } }
      pageInfo { hasNextPage hasPreviousPage endCursor }
    }
  }
}
"""


@pytest.fixture(params=["exact", "index"])
def plan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "index":
        monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 0)
    return request.param


async def pages(
    gql: Any, admin: Caller, agent: SearchAgent, first: int, **args: Any
) -> list[list[str]]:
    found: list[list[str]] = []
    after = None
    while True:
        result = await gql(admin, PAGE, a=str(agent.action_id), first=first, after=after, **args)
        page = result.ok()["action"]["searchMemories"]
        found.append([e["node"]["memoryId"] for e in page["edges"]])
        assert page["pageInfo"]["hasPreviousPage"] is (after is not None)
        if page["edges"]:
            assert page["pageInfo"]["endCursor"] == page["edges"][-1]["cursor"]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]
        assert len(found) < 20, "paging does not end"


@pytest.mark.parametrize("mode", ["HYBRID", "LEXICAL", "VECTOR"])
async def test_search_memories_pages_with_after(
    state: AppState, admin: Caller, gql: Any, plan: str, mode: str
) -> None:
    agent = await make_search_agent(state, admin)
    texts = [
        "The customer prefers email for invoices",
        "The customer prefers phone calls",
        "Invoices go out on the first of the month",
        "The customer asked about an email invoice twice",
        "Email the customer the invoice",
    ]
    for i, text in enumerate(texts):
        await agent.add(text, created=T0 - timedelta(hours=i))
    # Equal scores (the same text) are ordered newest first, and a page may end among them.
    for i in range(3):
        await agent.add("customer email invoice", created=T0 - timedelta(days=1, hours=i))
    await agent.add("customer email invoice", created=T0 - timedelta(days=3))
    await agent.add("customer email invoice", created=T0 - timedelta(days=3))
    if plan == "index":
        await list_agents(state)  # own indexes: an agent without them is ranked exactly

    q = "customer email invoice"
    whole = await pages(gql, admin, agent, 100, q=q, mode=mode)
    assert len(whole) == 1 and len(whole[0]) >= 7
    for first in (1, 2, 3):
        paged = await pages(gql, admin, agent, first, q=q, mode=mode)
        assert [m for page in paged for m in page] == whole[0], first
        assert all(len(page) == first for page in paged[:-1])


async def test_search_memories_without_query_pages_the_listing(
    state: AppState, admin: Caller, gql: Any
) -> None:
    agent = await make_search_agent(state, admin)
    ids = [str(await agent.add(f"record {i}", created=T0 - timedelta(hours=i))) for i in range(5)]
    assert await pages(gql, admin, agent, 2) == [ids[:2], ids[2:4], ids[4:]]


async def test_search_memories_refuses_a_cursor_of_another_kind(
    state: AppState, admin: Caller, gql: Any
) -> None:
    agent = await make_search_agent(state, admin)
    for i in range(3):
        await agent.add(f"customer record {i}", created=T0 - timedelta(hours=i))
    a = str(agent.action_id)
    listing = (await gql(admin, PAGE, a=a, first=1)).ok()["action"]["searchMemories"]
    ranked = (await gql(admin, PAGE, a=a, q="customer", first=1)).ok()["action"]["searchMemories"]
    # A listing's cursor does not page a ranked search, nor the other way round, nor garbage.
    for q, after in (
        (None, ranked["pageInfo"]["endCursor"]),
        ("customer", listing["pageInfo"]["endCursor"]),
        ("customer", "not-a-cursor"),
    ):
        result = await gql(admin, PAGE, a=a, q=q, first=1, after=after)
        assert result.codes == ["BAD_REQUEST"], (q, after)
        assert "`after`" in result.errors[0]["message"]
    # A ranked search's cursor pages that search only: not another query's, nor another mode's
    # (it would start another ranking at a place it never reached).
    after = ranked["pageInfo"]["endCursor"]
    for q, mode in (("record", None), ("customer", "VECTOR"), ("customer ", "LEXICAL")):
        result = await gql(admin, PAGE, a=a, q=q, mode=mode, first=1, after=after)
        assert result.codes == ["BAD_REQUEST"], (q, mode)
        assert "with the same query, mode and filters" in result.errors[0]["message"]
    same = await gql(admin, PAGE, a=a, q=" customer ", mode="HYBRID", first=1, after=after)
    assert len(same.ok()["action"]["searchMemories"]["edges"]) == 1


@pytest.mark.parametrize("mode", ["LEXICAL", "VECTOR"])
async def test_index_plan_pages_past_its_first_candidates(
    state: AppState, admin: Caller, gql: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A later page's index plan proposes candidates for every record before it: paging 5 at a
    time reaches all 50 matches, past the 40 candidates a first page of 5 reads."""
    monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 0)
    agent = await make_search_agent(state, admin)
    for i in range(50):
        await agent.add(f"invoice number {i} for the customer", created=T0 - timedelta(hours=i))
    await list_agents(state)  # own indexes: an agent without them is ranked exactly
    q = "customer invoice"
    paged = await pages(gql, admin, agent, 5, q=q, mode=mode)
    found = [m for page in paged for m in page]
    assert len(found) == 50 and len(set(found)) == 50
    assert found == (await pages(gql, admin, agent, 100, q=q, mode=mode))[0]


async def test_a_ranked_search_pages_through_its_best_10000(
    state: AppState, admin: Caller, gql: Any
) -> None:
    agent = await make_search_agent(state, admin)
    await agent.add("customer invoice", created=T0)
    a = str(agent.action_id)
    page = (await gql(admin, PAGE, a=a, q="invoice", first=1)).ok()["action"]["searchMemories"]
    cursor = page["pageInfo"]["endCursor"]
    raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    raw[4] = search_module.MAX_DEPTH  # its depth: as deep as a ranked search pages
    deep = base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")
    result = await gql(admin, PAGE, a=a, q="invoice", first=1, after=deep)
    assert result.codes == ["BAD_REQUEST"]
    assert "best 10,000 records" in result.errors[0]["message"]


@pytest.mark.parametrize("first", [1, 2, 3, 5])
async def test_a_ranked_search_ends_at_its_bound_without_promising_more(
    state: AppState, admin: Caller, gql: Any, monkeypatch: pytest.MonkeyPatch, first: int
) -> None:
    """The page that reaches MAX_DEPTH ends the ranking: `hasNextPage` false, not a cursor the
    next request refuses. Its pages hold the best MAX_DEPTH records, in order."""
    monkeypatch.setattr(search_module, "MAX_DEPTH", 5)
    agent = await make_search_agent(state, admin)
    for i in range(8):
        await agent.add(f"invoice number {i}", created=T0 - timedelta(hours=i))
    paged = await pages(gql, admin, agent, first, q="invoice", mode="LEXICAL")
    whole = (await pages(gql, admin, agent, 100, q="invoice", mode="LEXICAL"))[0]
    assert [m for page in paged for m in page] == whole[:5]
    assert all(paged), "an empty page"
