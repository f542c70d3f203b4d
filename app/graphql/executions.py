"""GraphQL types and operations for executions (of every kind: turns, MCP tool calls, ingests,
operator writes, erasures) and sessions: `execution`, `executeAction` and `eraseSession`."""

from enum import Enum
from typing import Annotated
from uuid import UUID

import strawberry

from app.db import cursors
from app.db.cursors import Keyset
from app.errors import BadInput
from app.executions import service as executions
from app.executions.service import (
    Execution,
    ExecutionPage,
    Session,
    SessionPage,
    TranscriptEvent,
    TranscriptPage,
)
from app.graphql.context import Info, batch_loader, batch_pages
from app.graphql.enums import graphql_enum
from app.graphql.history import SessionHistoryFields
from app.graphql.node import node_type
from app.graphql.relay import (
    AFTER,
    CREATED_ID,
    FIRST,
    Connection,
    Node,
    global_id,
    keyset_connection,
    parse_int4,
    parse_uuid,
)
from app.graphql.scalars import Timestamp, Value
from app.runtime import erase, redaction, turns

# Action is above this module (it lists executions): named lazily, read through its DataLoader.
# Not imported, even under TYPE_CHECKING (a circle, tests/test_layering.py): mypy cannot see it.
ACTION = Annotated["Action", strawberry.lazy("app.graphql.actions")]  # type: ignore[name-defined]  # noqa: F821
SESSIONS = Keyset(cursors.INSTANT, cursors.TEXT)  # (created, session_id)
TRANSCRIPT = Keyset(cursors.SEQUENCE)  # transcript sequences are PostgreSQL integers


@graphql_enum("Where an execution is.")
class ActionExecutionStatus(Enum):
    RUNNING = (
        "Under way. A turn whose process dies is failed by another process once its heartbeat is "
        "older than ENGRAM_TURN_LEASE_SECONDS."
    )
    SUCCEEDED = "Committed: its memory, output and transcript together."
    FAILED = (
        "Failed: only its transcript is kept, and `error` says what to change; retry it with its "
        "executionId."
    )


@graphql_enum("What an execution is.")
class ActionExecutionKind(Enum):
    TURN = "A turn of an agent (executeAction)."
    OPERATOR = "An operator's memory write (addAgentMemory, deleteAgentMemory)."
    MCP = "One tool call of a client over MCP (/mcp/{actionId})."
    INGEST = "A conversation handed in for review (rememberConversation)."
    ERASE = "A session's words erased for good (eraseSession)."


@strawberry.type(
    description="One event of a turn's transcript; `data` is JSON whose shape `type` names."
)
class ActionExecutionEvent(Node):
    action_id: UUID = strawberry.field(description="The agent whose execution it is of.")
    execution_id: UUID = strawberry.field(description="The execution it is of.")
    sequence: int = strawberry.field(
        description="Its place in the execution's transcript, across invocations."
    )
    invocation_number: int = strawberry.field(description="The invocation that wrote it.")
    type: str = strawberry.field(
        description="What happened, such as model.call, tool.execution or memory.pinned."
    )
    data: Value = strawberry.field(description="The event's JSON, shaped by its `type`.")
    created: Timestamp = strawberry.field(description="When it happened.")

    @classmethod
    def of(cls, e: TranscriptEvent, reads_memory: bool) -> "ActionExecutionEvent":
        """`reads_memory`: whether the reader may read the agent's memory records."""
        return cls(
            id=global_id("ActionExecutionEvent", e.action_id, e.execution_id, e.sequence),
            action_id=e.action_id,
            execution_id=e.execution_id,
            sequence=e.sequence,
            invocation_number=e.invocation_number,
            type=e.type,
            data=Value(e.data if reads_memory else redaction.event_data(e.type, e.data)),
            created=Timestamp(e.created),
        )


