"""Issue 14, item 3 (no N+1): the objects a page's records point at (their agent version,
execution and session) are read through per-request DataLoaders, one query per kind however
many records the page holds, with the same grants as one read."""

import asyncio
import json
import uuid
from uuid import UUID

import pytest
from factories import (
    LABELS,
    allow,
    caller,
    forget,
    full_memory,
    make_agent,
    make_agent_id,
    record_turn,
    remember,
    token_for,
    writer,
)
from helpers import GQL
from runtime_support import RUNNER_POLICIES

from app.actions import service as actions
from app.auth import service as auth_service
from app.db.cursors import pack, unpack
from app.db.pool import create_pool
from app.executions import store as executions_store
from app.graphql.context import _BATCHES
from app.graphql.executions import SESSIONS as SESSIONS_KEYSET
from app.graphql.executions import TRANSCRIPT as TRANSCRIPT_KEYS
from app.graphql.history import CONVERSATION
from app.graphql.memory import VERSIONS
from app.graphql.relay import CREATED_ID, global_id
from app.memory import operator
from app.memory import search as memory_search
from app.memory.operator import HistoryPage
from app.runtime import redaction
from app.state import AppState

READ_MEMORY = allow(["SELECT"], "financial.AgentMemory.indexes.*", "financial.AgentMemory.document")

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
    a = await make_agent_id(state, admin)
    gql = GQL(state)
    assert (await gql(admin, TWO_TURNS, a=a)).codes == ["BAD_REQUEST"]
    for turns in (1, 2):
        done = (await gql(admin, TURN, a=a)).ok()
        assert done["executeAction"] == {"status": "SUCCEEDED", "session": {"turns": turns}}


# Issue 14, item 3: nested connections. A page of parents reads each parent's page of children
# in one query, with each field's grants, redaction, cursors and errors.

PAGE_INFO = "pageInfo { hasNextPage hasPreviousPage startCursor endCursor }"
TOKENS = "tokens(first: %d, after: %s) { edges { cursor node { tokenId } } " + PAGE_INFO + " }"
CLIENTS = "query { clients(first: 100) { nodes { principal " + TOKENS + " } } }"


BAD_CURSOR = '"bm90LW91cnM"'  # base64 of "not-ours"


def aliased(fields: dict[str, str]) -> str:
    """A query of root fields under their aliases; an alias a field names as `$alias` is
    declared as a String variable."""
    used = [a for a in fields if any(f"${a}" in f for f in fields.values())]
    declared = ", ".join(f"${a}: String" for a in used)
    body = " ".join(f"{a}: {f}" for a, f in fields.items())
    return f"query({declared}) {{ {body} }}" if used else f"query {{ {body} }}"


def position(cursor: str | None) -> str | None:
    """A listing's cursor without its binding (app/db/cursors.py, Keyset.bound): the cursor its
    keyset alone encodes, as `expected` builds them. Which arguments a cursor is bound to is
    tests/test_listing_cursors.py's."""
    return None if cursor is None else pack(unpack(cursor)[1:])


def positions(connection: dict) -> dict:
    """A connection as the API answered it, each cursor its `position`; its cursors are all
    bound alike."""
    edges = connection["edges"]
    page_info = connection["pageInfo"]
    bound = {unpack(e["cursor"])[0] for e in edges}
    assert len(bound) <= 1, bound
    ends = (page_info["startCursor"], page_info["endCursor"])
    assert {unpack(c)[0] for c in ends if c is not None} <= bound
    return {
        **connection,
        "edges": [{**e, "cursor": position(e["cursor"])} for e in edges],
        "pageInfo": {
            **page_info,
            "startCursor": position(page_info["startCursor"]),
            "endCursor": position(page_info["endCursor"]),
        },
    }


def expected(items: list[tuple[str, dict]], first: int, after: str | None) -> dict:
    """The connection a keyset list gives: `items` are (cursor, node) in the list's order;
    compare with `positions` of the API's, `after` as the API issued it."""
    cursors = [c for c, _ in items]
    start = cursors.index(position(after)) + 1 if after is not None else 0
    edges = [{"cursor": c, "node": n} for c, n in items[start : start + first]]
    return {
        "edges": edges,
        "pageInfo": {
            "hasNextPage": len(items) > start + first,
            "hasPreviousPage": after is not None,
            "startCursor": edges[0]["cursor"] if edges else None,
            "endCursor": edges[-1]["cursor"] if edges else None,
        },
    }


async def clients_with_tokens(state, admin, counts: list[int], start: int = 0) -> None:
    for i, n in enumerate(counts, start):
        await token_for(state, admin, f"c{i:02}")
        for _ in range(n - 1):
            await auth_service.issue_client_token(
                state.pool, admin, account_id=None, principal=f"c{i:02}"
            )


async def all_tokens(state, admin) -> dict[str, list[tuple[str, dict]]]:
    """Each client's tokens as (cursor, node), newest first, read straight from the table."""
    rows = await state.pool.fetch(
        "SELECT principal, created, token_id FROM client_tokens WHERE account_id = $1 "
        "ORDER BY created DESC, token_id DESC",
        admin.account_id,
    )
    found: dict[str, list[tuple[str, dict]]] = {}
    for r in rows:
        cursor = CREATED_ID.encode(r["created"], r["token_id"])
        found.setdefault(r["principal"], []).append((cursor, {"tokenId": str(r["token_id"])}))
    return found


