"""Twin accounts in real turns: an agent of account A copied into account B (`engram import
--account`) keeps its action, session, execution and record IDs, and B's copy then runs turns
through GraphQL with the scripted model. Whatever A wrote after the copy (turns, history,
records, running summaries, a preview deletion, more of a shared execution's transcript, a
new version of the agent) is
A's alone: B's turns neither show it to B's model nor change it, through the agent's own
tools, recall, its context window, a retry and a replay of a shared execution, and eraseSession.
Only each statement's account filter holds this (test_tenant_twins.py holds the operator's
reads and writes).

One world per module (a worker's share of its tests): each test changes only B's rows it
names, and asserts nothing another test's turns change."""

import io
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest
from factories import allow, caller, full_memory, import_into, make_account, make_agent
from helpers import GQL, database_copy, db_settings, running_state
from openai_server import OpenAIServer
from runtime_support import (
    EXECUTE,
    chat,
    history_of,
    memory,
    recalls,
    run,
    scripted_model,
    tool_runs,
)

from app.auth.caller import Caller
from app.executions import summary_store
from app.state import AppState
from app.transfer.service import export_action

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")
HARNESS = {**full_memory(), "history": {"index": "messages"}}
# Every word A wrote after the copy holds this; none of B's does.
SECRET = "qx"


@dataclass
class World:
    state: AppState
    gql: GQL
    model: OpenAIServer
    a: Caller
    b: Caller
    action_id: str
    records: dict[str, str]  # the shared records by name (alpha...foxtrot), both accounts'
    executions: dict[str, str]  # the shared turns by session (s1...s4), both accounts'
    secret: str  # A's agent-scope record written after the copy
    session_note: str  # A's session-scope record of s2 written after the copy
    secret_event: str  # an event A's history of s1 kept after the copy


async def _turn(
    w: "World | Any", who: Caller, action_id: str, message: str, *calls: tuple[str, Any], **kw: Any
) -> dict[str, Any]:
    if calls:
        w.model.call_tools(*calls)
    w.model.say(kw.pop("answer", "Done."))
    executed = await run(w.gql, who, action_id, message, **kw)
    assert executed["status"] == "SUCCEEDED", executed["error"]
    return executed


def _added(executed: dict[str, Any]) -> list[str]:
    return [r["id"] for t in tool_runs(executed, "add_memory") for r in t["output"]["memories"]]


def _fact(summary: str, **more: Any) -> tuple[str, dict[str, Any]]:
    return ("add_memory", {"summary": summary, "kind": "fact", "scope": "agent", **more})


