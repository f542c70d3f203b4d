"""The bound on a whole turn, ENGRAM_TURN_TIMEOUT_SECONDS (app/runtime/deadline.py), end to end:
turns and ingests through GraphQL (in process, and once over HTTP), the scripted model on
loopback delaying its replies, the real database.

A turn that has not answered by its deadline fails as other failed turns do (FAILED, the
message naming the setting, only its transcript kept, its staged memory dropped), whatever it
was waiting for, cut then rather than after the model call's own timeout; a memory review cut
by it is dropped and the turn commits its answer; an ingest, whose work is its review, fails.
"""

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest
from factories import allow, make_agent_id, memory_harness, token_for
from helpers import GQL, eventually
from openai_server import OpenAIServer
from runtime_support import (
    EXECUTE,
    at_its_model_call,
    candidates,
    chat,
    events,
    memories,
    refuse_failure_records,
    run,
    tool_runs,
)

from app.auth.caller import Caller
from app.runtime import review as review_module
from app.state import AppState

pytestmark = [
    pytest.mark.usefixtures("model_server"),
    pytest.mark.settings(model_name="scripted", turn_timeout_seconds=1.5),
]

SETTING = "ENGRAM_TURN_TIMEOUT_SECONDS (1.5 seconds)"
# Far past the deadline, and within ENGRAM_MODEL_TIMEOUT_SECONDS (120): only the deadline cuts it.
LATE = 10.0
# A statement that runs past the deadline, as the deadline's cancel reaches the server too late
# to stop it (its reply was on its way): it sleeps, and goes on when cancelled.
LATE_STATEMENT = """
CREATE FUNCTION late() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    BEGIN PERFORM pg_sleep(2.5); EXCEPTION WHEN query_canceled THEN NULL; END;
    RETURN NEW;
END $$;
"""
REMEMBER = """mutation($input: RememberConversationInput!) { rememberConversation(input: $input) {
    executionId status error records { memoryId } } }"""


async def staged_rows(state: AppState, execution_id: str) -> int:
    """The memory rows an execution staged and did not commit (or drop)."""
    async with state.pool.acquire() as conn:
        return await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE pending_execution = $1",
            uuid.UUID(execution_id),
        )


