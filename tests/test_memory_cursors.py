"""Crafted cursors, IDs and bounds on the memory API are the client's error (BAD_REQUEST) with a
message saying what to send, never an internal error."""

import base64
import io
import json
import math
import struct
import uuid
from typing import Any

import httpx
import pytest
from factories import allow, list_agents, make_account, make_agent, remember, token_for

from app.db import cursors
from app.errors import BadInput
from app.graphql.relay import CREATED_ID, global_id
from app.memory import search as search_module
from app.memory.search import search
from app.memory.visibility import OperatorReader
from app.transfer.service import export_action, import_file

MEMORIES = """query($a: UUID!, $after: String) {
  action(actionId: $a) { memories(first: 5, after: $after) { nodes { memoryId } } } }"""
FIRST_PAGE = """query($a: UUID!) {
  action(actionId: $a) { memories(first: 1) { pageInfo { endCursor } } } }"""
HISTORY = """query($a: UUID!, $id: UUID!, $after: String) {
  agentMemory(actionId: $a, id: $id) { history(first: 5, after: $after) { nodes { version } } } }"""
SEARCH = """query($a: UUID!, $q: String, $ids: [UUID!], $first: Int!) {
  action(actionId: $a) { searchMemories(query: $q, ids: $ids, first: $first) {
    nodes { memoryId } pageInfo { hasNextPage } } } }"""
NODE = "query($id: ID!) { node(id: $id) { ... on ActionAgentMemory { memoryId version } } }"
SOME_ID = str(uuid.uuid4())


def cursor(value: Any) -> str:
    raw = value if isinstance(value, str) else json.dumps(value)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


KEYSETS = {
    "uuid as a number": cursor([{"t": "2026-01-01T00:00:00+00:00"}, {"u": 5}]),
    "timestamp as a number": cursor([{"t": 5}, {"u": SOME_ID}]),
    "timestamp without a zone": cursor([{"t": "2026-01-01T00:00:00"}, {"u": SOME_ID}]),
    "timestamp out of range": cursor([{"t": "0001-01-01T00:00:00+14:00"}, {"u": SOME_ID}]),
    "unknown object": cursor([{"x": 1}, {"u": SOME_ID}]),
    "two keys": cursor([{"t": "2026-01-01T00:00:00+00:00", "u": SOME_ID}, {"u": SOME_ID}]),
    "wrong arity": cursor([{"u": SOME_ID}]),
    "not a list": cursor({"u": SOME_ID}),
    "nested deep": cursor("[" * 100_000 + "]" * 100_000),
    "not base64": "%%%",
    "not JSON": cursor("{"),
}
VERSIONS = {
    "beyond int4": cursor([2**31]),
    "below int4": cursor([-(2**31) - 1]),
    "a boolean": cursor([True]),
    "a float": cursor([1.5]),
    "null": cursor([None]),
    "text with NUL": cursor(["a\u0000b"]),
}


def bound_as(crafted: str, issued: str) -> str:
    """`crafted` as the list would read it: its values after the binding of a cursor the list
    issued (app/db/cursors.py, Keyset.bound), so that what is refused is the values."""
    try:
        values = cursors.unpack(crafted)
    except Exception:
        return crafted
    if not isinstance(values, list):
        return crafted
    return cursors.pack([cursors.unpack(issued)[0], *values])


# M56
@pytest.mark.parametrize("name", list(KEYSETS))
async def test_m56_crafted_listing_cursors_are_bad_requests(state, gql, admin, name):
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    for summary in ("one", "two"):
        await remember(state, agent, summary, scope="AGENT")
    issued = (await gql(admin, FIRST_PAGE, a=a)).ok()["action"]["memories"]["pageInfo"]["endCursor"]
    result = await gql(admin, MEMORIES, a=a, after=bound_as(KEYSETS[name], issued))
    assert result.codes == ["BAD_REQUEST"], result.errors
    assert "cursor" in result.errors[0]["message"]


# M59
@pytest.mark.parametrize("name", list(VERSIONS))
async def test_m59_crafted_history_cursors_are_bad_requests(state, gql, admin, name):
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "a record", scope="AGENT")
    a, id_ = str(agent.action_id), str(record.memory_id)
    listed = await gql(admin, HISTORY.replace("nodes", "edges { cursor } nodes"), a=a, id=id_)
    issued = listed.ok()["agentMemory"]["history"]["edges"][0]["cursor"]
    result = await gql(admin, HISTORY, a=a, id=id_, after=bound_as(VERSIONS[name], issued))
    assert result.codes == ["BAD_REQUEST"], result.errors
    # The cursors the connection issues still page.
    after_2 = bound_as(cursors.pack([2]), issued)
    assert (await gql(admin, HISTORY, a=a, id=id_, after=after_2)).ok()["agentMemory"]["history"][
        "nodes"
    ] == [{"version": 1}]


