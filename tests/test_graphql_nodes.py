"""`nodes(ids)`: many objects by their global IDs in one call, over HTTP, each as `node(id)`
reads it; what `node` answers NOT_FOUND is null, and the request stands (no error)."""

import base64
import json
import uuid
from typing import Any
from uuid import UUID

import httpx
import pytest
from factories import (
    allow,
    caller,
    deny,
    forget,
    make_account,
    make_agent,
    record_turn,
    remember,
    token_for,
    writer,
)
from helpers import GQL
from test_graphql_loaders import EVENTS, all_events, counted, executions_with_events, reader

from app.actions import service as actions
from app.auth import service as auth_service
from app.executions import store as executions_store
from app.graphql.node import MAX_IDS
from app.graphql.relay import global_id
from app.graphql.schema import schema
from app.state import AppState

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")

# Every Node type, by a fragment each: what node(id) and nodes(ids) answer alike.
FIELDS = """
  __typename id
  ... on Action { actionId version name }
  ... on ActionAgentMemory { memoryId version memoryStatus: status summary }
  ... on ActionExecution { executionId status }
  ... on ActionSession { sessionId turns }
  ... on ActionHistoryEvent { eventId sessionId text }
  ... on ActionExecutionEvent { sequence invocationNumber type data created }
  ... on Client { principal name }
  ... on Account { accountId name }
  ... on ClientTokenInfo { tokenId prefix }
"""
NODES = f"query($ids: [ID!]!) {{ nodes(ids: $ids) {{ {FIELDS} }} }}"
NODE = f"query($id: ID!) {{ node(id: $id) {{ {FIELDS} }} }}"