async def _build(state: AppState, model: OpenAIServer) -> World:
    gql = GQL(state)
    a = caller(await make_account(state, "A"), EVERYTHING, principal="alice")
    b = caller(await make_account(state, "B"), EVERYTHING, principal="bob")
    agent = await make_agent(state, a, harness=HARNESS)
    action = str(agent.action_id)
    w: Any = World(state, gql, model, a, b, action, {}, {}, "", "", "")

    # Before the copy: a turn in each of four sessions, each writing agent-scope records.
    names = {"s1": ["alpha", "bravo", "charlie"], "s2": ["delta"], "s3": ["echo"], "s4": ["fox"]}
    for session, facts in names.items():
        calls = [_fact(f"Shared fact {name} of the ferry timetable") for name in facts]
        executed = await _turn(w, a, action, f"Note the {session} facts", *calls, session=session)
        w.executions[session] = executed["executionId"]
        w.records.update(zip(facts, _added(executed), strict=True))

    out = io.StringIO()
    await export_action(state.pool, account_id=a.account_id, action_id=agent.action_id, out=out)
    # A's copy of s1's first turn, changed as no write does (its turn number): a statement that
    # read A's row for B's would show it (the replay's bound, below). Changed before the import
    # writes B's rows, so that A's row comes first in the table.
    await state.pool.execute(
        "UPDATE executions SET turn = 99 WHERE account_id = $1 AND execution_id = $2",
        a.account_id,
        UUID(w.executions["s1"]),
    )

    # A's next version of the agent, saved before B's copy is written too.
    instructions = f"You are A's agent {SECRET}5518."
    saved = await gql(
        a, UPDATE, a=action, i={"name": "support", "instructions": instructions, "harness": HARNESS}
    )
    assert saved.ok()["updateAction"]["version"] == 2

    await import_into(state, b.account_id, out.getvalue())

    # After the copy, A alone: a preview turn deleting echo (s3)...
    await _turn(
        w,
        a,
        action,
        "Forget echo",
        ("delete_memory", {"id": w.records["echo"]}),
        session="s3",
        preview=True,
    )
    # ...a turn of s1 writing a record, kept in its history...
    executed = await _turn(
        w,
        a,
        action,
        f"My words {SECRET}5512 are A's",
        _fact(f"Zanzibar invoice {SECRET}7781 is A's"),
        answer=f"A's reply {SECRET}5513",
        session="s1",
    )
    (w.secret,) = _added(executed)
    kept = await history_of(gql, a, action, "s1")
    w.secret_event = next(e["eventId"] for e in kept if f"{SECRET}5512" in e["text"])
    # ...a turn of s2 writing a session-scope record...
    executed = await _turn(
        w,
        a,
        action,
        f"My s2 words {SECRET}5516",
        _fact(f"Zanzibar note {SECRET}7782", scope="session"),
        session="s2",
    )
    (w.session_note,) = _added(executed)
    # ...A's copy of bravo deleted...
    deleted = await gql(
        a,
        "mutation($a: UUID!, $id: UUID!) { deleteAgentMemory(actionId: $a, id: $id) { status } }",
        a=action,
        id=w.records["bravo"],
    )
    assert deleted.ok()["deleteAgentMemory"]["status"] == "DELETED"
    async with state.pool.acquire() as conn:
        # ...a running summary of s2 (as a turn whose context overflowed saves one)...
        await _save_summary(conn, a, agent.action_id, "s2", f"A's summary {SECRET}5514", 1)
        # ...and a tool call more in its copy of s1's first turn's transcript.
        e1 = UUID(w.executions["s1"])
        sequence = await conn.fetchval(
            "SELECT max(sequence) + 1 FROM transcript_events"
            " WHERE account_id = $1 AND execution_id = $2",
            a.account_id,
            e1,
        )
        call = {"id": "call-a", "name": "search_memory", "arguments": f"{SECRET}5515"}
        await conn.executemany(
            "INSERT INTO transcript_events (account_id, action_id, execution_id, sequence,"
            " invocation_number, type, data) VALUES ($1, $2, $3, $4, 1, $5, $6)",
            [
                (
                    a.account_id,
                    agent.action_id,
                    e1,
                    sequence,
                    "model.call",
                    {"purpose": "turn", "content": None, "toolCalls": [call]},
                ),
                (
                    a.account_id,
                    agent.action_id,
                    e1,
                    sequence + 1,
                    "tool.execution",
                    {
                        "name": "search_memory",
                        "callId": "call-a",
                        "input": {},
                        "output": {"records": f"{SECRET}5517"},
                    },
                ),
            ],
        )
        # s4's turn FAILED in both accounts (as no turn that wrote a record is; a stand-in for
        # a failed turn both hold): A's after a second attempt, whose events B's copy lacks.
        e4 = UUID(w.executions["s4"])
        await conn.execute(
            "UPDATE executions SET status = 'FAILED', error = 'model failed'"
            " WHERE execution_id = $1",
            e4,
        )
        await conn.execute(
            "UPDATE executions SET invocation_number = 2 WHERE account_id = $1"
            " AND execution_id = $2",
            a.account_id,
            e4,
        )
        sequence = await conn.fetchval(
            "SELECT max(sequence) + 1 FROM transcript_events"
            " WHERE account_id = $1 AND execution_id = $2",
            a.account_id,
            e4,
        )
        await conn.executemany(
            "INSERT INTO transcript_events (account_id, action_id, execution_id, sequence,"
            " invocation_number, type, data) VALUES ($1, $2, $3, $4, 2, 'turn.input', $5)",
            [
                (a.account_id, agent.action_id, e4, sequence + n, {"attempt": f"{SECRET}{n}"})
                for n in range(5)
            ],
        )
        # B's own running summary of s3.
        await _save_summary(conn, b, agent.action_id, "s3", "B's own summary of s3", 2)
    return w


async def _save_summary(
    conn: Any, who: Caller, action_id: UUID, session: str, text: str, through: int
) -> None:
    execution = await conn.fetchval(
        "SELECT execution_id FROM executions WHERE account_id = $1 AND session_id = $2 LIMIT 1",
        who.account_id,
        session,
    )
    assert await summary_store.save_summary(
        conn,
        account_id=who.account_id,
        action_id=action_id,
        session_id=session,
        preview=False,
        summary=text,
        through_turn=through,
        through_message=2,
        tokens=10,
        execution_id=execution,
        base_version=None,
    )


