"""Executing one turn of an agent: recall, pins, the model and its native tools, atomically.

A turn holds no database transaction while the model works. It starts in one short
transaction (the execution row, RUNNING), stages its memory writes through MemoryWork (rows
only it sees), and ends in one short transaction that commits the memory, the execution's
result, the session's turn count, running summary and kept history, and the transcript
together. A turn that fails discards its staged memory and keeps only its transcript, written
in a transaction of its own; retried, it runs again as the execution's next invocation. A
turn that has not answered by its deadline (ENGRAM_TURN_TIMEOUT_SECONDS,
app/runtime/deadline.py) fails so; a memory review still running then is dropped, and the
turn commits its answer.
"""

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

import asyncpg

from app import fairness
from app.actions.service import ActionVersion, agent_principal, load_action
from app.auth import resources, verified
from app.auth import service as auth_service
from app.auth.caller import Caller
from app.auth.resources import Grant
from app.db.errors import (
    described,
    is_lock_timeout,
    is_out_of_resources,
    is_schema_missing,
    is_statement_timeout,
    is_unavailable,
)
from app.embeddings.errors import EmbeddingFailed
from app.errors import BadInput, Conflict, DomainError, NotFound, action_not_found
from app.executions import erasure_store, liveness_store, review_store, store
from app.executions.service import Execution
from app.history import keeping
from app.history import store as history_store
from app.history.store import HistoryScope
from app.idempotency.keys import Duplicate, Key, key_for
from app.memory import maintenance
from app.memory.records import MemoryRecord, Source
from app.memory.service import MemoryWork, Writer
from app.observability import metrics
from app.runtime import deadline, liveness
from app.runtime import transcript as events
from app.runtime.context import ContextWindow, as_text, budget_of, open_window
from app.runtime.deadline import deadline as turn_deadline
from app.runtime.instructions import listed_tokens, system_instructions
from app.runtime.model import (
    MODEL,
    Completion,
    ModelClient,
    ModelFailed,
    check_endpoint,
    unique_call_ids,
)
from app.runtime.recall import Recall
from app.runtime.review import review_memory
from app.runtime.tool_args import NATIVE_TOOLS
from app.runtime.tools import HistoryAccess, NativeTools, versions
from app.runtime.transcript import Transcript
from app.scope import Scope, as_harness, check_session_id
from app.state import AppState
from app.text import storable

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# What a client needs to run a turn, a tool call or an ingest (each also needs what its own
# work does: a tool call, its tool's grants).
RUN_GRANTS: tuple[Grant, ...] = (("INSERT", resources.EXECUTION_DOCUMENT),)


@dataclass(frozen=True)
class TurnRequest:
    action_id: UUID
    session_id: str | None
    input: Any
    preview: bool = False
    execution_id: UUID | None = None  # retry this FAILED execution as its next invocation
    idempotency_key: str | None = None  # a retry with this key answers with the first turn
    replay_of: UUID | None = None  # re-run this committed turn's input as a preview turn (H12)


class TurnEnded(Conflict):
    """The execution stopped running this attempt while it worked (swept as stale, or retried),
    or is `gone`: a turn's start is committed without waiting for its WAL flush, so a crash of
    PostgreSQL may lose it while the turn goes on, on the restarted server."""

    def __init__(self, execution: Execution, *, gone: bool = False) -> None:
        what = liveness_store.named(execution.kind)
        if gone:
            again = "run the turn again" if execution.kind == "TURN" else liveness_store.SEND_AGAIN
            message = (
                f"execution {execution.execution_id} is gone: the database lost this {what}'s "
                f"start (it restarted while the {what} ran), so nothing of this attempt was "
                f"kept; {again}"
            )
        else:
            message = (
                f"execution {execution.execution_id} no longer runs invocation "
                f"{execution.invocation_number}: it was failed as stale or retried while this "
                f"{what} ran, so nothing of this attempt was kept"
            )
        super().__init__(message)


async def _turn_ended(conn: asyncpg.Connection, execution: Execution) -> TurnEnded:
    """The error for an attempt a write found no longer running: whether its execution is
    still there says which."""
    found = await store.get_execution(
        conn, execution.account_id, execution.action_id, execution.execution_id
    )
    return TurnEnded(execution, gone=found is None)


@dataclass
class TurnContext:
    """What a running turn holds; also what an end-of-turn step (memory review) works on."""

    state: AppState
    action: ActionVersion
    execution: Execution
    transcript: Transcript
    work: MemoryWork | None
    # The caller whose request started this attempt, and the grants its work needs: its commit
    # writes only while the token that request sent exists and its client holds them
    # (`check_authority`). None: no caller to check (a test's context).
    caller: Caller | None = None
    grants: tuple[Grant, ...] = RUN_GRANTS
    # The conversation as the last model call read it, then the agent's answer.
    messages: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""
    window: ContextWindow | None = None  # the conversation within its budget (context.py)
    # Set by the memory review (app/runtime/review.py), written by the commit: how many
    # messages this turn adds for review, and the turns (this one too) its review covered.
    review_messages: int | None = None
    # Each with the messages of it an earlier review had read (review_read, migration 0031).
    reviewed: dict[UUID, int] = field(default_factory=dict)
    # A turn the review stopped inside: its messages read before the review, and after.
    review_partly: tuple[UUID, int, int] | None = None
    # When that review changed records: where `work` stood before it, and the versions.
    review_written: tuple[tuple[int, int, int], list[dict[str, Any]]] | None = None
    # The session history its search_history reads (None: history off, or no session).
    history: HistoryScope | None = None
    # The events it keeps in that history, embedded once it answered (`_kept_history`).
    kept: keeping.Prepared | None = None
    # When it must stop, in the event loop's time (None: no bound; deadline.py): set as the
    # attempt starts, which is when the context is made.
    deadline: float | None = field(init=False)
    # This process's count of changes to clients and tokens (auth/verified.py) when the caller
    # was last checked: `keep_alive` checks it again only once that count moved.
    auth_seen: int = field(init=False)

    def __post_init__(self) -> None:
        self.deadline = turn_deadline(self.state.settings)
        self.auth_seen = verified.generation()

    async def keep_alive(self) -> None:
        """Call after each model call: a live turn is never swept as stale, and a swept one, or
        one whose token this process saw revoked, stops here rather than after more model calls
        it could never commit."""
        rows = self.transcript.unwritten()
        write = asyncio.ensure_future(self._touch(rows))
        try:
            # Cut as it writes (at the deadline, or as the request ends): the write, one short
            # transaction, ends first, so the failure that follows knows whether these rows
            # were stored and does not write them twice.
            alive = await outlast(write)
        except asyncio.CancelledError:
            if not write.cancelled() and write.exception() is None and write.result():
                self.transcript.written += len(rows)
            raise
        if not alive:
            async with self.state.pool.acquire() as conn:
                raise await _turn_ended(conn, self.execution)
        self.transcript.written += len(rows)
        if verified.generation() != self.auth_seen and self.caller is not None:
            # A client or token changed through this process meanwhile: a turn whose token it
            # took stops here, before model calls it could never commit. (A change made
            # through another process stops it at its commit.)
            self.auth_seen = verified.generation()
            if self.caller.token_id is not None:
                async with self.state.pool.acquire() as conn:
                    await check_authority(conn, self)

    async def _touch(self, rows: list[tuple[int, int, str, Any]]) -> bool:
        """The sign of life and the transcript's `rows`, in one transaction; False: the
        execution no longer runs this attempt (and nothing was written)."""
        e = self.execution
        async with self.state.pool.acquire() as conn:  # one statement: its own transaction
            return await store.touch_execution(
                conn, e.account_id, e.action_id, e.execution_id, e.invocation_number, rows
            )