async def test_a_turn_whose_model_keeps_calling_tools_fails_at_the_deadline_keeping_nothing(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    # Eight replies that each save a fact, 0.4 s apart: 3.2 s of work, within the bound on
    # model calls (16), past the turn's deadline.
    for n in range(8):
        note = {"summary": f"Ada's fact number {n}", "kind": "fact"}
        model_server.call_tools(("add_memory", note), delay=0.4)
    model_server.say("Saved them all.")

    failed = await run(gql, admin, action_id, "note everything about Ada")

    assert failed["status"] == "FAILED" and failed["output"] is None
    assert f"the turn did not answer within {SETTING}" in failed["error"], failed["error"]
    assert "nothing of this turn was kept" in failed["error"]
    assert events(failed, "turn.failed") == [{"error": failed["error"]}]
    saved = tool_runs(failed, "add_memory")
    assert 1 <= len(saved) < 8, saved  # it staged writes before the deadline...
    assert await memories(gql, admin, action_id) == []  # ...and committed none
    assert await staged_rows(state, failed["executionId"]) == 0
    assert events(failed, "memory.review") == []  # a turn that did not answer is not reviewed
    # Retried with a longer bound, it runs again as its next invocation (the model's replies
    # not yet sent: the rest of the facts, and the answer).
    state.settings.turn_timeout_seconds = 600
    retried = await run(gql, admin, action_id, None, execution_id=failed["executionId"])
    assert retried["status"] == "SUCCEEDED", retried["error"]
    assert retried["output"] == "Saved them all."
    kept = {m["summary"] for m in await memories(gql, admin, action_id)}
    first = {r["input"]["summary"] for r in saved}
    assert kept and not kept & first, (kept, first)  # its own writes; none of the first's
    assert kept <= {r["input"]["summary"] for r in tool_runs(retried, "add_memory")}


async def test_a_slow_model_call_is_cut_at_the_deadline_not_at_the_model_timeout(
    state: AppState, admin: Caller, base_url: str, model_server: OpenAIServer
) -> None:
    """Over HTTP: the model call in flight is cancelled at the deadline; the answer is the
    FAILED execution with no GraphQL error, as for a model call past its own timeout."""
    action_id = await make_agent_id(state, admin, harness=None)
    model_server.say("Hello, at last.", delay=LATE)
    token = await token_for(state, admin, "ops", allow(["SELECT", "INSERT"], "*"))
    body = {"query": EXECUTE, "variables": {"input": {"actionId": action_id, "input": "hi"}}}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        started = time.monotonic()
        response = await http.post(
            "/graphql", json=body, headers={"authorization": f"Bearer {token}"}
        )
        took = time.monotonic() - started

    assert response.status_code == 200, response.text
    answer = response.json()
    assert "errors" not in answer, answer
    failed = answer["data"]["executeAction"]
    assert failed["status"] == "FAILED"
    assert f"the turn did not answer within {SETTING}" in failed["error"], failed["error"]
    assert "ENGRAM_MODEL_TIMEOUT_SECONDS" not in failed["error"]
    assert took < LATE * 0.7, took  # not when the model answered, nor at its own timeout
    assert len(chat(model_server, "turn")) == 1  # cut, not retried
    # The call in flight was cancelled: its connection closed while the model still worked.
    await eventually(lambda: model_server.abandoned == 1, "the cut call's connection to close")
    assert events(failed, "model.call") == []


async def test_a_review_past_the_deadline_is_dropped_and_the_turn_keeps_its_answer(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    """The deadline bounds the end-of-turn review too, but a review it cuts fails as any
    review failure does: the turn commits its answer without the review's records, and the
    next review reads its messages."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.say("Got it, Lisbon.")
    candidates(model_server, {"summary": "Ada lives in Lisbon"}, delay=LATE)

    started = time.monotonic()
    answered = await run(gql, admin, action_id, "I live in Lisbon")
    took = time.monotonic() - started

    assert answered["status"] == "SUCCEEDED", answered["error"]
    assert answered["output"] == "Got it, Lisbon."
    (review,) = events(answered, "memory.review")
    assert review["error"] == (
        f"the memory review was stopped at the turn's deadline, {SETTING}; its messages wait "
        "for the next review"
    )
    assert "written" not in review
    assert took < LATE * 0.7, took
    assert await memories(gql, admin, action_id) == []

    model_server.say("It is sunny.")
    candidates(model_server, {"summary": "Ada lives in Lisbon"})
    later = await run(gql, admin, action_id, "What's the weather?")
    assert later["status"] == "SUCCEEDED", later["error"]
    (review,) = events(later, "memory.review")
    assert review["messages"]["count"] == 4  # the cut review's two, and this turn's
    assert review["messages"]["from"]["executionId"] == answered["executionId"]
    assert [m["summary"] for m in await memories(gql, admin, action_id)] == ["Ada lives in Lisbon"]


async def late_transcript(state: AppState) -> None:
    """A transcript's model.call rows commit LATE_STATEMENT's way: the sign of life that writes
    them takes 2.5 seconds to commit."""
    async with state.pool.acquire() as conn:
        await conn.execute(LATE_STATEMENT)
        await conn.execute("""
            CREATE CONSTRAINT TRIGGER late AFTER INSERT ON transcript_events
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.type = 'model.call')
                EXECUTE FUNCTION late()
        """)


async def test_a_deadline_met_while_a_transcript_is_committed_fails_the_turn_cleanly(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """The deadline passes while the sign of life after a model call commits the transcript so
    far: the commit ends (it is not cut), and the turn fails naming the setting, its transcript
    whole, each event once."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    await late_transcript(state)
    model_server.say("Hello.")

    failed = await run(gql, admin, action_id, "hi")

    assert failed["status"] == "FAILED", failed
    assert f"the turn did not answer within {SETTING}" in failed["error"], failed["error"]
    types = [e["type"] for e in failed["transcript"]["nodes"]]
    assert types == ["turn.input", "model.call", "turn.failed"], types
    assert events(failed, "turn.failed") == [{"error": failed["error"]}]  # nothing lost


async def cancelled_twice_as_it_commits(
    gql: GQL, admin: Caller, state: AppState, action_id: str
) -> tuple[str, str | None, list[tuple[str, Any]]]:
    """Runs a turn, cancelled as its sign of life commits its transcript so far (at the
    deadline, or as its request ends), and again while it waits for that commit (the request
    ending after the deadline); returns its status, error and transcript as stored."""
    turn = asyncio.ensure_future(run(gql, admin, action_id, "hi"))
    sleeping = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
    async with state.pool.acquire() as conn:
        await eventually(
            lambda: conn.fetchval(sleeping), "the sign of life's commit to be under way"
        )
    turn.cancel()
    await asyncio.sleep(0.3)
    assert not turn.done()  # it waits for the commit...
    turn.cancel()  # ...and is cancelled again meanwhile
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn, 30)
    async with state.pool.acquire() as conn:
        status, error = await conn.fetchrow(
            "SELECT status, error FROM executions WHERE action_id = $1", uuid.UUID(action_id)
        )
        transcript = await conn.fetch(
            "SELECT type, data FROM transcript_events WHERE action_id = $1 ORDER BY sequence",
            uuid.UUID(action_id),
        )
    return status, error, [(e["type"], e["data"]) for e in transcript]