def test_m56_issued_cursors_decode_to_their_values() -> None:
    from datetime import UTC, datetime

    instant = datetime(2026, 1, 1, 12, tzinfo=UTC)
    memory_id = uuid.uuid4()
    assert CREATED_ID.decode(CREATED_ID.encode(instant, memory_id)) == (instant, memory_id)
    assert cursors.Keyset(cursors.INT4).decode(cursors.pack([2**31 - 1])) == (2**31 - 1,)
    assert cursors.Keyset(cursors.TEXT).decode(cursors.pack(["chat-1"])) == ("chat-1",)


def test_m56_each_kind_writes_the_json_of_its_value() -> None:
    # A kind's fast `text` writes exactly what json.dumps writes of the value it dumps, so a
    # cursor is the same string either way, and reads back to the same value.
    from datetime import UTC, datetime, timedelta, timezone

    samples = {
        cursors.INT4: [0, -1, 2**31 - 1, -(2**31)],
        cursors.SEQUENCE: [0, 7, 2**31 - 1],
        cursors.COUNT: [1, 10_000, 2**63],
        cursors.SCORE: [0.0, -0.0, 0.1, 1 / 3, 0.7234567891234, 1e-7, 5e-324, -2.5, 1e300],
        cursors.constant("ranked"): ["ranked"],
        cursors.TEXT: ["chat-1", 'a "quoted" \\ line\n', "caf\u00e9 \u2028 \U0001f600"],
        cursors.INSTANT_TEXT: [datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)],
        cursors.INSTANT: [datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5)))],
        cursors.ID_TEXT: [uuid.uuid4()],
        cursors.ID: [uuid.uuid4()],
        cursors.WEIGHTS: [None, (), (1.0,), (0.1, 1 / 3, 2.302585092994046, 1e-30, 0.0, 1e6)],
        cursors.BEST: [None, 0.1, 1 / 3, 7.25, 1e-12, 1e12],
    }
    for kind, values in samples.items():
        for value in values:
            written = kind.text(value)
            assert written == json.dumps(kind.dump(value), separators=(",", ":")), value
            assert kind.load(json.loads(written)) == value


SEARCH_CURSORS = {
    **KEYSETS,
    "search cursor with a number for the ID": cursor(["2026-01-01T00:00:00+00:00", 5]),
    "search cursor without a zone": cursor(["2026-01-01T00:00:00", SOME_ID]),
}


# M38
@pytest.mark.parametrize("name", list(SEARCH_CURSORS))
async def test_m38_crafted_search_cursors_are_bad_input(state, admin, name):
    agent = await make_agent(state, admin)
    reader = OperatorReader(admin.account_id, agent.action_id)
    with pytest.raises(BadInput, match="cursor"):
        await search(
            state.pool,
            state.embedder,
            reader,
            agent.harness.memory.search,
            query=None,
            after=SEARCH_CURSORS[name],
        )


def packed(*weights: float) -> str:
    return base64.urlsafe_b64encode(struct.pack(f"<{len(weights)}d", *weights)).decode()


# A ranked cursor's weights and best text score (the first page's, which later pages rank by),
# crafted: each is refused, not ranked by.
WEIGHTS = {
    "weights not base64": (["%%%"], None),
    "weights not whole numbers": (["AAAA"], None),
    "a weight not a number": ([packed(math.nan)], None),
    "an infinite weight": ([packed(1.0, math.inf)], None),
    "a negative weight": ([packed(-1.0)], None),
    "too many weights": ([packed(*[1.0] * (cursors.MAX_WEIGHTS + 1))], None),
    "weights as a list": ([[1.0, 2.0]], None),
    "a best score of 0": ([None], 0.0),
    "a negative best score": ([None], -1.0),
    "a best score as text": ([None], "1.0"),
    "a best score so small the text rank overflows": ([None], 5e-324),
    "weights so small the text rank underflows": ([packed(5e-324, 5e-324)], 3.0),
    "a weight so large its sums overflow": ([packed(1e300, 1e300)], None),
}