async def check_authority(conn: asyncpg.Connection, context: TurnContext) -> None:
    """The first statement of a commit's transaction: refuses (nothing is written) when the
    token that started the attempt was revoked, its client deleted, or its grants narrowed
    while it ran, and holds the token and its client so that none of these can commit until
    this commit has (auth_service.check_still_allowed)."""
    if context.caller is not None:
        what = liveness_store.named(context.execution.kind)
        await auth_service.check_still_allowed(
            conn, context.caller, grants=context.grants, what=what
        )


async def outlast(task: asyncio.Future[_T]) -> _T:
    """`task`'s result (or error), awaited to its end even when the caller is cancelled
    meanwhile, once or more (at the turn's deadline, and again as its request ends): the
    cancellation is raised after the task ended, once, and the task's own error is then taken
    (never left unretrieved). Work that must not be cut short: a turn's commit of its
    transcript so far, the recording of its failure."""
    cut: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as e:
            if not task.cancelled():  # the caller's cut, not the task's own end
                cut = cut or e
        except Exception:
            pass  # the task's error, raised below
    if cut is not None:
        if not task.cancelled():
            task.exception()
        raise cut
    return task.result()


# Steps run after the agent answers and before the turn commits, inside its unit of work:
# the memory review (model calls of purpose `memory`, app/runtime/review.py).
TurnEndStep = Callable[[TurnContext, ModelClient], Awaitable[None]]
END_OF_TURN_STEPS: list[TurnEndStep] = [review_memory]


def model_client(state: AppState) -> ModelClient:
    """The process's model client, made on first use (closed by stop_services)."""
    client = state.services.get(MODEL)
    if client is None:
        client = state.services[MODEL] = ModelClient(state.settings)
    return client


def stale_after_seconds(state: AppState) -> float:
    """How long a live turn may go without a sign of life (liveness.stale_after_seconds)."""
    return liveness.stale_after_seconds(state.settings)


def _boot_id(state: AppState) -> UUID | None:
    """The process's boot ID, which its RUNNING turns carry (app/runtime/liveness.py)."""
    process = state.services.get(liveness.TURN_LIVENESS)
    return process.boot_id if process is not None else None


def _check_request(
    request: TurnRequest,
    action: ActionVersion,
    session_param: str = "a sessionId",
    *,
    stored: bool = False,
) -> None:
    """`session_param`: how the caller names a session (MCP: a query parameter). `stored`:
    the session is one a turn already ran in (a replay's), whose ID was checked when it was
    given: only the agent's current scope rules apply to it."""
    if not stored:
        check_session_id(request.session_id, session_param.removeprefix("a "))
    memory = action.harness.memory
    agent_only = memory.read == memory.write == (Scope.AGENT,)
    # Spec: an agent without a session has no session scope, so it must set both to ["agent"].
    if request.session_id is None and memory.enabled and not agent_only:
        raise BadInput(
            f"a turn without {session_param} is an agent without a session: its memory scopes "
            '(harness.memory.scope.read and .write) must both be ["agent"], but they are '
            f"read {as_harness(memory.read)} and write {as_harness(memory.write)}; pass "
            f"{session_param} or change the scopes"
        )


async def _discard_ended(state: AppState, action: ActionVersion) -> None:
    """Fails turns whose process died, and drops the memory they staged (it can never commit)."""
    async with state.pool.acquire() as conn:
        ended = await liveness_store.fail_stale_and_find_ended(
            conn, action.account_id, action.action_id, stale_after_seconds(state)
        )
    assert state.embedder is not None
    for row in ended:
        await MemoryWork(state.pool, state.embedder, _writer(action, Execution.of(row))).discard()


def _writer(action: ActionVersion, execution: Execution, source: Source = "TOOL") -> Writer:
    """How the agent writes memory in this execution: by its tools, unless `source` says."""
    return Writer(
        account_id=execution.account_id,
        action=action,
        execution_id=execution.execution_id,
        invocation_number=execution.invocation_number,
        session_id=execution.session_id,
        principal=agent_principal(action.action_id),
        source=source,
        preview=execution.preview,
    )


