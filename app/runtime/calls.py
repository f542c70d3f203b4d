"""Executions outside a turn, for agents that run elsewhere: one tool call of a client over MCP
(kind MCP, app/mcp/) and one conversation handed in to be remembered (kind INGEST,
`rememberConversation` and the MCP tool `remember_conversation`).

Each runs as a turn does (app/runtime/turns.py): its execution starts RUNNING in one short
transaction, carrying the process's boot ID so the liveness sweep ends it if the process dies;
its memory writes are staged through MemoryWork and committed together with the execution's
end and its transcript in one short transaction; a failure discards them and keeps the
transcript. The tools are the turn's own (turns.native_tools): the same schemas, limits,
scope rules, preview flag and error messages. Records an MCP call writes have source MCP,
those an ingest's review writes EXTRACTION, and both have the agent's principal as modifiedBy.
An ingest in a session is counted as one turn of it, and keeps its messages as that turn's
session history when the agent keeps history (app/history/keeping.py). An ingest's review has
a turn's deadline (app/runtime/deadline.py): past it the ingest fails, keeping nothing. An MCP
call runs one tool, bounded by the database's and the embedder's timeouts instead.
"""

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from app import fairness
from app.actions.service import ActionVersion, load_action
from app.auth import resources
from app.auth.caller import Caller
from app.auth.resources import Grant
from app.errors import BadInput, Conflict, action_not_found
from app.executions import store
from app.executions.service import Execution
from app.history import keeping
from app.history.service import READ_HISTORY
from app.history.store import HistoryScope
from app.idempotency.keys import MAX_KEY_LENGTH, Duplicate, Key, key_for
from app.memory.records import MemoryRecord, Source
from app.memory.service import MemoryWork
from app.observability import metrics
from app.runtime import deadline, liveness, redaction, turns
from app.runtime import review as conversation_review
from app.runtime import transcript as events
from app.runtime.model import ToolCall, check_endpoint
from app.runtime.tool_args import (
    ADD_MEMORY,
    DELETE_MEMORY,
    NATIVE_TOOLS,
    READ_MEMORY,
    SEARCH_HISTORY,
    SEARCH_MEMORY,
)
from app.runtime.tools import MAX_ARGUMENT_DEPTH, versions
from app.runtime.transcript import Transcript
from app.runtime.turns import TurnContext, TurnRequest
from app.state import AppState
from app.text import (
    check_json,
    check_storable,
    nests_deeper,
    rfc3339,
    shown,
    storable,
    storable_json,
)

REMEMBER_CONVERSATION = "remember_conversation"
ROLES = ("user", "assistant", "tool")
MAX_MESSAGES = 500
MAX_MESSAGE_BYTES = 64 * 1024
MAX_CONVERSATION_BYTES = 512 * 1024  # within the default ENGRAM_MAX_BODY_BYTES, as JSON
MAX_CLIENT_NAME = 200

# What a client needs, beyond INSERT on financial.ActionExecution.document, for each tool: the
# tools hand it record text and change records (spec: reading memory through the API needs
# SELECT on the indexes and the document; changing it, UPDATE).
_READ: tuple[Grant, ...] = resources.READ_MEMORY + (("SELECT", resources.MEMORY_SEARCH_INDEX),)
_CHANGE: tuple[Grant, ...] = _READ + (("UPDATE", resources.MEMORY_DOCUMENT),)


def tool_grants(name: str, arguments: dict[str, Any], pins: bool = True) -> tuple[Grant, ...]:
    """The memory grants a client's call of the tool `name` with `arguments` needs; `pins`:
    whether the agent may pin at all (if not, a pin is the tool's refusal, not a grant's)."""
    if name in (SEARCH_MEMORY, READ_MEMORY):
        return _READ
    if name == ADD_MEMORY:
        grants = resources.ADD_MEMORY
        if arguments.get("replaces") is not None:
            grants += _CHANGE
        if arguments.get("pinned") is True and pins:
            grants += resources.PIN_MEMORY
        return grants
    if name == DELETE_MEMORY:
        return _CHANGE
    if name == SEARCH_HISTORY:
        return READ_HISTORY  # a session's history is read as transcripts are
    return ()