async def office_search(
    state: Any, agent: Any, mode: str, after: str | None = None
) -> search_module.SearchResult:
    """A page of one record of an operator's search for "office Oslo"."""
    return await search(
        state.pool,
        state.embedder,
        OperatorReader(agent.account_id, agent.action_id),
        agent.harness.memory.search,
        query="office Oslo",
        mode=mode,
        limit=1,
        after=after,
    )


# M38
@pytest.mark.parametrize("name", list(WEIGHTS))
async def test_m38_crafted_ranked_cursors_are_bad_input(state, admin, name):
    agent = await make_agent(state, admin)
    for text in ("the office is in Oslo", "the office moved to Bergen"):
        await remember(state, agent, text, scope="AGENT")

    async def page(after: str | None = None) -> search_module.SearchResult:
        return await office_search(state, agent, "hybrid", after)

    issued = cursors.unpack((await page()).cursors[0])
    weights, best = issued[5:]
    assert weights and best  # the first page's, carried
    later = await page(cursors.pack(issued))
    assert len(later.records) == 1
    (weights,), best = WEIGHTS[name]
    with pytest.raises(BadInput, match="cursor"):
        await page(cursors.pack([*issued[:5], weights, best]))
    # Weights for another number of words are not used: the page is weighed afresh.
    other = cursors.pack([*issued[:5], packed(1.0, 2.0, 3.0, 4.0, 5.0), None])
    assert [r.memory_id for r in (await page(other)).records] == [
        r.memory_id for r in later.records
    ]


# M38
@pytest.mark.parametrize("mode", ["hybrid", "lexical"])
@pytest.mark.parametrize("weight", [cursors.MAX_WEIGHT, 0.0, cursors.MIN_WEIGHT])
async def test_m38_a_long_querys_cursor_with_weights_at_their_bounds_pages(
    state, admin, monkeypatch, mode, weight
):
    """A query of more than six words on the index plan estimates its last word tier's share
    of the agent from its later words' weights (`search_store._LATER`): a cursor's weights at
    the bounds it may carry page like any, with no internal error (e^-1e6 underflows float8,
    which PostgreSQL raises)."""
    monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 0)
    monkeypatch.setattr(search_module, "SCOPED_MAX_ROWS", 0)
    agent = await make_agent(state, admin)
    for text in ("the office is in Oslo", "the office moved to Bergen", "a fjord near Oslo"):
        await remember(state, agent, text, scope="AGENT")
    await list_agents(state)
    query = "office Oslo Bergen fjord moved near harbour winter"  # eight words

    async def page(after: str | None = None) -> search_module.SearchResult:
        return await search(
            state.pool,
            state.embedder,
            OperatorReader(agent.account_id, agent.action_id),
            agent.harness.memory.search,
            query=query,
            mode=mode,
            limit=1,
            after=after,
        )

    issued = cursors.unpack((await page()).cursors[0])
    assert issued[5] is not None  # the first page's weights, carried
    crafted = cursors.pack([*issued[:5], packed(*[weight] * 8), issued[6]])
    await page(crafted)  # ranked by those weights (every record above the cursor at 1e6)


# M38
@pytest.mark.parametrize("mode", ["lexical", "vector"])
async def test_m38_a_best_score_crafted_into_a_cursor_that_carries_none_is_not_read(
    state, admin, mode
):
    """Only a hybrid cursor carries a best text score (lexical and vector modes normalize
    nothing): one crafted into another mode's cursor changes nothing, and is no internal
    error."""
    agent = await make_agent(state, admin)
    for text in ("the office is in Oslo", "the office moved to Bergen", "Oslo has a fjord"):
        await remember(state, agent, text, scope="AGENT")

    async def page(after: str | None = None) -> search_module.SearchResult:
        return await office_search(state, agent, mode, after)

    issued = cursors.unpack((await page()).cursors[0])
    assert issued[6] is None
    later = [r.memory_id for r in (await page(cursors.pack(issued))).records]
    assert later
    crafted = await page(cursors.pack([*issued[:6], 1.0]))
    assert [r.memory_id for r in crafted.records] == later


# M38
async def test_m38_search_memories_pages_up_to_its_bound_with_a_clear_message(
    state, gql, admin, monkeypatch
):
    monkeypatch.setattr(search_module, "EXACT_MAX_ROWS", 0)  # the index plan, HNSW included
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "the office is in Oslo", scope="AGENT")
    await list_agents(state)  # own indexes: an agent without them is ranked exactly
    a = str(agent.action_id)
    for query in (None, "office"):
        page = (await gql(admin, SEARCH, a=a, q=query, first=1000)).ok()["action"]
        assert page["searchMemories"]["nodes"] == [{"memoryId": str(record.memory_id)}]
    too_many = await gql(admin, SEARCH, a=a, q="office", first=1001)
    assert too_many.codes == ["BAD_REQUEST"]
    assert too_many.errors[0]["message"] == "`first` must be from 1 to 1000, got 1001"