async def _insert_running(
    state: AppState,
    caller: Caller,
    action: ActionVersion,
    request: TurnRequest,
    *,
    kind: str = "TURN",
    key: Key | None = None,
    replay_of: Execution | None = None,
) -> Execution:
    """Drops what the agent's ended turns staged, then writes a new execution of its current
    version for the request's session, input and mode, RUNNING in this process, with the
    request's key. In a session the session is created if new, and a turn numbered after its
    last one (provisional: the commit numbers it); a replay has its original's number."""
    session_id = request.session_id
    await _discard_ended(state, action)
    opens = session_id is not None and replay_of is None

    async def insert(conn: asyncpg.Connection) -> asyncpg.Record:
        # In a session the session is created with it if new (`open_session`).
        return await store.insert_execution(
            conn,
            account_id=caller.account_id,
            action_id=action.action_id,
            execution_id=uuid.uuid4(),
            action_version=action.version,
            session_id=session_id,
            turn=replay_of.turn if replay_of is not None else None,
            kind=kind,
            status="RUNNING",
            preview=request.preview,
            principal=caller.principal,
            token_id=caller.token_id,
            input=request.input,
            boot_id=_boot_id(state),
            replay_of=replay_of.execution_id if replay_of is not None else None,
            open_session=opens,
            next_turn=opens and kind == "TURN",
            deferred=True,  # store.defer_durability
        )

    async with state.pool.acquire() as conn:
        if replay_of is None and key is None:
            row = await insert(conn)  # one statement: its own transaction
        else:
            async with conn.transaction():
                if replay_of is not None:
                    # Its session locked: an erasure came first, or waits for it.
                    await _lock_session(conn, replay_of)
                    await _check_not_erased(conn, replay_of, "replayed")
                row = await insert(conn)
                if key is not None:
                    await key.record(conn, {"executionId": str(row["execution_id"])})
    return Execution.of(row)


async def _start_new(
    state: AppState, caller: Caller, request: TurnRequest, key: Key | None
) -> tuple[ActionVersion, Execution]:
    if request.input is None:
        raise BadInput("input is required: the message or value the turn answers")
    async with state.pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, request.action_id)
    if action is None:
        raise action_not_found(request.action_id)
    _check_request(request, action)
    check_endpoint(action.model, state.settings, action.account_id)
    return action, await _insert_running(state, caller, action, request, key=key)


async def _lock_session(conn: asyncpg.Connection, e: Execution, *, exclusive: bool = False) -> None:
    """Locks the execution's session, if it has one, until the transaction ends: shared for a
    retry's or replay's start, exclusive for a commit. eraseSession locks it exclusively and
    then refuses while an execution of the session runs, so a turn either starts after an
    erasure (and sees it), or the erasure waits and finds it running. Taken before any other
    row the transaction writes, as every path that locks a session does."""
    if e.session_id is not None:
        await store.lock_session(conn, e.account_id, e.action_id, e.session_id, exclusive=exclusive)


async def _check_not_erased(conn: asyncpg.Connection, e: Execution, done: str) -> None:
    """A turn of a session erased since it ran has lost its input: it is not run again."""
    if await erasure_store.was_erased(conn, e.account_id, e.action_id, e.execution_id):
        raise BadInput(
            f"execution {e.execution_id} cannot be {done}: its session was erased "
            "(eraseSession) after it ran, and its input with it; start a new turn"
        )


async def _start_replay(
    state: AppState, caller: Caller, request: TurnRequest, key: Key | None
) -> tuple[ActionVersion, Execution]:
    """A replay (H12): the original committed turn's input, run again by the agent's current
    version as a new preview execution that names the original. It keeps no history and
    counts no turn; its search_history sees what the original's did."""
    assert request.replay_of is not None
    if request.execution_id is not None:
        raise BadInput(
            "replayOf and executionId cannot go together: replayOf re-runs a committed turn as "
            "a new preview execution, executionId retries a FAILED one"
        )
    async with state.pool.acquire() as conn:
        found = await store.get_execution(
            conn, caller.account_id, request.action_id, request.replay_of
        )
        if found is None:
            raise NotFound(f"execution {request.replay_of} of action {request.action_id} not found")
        original = Execution.of(found)
        if original.kind != "TURN":
            raise BadInput(
                f"execution {original.execution_id} is of kind {original.kind}, not a turn; "
                "only a turn (kind TURN) can be replayed"
            )
        if original.status == "RUNNING":
            raise Conflict(
                f"execution {original.execution_id} is running; replay it once it has committed"
            )
        if original.status != "SUCCEEDED":
            raise BadInput(
                f"execution {original.execution_id} is a {original.status} turn; only a turn "
                "that SUCCEEDED (was committed) can be replayed"
            )
        if request.session_id is not None and request.session_id != original.session_id:
            raise BadInput(
                "a replay runs in its original's session: omit sessionId or pass "
                f"{original.session_id!r}"
            )
        if request.input is not None and request.input != original.input:
            raise BadInput("a replay runs its original's input; omit input or pass the same")
        action = await load_action(conn, caller.account_id, request.action_id)
    if action is None:
        raise action_not_found(request.action_id)
    rerun = TurnRequest(action.action_id, original.session_id, original.input, preview=True)
    # The current version's rules for the original's session (e.g. scopes without a session).
    _check_request(rerun, action, stored=True)
    check_endpoint(action.model, state.settings, action.account_id)
    return action, await _insert_running(state, caller, action, rerun, key=key, replay_of=original)


async def _history_scope(
    state: AppState, action: ActionVersion, e: Execution
) -> HistoryScope | None:
    """What the turn's search_history sees (H12, H13, H15): `_earlier_turns`."""
    if action.harness.history is None or e.session_id is None:
        return None
    return HistoryScope(e.account_id, e.action_id, e.session_id, *await _earlier_turns(state, e))


async def _earlier_turns(state: AppState, e: Execution) -> tuple[int | None, bool]:
    """The session's turns a turn reads, its search_history and its context window alike: the
    turn before which they end (None: every kept turn) and whether preview turns are among
    them. A replay reads what its original read: the turns before it, preview ones only if
    the original was a preview turn (H12); a replay of a replay, what that replay read. A
    turn's own events are kept only when it commits, so every turn kept before it reads is
    before it: a new turn has no bound (its number, a guess until the commit numbers it, would
    leave out a turn committed while it ran, or between a failed attempt and its retry)."""
    if e.replay_of is None:
        return None, e.preview
    async with state.pool.acquire() as conn:
        # A replay of a replay sees what that one saw: the first turn's view, not a preview's.
        original = await store.replayed_turn(conn, e.account_id, e.action_id, e.replay_of)
    assert original is not None  # executions are erased, never deleted
    return original["turn"], original["preview"]