def post(url: str, token: str, query: str, **variables: Any) -> tuple[int, dict[str, Any]]:
    response = httpx.post(
        f"{url}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    return response.status_code, response.json()


def codes(body: dict[str, Any]) -> list[str]:
    return [e["extensions"]["code"] for e in body.get("errors") or []]


async def add_event(state: AppState, agent, session: str, execution_id: UUID) -> UUID:
    """A kept history event of the session's turn, as a turn keeps one."""
    event_id = uuid.uuid4()
    async with state.pool.acquire() as conn:
        await conn.execute(
            """
            INSERT INTO history_events (account_id, action_id, session_id, event_id, turn,
                execution_id, invocation_number, sequence, who, data, text, parts, preview)
            VALUES ($1, $2, $3, $4, 1, $5, 1, 1, 'user', $6, $7, 1, false)
            """,
            agent.account_id,
            agent.action_id,
            session,
            event_id,
            execution_id,
            {"content": f"hello from {session}"},
            f"hello from {session}",
        )
    return event_id


async def every_type(state: AppState, admin, count: int = 1, owner=None) -> dict[str, list[str]]:
    """`count` objects of each Node type, by type: their global IDs. The agent's are `owner`'s
    (by default the admin's); the clients and tokens are of the owner's account, or of a new
    one when the owner is the admin of the default account."""
    owner = owner or admin
    agent = await make_agent(state, owner)
    account_id = await make_account(state, "acme") if owner is admin else owner.account_id
    ids: dict[str, list[str]] = {
        "Action": [global_id("Action", agent.action_id, agent.version)],
        "ActionAgentMemory": [],
        "ActionExecution": [],
        "ActionSession": [],
        "ActionHistoryEvent": [],
        "ActionExecutionEvent": [],
        "Client": [],
        "Account": [global_id("Account", account_id)],
        "ClientToken": [],
    }
    for i in range(count):
        w = writer(agent, session=f"s{i}")
        await record_turn(state, w)
        record = await remember(state, agent, f"fact {i}", scope="AGENT")
        ids["ActionAgentMemory"].append(
            global_id("ActionAgentMemory", agent.action_id, record.memory_id)
        )
        ids["ActionExecution"].append(global_id("ActionExecution", agent.action_id, w.execution_id))
        ids["ActionSession"].append(global_id("ActionSession", agent.action_id, f"s{i}"))
        event = await add_event(state, agent, f"s{i}", w.execution_id)
        ids["ActionHistoryEvent"].append(
            global_id("ActionHistoryEvent", agent.action_id, f"s{i}", event)
        )
        async with state.pool.acquire() as conn:
            await executions_store.insert_events(
                conn,
                agent.account_id,
                agent.action_id,
                w.execution_id,
                [(1, 1, "turn.input", {"input": f"hello from s{i}"})],
            )
        ids["ActionExecutionEvent"].append(
            global_id("ActionExecutionEvent", agent.action_id, w.execution_id, 1)
        )
        principal = f"bot{i}"
        await token_for(state, admin, principal, EVERYTHING, account_id=account_id)
        ids["Client"].append(global_id("Client", account_id, principal))
        tokens = await auth_service.list_client_tokens(
            state.pool, admin, account_id=account_id, principal=principal
        )
        ids["ClientToken"].append(
            global_id("ClientToken", account_id, principal, tokens[0].token_id)
        )
    return ids


def parts(id: str) -> list[str]:
    return json.loads(base64.urlsafe_b64decode(id + "=" * (-len(id) % 4)))[1:]


async def test_nodes_reads_every_type_in_the_order_asked_duplicates_at_each_place(
    state, admin, base_url
):
    token = await token_for(state, admin, "ops", EVERYTHING)
    ids = await every_type(state, admin)
    one_each = [i for found in ids.values() for i in found]
    assert len(one_each) == 9
    asked = [*reversed(one_each), one_each[0], one_each[3], one_each[0]]
    status, body = post(base_url, token, NODES, ids=asked)
    assert status == 200 and "errors" not in body, body
    answered = body["data"]["nodes"]
    assert [n["id"] for n in answered] == asked
    assert {n["__typename"] for n in answered} == {
        "Action",
        "ActionAgentMemory",
        "ActionExecution",
        "ActionSession",
        "ActionHistoryEvent",
        "ActionExecutionEvent",
        "Client",
        "Account",
        "ClientTokenInfo",
    }
    # Each entry is what node(id) answers for its ID.
    for id, entry in zip(asked, answered, strict=True):
        status, one = post(base_url, token, NODE, id=id)
        assert status == 200 and one == {"data": {"node": entry}}
    # No IDs: an empty list.
    assert post(base_url, token, NODES, ids=[])[1] == {"data": {"nodes": []}}


async def test_ids_naming_nothing_are_null_at_their_index(state, admin, base_url):
    """Unknown, deleted (as node has it: a deleted record stays readable, a revoked token or a
    deleted client does not) or another tenant's: null at the item, no error (a failed request
    answers data: null, and this one did not fail: as `action(actionId)` answers an agent it
    does not find), and the rest of the answer stands; another tenant's answers exactly as an
    unknown one."""
    token = await token_for(state, admin, "ops", EVERYTHING)
    ids = await every_type(state, admin, count=2)
    agent_id, memory_id = map(UUID, parts(ids["ActionAgentMemory"][1]))
    # A deleted record: node reads it (status DELETED), so does nodes.
    agent = await actions.get_action(state.pool, admin, action_id=agent_id)
    assert agent is not None
    await forget(state, agent, memory_id)
    # A revoked token and a deleted client: node answers NOT_FOUND.
    account_id, principal, token_id = parts(ids["ClientToken"][1])
    await auth_service.revoke_client_token(
        state.pool, admin, account_id=UUID(account_id), principal=principal, token_id=UUID(token_id)
    )
    gone_client = ids["Client"][0]
    await auth_service.delete_client(
        state.pool, admin, account_id=UUID(account_id), principal="bot0"
    )
    other_account = await make_account(state, "other")
    theirs = await every_type(state, admin, owner=caller(other_account, EVERYTHING))
    unknown_record = global_id("ActionAgentMemory", agent_id, uuid.uuid4())
    no_such_type = global_id("Invoice", uuid.uuid4())
    asked = [
        ids["Action"][0],  # 0
        unknown_record,  # 1
        theirs["ActionAgentMemory"][0],  # 2
        ids["ActionAgentMemory"][1],  # 3: deleted, still read
        ids["ClientToken"][1],  # 4: revoked
        gone_client,  # 5: deleted
        theirs["Action"][0],  # 6
        no_such_type,  # 7
        ids["ActionSession"][0],  # 8
        unknown_record,  # 9: again
    ]
    # The other tenant's client reads its own; the default account's objects are hidden from it.
    tenant_token = await token_for(state, admin, "tenant-ops", EVERYTHING, account_id=other_account)
    status, body = post(base_url, tenant_token, NODES, ids=asked)
    assert status == 200
    missing_for_tenant = [i for i in range(10) if i not in (2, 6)]
    assert "errors" not in body, body["errors"]
    assert [i for i, n in enumerate(body["data"]["nodes"]) if n is None] == missing_for_tenant

    # The ops client (of the default account: it reaches other accounts' clients, never their
    # agents' objects).
    status, body = post(base_url, token, NODES, ids=asked)
    assert status == 200
    answered = body["data"]["nodes"]
    missing = [1, 2, 4, 5, 6, 7, 9]
    assert [i for i, n in enumerate(answered) if n is None] == missing
    assert answered[3]["memoryStatus"] == "DELETED"
    assert [n["id"] for n in answered if n is not None] == [
        asked[i] for i in range(10) if i not in missing
    ]
    assert "errors" not in body, body["errors"]
    # As node answers them.
    for i in missing:
        assert codes(post(base_url, token, NODE, id=asked[i])[1]) == ["NOT_FOUND"]
    # Under an alias, the path names the alias.
    status, body = post(
        base_url,
        token,
        "query($ids: [ID!]!) { found: nodes(ids: $ids) { id } }",
        ids=[ids["Action"][0], unknown_record],
    )
    assert body == {"data": {"found": [{"id": ids["Action"][0]}, None]}}


def test_the_schema_says_what_nodes_answers_for_an_id_naming_nothing():
    """What a client reads in schema.graphql is what the test above checks: null at the item,
    no error (a failed request answers `data: null`, so an error there would leave no list).
    It used to promise an error at each such item."""
    described = schema._schema.query_type.fields["nodes"].description
    assert "the list holds null, with no error" in described, described
    assert '["nodes", i]' not in described


async def test_ids_mixing_two_tenants_parts_name_nothing(state, admin, base_url):
    """A tenant building IDs from its own parts and another tenant's (its agent with their
    record, execution or event; their agent with its session or event; its account with their
    token) reads nothing of theirs, and what it reads of them answers exactly as
    IDs naming nothing do: null, no error, the same bytes."""
    ours, theirs = await make_account(state, "ours"), await make_account(state, "theirs")
    mine = await every_type(state, admin, owner=caller(ours, EVERYTHING))
    other = await every_type(state, admin, owner=caller(theirs, EVERYTHING))
    token = await token_for(state, admin, "ours-ops", EVERYTHING, account_id=ours)
    agent = parts(mine["Action"][0])[0]
    their_agent = parts(other["Action"][0])[0]
    _, their_memory = parts(other["ActionAgentMemory"][0])
    _, their_execution = parts(other["ActionExecution"][0])
    _, their_session, their_event = parts(other["ActionHistoryEvent"][0])
    _, my_execution = parts(mine["ActionExecution"][0])
    _, their_principal, their_token = parts(other["ClientToken"][0])
    _, my_session, my_event = parts(mine["ActionHistoryEvent"][0])

    def mixed(memory: str, execution: str, event: str, token_id: str, account: str) -> list[str]:
        return [
            global_id("ActionAgentMemory", agent, memory),
            global_id("ActionAgentMemory", agent, memory, 1),
            global_id("ActionExecution", agent, execution),
            global_id("ActionHistoryEvent", agent, their_session, event),
            global_id("ActionHistoryEvent", agent, my_session, event),
            global_id("ActionHistoryEvent", their_agent, my_session, my_event),
            global_id("ActionExecutionEvent", agent, execution, 1),
            global_id("ActionExecutionEvent", their_agent, my_execution, 1),
            global_id("ActionSession", their_agent, my_session),
            global_id("ClientToken", ours, their_principal, token_id),
            global_id("ClientToken", theirs, their_principal, token_id),
            global_id("Account", account),
        ]

    # Both accounts name a session s0 and a client bot0: only the agent or account tells them
    # apart.
    assert (their_session, their_principal) == (my_session, parts(mine["Client"][0])[1])
    asked = mixed(their_memory, their_execution, their_event, their_token, str(theirs))
    status, body = post(base_url, token, NODES, ids=asked)
    assert status == 200 and body == {"data": {"nodes": [None] * len(asked)}}, [
        (i, n) for i, n in enumerate(body["data"]["nodes"]) if n is not None
    ]
    unknown = mixed(*(str(uuid.uuid4()) for _ in range(4)), str(uuid.uuid4()))
    assert post(base_url, token, NODES, ids=unknown)[1] == body
    # Their own IDs, read by them, are theirs: the same parts name their objects.
    their_token_text = await token_for(state, admin, "theirs-ops", EVERYTHING, account_id=theirs)
    _, found = post(base_url, their_token_text, NODES, ids=[i for v in other.values() for i in v])
    assert all(n is not None for n in found["data"]["nodes"]), found


async def test_hostile_parts_of_an_id_are_bad_request(state, admin, base_url):
    """Well-encoded IDs whose parts are NUL, lone surrogates (as JSON escapes), numbers past
    int4 and int8 or negative, not text, nested 2,000 deep: BAD_REQUEST through node and
    nodes, never INTERNAL; among 1,000 IDs, the field fails naming the malformed one's place."""
    token = await token_for(state, admin, "ops", EVERYTHING)
    ids = await every_type(state, admin)
    agent, memory = parts(ids["ActionAgentMemory"][0])

    def encoded(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    hostile = [
        f'["ActionSession","{agent}","a\\u0000b"]',
        f'["ActionSession","{agent}","\\ud800"]',
        f'["Client","{uuid.uuid4()}","\\udfff"]',
        f'["Action","{agent}","2147483648"]',
        f'["ActionAgentMemory","{agent}","{memory}","99999999999999999999999"]',
        f'["Action","{agent}","-1"]',
        f'["Action","{agent}","\\uff11"]',
        f'["Action","{agent}",1]',
        f'["Action","{agent}",1e400]',
        f'["Action","{agent}",NaN]',
        '["Account",' + "[" * 2000 + "]" * 2000 + "]",
        f'["ActionHistoryEvent","{agent}","s0","{memory}","extra"]',
        f'["ActionExecutionEvent","{agent}","{memory}","-1"]',
        f'["ActionExecutionEvent","{agent}","{memory}","2147483648"]',
        f'["ActionExecutionEvent","{agent}","{memory}","1","2"]',
        f'["ActionExecutionEvent","{agent}","{memory}"]',
        f'["ActionExecutionEvent","{agent}","s0","1"]',
        f'["ActionExecutionEvent","{agent}","{memory}",1]',
    ]
    for text in hostile:
        for query, variables in ((NODES, {"ids": [encoded(text)]}), (NODE, {"id": encoded(text)})):
            status, body = post(base_url, token, query, **variables)
            assert status == 200 and codes(body) == ["BAD_REQUEST"], (text, body)
            assert body["data"] is None
    many = [ids["Action"][0]] * 1000
    many[737] = encoded(hostile[1])
    status, body = post(base_url, token, NODES, ids=many)
    assert codes(body) == ["BAD_REQUEST"] and body["data"] is None
    assert body["errors"][0]["message"].startswith("`ids[737]`: "), body


async def test_a_malformed_id_fails_the_field_naming_its_place(state, admin, base_url):
    token = await token_for(state, admin, "ops", EVERYTHING)
    ids = await every_type(state, admin)
    for bad, says in [
        ("not an id", "`ids[1]`: 'not an id' is not a global ID"),
        (global_id("Action", uuid.uuid4(), "x"), "`ids[1]`: an Action ID names an action"),
        (global_id("ActionExecution", "nope", uuid.uuid4()), "`ids[1]`: 'nope' is not a valid"),
        (
            global_id("ActionExecutionEvent", uuid.uuid4(), uuid.uuid4(), "first"),
            "`ids[1]`: an ActionExecutionEvent ID names an agent, an execution and a sequence",
        ),
    ]:
        status, body = post(base_url, token, NODES, ids=[ids["Action"][0], bad])
        assert status == 200 and body["data"] is None
        assert codes(body) == ["BAD_REQUEST"]
        assert body["errors"][0]["message"].startswith(says), body
        # node answers the same ID BAD_REQUEST too.
        assert codes(post(base_url, token, NODE, id=bad)[1]) == ["BAD_REQUEST"]


def respelled(id: str) -> list[str]:
    """The same parts as `id` names, spelled otherwise: each decodes to an object's key, but
    none is the `id` that object answers."""
    type_name, *key = json.loads(base64.urlsafe_b64decode(id + "=" * (-len(id) % 4)))

    def encoded(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    spellings = [
        id + "=" * (-len(id) % 4 or 4),  # padded
        encoded(json.dumps([type_name, *key])),  # JSON with spaces
        encoded(json.dumps([type_name, *key], separators=(",", ":"), indent=0)),  # line breaks
        id[:8] + "." + id[8:],  # a character base64 decoding skips
    ]
    for i, part in enumerate(key):
        if part.isdigit():  # a version
            spellings.append(global_id(type_name, *key[:i], "0" + part, *key[i + 1 :]))
        try:
            uuid.UUID(part)
        except ValueError:
            continue
        for other in (part.upper(), part.replace("-", ""), "{" + part + "}", "urn:uuid:" + part):
            spellings.append(global_id(type_name, *key[:i], other, *key[i + 1 :]))
    return [s for s in spellings if s != id]


async def test_an_id_spelled_otherwise_is_bad_request_not_another_id(state, admin, base_url):
    """node(id) answers the object whose `id` is the one asked (a client caches by `id`): an ID
    whose parts name an object but are not written as the service writes them (a UUID in
    capitals or without hyphens, a version `01`, the JSON spaced, the base64 padded) is
    BAD_REQUEST, as a malformed one is; it used to read the object, which answered another
    `id`. Every issued ID reads back as itself."""
    token = await token_for(state, admin, "ops", EVERYTHING)
    ids = await every_type(state, admin)
    agent, memory = parts(ids["ActionAgentMemory"][0])
    ids["ActionAgentMemory"].append(global_id("ActionAgentMemory", agent, memory, 1))
    for type_name, issued in ids.items():
        (id, *others) = issued
        status, body = post(base_url, token, NODE, id=id)
        assert status == 200 and body["data"]["node"]["id"] == id, (type_name, body)
        for other in respelled(id) + [respelled(o)[0] for o in others]:
            for query, variables in ((NODE, {"id": other}), (NODES, {"ids": [id, other]})):
                status, body = post(base_url, token, query, **variables)
                assert status == 200 and codes(body) == ["BAD_REQUEST"], (type_name, other, body)
                assert body["data"] is None


async def test_a_refusal_quotes_a_long_id_by_its_start_end_and_length(state, admin, base_url):
    """A refusal repeated the ID it refused whole: an ID of 900,000 characters (as long as the
    request may be) came back in each error's message. The IDs the service issues are still
    quoted whole; a longer one by its start, its end and its length."""
    token = await token_for(state, admin, "ops", EVERYTHING)
    huge = "A" * 900_000 + "?"
    for query, variables in ((NODE, {"id": huge}), (NODES, {"ids": [huge]})):
        status, body = post(base_url, token, query, **variables)
        assert status == 200 and codes(body) == ["BAD_REQUEST"], body["errors"][0]["message"][:200]
        message = body["errors"][0]["message"]
        assert len(message) < 4100 and "(900,003 characters) is not a global ID" in message
    # Well formed, naming nothing: NOT_FOUND from node, quoted whole (an ID as long as the
    # longest the service issues, a session of 200 emoji).
    session = "\U0001f600" * 200
    missing = global_id("ActionSession", uuid.uuid4(), session)
    status, body = post(base_url, token, NODE, id=missing)
    assert codes(body) == ["NOT_FOUND"]
    assert body["errors"][0]["message"] == f"no object has the ID {missing!r}"


async def test_at_most_max_ids_at_once(state, admin, base_url):
    token = await token_for(state, admin, "ops", EVERYTHING)
    ids = await every_type(state, admin)
    many = [ids["ActionAgentMemory"][0]] * MAX_IDS
    status, body = post(
        base_url, token, "query($ids: [ID!]!) { nodes(ids: $ids) { id } }", ids=many
    )
    assert status == 200 and "errors" not in body
    assert body["data"]["nodes"] == [{"id": many[0]}] * MAX_IDS
    status, body = post(
        base_url, token, "query($ids: [ID!]!) { nodes(ids: $ids) { id } }", ids=[*many, many[0]]
    )
    assert codes(body) == ["BAD_REQUEST"] and body["data"] is None
    assert body["errors"][0]["message"] == (
        "`ids` holds 1,001 IDs; `nodes` reads at most 1,000 at once: send the others in "
        "further requests"
    )


@pytest.mark.settings(max_query_nodes=50)
async def test_the_request_limits_count_nodes_at_its_ids(state, admin, base_url):
    """ENGRAM_MAX_QUERY_NODES counts an object per ID (and what each selects), before
    anything runs."""
    token = await token_for(state, admin, "ops", EVERYTHING)
    ids = await every_type(state, admin)
    action = ids["Action"][0]
    plain = "query($ids: [ID!]!) { nodes(ids: $ids) { id } }"
    assert (
        post(base_url, token, plain, ids=[action] * 50)[1]["data"]["nodes"] == [{"id": action}] * 50
    )
    status, body = post(base_url, token, plain, ids=[action] * 51)
    assert codes(body) == ["BAD_REQUEST"]
    assert "could hold 51 objects" in body["errors"][0]["message"]
    # Nested pages multiply: 5 IDs, each an agent, its page and 10 records, are 5 * 12.
    nested = """query($ids: [ID!]!) { nodes(ids: $ids) {
        ... on Action { memories(first: 10) { nodes { memoryId } } } } }"""
    status, body = post(base_url, token, nested, ids=[action] * 5)
    assert codes(body) == ["BAD_REQUEST"]
    assert "could hold 60 objects" in body["errors"][0]["message"]
    assert "errors" not in post(base_url, token, nested, ids=[action] * 4)[1]


@pytest.mark.settings(max_answer_bytes=2**20)
async def test_the_answers_bytes_bound_holds(state, admin, base_url):
    """ENGRAM_MAX_ANSWER_BYTES bounds the answer as it is built, an ID asked again counted
    again."""
    token = await token_for(state, admin, "ops", EVERYTHING)
    big = await make_agent(state, admin, instructions="x" * 60_000)
    asked = [global_id("Action", big.action_id, big.version)]
    query = "query($ids: [ID!]!) { nodes(ids: $ids) { ... on Action { instructions } } }"
    assert "errors" not in post(base_url, token, query, ids=asked * 16)[1]
    status, body = post(base_url, token, query, ids=asked * 18)
    assert body["data"] is None and codes(body) == ["BAD_REQUEST"]
    assert "answer passed 1,048,576 bytes" in body["errors"][0]["message"]


async def test_each_id_keeps_the_grants_node_has(state, admin, base_url):
    """A client holding the memory grants alone: records read; an execution's ID is
    ACCESS_DENIED (as node answers it), failing the field; an agent's ID reads it without its
    document (a field of it needs SELECT on financial.Action.document, as node's)."""
    ids = await every_type(state, admin)
    memory_only = await token_for(
        state,
        admin,
        "memory-reader",
        allow(["SELECT"], "financial.AgentMemory.indexes.*", "financial.AgentMemory.document"),
    )
    records = "query($ids: [ID!]!) { nodes(ids: $ids) { id ... on ActionAgentMemory { summary } } }"
    status, body = post(base_url, memory_only, records, ids=ids["ActionAgentMemory"])
    assert "errors" not in body and body["data"]["nodes"][0]["summary"] == "fact 0"
    for type_name in (
        "ActionExecution",
        "ActionSession",
        "ActionHistoryEvent",
        "ActionExecutionEvent",
        "Client",
        "Account",
        "ClientToken",
    ):
        asked = [ids["ActionAgentMemory"][0], ids[type_name][0]]
        status, body = post(base_url, memory_only, records, ids=asked)
        assert body["data"] is None and codes(body) == ["ACCESS_DENIED"], (type_name, body)
        assert body["errors"][0]["message"].startswith("`ids[1]`: "), body
        assert codes(post(base_url, memory_only, NODE, id=asked[1])[1]) == ["ACCESS_DENIED"]
    # An unknown ID of a type it may not read is ACCESS_DENIED as well: the grant is checked
    # before anything is read, so the answer tells nothing of what exists.
    unknown = global_id("ActionExecution", uuid.uuid4(), uuid.uuid4())
    assert codes(post(base_url, memory_only, records, ids=[unknown])[1]) == ["ACCESS_DENIED"]
    # An agent reads without grants; its name needs the document grant, as through node.
    status, body = post(
        base_url, memory_only, "query($ids: [ID!]!) { nodes(ids: $ids) { id } }", ids=ids["Action"]
    )
    assert body == {"data": {"nodes": [{"id": ids["Action"][0]}]}}
    status, body = post(
        base_url,
        memory_only,
        "query($ids: [ID!]!) { nodes(ids: $ids) { ... on Action { name } } }",
        ids=ids["Action"],
    )
    assert codes(body) == ["ACCESS_DENIED"] and body["data"] is None


async def test_nodes_reads_each_type_in_one_batch(state, db_url, admin):
    """No N+1: 115 IDs of every type cost what 10 do (a statement per type; records three:
    the records, the versions asked, their agents' label names)."""
    ids = await every_type(state, admin, count=15)
    # A second agent's records, asked at their first version (since deleted: version 2).
    other = await make_agent(state, admin, name="billing")
    versioned = []
    for i in range(8):
        record = await remember(state, other, f"billing fact {i}", scope="AGENT")
        await forget(state, other, record.memory_id)
        versioned.append(global_id("ActionAgentMemory", other.action_id, record.memory_id, 1))
    few = [found[0] for found in ids.values()] + versioned[:1]
    many = [i for found in ids.values() for i in found] + versioned
    assert len(many) == 115 and len(set(many)) == 115
    data, statements_few = await counted(state, db_url, admin, NODES, ids=few)
    assert all(n is not None for n in data["nodes"])
    data, statements_many = await counted(state, db_url, admin, NODES, ids=many)
    assert [n["id"] for n in data["nodes"]] == many
    assert all(n is not None for n in data["nodes"])
    assert data["nodes"][-1]["version"] == 1 and data["nodes"][-1]["memoryStatus"] == "ACTIVE"
    assert statements_many == statements_few == 11, (statements_few, statements_many)


# A turn's transcript events (ActionExecutionEvent): each a Node, read back by node(id) and
# nodes(ids) as ActionExecution.transcript lists it.
EVENT = "id actionId executionId sequence invocationNumber type data created"
LISTED_EVENTS = f"""query($e: UUID!) {{ execution(executionId: $e) {{
  transcript(first: 100) {{ nodes {{ {EVENT} }} }} }} }}"""
EVENT_NODE = f"query($id: ID!) {{ node(id: $id) {{ ... on ActionExecutionEvent {{ {EVENT} }} }} }}"
EVENT_NODES = (
    f"query($ids: [ID!]!) {{ nodes(ids: $ids) {{ ... on ActionExecutionEvent {{ {EVENT} }} }} }}"
)


def event_id(agent, execution_id: UUID, sequence: int | str) -> str:
    return global_id("ActionExecutionEvent", agent.action_id, execution_id, sequence)


async def transcript_of(gql: GQL, who, execution_id: UUID) -> list[dict[str, Any]]:
    listed = (await gql(who, LISTED_EVENTS, e=str(execution_id))).ok()["execution"]
    return listed["transcript"]["nodes"]


@pytest.mark.parametrize("reads_memory", [True, False])
async def test_a_transcript_events_id_reads_it_as_the_transcript_lists_it(
    gql: GQL, admin, reads_memory
):
    """Each event `transcript` lists has an `id` (its agent, execution and sequence) that
    node(id) and nodes(ids) read back as the same event: for a reader without the memory
    grants, with the same memory text left out."""
    agent = await make_agent(gql.state, admin)
    done, _running = await executions_with_events(gql.state, agent, [len(EVENTS), 2])
    who = reader(admin, reads_memory=reads_memory)
    listed = await transcript_of(gql, who, done)
    assert [e["sequence"] for e in listed] == list(range(1, len(EVENTS) + 1))
    assert ("Ada likes tea" in json.dumps(listed)) == reads_memory
    for event in listed:
        assert event["id"] == event_id(agent, done, event["sequence"])
        assert (event["actionId"], event["executionId"]) == (str(agent.action_id), str(done))
        assert (await gql(who, EVENT_NODE, id=event["id"])).ok() == {"node": event}
    asked = [e["id"] for e in reversed(listed)] + [listed[0]["id"]]
    found = (await gql(who, EVENT_NODES, ids=asked)).ok()["nodes"]
    assert found == [*reversed(listed), listed[0]]


async def test_an_event_of_a_running_attempt_is_found_once_it_ends(gql: GQL, admin):
    """As the transcript lists an attempt's events once it ends, node(id) reads them then: an
    execution's failed first attempt's events are read while its second runs, the second's
    are NOT_FOUND (null in nodes) until it has ended."""
    agent = await make_agent(gql.state, admin)
    # Its first attempt wrote sequences 1 and 2; its second, running, 3 and 4.
    (running,) = await executions_with_events(gql.state, agent, [4])
    who = reader(admin, reads_memory=True)
    ids = [event_id(agent, running, s) for s in range(1, 5)]
    listed = await transcript_of(gql, who, running)
    assert [e["id"] for e in listed] == ids[:2]
    assert (await gql(who, EVENT_NODES, ids=ids)).ok()["nodes"] == [*listed, None, None]
    for id in ids[2:]:
        assert (await gql(who, EVENT_NODE, id=id)).codes == ["NOT_FOUND"]
    await gql.state.pool.execute(
        "UPDATE executions SET status = 'FAILED', error = 'gone' WHERE execution_id = $1",
        running,
    )
    listed = await transcript_of(gql, who, running)
    assert [e["id"] for e in listed] == ids
    assert (await gql(who, EVENT_NODES, ids=ids)).ok()["nodes"] == listed
    assert (await gql(who, EVENT_NODE, id=ids[3])).ok() == {"node": listed[3]}


async def test_another_accounts_event_is_not_found(gql: GQL, state, admin):
    """An event's ID read by a client of another account is NOT_FOUND (null in nodes), as an
    ID naming no event is."""
    agent = await make_agent(state, admin)
    done, _ = await executions_with_events(state, agent, [3, 0])
    id = event_id(agent, done, 1)
    assert (await gql(admin, EVENT_NODE, id=id)).ok()["node"]["id"] == id
    other = caller(await make_account(state, "other"), EVERYTHING)
    refused = await gql(other, EVENT_NODE, id=id)
    assert refused.codes == ["NOT_FOUND"] and refused.data is None
    assert (await gql(other, EVENT_NODES, ids=[id, id])).ok() == {"nodes": [None, None]}
    unknown = event_id(agent, done, 4)
    assert (await gql(admin, EVENT_NODE, id=unknown)).codes == ["NOT_FOUND"]
    assert (await gql(admin, EVENT_NODES, ids=[unknown, id])).ok()["nodes"][0] is None


async def test_an_events_id_needs_the_grant_the_transcript_needs(gql: GQL, state, admin):
    """SELECT on financial.ActionExecution.transcript, as ActionExecution.transcript: with it
    alone an event reads (its memory text left out); without it, ACCESS_DENIED, whether the
    event exists or not, as through the transcript."""
    agent = await make_agent(state, admin)
    done, _ = await executions_with_events(state, agent, [len(EVENTS), 0])
    ids = [event_id(agent, done, s) for s in (2, 99)]
    transcript_only = caller(
        admin.account_id, allow(["SELECT"], "financial.ActionExecution.transcript")
    )
    found = (await gql(transcript_only, EVENT_NODE, id=ids[0])).ok()["node"]
    assert found["type"] == "tool.execution" and "Ada likes tea" not in json.dumps(found)
    no_transcript = caller(
        admin.account_id,
        allow(["SELECT"], "financial.*"),
        deny(["SELECT"], "financial.ActionExecution.transcript"),
    )
    refused = await gql(no_transcript, LISTED_EVENTS, e=str(done))
    assert refused.codes == ["ACCESS_DENIED"]
    for id in ids:
        assert (await gql(no_transcript, EVENT_NODE, id=id)).codes == ["ACCESS_DENIED"]
        assert (await gql(no_transcript, EVENT_NODES, ids=[id])).codes == ["ACCESS_DENIED"]


async def test_an_altered_events_id_is_bad_request(gql: GQL, admin):
    """An event's ID with its sequence not a sequence (a word, negative, past int4, written
    `01`), a part more or fewer, or its parts spelled otherwise than the `id` the transcript
    gave: BAD_REQUEST through node and nodes, as for the other Node types."""
    agent = await make_agent(gql.state, admin)
    done, _ = await executions_with_events(gql.state, agent, [3, 0])
    (listed, *_) = await transcript_of(gql, admin, done)
    assert listed["id"] == event_id(agent, done, 1)
    altered = [
        event_id(agent, done, "first"),
        event_id(agent, done, "-1"),
        event_id(agent, done, "2147483648"),
        event_id(agent, done, "01"),
        global_id("ActionExecutionEvent", agent.action_id, done),
        global_id("ActionExecutionEvent", agent.action_id, done, 1, 1),
        global_id("ActionExecutionEvent", agent.action_id, "s1", 1),
        *respelled(listed["id"]),
    ]
    for id in altered:
        refused = await gql(admin, EVENT_NODE, id=id)
        assert refused.codes == ["BAD_REQUEST"] and refused.data is None, (id, refused)
        refused = await gql(admin, EVENT_NODES, ids=[listed["id"], id])
        assert refused.codes == ["BAD_REQUEST"], (id, refused)
        assert refused.errors[0]["message"].startswith("`ids[1]`: "), refused.errors


async def test_nodes_reads_transcript_events_in_one_statement(state, db_url, admin):
    """No N+1: the events of many IDs, of several executions (a running attempt's and IDs
    naming nothing among them), are one statement, as one ID's; each answers as the
    transcript lists it (here for a reader without the memory grants)."""
    agent = await make_agent(state, admin)
    counts = [5, 3, 6, 4]  # the last execution runs its second attempt (sequences 3 and 4)
    made = await executions_with_events(state, agent, counts)
    ids = [
        event_id(agent, e, s) for e, n in zip(made, counts, strict=True) for s in range(1, n + 2)
    ]
    who = reader(admin, reads_memory=False)
    fields = """query($ids: [ID!]!) { nodes(ids: $ids) {
      ... on ActionExecutionEvent { id sequence invocationNumber type data } } }"""
    _, one = await counted(state, db_url, who, fields, ids=ids[:1])
    data, many = await counted(state, db_url, who, fields, ids=ids)
    assert one == many == 1, (one, many)
    listed = {}
    for e, events in (await all_events(state, agent, reads_memory=False)).items():
        for _, node in events:
            id = event_id(agent, UUID(e), node["sequence"])
            listed[id] = {"id": id, **node}
    assert data["nodes"] == [listed.get(id) for id in ids]
    assert sum(n is None for n in data["nodes"]) == len(counts) + 2
