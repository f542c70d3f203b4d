"""What one request may ask of the shared service (app/graphql/limits.py): one tenant's request
must not hold the event loop, the pool or the process's memory for everyone else.

Found by a hostile tenant's probe, each with a document of a few hundred bytes to a few KB:
fragments spread twice in each of 30 fragments (validation and the mutation checks walked
them 2^30 times, the event loop blocked for hours); a record's `action` listing its records
(one answer of 1,000 x 1,000 records: 514 MB, /healthz unanswered for 41 s, 2.6 GB resident);
50 aliased searches (every pooled connection held for 6 to 10 s)."""

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpx
import pytest
from factories import allow, make_agent, remember, token_for
from graphql import Source

from app.actions import service as actions_service
from app.auth.caller import Caller
from app.executions import store as executions_store
from app.graphql.context import _BATCHES, Context
from app.graphql.documents import IndexedSource
from app.graphql.schema import build_schema
from app.memory import search as memory_search
from app.state import AppState

EXECUTION_DOCUMENT = "financial.ActionExecution.document"

MEMORIES = """query($a: UUID!) { action(actionId: $a) { memories(first: 1000) {
  nodes { memoryId action { memories(first: 1000) { nodes { memoryId summary } } } } } } }"""

PAGE = "m{i}: memories(first: 1000) {{ nodes {{ summary }} }}"
SEARCH = 's{i}: searchMemories(query: "{query}", first: 5) {{ nodes {{ summary }} }}'


def on_agent(fields: Iterable[str]) -> str:
    """A query of these fields of the agent $a."""
    return "query($a: UUID!) { action(actionId: $a) { " + " ".join(fields) + " } }"


# Run apart (test_fragments_spread_twice_at_each_level_are_checked_once_each).
DOUBLING = """
import uuid

from graphql import parse, validate

from app.auth.caller import Caller
from app.auth.policies import parse_policies
from app.graphql.schema import _depth_rule, schema
from app.graphql.selection import mutation_count_refusal, selection_refusal


def doubling(operation, root, leaf):
    # Fragment i spreads fragment i - 1 twice: 2^40 spreads of the first.
    fragments = [f"fragment F0 on {root} {{ {leaf} }}"] + [
        f"fragment F{i} on {root} {{ ...F{i - 1} ...F{i - 1} }}" for i in range(1, 41)
    ]
    document = parse(operation + " " + " ".join(fragments))
    return document, document.definitions[0], {d.name.value: d for d in document.definitions[1:]}


s = schema._schema
query, _, _ = doubling("query { ...F40 }", "Query", "viewer { principal }")
assert validate(s, query, [_depth_rule(12)]) == []
delete = "deleteAgentMemory(actionId: $a, id: $a) { memoryId }"
mutation, operation, fragments = doubling("mutation($a: UUID!) { ...F40 }", "Mutation", delete)
assert validate(s, mutation, [_depth_rule(12)]) == []
assert mutation_count_refusal(operation, fragments, {}) is None
answer, operation, fragments = doubling(
    "mutation($a: UUID!) { deleteAgentMemory(actionId: $a, id: $a) { ...F40 } }",
    "ActionAgentMemory",
    "memoryId action { name }",
)
reader = Caller(uuid.uuid4(), "reader", parse_policies([]))
refusal = selection_refusal(s, operation, fragments, {}, reader)
assert refusal and "financial.Action.document" in refusal, refusal
print("checked")
"""