@dataclass(frozen=True)
class Place:
    """Where a call from outside works: the agent, its session (None: it has none), the mode."""

    action_id: UUID
    session_id: str | None = None
    preview: bool = False


@dataclass(frozen=True)
class ClientInfo:
    """Who calls, recorded in the execution's input: the authenticated client, and the program
    it says it is (its MCP clientInfo when the request carries it, and its User-Agent)."""

    principal: str
    name: str | None = None
    version: str | None = None
    user_agent: str | None = None

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"principal": self.principal}
        for key, value in (
            ("name", self.name),
            ("version", self.version),
            ("userAgent", self.user_agent),
        ):
            if value:
                found[key] = storable(value[:MAX_CLIENT_NAME])
        return found


async def load_place(
    state: AppState, caller: Caller, place: Place, session_param: str = "a sessionId"
) -> ActionVersion:
    """The agent a call from outside works on, as executeAction finds it: another account's
    agent is not found, and the session rules are a turn's (`session_param`: how the caller
    names a session)."""
    caller.require(*turns.RUN_GRANTS)
    async with state.pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, place.action_id)
    if action is None:
        raise action_not_found(place.action_id)
    turns._check_request(
        TurnRequest(place.action_id, place.session_id, None), action, session_param
    )
    return action


# What a turn's system instructions tell the agent's own model about its memory tools
# (app/runtime/instructions.py), a client's model reads in the tools' descriptions instead.
WHEN_TO_USE = {
    SEARCH_MEMORY: "Use it before you answer anything that may depend on what you learned "
    "earlier (a person's preferences, facts about an account, decisions taken), and before "
    "asking again for something you may have been told.",
    ADD_MEMORY: "Use it when you learn a durable fact, preference, decision or commitment that "
    "will matter in later conversations; not for small talk or what only matters now. Search "
    "first: when it corrects a record you found, name that record in replaces.",
    READ_MEMORY: "Use it when a search result's summary is not enough, or to follow a "
    "record's replaces or replacedBy.",
    DELETE_MEMORY: "Use it when a record is wrong or no longer useful and nothing replaces it; "
    "to correct one, add the right one with replaces instead.",
    SEARCH_HISTORY: "Use it before you guess at, or ask again for, something an earlier turn "
    "of this session established.",
}


def history_scope(action: ActionVersion, place: Place) -> HistoryScope | None:
    """What search_history reads for a client over MCP: the session's committed turns (preview
    ones only in preview mode); None when the agent keeps no history or has no session."""
    if action.harness.history is None or place.session_id is None:
        return None
    return HistoryScope(action.account_id, action.action_id, place.session_id, None, place.preview)


def offered_tools(state: AppState, action: ActionVersion, place: Place) -> list[dict[str, Any]]:
    """What a client over MCP is offered: the native tools of the agent's turns (OpenAI tool
    definitions, their parameters unchanged, their descriptions saying when to use them), and
    remember_conversation when its memory is enabled."""
    tools = []
    scope = history_scope(action, place)
    for tool in turns.native_tools(state, action, Transcript(1, 1), None, scope).offered:
        function = tool["function"]
        when = WHEN_TO_USE.get(function["name"])
        if when:
            function = {**function, "description": f"{function['description']} {when}"}
        tools.append({**tool, "function": function})
    if action.harness.memory.enabled:
        tools.append(REMEMBER_CONVERSATION_TOOL)
    return tools


