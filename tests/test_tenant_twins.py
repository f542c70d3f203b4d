"""Two accounts holding the same IDs: an agent exported from account A and imported into
account B (`engram import --account`) keeps its action, session, execution and record IDs, so
both accounts then have an agent of one `actionId`, a session `s1` of it, and records of the
same `memoryId`. Whatever A writes after the copy is A's alone: B, naming A's IDs through its
own twin agent (which it may read, so no check of the agent stops it), neither reads nor
changes it, and what B changes of its copy leaves A's as it was.

Every statement's account filter is what holds this: the agent's ID, its session's, even a
record's are no longer one account's."""

import io
from dataclasses import dataclass
from uuid import UUID, uuid4

import pytest
from factories import (
    allow,
    caller,
    commit,
    import_into,
    make_account,
    make_agent,
    record_turn,
    work,
    writer,
)
from helpers import GQL

from app.actions.service import ActionVersion
from app.auth.caller import Caller
from app.executions import store as executions_store
from app.history import store as history_store
from app.history.keeping import KeptEvent
from app.memory.service import NewMemory
from app.state import AppState
from app.transfer.service import export_action

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")


@dataclass
class Twins:
    a: Caller
    b: Caller
    agent: ActionVersion  # A's; B's twin has the same action ID
    shared: UUID  # a record both accounts hold (A's copied into B)
    shared_execution: UUID  # the turn that wrote it, in both accounts
    secret: UUID  # a record A wrote after the copy
    secret_execution: UUID  # the turn of A's that wrote it, in session s1
    secret_event: UUID  # an event A's history kept of that turn

    @property
    def action_id(self) -> str:
        return str(self.agent.action_id)


async def _turn(state: AppState, agent: ActionVersion, summary: str) -> tuple[UUID, UUID]:
    """A committed turn of session s1 writing one agent-scope record: (record, execution)."""
    w = writer(agent, session="s1")
    await record_turn(state, w)
    unit = work(state, w)
    (record,) = await unit.add(NewMemory(summary=summary, kind="fact", scope="AGENT"))
    await commit(state, unit)
    return record.memory_id, w.execution_id


async def _keep_event(
    state: AppState, agent: ActionVersion, execution_id: UUID, turn: int, text: str
) -> UUID:
    """An event of the turn kept in its session's history, as a committing turn keeps it."""

    @dataclass
    class Keeper:
        account_id: UUID
        action_id: UUID
        session_id: str
        execution_id: UUID
        invocation_number: int = 1
        preview: bool = False

    event = KeptEvent(uuid4(), 1, "user", {"message": text}, text, [text], [[]])
    keeper = Keeper(agent.account_id, agent.action_id, "s1", execution_id)
    async with state.pool.acquire() as conn, conn.transaction():
        await history_store.insert(conn, keeper, turn, [event], None)
    return event.event_id


@pytest.fixture
async def twins(state: AppState) -> Twins:
    a = caller(await make_account(state, "A"), EVERYTHING, principal="alice")
    b = caller(await make_account(state, "B"), EVERYTHING, principal="bob")
    agent = await make_agent(state, a)
    shared, first = await _turn(state, agent, "known to both accounts")
    await _keep_event(state, agent, first, 1, "copied words")
    out = io.StringIO()
    await export_action(state.pool, account_id=a.account_id, action_id=agent.action_id, out=out)

    await import_into(state, b.account_id, out.getvalue())
    secret, execution = await _turn(state, agent, "A's secret, written after the copy")
    event = await _keep_event(state, agent, execution, 2, "A's secret words")
    await record_turn(state, writer(agent, session="a-only"))  # a session of A's alone
    # Events A's copy of the shared turn got since (as a retry's attempt would add them).
    async with state.pool.acquire() as conn:
        await executions_store.insert_events(
            conn, a.account_id, agent.action_id, first, [(1, 1, "turn.input", {"secret": 1})]
        )
    return Twins(a, b, agent, shared, first, secret, execution, event)


def _a_only_session(twins: Twins) -> str:
    """The global ID of A's session `a-only` (as its `id` reads)."""
    from app.graphql.relay import global_id

    return global_id("ActionSession", twins.agent.action_id, "a-only")