def test_fragments_spread_twice_at_each_level_are_checked_once_each():
    """Validation's depth rule and the mutation checks (one mutation a request, the answer's
    grants) measure each fragment once. Measured at each spread, 40 levels were 2^40 steps: run
    apart, so that a regression fails at the timeout instead of holding the test run."""
    done = subprocess.run(
        [sys.executable, "-c", DOUBLING], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "checked" in done.stdout, done.stderr


async def test_fragments_nested_past_the_limit_are_bad_request(gql, admin):
    """A chain of 300 fragments, each spreading the next: the depth rule recursed past
    Python's stack, and the request failed with a RecursionError's words and no code."""
    chain = ["fragment F0 on Query { viewer { principal } }"] + [
        f"fragment F{i} on Query {{ ...F{i - 1} }}" for i in range(1, 300)
    ]
    result = await gql(admin, "query { ...F299 } " + " ".join(chain))
    assert [e.get("extensions", {}).get("code") for e in result.errors][:1] == ["BAD_REQUEST"]
    assert (
        "fragments are spread within fragments 300 deep; at most 100" in result.errors[0]["message"]
    )
    nested = ["fragment F0 on Query { viewer { principal } }"] + [
        f"fragment F{i} on Query {{ ...F{i - 1} }}" for i in range(1, 100)
    ]
    assert (await gql(admin, "query { ...F99 } " + " ".join(nested))).ok()["viewer"]


async def test_an_answer_repeating_a_page_through_the_schema_is_refused_before_it_runs(
    state, gql, admin
):
    agent = await make_agent(state, admin)
    await remember(state, agent, "the only record", scope="AGENT")
    a = str(agent.action_id)
    looped = await gql(admin, MEMORIES, a=a)
    assert looped.codes == ["BAD_REQUEST"] and looped.data is None
    assert "could hold 1,003,002 objects" in looped.errors[0]["message"]
    assert "at most 10,000 (ENGRAM_MAX_QUERY_NODES): nothing ran" in looped.errors[0]["message"]
    aliased = on_agent(PAGE.format(i=i) for i in range(11))
    assert "could hold 11,012 objects" in (await gql(admin, aliased, a=a)).errors[0]["message"]
    # The same, within the limit, runs: nine full pages, or the loop at pages of 95.
    within = on_agent(PAGE.format(i=i) for i in range(9))
    assert len((await gql(admin, within, a=a)).ok()["action"]) == 9
    small = MEMORIES.replace("1000", "95")
    page = (await gql(admin, small, a=a)).ok()["action"]["memories"]["nodes"]
    assert [n["action"]["memories"]["nodes"][0]["summary"] for n in page] == ["the only record"]


async def test_a_mutation_whose_answer_is_over_the_limit_writes_nothing(state, gql, admin):
    """Refused before the mutation runs, as an answer the caller may not read is: a change is
    never made and then lost with its answer."""
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    add = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
      addAgentMemories(actionId: $a, inputs: $inputs) {
        memoryIds memories { action { memories(first: 1000) { nodes { memoryId } } } } } }"""
    inputs = [{"summary": f"fact {i}", "kind": "fact", "scope": "AGENT"} for i in range(20)]
    refused = await gql(admin, add, a=a, inputs=inputs)
    assert (
        refused.codes == ["BAD_REQUEST"]
        and "could hold 20,061 objects" in refused.errors[0]["message"]
    )
    listing = (
        "query($a: UUID!) { action(actionId: $a) { memories(first: 10) { nodes { memoryId } } } }"
    )
    assert (await gql(admin, listing, a=a)).ok()["action"]["memories"]["nodes"] == []
    added = await gql(admin, add, a=a, inputs=inputs[:9])
    assert len(added.ok()["addAgentMemories"]["memoryIds"]) == 9


async def test_searches_a_request_runs_are_counted_wherever_they_are(state, gql, admin):
    agent = await make_agent(state, admin)
    await remember(state, agent, "the parcel is blue", scope="AGENT")
    a = str(agent.action_id)

    def searches(n: int, query: str = "parcel") -> str:
        return on_agent(SEARCH.format(i=i, query=query) for i in range(n))

    refused = await gql(admin, searches(21), a=a)
    assert refused.codes == ["BAD_REQUEST"]
    assert "would run 21 searches" in refused.errors[0]["message"]
    assert "at most 20 (ENGRAM_MAX_QUERY_SEARCHES): nothing ran" in refused.errors[0]["message"]
    ran = (await gql(admin, searches(20), a=a)).ok()["action"]
    assert {n["summary"] for s in ran.values() for n in s["nodes"]} == {"the parcel is blue"}
    # A listing (no query) is no search; a search in each session of a page counts per session.
    assert (await gql(admin, searches(21, query=" "), a=a)).ok()
    per_session = """query($a: UUID!) { action(actionId: $a) { sessions(first: 21) {
      nodes { searchHistory(query: "parcel") { score } } } } }"""
    assert "would run 21 searches" in (await gql(admin, per_session, a=a)).errors[0]["message"]
    skipped = per_session.replace('(query: "parcel")', '(query: "parcel") @skip(if: true)')
    assert (await gql(admin, skipped, a=a)).ok()


async def test_a_request_runs_two_searches_at_once(state, gql, admin, monkeypatch):
    """Aliased searches ran all at once, each holding a pooled connection: 50 held the whole
    pool, and every other tenant's request (and /healthz) waited for one."""
    agent = await make_agent(state, admin)
    running, most = 0, 0
    search = memory_search.search_as_operator

    async def counted(*args, **kwargs):
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.05)
            return await search(*args, **kwargs)
        finally:
            running -= 1

    monkeypatch.setattr(memory_search, "search_as_operator", counted)
    six = on_agent(SEARCH.format(i=i, query="x") for i in range(6))
    result = await gql(admin, six, a=str(agent.action_id))
    assert len(result.ok()["action"]) == 6
    assert most == 2