async def list_executions(
    info: Info, action_id: UUID, session_id: str | None, first: int, after: str | None
) -> Connection["ActionExecution"]:
    """A session's executions (or, with `session_id` None, the agent's), read with the other
    pages of executions this request's resolvers ask for (one query per kind)."""
    return await keyset_connection(
        first,
        after,
        CREATED_ID.bound("executions", info.context.caller.account_id, action_id, session_id),
        lambda keyset, limit: info.context.load(
            "ActionExecution pages",
            ExecutionPage(action_id, session_id, keyset, limit),
        ),
        lambda e: (e.created, e.execution_id),
        ActionExecution.of,
    )


@strawberry.type(
    description="An execution: one turn of an agent (retried as its next invocations), an "
    "operator's memory write, a client's tool call over MCP, a conversation handed in with "
    "rememberConversation, or a session's erasure."
)
class ActionExecution(Node):
    record: strawberry.Private[Execution]
    execution_id: UUID = strawberry.field(description="Unique identifier of the execution.")
    action_id: UUID = strawberry.field(description="The agent it ran for.")
    action_version: int = strawberry.field(description="The agent version that ran it.")
    session_id: str | None = strawberry.field(
        description="Its session; null for an agent without sessions."
    )
    turn: int | None = strawberry.field(
        description=(
            "The turn's number in its session, from 1; null without a session. Given as the "
            "turn starts and settled as it commits: a turn that failed keeps the number it "
            "started with, which the session's next committed turn holds too."
        )
    )
    invocation_number: int = strawberry.field(
        description="Its latest invocation: 1, and one more for each retry."
    )
    status: ActionExecutionStatus = strawberry.field(description="RUNNING, SUCCEEDED or FAILED.")
    preview: bool = strawberry.field(
        description="Whether it ran in preview mode: what it wrote only preview turns see."
    )
    error: str | None = strawberry.field(
        description="Why it failed, saying what to change; null unless FAILED."
    )
    created: Timestamp = strawberry.field(description="When it started.")
    modified: Timestamp = strawberry.field(description="When it last changed (its end).")
    kind: ActionExecutionKind = strawberry.field(
        description="TURN (an agent's turn), OPERATOR (an operator's memory write), ERASE "
        "(eraseSession), MCP (a client's tool call over MCP) or INGEST (rememberConversation)."
    )
    principal: str = strawberry.field(description="Who started it.")
    token_id: UUID | None = strawberry.field(
        description="The `tokenId` of the token the request that started it sent (it may since "
        "have been revoked; a retry's token is not recorded): executions(tokenId) lists what "
        "one token started. Always a token of a client of its own account, so a client outside "
        "the default account never reads one of the operator's. Null for what an `engram` "
        "command did and for executions started before tokens were recorded (migration 0042)."
    )
    replay_of: UUID | None = strawberry.field(
        description="A replay: the committed turn whose input it re-ran."
    )

    @classmethod
    def of(cls, e: Execution) -> "ActionExecution":
        return cls(
            id=global_id("ActionExecution", e.action_id, e.execution_id),
            record=e,
            execution_id=e.execution_id,
            action_id=e.action_id,
            action_version=e.action_version,
            session_id=e.session_id,
            turn=e.turn,
            invocation_number=e.invocation_number,
            kind=ActionExecutionKind(e.kind),
            status=ActionExecutionStatus(e.status),
            preview=e.preview,
            error=e.error,
            created=Timestamp(e.created),
            modified=Timestamp(e.modified),
            principal=e.principal,
            token_id=e.token_id,
            replay_of=e.replay_of,
        )

    @strawberry.field(
        description="What the execution was asked. Memory records in it show only their ID and "
        "version unless you may read the agent's memory."
    )
    def input(self, info: Info) -> Value:
        return Value(_memory_view(info, self.record.input))

    @strawberry.field(
        description="What the execution answered; null unless it succeeded. Memory records in it "
        "show only their ID and version unless you may read the agent's memory."
    )
    def output(self, info: Info) -> Value | None:
        if self.record.output is None:
            return None
        return Value(_memory_view(info, self.record.output))

    @strawberry.field(description="The agent at the version that ran this execution.")
    async def action(self, info: Info) -> ACTION | None:
        return await info.context.load("Action", (self.action_id, self.action_version))

    @strawberry.field(
        description="The session the turn belongs to; null for an agent without sessions."
    )
    async def session(self, info: Info) -> "ActionSession | None":
        if self.session_id is None:
            return None
        return await info.context.load("ActionSession", (self.action_id, self.session_id))

    @strawberry.field(
        description="The turn's events in order, every invocation's, failed attempts included. "
        "Memory records in them show only their ID and version, and memory tools' arguments no "
        "record text, unless you may read the agent's memory."
    )
    async def transcript(
        self, info: Info, first: FIRST, after: AFTER = None
    ) -> Connection[ActionExecutionEvent]:
        reads_memory = redaction.may_read(info.context.caller)
        return await keyset_connection(
            first,
            after,
            TRANSCRIPT.bound(
                "ActionExecution.transcript", info.context.caller.account_id, self.execution_id
            ),
            lambda sequence, limit: info.context.load(
                "ActionExecution.transcript",
                TranscriptPage(
                    self.action_id, self.execution_id, sequence[0] if sequence else None, limit
                ),
            ),
            lambda e: (e.sequence,),
            lambda e: ActionExecutionEvent.of(e, reads_memory),
        )