REMEMBER_CONVERSATION_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": REMEMBER_CONVERSATION,
        "description": "Hand over a conversation (or its latest part) for review: what will "
        "matter later becomes memory, compared with what you already remember, so a restated "
        "fact is skipped and a corrected one replaces the old record. Use it at the end of a "
        "conversation or a task, instead of several add_memory calls; it answers with what was "
        "decided for each fact.",
        "parameters": {
            "type": "object",
            "properties": {
                "messages": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_MESSAGES,
                    "items": {
                        "type": "object",
                        "properties": {
                            "role": {"type": "string", "enum": list(ROLES)},
                            "content": {
                                "type": "string",
                                "minLength": 1,
                                "description": f"Not blank; at most {MAX_MESSAGE_BYTES} bytes, "
                                f"and the messages together at most {MAX_CONVERSATION_BYTES}.",
                            },
                            "time": {
                                "type": "string",
                                "format": "date-time",
                                "description": "When it was said (RFC 3339); default now.",
                            },
                        },
                        "required": ["role", "content"],
                        "additionalProperties": False,
                    },
                },
                "idempotencyKey": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_KEY_LENGTH,
                    "description": "Sent again with the same messages, answers with the first "
                    "call's result instead of remembering them twice.",
                },
            },
            "required": ["messages"],
            "additionalProperties": False,
        },
    },
}


@dataclass
class _Run:
    """One execution outside a turn, as a turn's context (the memory review works on one)."""

    context: TurnContext
    ended: Execution | None = None  # as committed or failed (`_commit`, `_failed`)

    @property
    def execution(self) -> Execution:
        return self.context.execution


async def _start(
    state: AppState,
    caller: Caller,
    action: ActionVersion,
    place: Place,
    *,
    kind: str,
    input: Any,
    source: Source,
    grants: tuple[Grant, ...] = turns.RUN_GRANTS,
) -> _Run:
    """`grants`: what the caller needs for this work, checked again as it commits."""
    request = TurnRequest(action.action_id, place.session_id, input, place.preview)
    execution = await turns._insert_running(state, caller, action, request, kind=kind)
    work: MemoryWork | None = None
    if action.harness.memory.enabled:
        assert state.embedder is not None
        work = MemoryWork(state.pool, state.embedder, turns._writer(action, execution, source))
    transcript = Transcript(1, 1)
    return _Run(TurnContext(state, action, execution, transcript, work, caller, grants))


async def _commit(
    run: _Run,
    output: Callable[[list[MemoryRecord]], Any],
    key: Key | None = None,
    *,
    as_turn: bool = False,
    kept: keeping.Prepared | None = None,
) -> Execution:
    """Commits the staged memory, the execution's `output` (made from the records as
    committed) and its transcript together. `as_turn` (an ingest in a session): the
    execution is counted as the session's next turn, and keeps `kept` as that turn's history,
    in the same transaction (H5). A review's records (`context.review_written`) that a record
    committed meanwhile says word for word are dropped first, as a turn's are."""
    context = run.context
    execution = run.execution
    async with context.state.pool.acquire() as conn, conn.transaction():
        await turns.check_authority(conn, context)
        await turns._lock_session(conn, execution, exclusive=True)  # before the memory rows
        restated = await turns._drop_restated(conn, context)
        written = await context.work.commit(conn) if context.work is not None else []
        if key is not None:
            await key.record(conn, {"executionId": str(execution.execution_id)})
        turn = None
        if as_turn and execution.session_id is not None:
            turn = await store.count_turn(
                conn, execution.account_id, execution.action_id, execution.session_id
            )
            if kept is not None:
                await turns.keep_history(conn, execution, turn, kept)
        if restated is not None:  # the last step before the commit: a failed one drops nothing
            context.transcript.add(events.MEMORY_REVIEW_DROPPED, restated)
        row = await turns._finish(
            conn, context, status="SUCCEEDED", output=output(written), error=None, turn=turn
        )
    context.transcript.written = len(context.transcript.events)
    turns.committed(context.state, execution, len(written), kept if turn is not None else None)
    run.ended = Execution.of(row)
    return run.ended


async def _refused(run: _Run, message: str) -> Execution:
    """Ends a call its tool refused: FAILED with the tool's message; nothing was changed."""
    context = run.context
    if context.work is not None:
        await context.work.discard()
    async with context.state.pool.acquire() as conn, conn.transaction():
        row = await turns._finish(
            conn, context, status="FAILED", output=None, error=message, turn=None
        )
    context.transcript.written = len(context.transcript.events)
    return Execution.of(row)