async def _start_retry(
    state: AppState, caller: Caller, request: TurnRequest, key: Key | None
) -> tuple[ActionVersion, Execution]:
    assert request.execution_id is not None
    async with state.pool.acquire() as conn:
        found = await store.get_execution(
            conn, caller.account_id, request.action_id, request.execution_id
        )
        if found is None:
            raise NotFound(
                f"execution {request.execution_id} of action {request.action_id} not found"
            )
        previous = Execution.of(found)
        if previous.kind != "TURN":
            raise BadInput(
                f"execution {previous.execution_id} is not a turn; only turns are retried"
            )
        if previous.status == "RUNNING":
            # Being retried by another request, or its attempt not ended yet: as when two
            # retries both read it FAILED (`restart_execution`), a state that will change.
            raise Conflict(
                f"execution {previous.execution_id} is running (being retried by another "
                "request, or its attempt has not ended); retry it once it has FAILED (one whose "
                "process stopped is failed when its lease, ENGRAM_TURN_LEASE_SECONDS, runs out)"
            )
        if previous.status != "FAILED":
            replay = (
                ": to run a committed turn's input again, with the agent's current version, "
                "pass its executionId as replayOf instead (a preview run)"
                if previous.status == "SUCCEEDED"
                else ""
            )
            raise BadInput(
                f"execution {previous.execution_id} is {previous.status}; only a FAILED "
                f"execution can be retried{replay}"
            )
        if request.session_id != previous.session_id or request.preview != previous.preview:
            raise BadInput(
                "a retry runs in the execution's own session and mode: pass its sessionId "
                f"({previous.session_id!r}) and preview ({str(previous.preview).lower()})"
            )
        if request.input is not None and request.input != previous.input:
            raise BadInput("a retry runs the execution's own input; omit input or pass the same")
        action = await load_action(
            conn, caller.account_id, request.action_id, previous.action_version
        )
        if action is None:
            raise NotFound(
                f"action {request.action_id} version {previous.action_version} not found"
            )
    check_endpoint(action.model, state.settings, action.account_id)
    await _discard_ended(state, action)
    async with state.pool.acquire() as conn, conn.transaction():
        await store.defer_durability(conn)
        # Its session locked first (as eraseSession locks it): an erasure either came first,
        # or waits for this restart and then finds the turn running.
        await _lock_session(conn, previous)
        row = await store.restart_execution(
            conn, caller.account_id, action.action_id, previous.execution_id, _boot_id(state)
        )
        if row is None:
            raise Conflict(f"execution {previous.execution_id} is being retried by another request")
        await _check_not_erased(conn, previous, "retried")
        if key is not None:
            await key.record(conn, {"executionId": str(row["execution_id"])})
    return action, Execution.of(row)


def _request_key(caller: Caller, request: TurnRequest) -> Key | None:
    arguments = {
        "actionId": request.action_id,
        "sessionId": request.session_id,
        "input": request.input,
        "preview": request.preview,
        "executionId": request.execution_id,
        "replayOf": request.replay_of,
    }
    return key_for(request.idempotency_key, caller, "executeAction", arguments)


async def keyed_execution(state: AppState, caller: Caller, key: Key) -> Execution | None:
    """The execution a key already answered with (an executeAction, an MCP call, an ingest),
    as it is now; None for a new key."""
    async with state.pool.acquire() as conn:
        result = await key.previous(conn)
        if result is None:
            return None
        execution_id = UUID(result["executionId"])
        row = await store.get_execution(conn, caller.account_id, None, execution_id)
    if row is None:
        raise NotFound(
            f"idempotency key {key.key!r} answered with execution {execution_id}, which no "
            "longer exists (its action was deleted)"
        )
    return Execution.of(row)


async def _answered(state: AppState, caller: Caller, key: Key) -> Execution | None:
    """The execution a key already answered with, as it is now; None for a new key."""
    execution = await keyed_execution(state, caller, key)
    if execution is None:
        return None
    execution_id = execution.execution_id
    if execution.status == "RUNNING":
        raise Conflict(
            f"idempotency key {key.key!r}: its turn, execution {execution_id}, is still running; "
            "send the request again once it has ended, or read the execution"
        )
    return execution


async def execute_turn(state: AppState, caller: Caller, request: TurnRequest) -> Execution:
    """Runs one turn (or retries a failed one); returns the execution, SUCCEEDED or FAILED."""
    caller.require(*RUN_GRANTS)
    key = _request_key(caller, request)
    if key is not None and (answered := await _answered(state, caller, key)) is not None:
        return answered
    # Before anything is written: refused, the turn leaves nothing behind.
    async with fairness.turn():
        try:
            if request.replay_of is not None:
                action, execution = await _start_replay(state, caller, request, key)
            elif request.execution_id is None:
                action, execution = await _start_new(state, caller, request, key)
            else:
                action, execution = await _start_retry(state, caller, request, key)
        except Duplicate:
            # A concurrent request with the same key started the turn first.
            assert key is not None
            answered = await _answered(state, caller, key)
            if answered is None:
                raise key.lost() from None
            return answered
        async with liveness.running(state, execution):
            return await _attempt(state, caller, action, execution)


async def _attempt(
    state: AppState, caller: Caller, action: ActionVersion, execution: Execution
) -> Execution:
    ended: Execution | None = None
    try:
        context = await _turn_context(state, caller, action, execution)
        try:
            context.history = await _history_scope(state, action, execution)
            await _run(context)
            ended = await _commit(context)
        except BaseException as e:
            # A cancelled request still records its failure: the recording outlasts the cut.
            recording = asyncio.ensure_future(_fail(context, e))
            if not isinstance(e, Exception):
                ended = await recorded_or_logged(recording, context.execution)
                raise
            ended = await outlast(recording)
        return ended
    finally:
        # Every turn started, once, as it ended: one whose end could not be recorded, or found
        # it ended already (failed by the liveness sweep, retried), as FAILED.
        metrics.current().turn(ended.status if ended is not None else "FAILED", kind="TURN")