@strawberry.type(
    description="A session of an agent: the turns that share its context, its session-scoped "
    "memory and its history."
)
class ActionSession(SessionHistoryFields, Node):
    record: strawberry.Private[Session]
    session_id: str = strawberry.field(
        description="The session's ID, as executeAction's `sessionId` names it."
    )
    action_id: UUID = strawberry.field(description="The agent it belongs to.")
    turns: int = strawberry.field(
        description="How many turns it has committed (a conversation ingested into it with "
        "rememberConversation counts as one)."
    )
    created: Timestamp = strawberry.field(description="When its first turn started.")
    modified: Timestamp = strawberry.field(description="When it last changed.")

    @classmethod
    def of(cls, s: Session) -> "ActionSession":
        return cls(
            id=global_id("ActionSession", s.action_id, s.session_id),
            record=s,
            session_id=s.session_id,
            action_id=s.action_id,
            turns=s.turns,
            created=Timestamp(s.created),
            modified=Timestamp(s.modified),
        )

    @strawberry.field(description="The session's executions, newest first.")
    async def executions(
        self, info: Info, first: FIRST, after: AFTER = None
    ) -> Connection[ActionExecution]:
        return await list_executions(info, self.action_id, self.session_id, first, after)


@strawberry.type
class ActionExecutionFields:
    """Fields of `Action` about its turns (Action inherits them)."""

    @strawberry.field(description="The agent's sessions, newest first.")
    async def sessions(
        self, info: Info, first: FIRST, after: AFTER = None
    ) -> Connection[ActionSession]:
        return await keyset_connection(
            first,
            after,
            SESSIONS.bound(
                "Action.sessions",
                info.context.caller.account_id,
                self.action_id,  # type: ignore[attr-defined]
            ),
            lambda keyset, limit: info.context.load(
                "Action.sessions",
                SessionPage(self.action_id, keyset, limit),  # type: ignore[attr-defined]
            ),
            lambda s: (s.created, s.session_id),
            ActionSession.of,
        )

    @strawberry.field(description="The agent's executions, of every session or none, newest first.")
    async def executions(
        self, info: Info, first: FIRST, after: AFTER = None
    ) -> Connection[ActionExecution]:
        return await list_executions(info, self.action_id, None, first, after)  # type: ignore[attr-defined]


def _memory_view(info: Info, value: object) -> object:
    """An execution's input or output as the caller may see it (app/runtime/redaction.py)."""
    if redaction.may_read(info.context.caller):
        return value
    return redaction.execution_value(value)