@pytest.mark.settings(max_query_nodes=50_000, max_query_searches=30)
async def test_the_limits_are_settings(base_url, admin, state):
    """ENGRAM_MAX_QUERY_NODES and ENGRAM_MAX_QUERY_SEARCHES reach the served schema."""
    token = await token_for(state, admin, "reader", allow(["SELECT"], "financial.*"))
    agent = await make_agent(state, admin)
    eleven = on_agent(PAGE.format(i=i) for i in range(11))
    searches = on_agent(SEARCH.format(i=i, query="x") for i in range(31))
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        headers = {"Authorization": f"Bearer {token}"}
        body = {"query": eleven, "variables": {"a": str(agent.action_id)}}
        assert "errors" not in (await http.post("/graphql", json=body, headers=headers)).json()
        body = {"query": searches, "variables": {"a": str(agent.action_id)}}
        answer = (await http.post("/graphql", json=body, headers=headers)).json()
        assert "at most 30 (ENGRAM_MAX_QUERY_SEARCHES)" in answer["errors"][0]["message"]


async def test_introspection_is_asked_once_a_request(gql, admin):
    """40 aliases of a full `__schema` held the event loop a second (3.8 MB), for a client
    holding no grant at all."""
    schema = "__schema { types { name fields { name type { name } } } }"
    twice = await gql(admin, f"{{ a: {schema} b: {schema} }}")
    assert twice.codes == ["BAD_REQUEST"]
    assert "asks for the schema 2 times" in twice.errors[0]["message"]
    assert (await gql(admin, f"{{ {schema} }}")).ok()["__schema"]["types"]
    types = " ".join(f't{i}: __type(name: "Action") {{ name }}' for i in range(21))
    assert "and for 21 types" in (await gql(admin, f"{{ {types} }}")).errors[0]["message"]
    within = types.replace(' t20: __type(name: "Action") { name }', "")
    assert len((await gql(admin, f"{{ {within} }}")).ok()) == 20


async def test_a_selection_repeats_a_field_name_at_most_100_times(gql, admin):
    """Validation compares fields of one response name pairwise, and deeper: 300 `viewer {
    principal }` held the event loop 0.6 s, 1,200 (through fragments as well) 1.4 s."""
    repeated = "{ " + "viewer { principal } " * 101 + "}"
    refused = await gql(admin, repeated)
    assert refused.codes == ["BAD_REQUEST"]
    assert "one selection asks for `viewer` 101 times" in refused.errors[0]["message"]
    assert (await gql(admin, "{ " + "viewer { principal } " * 100 + "}")).ok()["viewer"]
    spreads = (
        "{ "
        + " ".join(f"...F{i}" for i in range(34))
        + " } "
        + " ".join(
            f"fragment F{i} on Query {{ viewer {{ principal }} viewer {{ principal }} "
            "... on Query { viewer { principal } } }"
            for i in range(34)
        )
    )
    assert "asks for `viewer` 102 times" in (await gql(admin, spreads)).errors[0]["message"]
    # Aliases name them apart; the same name in many selections is no repetition.
    aliased = " ".join(f'a{i}: action(actionId: "{uuid.uuid4()}") {{ name }}' for i in range(150))
    assert len((await gql(admin, "{ " + aliased + " }")).ok()) == 150


def instructions_of(aliases: int, directive: str = "") -> str:
    """`aliases` pages of the account's agents' instructions (through graphql-core's own path,
    rather than the short one for plain fields, with a directive on the field)."""
    page = "a{i}: actions(first: 20) {{ nodes {{ actionId instructions{directive} }} }}"
    return "{ " + " ".join(page.format(i=i, directive=directive) for i in range(aliases)) + " }"