async def _turn_context(
    state: AppState, caller: Caller, action: ActionVersion, execution: Execution
) -> TurnContext:
    first_sequence = 1
    if execution.invocation_number > 1:
        async with state.pool.acquire() as conn:
            first_sequence = await store.next_sequence(
                conn, execution.account_id, execution.action_id, execution.execution_id
            )
    transcript = Transcript(execution.invocation_number, first_sequence)
    work: MemoryWork | None = None
    if action.harness.memory.enabled:
        assert state.embedder is not None
        work = MemoryWork(state.pool, state.embedder, _writer(action, execution))
    return TurnContext(state, action, execution, transcript, work, caller)


async def recorded_or_logged(
    recording: asyncio.Future[Execution], execution: Execution
) -> Execution | None:
    """Waits for the record of a failure that is a cancellation (`outlast`), which then goes
    on, and returns the execution it ended; None when the turn had ended already (swept) or
    the database refused the record, which is logged, not raised in its place (the cancel was
    answered as an error of the turn's, whoever cancelled it never learning it ended so); the
    liveness sweep ends the turn."""
    try:
        return await outlast(recording)
    except TurnEnded:
        return None  # swept meanwhile: ended already
    except Exception as lost:
        _log_lost(lost, "its failure could not be recorded", execution)
        return None


def native_tools(
    state: AppState,
    action: ActionVersion,
    transcript: Transcript,
    work: MemoryWork | None,
    history: HistoryScope | None = None,
    *,
    memory_text: bool = True,
    hold_uses: bool = False,
) -> NativeTools:
    """The native tools of a turn, and of a client's call over MCP (app/runtime/calls.py):
    one place, so a tool added here is offered over MCP too. `history`: the session history
    search_history reads (None: not offered); `memory_text`: whether its results may hold
    memory record text (a client without the memory read grants: not); `hold_uses`: a turn's,
    whose RETRIEVED uses wait for the model call that reads the result (M32)."""
    assert state.embedder is not None
    access = HistoryAccess(state.pool, state.embedder, history, memory_text) if history else None
    return NativeTools(
        work,
        action.harness.memory,
        transcript,
        state.embedder.name,
        access,
        max_query_chars=state.settings.max_search_query_chars,
        held=[] if hold_uses else None,
    )


async def _open_window(context: TurnContext, client: ModelClient) -> ContextWindow:
    """The session's earlier turns, within the context budget: their summary and the messages
    after it (their inputs, replies, tool calls and results; not their recalls)."""
    execution, action = context.execution, context.action

    async def context_call(completion: Completion) -> None:
        context.transcript.add(events.MODEL_CALL, events.model_call(completion, "context"))
        await context.keep_alive()

    # A replay reads what its original read (and stores no summary).
    before_turn, preview = await _earlier_turns(context.state, execution)
    budget, reserve = budget_of(action.model, context.state.settings.model_context_tokens)
    session = None
    if execution.session_id is not None:
        session = HistoryScope(
            execution.account_id, execution.action_id, execution.session_id, before_turn, preview
        )
    return await open_window(
        context.state.pool,
        session,
        budget=budget,
        reserve=reserve,
        history=action.harness.history,
        client=client,
        config=action.model,
        account_id=action.account_id,
        transcript=context.transcript,
        after_call=context_call,
    )


async def _run(context: TurnContext) -> None:
    """The agent's side of the turn, within the turn's deadline, the history it keeps (within
    it too), then the end-of-turn steps (each bounded by the same deadline, which fails the
    step, not the turn)."""
    client = model_client(context.state)
    timed_out = (
        f"the turn did not answer within {deadline.bound(context.state.settings)}: the model "
        "or tool call under way was stopped, and nothing of this turn was kept; retry the "
        "execution, or raise the setting"
    )
    async with deadline.within(context.deadline, timed_out):
        await _answer(context, client)
    # The history the turn keeps is embedded within the deadline too (else the provider's
    # timeout and retries could run past it), and before the review, whose cut at the
    # deadline must cost the turn nothing.
    unembedded = (
        "the history this turn keeps was not embedded within "
        f"{deadline.bound(context.state.settings)}: the embedding under way was stopped, and "
        "nothing of this turn was kept; retry the execution, or raise the setting"
    )
    async with deadline.within(context.deadline, unembedded):
        context.kept = await _kept_history(context)
    for step in END_OF_TURN_STEPS:
        await step(context, client)


async def _answer(context: TurnContext, client: ModelClient) -> None:
    """The agent's side of the turn, up to its answer (`context.output`)."""
    state, action, transcript = context.state, context.action, context.transcript
    memory = action.harness.memory
    request = as_text(context.execution.input)
    transcript.add(events.TURN_INPUT, {"input": context.execution.input})

    pinned: list[MemoryRecord] | None = None
    if context.work is not None and memory.pinned_max_tokens is not None:
        pinned = await context.work.pinned()
        transcript.add(
            events.MEMORY_PINNED, {"records": versions(pinned), "tokens": listed_tokens(pinned)}
        )
    window = context.window = await _open_window(context, client)
    tools = native_tools(state, action, transcript, context.work, context.history, hold_uses=True)
    # Earlier turns' memory blocks are not replayed, so only this turn's recalls count as
    # already put before the conversation (M31).
    recall = Recall(tools, transcript, request) if context.work is not None else None

    system = {
        "role": "system",
        "content": system_instructions(
            action.instructions, memory, pinned, history=context.history is not None
        ),
    }
    asked = {"role": "user", "content": request}
    exchange: list[dict[str, Any]] = []
    latest = ""
    limit = state.settings.max_model_calls_per_turn
    per_reply = state.settings.max_tool_calls_per_reply
    beyond = (
        f"not run: at most {per_reply} tool calls run per reply "
        "(ENGRAM_MAX_TOOL_CALLS_PER_REPLY); call the rest in your next reply"
    )
    called: set[str] = set()  # the turn's tool call IDs so far
    for call_number in range(1, limit + 1):
        recalled = await recall.before_call(latest) if recall else None
        context.messages = await window.prompt(system, tools.offered, recalled, asked, exchange)
        tools.release_uses(window.reads)
        if recall is not None:
            recall.release_use()
        last = call_number == limit
        # The last allowed call may not use tools, so the model answers instead.
        completion = await client.complete(
            action.model,
            context.messages,
            tools.offered,
            "turn",
            account_id=action.account_id,
            tool_choice="none" if last else "auto",
        )
        completion = unique_call_ids(completion, called, call_number)
        transcript.add(events.MODEL_CALL, events.model_call(completion, "turn"))
        await context.keep_alive()
        if not completion.tool_calls:
            context.output = completion.content or ""
            context.messages.append({"role": "assistant", "content": context.output})
            break
        if last:
            raise ModelFailed(
                f"the model still called tools on the last of its {limit} model calls this turn "
                "(ENGRAM_MAX_MODEL_CALLS_PER_TURN) and never answered"
            )
        exchange.append(
            {
                "role": "assistant",
                "content": completion.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in completion.tool_calls
                ],
            }
        )
        results = []
        for number, call in enumerate(completion.tool_calls):
            if number < per_reply:
                result = await tools.call(call)
                results.append(result.text)
            else:
                result = tools.refuse(call, beyond)
                if number % per_reply == 0:
                    await asyncio.sleep(0)  # refusing runs no await: other requests go on
            exchange.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
        # The next recall looks for what the work is now about: the reply and the tools' words.
        latest = "\n".join(t for t in [completion.content or "", *results] if t)