batch_loader("ActionExecution", executions.get_executions, ActionExecution.of)
batch_loader("ActionSession", executions.get_sessions, ActionSession.of)
batch_pages("ActionExecution.transcript", executions.list_transcript_pages)
# Transcript events by ID, for node(id) and nodes(ids): those of one request in one query.
batch_loader("ActionExecutionEvent", executions.get_transcript_events, lambda event: event)
batch_pages("Action.sessions", executions.list_session_pages)
# ActionSession.executions and Action.executions: one loader, one query per kind of page.
batch_pages("ActionExecution pages", executions.list_execution_pages)


def _key(parts: list[str], type_name: str) -> tuple[str, str]:
    # PostgreSQL text cannot hold NUL: such a key names nothing, and must not reach the driver.
    if len(parts) != 2 or any("\x00" in p for p in parts):
        raise BadInput(f"not a global ID of an {type_name}: it must come from that object's `id`")
    return parts[0], parts[1]


def _execution_key(parts: list[str]) -> tuple[UUID, UUID]:
    action_id, execution_id = _key(parts, "ActionExecution")
    return parse_uuid(action_id), parse_uuid(execution_id)


def _session_key(parts: list[str]) -> tuple[UUID, str]:
    action_id, session_id = _key(parts, "ActionSession")
    return parse_uuid(action_id), session_id


def _event_key(parts: list[str]) -> tuple[UUID, UUID, int]:
    sequence = parse_int4(parts[2]) if len(parts) == 3 else None
    if sequence is None:
        raise BadInput(
            "an ActionExecutionEvent ID names an agent, an execution and a sequence: it must "
            "come from that event's `id`"
        )
    return parse_uuid(parts[0]), parse_uuid(parts[1]), sequence


@node_type("ActionExecution", _execution_key)
async def _execution_node(info: Info, key: tuple[UUID, UUID]) -> ActionExecution | None:
    return await info.context.load("ActionExecution", key)


@node_type("ActionSession", _session_key)
async def _session_node(info: Info, key: tuple[UUID, str]) -> ActionSession | None:
    return await info.context.load("ActionSession", key)


@node_type("ActionExecutionEvent", _event_key)
async def _event_node(info: Info, key: tuple[UUID, UUID, int]) -> ActionExecutionEvent | None:
    # As the transcript lists it: once its attempt has ended, reduced for a reader who may not
    # read the agent's memory.
    found = await info.context.load("ActionExecutionEvent", key)
    if found is None:
        return None
    return ActionExecutionEvent.of(found, redaction.may_read(info.context.caller))


@strawberry.type
class ExecutionQuery:
    @strawberry.field(description="One execution (a turn, or an operator's write); null if none.")
    async def execution(
        self,
        info: Info,
        execution_id: Annotated[
            UUID, strawberry.argument(description="The execution's `executionId`.")
        ],
    ) -> ActionExecution | None:
        found = await executions.get_execution(
            info.context.pool, info.context.caller, execution_id=execution_id
        )
        return ActionExecution.of(found) if found else None

    @strawberry.field(
        description="The executions that requests sending the token `tokenId` started (turns, "
        "MCP tool calls, ingests, memory writes, erasures), in every agent of the caller's "
        "account, newest first. After a leak, executions(tokenId: leaked) lists what the leaked "
        "token ran; the memory records each wrote name it as their `executionId`. Only tokens "
        "of the account's own clients are found (`tokenId` of ActionExecution). Needs SELECT "
        "on financial.ActionExecution.indexes.created and financial.ActionExecution.document, "
        "as an agent's executions do."
    )
    async def executions(
        self,
        info: Info,
        token_id: Annotated[
            UUID,
            strawberry.argument(
                description="The `tokenId` of the token (a leaked one), revoked or not."
            ),
        ],
        first: FIRST,
        after: AFTER = None,
    ) -> Connection[ActionExecution]:
        caller = info.context.caller
        async with info.context.reads():
            return await keyset_connection(
                first,
                after,
                CREATED_ID.bound("executions(tokenId)", caller.account_id, token_id),
                lambda keyset, limit: executions.list_token_executions(
                    info.context.pool, caller, token_id=token_id, after=keyset, limit=limit
                ),
                lambda e: (e.created, e.execution_id),
                ActionExecution.of,
            )