# Issue 14, item 3
async def test_issue14_item3_client_tokens_cost_one_query_however_many_clients(
    state, db_url, admin
):
    await clients_with_tokens(state, admin, [3, 1, 2])
    await auth_service.create_client(
        state.pool, admin, account_id=None, principal="no-tokens", name="none", policies=[]
    )
    few, with_few = await counted(state, db_url, admin, CLIENTS % (2, "null"))
    await clients_with_tokens(state, admin, [2, 4, 1, 3, 1, 2, 5], start=3)
    many, with_many = await counted(state, db_url, admin, CLIENTS % (2, "null"))
    assert with_many == with_few <= 2
    tokens = await all_tokens(state, admin)
    for data in (few, many):
        for client in data["clients"]["nodes"]:
            assert positions(client["tokens"]) == expected(
                tokens.get(client["principal"], []), 2, None
            )
    assert len(many["clients"]["nodes"]) == 11  # c00 to c09, no-tokens
    assert [c["tokens"]["edges"] for c in many["clients"]["nodes"]].count([]) == 1


# Issue 14, item 3: parents asking for pages after different cursors, in one request.
async def test_issue14_item3_client_tokens_page_after_each_parents_own_cursor(state, admin):
    await clients_with_tokens(state, admin, [5, 2, 0, 3])
    tokens = await all_tokens(state, admin)
    principals = ["c00", "c01", "c03"]
    gql = GQL(state)
    query = aliased(
        {p: f'client(principal: "{p}") {{ {TOKENS % (2, "$" + p)} }}' for p in principals}
    )
    after: dict[str, str | None] = dict.fromkeys(principals)
    for _ in range(4):  # c00's three pages, then an empty one after its last
        data = (await gql(admin, query, **after)).ok()
        for p in principals:
            assert positions(data[p]["tokens"]) == expected(tokens[p], 2, after[p]), (p, after[p])
            after[p] = data[p]["tokens"]["pageInfo"]["endCursor"]
    assert data["c00"]["tokens"]["pageInfo"]["hasPreviousPage"]
    assert data["c00"]["tokens"]["edges"] == []


# Issue 14, item 3: each parent's tokens field keeps its own grant check and its own errors.
async def test_issue14_item3_batched_tokens_keep_grants_and_errors(state, admin):
    await clients_with_tokens(state, admin, [2, 1])
    gql = GQL(state)
    lister = caller(admin.account_id, allow(["SELECT"], "financial.Client.document"))
    denied = await gql(lister, CLIENTS % (1, "null"))
    # The first field's error nulls the list (its items are non-null): one error, as before.
    assert denied.codes == ["ACCESS_DENIED"] and denied.errors[0]["path"][-1] == "tokens"
    too_many = await gql(admin, CLIENTS % (1001, "null"))
    assert too_many.codes == ["BAD_REQUEST"] and too_many.errors[0]["path"][-1] == "tokens"
    mixed = await gql(
        admin,
        aliased(
            {
                "bad": f'client(principal: "c00") {{ {TOKENS % (1, BAD_CURSOR)} }}',
                "good": f'client(principal: "c01") {{ {TOKENS % (1, "null")} }}',
            }
        ),
    )
    assert mixed.codes == ["BAD_REQUEST"] and mixed.errors[0]["path"][0] == "bad"
    assert mixed.data is None  # a failed request returns no data


TRANSCRIPT = (
    "transcript(first: %d, after: %s) { edges { cursor node { sequence invocationNumber type "
    "data } } " + PAGE_INFO + " }"
)
EXECUTIONS = """query($a: UUID!) { action(actionId: $a) { executions(first: 50) {
  nodes { executionId %s } } } }"""
# A memory tool's run and a memory review: what a reader without the memory grants sees reduced.
EVENTS = [
    ("turn.input", {"input": "hello", "message": "hello"}),
    (
        "tool.execution",
        {
            "name": "read_memory",
            "input": {"id": "m1"},
            "output": {"records": [{"id": "m1", "version": 1, "summary": "Ada likes tea"}]},
        },
    ),
    ("model.call", {"purpose": "memory", "content": "Ada likes tea", "toolCalls": []}),
    ("turn.output", {"output": "Noted."}),
]