CANCELLED = "the turn was cancelled before it finished; retry the execution"


@pytest.mark.settings(turn_timeout_seconds=0)
async def test_a_turn_cancelled_twice_while_a_transcript_is_committed_fails_cleanly(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """It still waits for the commit, so the failure knows what was stored and writes each
    event once: it wrote the stored ones again, which the database refused, leaving the turn
    RUNNING."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    await late_transcript(state)
    model_server.say("Hello.")

    status, error, transcript = await cancelled_twice_as_it_commits(gql, admin, state, action_id)

    assert (status, error) == ("FAILED", CANCELLED)
    types = [t for t, _ in transcript]
    assert types == ["turn.input", "model.call", "turn.failed"], types


@pytest.mark.settings(turn_timeout_seconds=0)
async def test_a_sign_of_life_failing_while_its_turn_is_cancelled_twice_is_waited_for(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """The commit the turn waits for fails: its error is taken, not raised in place of the
    cancellation, nothing is counted as stored, and the failure, whose own commit of those
    events fails too, keeps itself alone, noting the events lost."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    async with state.pool.acquire() as conn:
        await conn.execute("""
            CREATE FUNCTION refused_late() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(1); RAISE EXCEPTION 'refused late'; END $$;
            CREATE CONSTRAINT TRIGGER refused AFTER INSERT ON transcript_events
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.type = 'model.call')
                EXECUTE FUNCTION refused_late();
        """)
    model_server.say("Hello.")

    status, error, transcript = await cancelled_twice_as_it_commits(gql, admin, state, action_id)

    assert (status, error) == ("FAILED", CANCELLED)
    ((kind, data),) = transcript
    assert kind == "turn.failed" and data["error"] == CANCELLED
    assert data["transcriptLost"] == (
        "the turn's last 2 transcript events could not be stored (RaiseError)"
    ), data


@pytest.mark.settings(turn_timeout_seconds=0)
async def test_a_turn_cancelled_again_as_its_failure_is_recorded_ends_after_the_record(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """Cancelled during its model call, the turn records its failure; cancelled again while
    that record commits, it still waits for it: the cancellation comes after the record (it
    came at once, the record left running in the background, its error never taken)."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    async with state.pool.acquire() as conn:
        await conn.execute(LATE_STATEMENT)
        await conn.execute("""
            CREATE CONSTRAINT TRIGGER late AFTER INSERT ON transcript_events
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.type = 'turn.failed')
                EXECUTE FUNCTION late()
        """)
    turn = await at_its_model_call(gql, admin, action_id, model_server, LATE)
    turn.cancel()
    sleeping = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
    async with state.pool.acquire() as conn:
        await eventually(lambda: conn.fetchval(sleeping), "the failure's commit to be under way")
        turn.cancel()
        await asyncio.sleep(0.3)
        assert not turn.done()  # it waits for the record
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(turn, 30)
        status, error = await conn.fetchrow(
            "SELECT status, error FROM executions WHERE action_id = $1", uuid.UUID(action_id)
        )
    assert (status, error) == ("FAILED", CANCELLED)


@pytest.mark.settings(turn_timeout_seconds=0)
async def test_a_cancelled_turn_whose_failure_cannot_be_recorded_stays_cancelled(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, caplog
) -> None:
    """Cancelled during its model call, the turn records its failure, and the database refuses
    the record (both of its writes): the turn ends cancelled, as it was, the record's error
    logged (the liveness sweep ends the turn); the record's error was raised in place of the
    cancellation, which whoever cancelled it then never saw."""
    action_id = await make_agent_id(gql.state, admin, harness=None)
    await refuse_failure_records(state)
    turn = await at_its_model_call(gql, admin, action_id, model_server, LATE)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn, 30)
    assert any("could not be recorded" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
    async with state.pool.acquire() as conn:
        status = await conn.fetchval(
            "SELECT status FROM executions WHERE action_id = $1", uuid.UUID(action_id)
        )
    assert status == "RUNNING"  # (ended by the liveness sweep)


async def late_staging(state: AppState) -> None:
    """Every staged memory row is stored LATE_STATEMENT's way."""
    async with state.pool.acquire() as conn:
        await conn.execute(LATE_STATEMENT)
        await conn.execute("""
            CREATE TRIGGER late BEFORE INSERT ON agent_memories FOR EACH ROW
                WHEN (NEW.pending_execution IS NOT NULL) EXECUTE FUNCTION late()
        """)


async def test_a_turn_cut_while_a_tool_stages_a_record_leaves_no_staged_row(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """The cut waits for the statement it cancelled to end, so the failure, which drops every
    row the execution staged, drops the one stored all the same too."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    await late_staging(state)
    model_server.call_tools(("add_memory", {"summary": "Ada lives in Lisbon", "kind": "fact"}))
    model_server.say("Saved.")

    failed = await run(gql, admin, action_id, "I live in Lisbon")

    assert failed["status"] == "FAILED", failed
    assert f"the turn did not answer within {SETTING}" in failed["error"], failed["error"]
    assert await staged_rows(state, failed["executionId"]) == 0
    assert await memories(gql, admin, action_id) == []


async def test_a_review_cut_while_it_stages_a_record_leaves_no_staged_row(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    """The deadline cuts the memory review as it stages a record, the row stored all the
    same: the review's failure drops it with the rest of what the review staged, at once."""
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    await late_staging(state)
    model_server.say("Got it, Lisbon.")
    candidates(model_server, {"summary": "Ada lives in Lisbon"})

    answered = await run(gql, admin, action_id, "I live in Lisbon")

    assert answered["status"] == "SUCCEEDED", answered["error"]
    (review,) = events(answered, "memory.review")
    assert "stopped at the turn's deadline" in review["error"], review
    assert await staged_rows(state, answered["executionId"]) == 0
    assert await memories(gql, admin, action_id) == []


async def test_an_ingest_whose_review_runs_past_the_deadline_fails_keeping_nothing(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    candidates(model_server, {"summary": "Ada lives in Berlin"}, delay=LATE)
    request = {
        "actionId": action_id,
        "sessionId": "s1",
        "messages": [{"role": "user", "content": "I'm Ada and I live in Berlin."}],
    }
    started = time.monotonic()
    failed = (await gql(admin, REMEMBER, input=request)).ok()["rememberConversation"]
    took = time.monotonic() - started

    assert failed["status"] == "FAILED" and failed["records"] == []
    assert failed["error"] == (
        f"the conversation's review did not end within {SETTING}: it was stopped, and nothing "
        "of it was kept; send the conversation again, in smaller parts, or raise the setting"
    )
    assert took < LATE * 0.7, took
    assert await memories(gql, admin, action_id) == []
    assert await staged_rows(state, failed["executionId"]) == 0


@pytest.mark.parametrize("seconds", [0, 30])
async def test_a_turn_within_the_deadline_or_with_none_is_unaffected(
    gql: GQL, admin: Caller, state: AppState, model_server: OpenAIServer, seconds: float
) -> None:
    state.settings.turn_timeout_seconds = seconds  # 0: no bound
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness(tools=["add_memory"]))
    model_server.call_tools(("add_memory", {"summary": "Ada prefers email", "kind": "fact"}))
    model_server.say("Saved, after a while.", delay=1.6)  # past the module's 1.5 s
    candidates(model_server, {"summary": "Ada's team meets on Mondays"}, delay=0.3)

    executed = await run(gql, admin, action_id, "note that Ada prefers email")

    assert executed["status"] == "SUCCEEDED", executed["error"]
    assert executed["output"] == "Saved, after a while."
    (review,) = events(executed, "memory.review")
    assert "error" not in review, review
    saved = sorted(m["summary"] for m in await memories(gql, admin, action_id))
    assert saved == ["Ada prefers email", "Ada's team meets on Mondays"]


@pytest.mark.settings(model_name="scripted", turn_timeout_seconds=4)
async def test_a_backlog_longer_than_a_turn_is_reviewed_over_several_turns(
    gql: GQL, admin: Caller, model_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`every: {messages: 12}`: six turns' messages, a part each, wait for the sixth turn's
    review, whose six candidate calls take 0.9 s each, 5.4 s in all, past the 4 s deadline. Cut
    there, it kept nothing, and the next review, with one part more, was cut too: the
    messages were never reviewed. A review reads on only while half the time it had left
    remains, and leaves the rest for the next, so the backlog is reviewed over several turns.
    (A review that began with T seconds left reads its last part by T / 2 + 0.9 s: the turn
    may take up to about 1.8 s before its review on a loaded machine.)"""
    monkeypatch.setattr(review_module, "CALL_CHARS", 400)  # each turn's messages a part
    harness = memory_harness(extraction={"every": {"messages": 12}})
    action_id = await make_agent_id(gql.state, admin, harness=harness)
    facts = [
        "Ada keeps bees",
        "Bob rows boats",
        "Cy grows figs",
        "Di plays oboe",
        "Ed bakes rye",
        "Flo knits socks",
    ]
    for fact in facts:
        model_server.say("Noted.")
        candidates(model_server, {"summary": fact}, delay=0.9)
    kept: list[str] = []
    for turn, fact in enumerate(facts):
        executed = await run(gql, admin, action_id, f"{fact}: " + "so it goes " * 30)
        assert executed["status"] == "SUCCEEDED", executed["error"]
        if turn < len(facts) - 1:
            assert events(executed, "memory.review") == []  # not due
    (review,) = events(executed, "memory.review")
    assert "error" not in review, review["error"]
    assert "half the time the turn had left" in review["dropped"][-1] and review["written"]
    for _ in range(8):  # the rest, with the later turns' messages, as each review comes due
        model_server.say("Noted.")
        executed = await run(gql, admin, action_id, "Thanks")
        kept = [m["summary"] for m in await memories(gql, admin, action_id)]
        if len(kept) == len(facts):
            break
    assert sorted(kept) == sorted(facts)
