"""Agents (actions) through GraphQL: grants, versions, listing, node look-ups, tenant isolation,
and how errors reach the client (codes, masking, logging)."""

import logging
from typing import Any
from uuid import uuid4

import pytest
from factories import (
    FULL_MEMORY,
    allow,
    caller,
    deny,
    make_account,
    make_agent,
    record_turn,
    remember,
    token_for,
    writer,
)

from app.actions import service as actions_service
from app.auth.caller import Caller
from app.db.cursors import pack
from app.graphql import field_completion
from app.graphql.relay import global_id
from app.graphql.schema import schema

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")
FIELDS = (
    "id actionId version currentVersion name instructions model harness createdBy created modified"
)
CREATE = f"mutation($input: ActionInput!) {{ createAction(input: $input) {{ {FIELDS} }} }}"
UPDATE = f"""
mutation($id: UUID!, $input: ActionInput!) {{
  updateAction(actionId: $id, input: $input) {{ {FIELDS} }}
}}
"""
ACTION = f"""
query($id: UUID!, $version: Int) {{ action(actionId: $id, version: $version) {{ {FIELDS} }} }}
"""
ACTIONS = """
query($first: Int!, $after: String) {
  actions(first: $first, after: $after) {
    edges { cursor node { actionId name version } }
    nodes { actionId }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
  }
}"""
NODE = "query($id: ID!) { node(id: $id) { id ... on Action { actionId version name } } }"


async def create(gql, who, name="support", **extra):
    return (await gql(who, CREATE, input={"name": name, **extra})).ok()["createAction"]


# --- each operation needs its grant -----------------------------------------------------------


async def test_create_action_grant(gql, state):
    account = await make_account(state)
    refused = await gql(
        caller(account, EVERYTHING, deny(["INSERT"], "financial.Action.document")),
        CREATE,
        input={"name": "a"},
    )
    assert refused.codes == ["ACCESS_DENIED"] and refused.data is None
    assert "INSERT financial.Action.document" in refused.errors[0]["message"]
    who = caller(account, allow(["INSERT"], "financial.Action.document"), principal="builder")
    created = (await gql(who, CREATE, input={"name": "a"})).ok()["createAction"]
    assert created["version"] == 1 and created["createdBy"] == "builder"


async def test_an_agent_of_another_account_is_not_found_saying_whose_account_was_searched(
    gql, state
):
    """An agent created with one account's token and used with another's (the operator's admin
    creating a tenant's agent in the default account): the refusal said only "not found", as
    for a mistyped ID; it says the client's account was searched. Another account's agent and
    a missing one still answer alike."""
    owner = caller(await make_account(state), EVERYTHING)
    other = caller(await make_account(state), EVERYTHING)
    theirs = (await create(gql, owner))["actionId"]
    missing = str(uuid4())
    requests = [
        (
            'mutation($id: UUID!) { updateAction(actionId: $id, input: {name: "b"}) { version } }',
            {},
        ),
        (
            'mutation($id: UUID!) { executeAction(input: {actionId: $id, sessionId: "s", '
            'input: "hi"}) { status } }',
            {},
        ),
        (
            'mutation($id: UUID!) { addAgentMemory(actionId: $id, input: {summary: "s", '
            'kind: "fact", sessionId: "s"}) { memoryId } }',
            {},
        ),
        (
            'mutation($id: UUID!) { eraseSession(actionId: $id, sessionId: "s") { erasedEvents } }',
            {},
        ),
    ]
    for query, variables in requests:
        said = []
        for action_id in (theirs, missing):
            refused = await gql(other, query, id=action_id, **variables)
            assert refused.codes == ["NOT_FOUND"], (query, refused.errors)
            said.append(refused.errors[0]["message"].replace(action_id, "ID"))
        assert (
            said[0]
            == said[1]
            == (
                "action ID not found in this client's account (an agent belongs to the account of "
                "the client that created it)"
            )
        ), query