async def _failed(run: _Run, error: BaseException) -> Execution:
    """As a turn fails: the transcript kept, the staged memory dropped, even when cancelled.

    A failure the database refuses to record (a full disk, a constraint) is logged, and the
    call is answered FAILED all the same, with its own failure and what became of its record:
    the execution stays RUNNING until this process's liveness sweep, which fails the
    executions it no longer runs, ends it (app/runtime/liveness.py). Its database error,
    raised in the failure's place, reached an MCP client in the database's words, and a
    GraphQL one as INTERNAL."""
    recording = asyncio.ensure_future(turns._fail(run.context, error))
    if not isinstance(error, Exception):
        run.ended = await turns.recorded_or_logged(recording, run.execution)
        raise error
    try:
        run.ended = await turns.outlast(recording)
        return run.ended
    except turns.TurnEnded:
        raise
    except Exception as lost:
        execution = run.execution
        turns._log_lost(lost, "its failure could not be recorded", execution)
        within = 2 * run.context.state.settings.turn_heartbeat_seconds
        failure = turns._failure_message(error, execution.kind)
        said = (
            f"{failure} (its failure could not be recorded, logged by the service: execution "
            f"{execution.execution_id} shows RUNNING until the service "
            f"ends it FAILED, within about {within:g} s of the database taking writes again)"
        )
        run.ended = dataclasses.replace(execution, status="FAILED", error=storable(said))
        return run.ended


# MCP tool calls


@dataclass(frozen=True)
class ToolOutcome:
    execution: Execution
    content: str  # what the client reads: the tool's output or its error, as JSON
    is_error: bool
    remembered: "Remembered | None" = None


async def call_tool(
    state: AppState,
    caller: Caller,
    place: Place,
    client: ClientInfo,
    name: str,
    arguments: dict[str, Any],
    action: ActionVersion | None = None,
) -> ToolOutcome:
    """Runs one tool call of a client over MCP as an execution of kind MCP (INGEST for
    remember_conversation). A call of a tool offered without the grants it needs is refused
    (AccessDenied), and a name that is no tool (BadInput), before anything is recorded; a
    native tool the agent does not offer is the tool's refusal, recorded as a FAILED execution.
    `action`: the agent as `load_place` found it for this request, else it is looked up."""
    # Deeper than a model's may go, refused before anything walks them by recursion (making
    # them storable; the modern protocol's parser takes hundreds of levels).
    if nests_deeper(arguments, MAX_ARGUMENT_DEPTH):
        raise BadInput(
            f"the arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels; send flatter JSON"
        )
    # Python's JSON (the MCP SDK's) reads NaN, Infinity and 1e400, which no JSON column stores.
    # (Text is made storable, as the tools make a model's: only numbers are refused here.)
    check_json(storable_json(arguments), "the arguments", root="arguments")
    if action is None:
        action = await load_place(state, caller, place)
    offered = [t["function"]["name"] for t in offered_tools(state, action, place)]
    grants: tuple[Grant, ...] = ()
    if name in offered:
        pins = action.harness.memory.pinned_max_tokens is not None
        grants = tool_grants(name, arguments, pins)
        caller.require(*grants)
    elif name not in (*NATIVE_TOOLS, SEARCH_HISTORY, REMEMBER_CONVERSATION):
        raise BadInput(
            f"there is no tool named {shown(name)}; your tools are: {', '.join(offered) or 'none'}"
        )
    # else a native tool this agent does not offer: refused by the tool, as its model reads it;
    # remember_conversation, by remember_conversation (saying the agent's memory is off).
    if name == REMEMBER_CONVERSATION:
        return await _remember_over_mcp(state, caller, place, client, arguments)
    run = await _start(
        state,
        caller,
        action,
        place,
        kind="MCP",
        # As the tools read them: NUL and lone surrogates cannot be stored.
        input=storable_json({"tool": name, "arguments": arguments, "client": client.as_json()}),
        source="MCP",
        grants=turns.RUN_GRANTS + grants,
    )
    context = run.context
    async with liveness.running(state, run.execution):
        try:
            tools = turns.native_tools(
                state,
                action,
                context.transcript,
                context.work,
                history_scope(action, place),
                memory_text=redaction.may_read(caller),
            )
            call = ToolCall(
                id=f"mcp-{run.execution.execution_id}",
                name=name,
                arguments=json.dumps(arguments, ensure_ascii=False),
            )
            message = await tools.call(call)
            recorded = context.transcript.events[-1].data
            if recorded.get("callId") != call.id:  # an output use follows a search's execution
                recorded = context.transcript.events[-2].data
            if "error" in recorded:
                execution = await _refused(run, recorded["error"])
                return ToolOutcome(execution, message.content, True)
            execution = await _commit(run, lambda _: recorded.get("output"))
        except Exception as e:
            execution = await _failed(run, e)
            error = execution.error or "the call failed"
            return ToolOutcome(execution, json.dumps({"error": error}, ensure_ascii=False), True)
    return ToolOutcome(execution, message.content, False)


