"""`rememberConversation`: a conversation an agent had elsewhere, handed in for review."""

from enum import Enum
from typing import Annotated
from uuid import UUID

import strawberry

from app.graphql.context import Info
from app.graphql.enums import graphql_enum
from app.graphql.executions import ActionExecutionStatus
from app.graphql.memory import ActionAgentMemory
from app.graphql.scalars import Timestamp
from app.memory import operator
from app.runtime import calls, redaction
from app.runtime.review import MAX_CANDIDATES


@strawberry.input(description="One message of a conversation.")
class ConversationMessageInput:
    role: str = strawberry.field(description="user, assistant or tool (as in chat APIs).")
    content: str = strawberry.field(
        description=f"What was said, at most {calls.MAX_MESSAGE_BYTES} bytes."
    )
    time: str | None = strawberry.field(
        default=None,
        description="When it was said (RFC 3339, with an offset); default now. The review "
        "turns words like 'yesterday' into dates from it.",
    )


@strawberry.input(description="A conversation an agent had elsewhere, handed in for review.")
class RememberConversationInput:
    action_id: UUID = strawberry.field(description="The agent whose memory it informs.")
    session_id: str | None = strawberry.field(
        default=None, description="The session it belongs to; omit it for an agent without one."
    )
    messages: list[ConversationMessageInput] = strawberry.field(
        description=f"1 to {calls.MAX_MESSAGES} messages, oldest first."
    )
    preview: bool = strawberry.field(
        default=False, description="Preview mode: what the review writes is preview only."
    )
    idempotency_key: str | None = strawberry.field(
        default=None,
        description="Sent again with the same arguments, returns the first request's result "
        "and writes nothing new; the same key with other arguments is CONFLICT.",
    )


@graphql_enum("What the review did with a fact it found.")
class MemoryReviewAction(Enum):
    ADD = ("add", "Kept it as a new record.")
    REPLACE = ("replace", "Kept it as a record that replaces one it corrects.")
    DELETE = ("delete", "Deleted a record the conversation shows wrong.")
    SKIP = ("skip", "Kept nothing: a record already says it, or it is not worth keeping.")


@strawberry.type(description="What the review decided for one fact it found.")
class MemoryReviewDecision:
    candidate: str = strawberry.field(description="The fact's handle in the transcript.")
    action: MemoryReviewAction = strawberry.field(description="What the review did with it.")
    summary: str | None = strawberry.field(
        description="The fact, as one line; null without the grants that read memory."
    )
    kind: str | None = strawberry.field(
        description="The fact's kind, one of the agent's (a reader without the grants that read "
        "memory sees it too: a kind is the harness's, not the record's text)."
    )
    memory_id: UUID | None = strawberry.field(description="The record it added (add, replace).")
    target_id: UUID | None = strawberry.field(
        description="The record it replaced or deleted (replace, delete)."
    )
    note: str | None = strawberry.field(
        description="Why it was skipped or not applied; null without the grants that read memory."
    )


@strawberry.type(description="What rememberConversation did: its execution and its decisions.")
class RememberConversationResult:
    execution_id: UUID = strawberry.field(description="The execution (kind INGEST) that ran it.")
    status: ActionExecutionStatus = strawberry.field(
        description="SUCCEEDED when the review ran and its writes committed; FAILED otherwise, "
        "writing nothing."
    )
    error: str | None = strawberry.field(description="Why the review failed; null if it ran.")
    created: Timestamp = strawberry.field(description="When the execution started.")
    decisions: list[MemoryReviewDecision] = strawberry.field(
        description="One per fact the review found, in its order."
    )
    records: list[ActionAgentMemory] | None = strawberry.field(
        description="The record versions it wrote (added, superseded, deleted); null without "
        "SELECT on financial.AgentMemory.indexes.* and financial.AgentMemory.document."
    )
    reviewed_messages: int | None = strawberry.field(
        description="How many of the messages, from the first, the review read: all of them, "
        f"unless it took the {MAX_CANDIDATES} candidates a review takes before their end; "
        "then send the messages after these again, in another rememberConversation (no later "
        "review reads them). 0 when it failed; null for an ingest an older release ran."
    )


def _uuid(value: object) -> UUID | None:
    return UUID(str(value)) if value else None


@strawberry.type
class IngestMutation:
    @strawberry.mutation(
        description="Runs the memory review over a conversation the agent had elsewhere, as an "
        "execution of kind INGEST: what will matter later becomes records (source EXTRACTION), "
        "compared with what the agent remembers, so restated facts do not pile up and "
        "corrected ones replace the old record. Needs INSERT on "
        "financial.ActionExecution.document."
    )
    async def remember_conversation(
        self,
        info: Info,
        input: Annotated[
            RememberConversationInput,
            strawberry.argument(description="The agent, the session and the messages."),
        ],
    ) -> RememberConversationResult:
        state, caller = info.context.state, info.context.caller
        done = await calls.remember_conversation(
            state,
            caller,
            calls.IngestRequest(
                calls.Place(input.action_id, input.session_id, input.preview),
                [calls.RawMessage(m.role, m.content, m.time) for m in input.messages],
                input.idempotency_key,
            ),
        )
        reads = redaction.may_read(caller)
        records = None
        if reads:
            records = []
            for m in done.memories:
                found = await operator.get_memory(
                    state.pool,
                    caller,
                    action_id=input.action_id,
                    memory_id=UUID(m["id"]),
                    version=m["version"],
                )
                if found is not None:
                    records.append(ActionAgentMemory.of(found, exact_version=True))
        e = done.execution
        return RememberConversationResult(
            execution_id=e.execution_id,
            status=ActionExecutionStatus(e.status),
            error=e.error,
            created=Timestamp(e.created),
            decisions=[
                MemoryReviewDecision(
                    candidate=str(d.get("candidate")),
                    action=MemoryReviewAction(d["action"]),
                    summary=d.get("summary") if reads else None,
                    kind=d.get("kind"),
                    memory_id=_uuid(d.get("memoryId")),
                    target_id=_uuid(d.get("targetId")),
                    note=d.get("note") if reads else None,
                )
                for d in done.decisions
            ],
            records=records,
            reviewed_messages=done.reviewed,
        )
