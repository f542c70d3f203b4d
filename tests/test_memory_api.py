"""The operator API on memory records (GraphQL): fields, listing, reads, history, deletion,
operator writes, node look-ups, and preview records as operators see them."""

import uuid
from datetime import datetime

import pytest
from factories import (
    allow,
    caller,
    commit,
    forget,
    full_memory,
    listed,
    make_agent,
    record_turn,
    remember,
    work,
    writer,
)

from app.actions import service as actions
from app.actions.harness import SearchConfig
from app.memory import search as memory_search
from app.memory.service import NewMemory

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")
FIELDS = """
  id memoryId created modified version actionId summary content metadata status scope kind
  source pinned labels { number value name } replaces replacedBy preview executionId
  invocationNumber actionVersion sessionId modifiedBy
"""
AGENT_MEMORY = f"""
query($actionId: UUID!, $id: UUID!, $version: Int) {{
  agentMemory(actionId: $actionId, id: $id, version: $version) {{ {FIELDS} }}
}}"""
ACTION_MEMORY = """
query($actionId: UUID!, $id: UUID!, $version: Int) {
  action(actionId: $actionId) { memory(id: $id, version: $version) { memoryId version status } }
}"""
MEMORIES = """
query($actionId: UUID!, $first: Int!, $after: String, $sort: SortOrder) {
  action(actionId: $actionId) {
    memories(first: $first, after: $after, sort: $sort) {
      edges { cursor node { memoryId summary status preview replaces created } }
      nodes { memoryId }
      pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    }
  }
}"""
HISTORY = """
query($actionId: UUID!, $id: UUID!, $first: Int!, $after: String) {
  agentMemory(actionId: $actionId, id: $id) {
    history(first: $first, after: $after) {
      edges { cursor node { id memoryId version status modifiedBy } }
      pageInfo { hasNextPage endCursor }
    }
  }
}"""
DELETE = f"""
mutation($actionId: UUID!, $id: UUID!) {{
  deleteAgentMemory(actionId: $actionId, id: $id) {{ {FIELDS} }}
}}"""
ADD = f"""
mutation($actionId: UUID!, $input: AgentMemoryInput!) {{
  addAgentMemory(actionId: $actionId, input: $input) {{
    {FIELDS} execution {{ executionId status }}
  }}
}}"""
NODE = (
    "query($id: ID!) { node(id: $id) { id ... on ActionAgentMemory { memoryId version status } } }"
)


@pytest.fixture
async def agent(state, admin):
    return await make_agent(state, admin)


async def memories(gql, who, agent, **variables):
    result = await gql(who, MEMORIES, actionId=str(agent.action_id), **variables)
    return result.ok()["action"]["memories"]


async def all_listed(gql, who, agent, sort=None) -> list[str]:
    return [
        n["memoryId"] for n in (await memories(gql, who, agent, first=1000, sort=sort))["nodes"]
    ]


def type_name(t) -> str:
    if t["kind"] == "NON_NULL":
        return type_name(t["ofType"]) + "!"
    if t["kind"] == "LIST":
        return "[" + type_name(t["ofType"]) + "]"
    return t["name"]