@pytest.fixture(scope="module")
async def world(pg_server, template_db, embedder) -> AsyncIterator[World]:
    name = f"engram_twin_turns_{os.getpid()}"
    with scripted_model() as model:
        async with database_copy(pg_server, template_db, name) as url:
            settings = db_settings(url, model_base_url=model.url, model_max_retries=0)
            async with running_state(settings, url, embedder, model=True) as state:
                yield await _build(state, model)


def _requests_since(w: World, before: int) -> str:
    """Every chat request (the turn's, its recall's memory blocks, the review's) since."""
    return json.dumps([r.body for r in chat(w.model, None)[before:]])


def _search_history(ids: Any = None, query: str | None = None) -> tuple[str, dict[str, Any]]:
    return ("search_history", {"ids": ids} if ids is not None else {"query": query})


async def test_b_turn_context_shows_nothing_a_wrote_after_the_copy(world: World) -> None:
    """B's turns of s1 and s2: the window's earlier turns and running summary
    (`summary_and_turns`), their tool calls (each `Turn`'s `calls`, of the shared first turn
    too) and recall are B's alone."""
    w = world
    before = len(chat(w.model, None))
    s1 = await _turn(w, w.b, w.action_id, "What about the Zanzibar invoice and fact bravo?")
    await _turn(w, w.b, w.action_id, "What did we note in s2?", session="s2")
    sent = _requests_since(w, before)
    assert SECRET not in sent, sent
    # What B's model reads of s1's first turn, from B's copy of its transcript.
    assert "Note the s1 facts" in sent and "Shared fact bravo" in sent
    recalled = [(r["id"], r["version"]) for c in recalls(s1) for r in c["output"]["records"]]
    assert (w.records["bravo"], 1) in recalled
    assert sorted(recalled).count((w.records["bravo"], 1)) == len(recalls(s1))
    assert all(r == (w.records["bravo"], 1) or r[0] != w.records["bravo"] for r in recalled)
    assert w.secret not in str(recalled)


async def test_b_agent_tools_neither_find_nor_change_a_records_or_history(world: World) -> None:
    """search_history by query and by ID, read_memory, search_memory by ID and delete_memory,
    naming what A wrote after the copy, in a turn of B's copy of s1."""
    w = world
    executed = await _turn(
        w,
        w.b,
        w.action_id,
        "Look things up",
        _search_history(query=f"My words {SECRET}5512 are A's"),
        _search_history(ids=[w.secret_event]),
        ("read_memory", {"id": w.secret}),
        ("search_memory", {"ids": [w.secret, w.records["alpha"], w.records["bravo"]]}),
        ("delete_memory", {"id": w.secret}),
        ("read_memory", {"id": w.records["bravo"]}),
    )
    by_query, by_id = tool_runs(executed, "search_history")
    assert SECRET not in json.dumps(by_query["output"]), by_query
    assert by_id["output"]["events"] == [], by_id
    read_secret, read_bravo = tool_runs(executed, "read_memory")
    assert "no memory record" in read_secret["error"], read_secret
    # B's bravo as B holds it: A deleted its own copy.
    (bravo,) = read_bravo["output"]["sources"]
    assert (bravo["id"], bravo["version"], bravo.get("status", "ACTIVE")) == (
        w.records["bravo"],
        1,
        "ACTIVE",
    )
    (searched,) = [t for t in tool_runs(executed, "search_memory") if not t["input"].get("recall")]
    found = sorted((r["id"], r["version"]) for r in searched["output"]["records"])
    assert found == sorted([(w.records["alpha"], 1), (w.records["bravo"], 1)]), found
    (refused,) = tool_runs(executed, "delete_memory")
    assert "error" in refused, refused
    secret = await memory(w.gql, w.a, w.action_id, w.secret)
    assert secret is not None and (secret["status"], secret["version"]) == ("ACTIVE", 1)


async def test_b_preview_turn_sees_its_records_despite_a_preview_deletion(world: World) -> None:
    """A preview turn of A deleted echo in s3 after the copy; B's preview turn of s3 still
    reads, finds and may delete B's echo (`get_shadow`, the shadow in `visible`), and starts
    from B's own live summary, no preview turn of B's being in it (`preview_turn_through`)."""
    w = world
    echo = w.records["echo"]
    before = len(chat(w.model, None))
    executed = await _turn(
        w,
        w.b,
        w.action_id,
        "Tell me the echo fact",
        ("read_memory", {"id": echo}),
        ("search_memory", {"query": "echo ferry timetable"}),
        ("delete_memory", {"id": echo}),
        session="s3",
        preview=True,
    )
    sent = _requests_since(w, before)
    assert "B's own summary of s3" in sent and SECRET not in sent
    (read,) = tool_runs(executed, "read_memory")
    assert read["output"]["sources"][0].get("status", "ACTIVE") == "ACTIVE", read
    (searched,) = [t for t in tool_runs(executed, "search_memory") if not t["input"].get("recall")]
    assert echo in [r["id"] for r in searched["output"]["records"]], searched
    (deleted,) = tool_runs(executed, "delete_memory")
    assert "error" not in deleted, deleted


