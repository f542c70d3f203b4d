"""Issue 11, items 4 and 7: no turn is left RUNNING, no staged row is left behind, and a
retry after a lost answer does not write twice.

- What a model or a tool produces is stored whatever characters it holds (NUL, lone
  surrogates): the turn ends SUCCEEDED or FAILED with its transcript, never INTERNAL.
- A failed turn keeps a transcript even when writing the whole of it fails.
- The turns of a dead process are failed by the background sweep of any live process
  (app/runtime/liveness.py), without another turn starting; they can then be retried.
- Staged rows that can never commit (a dead turn's, an operator write that died between
  staging and committing) are swept.
- Idempotency keys on addAgentMemory, deleteAgentMemory and executeAction.
"""

import asyncio
import contextlib
import itertools
import os
import re
import signal
import time
import types
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from factories import allow, caller, make_agent_id, make_running_turn, memory_harness, token_for
from helpers import GQL, eventually
from openai_server import OpenAIServer
from runtime_support import (
    EXECUTE,
    RUNNER_POLICIES,
    candidates,
    chat,
    decide,
    events,
    memories,
    run,
    tool_runs,
)

from app.actions.service import load_action
from app.auth.caller import Caller
from app.db.embedded import EmbeddedPostgres
from app.executions import liveness_store, store
from app.memory.service import MemoryWork, NewMemory, Writer
from app.runtime import liveness
from app.runtime.model import ModelClient
from app.state import AppState

HEARTBEAT = 0.2
LEASE = 1.0
pytestmark = [
    pytest.mark.usefixtures("model_server"),
    pytest.mark.settings(turn_heartbeat_seconds=HEARTBEAT, turn_lease_seconds=LEASE),
]
AGENT_MEMORY = memory_harness(scope={"read": ["agent"], "write": ["agent"]})


def process(state: AppState) -> liveness.TurnLiveness:
    found = state.services.get(liveness.TURN_LIVENESS)
    assert found is not None
    return found