async def test_update_action_grant(gql, state):
    account = await make_account(state)
    action = await create(gql, caller(account, EVERYTHING))
    variables = {"id": action["actionId"], "input": {"name": "b"}}
    refused = await gql(
        caller(account, EVERYTHING, deny(["UPDATE"], "financial.Action.*")), UPDATE, **variables
    )
    assert refused.codes == ["ACCESS_DENIED"]
    assert "UPDATE financial.Action.document" in refused.errors[0]["message"]
    # The refused update wrote no version.
    current = await gql(caller(account, EVERYTHING), ACTION, id=action["actionId"])
    assert current.ok()["action"]["version"] == 1
    allowed = await gql(
        caller(account, allow(["UPDATE"], "financial.Action.document")), UPDATE, **variables
    )
    assert allowed.ok()["updateAction"]["version"] == 2


async def test_action_query_grant(gql, state):
    account = await make_account(state)
    action = await create(gql, caller(account, EVERYTHING))
    refused = await gql(
        caller(account, EVERYTHING, deny(["SELECT"], "financial.Action.document")),
        ACTION,
        id=action["actionId"],
    )
    assert refused.codes == ["ACCESS_DENIED"] and refused.data is None
    allowed = await gql(
        caller(account, allow(["SELECT"], "financial.Action.document")),
        ACTION,
        id=action["actionId"],
    )
    assert allowed.ok()["action"]["actionId"] == action["actionId"]


async def test_actions_query_needs_the_index_and_the_document(gql, state):
    account = await make_account(state)
    await create(gql, caller(account, EVERYTHING))
    for missing in ("financial.Action.indexes.created", "financial.Action.document"):
        refused = await gql(
            caller(account, EVERYTHING, deny(["SELECT"], missing)), ACTIONS, first=5
        )
        assert refused.codes == ["ACCESS_DENIED"], missing
        assert f"SELECT {missing}" in refused.errors[0]["message"]
    exact = caller(
        account, allow(["SELECT"], "financial.Action.indexes.created", "financial.Action.document")
    )
    assert len((await gql(exact, ACTIONS, first=5)).ok()["actions"]["nodes"]) == 1


async def test_node_action_needs_the_same_grant_as_action(gql, state):
    account = await make_account(state)
    action = await create(gql, caller(account, EVERYTHING))
    refused = await gql(
        caller(account, EVERYTHING, deny(["SELECT"], "financial.Action.document")),
        NODE,
        id=action["id"],
    )
    assert refused.codes == ["ACCESS_DENIED"]
    allowed = await gql(
        caller(account, allow(["SELECT"], "financial.Action.document")), NODE, id=action["id"]
    )
    assert allowed.ok()["node"] == {
        "id": action["id"],
        "actionId": action["actionId"],
        "version": 1,
        "name": "support",
    }


# --- versions ---------------------------------------------------------------------------------


async def test_update_writes_version_2_and_version_1_stays_readable(gql, admin):
    v1 = await create(
        gql,
        admin,
        instructions="Help customers.",
        model={"name": "gpt-4o-mini", "temperature": 0.2},
        harness={"memory": {"enabled": True}},
    )
    v2 = (
        await gql(
            admin,
            UPDATE,
            id=v1["actionId"],
            input={
                "name": "support v2",
                "instructions": "Help customers kindly.",
                "harness": {"history": {}},
            },
        )
    ).ok()["updateAction"]
    assert (v2["actionId"], v2["version"], v2["currentVersion"]) == (v1["actionId"], 2, 2)
    assert v2["name"] == "support v2" and v2["model"] == {}
    assert v2["harness"]["memory"]["enabled"] is False
    assert v2["harness"]["history"] == {"index": "messages"}
    assert v2["id"] != v1["id"]
    assert v2["created"] == v1["created"]  # the agent's creation time
    assert v2["modified"] >= v1["modified"]  # this version's time

    current = (await gql(admin, ACTION, id=v1["actionId"])).ok()["action"]
    assert current["version"] == 2 and current["name"] == "support v2"
    old = (await gql(admin, ACTION, id=v1["actionId"], version=1)).ok()["action"]
    assert old["version"] == 1 and old["currentVersion"] == 2
    assert old["name"] == "support" and old["instructions"] == "Help customers."
    assert old["model"] == {"name": "gpt-4o-mini", "temperature": 0.2}
    assert old["harness"]["memory"]["enabled"] is True
    # node(id) of version 1 is version 1.
    node = (await gql(admin, NODE, id=v1["id"])).ok()["node"]
    assert (node["version"], node["name"]) == (1, "support")


