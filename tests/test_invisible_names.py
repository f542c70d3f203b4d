"""Characters that show as nothing (a right-to-left mark, a soft hyphen, a word joiner, tags) in a
new name or session ID are BAD_REQUEST naming the field, the code point and where it is, over
real HTTP; the joiners, variation selectors and emoji flags that scripts and emoji need are kept.
What an earlier release stored under such a name or ID stays reachable: read, listed, updated
without a rename, erased, its records deleted."""

import base64
import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from helpers import database_copy, db_settings, stored_earlier
from servers import serving

from app.embeddings.static import StaticEmbedder

TOKEN = "test-invisible-names-admin-token"
HARNESS = {"memory": {"enabled": True, "scope": {"read": ["session"], "write": ["session"]}}}
CREATE = "mutation($i: ActionInput!) { createAction(input: $i) { actionId name } }"
UPDATE = "mutation($a: UUID!, $i: ActionInput!) { updateAction(actionId: $a, input: $i) { name } }"
ADD = (
    "mutation($a: UUID!, $i: AgentMemoryInput!) {"
    " addAgentMemory(actionId: $a, input: $i) { memoryId } }"
)
EXECUTE = "mutation($i: ExecuteActionInput!) { executeAction(input: $i) { status } }"
CREATE_CLIENT = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
UPDATE_CLIENT = (
    "mutation($p: String!, $i: ClientUpdateInput!) { updateClient(principal: $p, input: $i) {"
    " name } }"
)
CREATE_ACCOUNT = "mutation($i: AccountInput!) { createAccount(input: $i) { accountId } }"
LISTED = """query($a: UUID!, $s: String) { action(actionId: $a) {
  memories(first: 10, sessionId: $s) { nodes { memoryId sessionId } } } }"""
NODE = "query($id: ID!) { node(id: $id) { ... on ActionSession { sessionId } } }"
ERASE = """mutation($a: UUID!, $s: String!) { eraseSession(actionId: $a, sessionId: $s) {
  liveMemoryIds } }"""
DELETE = "mutation($a: UUID!, $m: UUID!) { deleteAgentMemory(actionId: $a, id: $m) { memoryId } }"

RLM_DIGITS = "\u200f12 34"  # shown as "34 12", another session's ID
SOFT = "s-1\u00ad"  # shown as "s-1"
ENGLAND = "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"


@pytest.fixture(scope="module")
async def module_db_url(pg_server, template_db) -> AsyncIterator[str]:
    async with database_copy(pg_server, template_db, f"engram_invisible_{os.getpid()}") as url:
        yield url


@pytest.fixture(scope="module")
def base_url(module_db_url: str, embedder: StaticEmbedder) -> Iterator[str]:
    settings = db_settings(
        module_db_url, bootstrap_token=TOKEN, model_base_url="http://127.0.0.1:9/v1"
    )
    with serving(settings, embedder) as url:
        yield url


@pytest.fixture
async def api(base_url: str) -> AsyncIterator[Any]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as http:

        async def call(query: str, **variables: Any) -> dict[str, Any]:
            response = await http.post("/graphql", json={"query": query, "variables": variables})
            assert response.status_code in (200, 400), response.text
            return response.json()

        yield call


def refused(body: dict[str, Any]) -> str:
    assert body["data"] is None, body
    assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_REQUEST"], body
    return body["errors"][0]["message"]


async def new_agent(api: Any, name: str = "agent") -> str:
    made = await api(CREATE, i={"name": name, "harness": HARNESS})
    return made["data"]["createAction"]["actionId"]


