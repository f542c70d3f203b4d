"""GraphQL types for a session's history: its kept events, listed and searched by operators."""

from enum import Enum
from typing import Annotated
from uuid import UUID

import strawberry

from app.db import cursors
from app.db.cursors import Keyset
from app.errors import BadInput
from app.graphql.context import Info, batch_loader, batch_pages
from app.graphql.enums import graphql_enum
from app.graphql.node import node_type
from app.graphql.relay import (
    AFTER,
    FIRST,
    Connection,
    Node,
    global_id,
    keyset_connection,
    parse_uuid,
)
from app.graphql.scalars import Timestamp, Value
from app.history import service
from app.history.search import MAX_LIMIT, Event
from app.history.service import EventPage
from app.runtime import redaction


@graphql_enum("Who a kept event is from.")
class ActionHistoryWho(Enum):
    USER = ("user", "The turn's input, as the agent received it.")
    AGENT = ("agent", "A reply of the agent, with the tools it called.")
    TOOL = ("tool", "A tool's result or error (kept with index: messages_and_tools).")


@strawberry.type(
    description="One event a committed turn kept in its session's history: the user's message, "
    "a reply of the agent with the tools it called, or a tool's result or error."
)
class ActionHistoryEvent(Node):
    event_id: UUID = strawberry.field(description="Unique identifier of the event.")
    action_id: UUID = strawberry.field(description="The agent whose session kept it.")
    session_id: str = strawberry.field(description="The session that kept it.")
    turn: int = strawberry.field(description="The turn that said it, in its session.")
    execution_id: UUID = strawberry.field(description="The execution it came from.")
    invocation_number: int = strawberry.field(description="The invocation it came from.")
    sequence: int = strawberry.field(
        description="The transcript event it came from, in its execution (a message of an "
        "ingested conversation: its place among the messages, from 1)."
    )
    who: ActionHistoryWho = strawberry.field(description="Who it is from.")
    call_id: str | None = strawberry.field(description="A tool result's call.")
    tool: str | None = strawberry.field(description="A tool result's tool.")
    header: str = strawberry.field(description="Who it is from, in its turn: `turn 12, user`.")
    text: str = strawberry.field(description="What it said, after its header line.")
    data: Value = strawberry.field(
        description="The event as JSON: a message's content, a reply's tool calls, a tool's result."
    )
    parts: int = strawberry.field(
        description="How many parts it is kept in (long events are kept in parts)."
    )
    preview: bool = strawberry.field(
        description="Whether a turn in preview mode kept it: live turns never find it."
    )
    created: Timestamp = strawberry.field(description="When its turn kept it.")

    @classmethod
    def of(cls, action_id: UUID, e: Event) -> "ActionHistoryEvent":
        return cls(
            id=global_id("ActionHistoryEvent", action_id, e.session_id, e.event_id),
            event_id=e.event_id,
            action_id=action_id,
            session_id=e.session_id,
            turn=e.turn,
            execution_id=e.execution_id,
            invocation_number=e.invocation_number,
            sequence=e.sequence,
            who=ActionHistoryWho(e.who),
            call_id=e.call_id,
            tool=e.tool,
            header=e.header,
            text=e.text,
            data=Value(e.data),
            parts=e.parts,
            preview=e.preview,
            created=Timestamp(e.created),
        )


@strawberry.type(description="One part of a kept event that matched a history search.")
class ActionHistorySearchResult:
    event: ActionHistoryEvent = strawberry.field(description="The whole event.")
    part: int = strawberry.field(description="Which of its `parts` matched, from 1.")
    score: float = strawberry.field(
        description="How well it matched (higher is better), ranked as memory search ranks."
    )
    text: str = strawberry.field(description="The part's text.")


def shown(info: Info, event: Event) -> Event:
    """The event as the caller may see it: without the memory grants, a memory tool's
    arguments and the records its result names are reduced as in transcripts."""
    if redaction.may_read(info.context.caller):
        return event
    return redaction.history_event(event)


CONVERSATION = Keyset(cursors.INT4, cursors.INT4)  # (turn, sequence)


@strawberry.type
class SessionHistoryFields:
    """Fields of `ActionSession` about its history (ActionSession inherits them)."""

    @strawberry.field(
        description="The session's kept history, in conversation order (turn, then sequence). "
        "Needs SELECT on financial.ActionExecution.transcript; memory record text shows only "
        "with the memory read grants, as in transcripts."
    )
    async def history(
        self, info: Info, first: FIRST, after: AFTER = None
    ) -> Connection[ActionHistoryEvent]:
        action_id, session_id = self.action_id, self.session_id  # type: ignore[attr-defined]
        return await keyset_connection(
            first,
            after,
            CONVERSATION.bound(
                "ActionSession.history", info.context.caller.account_id, action_id, session_id
            ),
            lambda position, limit: info.context.load(
                "ActionSession.history",
                EventPage(action_id, session_id, position, limit),
            ),
            lambda e: (e.turn, e.sequence),
            lambda e: ActionHistoryEvent.of(action_id, shown(info, e)),
        )

    @strawberry.field(
        description="The parts of the session's kept events that best match `query`, by meaning, "
        "words and recency, as the agent's search_history ranks them (every turn, live and "
        "preview). Grants as `history`; without the memory read grants, what holds memory record "
        "text (a memory tool's result, an agent message's call of one) is not ranked: such a "
        "message is found by its own words, its call shown without the record text."
    )
    async def search_history(
        self,
        info: Info,
        query: Annotated[str, strawberry.argument(description="What to find, in words.")],
        first: Annotated[
            int, strawberry.argument(description=f"How many parts to return, 1 to {MAX_LIMIT}.")
        ] = 10,
    ) -> list[ActionHistorySearchResult]:
        if not 1 <= first <= MAX_LIMIT:
            raise BadInput(f"`first` must be from 1 to {MAX_LIMIT}, got {first}")
        action_id, session_id = self.action_id, self.session_id  # type: ignore[attr-defined]
        async with info.context.searching:
            found = await service.search_events(
                info.context.pool,
                info.context.embedder,
                info.context.caller,
                action_id=action_id,
                session_id=session_id,
                query=query,
                limit=first,
                max_query_chars=info.context.state.settings.max_search_query_chars,
                # Without the memory read grants, the parts that hold record text are left out of
                # the ranking (a score, or a short page, would tell that their words matched).
                hidden_tools=redaction.hidden_tools(info.context.caller),
            )
        results = []
        for e in found:
            visible = shown(info, e)
            results.append(
                ActionHistorySearchResult(
                    event=ActionHistoryEvent.of(action_id, visible),
                    part=e.part or 1,
                    score=float(e.score or 0.0),
                    text=visible.part_text or visible.text,
                )
            )
        return results


batch_pages("ActionSession.history", service.list_event_pages)


# Events by ID, for node(id) and nodes(ids): those of one request in one query.
batch_loader("ActionHistoryEvent", service.get_events, lambda event: event)


def _event_key(parts: list[str]) -> tuple[UUID, str, UUID]:
    if len(parts) != 3 or any("\x00" in p for p in parts):
        raise BadInput("not a global ID of an ActionHistoryEvent: it must come from its `id`")
    return parse_uuid(parts[0]), parts[1], parse_uuid(parts[2])


@node_type("ActionHistoryEvent", _event_key)
async def _event_node(info: Info, key: tuple[UUID, str, UUID]) -> ActionHistoryEvent | None:
    found = await info.context.load("ActionHistoryEvent", key)
    return ActionHistoryEvent.of(key[0], shown(info, found)) if found else None