async def test_concurrent_updates_each_write_the_next_version(gql, admin):
    """Eight updates of one agent at once: each waits for the one before and writes the next
    version (the agent was read as missing by those that waited: NOT_FOUND, their update lost)."""
    import asyncio

    v1 = await create(gql, admin)
    done = await asyncio.gather(
        *(gql(admin, UPDATE, id=v1["actionId"], input={"name": f"v{i}"}) for i in range(8))
    )
    versions = sorted(d.ok()["updateAction"]["version"] for d in done)
    assert versions == list(range(2, 10))
    current = (await gql(admin, ACTION, id=v1["actionId"])).ok()["action"]
    assert current["currentVersion"] == 9


async def test_an_update_based_on_an_older_version_is_conflict_and_writes_nothing(gql, admin):
    """`expectedVersion`: a form filled from version 1 and saved after someone else wrote
    version 2 is CONFLICT naming both versions, and version 2 stays current; based on the
    current version it writes the next one."""
    v1 = await create(gql, admin)
    expected = """mutation($id: UUID!, $input: ActionInput!, $v: Int) {
      updateAction(actionId: $id, input: $input, expectedVersion: $v) { version name } }"""
    theirs = await gql(admin, expected, id=v1["actionId"], input={"name": "theirs"}, v=1)
    assert theirs.ok()["updateAction"] == {"version": 2, "name": "theirs"}
    mine = await gql(admin, expected, id=v1["actionId"], input={"name": "mine"}, v=1)
    assert mine.codes == ["CONFLICT"]
    assert "is at version 2" in mine.errors[0]["message"]
    assert "version 1 that this change was based on" in mine.errors[0]["message"]
    current = (await gql(admin, ACTION, id=v1["actionId"])).ok()["action"]
    assert (current["currentVersion"], current["name"]) == (2, "theirs")
    again = await gql(admin, expected, id=v1["actionId"], input={"name": "mine"}, v=2)
    assert again.ok()["updateAction"] == {"version": 3, "name": "mine"}


async def test_a_version_is_read_as_stored_each_time(gql, admin, state):
    """Parses of a version's model and harness are kept by their text, not by the version: a
    document rewritten in the database (as a restore may) is read as it now is."""
    action = await create(gql, admin, model={"name": "m1"}, harness={"memory": {"enabled": True}})
    first = (await gql(admin, ACTION, id=action["actionId"])).ok()["action"]
    assert first["model"] == {"name": "m1"} and first["harness"]["memory"]["enabled"] is True
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE action_versions SET model = $2, harness = $3 WHERE action_id = $1",
            action["actionId"],
            {"name": "m2"},
            {"memory": {"enabled": False}},
        )
    again = (await gql(admin, ACTION, id=action["actionId"])).ok()["action"]
    assert again["model"] == {"name": "m2"} and again["harness"]["memory"]["enabled"] is False
    # The same document read twice is the same answer.
    assert (await gql(admin, ACTION, id=action["actionId"])).ok()["action"] == again


async def test_an_update_repairs_a_stored_model_that_no_longer_validates(gql, admin, state):
    """An update reads the previous version's harness only (its labels must stay): a stored
    model that fails today's checks (an import, or checks made stricter) does not block the
    update that replaces it."""
    action = await create(gql, admin, harness={"memory": {"enabled": True}})
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE action_versions SET model = $2 WHERE action_id = $1",
            action["actionId"],
            {"maxTokens": 500, "contextTokens": 600},
        )
    updated = await gql(admin, UPDATE, id=action["actionId"], input={"name": "x", "model": {}})
    assert updated.ok()["updateAction"]["version"] == 2
    assert updated.data["updateAction"]["model"] == {}


async def test_missing_version_or_action_is_null(gql, admin):
    action = await create(gql, admin)
    assert (await gql(admin, ACTION, id=action["actionId"], version=2)).ok()["action"] is None
    assert (await gql(admin, ACTION, id=action["actionId"], version=0)).ok()["action"] is None
    assert (await gql(admin, ACTION, id=str(uuid4()))).ok()["action"] is None


