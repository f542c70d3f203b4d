"""`Action.memories(sessionId:)` over HTTP: an operator lists what an agent remembered in one
conversation (the session-scope records of that session), with the listing's other filters and
its cursors, and the API's rules on session IDs and tenants."""

from typing import Any

import httpx
import pytest
from factories import allow, make_account, make_agent, remember, token_for

from app.memory import operator

LIST = """
query($a: UUID!, $first: Int!, $after: String, $session: String, $kind: String,
      $scope: ActionAgentMemoryScope, $status: [ActionAgentMemoryStatus!]) {
  action(actionId: $a) {
    memories(first: $first, after: $after, sessionId: $session, kind: $kind, scope: $scope,
             status: $status) {
      nodes { memoryId summary scope sessionId status }
      pageInfo { hasNextPage endCursor }
    }
  }
}"""
EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")


@pytest.fixture
async def seeded(state, admin) -> dict[str, Any]:
    """An agent with records of two sessions and of agent scope (one of them written by a turn
    of session s-1), oldest first in each list; an admin's token."""
    agent = await make_agent(state, admin)
    made: dict[str, list] = {"s-1": [], "s-2": [], "agent": []}
    for n, (session, scope, kind) in enumerate(
        [
            ("s-1", "SESSION", "fact"),
            ("s-2", "SESSION", "fact"),
            ("s-1", "AGENT", "fact"),
            ("s-1", "SESSION", "event"),
            ("s-2", "SESSION", "event"),
            ("s-1", "SESSION", "fact"),
            (None, "AGENT", "fact"),
        ]
    ):
        record = await remember(
            state, agent, f"record {n} of {session}", kind=kind, session=session, scope=scope
        )
        made["agent" if scope == "AGENT" else session].append(record)
    return {
        "agent": str(agent.action_id),
        "records": {k: [str(r.memory_id) for r in v] for k, v in made.items()},
        "token": await token_for(state, admin, "auditor", EVERYTHING),
        "admin": admin,
        "state": state,
        "action": agent,
    }


