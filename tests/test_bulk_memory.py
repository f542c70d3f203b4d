"""addAgentMemories: many records in one call, one transaction, one execution; all or none."""

import asyncio
import uuid

import pytest
from factories import allow, caller, full_memory, make_agent, remember
from graphql import parse
from graphql.execution.values import get_variable_values
from strawberry.types.arguments import convert_argument
from strawberry.types.base import StrawberryList

from app.graphql.memory import AgentMemoryInput, AgentMemoryLabelInput
from app.graphql.schema import schema

BULK = """
mutation($actionId: UUID!, $inputs: [AgentMemoryInput!]!, $key: String) {
  addAgentMemories(actionId: $actionId, inputs: $inputs, idempotencyKey: $key) {
    executionId memoryIds
    memories { memoryId version status source scope sessionId kind summary replaces
               modifiedBy executionId labels { number value name } }
  }
}"""
COUNT = "SELECT count(*) FROM agent_memories WHERE action_id = $1"
VERSIONS = "SELECT count(*) FROM agent_memory_versions WHERE action_id = $1"


@pytest.fixture
async def agent(state, admin):
    return await make_agent(state, admin)


def inputs(n: int, **extra):
    return [{"summary": f"fact number {i}", "kind": "fact", **extra} for i in range(n)]


async def counts(state, agent) -> tuple[int, int, int]:
    async with state.pool.acquire() as conn:
        return (
            await conn.fetchval(COUNT, agent.action_id),
            await conn.fetchval(VERSIONS, agent.action_id),
            await conn.fetchval(
                "SELECT count(*) FROM executions WHERE action_id = $1", agent.action_id
            ),
        )


async def test_a_thousand_records_in_one_call_one_execution(gql, admin, state, agent):
    result = await gql(admin, BULK, actionId=str(agent.action_id), inputs=inputs(1000))
    added = result.ok()["addAgentMemories"]
    assert len(added["memoryIds"]) == 1000 and len(set(added["memoryIds"])) == 1000
    memories = added["memories"]
    assert [m["memoryId"] for m in memories] == added["memoryIds"]
    assert [m["summary"] for m in memories] == [f"fact number {i}" for i in range(1000)]
    assert {
        (m["version"], m["status"], m["source"], m["scope"], m["modifiedBy"]) for m in memories
    } == {(1, "ACTIVE", "OPERATOR", "AGENT", "admin")}
    assert {m["executionId"] for m in memories} == {added["executionId"]}
    assert await counts(state, agent) == (1000, 1000, 1)
    async with state.pool.acquire() as conn:
        execution = await conn.fetchrow(
            "SELECT kind, status, input FROM executions WHERE execution_id = $1",
            uuid.UUID(added["executionId"]),
        )
        embedded = await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE action_id = $1 AND embedding IS NOT NULL",
            agent.action_id,
        )
    assert (execution["kind"], execution["status"]) == ("OPERATOR", "SUCCEEDED")
    assert execution["input"]["operation"] == "addAgentMemories"
    assert embedded == 1000
    # Listed newest first: the last input is the newest record.
    listed = await gql(
        admin,
        "query($a: UUID!) { action(actionId: $a) { memories(first: 3) { nodes { summary } } } }",
        a=str(agent.action_id),
    )
    assert [n["summary"] for n in listed.ok()["action"]["memories"]["nodes"]] == [
        "fact number 999",
        "fact number 998",
        "fact number 997",
    ]