async def test_update_of_a_missing_action_is_not_found(gql, admin):
    result = await gql(admin, UPDATE, id=str(uuid4()), input={"name": "x"})
    assert result.codes == ["NOT_FOUND"]


@pytest.mark.parametrize(
    ("input", "message"),
    [
        ({"name": "  "}, "name must be 1 to 200 characters"),
        ({"name": "x" * 201}, "name must be 1 to 200 characters"),
        (
            {"name": "a", "instructions": "x" * (64 * 1024 + 1)},
            "instructions must be at most 65536 bytes",
        ),
        (
            {"name": "a", "harness": {"memory": {"extraction": {"prompt": "é" * 8193}}}},
            "harness.memory.extraction.prompt: must be at most 16384 bytes (the review sends it "
            "with each of its calls), not 16386",
        ),
        (
            {"name": "a", "harness": {"memory": {"kinds": [f"k{i}" for i in range(101)]}}},
            "harness.memory.kinds: must be at most 100 kinds (each is in the tools' schemas of "
            "every model call), not 101",
        ),
        (
            {
                "name": "a",
                "harness": {
                    "memory": {"labels": {"topic": {"number": 5, "description": "é" * 513}}}
                },
            },
            "harness.memory.labels.topic.description: must be at most 1024 bytes (it is in the "
            "tools' schemas of every model call), not 1,026",
        ),
        ({"name": "a", "model": "gpt"}, "model must be an object"),
        # An object sent as its JSON text (JSON.stringify into a variable of type Value).
        (
            {"name": "a", "harness": '{"memory": {"enabled": true}}'},
            "harness: must be an object, not a string holding its JSON: send the object "
            "itself, not its text",
        ),
        (
            {"name": "a", "model": '{"name": "gpt"}'},
            "not a string holding its JSON: send the object itself, not its text",
        ),
        ({"name": "a", "model": {"nmae": "gpt"}}, "model: unknown field 'nmae'"),
        (
            {"name": "a", "model": {"baseUrl": "ftp://x"}},
            "model.baseUrl must be an http:// or https:// URL",
        ),
        (
            {"name": "a", "model": {"temperature": 3}},
            "model.temperature must be a number from 0 to 2",
        ),
        (
            {"name": "a", "model": {"apiKeyEnv": "not an env"}},
            "model.apiKeyEnv must name an environment variable",
        ),
        (
            {"name": "a", "model": {"maxTokens": 0}},
            "model.maxTokens must be an integer from 1 to 1000000",
        ),
    ],
)
async def test_bad_action_input_is_bad_request(gql, admin, input, message):
    result = await gql(admin, CREATE, input=input)
    assert result.codes == ["BAD_REQUEST"]
    assert message in result.errors[0]["message"]


async def test_kinds_and_label_descriptions_at_their_limits_are_taken(gql, admin):
    memory = {
        "kinds": [f"k{i}" for i in range(100)],
        "labels": {"topic": {"number": 5, "description": "é" * 512}},
    }
    created = await gql(admin, CREATE, input={"name": "a", "harness": {"memory": memory}})
    assert created.ok()["createAction"]["version"] == 1


# --- listing ----------------------------------------------------------------------------------


async def test_actions_pages_newest_first_with_keyset_cursors(gql, admin):
    created = [await create(gql, admin, name=f"a{i}") for i in range(5)]
    (await gql(admin, UPDATE, id=created[0]["actionId"], input={"name": "a0 v2"})).ok()
    first = (await gql(admin, ACTIONS, first=2)).ok()["actions"]
    assert [e["node"]["name"] for e in first["edges"]] == ["a4", "a3"]
    assert (
        first["pageInfo"]["hasNextPage"] is True and first["pageInfo"]["hasPreviousPage"] is False
    )
    assert first["pageInfo"]["endCursor"] == first["edges"][-1]["cursor"]
    second = (await gql(admin, ACTIONS, first=2, after=first["pageInfo"]["endCursor"])).ok()[
        "actions"
    ]
    assert [e["node"]["name"] for e in second["edges"]] == ["a2", "a1"]
    assert second["pageInfo"]["hasPreviousPage"] is True
    third = (await gql(admin, ACTIONS, first=2, after=second["pageInfo"]["endCursor"])).ok()[
        "actions"
    ]
    # Each agent is listed once, at its current version.
    assert [(e["node"]["name"], e["node"]["version"]) for e in third["edges"]] == [("a0 v2", 2)]
    assert third["pageInfo"]["hasNextPage"] is False