@pytest.mark.settings(max_answer_bytes=2**20)
async def test_an_answer_past_max_answer_bytes_is_refused_whole(base_url, state, admin, gql):
    """The object count bounds no text: nine aliases of a page of 1,000 agents' 64 KiB
    instructions are 9,009 objects and 590 MB. The answer's size is counted as it is built,
    on the short path for plain fields and on graphql-core's own."""
    for i in range(12):  # 720,000 characters of instructions
        await make_agent(state, admin, name=f"agent {i}", instructions=str(i % 10) * 60_000)
    token = await token_for(state, admin, "reader", allow(["SELECT"], "financial.*"))
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:

        async def ask(query: str) -> dict:
            body = {"query": query}
            return (await http.post("/graphql", json=body, headers=headers)).json()

        headers = {"Authorization": f"Bearer {token}"}
        for directive in ("", " @include(if: true)"):
            within = await ask(instructions_of(1, directive))
            assert "errors" not in within
            # In full, as the default budget (32 MiB) answers it.
            assert within["data"] == (await gql(admin, instructions_of(1))).ok()
            assert sorted(n["instructions"][0] for n in within["data"]["a0"]["nodes"]) == sorted(
                str(i % 10) for i in range(12)
            )
            refused = await ask(instructions_of(2, directive))
            assert refused["data"] is None and len(refused["errors"]) == 1, refused
            error = refused["errors"][0]
            assert error["extensions"]["code"] == "BAD_REQUEST"
            assert "answer passed 1,048,576 bytes (ENGRAM_MAX_ANSWER_BYTES" in error["message"]
            assert "ask for smaller pages or fewer fields" in error["message"]
    assert len((await gql(admin, instructions_of(2))).ok()) == 2


@pytest.mark.settings(max_answer_bytes=2**20)
async def test_a_mutation_whose_answer_passes_max_answer_bytes_still_writes(base_url, state, admin):
    """Aliases of one field hold one object's text many times over; a mutation's answer is
    counted too, and its refusal says that the change was made (one mutation a request)."""
    token = await token_for(state, admin, "writer", allow(["SELECT", "INSERT"], "financial.*"))
    fields = " ".join(f"i{i}: instructions" for i in range(20))  # 20 x 60,000 characters
    create = f"mutation($input: ActionInput!) {{ createAction(input: $input) {{ {fields} }} }}"
    listing = "{ actions(first: 10) { nodes { name } } }"
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:

        async def ask(query: str, **variables: Any) -> dict:
            body = {"query": query, "variables": variables}
            return (await http.post("/graphql", json=body, headers=headers)).json()

        headers = {"Authorization": f"Bearer {token}"}
        agent = {"name": "verbose", "instructions": "x" * 60_000}
        refused = await ask(create, input=agent)
        assert refused["data"] is None and len(refused["errors"]) == 1, refused
        error = refused["errors"][0]
        assert error["extensions"]["code"] == "BAD_REQUEST"
        assert "passed 1,048,576 bytes (ENGRAM_MAX_ANSWER_BYTES" in error["message"]
        assert "the change the mutation asked for was made" in error["message"]
        assert (await ask(listing))["data"]["actions"]["nodes"] == [{"name": "verbose"}]
        fewer = create.replace(fields, " ".join(f"i{i}: instructions" for i in range(15)))
        assert (
            len((await ask(fewer, input=agent | {"name": "terse"}))["data"]["createAction"]) == 15
        )