# M59
async def test_m59_every_field_of_the_record_with_its_type(gql, admin):
    introspect = """
    { __type(name: "ActionAgentMemory") { interfaces { name } fields { name
        args { name type { kind name ofType { kind name } } }
        type { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } }"""
    found = (await gql(admin, introspect)).ok()["__type"]
    assert [i["name"] for i in found["interfaces"]] == ["Node"]
    types = {f["name"]: type_name(f["type"]) for f in found["fields"]}
    spec = {
        "id": "ID!",
        "memoryId": "UUID!",
        "created": "Timestamp!",
        "modified": "Timestamp!",
        "version": "Int!",
        "actionId": "UUID!",
        "summary": "String!",
        "content": "String!",
        "metadata": "Value!",
        "status": "ActionAgentMemoryStatus!",
        "scope": "ActionAgentMemoryScope!",
        "kind": "String!",
        "source": "ActionAgentMemorySource!",
        "pinned": "Boolean!",
        "labels": "[ActionAgentMemoryLabel!]!",
        "replaces": "UUID",
        "replacedBy": "UUID",
        "preview": "Boolean!",
        "executionId": "UUID!",
        "invocationNumber": "Int!",
        "actionVersion": "Int!",
        "sessionId": "String",
        "modifiedBy": "String!",
        "action": "Action!",
        "session": "ActionSession",
        "history": "ActionAgentMemoryConnection!",
    }
    assert {name: types.get(name) for name in spec} == spec
    history = next(f for f in found["fields"] if f["name"] == "history")
    assert [a["name"] for a in history["args"]] == ["first", "after"]
    enums = """{ s: __type(name: "ActionAgentMemoryStatus") { enumValues { name } }
                 c: __type(name: "ActionAgentMemoryScope") { enumValues { name } }
                 o: __type(name: "ActionAgentMemorySource") { enumValues { name } } }"""
    values = (await gql(admin, enums)).ok()
    assert [v["name"] for v in values["s"]["enumValues"]] == ["ACTIVE", "DELETED", "SUPERSEDED"]
    assert [v["name"] for v in values["c"]["enumValues"]] == ["SESSION", "AGENT"]
    # The spec's three, and MCP: records a client's tool call over MCP wrote (issue 15).
    assert [v["name"] for v in values["o"]["enumValues"]] == [
        "EXTRACTION",
        "TOOL",
        "OPERATOR",
        "MCP",
    ]


# M53
async def test_m53_record_names_and_reads_the_execution_invocation_version_and_session(
    state, gql, admin, agent
):
    w = writer(agent, session="chat-7", invocation=2)
    await record_turn(state, w)
    unit = work(state, w)
    (record,) = await unit.add(
        NewMemory(
            summary="prefers phone", kind="fact", labels={"ticket": "T-1", "customer_id": "c-9"}
        )
    )
    await commit(state, unit)
    await actions.update_action(
        state.pool,
        admin,
        action_id=agent.action_id,
        name="support v2",
        instructions="",
        model=None,
        harness=agent.harness.raw,
    )
    query = f"""
    query($actionId: UUID!, $id: UUID!) {{ agentMemory(actionId: $actionId, id: $id) {{ {FIELDS}
        action {{ actionId version name }} session {{ sessionId }}
        execution {{ executionId invocationNumber actionVersion sessionId preview }} }} }}"""
    found = (await gql(admin, query, actionId=str(agent.action_id), id=str(record.memory_id))).ok()
    m = found["agentMemory"]
    assert m["executionId"] == str(w.execution_id) and m["invocationNumber"] == 2
    assert m["actionVersion"] == 1 and m["sessionId"] == "chat-7"
    assert m["modifiedBy"] == f"action:{agent.action_id}" and m["source"] == "TOOL"
    assert m["action"] == {"actionId": str(agent.action_id), "version": 1, "name": "support"}
    assert m["session"] == {"sessionId": "chat-7"}
    assert m["execution"] == {
        "executionId": str(w.execution_id),
        "invocationNumber": 2,
        "actionVersion": 1,
        "sessionId": "chat-7",
        "preview": False,
    }
    assert m["labels"] == [
        {"number": 5, "value": "c-9", "name": "customer_id"},
        {"number": 7, "value": "T-1", "name": "ticket"},
    ]
    assert (m["status"], m["scope"], m["kind"], m["version"]) == ("ACTIVE", "SESSION", "fact", 1)
    assert m["metadata"] == {} and m["content"] == "" and m["pinned"] is False
    assert m["replaces"] is None and m["replacedBy"] is None and m["preview"] is False
    assert m["created"].endswith("Z") and m["created"] == m["modified"]


# M53
async def test_m53_a_record_without_a_session_has_no_session(state, gql, admin):
    sessionless = await make_agent(
        state, admin, name="n", harness=full_memory(scope={"read": ["agent"], "write": ["agent"]})
    )
    record = await remember(state, sessionless, "no session", session=None)
    query = """query($a: UUID!, $id: UUID!) {
      agentMemory(actionId: $a, id: $id) { sessionId session { sessionId } } }"""
    found = (await gql(admin, query, a=str(sessionless.action_id), id=str(record.memory_id))).ok()
    assert found["agentMemory"] == {"sessionId": None, "session": None}