async def test_more_than_a_thousand_is_refused(gql, admin, state, agent):
    result = await gql(admin, BULK, actionId=str(agent.action_id), inputs=inputs(1001))
    assert result.codes == ["BAD_REQUEST"]
    assert "1,000" in result.errors[0]["message"]
    assert await counts(state, agent) == (0, 0, 0)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"summary": "two\nlines"}, "summary"),
        ({"kind": "nonsense"}, "kind"),
        ({"labels": [{"name": "nope", "value": "x"}]}, "labels"),
        ({"scope": "SESSION"}, "scope"),
        ({"content": "x" * 20000}, "content"),
        ({"sessionId": "s" * 300}, "sessionId"),
        ({"replaces": str(uuid.uuid4())}, "replaces"),
    ],
)
async def test_an_invalid_input_refuses_all_and_names_its_index(
    gql, admin, state, agent, bad, field
):
    batch = inputs(40)
    batch[17] = {**batch[17], **bad}
    result = await gql(admin, BULK, actionId=str(agent.action_id), inputs=batch)
    assert result.codes in (["BAD_REQUEST"], ["NOT_FOUND"])
    assert result.errors[0]["message"].startswith(f"inputs[17].{field}: "), result.errors
    assert await counts(state, agent) == (0, 0, 0)


async def test_replaces_and_labels_and_sessions(gql, admin, state, agent):
    old = await remember(state, agent, "office in Bergen", session=None, scope="AGENT")
    batch = [
        {
            "summary": "office in Oslo",
            "kind": "fact",
            "scope": "AGENT",
            "replaces": str(old.memory_id),
        },
        {
            "summary": "likes tea",
            "kind": "fact",
            "sessionId": "chat-1",
            "labels": [{"name": "customer_id", "value": "c-1"}],
        },
        {"summary": "likes coffee", "kind": "fact", "sessionId": "chat-2"},
    ]
    added = (await gql(admin, BULK, actionId=str(agent.action_id), inputs=batch)).ok()
    first, tea, coffee = added["addAgentMemories"]["memories"]
    assert first["replaces"] == str(old.memory_id)
    assert (tea["scope"], tea["sessionId"]) == ("SESSION", "chat-1")
    assert tea["labels"] == [{"number": 5, "value": "c-1", "name": "customer_id"}]
    assert (coffee["scope"], coffee["sessionId"]) == ("SESSION", "chat-2")
    async with state.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT status, replaced_by, version FROM agent_memories WHERE memory_id = $1",
            old.memory_id,
        )
        sessions = await conn.fetch(
            "SELECT session_id FROM sessions WHERE action_id = $1 ORDER BY 1", agent.action_id
        )
    assert dict(row) == {
        "status": "SUPERSEDED",
        "replaced_by": uuid.UUID(first["memoryId"]),
        "version": 2,
    }
    assert [s["session_id"] for s in sessions][-2:] == ["chat-1", "chat-2"]
    # The same record replaced twice in one call is refused at the second.
    twice = [
        {"summary": "a", "kind": "fact", "scope": "AGENT", "replaces": first["memoryId"]},
        {"summary": "b", "kind": "fact", "scope": "AGENT", "replaces": first["memoryId"]},
    ]
    result = await gql(admin, BULK, actionId=str(agent.action_id), inputs=twice)
    assert result.codes == ["BAD_REQUEST"] and result.errors[0]["message"].startswith(
        "inputs[1].replaces: "
    )


async def test_grants_of_add_agent_memory(gql, admin, state, agent):
    reader_only = caller(
        admin.account_id,
        allow(["SELECT"], "financial.AgentMemory.indexes.*", "financial.AgentMemory.document"),
    )
    result = await gql(reader_only, BULK, actionId=str(agent.action_id), inputs=inputs(2))
    assert result.codes == ["ACCESS_DENIED"]
    writer = caller(
        admin.account_id,
        allow(
            ["SELECT", "INSERT"],
            "financial.AgentMemory.indexes.*",
            "financial.AgentMemory.document",
        ),
    )
    ok = await gql(writer, BULK, actionId=str(agent.action_id), inputs=inputs(2))
    assert len(ok.ok()["addAgentMemories"]["memoryIds"]) == 2
    assert await counts(state, agent) == (2, 2, 1)


async def test_a_retry_with_the_same_key_writes_nothing_new(gql, admin, state, agent):
    first = await gql(admin, BULK, actionId=str(agent.action_id), inputs=inputs(5), key="k1")
    again = await gql(admin, BULK, actionId=str(agent.action_id), inputs=inputs(5), key="k1")
    assert again.ok() == first.ok()
    assert await counts(state, agent) == (5, 5, 1)
    other = await gql(admin, BULK, actionId=str(agent.action_id), inputs=inputs(6), key="k1")
    assert other.codes == ["CONFLICT"]