@pytest.mark.settings(max_answer_bytes=2**20)
async def test_json_an_answer_resolves_is_counted_at_its_length(base_url, state, admin, gql):
    """An execution's `input` (a resolver's JSON value, up to a request body each) counts at
    its length as JSON."""
    agent = await make_agent(state, admin)
    async with state.pool.acquire() as conn:
        await executions_store.ensure_session(conn, admin.account_id, agent.action_id, "s1")
        for turn in range(3):
            await executions_store.insert_execution(
                conn,
                account_id=admin.account_id,
                action_id=agent.action_id,
                execution_id=uuid.uuid4(),
                action_version=1,
                session_id="s1",
                turn=turn + 1,
                kind="TURN",
                status="RUNNING",
                preview=False,
                principal=admin.principal,
                token_id=None,
                input={"messages": [{"role": "user", "content": "y" * 200_000}] * 2},
            )
    inputs = (
        "query($a: UUID!) {{ action(actionId: $a) {{ executions(first: {n}) {{ nodes {{ input }} "
        "}} }} }}"
    )
    token = await token_for(state, admin, "reader", allow(["SELECT"], "financial.*"))
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        headers = {"Authorization": f"Bearer {token}"}
        a = str(agent.action_id)

        async def ask(n: int) -> dict:
            body = {"query": inputs.format(n=n), "variables": {"a": a}}
            return (await http.post("/graphql", json=body, headers=headers)).json()

        two = await ask(2)  # 800,000 characters of JSON
        assert "errors" not in two
        assert two["data"] == (await gql(admin, inputs.format(n=2), a=a)).ok()
        refused = await ask(3)
        assert refused["data"] is None and len(refused["errors"]) == 1, refused
        assert refused["errors"][0]["extensions"]["code"] == "BAD_REQUEST"
        assert "ENGRAM_MAX_ANSWER_BYTES" in refused["errors"][0]["message"]


@pytest.fixture
def budgeted(state: AppState, admin: Caller) -> Callable[[str], Awaitable[Any]]:
    """Runs a query in process, as the admin, with an answer budget of 1 MiB."""
    schema = build_schema(max_answer_bytes=2**20)
    return lambda query: schema.execute(query, context_value=Context(state, admin))


async def test_a_request_reads_its_pages_two_at_a_time_and_none_once_refused(
    state, admin, budgeted, monkeypatch
):
    """Nine aliases of a page of agents were read at once, every page held (250-450 MB of
    instructions in the service) for an answer refused at its first: a request reads two pages
    at a time, each answered before the next is read, and none once its answer is refused."""
    for i in range(20):  # a page of 10: 600,000 characters
        await make_agent(state, admin, name=f"agent {i}", instructions=str(i % 10) * 60_000)
    list_actions = actions_service.list_actions
    reads = {"started": 0, "running": 0, "most": 0}

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads["started"] += 1
        reads["running"] += 1
        reads["most"] = max(reads["most"], reads["running"])
        try:
            return await list_actions(*args, **kwargs)
        finally:
            reads["running"] -= 1

    monkeypatch.setattr(actions_service, "list_actions", counted)
    pages = "{ " + " ".join(f"a{i}: actions(first: 10) {{ nodes {{ name }} }}" for i in range(9))
    answered = await budgeted(pages + " }")
    assert not answered.errors and len(answered.data) == 9
    assert reads["most"] == 2 and reads["started"] == 9
    reads.update(started=0, most=0)
    refused = await budgeted(pages.replace("name", "instructions") + " }")
    assert refused.data is None and len(refused.errors) == 1
    assert "ENGRAM_MAX_ANSWER_BYTES" in refused.errors[0].message
    # The second page passed the budget: of the others, at most the one read meanwhile began.
    assert reads["most"] <= 2 and reads["started"] <= 3, reads

    # Each agent's sessions are asked for before its instructions are counted: the budget passed
    # (at the 18th agent), those of the agents before are settled in the background, unread.
    batches: list[int] = []
    sessions = _BATCHES["Action.sessions"]

    async def batch(pool: Any, caller: Any, keys: list[Any]) -> list[Any]:
        batches.append(len(keys))
        return await sessions(pool, caller, keys)

    monkeypatch.setitem(_BATCHES, "Action.sessions", batch)
    nested = "{ actions(first: 20) { nodes { sessions(first: 1) { nodes { sessionId } } %s } } }"
    assert not (await budgeted(nested % "name")).errors and batches == [20]
    batches.clear()
    refused = await budgeted(nested % "instructions")
    assert refused.data is None and "ENGRAM_MAX_ANSWER_BYTES" in refused.errors[0].message
    for _ in range(200):  # the loop runs what was settled in the background
        await asyncio.sleep(0)
    assert batches == []