# M56
async def test_m56_memories_newest_first_unless_asc_in_keyset_pages(state, gql, admin, agent):
    ids = [str((await remember(state, agent, f"fact {i}")).memory_id) for i in range(5)]
    assert await all_listed(gql, admin, agent) == ids[::-1]
    assert await all_listed(gql, admin, agent, sort="DESC") == ids[::-1]
    assert await all_listed(gql, admin, agent, sort="ASC") == ids
    first = await memories(gql, admin, agent, first=2)
    assert [e["node"]["memoryId"] for e in first["edges"]] == ids[4:2:-1]
    assert first["pageInfo"]["hasNextPage"] and not first["pageInfo"]["hasPreviousPage"]
    assert first["pageInfo"]["endCursor"] == first["edges"][-1]["cursor"]
    second = await memories(gql, admin, agent, first=2, after=first["pageInfo"]["endCursor"])
    assert [n["memoryId"] for n in second["nodes"]] == ids[2:0:-1]
    assert second["pageInfo"]["hasPreviousPage"]
    last = await memories(gql, admin, agent, first=2, after=second["pageInfo"]["endCursor"])
    assert [n["memoryId"] for n in last["nodes"]] == ids[:1]
    assert not last["pageInfo"]["hasNextPage"]
    asc = await memories(gql, admin, agent, first=3, sort="ASC")
    rest = await memories(
        gql, admin, agent, first=3, sort="ASC", after=asc["pageInfo"]["endCursor"]
    )
    assert [n["memoryId"] for n in asc["nodes"] + rest["nodes"]] == ids
    bad = await gql(admin, MEMORIES, actionId=str(agent.action_id), first=2, after="nonsense")
    assert bad.codes == ["BAD_REQUEST"]
    too_many = await gql(admin, MEMORIES, actionId=str(agent.action_id), first=5000)
    assert too_many.codes == ["BAD_REQUEST"]


# M56 P5
async def test_m56_p5_deleted_and_superseded_omitted_except_preview_deletions(
    state, gql, admin, agent
):
    active = await remember(state, agent, "active")
    old = await remember(state, agent, "old")
    new = await remember(state, agent, "new", replaces=old.memory_id)
    deleted = await remember(state, agent, "deleted")
    await forget(state, agent, deleted.memory_id)
    preview = await remember(state, agent, "preview record", preview=True)
    live = await remember(state, agent, "live, deleted in preview", scope="AGENT")
    unit = work(state, writer(agent, preview=True))
    deletion = await unit.delete(live.memory_id)
    await commit(state, unit)
    draft = await remember(state, agent, "preview draft deleted in preview", preview=True)
    await forget(state, agent, draft.memory_id, preview=True)
    staged = work(state, writer(agent))
    (pending,) = await staged.add(NewMemory(summary="staged, uncommitted", kind="fact"))

    listed_ids = await all_listed(gql, admin, agent)
    expected = [deletion, live, preview, new, active]
    assert listed_ids == [str(r.memory_id) for r in expected]
    nodes = {n["memoryId"]: n for n in (await memories(gql, admin, agent, first=100))["nodes"]}
    shown = next(
        e["node"]
        for e in (await memories(gql, admin, agent, first=100))["edges"]
        if e["node"]["memoryId"] == str(deletion.memory_id)
    )
    assert (
        shown["status"] == "DELETED"
        and shown["preview"]
        and shown["replaces"] == str(live.memory_id)
    )
    assert str(pending.memory_id) not in nodes
    found = await gql(admin, AGENT_MEMORY, actionId=str(agent.action_id), id=str(pending.memory_id))
    assert found.ok()["agentMemory"] is None  # staged rows are never shown


