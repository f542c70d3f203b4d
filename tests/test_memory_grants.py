"""M55: the grants the operator API on memory needs, whoever asks; M26: the agent's own use of
its memory needs none and grants nothing to anyone."""

import uuid

import pytest
from factories import (
    allow,
    caller,
    commit,
    deny,
    make_account,
    make_agent,
    record_turn,
    remember,
    work,
    writer,
)

from app.memory.service import NewMemory

DOCUMENT = "financial.AgentMemory.document"
INDEXES = "financial.AgentMemory.indexes.*"
ACTION = allow(["SELECT"], "financial.Action.document")  # to reach Action.memories at all

LIST = "query($a: UUID!) { action(actionId: $a) { memories(first: 10) { nodes { memoryId } } } }"
READ = "query($a: UUID!, $id: UUID!) { agentMemory(actionId: $a, id: $id) { memoryId status } }"
READ_VIA_ACTION = (
    "query($a: UUID!, $id: UUID!) { action(actionId: $a) { memory(id: $id) { memoryId } } }"
)
HISTORY = """query($a: UUID!, $id: UUID!) {
  agentMemory(actionId: $a, id: $id) { history(first: 5) { nodes { version } } } }"""
DELETE = """mutation($a: UUID!, $id: UUID!) {
  deleteAgentMemory(actionId: $a, id: $id) { status modifiedBy } }"""
ADD = """mutation($a: UUID!) {
  addAgentMemory(actionId: $a, input: {summary: "seeded", kind: "fact"}) { memoryId source } }"""
NODE = "query($id: ID!) { node(id: $id) { ... on ActionAgentMemory { memoryId } } }"
GLOBAL_ID = "query($a: UUID!, $id: UUID!) { agentMemory(actionId: $a, id: $id) { id } }"

# Who asks -> (may list and read, may delete, may add). Adding returns the stored record, so
# it needs the grants that read it besides INSERT.
MATRIX = {
    "no grant": ([ACTION], (False, False, False)),
    "indexes only": ([ACTION, allow(["SELECT"], INDEXES)], (False, False, False)),
    "one index only": (
        [ACTION, allow(["SELECT"], "financial.AgentMemory.indexes.created")],
        (False, False, False),
    ),
    "document only": ([ACTION, allow(["SELECT"], DOCUMENT)], (False, False, False)),
    "both": ([ACTION, allow(["SELECT"], INDEXES, DOCUMENT)], (True, False, False)),
    "update only": ([ACTION, allow(["UPDATE"], DOCUMENT)], (False, False, False)),
    "both with update": (
        [ACTION, allow(["SELECT"], INDEXES, DOCUMENT), allow(["UPDATE"], DOCUMENT)],
        (True, True, False),
    ),
    "insert only": ([ACTION, allow(["INSERT"], DOCUMENT)], (False, False, False)),
    "insert and read": (
        [ACTION, allow(["INSERT"], DOCUMENT), allow(["SELECT"], INDEXES, DOCUMENT)],
        (True, False, True),
    ),
    "wildcard": (
        [ACTION, allow(["SELECT", "UPDATE", "INSERT"], "financial.AgentMemory.*")],
        (True, True, True),
    ),
    "deny document": (
        [allow(["SELECT", "UPDATE", "INSERT"], "*"), deny(["SELECT"], DOCUMENT)],
        (False, False, False),
    ),
    "deny indexes": (
        [
            allow(["SELECT", "UPDATE", "INSERT"], "*"),
            deny(["SELECT"], "financial.AgentMemory.indexes.*"),
        ],
        (False, False, False),
    ),
    "deny update": (
        [allow(["SELECT", "UPDATE", "INSERT"], "*"), deny(["UPDATE"], "financial.*")],
        (True, False, True),
    ),
    "deny insert": (
        [allow(["SELECT", "UPDATE", "INSERT"], "*"), deny(["INSERT"], DOCUMENT)],
        (True, True, False),
    ),
}