@pytest.mark.parametrize(
    "after",
    [
        "not a cursor",
        pack([1, 2]),
        pack(["x"]),
        pack([{"t": "yesterday"}, {"u": "x"}]),
    ],
)
async def test_foreign_cursors_are_bad_request(gql, admin, after):
    result = await gql(admin, ACTIONS, first=2, after=after)
    assert result.codes == ["BAD_REQUEST"]
    assert "`after` is not a cursor this connection issued" in result.errors[0]["message"]


@pytest.mark.parametrize("first", [-1, 0, 1001])
async def test_first_out_of_range_is_bad_request(gql, admin, first):
    result = await gql(admin, ACTIONS, first=first)
    assert result.codes == ["BAD_REQUEST"]
    assert result.errors[0]["message"] == f"`first` must be from 1 to 1000, got {first}"


# Each connection, reached from the root: `first: 0` would answer an empty page saying more
# follow (hasNextPage) without an endCursor to ask for them, so every one refuses it.
CONNECTIONS = {
    "Query.actions": "actions(first: 0) { %s }",
    "Query.accounts": "accounts(first: 0) { %s }",
    "Query.clients": "clients(first: 0) { %s }",
    "Client.tokens": 'client(principal: "c1") { tokens(first: 0) { %s } }',
    "Query.tokensIssuedBy": (
        'tokensIssuedBy(tokenId: "00000000-0000-0000-0000-000000000000", first: 0) { %s }'
    ),
    "Query.adminEvents": "adminEvents(first: 0) { %s }",
    "Query.executions": (
        'executions(tokenId: "00000000-0000-0000-0000-000000000000", first: 0) { %s }'
    ),
    "Action.sessions": "action(actionId: $a) { sessions(first: 0) { %s } }",
    "Action.executions": "action(actionId: $a) { executions(first: 0) { %s } }",
    "Action.memories": "action(actionId: $a) { memories(first: 0) { %s } }",
    "Action.searchMemories": "action(actionId: $a) { searchMemories(first: 0) { %s } }",
    "ActionAgentMemory.history": "agentMemory(actionId: $a, id: $m) { history(first: 0) { %s } }",
    "ActionExecution.transcript": "execution(executionId: $e) { transcript(first: 0) { %s } }",
    "ActionSession.history": "node(id: $s) { ... on ActionSession { history(first: 0) { %s } } }",
    "ActionSession.executions": (
        "node(id: $s) { ... on ActionSession { executions(first: 0) { %s } } }"
    ),
}


def test_every_connection_is_in_the_first_zero_test():
    connections = {
        f"{name}.{field}"
        for name, type_ in schema._schema.type_map.items()
        for field, definition in getattr(type_, "fields", {}).items()
        if "first" in getattr(definition, "args", {})
        and str(definition.type).rstrip("!").endswith("Connection")
    }
    assert connections == set(CONNECTIONS)


@pytest.mark.parametrize("field", sorted(CONNECTIONS))
async def test_first_zero_is_bad_request_on_every_connection(state, gql, admin, field):
    agent = await make_agent(state, admin)
    w = writer(agent, session="s1")
    await record_turn(state, w)
    record = await remember(state, agent, "the office is in Oslo")
    await token_for(state, admin, "c1")
    variables = {
        "a": (str(agent.action_id), "UUID"),
        "m": (str(record.memory_id), "UUID"),
        "e": (str(w.execution_id), "UUID"),
        "s": (global_id("ActionSession", agent.action_id, "s1"), "ID"),
    }
    body = CONNECTIONS[field] % "edges { cursor } pageInfo { hasNextPage endCursor }"
    used = {k: v for k, v in variables.items() if f"${k}" in body}
    declared = ", ".join(f"${k}: {kind}!" for k, (_, kind) in used.items())
    query = f"query({declared}) {{ {body} }}" if used else f"query {{ {body} }}"
    result = await gql(admin, query, **{k: value for k, (value, _) in used.items()})
    assert result.codes == ["BAD_REQUEST"], result.errors
    assert result.errors[0]["message"] == "`first` must be from 1 to 1000, got 0"
    one = await gql(
        admin, query.replace("first: 0", "first: 1"), **{k: v for k, (v, _) in used.items()}
    )
    assert one.ok()