async def post(base_url: str, token: str, **variables: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        answer = await http.post(
            "/graphql",
            json={"query": LIST, "variables": {"first": 100, **variables}},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert answer.status_code == 200, answer.text
    return answer.json()


async def listed(base_url: str, token: str, **variables: Any) -> list[str]:
    body = await post(base_url, token, **variables)
    assert not body.get("errors"), body
    return [n["memoryId"] for n in body["data"]["action"]["memories"]["nodes"]]


def newest_first(ids: list[str]) -> list[str]:
    return list(reversed(ids))


async def test_a_session_lists_its_own_session_scope_records_alone(base_url, seeded):
    a, token, records = seeded["agent"], seeded["token"], seeded["records"]
    assert await listed(base_url, token, a=a, session="s-1") == newest_first(records["s-1"])
    assert await listed(base_url, token, a=a, session="s-2") == newest_first(records["s-2"])
    # The agent-scope record a turn of s-1 wrote is of no one session: not listed under it.
    body = await post(base_url, token, a=a, session="s-1")
    nodes = body["data"]["action"]["memories"]["nodes"]
    assert {(n["scope"], n["sessionId"]) for n in nodes} == {("SESSION", "s-1")}
    # A session the agent never had lists nothing; without the filter, every record is listed.
    assert await listed(base_url, token, a=a, session="never-had") == []
    assert len(await listed(base_url, token, a=a)) == 7


async def test_the_session_filter_combines_with_kind_scope_and_status(base_url, seeded):
    a, token, records = seeded["agent"], seeded["token"], seeded["records"]
    first_fact, event, last_fact = records["s-1"]
    assert await listed(base_url, token, a=a, session="s-1", kind="fact") == [last_fact, first_fact]
    assert await listed(base_url, token, a=a, session="s-1", kind="event") == [event]
    assert await listed(base_url, token, a=a, session="s-2", kind="guidance") == []
    assert await listed(base_url, token, a=a, session="s-1", scope="SESSION") == newest_first(
        records["s-1"]
    )
    # Agent scope is of no one session: asked together, nothing.
    assert await listed(base_url, token, a=a, session="s-1", scope="AGENT") == []

    state, admin = seeded["state"], seeded["admin"]
    await operator.delete_memory(
        state.pool, admin, action_id=seeded["action"].action_id, memory_id=event
    )
    assert await listed(base_url, token, a=a, session="s-1") == [last_fact, first_fact]
    assert await listed(base_url, token, a=a, session="s-1", status=["DELETED"]) == [event]


async def test_a_sessions_records_page_through_with_cursors(base_url, seeded):
    a, token, records = seeded["agent"], seeded["token"], seeded["records"]
    seen, after, pages = [], None, 0
    while True:
        body = await post(base_url, token, a=a, session="s-1", first=1, after=after)
        assert not body.get("errors"), body
        page = body["data"]["action"]["memories"]
        seen += [n["memoryId"] for n in page["nodes"]]
        pages += 1
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == newest_first(records["s-1"])
    assert pages == 3  # the last page says nothing follows: none of s-2's or agent scope's


@pytest.mark.parametrize(
    ("session", "message"),
    [
        ("", "sessionId must be 1 to 200 characters, not blank"),
        ("   ", "sessionId must be 1 to 200 characters, not blank"),
        ("s" * 201, "sessionId must be 1 to 200 characters, not blank"),
        ("s-1\nand more", "sessionId"),
    ],
)
async def test_a_bad_session_id_is_bad_request(base_url, seeded, session, message):
    body = await post(base_url, seeded["token"], a=seeded["agent"], session=session)
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "BAD_REQUEST", error
    assert error["message"].startswith(message), error
    assert body["data"] is None


async def test_another_tenants_agent_stays_unseen_and_a_client_without_memory_is_denied(
    base_url, seeded
):
    state, admin, a = seeded["state"], seeded["admin"], seeded["agent"]
    other = await make_account(state, "other")
    stranger = await token_for(state, admin, "stranger", EVERYTHING, account_id=other)
    body = await post(base_url, stranger, a=a, session="s-1")
    assert body == {"data": {"action": None}}
    agents_only = await token_for(
        state, admin, "agents-only", allow(["SELECT"], "financial.Action.*")
    )
    body = await post(base_url, agents_only, a=a, session="s-1")
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "ACCESS_DENIED", error


BATCHED = """query($a: UUID!) {
  action(actionId: $a) {
    first: memories(first: 10, sessionId: "s-1") { nodes { memoryId } }
    second: memories(first: 10, sessionId: "s-2") { nodes { memoryId } }
  }
  actions(first: 10) {
    nodes { actionId memories(first: 10, sessionId: "s-2") { nodes { memoryId } } }
  }
}"""


async def test_listings_of_several_sessions_and_agents_in_one_request(base_url, seeded):
    """Read together (one request's DataLoader: a page per session, and the agents' pages of one
    session in one statement), each listing keeps its own session."""
    state, admin, token, records = (seeded[k] for k in ("state", "admin", "token", "records"))
    other = await make_agent(state, admin, name="other")
    theirs = await remember(
        state, other, "other agent's s-2 record", session="s-2", scope="SESSION"
    )
    await remember(state, other, "other agent's s-1 record", session="s-1", scope="SESSION")
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        answer = await http.post(
            "/graphql",
            json={"query": BATCHED, "variables": {"a": seeded["agent"]}},
            headers={"Authorization": f"Bearer {token}"},
        )
    body = answer.json()
    assert not body.get("errors"), body

    def ids(listing: dict) -> list[str]:
        return [n["memoryId"] for n in listing["nodes"]]

    action = body["data"]["action"]
    assert ids(action["first"]) == newest_first(records["s-1"])
    assert ids(action["second"]) == newest_first(records["s-2"])
    by_agent = {a["actionId"]: ids(a["memories"]) for a in body["data"]["actions"]["nodes"]}
    assert by_agent == {
        seeded["agent"]: newest_first(records["s-2"]),
        str(other.action_id): [str(theirs.memory_id)],
    }