# M55
@pytest.mark.parametrize("who", list(MATRIX))
async def test_m55_grant_matrix(state, gql, admin, who):
    policies, (may_read, may_delete, may_add) = MATRIX[who]
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "guarded", scope="AGENT")
    asker = caller(admin.account_id, *policies, principal="asker")
    a, id_ = str(agent.action_id), str(record.memory_id)

    for query in (LIST, READ, READ_VIA_ACTION, HISTORY):
        result = await gql(asker, query, a=a, id=id_)
        if may_read:
            assert not result.errors, (query, result.errors)
        else:
            assert result.codes == ["ACCESS_DENIED"] and result.data is None, (query, result.errors)
            assert "financial.AgentMemory" in result.errors[0]["message"]
    if may_read:
        assert (await gql(asker, LIST, a=a)).ok()["action"]["memories"]["nodes"] == [
            {"memoryId": id_}
        ]
    # node(id) reads the record as agentMemory does, with the same grants.
    global_id = (await gql(admin, GLOBAL_ID, a=a, id=id_)).ok()["agentMemory"]["id"]
    by_node = await gql(asker, NODE, id=global_id)
    if may_read:
        assert by_node.ok()["node"] == {"memoryId": id_}
    else:
        assert by_node.codes == ["ACCESS_DENIED"] and by_node.data is None

    added = await gql(asker, ADD, a=a)
    if may_add:
        assert added.ok()["addAgentMemory"]["source"] == "OPERATOR"
    else:
        assert added.codes == ["ACCESS_DENIED"]

    deleted = await gql(asker, DELETE, a=a, id=id_)
    if may_delete:
        assert deleted.ok()["deleteAgentMemory"] == {"status": "DELETED", "modifiedBy": "asker"}
    else:
        assert deleted.codes == ["ACCESS_DENIED"]
        check = (await gql(admin, READ, a=a, id=id_)).ok()["agentMemory"]
        assert check["status"] == "ACTIVE"  # a refused delete changes nothing


REPLACE = """mutation($a: UUID!, $id: UUID!) {
  addAgentMemory(actionId: $a, input: {summary: "corrected", kind: "fact", scope: AGENT,
                                       replaces: $id}) { memoryId replaces } }"""
INSERT_GRANT = allow(["INSERT"], DOCUMENT)
READ_GRANT = allow(["SELECT"], INDEXES, DOCUMENT)
UPDATE_GRANT = allow(["UPDATE"], DOCUMENT)
# Who asks -> may replace: a replacement removes the record it replaces from recall, as a
# deletion does, so it needs the delete grants (SELECT and UPDATE) besides INSERT.
REPLACE_MATRIX = {
    "insert only": ([ACTION, INSERT_GRANT], False),
    "insert and read": ([ACTION, INSERT_GRANT, READ_GRANT], False),
    "insert and update": ([ACTION, INSERT_GRANT, UPDATE_GRANT], False),
    "insert, read and update": ([ACTION, INSERT_GRANT, READ_GRANT, UPDATE_GRANT], True),
    "deny update": (
        [allow(["SELECT", "UPDATE", "INSERT"], "*"), deny(["UPDATE"], DOCUMENT)],
        False,
    ),
    "deny the indexes": (
        [allow(["SELECT", "UPDATE", "INSERT"], "*"), deny(["SELECT"], INDEXES)],
        False,
    ),
}


# M55 M42
@pytest.mark.parametrize("who", list(REPLACE_MATRIX))
async def test_m55_replacing_a_record_needs_the_delete_grants(state, gql, admin, who):
    policies, may_replace = REPLACE_MATRIX[who]
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "to correct", scope="AGENT")
    asker = caller(admin.account_id, *policies, principal="asker")
    a, id_ = str(agent.action_id), str(record.memory_id)

    replaced = await gql(asker, REPLACE, a=a, id=id_)
    after = (await gql(admin, READ_STATUS, a=a, id=id_)).ok()["agentMemory"]
    if may_replace:
        assert replaced.ok()["addAgentMemory"]["replaces"] == id_
        assert after["status"] == "SUPERSEDED"
    else:
        assert replaced.codes == ["ACCESS_DENIED"] and replaced.data is None
        assert after == {"status": "ACTIVE", "replacedBy": None}  # nothing changed
        async with state.pool.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM agent_memories") == 1
            assert (
                await conn.fetchval("SELECT count(*) FROM executions WHERE kind = 'OPERATOR'") == 0
            )