# A mutation answering with a list, and what the mutation changed if it ran.
NESTED_PAGES = {
    "createAction": (
        'mutation($f: Int!) { createAction(input: {name: "new"}) { actionId '
        "sessions(first: $f) { nodes { sessionId } } } }",
        1000,
    ),
    "updateAction": (
        "mutation($a: UUID!, $h: Value, $f: Int!) { updateAction(actionId: $a, input: "
        '{name: "v2", harness: $h}) { version searchMemories(first: $f) { nodes { memoryId } } } }',
        1000,
    ),
    "deleteAgentMemory": (
        "mutation($a: UUID!, $m: UUID!, $f: Int!) { deleteAgentMemory(actionId: $a, id: $m) { "
        "status history(first: $f) { nodes { version } } } }",
        1000,
    ),
    "addAgentMemory": (
        "mutation($a: UUID!, $f: Int!) { addAgentMemory(actionId: $a, input: {summary: "
        '"the office moved", kind: "fact", sessionId: "s1"}) { memoryId session { '
        'searchHistory(query: "office", first: $f) { text } } } }',
        50,
    ),
}


async def _nested_world(state, gql, admin) -> tuple[dict[str, Any], Any]:
    agent = await make_agent(state, admin)
    w = writer(agent, session="s1")
    await record_turn(state, w)
    record = await remember(state, agent, "the office is in Oslo")
    variables = {"a": str(agent.action_id), "m": str(record.memory_id), "h": FULL_MEMORY}

    async def changes() -> dict[str, Any]:
        seen = await gql(
            admin,
            "query($a: UUID!, $m: UUID!) { actions(first: 10) { nodes { actionId } } "
            "action(actionId: $a) { currentVersion memories(first: 10) { nodes { memoryId } } } "
            "agentMemory(actionId: $a, id: $m) { status } }",
            a=variables["a"],
            m=variables["m"],
        )
        return seen.ok()

    return variables, changes


@pytest.mark.parametrize("mutation", sorted(NESTED_PAGES))
@pytest.mark.parametrize("past", [False, True])
async def test_a_mutation_whose_answers_page_is_refused_changes_nothing(
    state, gql, admin, mutation, past
):
    """A list's `first` out of its range is refused by the list, which completes after the
    mutation made its change: the change was made and its answer lost (`data: null`), so a
    retry made it twice. Refused before anything runs."""
    query, maximum = NESTED_PAGES[mutation]
    variables, changes = await _nested_world(state, gql, admin)
    before = await changes()
    first = maximum + 1 if past else 0
    used = {k: v for k, v in variables.items() if f"${k}" in query}
    refused = await gql(admin, query, f=first, **used)
    assert refused.codes == ["BAD_REQUEST"], refused.errors
    assert refused.data is None
    assert (
        f"must be from 1 to {maximum:,}, got {first}: nothing ran" in (refused.errors[0]["message"])
    )
    assert await changes() == before
    assert (await gql(admin, query, f=maximum, **used)).ok()
    assert await changes() != before