MEMORY = """query($a: UUID!, $id: UUID!, $v: Int) {
  agentMemory(actionId: $a, id: $id, version: $v) { id memoryId summary status version } }"""
NODE = """query($id: ID!) { node(id: $id) {
  ... on ActionAgentMemory { memoryId summary }
  ... on ActionExecution { executionId }
  ... on ActionHistoryEvent { text }
  ... on ActionExecutionEvent { data } } }"""
EXECUTION = """query($e: UUID!) { execution(executionId: $e) {
  id executionId input transcript(first: 10) { nodes { id data } } } }"""
VERSIONS = """query($a: UUID!, $id: UUID!) {
  agentMemory(actionId: $a, id: $id) { history(first: 10) { nodes { id version status } } } }"""
NODES = """query($ids: [ID!]!) { nodes(ids: $ids) {
  ... on ActionAgentMemory { version } ... on ActionSession { sessionId } } }"""
LISTED = """query($a: UUID!) { action(actionId: $a) {
  memories(first: 100) { nodes { memoryId } }
  executions(first: 100) { nodes { executionId } }
  sessions(first: 10) { nodes { sessionId
    executions(first: 100) { nodes { executionId } }
    history(first: 100) { nodes { id text } } } } } }"""
SEARCH_HISTORY = """query($a: UUID!) { action(actionId: $a) {
  sessions(first: 10) { nodes { searchHistory(query: "secret words") { text } } } } }"""
DELETE = """mutation($a: UUID!, $id: UUID!) {
  deleteAgentMemory(actionId: $a, id: $id) { status } }"""
ERASE = """mutation($a: UUID!, $s: String!) {
  eraseSession(actionId: $a, sessionId: $s) { erasedEvents erasedExecutions liveMemoryIds } }"""


async def test_b_reads_none_of_what_a_wrote_after_the_copy(gql: GQL, twins: Twins) -> None:
    a, b, action = twins.a, twins.b, twins.action_id
    secret = (await gql(a, MEMORY, a=action, id=str(twins.secret))).ok()["agentMemory"]
    assert secret["summary"].startswith("A's secret")
    assert (await gql(b, MEMORY, a=action, id=str(twins.secret))).ok()["agentMemory"] is None
    found = await gql(b, NODE, id=secret["id"])
    assert found.codes == ["NOT_FOUND"], found
    execution = (await gql(a, EXECUTION, e=str(twins.secret_execution))).ok()["execution"]
    assert (await gql(b, EXECUTION, e=str(twins.secret_execution))).ok()["execution"] is None
    assert (await gql(b, NODE, id=execution["id"])).codes == ["NOT_FOUND"]

    listed = (await gql(b, LISTED, a=action)).ok()["action"]
    for unseen in (twins.secret, twins.secret_execution, "secret", "a-only"):
        assert str(unseen) not in str(listed), unseen
    assert [n["memoryId"] for n in listed["memories"]["nodes"]] == [str(twins.shared)]
    (session,) = listed["sessions"]["nodes"]
    assert session["history"]["nodes"] == []  # (an export holds no history)
    assert (await gql(b, SEARCH_HISTORY, a=action)).ok()["action"]["sessions"]["nodes"] == [
        {"searchHistory": []}
    ]
    found = (await gql(a, SEARCH_HISTORY, a=action)).ok()["action"]["sessions"]["nodes"]
    assert "secret" in str(found)  # (A's own search finds it)
    sessions = (await gql(a, LISTED, a=action)).ok()["action"]["sessions"]["nodes"]
    mine = next(s for s in sessions if s["sessionId"] == "s1")
    event_id = next(e["id"] for e in mine["history"]["nodes"] if "secret" in e["text"])
    assert (await gql(b, NODE, id=event_id)).codes == ["NOT_FOUND"]
    copied = (await gql(b, EXECUTION, e=str(twins.shared_execution))).ok()["execution"]
    assert copied["transcript"]["nodes"] == []  # not the events A's copy got since
    # Nor by their IDs, which name B's execution of that ID as well.
    (since,) = (await gql(a, EXECUTION, e=str(twins.shared_execution))).ok()["execution"][
        "transcript"
    ]["nodes"]
    assert (await gql(a, NODE, id=since["id"])).ok() == {"node": {"data": {"secret": 1}}}
    assert (await gql(b, NODE, id=since["id"])).codes == ["NOT_FOUND"]
    assert (await gql(b, NODES, ids=[since["id"]])).ok()["nodes"] == [None]

    # A deletes its copy of the shared record: its version 2 is A's alone.
    assert (await gql(a, DELETE, a=action, id=str(twins.shared))).ok()
    ours = (await gql(a, VERSIONS, a=action, id=str(twins.shared))).ok()["agentMemory"]
    assert [v["version"] for v in ours["history"]["nodes"]] == [2, 1]
    theirs = (await gql(b, VERSIONS, a=action, id=str(twins.shared))).ok()["agentMemory"]
    assert [(v["version"], v["status"]) for v in theirs["history"]["nodes"]] == [(1, "ACTIVE")]
    assert (await gql(b, NODE, id=ours["history"]["nodes"][0]["id"])).codes == ["NOT_FOUND"]
    unseen = [ours["history"]["nodes"][0]["id"], _a_only_session(twins)]
    assert (await gql(b, NODES, ids=unseen)).ok()["nodes"] == [None, None]