async def _finish(
    conn: asyncpg.Connection,
    context: TurnContext,
    *,
    status: str,
    output: Any,
    error: str | None,
    turn: int | None,
    rows: list[tuple[int, int, str, Any]] | None = None,
) -> asyncpg.Record:
    """Ends the attempt and writes its transcript (or `rows` instead of its unwritten events),
    in one statement inside the caller's transaction."""
    execution = context.execution
    row = await store.finish_execution(
        conn,
        account_id=execution.account_id,
        action_id=execution.action_id,
        execution_id=execution.execution_id,
        invocation_number=execution.invocation_number,
        status=status,
        output=output,
        error=error,
        turn=turn,
        events=context.transcript.unwritten() if rows is None else rows,
    )
    if row is None:
        raise await _turn_ended(conn, execution)  # and nothing was written
    return row


async def _kept_history(context: TurnContext) -> keeping.Prepared | None:
    """The events the turn keeps in its session's history, embedded (H1-H4, H8); None when it
    keeps none: history off, no session, or a replay (which re-runs the past)."""
    execution, history = context.execution, context.action.harness.history
    if history is None or execution.session_id is None or execution.replay_of is not None:
        return None
    rows = [(e.sequence, e.type, e.data) for e in context.transcript.events]
    kept = keeping.kept_events(rows, history.index, as_text(execution.input), NATIVE_TOOLS)
    assert context.state.embedder is not None
    prepared = await keeping.embed(context.state.embedder, kept)
    if prepared.embed_tokens:
        context.transcript.embedding(context.state.embedder.name, prepared.embed_tokens, "history")
    return prepared


async def keep_history(
    conn: asyncpg.Connection, execution: Execution, turn: int, kept: keeping.Prepared
) -> None:
    """Writes the events an execution keeps in its session's history as turn `turn`, inside
    the transaction that commits it (a turn's, or an ingest's)."""
    await history_store.insert(conn, execution, turn, kept.events, kept.vectors)


def committed(
    state: AppState, execution: Execution, records: int, kept: keeping.Prepared | None
) -> None:
    """After a commit: what it added to the agent's memory and the session's history, for
    the builds of their own search indexes (app/memory/maintenance.py IndexBuilds)."""
    key = (execution.account_id, execution.action_id)
    maintenance.wrote(state.pool, key, records)
    if kept is not None and execution.session_id is not None:
        parts = sum(len(e.parts) for e in kept.events)
        maintenance.wrote(state.pool, (*key, execution.session_id), parts)


class _Overlap(Exception):
    """Another turn's review covered an earlier turn this turn's review read too."""


async def _record_review(conn: asyncpg.Connection, context: TurnContext) -> dict[str, Any] | None:
    """Marks, in the commit's transaction, the turns the turn's review covered. When another
    turn of the session, committed meanwhile, reviewed an earlier turn this review read too,
    the records this review wrote would restate what that one kept: they are dropped, nothing
    is marked, and this turn's messages wait for the next review; the turn commits the rest,
    and the returned `memory.review.dropped` event says so. (A review that wrote nothing
    restates nothing.)"""
    if context.review_messages is None:
        return None
    e = context.execution
    key = (conn, e.account_id, e.action_id, e.execution_id, context.review_messages)
    if context.review_written is None:
        # Its marks alone: nothing of it to drop, so no savepoint (a statement that fails
        # fails the commit).
        await review_store.record_review(*key, context.reviewed, context.review_partly)
        return None
    try:
        async with conn.transaction():  # a savepoint: the marks below go if the review does
            covered = await review_store.record_review(
                *key, context.reviewed, context.review_partly
            )
            if not covered:
                raise _Overlap
    except _Overlap:
        return await _drop_review(
            conn,
            context,
            "another turn's memory review, committed first, covered an earlier turn this "
            "review read too",
        )
    return None


async def _drop_review(conn: asyncpg.Connection, context: TurnContext, why: str) -> dict[str, Any]:
    """Drops, in the commit's transaction, the records the turn's review staged; its messages
    are counted and none marked reviewed, so they wait for the next review. Returns the
    `memory.review.dropped` event saying `why`."""
    assert context.work is not None and context.review_written is not None
    assert context.review_messages is not None  # the review ran
    e = context.execution
    mark, records = context.review_written
    await review_store.record_review(
        conn, e.account_id, e.action_id, e.execution_id, context.review_messages, {}
    )
    await context.work.discard_since(conn, mark)
    return {
        "reason": f"{why}: the review's records were not kept, and this turn's messages wait "
        "for the next review",
        "records": records,
    }