@pytest.mark.parametrize(
    "answer",
    [
        'sessions(first: 1, after: "x") { nodes { sessionId } }',
        'memories(first: 1, labels: [{name: "nope", value: "v"}]) { nodes { memoryId } }',
    ],
)
async def test_a_refusal_below_a_mutation_that_ran_says_its_change_was_made(
    state, gql, admin, answer
):
    """What a list refuses only once it knows its parent (a cursor bound to the agent just
    made, a label its harness declares) fails after the change was made, and `data` is null:
    the error says so, so that the client reads back rather than making the change twice."""
    failed = await gql(admin, f'mutation {{ createAction(input: {{name: "new"}}) {{ {answer} }} }}')
    assert failed.codes == ["BAD_REQUEST"] and failed.data is None
    assert failed.errors[0]["message"].endswith(
        "(the mutation ran and its change was made before this part of its answer failed: read "
        "it back rather than sending the mutation again)"
    )
    listed = await gql(admin, "{ actions(first: 10) { nodes { name } } }")
    assert [a["name"] for a in listed.ok()["actions"]["nodes"]] == ["new"]
    # A mutation refused itself made nothing, and says nothing of the kind.
    refused = await gql(admin, 'mutation { createAction(input: {name: " "}) { actionId } }')
    assert refused.codes == ["BAD_REQUEST"]
    assert "mutation ran" not in refused.errors[0]["message"]


async def test_a_page_left_out_by_skip_is_not_refused(state, gql, admin):
    ran = await gql(
        admin,
        'mutation($no: Boolean!) { createAction(input: {name: "n"}) { actionId '
        "sessions(first: 0) @skip(if: $no) { nodes { sessionId } } } }",
        no=True,
    )
    assert ran.ok()["createAction"]["actionId"]


# --- node -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "node_id",
    [
        "%%%",
        global_id("Nothing", "x"),
        global_id("Action", "not-a-uuid", 1),
        global_id("Action", "1ce1792c-f822-49c0-be3d-991d9e222750"),
        global_id("Action", "0a50f328-89e8-44cf-bf37-1a4aadfa2f2d", "one"),
        global_id("Client", "cbf1e063-5d8d-4221-a66f-262de3e718c1"),
    ],
)
async def test_bad_or_unknown_node_ids_are_bad_request_or_not_found(gql, admin, node_id):
    result = await gql(admin, NODE, id=node_id)
    assert result.codes in (["BAD_REQUEST"], ["NOT_FOUND"]), result.errors
    assert result.data is None


async def test_node_of_a_missing_action_is_not_found(gql, admin):
    result = await gql(admin, NODE, id=global_id("Action", uuid4(), 1))
    assert result.codes == ["NOT_FOUND"]


# --- tenant isolation -------------------------------------------------------------------------


@pytest.fixture
async def a_action(gql, state):
    a = await make_account(state, "A")
    owner = caller(a, EVERYTHING)
    v1 = await create(gql, owner, name="secret agent", instructions="A's secret instructions")
    v2 = (await gql(owner, UPDATE, id=v1["actionId"], input={"name": "secret agent 2"})).ok()[
        "updateAction"
    ]
    intruder = caller(await make_account(state, "B"), EVERYTHING, principal="mallory")
    return owner, intruder, v1, v2


async def test_b_cannot_read_a_actions_or_versions(gql, a_action):
    _, intruder, v1, _ = a_action
    for version in (None, 1, 2):
        result = await gql(intruder, ACTION, id=v1["actionId"], version=version)
        assert result.ok()["action"] is None


async def test_b_cannot_list_a_actions(gql, a_action):
    _, intruder, _, _ = a_action
    listed = (await gql(intruder, ACTIONS, first=100)).ok()["actions"]
    assert listed["nodes"] == [] and listed["pageInfo"]["hasNextPage"] is False


async def test_b_cannot_node_look_up_a_actions(gql, a_action):
    _, intruder, v1, v2 = a_action
    for node_id in (v1["id"], v2["id"]):
        result = await gql(intruder, NODE, id=node_id)
        assert result.codes == ["NOT_FOUND"] and result.data is None
        assert "secret" not in str(result.errors)


async def test_b_cannot_update_a_actions(gql, a_action):
    owner, intruder, v1, _ = a_action
    result = await gql(intruder, UPDATE, id=v1["actionId"], input={"name": "hijacked"})
    assert result.codes == ["NOT_FOUND"] and result.data is None
    current = (await gql(owner, ACTION, id=v1["actionId"])).ok()["action"]
    assert (current["version"], current["name"]) == (2, "secret agent 2")