EXECUTION = """query($e: UUID!) { execution(executionId: $e) {
  status invocationNumber transcript(first: 500) { nodes { sequence invocationNumber } } } }"""


async def test_b_retry_of_a_shared_failed_turn_leaves_a_copy_as_it_was(world: World) -> None:
    """Both accounts hold s4's turn FAILED, A's after a second attempt: B's retry restarts B's
    (`restart_execution`) as its second invocation, its events numbered after B's own
    (`next_sequence`), and A's stays FAILED at its second."""
    w = world
    e4 = w.executions["s4"]
    ours = (await w.gql(w.b, EXECUTION, e=e4)).ok()["execution"]
    last = max(n["sequence"] for n in ours["transcript"]["nodes"])
    await _turn(w, w.b, w.action_id, None, session="s4", execution_id=e4)
    retried = (await w.gql(w.b, EXECUTION, e=e4)).ok()["execution"]
    assert (retried["status"], retried["invocationNumber"]) == ("SUCCEEDED", 2)
    second = [n["sequence"] for n in retried["transcript"]["nodes"] if n["invocationNumber"] == 2]
    assert min(second) == last + 1, (last, second)
    theirs = (await w.gql(w.a, EXECUTION, e=e4)).ok()["execution"]
    assert (theirs["status"], theirs["invocationNumber"]) == ("FAILED", 2)


async def test_b_replay_of_a_shared_turn_reads_b_bound(world: World) -> None:
    """B replays s1's first turn, whose copy in A reads as a later turn: the replay's bound is
    B's copy's (`replayed_turn`), before turn 1, so it finds none of B's later turns' words,
    and neither does a replay of that replay."""
    w = world
    await _turn(w, w.b, w.action_id, "Remember the bluefin ferry words", session="s1")
    original = w.executions["s1"]
    for _ in range(2):
        w.model.call_tools(_search_history(query="bluefin ferry words"))
        w.model.say("Replayed.")
        replay = (
            await w.gql(w.b, EXECUTE, input={"actionId": w.action_id, "replayOf": original})
        ).ok()["executeAction"]
        assert replay["status"] == "SUCCEEDED", replay["error"]
        (searching,) = tool_runs(replay, "search_history")
        assert searching["output"]["events"] == [], searching
        original = replay["executionId"]


ERASE = """mutation($a: UUID!, $s: String!) {
  eraseSession(actionId: $a, sessionId: $s) { liveMemoryIds } }"""


async def test_b_erasure_of_s2_leaves_a_summary_and_lists_only_b_records(world: World) -> None:
    """B erases s2: it lists B's live records of the session, not A's session-scope one
    (`live_memories`), and removes B's summaries, not A's (`erase_summaries`)."""
    w = world
    erased = (await w.gql(w.b, ERASE, a=w.action_id, s="s2")).ok()["eraseSession"]
    assert erased["liveMemoryIds"] == [w.records["delta"]], erased
    kept = await w.state.pool.fetchval(
        "SELECT summary FROM session_summaries WHERE account_id = $1 AND session_id = 's2'",
        w.a.account_id,
    )
    assert kept == f"A's summary {SECRET}5514"


UPDATE = """mutation($a: UUID!, $i: ActionInput!) {
  updateAction(actionId: $a, input: $i) { version name } }"""
AGENT = """query($a: UUID!) { action(actionId: $a) { version name } }"""


async def test_b_update_of_its_twin_agent_leaves_a_agent_as_it_was(world: World) -> None:
    """B saves a new version of its copy of the agent (`bump_version`): A's stays at its
    version. (B's turns run B's version, not A's second, which A saved after the copy: the
    first test's `get_version`.) (Clients and tokens do not travel with an
    import: only an agent's rows, sessions, executions and records share IDs.)"""
    w = world
    before = (await w.gql(w.a, AGENT, a=w.action_id)).ok()["action"]
    theirs = (await w.gql(w.b, AGENT, a=w.action_id)).ok()["action"]
    saved = await w.gql(w.b, UPDATE, a=w.action_id, i={"name": "B's support", "harness": HARNESS})
    assert saved.ok()["updateAction"] == {"version": theirs["version"] + 1, "name": "B's support"}
    assert (await w.gql(w.a, AGENT, a=w.action_id)).ok()["action"] == before