# M56 P5
async def test_m56_p5_a_deleted_preview_replacement_is_no_preview_deletion(
    state, gql, admin, agent
):
    kept = await remember(state, agent, "live, replaced in preview")
    also = await remember(state, agent, "live, replaced in preview too")
    gone = await remember(state, agent, "live, deleted in preview")
    # Preview records that replace live ones, then deleted: by a preview turn, by an operator.
    draft = await remember(state, agent, "preview draft", preview=True, replaces=kept.memory_id)
    await forget(state, agent, draft.memory_id, preview=True)
    other = await remember(state, agent, "preview draft too", preview=True, replaces=also.memory_id)
    dropped = await gql(admin, DELETE, actionId=str(agent.action_id), id=str(other.memory_id))
    assert dropped.ok()["deleteAgentMemory"]["status"] == "DELETED"
    unit = work(state, writer(agent, preview=True))
    deletion = await unit.delete(gone.memory_id)
    await commit(state, unit)

    for record in (draft, other):  # DELETED, preview, naming a record: and still no deletion
        read = await gql(
            admin, AGENT_MEMORY, actionId=str(agent.action_id), id=str(record.memory_id)
        )
        shown = read.ok()["agentMemory"]
        assert (shown["status"], shown["preview"], shown["replaces"]) == (
            "DELETED",
            True,
            str(record.replaces),
        )
    assert await all_listed(gql, admin, agent) == [
        str(r.memory_id) for r in (deletion, gone, also, kept)
    ]


# M57
async def test_m57_agent_memory_any_status_an_exact_version_or_null(state, gql, admin, agent):
    old = await remember(state, agent, "first wording")
    new = await remember(state, agent, "second wording", replaces=old.memory_id)
    read = lambda **v: gql(admin, AGENT_MEMORY, actionId=str(agent.action_id), **v)  # noqa: E731
    current = (await read(id=str(old.memory_id))).ok()["agentMemory"]
    assert (current["status"], current["version"], current["replacedBy"]) == (
        "SUPERSEDED",
        2,
        str(new.memory_id),
    )
    first = (await read(id=str(old.memory_id), version=1)).ok()["agentMemory"]
    assert (first["status"], first["version"], first["replacedBy"]) == ("ACTIVE", 1, None)
    assert first["id"] != current["id"]
    assert (await read(id=str(old.memory_id), version=2)).ok()["agentMemory"][
        "status"
    ] == "SUPERSEDED"
    assert (await read(id=str(old.memory_id), version=3)).ok()["agentMemory"] is None
    assert (await read(id=str(uuid.uuid4()))).ok()["agentMemory"] is None
    other = await gql(admin, AGENT_MEMORY, actionId=str(uuid.uuid4()), id=str(old.memory_id))
    assert other.ok()["agentMemory"] is None
    via_action = await gql(
        admin, ACTION_MEMORY, actionId=str(agent.action_id), id=str(old.memory_id), version=1
    )
    assert via_action.ok()["action"]["memory"] == {
        "memoryId": str(old.memory_id),
        "version": 1,
        "status": "ACTIVE",
    }
    none = await gql(admin, ACTION_MEMORY, actionId=str(agent.action_id), id=str(uuid.uuid4()))
    assert none.ok()["action"]["memory"] is None


# M54 M58
async def test_m54_m58_deleting_removes_from_recall_and_memories_not_from_reads(
    state, gql, admin, agent
):
    record = await remember(state, agent, "wrong address", scope="AGENT")
    keeper = await remember(state, agent, "right address", scope="AGENT")
    deleter = caller(agent.account_id, EVERYTHING, principal="ops@example.com")
    deleted = (
        await gql(deleter, DELETE, actionId=str(agent.action_id), id=str(record.memory_id))
    ).ok()
    m = deleted["deleteAgentMemory"]
    assert (m["status"], m["version"], m["modifiedBy"]) == ("DELETED", 2, "ops@example.com")
    assert m["executionId"] == str(record.execution_id)  # provenance stays the writer's
    assert await all_listed(gql, admin, agent) == [str(keeper.memory_id)]
    assert record.memory_id not in await listed(state, writer(agent))  # recall no longer finds it
    # Nor does a ranked search, as recall and search_memory run it, in any mode (M54, M58).
    for mode in ("hybrid", "lexical", "vector"):
        found = await memory_search.search(
            state.pool,
            state.embedder,
            writer(agent).reader(),
            SearchConfig(),
            query="wrong address",
            mode=mode,
            limit=10,
        )
        assert [r.memory_id for r in found.records] == [keeper.memory_id], mode
    assert await work(state, writer(agent)).read(record.memory_id) is not None
    read = (
        await gql(admin, AGENT_MEMORY, actionId=str(agent.action_id), id=str(record.memory_id))
    ).ok()
    assert read["agentMemory"]["status"] == "DELETED"
    history = (
        await gql(admin, HISTORY, actionId=str(agent.action_id), id=str(record.memory_id), first=10)
    ).ok()
    assert [
        (e["node"]["version"], e["node"]["status"], e["node"]["modifiedBy"])
        for e in history["agentMemory"]["history"]["edges"]
    ] == [
        (2, "DELETED", "ops@example.com"),
        (1, "ACTIVE", f"action:{agent.action_id}"),
    ]
    again = (await gql(admin, DELETE, actionId=str(agent.action_id), id=str(record.memory_id))).ok()
    assert again["deleteAgentMemory"] == m  # unchanged: same version, same modifiedBy
    history = (
        await gql(admin, HISTORY, actionId=str(agent.action_id), id=str(record.memory_id), first=10)
    ).ok()
    assert len(history["agentMemory"]["history"]["edges"]) == 2
    missing = await gql(admin, DELETE, actionId=str(agent.action_id), id=str(uuid.uuid4()))
    assert missing.codes == ["NOT_FOUND"] and missing.data is None