READ_STATUS = """query($a: UUID!, $id: UUID!) {
  agentMemory(actionId: $a, id: $id) { status replacedBy } }"""


# M55
async def test_m55_another_account_never_reaches_the_records(state, gql, admin):
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "tenant one's", scope="AGENT")
    stranger = caller(await make_account(state), allow(["SELECT", "UPDATE", "INSERT"], "*"))
    a, id_ = str(agent.action_id), str(record.memory_id)
    assert (await gql(stranger, READ, a=a, id=id_)).ok()["agentMemory"] is None
    assert (await gql(stranger, LIST, a=a)).ok()["action"] is None
    assert (await gql(stranger, DELETE, a=a, id=id_)).codes == ["NOT_FOUND"]
    assert (await gql(stranger, ADD, a=a)).codes == ["NOT_FOUND"]
    found = (await gql(admin, READ, a=a, id=id_)).ok()["agentMemory"]
    node_id = (
        await gql(
            admin,
            "query($a: UUID!, $id: UUID!) { agentMemory(actionId: $a, id: $id) { id } }",
            a=a,
            id=id_,
        )
    ).ok()["agentMemory"]["id"]
    assert (await gql(stranger, NODE, id=node_id)).codes == ["NOT_FOUND"]
    assert found["status"] == "ACTIVE"


# M53
async def test_m53_execution_and_session_links_follow_the_readers_grants(state, gql, admin):
    agent = await make_agent(state, admin)
    w = writer(agent, session="chat-1")
    await record_turn(state, w)
    unit = work(state, w)
    (record,) = await unit.add(NewMemory(summary="linked", kind="fact"))
    await commit(state, unit)
    memory_only = caller(admin.account_id, allow(["SELECT"], INDEXES, DOCUMENT))
    a, id_ = str(agent.action_id), str(record.memory_id)
    # The action resolves without its grant (its ID is the record's), not its document.
    for link in ("execution { executionId }", "session { sessionId }", "action { name }"):
        query = (
            f"query($a: UUID!, $id: UUID!) {{ agentMemory(actionId: $a, id: $id) {{ {link} }} }}"
        )
        refused = await gql(memory_only, query, a=a, id=id_)
        assert refused.codes == ["ACCESS_DENIED"], link
    both = caller(
        admin.account_id,
        allow(["SELECT"], INDEXES, DOCUMENT),
        allow(["SELECT"], "financial.ActionExecution.*", "financial.Action.document"),
    )
    query = """query($a: UUID!, $id: UUID!) { agentMemory(actionId: $a, id: $id) {
        execution { executionId } session { sessionId } action { version } } }"""
    linked = (await gql(both, query, a=a, id=id_)).ok()["agentMemory"]
    assert linked == {
        "execution": {"executionId": str(w.execution_id)},
        "session": {"sessionId": "chat-1"},
        "action": {"version": 1},
    }


# M26
async def test_m26_the_agent_uses_its_memory_without_grants_and_grants_nothing(state, gql):
    account = await make_account(state)
    builder = caller(account, allow(["INSERT"], "financial.Action.document"))
    agent = await make_agent(state, builder)
    # Its turns save, read, replace and delete without any policy on financial.AgentMemory.
    first = await remember(state, agent, "learned in a turn", scope="AGENT")
    second = await remember(state, agent, "corrected", scope="AGENT", replaces=first.memory_id)
    unit = work(state, writer(agent))
    assert (await unit.read(second.memory_id)).summary == "corrected"
    assert (await unit.delete(second.memory_id)).status == "DELETED"
    await commit(state, unit)
    # Whoever starts or calls the agent still needs the grants to read its memory.
    starter = caller(
        account,
        allow(["SELECT", "INSERT", "UPDATE"], "financial.Action.*", "financial.ActionExecution.*"),
    )
    a, id_ = str(agent.action_id), str(first.memory_id)
    assert (await gql(starter, READ, a=a, id=id_)).codes == ["ACCESS_DENIED"]
    assert (await gql(starter, LIST, a=a)).codes == ["ACCESS_DENIED"]
    assert (await gql(starter, DELETE, a=a, id=id_)).codes == ["ACCESS_DENIED"]
    assert uuid.UUID(id_) == first.memory_id