# M38
async def test_m38_search_memories_reads_at_most_1000_ids(state, gql, admin):
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "one record", scope="AGENT")
    a = str(agent.action_id)
    ids = [str(record.memory_id), *(str(uuid.uuid4()) for _ in range(999))]
    found = (await gql(admin, SEARCH, a=a, ids=ids, first=10)).ok()["action"]["searchMemories"]
    assert found["nodes"] == [{"memoryId": str(record.memory_id)}]
    refused = await gql(admin, SEARCH, a=a, ids=[*ids, str(uuid.uuid4())], first=10)
    assert refused.codes == ["BAD_REQUEST"]
    assert "at most 1000" in refused.errors[0]["message"]


# M57
@pytest.mark.parametrize("version", ["99999999999", "2147483648", "\u00b2", "1.5", "-1"])
async def test_m57_node_ids_naming_impossible_versions_are_bad_requests(state, gql, admin, version):
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "a record", scope="AGENT")
    node_id = global_id("ActionAgentMemory", agent.action_id, record.memory_id, version)
    result = await gql(admin, NODE, id=node_id)
    assert result.codes == ["BAD_REQUEST"], result.errors
    exact = global_id("ActionAgentMemory", agent.action_id, record.memory_id, 1)
    assert (await gql(admin, NODE, id=exact)).ok()["node"] == {
        "memoryId": str(record.memory_id),
        "version": 1,
    }


RANKED_PAGE = """query($a: UUID!, $after: String) { action(actionId: $a) {
  searchMemories(query: "office Oslo", first: 1, after: $after) {
    edges { node { memoryId } } pageInfo { endCursor } } } }"""


# M38
async def test_m38_a_ranked_cursor_of_another_agent_or_account_is_bad_request(
    state, admin, base_url
):
    """A ranked search's cursor belongs to the agent it searched: passed to the same search of
    another agent, also of another account holding an agent of the same ID (an import of an
    export), it is refused as a cursor of another query is. It paged that agent from a place
    its own search never reached, ranked by the word weights of the other agent's records."""
    texts = ("the office is in Oslo", "the office moved to Bergen", "Oslo has a fjord")
    agent, neighbour = await make_agent(state, admin), await make_agent(state, admin)
    for text in texts:
        await remember(state, agent, text, scope="AGENT")
        await remember(state, neighbour, text, scope="AGENT")
    exported = io.StringIO()
    await export_action(
        state.pool, account_id=admin.account_id, action_id=agent.action_id, out=exported
    )
    other_account = await make_account(state, "other")

    async def embedder() -> Any:
        return state.embedder

    lines = exported.getvalue().splitlines()
    await import_file(state.pool, account_id=other_account, lines=lines, open_embedder=embedder)
    verbs = ["SELECT", "INSERT", "UPDATE", "DELETE"]
    ours = await token_for(state, admin, "console", allow(verbs, "*"))
    theirs = await token_for(state, admin, "console", allow(verbs, "*"), account_id=other_account)
    a, n = str(agent.action_id), str(neighbour.action_id)

    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:

        async def page(token: str, action: str, after: str | None = None) -> dict[str, Any]:
            answer = await http.post(
                "/graphql",
                json={"query": RANKED_PAGE, "variables": {"a": action, "after": after}},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert answer.status_code == 200, answer.text
            return answer.json()

        first = (await page(ours, a))["data"]["action"]["searchMemories"]
        cursor = first["pageInfo"]["endCursor"]
        # Its own search goes on from it.
        second = (await page(ours, a, cursor))["data"]["action"]["searchMemories"]
        assert second["edges"] and second["edges"] != first["edges"]
        # The other account's copy answers its own first page as ours does.
        copy = (await page(theirs, a))["data"]["action"]["searchMemories"]
        assert copy["edges"] == first["edges"]
        for token, action in ((ours, n), (theirs, a)):
            refused = await page(token, action, cursor)
            assert refused["data"] is None
            (error,) = refused["errors"]
            assert error["extensions"]["code"] == "BAD_REQUEST", error
            assert error["message"].startswith("`after` is not a cursor this search issued")