# M59
async def test_a_change_is_never_dated_before_the_version_it_follows(state, gql, admin, agent):
    """The database's clock stepped back since a record was written (here: its row dated a day
    ahead; its versions are append-only): its deletion is dated no earlier, so its history
    reads in order and an export of it is importable (`engram import` refuses a version
    modified before the record was created)."""
    record = await remember(state, agent, "dated ahead", scope="AGENT")
    async with state.pool.acquire() as conn:
        ahead = await conn.fetchval(
            """
            UPDATE agent_memories SET modified = modified + interval '1 day'
            WHERE memory_id = $1 RETURNING modified
            """,
            record.memory_id,
        )
    deleted = (
        await gql(admin, DELETE, actionId=str(agent.action_id), id=str(record.memory_id))
    ).ok()["deleteAgentMemory"]
    assert deleted["version"] == 2
    assert datetime.fromisoformat(deleted["modified"]) >= ahead


async def test_deleting_a_superseded_record_names_its_successor(state, gql, admin, agent):
    old = await remember(state, agent, "old")
    new = await remember(state, agent, "new", replaces=old.memory_id)
    refused = await gql(admin, DELETE, actionId=str(agent.action_id), id=str(old.memory_id))
    assert refused.codes == ["BAD_REQUEST"] and str(new.memory_id) in refused.errors[0]["message"]


# M59
async def test_m59_history_every_version_newest_first_in_pages(state, gql, admin, agent):
    old = await remember(state, agent, "v1")
    await remember(state, agent, "v2", replaces=old.memory_id)
    variables = {"actionId": str(agent.action_id), "id": str(old.memory_id)}
    page = (await gql(admin, HISTORY, first=1, **variables)).ok()["agentMemory"]["history"]
    assert [e["node"]["version"] for e in page["edges"]] == [2]
    assert page["pageInfo"]["hasNextPage"]
    rest = (
        await gql(admin, HISTORY, first=1, after=page["pageInfo"]["endCursor"], **variables)
    ).ok()
    rest = rest["agentMemory"]["history"]
    assert [(e["node"]["version"], e["node"]["status"]) for e in rest["edges"]] == [(1, "ACTIVE")]
    assert not rest["pageInfo"]["hasNextPage"]
    ids = {e["node"]["id"] for e in page["edges"] + rest["edges"]}
    assert len(ids) == 2  # each version is a node of its own
    for node_id, version in [
        (page["edges"][0]["node"]["id"], 2),
        (rest["edges"][0]["node"]["id"], 1),
    ]:
        found = (await gql(admin, NODE, id=node_id)).ok()["node"]
        assert (found["memoryId"], found["version"]) == (str(old.memory_id), version)


async def test_node_resolves_a_record(state, gql, admin, agent):
    record = await remember(state, agent, "findable")
    read = (
        await gql(admin, AGENT_MEMORY, actionId=str(agent.action_id), id=str(record.memory_id))
    ).ok()
    node = (await gql(admin, NODE, id=read["agentMemory"]["id"])).ok()["node"]
    assert node == {
        "id": read["agentMemory"]["id"],
        "memoryId": str(record.memory_id),
        "version": 1,
        "status": "ACTIVE",
    }
    await forget(state, agent, record.memory_id)
    assert (await gql(admin, NODE, id=read["agentMemory"]["id"])).ok()["node"][
        "status"
    ] == "DELETED"