@pytest.mark.settings(body_timeout_seconds=0.5)
async def test_a_body_that_does_not_arrive_in_time_is_refused_and_its_buffer_let_go(
    base_url, state, admin
):
    """A client that sent its headers and most of its body, and never the rest, held that
    buffer (up to ENGRAM_MAX_BODY_BYTES, before any token was checked on /graphql) for as long
    as it kept the connection open: any number of them held any amount of memory. A body is
    read within ENGRAM_BODY_TIMEOUT_SECONDS, else answered 408 and the connection closed at
    once (it was kept for the server's keep-alive time, 5 s, its unread rest to be read as the
    next request)."""
    agent = await make_agent(state, admin)
    token = await token_for(state, admin, "slow", allow(["INSERT"], EXECUTION_DOCUMENT))
    host, port = base_url.removeprefix("http://").split(":")
    for path, headers in (
        ("/graphql", ""),  # no token: the body is read first
        (
            f"/mcp/{agent.action_id}?session=s1",
            f"authorization: Bearer {token}\r\naccept: application/json, text/event-stream\r\n",
        ),
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n{headers}"
            "content-length: 100000\r\n\r\n".encode()
            + b'{"query": "{ vie'
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 3)  # read() returns once closed
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert b"\r\nconnection: close" in head.lower(), answer
        assert b"ENGRAM_BODY_TIMEOUT_SECONDS" in body and b"BAD_REQUEST" in body, answer
    # Counted under its error code, as the README says of engram_requests_total, not its status.
    watcher = await token_for(
        state, admin, "watcher", allow(["SELECT"], "financial.Deployment.metrics")
    )
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        metrics = (await http.get("/metrics", headers={"Authorization": f"Bearer {watcher}"})).text
    assert 'engram_requests_total{code="BAD_REQUEST",operation="-"} 1.0' in metrics, metrics
    assert "HTTP_408" not in metrics


@pytest.mark.parametrize(
    "body",
    ["", "{ a }", "\n", "\r\n", "\r", "a\r\nb\nc\rd\r\n\r\ne", "\n\n" + "x" * 50 + "\r\n\ry"],
)
def test_an_indexed_source_places_each_position_as_graphql_core_does(body):
    """IndexedSource's bisection against graphql-core's scan, at every position (line breaks
    of one and two characters, consecutive, first and last)."""
    plain, indexed = Source(body), IndexedSource(body)
    for position in range(len(body) + 2):
        assert indexed.get_location(position) == plain.get_location(position), position


async def test_many_field_errors_after_a_long_text_do_not_hold_the_event_loop(
    base_url, state, admin, gql
):
    """Seed 64 of bench/fuzz_graphql.py: `nodes` of 1,002 IDs in 111 KB of text, each agent's
    records asked for with `first: 0`, took 1.3 to 2.8 s. graphql-core placed each field
    error in the text by scanning it from its start (twice an error), to its end when it holds
    no line break past the error: 1,000 such errors after a comment of 900 KB held the event
    loop 21 s, and /healthz waited as long. The text's line breaks are now found once."""
    agent = await make_agent(state, admin)
    a = str(agent.action_id)
    node = (await gql(admin, "query($a: UUID!) { action(actionId: $a) { id } }", a=a)).ok()
    token = await token_for(state, admin, "reader", allow(["SELECT"], "financial.*"))
    field = "memories(first: 0) { __typename }"
    query = (
        "#" + "x" * 900_000 + "\r\n"  # a comment: no token, one line
        + "query { nodes(ids: " + json.dumps([node["action"]["id"]] * 1000) + ") "
        + "{ ... on Action { " + field + " } } }"
    )  # fmt: skip
    column = query.index(field) - (query.index("\r\n") + 2) + 1  # on the second line
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        waits: list[float] = []

        async def ping() -> None:
            while True:
                started = time.monotonic()
                assert (await http.get("/healthz")).status_code == 200
                waits.append(time.monotonic() - started)
                await asyncio.sleep(0.05)

        pinging = asyncio.create_task(ping())
        await asyncio.sleep(0.2)
        started = time.monotonic()
        answer = await http.post(
            "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {token}"}
        )
        took = time.monotonic() - started
        await asyncio.sleep(0.2)
        pinging.cancel()
    errors = answer.json()["errors"]
    assert len(errors) == 1000
    assert {e["extensions"]["code"] for e in errors} == {"BAD_REQUEST"}
    assert {e["message"] for e in errors} == {"`first` must be from 1 to 1000, got 0"}
    assert all(e["locations"] == [{"line": 2, "column": column}] for e in errors), errors[0]
    # 0.7 s here against 21.9 s before, with /healthz waiting 0.3 s against 21.4 s: bounds
    # far from both, for a shared machine.
    assert took < 8, took
    assert max(waits) < 5, waits
