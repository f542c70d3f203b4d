"""Issue 14, item 3 (no N+1): the objects a page's records point at (their agent version,
execution and session) are read through per-request DataLoaders, one query per kind however
many records the page holds, with the same grants as one read."""

import pytest
from factories import allow, caller, make_agent, record_turn, remember, writer
from helpers import GQL

from app.db.pool import create_pool
from app.state import AppState

PAGE = """query($a: UUID!) { action(actionId: $a) { memories(first: 100) {
  nodes { memoryId %s } } } }"""
LINKED = "action { name } execution { status }"


async def counted(state: AppState, db_url: str, who, query: str, **variables) -> tuple[dict, int]:
    """The operation's data, and how many queries it sent to PostgreSQL (besides the reset
    the pool sends when a connection comes back), the second time it ran: the first also
    reads the driver's type information."""
    pool = await create_pool(db_url, min_size=1, max_size=1)
    statements: list[str] = []
    try:
        async with pool.acquire() as conn:  # the pool's one connection: every query's
            reset = conn.get_reset_query()
            conn.add_query_logger(lambda record: statements.append(record.query))
        run = GQL(AppState(settings=state.settings, pool=pool))
        await run(who, query, **variables)
        statements.clear()
        result = await run(who, query, **variables)
    finally:
        await pool.close()
    return result.ok(), len([s for s in statements if s != reset])


async def records(state, agent, n: int) -> None:
    for i in range(n):
        w = writer(agent, session=f"s{i % 3}")
        await record_turn(state, w)
        await remember(state, agent, f"fact {i}", scope="AGENT", execution_id=w.execution_id)


# Issue 14, item 3
async def test_issue14_item3_action_and_execution_cost_two_queries_however_many_records(
    state, db_url, admin
):
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    await records(state, agent, 3)
    _, plain = await counted(state, db_url, admin, PAGE % "", a=a)
    few, with_links = await counted(state, db_url, admin, PAGE % LINKED, a=a)
    assert with_links - plain <= 2
    await records(state, agent, 12)
    many, with_links_many = await counted(state, db_url, admin, PAGE % LINKED, a=a)
    assert with_links_many == with_links
    nodes = many["action"]["memories"]["nodes"]
    assert len(nodes) == 15
    assert all(n["action"] == {"name": "support"} for n in nodes)
    assert all(n["execution"] == {"status": "SUCCEEDED"} for n in nodes)
    _, with_sessions = await counted(
        state, db_url, admin, PAGE % f"{LINKED} session {{ sessionId }}", a=a
    )
    assert with_sessions == with_links + 1


# Issue 14, item 3: a batch keeps each field's grants and the caller's account.
@pytest.mark.parametrize("field", ["execution { status }", "session { sessionId }"])
async def test_issue14_item3_batched_fields_keep_their_grants(state, admin, field):
    agent = await make_agent(state, admin)
    await records(state, agent, 3)
    memory_only = caller(
        admin.account_id,
        allow(["SELECT"], "financial.AgentMemory.indexes.*", "financial.AgentMemory.document"),
    )
    result = await GQL(state)(memory_only, PAGE % field, a=str(agent.action_id))
    assert result.codes and set(result.codes) == {"ACCESS_DENIED"}, result.errors


# Issue 14, item 3: a DataLoader's answers last one request, and a request runs one mutation
# (app/graphql/selection.py), so a mutation's answer reads what it wrote and never what an
# earlier mutation's answer loaded: two turns in one request are refused before either runs.
TURN = """mutation($a: UUID!) {
  executeAction(input: {actionId: $a, sessionId: "s1", input: "one"}) {
    status session { turns } }
}"""
TWO_TURNS = """mutation($a: UUID!) {
  first: executeAction(input: {actionId: $a, sessionId: "s1", input: "one"}) {
    status session { turns } }
  second: executeAction(input: {actionId: $a, sessionId: "s1", input: "two"}) {
    status session { turns } }
}"""


async def test_issue14_item3_a_mutations_answer_reads_what_it_wrote(state, admin, model_server):
    a = str((await make_agent(state, admin)).action_id)
    gql = GQL(state)
    assert (await gql(admin, TWO_TURNS, a=a)).codes == ["BAD_REQUEST"]
    for turns in (1, 2):
        done = (await gql(admin, TURN, a=a)).ok()
        assert done["executeAction"] == {"status": "SUCCEEDED", "session": {"turns": turns}}