async def test_add_agent_memory_seeds_a_record_as_an_execution_of_its_own(state, gql, admin, agent):
    operator_caller = caller(agent.account_id, EVERYTHING, principal="ops")
    added = await gql(
        operator_caller,
        ADD,
        actionId=str(agent.action_id),
        input={
            "summary": "VIP customer: escalate at once",
            "content": "Agreed with account management.",
            "kind": "guidance",
            "labels": [{"name": "ticket", "value": "T-3"}, {"number": 5, "value": "c-1"}],
            "sessionId": "chat-1",
            "metadata": {"by": "ops"},
        },
    )
    m = added.ok()["addAgentMemory"]
    assert (m["source"], m["scope"], m["sessionId"], m["modifiedBy"]) == (
        "OPERATOR",
        "SESSION",
        "chat-1",
        "ops",
    )
    assert m["labels"] == [
        {"number": 5, "value": "c-1", "name": "customer_id"},
        {"number": 7, "value": "T-3", "name": "ticket"},
    ]
    assert m["metadata"] == {"by": "ops"} and m["kind"] == "guidance" and m["version"] == 1
    assert m["execution"] == {"executionId": m["executionId"], "status": "SUCCEEDED"}
    async with state.pool.acquire() as conn:
        execution = await conn.fetchrow(
            "SELECT kind, status, principal, session_id, action_version FROM executions "
            "WHERE execution_id = $1",
            uuid.UUID(m["executionId"]),
        )
    assert dict(execution) == {
        "kind": "OPERATOR",
        "status": "SUCCEEDED",
        "principal": "ops",
        "session_id": "chat-1",
        "action_version": 1,
    }
    # The session's turns now recall it; other sessions do not.
    assert uuid.UUID(m["memoryId"]) in await listed(state, writer(agent, session="chat-1"))
    assert uuid.UUID(m["memoryId"]) not in await listed(state, writer(agent, session="chat-2"))
    # Without a session it is an agent-scope record; a correction replaces one.
    wide = (
        await gql(
            operator_caller,
            ADD,
            actionId=str(agent.action_id),
            input={"summary": "office moved", "kind": "fact"},
        )
    ).ok()["addAgentMemory"]
    assert wide["scope"] == "AGENT" and wide["sessionId"] is None
    fix = (
        await gql(
            operator_caller,
            ADD,
            actionId=str(agent.action_id),
            input={
                "summary": "office moved to Oslo",
                "kind": "fact",
                "scope": "AGENT",
                "replaces": wide["memoryId"],
            },
        )
    ).ok()["addAgentMemory"]
    assert fix["replaces"] == wide["memoryId"]
    old = (await gql(admin, AGENT_MEMORY, actionId=str(agent.action_id), id=wide["memoryId"])).ok()
    assert (old["agentMemory"]["status"], old["agentMemory"]["replacedBy"]) == (
        "SUPERSEDED",
        fix["memoryId"],
    )


async def test_add_agent_memory_refusals_leave_nothing(state, gql, admin, agent):
    async def count() -> tuple[int, int]:
        async with state.pool.acquire() as conn:
            return (
                await conn.fetchval("SELECT count(*) FROM agent_memories"),
                await conn.fetchval("SELECT count(*) FROM executions"),
            )

    cases = [
        ({"summary": "x", "kind": "opinion"}, "BAD_REQUEST", "kinds"),
        ({"summary": "two\nlines", "kind": "fact"}, "BAD_REQUEST", "one line"),
        (
            {"summary": "x", "kind": "fact", "labels": [{"name": "region", "value": "eu"}]},
            "BAD_REQUEST",
            "customer_id",
        ),
        (
            {"summary": "x", "kind": "fact", "labels": [{"value": "eu"}]},
            "BAD_REQUEST",
            "name or its number",
        ),
        (
            {
                "summary": "x",
                "kind": "fact",
                "labels": [{"name": "ticket", "number": 5, "value": "a"}],
            },
            "BAD_REQUEST",
            "number 7",
        ),
        ({"summary": "x", "kind": "fact", "scope": "SESSION"}, "BAD_REQUEST", "sessionId"),
        # One rule for every session ID (turns, MCP, operators): 1 to 200 characters, not blank.
        ({"summary": "x", "kind": "fact", "sessionId": "  "}, "BAD_REQUEST", "not blank"),
        ({"summary": "x", "kind": "fact", "sessionId": "s" * 201}, "BAD_REQUEST", "1 to 200"),
        ({"summary": "x", "kind": "fact", "pinned": True}, "BAD_REQUEST", "pinned"),
        ({"summary": "x", "kind": "fact", "replaces": str(uuid.uuid4())}, "NOT_FOUND", "not found"),
    ]
    for input, code, words in cases:
        result = await gql(admin, ADD, actionId=str(agent.action_id), input=input)
        assert result.codes == [code], (input, result.errors)
        assert words in result.errors[0]["message"], (input, result.errors)
    missing = await gql(
        admin, ADD, actionId=str(uuid.uuid4()), input={"summary": "x", "kind": "fact"}
    )
    assert missing.codes == ["NOT_FOUND"]
    assert await count() == (0, 0)


