"""M55 as documented (issue 11, item 8): the spec's memory grants alone reach an agent's
memories through `action(actionId)`; the action's own document fields check their grant one by
one; `searchMemories` without a query lists and with `ids` reads, needing what those need."""

import pytest
from factories import allow, caller, deny, make_agent, remember

INDEXES = "financial.AgentMemory.indexes.*"
DOCUMENT = "financial.AgentMemory.document"

MEMORIES = """query($a: UUID!) { action(actionId: $a) { actionId version
  memories(first: 10) { nodes { memoryId summary } } } }"""
MEMORY = """query($a: UUID!, $id: UUID!) { action(actionId: $a) {
  memory(id: $id) { memoryId action { actionId version } } } }"""
SEARCH = """query($a: UUID!, $q: String, $ids: [UUID!]) { action(actionId: $a) {
  searchMemories(query: $q, ids: $ids, first: 10) { nodes { memoryId } } } }"""


# M55
async def test_m55_the_spec_grants_alone_list_and_read_through_action(state, gql, admin):
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "prefers email", scope="AGENT")
    spec = caller(admin.account_id, allow(["SELECT"], INDEXES, DOCUMENT), principal="operator")
    a, id_ = str(agent.action_id), str(record.memory_id)

    listed = (await gql(spec, MEMORIES, a=a)).ok()["action"]
    assert listed["actionId"] == a and listed["version"] == 1
    assert listed["memories"]["nodes"] == [{"memoryId": id_, "summary": "prefers email"}]
    read = (await gql(spec, MEMORY, a=a, id=id_)).ok()["action"]["memory"]
    assert read == {"memoryId": id_, "action": {"actionId": a, "version": 1}}
    found = (await gql(spec, SEARCH, a=a, q="email")).ok()["action"]["searchMemories"]
    assert found["nodes"] == [{"memoryId": id_}]


@pytest.mark.parametrize(
    "field", ["name", "instructions", "model", "harness", "created", "createdBy", "currentVersion"]
)
async def test_the_actions_document_fields_need_their_grant_one_by_one(state, gql, admin, field):
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    spec = caller(admin.account_id, allow(["SELECT"], INDEXES, DOCUMENT))
    query = f"query($a: UUID!) {{ action(actionId: $a) {{ actionId {field} }} }}"
    refused = await gql(spec, query, a=a)
    assert refused.codes == ["ACCESS_DENIED"] and refused.data is None
    assert "SELECT financial.Action.document" in refused.errors[0]["message"]
    # Reached from a record, the action is the same: its ID, not its document.
    via_memory = f"""query($a: UUID!, $id: UUID!) {{ agentMemory(actionId: $a, id: $id) {{
      action {{ {field} }} }} }}"""
    record = await remember(state, agent, "a fact", scope="AGENT")
    refused = await gql(spec, via_memory, a=a, id=str(record.memory_id))
    assert refused.codes == ["ACCESS_DENIED"]
    granted = caller(
        admin.account_id,
        allow(["SELECT"], INDEXES, DOCUMENT),
        allow(["SELECT"], "financial.Action.document"),
    )
    assert (await gql(granted, query, a=a)).ok()["action"][field] is not None


async def test_writing_an_action_returns_it_to_its_writer(state, gql, admin):
    writer = caller(admin.account_id, allow(["INSERT"], "financial.Action.document"))
    created = await gql(writer, 'mutation { createAction(input: {name: "w"}) { name version } }')
    assert created.ok()["createAction"] == {"name": "w", "version": 1}


# Who asks -> (may search with a query, may list without one, may read by ids)
SEARCH_MATRIX = {
    "spec grants": ([allow(["SELECT"], INDEXES, DOCUMENT)], (True, True, True)),
    "deny the created index": (
        [allow(["SELECT"], "*"), deny(["SELECT"], "financial.AgentMemory.indexes.created")],
        (True, False, False),
    ),
    "deny the search index": (
        [allow(["SELECT"], "*"), deny(["SELECT"], "financial.AgentMemory.indexes.search")],
        (False, True, True),
    ),
    "search index and document": (
        [allow(["SELECT"], "financial.AgentMemory.indexes.search", DOCUMENT)],
        (True, False, False),
    ),
}


# M55
@pytest.mark.parametrize("who", list(SEARCH_MATRIX))
async def test_m55_search_without_a_query_is_a_listing_and_with_ids_a_read(state, gql, admin, who):
    policies, (may_search, may_list, may_read) = SEARCH_MATRIX[who]
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "prefers email", scope="AGENT")
    asker = caller(admin.account_id, *policies)
    a, id_ = str(agent.action_id), str(record.memory_id)
    for allowed, variables in (
        (may_search, {"q": "email"}),
        (may_list, {}),
        (may_read, {"ids": [id_]}),
        (may_search and may_read, {"q": "email", "ids": [id_]}),
    ):
        result = await gql(asker, SEARCH, a=a, **variables)
        if allowed:
            assert result.ok()["action"]["searchMemories"]["nodes"] == [{"memoryId": id_}]
        else:
            assert result.codes == ["ACCESS_DENIED"], (variables, result.errors)