async def _remember_over_mcp(
    state: AppState,
    caller: Caller,
    place: Place,
    client: ClientInfo,
    arguments: dict[str, Any],
) -> ToolOutcome:
    extra = set(arguments) - {"messages", "idempotencyKey"}
    if extra:
        raise BadInput(
            f"unknown parameter {shown(sorted(extra)[0])}; the parameters are: messages, "
            "idempotencyKey"
        )
    raw = arguments.get("messages")
    if not isinstance(raw, list):
        raise BadInput("messages must be a list of {role, content, time} objects")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise BadInput(f"messages[{i}] must be an object with role, content and time")
        unknown = set(m) - {"role", "content", "time"}
        if unknown:
            raise BadInput(f"messages[{i}] has an unknown field {shown(sorted(unknown)[0])}")
        messages.append(RawMessage(m.get("role"), m.get("content"), m.get("time")))
    key = arguments.get("idempotencyKey")
    if key is not None and not isinstance(key, str):
        raise BadInput("idempotencyKey must be a string")
    done = await remember_conversation(
        state, caller, IngestRequest(place, messages, key), client=client
    )
    decisions = done.decisions
    if not redaction.may_read(caller):
        # As rememberConversation answers such a client: the decisions without their text (a
        # summary is the record's, a note may quote one), the records' IDs kept.
        hidden = ("summary", "note")
        decisions = [{k: None if k in hidden else v for k, v in d.items()} for d in decisions]
    output = {
        "executionId": str(done.execution.execution_id),
        "status": done.execution.status,
        "decisions": decisions,
        "memories": done.memories,
        "reviewedMessages": done.reviewed,
    }
    if done.execution.error:
        output["error"] = done.execution.error
    return ToolOutcome(
        done.execution,
        json.dumps(output, ensure_ascii=False),
        done.execution.status != "SUCCEEDED",
        done,
    )


# Conversation ingest


@dataclass(frozen=True)
class RawMessage:
    """A message as a client sends it; checked by `check_messages`."""

    role: Any
    content: Any
    time: Any = None


@dataclass(frozen=True)
class IngestRequest:
    place: Place
    messages: Sequence[RawMessage]
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Remembered:
    execution: Execution
    # What the review decided for each candidate: {candidate, action, summary, kind, memoryId,
    # targetId, note}; `summary` and `kind` are memory text.
    decisions: list[dict[str, Any]] = field(default_factory=list)
    memories: list[dict[str, Any]] = field(default_factory=list)  # the versions written
    # How many of the messages, from the first, the review read (all, unless it took its
    # MAX_CANDIDATES candidates before their end): 0 for an ingest that failed, None for one
    # an older release committed.
    reviewed: int | None = 0