async def test_an_operator_seeds_only_scopes_the_agent_reads(state, gql, admin):
    session_reader = await make_agent(
        state,
        admin,
        name="s",
        harness=full_memory(scope={"read": ["session"], "write": ["session"]}),
    )
    refused = await gql(
        admin,
        ADD,
        actionId=str(session_reader.action_id),
        input={"summary": "never recalled", "kind": "fact", "scope": "AGENT"},
    )
    assert (
        refused.codes == ["BAD_REQUEST"] and "never recalls AGENT" in refused.errors[0]["message"]
    )


async def test_a_seed_refused_for_its_default_scope_says_where_that_scope_came_from(
    state, gql, admin
):
    """An operator who gives no scope gets the one the sessionId implies: the refusal says so
    and what to send, instead of naming a scope the request never mentioned."""
    session_reader = await make_agent(
        state,
        admin,
        name="s",
        harness=full_memory(scope={"read": ["session"], "write": ["session"]}),
    )
    no_session = await gql(
        admin, ADD, actionId=str(session_reader.action_id), input={"summary": "x", "kind": "fact"}
    )
    assert no_session.codes == ["BAD_REQUEST"]
    assert no_session.errors[0]["message"] == (
        "a record without a sessionId is AGENT-scoped, and this agent never recalls AGENT "
        'records: its harness.memory.scope.read is ["session"]; give the sessionId of the '
        "session that recalls it"
    )
    agent_reader = await make_agent(
        state, admin, name="a", harness=full_memory(scope={"read": ["agent"], "write": ["agent"]})
    )
    in_session = await gql(
        admin,
        ADD,
        actionId=str(agent_reader.action_id),
        input={"summary": "x", "kind": "fact", "sessionId": "s1"},
    )
    assert in_session.codes == ["BAD_REQUEST"]
    assert "a record with a sessionId is SESSION-scoped" in in_session.errors[0]["message"]
    assert in_session.errors[0]["message"].endswith("give scope AGENT")


async def test_an_operator_cannot_replace_a_preview_record_but_may_delete_it(
    state, gql, admin, agent
):
    preview = await remember(state, agent, "preview", preview=True, scope="AGENT")
    refused = await gql(
        admin,
        ADD,
        actionId=str(agent.action_id),
        input={"summary": "x", "kind": "fact", "replaces": str(preview.memory_id)},
    )
    assert refused.codes == ["BAD_REQUEST"] and "preview mode" in refused.errors[0]["message"]
    deleted = (
        await gql(admin, DELETE, actionId=str(agent.action_id), id=str(preview.memory_id))
    ).ok()
    assert deleted["deleteAgentMemory"]["status"] == "DELETED"
    assert str(preview.memory_id) not in await all_listed(gql, admin, agent)


async def test_a_turn_that_replaced_a_record_an_operator_deleted_meanwhile_conflicts(
    state, gql, admin, agent
):
    record = await remember(state, agent, "contested")
    unit = work(state, writer(agent))
    await unit.add(NewMemory(summary="correction", kind="fact", replaces=record.memory_id))
    (await gql(admin, DELETE, actionId=str(agent.action_id), id=str(record.memory_id))).ok()
    from app.errors import Conflict

    with pytest.raises(Conflict):
        await commit(state, unit)
    await unit.discard()
    assert await all_listed(gql, admin, agent) == []