async def _drop_restated(conn: asyncpg.Connection, context: TurnContext) -> dict[str, Any] | None:
    """Drops, in the commit's transaction, the records the turn's review adds that a record
    committed meanwhile says word for word (another turn's review learned the same at the same
    time: neither saw the other's record, M12); the review would have skipped them had it run
    after. Returns the `memory.review.dropped` event naming them, or None."""
    if context.work is None or context.review_written is None:
        return None
    mark, written = context.review_written
    restated = {str(m) for m in await context.work.drop_restated(conn, mark)}
    if not restated:
        return None
    return {
        "reason": "another turn committed, while this one ran, records that say word for word "
        "what these records of this turn's memory review say: they were not kept twice",
        "records": [r for r in written if r["id"] in restated],
    }


async def _commit_memory(
    conn: asyncpg.Connection, context: TurnContext
) -> tuple[list[MemoryRecord], dict[str, Any] | None]:
    """Commits the turn's memory with its review's marks; returns what it wrote and, when the
    review's records were not kept, the `memory.review.dropped` event. A review never fails
    its turn: when committing meets a record another writer changed meanwhile, the review's
    records go (its messages wait for the next review) and the turn's own writes are committed
    alone; a conflict then is the turn's own, and fails it."""
    if context.review_written is None:
        # The review staged no records (or did not run): none to drop, none restated, and a
        # conflict is the turn's own, which fails it whole; so no savepoint.
        await _record_review(conn, context)
        return (await context.work.commit(conn) if context.work is not None else []), None
    assert context.work is not None  # a review writes through the turn's memory
    restated = await _drop_restated(conn, context)
    dropped = None
    try:
        async with conn.transaction():  # a savepoint: the review's marks go with its records
            dropped = await _record_review(conn, context)
            return await context.work.commit(conn), dropped or restated
    except Conflict:
        if dropped is not None:
            raise  # the review's records were not in it: the turn's own writes conflicted
        dropped = await _drop_review(
            conn,
            context,
            "a record this turn's memory review changes was changed by another writer "
            "meanwhile, after the review read it",
        )
        return await context.work.commit(conn), dropped


def _writes_only_its_end(context: TurnContext) -> bool:
    """Whether the turn's commit writes nothing but its end (`store.commit_turn`): no memory
    records (the turn's or its review's), no review stopped inside a turn, no summary, no
    history."""
    return (
        (context.work is None or context.work.idle)
        and context.review_written is None
        and context.review_partly is None
        and context.kept is None
        and (context.window is None or not context.window.unsaved)
    )


async def _commit_its_end(context: TurnContext, counts: bool) -> asyncpg.Record:
    """What `_commit`'s transaction does for a turn that writes nothing but its end
    (`_writes_only_its_end`), in one statement: written only while the caller's token and
    the policies its request read still hold. When they changed (or the token went, or the
    turn stopped running), checked again and written in a transaction (`check_authority`)."""
    execution, caller = context.execution, context.caller
    review = None
    if context.review_messages is not None:
        review = context.review_messages, context.reviewed
    authority = None
    if caller is not None and caller.token_id is not None:
        authority = caller.principal, caller.token_id, caller.stored_policies

    async def commit(
        conn: asyncpg.Connection, authority: tuple[str, UUID, Any] | None
    ) -> asyncpg.Record | None:
        return await store.commit_turn(
            conn,
            account_id=execution.account_id,
            action_id=execution.action_id,
            execution_id=execution.execution_id,
            invocation_number=execution.invocation_number,
            output=context.output,
            session_id=execution.session_id,
            count=counts,
            review=review,
            events=context.transcript.unwritten(),
            authority=authority,
        )

    async with context.state.pool.acquire() as conn:
        row = await commit(conn, authority)
        if row is None and authority is not None:
            async with conn.transaction():
                await check_authority(conn, context)
                row = await commit(conn, None)
        if row is None:
            raise await _turn_ended(conn, execution)  # and nothing was written
    return row


async def _commit(context: TurnContext) -> Execution:
    execution, transcript = context.execution, context.transcript
    kept = context.kept
    transcript.add(events.TURN_OUTPUT, {"output": context.output})
    counts = execution.session_id is not None and execution.replay_of is None
    if _writes_only_its_end(context):
        row = await _commit_its_end(context, counts)
        transcript.written = len(transcript.events)
        committed(context.state, execution, 0, None)
        return Execution.of(row)
    async with context.state.pool.acquire() as conn, conn.transaction():
        await check_authority(conn, context)
        turn = None
        # The session locked before the memory rows; a turn it counts is counted by the same
        # statement (numbered now: nothing else in this transaction reads the count).
        if counts:
            assert execution.session_id is not None
            turn = await store.count_turn(
                conn, execution.account_id, execution.action_id, execution.session_id, lock=True
            )
        else:
            await _lock_session(conn, execution, exclusive=True)
        written, dropped = await _commit_memory(conn, context)
        if turn is not None:  # counted (a session's row is only gone with its action)
            if context.window is not None:
                await context.window.save(conn, execution, turn)
            if kept is not None:  # H5: kept only in the commit's transaction
                await keep_history(conn, execution, turn, kept)
        if dropped is not None:  # the last step before the commit: a failed one drops nothing
            transcript.add(events.MEMORY_REVIEW_DROPPED, dropped)
        row = await _finish(
            conn, context, status="SUCCEEDED", output=context.output, error=None, turn=turn
        )
    transcript.written = len(transcript.events)
    committed(context.state, execution, len(written), kept if turn is not None else None)
    return Execution.of(row)