# Text a model or a tool produces


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
async def test_unstorable_characters_in_a_model_reply_are_replaced_not_fatal(
    gql: GQL, admin: Caller, model_server: OpenAIServer, state: AppState, bad: str
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.say(f"before{bad}after")
    executed = await run(gql, admin, action_id, "hello")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert executed["output"] == "before\ufffdafter"
    assert events(executed, "model.call")[0]["content"] == "before\ufffdafter"
    assert events(executed, "turn.output") == [{"output": "before\ufffdafter"}]
    # The session's next turn reads it back as history.
    again = await run(gql, admin, action_id, "and?")
    assert again["status"] == "SUCCEEDED", again["error"]


@pytest.mark.parametrize("escape", ["\\u0000", "\\udc00"], ids=["nul", "lone-surrogate"])
async def test_unstorable_characters_in_tool_arguments_are_replaced_not_fatal(
    gql: GQL, admin: Caller, model_server: OpenAIServer, escape: str
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    arguments = '{"summary": "Ada' + escape + 'prefers email", "kind": "fact"}'
    model_server.call_tools(("add_memory", arguments), content="noting\x00it")
    executed = await run(gql, admin, action_id, "note it")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    [added] = tool_runs(executed, "add_memory")
    assert added["input"]["summary"] == "Ada\ufffdprefers email"
    assert [m["summary"] for m in await memories(gql, admin, action_id)] == [
        "Ada\ufffdprefers email"
    ]


async def test_non_json_numbers_in_tool_arguments_are_refused_to_the_model(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.call_tools(("search_memory", '{"query": "email", "limit": NaN}'))
    executed = await run(gql, admin, action_id, "look")
    assert executed["status"] == "SUCCEEDED", executed["error"]
    [refused] = tool_runs(executed, "search_memory")
    assert "NaN is not a JSON value" in refused["error"]


async def test_a_failed_turn_keeps_a_transcript_even_when_writing_it_fails_once(
    gql: GQL, admin: Caller, model_server: OpenAIServer, state: AppState
) -> None:
    """The database refuses the turn's events (here a trigger does, as it could refuse a value
    it cannot store): the turn still ends FAILED, with its failure in its transcript."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    async with state.pool.acquire() as conn:
        await conn.execute("""
            CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.data::text LIKE '%POISON%' THEN RAISE EXCEPTION 'refused'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_poison BEFORE INSERT ON transcript_events
                FOR EACH ROW EXECUTE FUNCTION refuse_poison();
        """)
    model_server.say("POISON")
    executed = await run(gql, admin, action_id, "hello")
    assert executed["status"] == "FAILED"
    assert "internal error" in executed["error"]
    [failed] = [e for e in executed["transcript"]["nodes"]]
    assert failed["type"] == "turn.failed" and failed["data"]["error"] == executed["error"]
    assert re.fullmatch(
        r"the turn's last \d+ transcript events could not be stored \(RaiseError\)",
        failed["data"]["transcriptLost"],
    )

    async with state.pool.acquire() as conn:
        await conn.execute("DROP TRIGGER refuse_poison ON transcript_events")
    retried = await run(gql, admin, action_id, "hello", execution_id=executed["executionId"])
    assert (retried["status"], retried["invocationNumber"]) == ("SUCCEEDED", 2)


# Turns of a dead process


async def _status(state: AppState, execution_id: uuid.UUID) -> str:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(
            "SELECT status FROM executions WHERE execution_id = $1", execution_id
        )


async def _staged(state: AppState, execution_id: uuid.UUID) -> int:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE pending_execution = $1", execution_id
        )


async def test_a_process_is_judged_by_the_lease_it_recorded(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    """Processes sharing a database may run with different leases: one silent for two minutes
    under its own ten-minute lease is alive, whatever the sweeping process's lease (a second
    here); one that recorded none (a release before migration 0028) is judged by the
    sweeper's."""
    action_id = await make_agent_id(gql.state, admin)
    patient, legacy = uuid.uuid4(), uuid.uuid4()
    async with state.pool.acquire() as conn:
        await conn.executemany(
            "INSERT INTO service_processes (boot_id, host, pid, heartbeat, lease_seconds) "
            "VALUES ($1, 'elsewhere', 1, now() - interval '120 seconds', $2)",
            [(patient, 600.0), (legacy, None)],
        )
    waiting = await make_running_turn(state, admin, action_id=action_id, boot_id=patient)
    orphan = await make_running_turn(state, admin, action_id=action_id, boot_id=legacy)
    sweeper = process(state)
    assert sweeper.lease_seconds < 120
    await sweeper.sweep()
    assert await _status(state, waiting) == "RUNNING" and await _staged(state, waiting) == 1
    assert await _status(state, orphan) == "FAILED"
    async with state.pool.acquire() as conn:
        kept = await conn.fetch("SELECT boot_id, lease_seconds FROM service_processes")
    leases = {r["boot_id"]: r["lease_seconds"] for r in kept}
    assert leases[patient] == 600 and leases[sweeper.boot_id] == sweeper.lease_seconds


async def test_turns_of_a_dead_process_are_failed_by_the_background_sweep_and_retried(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    dead, alive = uuid.uuid4(), uuid.uuid4()
    async with state.pool.acquire() as conn:
        # Another process sharing the database: one killed an hour ago, one alive.
        await conn.executemany(
            "INSERT INTO service_processes (boot_id, host, pid, heartbeat) "
            "VALUES ($1, 'elsewhere', 1, now() + make_interval(secs => $2))",
            [(dead, -3600.0), (alive, 3600.0)],
        )
    crashed = await make_running_turn(state, admin, action_id=action_id, boot_id=dead)
    running = await make_running_turn(state, admin, action_id=action_id, boot_id=alive)

    async def swept() -> bool:
        return await _status(state, crashed) == "FAILED" and await _staged(state, crashed) == 0

    async def forgotten() -> bool:
        async with state.pool.acquire() as conn:
            processes = await conn.fetch("SELECT boot_id FROM service_processes")
        return {p["boot_id"] for p in processes} == {alive, process(state).boot_id}

    await eventually(swept, "the sweep")  # no turn started: the background sweep did it
    await eventually(forgotten, "the sweep")  # and the dead process is forgotten, the live one kept
    assert chat(model_server) == []
    async with state.pool.acquire() as conn:
        error = await conn.fetchval("SELECT error FROM executions WHERE execution_id = $1", crashed)
    assert "its process ended" in error
    # The live process's turn and staged row are left alone.
    assert await _status(state, running) == "RUNNING" and await _staged(state, running) == 1

    retried = await run(gql, admin, action_id, None, execution_id=str(crashed))
    assert (retried["status"], retried["invocationNumber"]) == ("SUCCEEDED", 2)


async def test_a_process_ends_its_own_turns_it_no_longer_runs_and_spares_live_ones(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """A turn whose end could not be recorded (the database was away when it failed) is failed
    by its own process's sweep; a live turn longer than the lease is not."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    me = process(state)
    lost = await make_running_turn(state, admin, action_id=action_id, boot_id=me.boot_id)
    old = await make_running_turn(state, admin, action_id=action_id)  # before boot IDs

    async def swept() -> bool:
        return await _status(state, lost) == "FAILED"

    await eventually(swept, "the sweep")
    async with state.pool.acquire() as conn:
        error = await conn.fetchval("SELECT error FROM executions WHERE execution_id = $1", lost)
    assert "its end could not be recorded" in error
    assert await _status(state, old) == "RUNNING"  # judged by the old, longer rule
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE executions SET modified = now() - interval '1 day' WHERE execution_id = $1",
            old,
        )

    async def old_swept() -> bool:
        return await _status(state, old) == "FAILED"

    await eventually(old_swept, "the sweep")

    model_server.say("slow answer", delay=3 * LEASE)
    slow = await run(gql, admin, action_id, "take your time")
    assert slow["status"] == "SUCCEEDED", slow["error"]


@pytest.mark.parametrize("kind", ["MCP", "INGEST"])
async def test_a_call_or_an_ingest_a_sweep_ends_is_told_to_be_sent_again(
    gql: GQL, admin: Caller, state: AppState, kind: str
) -> None:
    """No executionId retries an MCP tool call or a conversation handed in (executeAction
    retries turns alone): one the sweep ends says to send it again, as its own failure would,
    and names what it was (not "the turn"), whether its process died, its process could not
    record its end, or it went stale (a turn of its agent starting); a turn still says to
    retry the execution."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    dead = uuid.uuid4()
    async with state.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO service_processes (boot_id, host, pid, heartbeat) "
            "VALUES ($1, 'elsewhere', 1, now() - interval '1 hour')",
            dead,
        )
    me = process(state)
    await me.aclose()  # its background sweep: this test sweeps when it says
    running = {
        "died": await make_running_turn(state, admin, action_id=action_id, boot_id=dead, kind=kind),
        "unrecorded": await make_running_turn(
            state, admin, action_id=action_id, boot_id=me.boot_id, kind=kind
        ),
        "turn": await make_running_turn(state, admin, action_id=action_id, boot_id=dead),
    }
    await me.sweep()
    stale = await make_running_turn(
        state, admin, action_id=action_id, idle=timedelta(days=1), kind=kind
    )
    async with state.pool.acquire() as conn:
        await liveness_store.fail_stale_turns(conn, admin.account_id, uuid.UUID(action_id), 3600)
        errors = {
            what: await conn.fetchval(
                "SELECT error FROM executions WHERE execution_id = $1", execution_id
            )
            for what, execution_id in {**running, "stale": stale}.items()
        }
    named = {"MCP": "the tool call", "INGEST": "the conversation"}[kind]
    sent_again = f"{named} stopped without finishing (its process ended); send it again"
    assert errors == {
        "died": sent_again,
        "unrecorded": f"{named} failed but its end could not be recorded (the database was "
        "unreachable); send it again",
        "turn": liveness_store.DEAD_PROCESS_ERROR,
        "stale": sent_again,
    }


async def test_an_execution_of_a_kind_without_words_of_its_own_ends_with_an_error(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    """The sweeps' words are by kind; one they have none for (a later release's kind met by
    this release's processes during a rolling upgrade; here ERASE, which no process leaves
    running) still ends FAILED with an error, not null: the words for an execution, told to
    send it again."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    dead = uuid.uuid4()
    async with state.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO service_processes (boot_id, host, pid, heartbeat) "
            "VALUES ($1, 'elsewhere', 1, now() - interval '1 hour')",
            dead,
        )
    me = process(state)
    await me.aclose()  # its background sweep: this test sweeps when it says
    running = {
        "died": await make_running_turn(
            state, admin, action_id=action_id, boot_id=dead, kind="ERASE"
        ),
        "unrecorded": await make_running_turn(
            state, admin, action_id=action_id, boot_id=me.boot_id, kind="ERASE"
        ),
    }
    await me.sweep()
    stale = await make_running_turn(
        state, admin, action_id=action_id, idle=timedelta(days=1), kind="ERASE"
    )
    async with state.pool.acquire() as conn:
        await liveness_store.fail_stale_turns(conn, admin.account_id, uuid.UUID(action_id), 3600)
        ended = {
            what: tuple(
                await conn.fetchrow(
                    "SELECT status, error FROM executions WHERE execution_id = $1", execution_id
                )
            )
            for what, execution_id in {**running, "stale": stale}.items()
        }
    died = "the execution stopped without finishing (its process ended); send it again"
    assert ended == {
        "died": ("FAILED", died),
        "unrecorded": (
            "FAILED",
            "the execution failed but its end could not be recorded (the database was "
            "unreachable); send it again",
        ),
        "stale": ("FAILED", died),
    }


async def test_processes_sweeping_one_database_at_once_fail_each_dead_turn_once(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    await process(state).aclose()  # this test's processes are the only ones sweeping
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    dead = [
        await make_running_turn(state, admin, action_id=action_id, boot_id=uuid.uuid4())
        for _ in range(6)
    ]
    others = [liveness.TurnLiveness(state.pool, state.settings) for _ in range(4)]
    swept = await asyncio.gather(*(p.sweep() for p in others))
    failed = [e for s in swept for e in s.failed]
    assert sorted(failed) == sorted(dead)  # each once, whichever process got it
    assert sum(s.staged_dropped for s in swept) == len(dead)
    for other in others:
        await other.aclose()


async def test_a_process_registers_at_start_and_leaves_at_stop(state: AppState) -> None:
    other = liveness.TurnLiveness(state.pool, state.settings)
    await other.start()
    async with state.pool.acquire() as conn:
        query = "SELECT count(*) FROM service_processes WHERE boot_id = $1"
        assert await conn.fetchval(query, other.boot_id) == 1
        await other.aclose()
        assert await conn.fetchval(query, other.boot_id) == 0


# Orphaned staged rows of operator writes


async def test_staged_rows_of_an_operator_write_that_died_are_swept(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=AGENT_MEMORY)
    async with state.pool.acquire() as conn:
        action = await load_action(conn, admin.account_id, uuid.UUID(action_id))
    assert action is not None and state.embedder is not None

    async def stage(summary: str) -> uuid.UUID:
        # What addAgentMemory stages before the transaction that commits it.
        writer = Writer(admin.account_id, action, uuid.uuid4(), 1, None, "ops", "OPERATOR", False)
        [row] = await MemoryWork(state.pool, state.embedder, writer).add(NewMemory(summary, "fact"))
        return row.memory_id

    orphan = await stage("orphaned by a crash")
    in_progress = await stage("about to commit")
    async with state.pool.acquire() as conn:
        # The orphan was staged an hour ago; the other is a write between staging and
        # committing (staged "now" for as long as this test runs), spared for the lease.
        for memory_id, age in [(orphan, 3600.0), (in_progress, -3600.0)]:
            await conn.execute(
                "UPDATE agent_memories SET created = now() - make_interval(secs => $2) "
                "WHERE memory_id = $1",
                memory_id,
                age,
            )

    async def left() -> list[uuid.UUID]:
        async with state.pool.acquire() as conn:
            return [
                r["memory_id"] for r in await conn.fetch("SELECT memory_id FROM agent_memories")
            ]

    async def swept() -> bool:
        return await left() == [in_progress]

    await eventually(swept, "the sweep")


# Idempotency keys

ADD = """
mutation($a: UUID!, $input: AgentMemoryInput!, $key: String) {
  addAgentMemory(actionId: $a, input: $input, idempotencyKey: $key) {
    memoryId version summary execution { executionId }
  }
}"""
DELETE = """
mutation($a: UUID!, $id: UUID!, $key: String) {
  deleteAgentMemory(actionId: $a, id: $id, idempotencyKey: $key) { memoryId version status }
}"""


async def _count(state: AppState, sql: str) -> int:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(sql)


async def test_add_agent_memory_with_a_key_writes_once(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=AGENT_MEMORY)
    fact = {"summary": "Ada prefers email", "kind": "fact"}

    first = (await gql(admin, ADD, a=action_id, input=fact, key="k1")).ok()["addAgentMemory"]
    again = (await gql(admin, ADD, a=action_id, input=fact, key="k1")).ok()["addAgentMemory"]
    assert again == first
    assert await _count(state, "SELECT count(*) FROM agent_memories") == 1
    assert await _count(state, "SELECT count(*) FROM executions") == 1

    other = await gql(admin, ADD, a=action_id, input={**fact, "summary": "Bo"}, key="k1")
    assert other.codes == ["CONFLICT"] and "'k1'" in other.errors[0]["message"]

    # Another principal's key of the same name is its own.
    ops = Caller(admin.account_id, "ops", admin.policies)
    theirs = (await gql(ops, ADD, a=action_id, input=fact, key="k1")).ok()["addAgentMemory"]
    assert theirs["memoryId"] != first["memoryId"]

    # A write that failed recorded no key: the key is still free.
    refused = await gql(admin, ADD, a=action_id, input={**fact, "kind": "nope"}, key="k2")
    assert refused.codes == ["BAD_REQUEST"]
    assert (await gql(admin, ADD, a=action_id, input=fact, key="k2")).ok()

    # Concurrent duplicates: one write, one answer.
    racing = await asyncio.gather(
        *(
            gql(admin, ADD, a=action_id, input={**fact, "summary": "Race"}, key="k3")
            for _ in range(4)
        )
    )
    assert len({r.ok()["addAgentMemory"]["memoryId"] for r in racing}) == 1
    assert await _count(state, "SELECT count(*) FROM agent_memories WHERE summary = 'Race'") == 1
    assert (
        await _count(
            state, "SELECT count(*) FROM agent_memories WHERE pending_execution IS NOT NULL"
        )
        == 0
    )

    for bad_key in ["x" * 201, " ", "k\x00"]:
        bad = await gql(admin, ADD, a=action_id, input=fact, key=bad_key)
        # The request check names the variable that carried the NUL (app/graphql/inputs.py).
        named = ("idempotencyKey", "$key")
        assert bad.codes == ["BAD_REQUEST"] and any(n in bad.errors[0]["message"] for n in named)

    # Kept a day, then forgotten by the sweep: the key may then name a new write.
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE idempotency_keys SET created = now() - interval '23 hours' WHERE key = 'k2'"
        )
        await conn.execute(
            "UPDATE idempotency_keys SET created = now() - interval '25 hours' WHERE key = 'k1'"
        )

    async def forgotten() -> bool:
        return not await _count(state, "SELECT count(*) FROM idempotency_keys WHERE key = 'k1'")

    await eventually(forgotten, "the sweep")  # admin's and ops's k1
    renewed = await gql(admin, ADD, a=action_id, input={**fact, "summary": "Bo"}, key="k1")
    assert renewed.ok()["addAgentMemory"]["memoryId"] != first["memoryId"]
    kept = await gql(admin, ADD, a=action_id, input={**fact, "summary": "Bo"}, key="k2")
    assert kept.codes == ["CONFLICT"]


async def test_a_backlog_of_old_keys_is_forgotten_in_batches(
    admin: Caller, state: AppState
) -> None:
    """A backlog (the first sweep after a long stop) is deleted a batch at a time, each batch
    its own statement within the statement bound, until none is left; a recent key stays."""
    from app.idempotency import store as idempotency_store
    from app.idempotency.keys import KEEP_SECONDS

    async with state.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO idempotency_keys (account_id, principal, operation, key, request,"
            " result, created) SELECT $1, 'backlog', 'op', 'old' || i, '', '{}',"
            " now() - interval '2 days' FROM generate_series(1, 25) i",
            admin.account_id,
        )
        await conn.execute(
            "INSERT INTO idempotency_keys (account_id, principal, operation, key, request,"
            " result) VALUES ($1, 'backlog', 'op', 'new', '', '{}')",
            admin.account_id,
        )
        forgotten = await idempotency_store.forget_older_than(conn, KEEP_SECONDS, batch=10)
        left = await conn.fetch("SELECT key FROM idempotency_keys WHERE principal = 'backlog'")
    assert forgotten == 25
    assert [r["key"] for r in left] == ["new"]


async def test_a_deleted_clients_keys_go_with_it(gql: GQL, admin: Caller, state: AppState) -> None:
    """A client made again with a deleted one's principal is another client: its key of the
    same name writes anew (it answered with the deleted client's write)."""
    from app.auth import service as auth_service

    action_id = await make_agent_id(gql.state, admin, harness=AGENT_MEMORY)
    fact = {"summary": "Ada prefers email", "kind": "fact"}
    ops = Caller(admin.account_id, "ops", admin.policies)
    for _ in range(2):
        await auth_service.create_client(
            state.pool, admin, account_id=None, principal="ops", name="ops", policies=[]
        )
        assert (await gql(ops, ADD, a=action_id, input=fact, key="k1")).ok()
        await auth_service.delete_client(state.pool, admin, account_id=None, principal="ops")
    assert await _count(state, "SELECT count(*) FROM agent_memories") == 2


async def signed_in(state: AppState, admin: Caller, principal: str) -> Caller:
    """A new client that may read and write, as a request with its token authenticates."""
    from app.auth import service as auth_service

    token = await token_for(state, admin, principal, allow(["SELECT", "INSERT"], "*"))
    return await auth_service.authenticate(state.pool, f"Bearer {token}")


async def test_a_write_committing_after_its_client_was_deleted_keeps_no_key(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    """A keyed write authenticated before its client's deletion that commits after it is
    refused: nothing written, no key kept (the key was kept, and a client made again with the
    principal was answered with the deleted one's write)."""
    from app.auth import service as auth_service

    action_id = await make_agent_id(gql.state, admin, harness=AGENT_MEMORY)
    fact = {"summary": "Ada prefers email", "kind": "fact"}

    ops = await signed_in(state, admin, "ops")
    async with state.pool.acquire() as conn, conn.transaction():
        # The write waits at its execution's insert, before its key.
        await conn.execute("LOCK TABLE executions IN ACCESS EXCLUSIVE MODE")
        write = asyncio.create_task(gql(ops, ADD, a=action_id, input=fact, key="k1"))
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted"
        await eventually(lambda: _count(state, waiting), "the write waits on the lock")
        await auth_service.delete_client(state.pool, admin, account_id=None, principal="ops")
    refused = await write
    assert refused.codes == ["UNAUTHENTICATED"] and "deleted" in refused.errors[0]["message"]
    assert await _count(state, "SELECT count(*) FROM idempotency_keys") == 0
    assert await _count(state, "SELECT count(*) FROM agent_memories") == 0
    # A client made again with the principal starts with no key.
    again = (
        await gql(await signed_in(state, admin, "ops"), ADD, a=action_id, input=fact, key="k1")
    ).ok()
    assert again["addAgentMemory"]["summary"] == fact["summary"]
    assert await _count(state, "SELECT count(*) FROM agent_memories") == 1


async def test_a_duplicate_finding_the_first_writes_key_gone_is_refused(
    gql: GQL, admin: Caller, state: AppState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed write that lost to the first request with its key (a Duplicate at its commit)
    and then finds that key gone, its client deleted in between, is refused and writes
    nothing (it failed an assertion: INTERNAL)."""
    from app.auth import service as auth_service
    from app.memory import operator

    action_id = await make_agent_id(gql.state, admin, harness=AGENT_MEMORY)
    fact = {"summary": "Ada prefers email", "kind": "fact"}
    ops = await signed_in(state, admin, "ops")
    assert (await gql(ops, ADD, a=action_id, input=fact, key="k1")).ok()
    answered, looked = operator._answered, 0

    async def deleted_meanwhile(*args: Any) -> Any:
        nonlocal looked
        looked += 1
        if looked == 1:
            return None  # looked before the first write committed
        await auth_service.delete_client(state.pool, admin, account_id=None, principal="ops")
        return await answered(*args)

    monkeypatch.setattr(operator, "_answered", deleted_meanwhile)
    refused = await gql(ops, ADD, a=action_id, input=fact, key="k1")
    assert refused.codes == ["UNAUTHENTICATED"] and "deleted" in refused.errors[0]["message"]
    assert looked == 2
    assert await _count(state, "SELECT count(*) FROM agent_memories") == 1


async def test_delete_agent_memory_with_a_key_answers_the_same(
    gql: GQL, admin: Caller, state: AppState
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=AGENT_MEMORY)
    fact = {"summary": "Ada prefers email", "kind": "fact"}
    one = (await gql(admin, ADD, a=action_id, input=fact)).ok()["addAgentMemory"]["memoryId"]
    two = (await gql(admin, ADD, a=action_id, input=fact)).ok()["addAgentMemory"]["memoryId"]

    first = (await gql(admin, DELETE, a=action_id, id=one, key="d1")).ok()["deleteAgentMemory"]
    again = (await gql(admin, DELETE, a=action_id, id=one, key="d1")).ok()["deleteAgentMemory"]
    assert first == again == {"memoryId": one, "version": 2, "status": "DELETED"}
    other = await gql(admin, DELETE, a=action_id, id=two, key="d1")
    assert other.codes == ["CONFLICT"] and "'d1'" in other.errors[0]["message"]
    # Keys are per operation: an add's key of the same name is another key.
    assert (await gql(admin, ADD, a=action_id, input=fact, key="d1")).ok()

    # Concurrent duplicates: one deletion, every request answered with it.
    racing = await asyncio.gather(
        *(gql(admin, DELETE, a=action_id, id=two, key="d2") for _ in range(4))
    )
    answers = [r.ok()["deleteAgentMemory"] for r in racing]
    assert answers == [{"memoryId": two, "version": 2, "status": "DELETED"}] * 4


async def test_execute_action_with_a_key_runs_one_turn(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())

    async def execute(who: Caller, key: str, input: str = "hello") -> Any:
        request = {"actionId": action_id, "sessionId": "s1", "input": input}
        return await gql(who, EXECUTE, input={**request, "idempotencyKey": key})

    first = (await execute(admin, "t1")).ok()["executeAction"]
    again = (await execute(admin, "t1")).ok()["executeAction"]
    assert first["status"] == "SUCCEEDED" and again == first
    assert len(chat(model_server)) == 1
    other = await execute(admin, "t1", "something else")
    assert other.codes == ["CONFLICT"] and "'t1'" in other.errors[0]["message"]
    runner = caller(admin.account_id, *RUNNER_POLICIES, principal="runner")
    theirs = (await execute(runner, "t1")).ok()["executeAction"]
    assert theirs["executionId"] != first["executionId"]
    assert await _count(state, "SELECT count(*) FROM executions") == 2

    # While the keyed turn still runs, its duplicate is told so rather than run a second one.
    model_server.say("slowly", delay=1.0)
    running = asyncio.ensure_future(execute(admin, "t2"))
    await eventually(lambda: _running_count(state), "the sweep")
    duplicate = await execute(admin, "t2")
    assert duplicate.codes == ["CONFLICT"] and "still running" in duplicate.errors[0]["message"]
    assert (await running).ok()["executeAction"]["status"] == "SUCCEEDED"
    assert await _count(state, "SELECT count(*) FROM executions") == 3


async def _running_count(state: AppState) -> bool:
    return await _count(state, "SELECT count(*) FROM executions WHERE status = 'RUNNING'") > 0


def test_a_turn_without_a_boot_id_is_judged_dead_only_after_its_retries_could_have_waited() -> None:
    """The bound counts, for each model call, every attempt's timeout and the longest wait
    before each retry (a Retry-After or the backoff, both capped at 30 s)."""
    from app.config import Settings

    settings = Settings(max_model_calls_per_turn=2, model_timeout_seconds=10, model_max_retries=3)
    # 2 calls x (4 attempts x 10 s + 3 waits x 30 s) + 600 s of margin.
    assert liveness.stale_after_seconds(settings) == 2 * (4 * 10 + 3 * 30) + 600


async def test_every_model_call_of_a_turn_is_followed_by_a_sign_of_life(
    gql: GQL, admin: Caller, model_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn is judged dead by how long it has shown no sign of life (`executions.modified`,
    stale_after_seconds for a turn without a boot ID), not by how long it has run: its own
    model calls, the context summary calls and the end-of-turn review's calls (candidates, a
    malformed reply told once, the decide call), however many a turn makes, are each followed
    by a sign of life (or by the commit), so no silence holds more than one model call."""
    log: list[str] = []
    complete = ModelClient.complete
    touch, finish, commit = store.touch_execution, store.finish_execution, store.commit_turn

    async def logged_complete(self: ModelClient, *args: Any, **kwargs: Any) -> Any:
        answer = await complete(self, *args, **kwargs)
        log.append(args[3])  # the purpose
        return answer

    async def logged(name: str, write: Any, *args: Any, **kwargs: Any) -> Any:
        log.append(name)
        return await write(*args, **kwargs)

    monkeypatch.setattr(ModelClient, "complete", logged_complete)
    monkeypatch.setattr(store, "touch_execution", lambda *a, **k: logged("alive", touch, *a, **k))
    monkeypatch.setattr(store, "finish_execution", lambda *a, **k: logged("end", finish, *a, **k))
    monkeypatch.setattr(store, "commit_turn", lambda *a, **k: logged("end", commit, *a, **k))

    action_id = await make_agent_id(
        gql.state, admin, harness=memory_harness(), model={"contextTokens": 2500}
    )
    for n in range(1, 7):
        model_server.say(f"context summary {n}", purpose="context")
    candidates(model_server, {"summary": "The user's name is Ada."})
    model_server.say(f"ANSWER-1 {'answer words ' * 150}")
    assert (await run(gql, admin, action_id, f"ASK-1 {'my name is Ada ' * 100}"))["status"] == (
        "SUCCEEDED"
    )
    for n in range(2, 6):
        model_server.say("I think that is worth keeping", purpose="memory")  # malformed: told
        candidates(model_server, {"summary": "The user is called Ada"})
        decide(model_server, {"candidate": "c1", "action": "skip"})
        model_server.say(f"ANSWER-{n} {'answer words ' * 150}")
        executed = await run(gql, admin, action_id, f"ASK-{n} {'call me Ada ' * 120}")
        assert executed["status"] == "SUCCEEDED", executed["error"]

    silent, longest = 0, 0
    for entry in log:
        silent = 0 if entry in ("alive", "end") else silent + 1
        longest = max(longest, silent)
    assert longest == 1, log
    calls = [e for e in log if e not in ("alive", "end")]
    assert {"turn", "context", "memory"} <= set(calls), calls
    assert calls.count("memory") >= 5 * 2  # each review's calls, several in a turn


async def test_a_turn_slow_between_model_calls_shows_life_well_within_the_bound(
    gql: GQL,
    admin: Caller,
    model_server: OpenAIServer,
    state: AppState,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a turn does between two model calls has no bound of its own: one reply's tool
    calls (up to ENGRAM_MAX_TOOL_CALLS_PER_REPLY, each search embedding its query), the
    review's embeddings, a slow embedder or database. While it runs, its process gives it a
    sign of life whenever it has been silent for a quarter of the bound (liveness.running),
    so no silence reaches the bound: a new turn of the agent, which fails the agent's turns
    silent that long (fail_stale_turns), spares it. Here the bound is 2 s, and one reply's
    ten searches against an embedder that takes 0.4 s a request keep the turn from its next
    model call for over 4 s."""
    bound = 2.0
    monkeypatch.setattr(liveness, "stale_after_seconds", lambda settings: bound)
    signs: list[tuple[Any, float]] = []  # (execution ID, when it showed life)

    def signed(write: Any, execution_id: Any) -> Any:
        async def logged(*args: Any, **kwargs: Any) -> Any:
            done = await write(*args, **kwargs)
            if done:
                signs.append((execution_id(args, kwargs), time.monotonic()))
            return done

        return logged

    by_position, by_name = (lambda a, k: a[3]), (lambda a, k: k["execution_id"])
    for name, which in [
        ("insert_execution", by_name),
        ("touch_execution", by_position),
        ("touch_silent_execution", by_position),
        ("finish_execution", by_name),
        ("commit_turn", by_name),
    ]:
        monkeypatch.setattr(store, name, signed(getattr(store, name), which))

    assert state.embedder is not None
    embed, embedded, busy = state.embedder.embed, 0, asyncio.Event()

    async def slow_embed(texts: list[str]) -> Any:
        nonlocal embedded
        await asyncio.sleep(0.4)
        embedded += 1
        if embedded == 8:  # the recall's, then six of the searches': over 2 s of silence
            busy.set()
        return await embed(texts)

    monkeypatch.setattr(state.embedder, "embed", slow_embed)
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    searches = [("search_memory", {"query": f"topic {k}"}) for k in range(10)]
    model_server.call_tools(*searches, when="ASK-SLOW")
    model_server.say("slow done", when="ASK-SLOW")
    model_server.say("quick done", when="ASK-QUICK")

    slow = asyncio.ensure_future(run(gql, admin, action_id, "ASK-SLOW", session="s1"))
    await asyncio.wait_for(busy.wait(), 60)
    quick = await run(gql, admin, action_id, "ASK-QUICK", session="s2")
    executed = await slow
    assert quick["status"] == "SUCCEEDED", quick["error"]
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert len(tool_runs(executed, "search_memory")) == 10

    times = [when for e, when in signs if str(e) == executed["executionId"]]
    assert len(times) >= 4  # its start, its first model call, a pulse or more, its end
    longest = max(b - a for a, b in itertools.pairwise(times))
    assert longest < bound, (longest, times)


async def a_search_memory_turn(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> dict[str, Any]:
    """One turn of a new memory agent whose model calls search_memory once, then answers."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.call_tools(("search_memory", {"query": "Ada"}))
    model_server.say("done")
    return await run(gql, admin, action_id, "hello")


async def test_a_turn_whose_model_calls_keep_it_alive_costs_no_other_write(
    gql: GQL, admin: Caller, model_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's sign of life is written only for a turn silent for a quarter of the
    bound: a turn that answers within it writes exactly what it wrote before (its start, a
    sign of life after each model call, its end)."""
    log: list[str] = []
    for name in ["touch_execution", "touch_silent_execution", "finish_execution", "commit_turn"]:
        write = getattr(store, name)

        async def logged(*args: Any, write: Any = write, name: str = name, **kwargs: Any) -> Any:
            log.append(name)
            return await write(*args, **kwargs)

        monkeypatch.setattr(store, name, logged)
    executed = await a_search_memory_turn(gql, admin, model_server)
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert log == ["touch_execution", "touch_execution", "commit_turn"]  # its end


async def test_only_a_turns_start_skips_its_wal_flush(
    gql: GQL, admin: Caller, model_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's start commits without waiting for its WAL flush (its statement sets
    `synchronous_commit` off for its own transaction); its signs of life and its end wait, and
    so flush it first (a crash that loses its signs of life does not end the turn: the test
    below). Each write is run here in a transaction of its own to read the setting it leaves
    for its commit."""
    seen: list[tuple[str, str]] = []
    for name in ["insert_execution", "touch_execution", "commit_turn"]:
        write = getattr(store, name)

        async def observed(
            conn: Any, *args: Any, write: Any = write, name: str = name, **kwargs: Any
        ) -> Any:
            async with conn.transaction():
                result = await write(conn, *args, **kwargs)
                seen.append((name, await conn.fetchval("SHOW synchronous_commit")))
            return result

        monkeypatch.setattr(store, name, observed)
    executed = await a_search_memory_turn(gql, admin, model_server)
    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert seen == [
        ("insert_execution", "off"),
        ("touch_execution", "on"),
        ("touch_execution", "on"),
        ("commit_turn", "on"),
    ]


async def crash(server: EmbeddedPostgres) -> None:
    """A crash of the database itself: one backend killed, the postmaster ends every other and
    restarts from its WAL on disk (what it holds only in memory is lost), as after any crash of
    a server process. Returns once it accepts connections again."""
    conn = await asyncpg.connect(server.uri())
    victim = await conn.fetchval("SELECT pg_backend_pid()")
    os.kill(victim, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await conn.close(timeout=1)

    async def accepts() -> bool:
        try:
            again = await asyncpg.connect(server.uri(), timeout=1)
        except (OSError, asyncpg.PostgresError):  # TimeoutError is an OSError
            return False
        await again.close()
        return True

    await eventually(accepts, "the database restarted after its crash", 60)


async def test_a_turns_signs_of_life_outlive_a_crash_of_the_database(
    gql: GQL,
    admin: Caller,
    model_server: OpenAIServer,
    pg_server: EmbeddedPostgres,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn is not ended by a crash of the database while it waits for its model: its next
    write reaches the restarted server on a new connection, and it goes on to its end. So what
    its signs of life wrote before the crash must have survived it (their commit waits for
    the WAL flush): else the turn ends SUCCEEDED with the transcript of a model call and its
    tool calls missing, and their usage uncounted."""
    touch = store.touch_execution
    crashes: list[bool] = []

    async def then_crash(*args: Any, **kwargs: Any) -> bool:
        alive = await touch(*args, **kwargs)
        if not crashes:  # just after the first sign of life (its model call and tool calls)
            crashes.append(True)
            await crash(pg_server)
        return alive

    monkeypatch.setattr(store, "touch_execution", then_crash)
    executed = await a_search_memory_turn(gql, admin, model_server)
    assert crashes
    assert executed["status"] == "SUCCEEDED", executed["error"]
    sequences = [e["sequence"] for e in executed["transcript"]["nodes"]]
    assert sequences == list(range(1, len(sequences) + 1)), sequences
    assert events(executed, "model.call")[0]["finishReason"] == "tool_calls"
    assert len(tool_runs(executed, "search_memory")) == 1


async def test_a_turn_cancelled_while_its_pulse_ends_is_cancelled(
    state: AppState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An execution's end waits for its pulse to end (it may be giving its connection back):
    a cancellation of the execution's own task meanwhile (its request's, a deadline's) cancels
    the execution, rather than being taken for the pulse's and dropped."""
    ending = asyncio.Event()

    async def pulse(*args: Any) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ending.set()
            await asyncio.sleep(0.2)  # as a release of its connection takes a round trip

    monkeypatch.setattr(liveness, "_pulse", pulse)
    execution: Any = types.SimpleNamespace(execution_id=uuid.uuid4())

    async def execute() -> str:
        async with liveness.running(state, execution):
            await asyncio.sleep(0)
        return "ended as if not cancelled"

    task = asyncio.create_task(execute())
    await asyncio.wait_for(ending.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    await asyncio.sleep(0.3)  # the pulse, cancelled already, ends meanwhile


async def test_a_sweep_that_fails_says_an_outage_in_one_line_and_a_fault_with_its_traceback(
    state: AppState, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The next heartbeat sweeps again either way; an outage is said by its kind (never a
    server's words), any other failure is a fault to find, logged with its traceback."""
    other = liveness.TurnLiveness(state.pool, state.settings)
    other.heartbeat_seconds = 0.01
    failures = iter(
        [asyncpg.exceptions.CannotConnectNowError("starting up, sent 'Ada'"), KeyError("boot")]
    )

    async def failing(**_: Any) -> Any:
        raise next(failures)

    monkeypatch.setattr(other, "sweep", failing)
    with caplog.at_level("WARNING", logger="app.runtime.liveness"):
        task = asyncio.create_task(other._loop())
        await eventually(lambda: len(caplog.records) >= 2, "both failures logged")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    outage, fault = caplog.records[:2]
    assert outage.getMessage() == (
        "turn liveness sweep failed (CannotConnectNowError (SQLSTATE 57P03)); next in 0.01 s"
    )
    assert outage.exc_info is None
    assert fault.levelname == "ERROR" and fault.exc_info is not None
    assert fault.exc_info[1] is not None and fault.exc_info[1].args == ("boot",)