async def executions_with_events(state, agent, counts: list[int]) -> list[UUID]:
    """An execution per count, with that many events (a cycle of EVENTS): the last one RUNNING
    its second invocation, whose events are not listed until it ends."""
    made = []
    async with state.pool.acquire() as conn:
        for i, n in enumerate(counts):
            execution_id = uuid.uuid4()
            running = i == len(counts) - 1
            await executions_store.insert_execution(
                conn,
                account_id=agent.account_id,
                action_id=agent.action_id,
                execution_id=execution_id,
                action_version=agent.version,
                session_id=None,
                turn=None,
                kind="TURN",
                status="RUNNING" if running else "SUCCEEDED",
                preview=False,
                principal="admin",
                token_id=None,
                input="hello",
                invocation_number=2 if running else 1,
            )
            events = [
                (s, 2 if running and s > n // 2 else 1, *EVENTS[(s - 1) % len(EVENTS)])
                for s in range(1, n + 1)
            ]
            await executions_store.insert_events(
                conn, agent.account_id, agent.action_id, execution_id, events
            )
            made.append(execution_id)
    return made


async def all_events(state, agent, reads_memory: bool) -> dict[str, list[tuple[str, dict]]]:
    """Each execution's listed events as (cursor, node), in order, read straight from the
    tables: a running invocation's left out, and reduced for a reader without memory grants."""
    rows = await state.pool.fetch(
        """
        SELECT t.* FROM transcript_events t JOIN executions x USING (account_id, action_id,
            execution_id)
        WHERE t.account_id = $1 AND t.action_id = $2
          AND NOT (x.status = 'RUNNING' AND x.invocation_number = t.invocation_number)
        ORDER BY t.sequence
        """,
        agent.account_id,
        agent.action_id,
    )
    found: dict[str, list[tuple[str, dict]]] = {}
    for r in rows:
        data = r["data"] if reads_memory else redaction.event_data(r["type"], r["data"])
        node = {
            "sequence": r["sequence"],
            "invocationNumber": r["invocation_number"],
            "type": r["type"],
            "data": data,
        }
        found.setdefault(str(r["execution_id"]), []).append(
            (TRANSCRIPT_KEYS.encode(r["sequence"]), node)
        )
    return found


def reader(admin, *, reads_memory: bool):
    memory = [READ_MEMORY] if reads_memory else []
    return caller(
        admin.account_id, allow(["SELECT"], "financial.Action.*"), *RUNNER_POLICIES, *memory
    )


# Issue 14, item 3
@pytest.mark.parametrize("reads_memory", [True, False])
async def test_issue14_item3_transcripts_cost_one_query_however_many_executions(
    state, db_url, admin, reads_memory
):
    agent = await make_agent(state, admin)
    who = reader(admin, reads_memory=reads_memory)
    query = EXECUTIONS % (TRANSCRIPT % (3, "null"))
    await executions_with_events(state, agent, [5, 0, 3, 6])
    few, with_few = await counted(state, db_url, who, query, a=str(agent.action_id))
    await executions_with_events(state, agent, [2, 7, 1, 0, 4, 9, 3, 6])
    many, with_many = await counted(state, db_url, who, query, a=str(agent.action_id))
    assert with_many == with_few <= 3
    events = await all_events(state, agent, reads_memory)
    for data in (few, many):
        for execution in data["action"]["executions"]["nodes"]:
            listed = events.get(execution["executionId"], [])
            assert positions(execution["transcript"]) == expected(listed, 3, None)
    nodes = many["action"]["executions"]["nodes"]
    assert len(nodes) == 12 and [n["transcript"]["edges"] for n in nodes].count([]) == 2
    shown = json.dumps(many)
    assert ("Ada likes tea" in shown) == reads_memory


# Issue 14, item 3: parents asking for pages after different cursors, in one request.
async def test_issue14_item3_transcripts_page_after_each_parents_own_cursor(state, admin):
    agent = await make_agent(state, admin)
    made = [str(e) for e in await executions_with_events(state, agent, [7, 3, 0, 5])]
    events = await all_events(state, agent, reads_memory=False)
    names = [f"e{i}" for i in range(len(made))]
    query = aliased(
        {
            n: f'execution(executionId: "{e}") {{ {TRANSCRIPT % (2, "$" + n)} }}'
            for n, e in zip(names, made, strict=True)
        }
    )
    gql, who = GQL(state), reader(admin, reads_memory=False)
    after: dict[str, str | None] = dict.fromkeys(names)
    for _ in range(5):  # e0's four pages, then an empty one after its last
        data = (await gql(who, query, **after)).ok()
        for n, e in zip(names, made, strict=True):
            transcript = data[n]["transcript"]
            assert positions(transcript) == expected(events.get(e, []), 2, after[n]), (n, after[n])
            after[n] = transcript["pageInfo"]["endCursor"]
    assert data["e0"]["transcript"]["pageInfo"]["hasPreviousPage"]
    assert data["e0"]["transcript"]["edges"] == []


# Issue 14, item 3: each parent's transcript field keeps its own grant check and its own errors.
async def test_issue14_item3_batched_transcripts_keep_grants_and_errors(state, admin):
    agent = await make_agent(state, admin)
    made = [str(e) for e in await executions_with_events(state, agent, [3, 2, 1])]
    gql, a = GQL(state), str(agent.action_id)
    no_transcripts = caller(
        admin.account_id,
        allow(["SELECT"], "financial.Action.*"),
        allow(["SELECT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.ActionExecution.indexes.*"),
    )
    denied = await gql(no_transcripts, EXECUTIONS % (TRANSCRIPT % (1, "null")), a=a)
    assert denied.codes == ["ACCESS_DENIED"] and denied.errors[0]["path"][-1] == "transcript"
    too_many = await gql(admin, EXECUTIONS % (TRANSCRIPT % (-1, "null")), a=a)
    assert too_many.codes == ["BAD_REQUEST"] and too_many.errors[0]["path"][-1] == "transcript"
    mixed = await gql(
        admin,
        aliased(
            {
                "bad": f'execution(executionId: "{made[0]}") {{ {TRANSCRIPT % (1, BAD_CURSOR)} }}',
                "good": f'execution(executionId: "{made[1]}") {{ {TRANSCRIPT % (1, "null")} }}',
            }
        ),
    )
    assert mixed.codes == ["BAD_REQUEST"] and mixed.errors[0]["path"][0] == "bad"
    assert mixed.data is None


# Issue 14, item 3: a page of sessions reads each session's executions and history in one
# query per field (they were one query per session: 52 statements for 50 sessions), and a page
# of agents each agent's sessions and executions.


def session_page(field: str, first: int, after: str) -> str:
    """A session's `executions` or `history` page, with its cursors and pageInfo."""
    node = "executionId" if field == "executions" else "eventId text"
    return (
        f"{field}(first: {first}, after: {after}) {{ edges {{ cursor node {{ {node} }} }} "
        f"{PAGE_INFO} }}"
    )


SESSIONS = (
    "query($a: UUID!) { action(actionId: $a) { sessions(first: 100) { nodes { sessionId %s } } } }"
)
HISTORY_EVENTS = [
    ("user", None, None, {"content": "hello"}, "hello"),
    (
        "tool",
        "c1",
        "read_memory",
        {"output": {"records": [{"id": "m1", "version": 1, "summary": "Ada likes tea"}]}},
        "read_memory: Ada likes tea",
    ),  # fmt: skip
    ("agent", None, None, {"content": "Noted.", "toolCalls": []}, "Noted."),
]


async def sessions_with_turns(state, agent, counts: list[int], start: int = 0) -> None:
    """A session per count (s00, s01...), each with that many executions and, per execution,
    a kept history event (a cycle of HISTORY_EVENTS)."""
    async with state.pool.acquire() as conn:
        for i, n in enumerate(counts, start):
            session = f"s{i:02}"
            await executions_store.ensure_session(conn, agent.account_id, agent.action_id, session)
            for turn in range(1, n + 1):
                execution_id = uuid.uuid4()
                await executions_store.insert_execution(
                    conn,
                    account_id=agent.account_id,
                    action_id=agent.action_id,
                    execution_id=execution_id,
                    action_version=agent.version,
                    session_id=session,
                    turn=turn,
                    kind="TURN",
                    status="SUCCEEDED",
                    preview=False,
                    principal="admin",
                    token_id=None,
                    input="hello",
                )
                who, call_id, tool, data, text = HISTORY_EVENTS[(turn - 1) % len(HISTORY_EVENTS)]
                await conn.execute(
                    """
                    INSERT INTO history_events (account_id, action_id, session_id, event_id, turn,
                        execution_id, invocation_number, sequence, who, call_id, tool, data,
                        text, parts, preview)
                    VALUES ($1, $2, $3, $4, $5, $6, 1, 1, $7, $8, $9, $10, $11, 1, false)
                    """,
                    agent.account_id,
                    agent.action_id,
                    session,
                    uuid.uuid4(),
                    turn,
                    execution_id,
                    who,
                    call_id,
                    tool,
                    data,
                    text,
                )


async def session_children(state, agent) -> tuple[dict, dict]:
    """Each session's executions (newest first) and history events (in conversation order) as
    (cursor, node), read straight from the tables."""
    executions: dict[str, list[tuple[str, dict]]] = {}
    for r in await state.pool.fetch(
        "SELECT session_id, created, execution_id FROM executions WHERE action_id = $1 "
        "ORDER BY created DESC, execution_id DESC",
        agent.action_id,
    ):
        node = {"executionId": str(r["execution_id"])}
        cursor = CREATED_ID.encode(r["created"], r["execution_id"])
        executions.setdefault(r["session_id"], []).append((cursor, node))
    history: dict[str, list[tuple[str, dict]]] = {}
    for r in await state.pool.fetch(
        "SELECT session_id, turn, sequence, event_id, text FROM history_events "
        "WHERE action_id = $1 ORDER BY turn, sequence",
        agent.action_id,
    ):
        node = {"eventId": str(r["event_id"]), "text": r["text"]}
        cursor = CONVERSATION.encode(r["turn"], r["sequence"])
        history.setdefault(r["session_id"], []).append((cursor, node))
    return executions, history


# Issue 14, item 3
async def test_issue14_item3_session_executions_and_history_cost_one_query_each(
    state, db_url, admin
):
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    query = SESSIONS % (session_page("executions", 2, "null") + session_page("history", 2, "null"))
    await sessions_with_turns(state, agent, [3, 1, 0, 2])
    few, with_few = await counted(state, db_url, admin, query, a=a)
    await sessions_with_turns(state, agent, [2, 4, 1, 0, 3, 5, 1, 2], start=4)
    many, with_many = await counted(state, db_url, admin, query, a=a)
    assert with_many == with_few <= 4  # the agent, its sessions, their executions, histories
    executions, history = await session_children(state, agent)
    for data in (few, many):
        for session in data["action"]["sessions"]["nodes"]:
            s = session["sessionId"]
            assert positions(session["executions"]) == expected(executions.get(s, []), 2, None), s
            assert positions(session["history"]) == expected(history.get(s, []), 2, None), s
    nodes = many["action"]["sessions"]["nodes"]
    assert len(nodes) == 12 and [n["history"]["edges"] for n in nodes].count([]) == 2


# Issue 14, item 3: parents asking for pages after different cursors, in one request.
@pytest.mark.parametrize("field", ["executions", "history"])
async def test_issue14_item3_session_pages_after_each_parents_own_cursor(state, admin, field):
    agent = await make_agent(state, admin)
    await sessions_with_turns(state, agent, [5, 2, 0, 3])
    executions, history = await session_children(state, agent)
    listed = executions if field == "executions" else history
    names = ["s00", "s01", "s02", "s03"]
    query = aliased(
        {
            n: f'node(id: "{global_id("ActionSession", agent.action_id, n)}") '
            f"{{ ... on ActionSession {{ {session_page(field, 2, '$' + n)} }} }}"
            for n in names
        }
    )
    gql = GQL(state)
    after: dict[str, str | None] = dict.fromkeys(names)
    for _ in range(4):  # s00's three pages, then an empty one after its last
        data = (await gql(admin, query, **after)).ok()
        for n in names:
            assert positions(data[n][field]) == expected(listed.get(n, []), 2, after[n]), (
                n,
                after[n],
            )
            after[n] = data[n][field]["pageInfo"]["endCursor"]
    assert data["s00"][field]["pageInfo"]["hasPreviousPage"]
    assert data["s00"][field]["edges"] == []


# Issue 14, item 3: each kind of executions page keeps its own grants in a shared batch (a
# session's needs the session index, an agent's the created index), and history its redaction.
async def test_issue14_item3_batched_session_pages_keep_grants_and_redaction(state, admin):
    agent = await make_agent(state, admin)
    await sessions_with_turns(state, agent, [3, 2])
    a, gql = str(agent.action_id), GQL(state)
    executions = session_page("executions", 2, "null")
    sessions_only = caller(
        admin.account_id,
        allow(["SELECT"], "financial.Action.*"),
        allow(["SELECT"], "financial.ActionExecution.document"),
        allow(["SELECT"], "financial.ActionExecution.indexes.sessions"),
    )
    query = (
        f'query {{ agent: action(actionId: "{a}") {{ {executions} }} '
        f'bySession: action(actionId: "{a}") {{ sessions(first: 5) {{ nodes {{ {executions} }} '
        "} } }"
    )
    # One error, the agent's page's: the sessions' pages of the same batch were read.
    mixed = await gql(sessions_only, query)
    assert mixed.codes == ["ACCESS_DENIED"] and mixed.errors[0]["path"] == ["agent", "executions"]
    alone = (await gql(sessions_only, SESSIONS % executions, a=a)).ok()
    listed, _ = await session_children(state, agent)
    for node in alone["action"]["sessions"]["nodes"]:
        assert positions(node["executions"]) == expected(listed[node["sessionId"]], 2, None)
    both = await gql(admin, query)
    assert both.ok()["agent"]["executions"]["edges"]
    no_index = caller(
        admin.account_id,
        allow(["SELECT"], "financial.Action.*"),
        allow(["SELECT"], "financial.ActionExecution.indexes.sessions"),
        allow(["SELECT"], "financial.ActionExecution.transcript"),
    )
    denied = await gql(no_index, SESSIONS % executions, a=a)
    assert denied.codes == ["ACCESS_DENIED"] and denied.errors[0]["path"][-1] == "executions"
    history = SESSIONS % session_page("history", 5, "null")
    shown = (await gql(reader(admin, reads_memory=True), history, a=a)).ok()
    redacted = (await gql(no_index, history, a=a)).ok()
    for data, reads_memory in ((shown, True), (redacted, False)):
        texts = [e["node"]["text"] for s in data["action"]["sessions"]["nodes"]
                 for e in s["history"]["edges"]]  # fmt: skip
        assert len(texts) == 5 and any("Ada likes tea" in t for t in texts) == reads_memory
    too_many = await gql(admin, SESSIONS % session_page("history", 1001, "null"), a=a)
    assert too_many.codes == ["BAD_REQUEST"] and too_many.errors[0]["path"][-1] == "history"


AGENT_PAGES = (
    "query { actions(first: 100) { nodes { actionId "
    "sessions(first: 2) { edges { cursor node { sessionId } } " + PAGE_INFO + " } "
    "executions(first: 2) { edges { cursor node { executionId } } " + PAGE_INFO + " } } } }"
)


# Issue 14, item 3: a page of agents reads their sessions and executions in one query each.
async def test_issue14_item3_agents_sessions_and_executions_cost_one_query_each(
    state, db_url, admin
):
    agents = [await make_agent(state, admin, name=f"a{i}") for i in range(3)]
    for agent in agents:
        await sessions_with_turns(state, agent, [2, 1, 3])
    few, with_few = await counted(state, db_url, admin, AGENT_PAGES)
    for i in range(6):
        agent = await make_agent(state, admin, name=f"b{i}")
        await sessions_with_turns(state, agent, [1] * (i % 3))
    many, with_many = await counted(state, db_url, admin, AGENT_PAGES)
    assert with_many == with_few <= 3  # the agents, their sessions, their executions
    for data in (few, many):
        for node in data["actions"]["nodes"]:
            sessions, executions = await agent_lists(state, UUID(node["actionId"]))
            assert positions(node["sessions"]) == expected(sessions, 2, None)
            assert positions(node["executions"]) == expected(executions, 2, None)
    assert len(many["actions"]["nodes"]) == 9


async def agent_lists(state, action_id: UUID) -> tuple[list, list]:
    """The agent's sessions and executions as (cursor, node), newest first, from the tables."""
    sessions = [
        (SESSIONS_KEYSET.encode(r["created"], r["session_id"]), {"sessionId": r["session_id"]})
        for r in await state.pool.fetch(
            "SELECT created, session_id FROM sessions WHERE action_id = $1 "
            "ORDER BY created DESC, session_id DESC",
            action_id,
        )
    ]
    executions = [
        (
            CREATED_ID.encode(r["created"], r["execution_id"]),
            {"executionId": str(r["execution_id"])},
        )
        for r in await state.pool.fetch(
            "SELECT created, execution_id FROM executions WHERE action_id = $1 "
            "ORDER BY created DESC, execution_id DESC",
            action_id,
        )
    ]
    return sessions, executions


# Issue 14, item 3: a page of records reads each record's history in three queries (which
# records the caller sees, their versions, the agent's label names); it was three per record.
VERSION = "version status summary labels { number value name }"
RECORD_HISTORY = (
    "history(first: %d, after: %s) { edges { cursor node { " + VERSION + " } } " + PAGE_INFO + " }"
)
RECORDS = """query($a: UUID!) { action(actionId: $a) {
  memories(first: 100, status: [ACTIVE, DELETED]) { nodes { memoryId %s } } } }"""


async def records_with_versions(state, agent, n: int) -> None:
    """`n` records with a label; every other one deleted (a second version)."""
    for i in range(n):
        record = await remember(
            state, agent, f"fact {i}", scope="AGENT", labels={"customer_id": f"c{i}"}
        )
        if i % 2:
            await forget(state, agent, record.memory_id)


async def all_versions(state, agent) -> dict[str, list[tuple[str, dict]]]:
    """Each record's versions as (cursor, node), newest first, read straight from the table."""
    found: dict[str, list[tuple[str, dict]]] = {}
    for r in await state.pool.fetch(
        "SELECT memory_id, version, status, summary, labels FROM agent_memory_versions "
        "WHERE action_id = $1 ORDER BY version DESC",
        agent.action_id,
    ):
        names = {5: "customer_id", 7: "ticket"}
        labels = [
            {"number": int(k), "value": v, "name": names.get(int(k))}
            for k, v in sorted(r["labels"].items(), key=lambda kv: int(kv[0]))
        ]
        node = {"version": r["version"], "status": r["status"], "summary": r["summary"],
                "labels": labels}  # fmt: skip
        found.setdefault(str(r["memory_id"]), []).append((VERSIONS.encode(r["version"]), node))
    return found


# Issue 14, item 3
async def test_issue14_item3_record_histories_cost_three_queries_however_many_records(
    state, db_url, admin
):
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    query = RECORDS % (RECORD_HISTORY % (1, "null"))
    await records_with_versions(state, agent, 3)
    few, with_few = await counted(state, db_url, admin, query, a=a)
    await records_with_versions(state, agent, 9)
    many, with_many = await counted(state, db_url, admin, query, a=a)
    plain = (await counted(state, db_url, admin, RECORDS % "", a=a))[1]
    assert with_many == with_few <= plain + 3
    versions = await all_versions(state, agent)
    for data in (few, many):
        for node in data["action"]["memories"]["nodes"]:
            assert positions(node["history"]) == expected(versions[node["memoryId"]], 1, None)
    nodes = many["action"]["memories"]["nodes"]
    assert len(nodes) == 12 and {n["history"]["pageInfo"]["hasNextPage"] for n in nodes} == {
        True,
        False,
    }


# Issue 14, item 3: parents asking for pages after different cursors, in one request; a record
# the caller does not see (another agent's, under this agent's ID) has no versions, as before.
async def test_issue14_item3_record_histories_page_after_each_parents_own_cursor(state, admin):
    agent = await make_agent(state, admin)
    await records_with_versions(state, agent, 4)
    versions = await all_versions(state, agent)
    ids = list(versions)
    names = [f"r{i}" for i in range(len(ids))]
    query = aliased(
        {
            n: f'agentMemory(actionId: "{agent.action_id}", id: "{m}") '
            f"{{ {RECORD_HISTORY % (1, '$' + n)} }}"
            for n, m in zip(names, ids, strict=True)
        }
    )
    gql = GQL(state)
    after: dict[str, str | None] = dict.fromkeys(names)
    for _ in range(3):  # two versions at most, then an empty page after the last
        data = (await gql(admin, query, **after)).ok()
        for n, m in zip(names, ids, strict=True):
            assert positions(data[n]["history"]) == expected(versions[m], 1, after[n]), (
                n,
                after[n],
            )
            after[n] = data[n]["history"]["pageInfo"]["endCursor"]
    other = await make_agent(state, admin, name="other")
    theirs = await remember(state, other, "not this agent's", scope="AGENT")
    page = await operator.memory_history_pages(
        state.pool,
        admin,
        pages=[
            HistoryPage(agent.action_id, theirs.memory_id, None, 5),
            HistoryPage(other.action_id, theirs.memory_id, None, 5),
        ],
    )
    assert page[0] == [] and [v.record.version for v in page[1]] == [1]
    too_many = await gql(admin, RECORDS % (RECORD_HISTORY % (1001, "null")), a=str(agent.action_id))
    assert too_many.codes == ["BAD_REQUEST"] and too_many.errors[0]["path"][-1] == "history"


# Issue 14, item 3: a page of agents reads their records in one query (and one for their label
# names), whatever filters the field asks with; it was one query per agent, or two with records.
AGENT_RECORD = "memoryId summary kind scope status labels { number value name }"
AGENT_MEMORIES = (
    "query { actions(first: 100) { nodes { actionId memories(first: 2%s) { edges { cursor "
    "node { " + AGENT_RECORD + " } } " + PAGE_INFO + " } } } }"
)
AGENT_FILTERS = [
    "",
    ", sort: ASC",
    ', kind: "fact"',
    ", scope: SESSION",
    ", status: [ACTIVE, DELETED], sort: ASC",
    ", preview: false, scope: AGENT",
    ', labels: [{name: "customer_id", value: "c0"}]',
    ', labels: [{number: 5, value: "c1"}], kind: "fact"',
]


async def agent_records(state, agent, n: int, *, labelled: bool = True) -> None:
    """`n` records of the agent: facts and events, of agent scope and of session s1, a third
    with a customer label (if `labelled`), and every fourth deleted."""
    for i in range(n):
        record = await remember(
            state,
            agent,
            f"{agent.name}: record {i}",
            kind=("fact", "event")[i % 2],
            scope="SESSION" if i % 3 == 2 else "AGENT",
            labels={"customer_id": f"c{i % 2}"} if labelled and i % 3 == 0 else {},
        )
        if i % 4 == 3:
            await forget(state, agent, record.memory_id)


async def listing_of(state, action_id: UUID) -> list[tuple[str, dict]]:
    """The agent's listing as (cursor, node), newest first, read straight from the table: its
    committed live records and preview deletions."""
    found = []
    for r in await state.pool.fetch(
        "SELECT created, memory_id, summary, kind, scope, status FROM agent_memories "
        "WHERE action_id = $1 AND pending_execution IS NULL "
        "AND (status = 'ACTIVE' OR (preview AND tombstone)) ORDER BY created DESC, memory_id DESC",
        action_id,
    ):
        number = await state.pool.fetchval(
            "SELECT labels->>'5' FROM agent_memories WHERE memory_id = $1", r["memory_id"]
        )
        labels = [{"number": 5, "value": number, "name": "customer_id"}] if number else []
        node = {"memoryId": str(r["memory_id"]), "summary": r["summary"], "kind": r["kind"],
                "scope": r["scope"], "status": r["status"], "labels": labels}  # fmt: skip
        found.append((CREATED_ID.encode(r["created"], r["memory_id"]), node))
    return found


# Issue 14, item 3
async def test_issue14_item3_agents_memories_cost_one_query_however_many_agents(
    state, db_url, admin
):
    for i in range(3):
        await agent_records(state, await make_agent(state, admin, name=f"a{i}"), 4)
    few = {f: await counted(state, db_url, admin, AGENT_MEMORIES % f) for f in AGENT_FILTERS}
    for i in range(6):
        await agent_records(state, await make_agent(state, admin, name=f"b{i}"), i % 3)
    many = {f: await counted(state, db_url, admin, AGENT_MEMORIES % f) for f in AGENT_FILTERS}
    # The agents, their pages, their label names.
    assert many[""][1] == few[""][1] <= 3
    for f in AGENT_FILTERS:
        if "labels" in f:
            # A statement each, planned for its values (its labels' numbers are its agent's).
            assert many[f][1] - few[f][1] == 6, f
            continue
        # Filtered, in a transaction planned for the filters' values (three more round trips).
        assert many[f][1] == few[f][1] <= 6, f
    for data, _ in (few[""], many[""]):
        for node in data["actions"]["nodes"]:
            listing = await listing_of(state, UUID(node["actionId"]))
            assert positions(node["memories"]) == expected(listing, 2, None)
    nodes = many[""][0]["actions"]["nodes"]
    assert len(nodes) == 9 and sum(bool(n["memories"]["edges"]) for n in nodes) == 7


async def add_a_label(state, admin, agent) -> None:
    """A second version of `agent` declaring label `region` (number 6) too, and a record of it
    holding region north, written after `agent` was read."""
    updated = await actions.update_action(
        state.pool,
        admin,
        action_id=agent.action_id,
        name=agent.name,
        instructions=agent.instructions,
        model=None,
        harness=full_memory(labels={**LABELS, "region": {"number": 6, "description": "Where."}}),
        settings=state.settings,
    )
    await remember(state, updated, "in the north", labels={"region": "north"})


# A page under `action(actionId)` names its records' labels by the agent that field read, not
# by reading the agent again: the page and the agent, two statements (three before); filtered
# by labels, the filter reads the agent whatever the version asked for. An earlier version asked
# for names them by the current one, which may have added labels since.
async def test_issue14_item3_a_page_under_its_agent_reads_the_agent_once(state, db_url, admin):
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    await remember(state, agent, "about c1", labels={"customer_id": "c1"})
    query = (
        "query($a: UUID!, $v: Int) { action(actionId: $a, version: $v) { memories(first: 10%s) "
        "{ nodes { summary labels { number name value } } } } }"
    )
    c1 = [{"number": 5, "name": "customer_id", "value": "c1"}]
    data, plain = await counted(state, db_url, admin, query % "", a=a)
    assert data["action"]["memories"]["nodes"] == [{"summary": "about c1", "labels": c1}]
    assert plain == 2
    by_label = ', labels: [{name: "customer_id", value: "c1"}]'
    data, filtered = await counted(state, db_url, admin, query % by_label, a=a)
    assert data["action"]["memories"]["nodes"] == [{"summary": "about c1", "labels": c1}]
    await add_a_label(state, admin, agent)
    north = [{"number": 6, "name": "region", "value": "north"}]
    for version, statements in ((None, plain), (1, plain + 1), (2, plain)):
        data, sent = await counted(state, db_url, admin, query % "", a=a, v=version)
        assert data["action"]["memories"]["nodes"] == [
            {"summary": "in the north", "labels": north},
            {"summary": "about c1", "labels": c1},
        ], version
        assert sent == statements, version
        data, sent = await counted(state, db_url, admin, query % by_label, a=a, v=version)
        assert data["action"]["memories"]["nodes"] == [{"summary": "about c1", "labels": c1}]
        assert sent == filtered, version


# The agent a page is given is the current version as its field read it, earlier in the
# request: another request may have updated the agent since, adding labels that the records
# written since hold and that a filter may name. A record's label it does not know sends the
# page to the agent as it is now, as before it was given one, and a label filter reads the agent
# anyway: no record's label without its name, nor a BAD_REQUEST for a label the agent declares.
async def test_a_page_given_its_agent_reads_it_again_for_a_label_added_since(state, admin):
    agent = await make_agent(state, admin)
    await remember(state, agent, "about c1", labels={"customer_id": "c1"})
    await add_a_label(state, admin, agent)
    assert agent.version == agent.current_version == 1  # as read before the update

    def page(*labels: operator.LabelValue) -> operator.MemoryPage:
        filters = operator.MemoryFilters(labels=labels)
        return operator.MemoryPage(agent.action_id, None, 10, False, filters, agent)

    plain, north, c1 = await operator.memory_pages(
        state.pool,
        admin,
        pages=[
            page(),
            page(operator.LabelValue("north", "region")),
            page(operator.LabelValue("c1", "customer_id")),
        ],
    )
    named = {5: "customer_id", 6: "region", 7: "ticket"}
    (alone,) = await operator.memory_pages(state.pool, admin, pages=[page()])
    assert isinstance(alone, list) and [dict(v.label_names) for v in alone] == [named, named]
    assert isinstance(plain, list) and [v.record.summary for v in plain] == [
        "in the north",
        "about c1",
    ]
    assert [dict(v.label_names) for v in plain] == [named, named]
    assert isinstance(north, list), north
    assert [(v.record.summary, dict(v.label_names)) for v in north] == [("in the north", named)]
    assert isinstance(c1, list) and [v.record.summary for v in c1] == ["about c1"]


# searchMemories is given its agent as its field read it, too: a label filter reads the agent as
# it is now, and a record holding a label that version does not declare sends the names there.
async def test_a_search_given_its_agent_reads_it_again_for_a_label_added_since(state, admin):
    agent = await make_agent(state, admin)
    await remember(state, agent, "about c1", labels={"customer_id": "c1"})
    await add_a_label(state, admin, agent)
    named = {5: "customer_id", 6: "region", 7: "ticket"}
    for query in (None, "north c1"):
        for labels, summaries in (
            ((), {"in the north", "about c1"}),
            ((operator.LabelValue("north", "region"),), {"in the north"}),
        ):
            views, _ = await memory_search.search_as_operator(
                state.pool,
                state.embedder,
                admin,
                action_id=agent.action_id,
                query=query,
                labels=labels,
                limit=10,
                action=agent,  # as read before the update
            )
            assert {v.record.summary for v in views} == summaries, (query, labels)
            assert all(dict(v.label_names) == named for v in views), (query, labels)


# Issue 14, item 3: each agent's page as the agent alone answers it, whatever the filters; its
# own cursor; its own errors; the grants of the field.
async def test_issue14_item3_batched_agent_memories_keep_filters_cursors_and_grants(state, admin):
    unlabelled = await make_agent(state, admin, name="plain", harness=full_memory(labels={}))
    await agent_records(state, unlabelled, 2, labelled=False)
    agents = [await make_agent(state, admin, name=f"a{i}") for i in range(3)]
    for i, agent in enumerate(agents):
        await agent_records(state, agent, 5 + i)
    await remember(state, agents[0], "a preview record", preview=True)
    gql = GQL(state)
    alone = (
        'query { action(actionId: "%s") { memories(first: 2%s) { edges { cursor node { '
        + AGENT_RECORD
        + " } } "
        + PAGE_INFO
        + " } } }"
    )
    for f in AGENT_FILTERS + [", preview: true"]:
        batched = await gql(admin, AGENT_MEMORIES % f)
        if "name:" in f:
            # A label the agent does not declare: its page fails, as when it is asked alone
            # (and, a connection never null, the listing with it).
            assert batched.codes == ["BAD_REQUEST"] and batched.data is None
            assert "not declared by this agent" in batched.errors[0]["message"]
            assert (await gql(admin, alone % (unlabelled.action_id, f))).codes == ["BAD_REQUEST"]
            batched = await gql(admin, AGENT_MEMORIES.replace("100", "3") % f)  # the others
        for node in batched.ok()["actions"]["nodes"]:
            own = await gql(admin, alone % (node["actionId"], f))
            assert node["memories"] == own.ok()["action"]["memories"], f
    # Each agent pages after its own cursor, in one request, newest or oldest first.
    names = [f"r{i}" for i in range(len(agents))]
    listings = [await listing_of(state, a.action_id) for a in agents]
    for sort, order in (("", 1), (", sort: ASC", -1)):
        query = aliased(
            {
                n: f'action(actionId: "{a.action_id}") {{ memories(first: 2, after: ${n}{sort}) '
                f"{{ edges {{ cursor node {{ {AGENT_RECORD} }} }} {PAGE_INFO} }} }}"
                for n, a in zip(names, agents, strict=True)
            }
        )
        after: dict[str, str | None] = dict.fromkeys(names)
        for _ in range(4):  # 4 to 6 records listed, two a page, then empty pages
            data = (await gql(admin, query, **after)).ok()
            for n, listing in zip(names, listings, strict=True):
                page = data[n]["memories"]
                assert positions(page) == expected(listing[::order], 2, after[n]), (
                    n,
                    sort,
                    after[n],
                )
                after[n] = page["pageInfo"]["endCursor"] or after[n]
    no_status = await gql(admin, AGENT_MEMORIES % ", status: []")
    assert set(no_status.codes) == {"BAD_REQUEST"}
    assert {e["path"][-1] for e in no_status.errors} == {"memories"}
    too_many = await gql(admin, AGENT_MEMORIES.replace("first: 2", "first: 1001") % "")
    assert set(too_many.codes) == {"BAD_REQUEST"}
    no_memory = await gql(reader(admin, reads_memory=False), AGENT_MEMORIES % "")
    assert no_memory.codes and set(no_memory.codes) == {"ACCESS_DENIED"}, no_memory.errors


# A field that fails cancels its siblings (graphql-core); a sibling waiting on a DataLoader's
# future cancelled that future for every other field loading the same key.
@pytest.mark.parametrize(
    "field",
    [
        "session { sessionId }",
        "execution { status }",
        "action { name }",
        "history(first: 1) { nodes { version } }",
    ],
)
async def test_a_field_failing_beside_a_load_leaves_the_same_load_elsewhere_answered(
    state, admin, gql, field
):
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "prefers phone", session="chat-7")
    failing = "bad: history(first: 0) { nodes { version } }"
    query = (
        "query($a: UUID!, $id: UUID!) {"
        f" x: agentMemory(actionId: $a, id: $id) {{ {field} }}"
        f" y: agentMemory(actionId: $a, id: $id) {{ {field} {failing} }} }}"
    )
    for _ in range(3):
        result = await gql(admin, query, a=str(agent.action_id), id=str(record.memory_id))
        (error,) = result.errors  # was: CancelledError out of the resolver (HTTP 500)
        assert error["extensions"]["code"] == "BAD_REQUEST", error
        assert error["path"] == ["y", "bad"]


async def test_a_load_no_field_waits_for_any_more_is_not_read_on_after_the_answer(
    state, admin, gql, monkeypatch
):
    """A field whose sibling fails is cancelled (graphql-core); when it was the only one
    waiting for a load, that load is cancelled too: its batch is not read on in the background,
    holding a pooled connection, after the request has answered."""
    agent = await make_agent(state, admin)
    record = await remember(state, agent, "prefers phone", session="chat-7")
    reads = {"started": 0, "running": 0}
    sessions = _BATCHES["ActionSession"]

    async def slow(pool, caller, keys):
        reads["started"] += 1
        reads["running"] += 1
        try:
            await asyncio.sleep(0.5)
            return await sessions(pool, caller, keys)
        finally:
            reads["running"] -= 1

    monkeypatch.setitem(_BATCHES, "ActionSession", slow)
    query = (
        "query($a: UUID!, $id: UUID!) { y: agentMemory(actionId: $a, id: $id) {"
        " session { sessionId } bad: history(first: 0) { nodes { version } } } }"
    )
    result = await gql(admin, query, a=str(agent.action_id), id=str(record.memory_id))
    assert result.codes == ["BAD_REQUEST"], result.errors
    await asyncio.sleep(0.1)
    assert reads["running"] == 0, reads  # was: read on for 0.5 s after the answer