ADD = """mutation($a: UUID!, $i: AgentMemoryInput!, $key: String) {
  addAgentMemory(actionId: $a, input: $i, idempotencyKey: $key) { memoryId version replaces } }"""


@pytest.mark.parametrize("bulk", [False, True])
async def test_the_same_key_sent_twice_at_once_with_replaces_answers_the_first_write(
    gql, admin, state, agent, bulk
):
    """The second request waits for the first, whose replacement then makes its own stale:
    it answers as the first did (the key's promise), not CONFLICT."""
    a = str(agent.action_id)
    for round in range(3):
        old = await gql(admin, ADD, a=a, i={"summary": f"plan Basic {round}", "kind": "fact"})
        new = {"summary": f"plan Gold {round}", "kind": "fact"}
        new["replaces"] = old.ok()["addAgentMemory"]["memoryId"]
        if bulk:
            sent = [gql(admin, BULK, actionId=a, inputs=[new], key=f"k{round}") for _ in "ab"]
        else:
            sent = [gql(admin, ADD, a=a, i=new, key=f"k{round}") for _ in "ab"]
        first, second = await asyncio.gather(*sent)
        assert first.ok() == second.ok(), (first.errors, second.errors)
    assert (await counts(state, agent))[0] == 6  # three replaced, three replacements


async def test_pins_of_one_call_count_together_against_the_budget(gql, admin, state):
    agent = await make_agent(state, admin, harness=full_memory(pinned={"max_tokens": 100}))
    pins = [
        {"summary": f"always greet customer {i} by name", "kind": "fact", "pinned": True}
        for i in range(6)
    ]
    refused = await gql(admin, BULK, actionId=str(agent.action_id), inputs=pins)
    assert refused.codes == ["BAD_REQUEST"] and "budget of 100" in refused.errors[0]["message"]
    assert await counts(state, agent) == (0, 0, 0)
    ok = await gql(admin, BULK, actionId=str(agent.action_id), inputs=pins[:2])
    assert len(ok.ok()["addAgentMemories"]["memoryIds"]) == 2


# The inputs addAgentMemories and addAgentMemory receive, built from their coerced values by a
# table made once (app/graphql/inputs.py), are those strawberry's own conversion builds.
def test_memory_inputs_built_directly_equal_strawberrys_own(monkeypatch):
    values = [
        {"summary": "plain", "kind": "fact"},
        {
            "summary": "every field",
            "content": "the evidence",
            "kind": "event",
            "labels": [{"name": "customer_id", "value": "42"}, {"number": 6, "value": "eu"}],
            "scope": "SESSION",
            "sessionId": "s1",
            "pinned": True,
            "replaces": str(uuid.uuid4()),
            "metadata": {"source": ["crm", 1, None, {"deep": True}]},
        },
        {"summary": "nulls", "kind": "fact", "labels": None, "scope": None, "metadata": None},
        {"summary": "empty labels", "kind": "fact", "labels": [], "metadata": "text"},
    ]
    operation = parse(
        "mutation($inputs: [AgentMemoryInput!]!) "
        '{ addAgentMemories(actionId: "00000000-0000-0000-0000-000000000000", inputs: $inputs) '
        "{ executionId } }"
    ).definitions[0]
    coerced = get_variable_values(
        schema._schema, operation.variable_definitions, {"inputs": values}
    ).coerced["inputs"]

    def converted() -> object:
        return convert_argument(
            coerced,
            StrawberryList(AgentMemoryInput),
            schema.schema_converter.scalar_registry,
            schema.config,
        )

    built = converted()
    for cls in (AgentMemoryInput, AgentMemoryLabelInput):
        monkeypatch.setattr(cls.__strawberry_definition__, "from_input", None)
    own = converted()
    assert built == own and repr(built) == repr(own)
    assert isinstance(built[1].labels[0], AgentMemoryLabelInput)