def parse_time(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise BadInput(f"{where} needs a time zone offset, such as Z or +02:00")
        return value.astimezone(UTC)
    if not isinstance(value, str):
        raise BadInput(f"{where} must be an RFC 3339 time string")
    try:
        return rfc3339(value)
    except ValueError as e:
        raise BadInput(f"{where}: {e}; got {shown(value)}") from None


def check_messages(messages: Sequence[RawMessage]) -> list[tuple[str, str, datetime | None]]:
    """The messages as (role, content, time), or BadInput naming the first that is wrong."""
    if not 1 <= len(messages) <= MAX_MESSAGES:
        raise BadInput(f"messages must hold 1 to {MAX_MESSAGES} messages, not {len(messages)}")
    checked = []
    total = 0
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            raise BadInput(f"{where}.role must be one of {', '.join(ROLES)}, not {shown(m.role)}")
        if not isinstance(m.content, str) or not m.content.strip():
            raise BadInput(f"{where}.content must be non-empty text")
        check_storable(m.content, f"{where}.content")
        size = len(m.content.encode())
        if size > MAX_MESSAGE_BYTES:
            raise BadInput(
                f"{where}.content is {size} bytes; at most {MAX_MESSAGE_BYTES} are allowed: "
                "split it, or leave out what need not be remembered"
            )
        total += size
        if total > MAX_CONVERSATION_BYTES:
            raise BadInput(
                f"the messages hold more than {MAX_CONVERSATION_BYTES} bytes; send the "
                "conversation in several calls"
            )
        checked.append((m.role, m.content, parse_time(m.time, f"{where}.time")))
    return checked


def _request_key(caller: Caller, request: IngestRequest) -> Key | None:
    arguments = {
        "actionId": request.place.action_id,
        "sessionId": request.place.session_id,
        "preview": request.place.preview,
        "messages": [[m.role, m.content, m.time] for m in request.messages],
    }
    return key_for(request.idempotency_key, caller, "rememberConversation", arguments)


async def _answered(state: AppState, caller: Caller, key: Key) -> Remembered | None:
    """The ingest a key already answered with (its key is recorded only when it committed)."""
    execution = await turns.keyed_execution(state, caller, key)
    if execution is None:
        return None
    output = execution.output or {}
    return Remembered(
        execution,
        output.get("decisions", []),
        output.get("memories", []),
        output.get("reviewedMessages"),
    )


def _decisions(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The review's decisions, each with its candidate's summary and kind."""
    candidates = {c["handle"]: c for c in event.get("candidates", [])}
    found = []
    for d in event.get("decisions", []):
        candidate = candidates.get(d.get("candidate"), {})
        decision: dict[str, Any] = {
            "candidate": d.get("candidate"),
            "action": d.get("action"),
            "summary": candidate.get("summary"),
            "kind": candidate.get("kind"),
        }
        if d.get("memoryId"):
            decision["memoryId"] = d["memoryId"]
        if d.get("id"):
            decision["targetId"] = d["id"]
        note = d.get("refused") or d.get("ignored") or d.get("reason")
        if note:
            decision["note"] = note
        found.append(decision)
    return found


def _restated_skipped(
    decisions: list[dict[str, Any]], written: list[MemoryRecord]
) -> list[dict[str, Any]]:
    """The decisions as committed: an addition the commit dropped, because a record committed
    meanwhile says it word for word, is a skip (changed in place: the answer reads them)."""
    kept = {str(r.memory_id) for r in written}
    for d in decisions:
        if d["action"] == "add" and d.get("memoryId") and d["memoryId"] not in kept:
            d.update(action="skip", note="duplicate: another turn committed it meanwhile")
            del d["memoryId"]
    return decisions


async def _kept_history(run: _Run, messages: list[tuple[str, str]]) -> keeping.Prepared | None:
    """What an ingest keeps in its session's history, embedded before its commit (None: the
    agent keeps no history, or the ingest has no session)."""
    context = run.context
    history = context.action.harness.history
    if history is None or run.execution.session_id is None:
        return None
    assert context.state.embedder is not None
    prepared = await keeping.embed(
        context.state.embedder, keeping.ingested_events(messages, history.index)
    )
    if prepared.embed_tokens:
        context.transcript.embedding(context.state.embedder.name, prepared.embed_tokens, "history")
    return prepared


@asynccontextmanager
async def _counted_ingest(state: AppState, run: _Run) -> AsyncIterator[None]:
    """While an ingest runs (`liveness.running`); counted once as it ends, as a turn is
    (`turns._attempt`): one whose end was not recorded (cancelled, swept, its failure's record
    lost) as FAILED, and one that lost its key to a request that answers for it by its own."""
    try:
        async with liveness.running(state, run.execution):
            yield
    finally:
        metrics.current().turn(run.ended.status if run.ended else "FAILED", kind="INGEST")


async def remember_conversation(
    state: AppState, caller: Caller, request: IngestRequest, client: ClientInfo | None = None
) -> Remembered:
    """Runs the memory review over a conversation handed in, as an execution of kind INGEST
    whose records have source EXTRACTION. In a session it counts as the session's next turn,
    and when the agent keeps history its messages are kept as that turn's (so a later turn's
    search_history finds them), only when it commits. A retry with the same idempotency key
    answers with the first ingest that committed, and writes nothing."""
    caller.require(*turns.RUN_GRANTS)
    messages = check_messages(request.messages)
    key = _request_key(caller, request)
    if key is not None and (answered := await _answered(state, caller, key)) is not None:
        return answered
    action = await load_place(state, caller, request.place)
    if not action.harness.memory.enabled:
        raise BadInput(
            f"action {action.action_id} has no long-term memory (harness.memory.enabled is "
            "false), so there is nothing to remember the conversation into"
        )
    check_endpoint(action.model, state.settings, action.account_id)
    # Before anything is written: refused, the review leaves nothing behind.
    async with fairness.turn():
        now = datetime.now(UTC)
        run = await _start(
            state,
            caller,
            action,
            request.place,
            kind="INGEST",
            input={
                "messages": [
                    {"role": role, "content": content, "time": (time or now).isoformat()}
                    for role, content, time in messages
                ],
                "client": (client or ClientInfo(caller.principal)).as_json(),
            },
            source="EXTRACTION",
        )
        context = run.context
        execution = run.execution
        async with _counted_ingest(state, run):
            try:
                review = conversation_review.Review(context, turns.model_client(state))
                said = [
                    conversation_review.Message(
                        role, text, time or now, execution.execution_id, None
                    )
                    for role, text, time in messages
                ]
                # The review is the ingest's work: cut at the deadline, the ingest fails.
                timed_out = (
                    "the conversation's review did not end within "
                    f"{deadline.bound(state.settings)}: it was stopped, and nothing of it was "
                    "kept; send the conversation again, in smaller parts, or raise the setting"
                )
                async with deadline.within(context.deadline, timed_out):
                    staged = await review.run(said)
                review.event["written"] = versions(staged)
                if staged:
                    context.review_written = ((0, 0, 0), review.event["written"])
                context.transcript.add(events.MEMORY_REVIEW, review.event)
                decisions = _decisions(review.event)
                reviewed = review.read.get(execution.execution_id, 0)
                unembedded = (
                    "the conversation's history was not embedded within "
                    f"{deadline.bound(state.settings)}: it was stopped, and nothing of it was "
                    "kept; send the conversation again, or raise the setting"
                )
                said_text = [(role, text) for role, text, _ in messages]
                async with deadline.within(context.deadline, unembedded):  # as the review
                    kept = await _kept_history(run, said_text)
                execution = await _commit(
                    run,
                    lambda written: {
                        "decisions": _restated_skipped(decisions, written),
                        "memories": versions(written),
                        "reviewedMessages": reviewed,
                    },
                    key,
                    as_turn=True,
                    kept=kept,
                )
            except (Duplicate, Conflict) as e:
                # A concurrent request with the same key committed first: its key, or a record
                # its review replaced or deleted that this one's did too. This one keeps
                # nothing, and answers as that one did (the key's promise), not with the refusal.
                answered = None if key is None else await _answered(state, caller, key)
                if answered is None:
                    lost = key.lost() if key is not None and isinstance(e, Duplicate) else e
                    return Remembered(await _failed(run, lost))
                await _failed(
                    run,
                    Conflict("another request with the same idempotencyKey remembered it first"),
                )
                return answered
            except BaseException as e:  # a cancellation too: recorded, then raised again
                return Remembered(await _failed(run, e))
        output = execution.output or {}
        return Remembered(execution, decisions, output.get("memories", []), reviewed)