# Each new name or ID with a character that shows as nothing: what the refusal says.
REFUSED = {
    "turn session, right-to-left mark": (
        EXECUTE,
        {"i": {"sessionId": RLM_DIGITS, "input": "hi"}},
        "sessionId contains U+200F at position 0",
    ),
    "record session, soft hyphen": (
        ADD,
        {"i": {"summary": "x.", "kind": "fact", "sessionId": SOFT}},
        "sessionId contains U+00AD at position 3",
    ),
    "agent name, left-to-right mark": (
        CREATE,
        {"i": {"name": "bot\u200e"}},
        "name contains U+200E at position 3",
    ),
    "agent name, Arabic letter mark": (
        CREATE,
        {"i": {"name": "\u061cbot"}},
        "U+061C at position 0",
    ),
    "agent name, tags outside a flag": (
        CREATE,
        {"i": {"name": "bot\U000e0069\U000e0067\U000e006e"}},
        "name contains U+E0069 at position 3",
    ),
    "client name, word joiner": (
        CREATE_CLIENT,
        {"i": {"principal": "p-invisible", "name": "a\u2060b", "policies": []}},
        "client name contains U+2060 at position 1",
    ),
    "account name, Mongolian vowel separator": (
        CREATE_ACCOUNT,
        {"i": {"name": "acme\u180e"}},
        "account name contains U+180E at position 4",
    ),
    "agent name, Mongolian vowel separator before a letter, after none": (
        CREATE,
        {"i": {"name": "bot \u180e\u1820"}},
        "name contains U+180E at position 4",
    ),
    "account name, Hangul filler alone": (
        CREATE_ACCOUNT,
        {"i": {"name": "\u3164"}},
        "account name contains U+3164 at position 0",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_a_new_name_or_session_id_holding_an_invisible_character_is_bad_request(
    api: Any, case: str
) -> None:
    query, variables, said = REFUSED[case]
    if query in (ADD, EXECUTE):
        agent = await new_agent(api)
        if query == ADD:
            variables = {"a": agent, **variables}
        else:
            variables["i"]["actionId"] = agent
    message = refused(await api(query, **variables))
    assert said in message, message
    assert "shows as nothing" in message


async def test_joiners_variation_selectors_and_emoji_flags_are_kept(api: Any) -> None:
    """Persian needs a zero-width non-joiner, a family emoji the joiner, a red heart its
    variation selector, England's flag its tags, traditional Mongolian its vowel separator
    before a final a (qoriy-a): each is a name, and a session ID."""
    for name in (
        "\u0645\u06cc\u200c\u0631\u0648\u0645",
        "\u182c\u1823\u1837\u1822\u1836\u180e\u1820",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",
        "\u2764\ufe0f bot",
        f"{ENGLAND} support",
    ):
        made = await api(CREATE, i={"name": name, "harness": HARNESS})
        assert made["data"]["createAction"]["name"] == name, made
        agent = made["data"]["createAction"]["actionId"]
        added = await api(ADD, a=agent, i={"summary": "Kept.", "kind": "fact", "sessionId": name})
        assert added["data"]["addAgentMemory"]["memoryId"], added


async def test_what_an_earlier_release_stored_under_an_invisible_id_stays_reachable(
    api: Any, module_db_url: str
) -> None:
    """A session whose ID holds a right-to-left mark, stored before such IDs were refused: its
    records are listed by its ID, the session is read, its records deleted and its words erased;
    a new turn in it is refused as a new session would be (docs/access.md)."""
    agent = await new_agent(api)
    kept = []
    for n in range(2):
        added = await api(
            ADD, a=agent, i={"summary": f"Fact {n}.", "kind": "fact", "sessionId": "stand-in"}
        )
        kept.append(added["data"]["addAgentMemory"]["memoryId"])
    await stored_earlier(module_db_url, "stand-in", RLM_DIGITS)

    listed = await api(LISTED, a=agent, s=RLM_DIGITS)
    assert "errors" not in listed, listed
    nodes = listed["data"]["action"]["memories"]["nodes"]
    assert sorted(n["memoryId"] for n in nodes) == sorted(kept)
    assert {n["sessionId"] for n in nodes} == {RLM_DIGITS}
    raw = json.dumps(["ActionSession", agent, RLM_DIGITS], separators=(",", ":")).encode()
    node = await api(NODE, id=base64.urlsafe_b64encode(raw).decode().rstrip("="))
    assert node["data"]["node"] == {"sessionId": RLM_DIGITS}, node

    said = refused(
        await api(EXECUTE, i={"actionId": agent, "sessionId": RLM_DIGITS, "input": "hi"})
    )
    assert "sessionId contains U+200F at position 0" in said

    deleted = await api(DELETE, a=agent, m=kept[0])
    assert deleted["data"]["deleteAgentMemory"]["memoryId"] == kept[0], deleted
    erased = await api(ERASE, a=agent, s=RLM_DIGITS)
    assert erased["data"]["eraseSession"]["liveMemoryIds"] == [kept[1]], erased


async def test_a_name_stored_earlier_is_kept_by_an_update_but_not_given_anew(
    api: Any, module_db_url: str
) -> None:
    """An agent and a client whose names hold a right-to-left mark, stored before such names
    were refused: an update that keeps the name goes through, one that gives a new such
    name is refused."""
    agent = await new_agent(api, "stand-in agent")
    made = await api(
        CREATE_CLIENT, i={"principal": "p-earlier", "name": "stand-in", "policies": []}
    )
    assert "errors" not in made, made
    conn = await asyncpg.connect(module_db_url)
    try:
        await conn.execute(
            "UPDATE action_versions SET name = $2 WHERE action_id = $1", agent, "\u200fbot"
        )
        await conn.execute(
            "UPDATE clients SET name = $1 WHERE principal = 'p-earlier'", "\u200fclient"
        )
    finally:
        await conn.close()

    kept = await api(UPDATE, a=agent, i={"name": "\u200fbot", "instructions": "Be brief."})
    assert kept["data"]["updateAction"]["name"] == "\u200fbot", kept
    renamed = await api(UPDATE, a=agent, i={"name": "\u200fbot2"})
    assert "name contains U+200F at position 0" in refused(renamed)

    kept = await api(UPDATE_CLIENT, p="p-earlier", i={"name": "\u200fclient", "policies": []})
    assert kept["data"]["updateClient"]["name"] == "\u200fclient", kept
    renamed = await api(UPDATE_CLIENT, p="p-earlier", i={"name": "client\u00ad"})
    assert "client name contains U+00AD at position 6" in refused(renamed)