async def test_b_own_actions_do_not_mix_with_a(gql, a_action):
    owner, intruder, _, _ = a_action
    mine = await create(gql, intruder, name="b agent")
    assert [
        n["actionId"] for n in (await gql(intruder, ACTIONS, first=10)).ok()["actions"]["nodes"]
    ] == [mine["actionId"]]
    assert len((await gql(owner, ACTIONS, first=10)).ok()["actions"]["nodes"]) == 1


# --- errors: codes, masking, logging ----------------------------------------------------------


async def test_unexpected_exception_is_internal_and_masked(gql, admin, monkeypatch, caplog):
    async def broken(*args, **kwargs):
        raise RuntimeError("password=hunter2 at db.internal:5432")

    monkeypatch.setattr(actions_service, "create_action", broken)
    with caplog.at_level(logging.ERROR):
        result = await gql(admin, CREATE, input={"name": "a"})
    assert result.codes == ["INTERNAL"]
    assert result.errors[0]["message"] == "Internal error."
    assert result.data is None
    assert "hunter2" not in str(result.errors)
    # The operator still sees what went wrong, with its stack, once.
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], RuntimeError)]
    assert len(logged) == 1


async def test_domain_and_request_errors_log_no_stack_trace(gql, state, admin, caplog):
    account = await make_account(state)
    with caplog.at_level(logging.DEBUG):
        assert (await gql(caller(account), CREATE, input={"name": "a"})).codes == ["ACCESS_DENIED"]
        assert (await gql(admin, CREATE, input={"name": " "})).codes == ["BAD_REQUEST"]
        assert (await gql(admin, UPDATE, id=str(uuid4()), input={"name": "x"})).codes == [
            "NOT_FOUND"
        ]
        assert (await gql(admin, "{ nope }")).codes == ["BAD_REQUEST"]
        assert (await gql(admin, "{ viewer { ")).codes == ["BAD_REQUEST"]
        assert (await gql(admin, ACTION, id="not-a-uuid")).codes == ["BAD_REQUEST"]
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == []


# A page's document fields are read directly once the caller may read them (app/graphql/
# field_completion.py's guard): the answer, errors and their paths included, is strawberry's own,
# for a reader with the grant, one without it (each field refused), and a creator without it
# (the version it wrote is readable).
async def test_document_fields_answer_as_strawberrys_own_path(state, gql, admin, monkeypatch):
    for i in range(3):
        await create(gql, admin, name=f"a{i}")
    listing = "query { actions(first: 10) { nodes { actionId name model createdBy version } } }"
    no_document = caller(admin.account_id, allow(["SELECT"], "financial.Action.indexes.*"))
    creator = caller(admin.account_id, allow(["INSERT"], "financial.Action.document"))

    async def answer(guarded: bool, who: Caller, query: str, **variables: Any) -> dict:
        monkeypatch.setattr(
            field_completion, "_PLANS", {}
        )  # plans made again, with or without guards
        if not guarded:
            monkeypatch.setattr(field_completion, "_guard", lambda definition: None)
        result = await gql(who, query, **variables)
        monkeypatch.undo()
        return {"data": result.data, "errors": result.errors}

    for who in (admin, no_document):
        assert await answer(True, who, listing) == await answer(False, who, listing)
    guarded = field_completion._plan(schema._schema.type_map["Action"])
    assert guarded["name"][5] is not None and guarded["version"][5] is None
    refused = await answer(True, no_document, listing)
    assert refused["errors"] and refused["data"] is None
    assert {e["extensions"]["code"] for e in refused["errors"]} == {"ACCESS_DENIED"}
    # Each creation writes an agent of its own: its ID and times differ, the rest is the same.
    new = [
        await answer(guarded, creator, CREATE, input={"name": "new"}) for guarded in (True, False)
    ]
    assert [n["errors"] for n in new] == [[], []]
    each = [
        {
            k: v
            for k, v in n["data"]["createAction"].items()
            if k not in ("id", "actionId", "created", "modified")
        }
        for n in new
    ]
    assert each[0] == each[1] and each[0]["name"] == "new" and each[0]["createdBy"] == "someone"