async def test_b_changes_nothing_of_a_through_the_same_ids(gql: GQL, twins: Twins) -> None:
    a, b, action = twins.a, twins.b, twins.action_id
    refused = await gql(b, DELETE, a=action, id=str(twins.secret))
    assert refused.codes == ["NOT_FOUND"], refused
    # B deletes its copy of the shared record: A's stays as it was.
    assert (await gql(b, DELETE, a=action, id=str(twins.shared))).ok()["deleteAgentMemory"] == {
        "status": "DELETED"
    }
    for record in (twins.shared, twins.secret):
        kept = (await gql(a, MEMORY, a=action, id=str(record))).ok()["agentMemory"]
        assert (kept["status"], kept["version"]) == ("ACTIVE", 1)
    # Version 2 of the shared record is B's deletion alone.
    assert (await gql(a, MEMORY, a=action, id=str(twins.shared), v=2)).ok()["agentMemory"] is None

    # B erases its session s1: A's session of that ID keeps its words and history.
    erased = (await gql(b, ERASE, a=action, s="s1")).ok()["eraseSession"]
    assert erased["erasedEvents"] == 0 and erased["liveMemoryIds"] == []
    sessions = (await gql(a, LISTED, a=action)).ok()["action"]["sessions"]["nodes"]
    session = next(s for s in sessions if s["sessionId"] == "s1")
    assert sorted(e["text"] for e in session["history"]["nodes"]) == [
        "A's secret words",
        "copied words",
    ]
    for execution in session["executions"]["nodes"]:
        kept = (await gql(a, EXECUTION, e=execution["executionId"])).ok()["execution"]
        assert kept["input"] == {"message": "hello"}, kept


KEYED_DELETE = """mutation($a: UUID!, $id: UUID!, $k: String) {
  deleteAgentMemory(actionId: $a, id: $id, idempotencyKey: $k) { memoryId status modifiedBy } }"""


async def test_an_idempotency_key_is_its_accounts_alone(gql: GQL, twins: Twins) -> None:
    """Two clients of one principal in two accounts sending the same key with the same
    arguments: the second's request is its own, never answered with the first's result."""
    a = caller(twins.a.account_id, EVERYTHING, principal="ops")
    b = caller(twins.b.account_id, EVERYTHING, principal="ops")
    action, shared = twins.action_id, str(twins.shared)
    first = (await gql(a, KEYED_DELETE, a=action, id=shared, k="k-1")).ok()["deleteAgentMemory"]
    assert first["status"] == "DELETED"
    # B's copy is still active: B's delete deletes it (a replay of A's would change nothing).
    before = (await gql(b, MEMORY, a=action, id=shared)).ok()["agentMemory"]
    assert before["status"] == "ACTIVE"
    (await gql(b, KEYED_DELETE, a=action, id=shared, k="k-1")).ok()
    after = (await gql(b, MEMORY, a=action, id=shared)).ok()["agentMemory"]
    assert (after["status"], after["version"]) == ("DELETED", 2)