def _failure_message(error: BaseException, kind: str) -> str:
    """What a failed execution of `kind` says of `error`: its words name what failed (the
    turn, the tool call, the conversation) and tell its caller what to do."""
    if isinstance(error, TurnEnded):
        return error.message
    what, again = liveness_store.named(kind), liveness_store.told(kind)
    if isinstance(error, Conflict):
        other = "turn" if kind == "TURN" else "execution"
        return (
            f"another {other} changed this agent's memory while this {what} ran "
            f"({error.message}); nothing of this {what} was kept: {again}"
        )
    if isinstance(error, ModelFailed | DomainError | deadline.TimedOut):
        return error.message
    if isinstance(error, asyncio.CancelledError):
        return f"the {what} was cancelled before it finished; {again}"
    if isinstance(error, EmbeddingFailed):  # a recall's, or a write's at commit
        if not error.transient:
            return (
                "the embedding model refused the text (logged by the service): retrying will "
                "not help until the service's embedding provider is fixed"
            )
        return f"the embedding model failed (logged by the service); {again}"
    if is_lock_timeout(error):
        return (
            f"the {what} waited longer than ENGRAM_LOCK_TIMEOUT_SECONDS for data another change "
            f"was holding, and its database work was rolled back; {again}"
        )
    if is_statement_timeout(error):
        return (
            f"the database did not finish the {what}'s work within "
            f"ENGRAM_STATEMENT_TIMEOUT_SECONDS, and rolled it back; {again}"
        )
    if is_out_of_resources(error):
        return (
            f"the database ran out of disk space or memory for the {what}'s work (logged by "
            f"the service), and rolled it back; {again} once the operator has made room"
        )
    if is_schema_missing(error):
        # A table, function or type of Engram's that the database does not hold (being
        # restored, or changed under the service): no connection was lost, and a retry passes
        # only once the database is whole again.
        return (
            "the database does not hold all of Engram's tables (it is being restored, or was "
            f"changed under the service), and the {what}'s database work was rolled back; "
            f"{again} once the database is restored whole"
        )
    if is_unavailable(error):
        # Its connection ended under it (a restart of the database, pg_terminate_backend, a
        # session idle in its transaction past its bound), or none could be had: no fault of
        # the turn's, and a retry may well pass.
        return (
            f"the database became unavailable while the {what} ran (restarting, or its "
            f"connection was ended), and the {what}'s database work was rolled back; {again}"
        )
    return f"the {what} failed on an internal error (logged by the service); {again}"


async def _committed_attempt(state: AppState, e: Execution) -> Execution | None:
    """The execution, when this attempt of it committed after all: its commit went through
    but the answer was lost on the way back (its connection ended), so the failure found it
    no longer running. None otherwise."""
    async with state.pool.acquire() as conn:
        row = await store.get_execution(conn, e.account_id, e.action_id, e.execution_id)
    if row is None or row["status"] != "SUCCEEDED":
        return None
    if row["invocation_number"] != e.invocation_number:
        return None
    log.warning(
        "%s %s: its commit went through, though its answer was lost",
        liveness_store.named(e.kind),
        e.execution_id,
    )
    return Execution.of(row)


def _log_lost(error: BaseException, what: str, e: Execution) -> None:
    """A failure's own step that failed (`what` befell the execution, named by its kind): a
    warning when the database went away (its failure says so already), an error with its
    traceback otherwise."""
    named = liveness_store.named(e.kind)
    if is_unavailable(error):
        log.warning("%s %s: " + what + " (%s)", named, e.execution_id, described(error))
    else:
        log.error("%s %s: " + what, named, e.execution_id, exc_info=error)


async def _fail(context: TurnContext, error: BaseException) -> Execution:
    """Keeps the failed attempt's transcript; drops its memory."""
    e = context.execution
    named = liveness_store.named(e.kind)
    if isinstance(error, EmbeddingFailed):
        log.warning(
            "%s %s failed: the embedding model failed: %s", named, e.execution_id, error.logged
        )
    elif is_lock_timeout(error) or is_statement_timeout(error) or is_unavailable(error):
        log.warning("%s %s failed: %s", named, e.execution_id, described(error))
    elif isinstance(error, deadline.TimedOut):
        log.warning("%s %s failed: %s", named, e.execution_id, error.message)
    elif isinstance(error, ModelFailed):
        log.warning("%s %s failed: %s", named, e.execution_id, error.logged)
    elif not isinstance(error, DomainError | asyncio.CancelledError):
        log.error("%s %s failed", named, e.execution_id, exc_info=error)
    message = storable(_failure_message(error, e.kind))
    transcript = context.transcript
    transcript.add(events.TURN_FAILED, {"error": message})
    if context.work is not None:
        try:
            await context.work.discard()
        except Exception as discard_error:
            # Staged rows of a turn that no longer runs are dropped by the liveness sweep.
            _log_lost(discard_error, "its staged memory is left to the sweep", e)
    try:
        async with context.state.pool.acquire() as conn, conn.transaction():
            # The transcript is kept even when the commit's wait for its session ran past the
            # lock bound: this wait is bounded by the statement bound only.
            await conn.execute("SET LOCAL lock_timeout = 0")
            # Failed by a sweep while it ran (its process stalled), its session may have been
            # erased since: then it writes no words back.
            await _lock_session(conn, context.execution)
            if await erasure_store.was_erased(
                conn,
                context.execution.account_id,
                context.execution.action_id,
                context.execution.execution_id,
            ):
                row = await _finish(
                    conn, context, status="FAILED", output=None, error=None, turn=None, rows=[]
                )
            else:
                row = await _finish(
                    conn, context, status="FAILED", output=None, error=message, turn=None
                )
    except TurnEnded:
        if (kept := await _committed_attempt(context.state, context.execution)) is not None:
            return kept
        raise
    except Exception as write_error:
        # Once more with only the failure, so the turn never stays RUNNING for want of a
        # transcript the database refused (if this fails too, the liveness sweep ends it).
        _log_lost(write_error, "its transcript could not be stored", e)
        lost = transcript.unwritten()
        note = (
            f"the {named}'s last {len(lost) - 1} transcript events could not be stored "
            f"({type(write_error).__name__})"
        )
        failed = {"error": message, "transcriptLost": storable(note)}
        only = [(lost[0][0], transcript.invocation_number, events.TURN_FAILED, failed)]
        async with context.state.pool.acquire() as conn, conn.transaction():
            row = await _finish(
                conn, context, status="FAILED", output=None, error=message, turn=None, rows=only
            )
        del transcript.events[transcript.written :]
        transcript.events.append(events.Event(*only[0]))
    transcript.written = len(transcript.events)
    return Execution.of(row)