@strawberry.input(description="A turn to run, retry or replay.")
class ExecuteActionInput:
    action_id: UUID = strawberry.field(description="The agent (action) to run.")
    session_id: str | None = strawberry.field(
        default=None, description="The session of the turn; omit it for an agent without sessions."
    )
    input: Value | None = strawberry.field(
        default=None, description="The message (a string) or value the turn answers."
    )
    preview: bool = strawberry.field(
        default=False, description="Run in preview mode: what the turn writes is preview only."
    )
    execution_id: UUID | None = strawberry.field(
        default=None, description="Retry this FAILED execution as its next invocation."
    )
    idempotency_key: str | None = strawberry.field(
        default=None,
        description="Sent again with the same arguments (after a lost answer), returns the "
        "execution the first request started instead of running another turn; the same key with "
        "other arguments is CONFLICT. Scoped to the caller and kept at least 24 hours.",
    )
    replay_of: UUID | None = strawberry.field(
        default=None,
        description="Replay this committed turn: its input, run by the agent's current version "
        "as a new preview execution that names it; its search_history sees only what the "
        "original's did. Not with executionId.",
    )


@strawberry.type(description="What eraseSession erased, and the memory it left.")
class EraseSessionResult:
    execution: ActionExecution = strawberry.field(
        description="The ERASE execution that records the erasure and who asked."
    )
    erased_events: int = strawberry.field(description="History events erased, with their parts.")
    erased_executions: int = strawberry.field(
        description="Executions whose input and output text was replaced by a marker."
    )
    erased_transcript_events: int = strawberry.field(
        description="Transcript events whose text was replaced by a marker."
    )
    live_memory_ids: list[UUID] = strawberry.field(
        description="The session's live memory records, left to deleteAgentMemory."
    )


@strawberry.type
class ExecutionMutation:
    @strawberry.mutation(
        description="Runs one turn of the agent's current version (or retries a failed one). "
        "A turn that fails returns its execution with status FAILED and its error."
    )
    async def execute_action(
        self,
        info: Info,
        input: Annotated[ExecuteActionInput, strawberry.argument(description="The turn.")],
    ) -> ActionExecution:
        executed = await turns.execute_turn(
            info.context.state,
            info.context.caller,
            turns.TurnRequest(
                action_id=input.action_id,
                session_id=input.session_id,
                input=input.input,
                preview=input.preview,
                execution_id=input.execution_id,
                idempotency_key=input.idempotency_key,
                replay_of=input.replay_of,
            ),
        )
        return ActionExecution.of(executed)

    @strawberry.mutation(
        description="Erases for good what a session said: its history events, parts and vectors, "
        "its summary, and the text of its executions' inputs, outputs and transcripts (replaced "
        "by a marker). Memory records are left to deleteAgentMemory: the answer lists the "
        "session's live ones. Needs DELETE on financial.ActionExecution.document; recorded as "
        "an execution of kind ERASE naming who asked."
    )
    async def erase_session(
        self,
        info: Info,
        action_id: Annotated[UUID, strawberry.argument(description="The session's agent.")],
        session_id: Annotated[str, strawberry.argument(description="The session's ID.")],
    ) -> EraseSessionResult:
        erased = await erase.erase_session(
            info.context.pool, info.context.caller, action_id, session_id
        )
        return EraseSessionResult(
            execution=ActionExecution.of(erased.execution),
            erased_events=erased.events,
            erased_executions=erased.executions,
            erased_transcript_events=erased.transcript_events,
            live_memory_ids=erased.memory_ids,
        )
