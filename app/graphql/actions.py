"""GraphQL types and operations for agents (actions) and their versions."""

from datetime import datetime
from typing import Any
from uuid import UUID

import strawberry
from strawberry.permission import BasePermission

from app.actions import service
from app.actions.service import ActionVersion
from app.errors import BadInput
from app.graphql.context import Info
from app.graphql.executions import ActionExecutionFields
from app.graphql.memory import ActionMemoryFields
from app.graphql.node import node_type
from app.graphql.relay import (
    Connection,
    Node,
    check_first,
    connection,
    decode_cursor,
    encode_cursor,
    global_id,
    parse_int4,
    parse_uuid,
)
from app.graphql.scalars import Timestamp, Value


@strawberry.input
class ActionInput:
    name: str
    instructions: str = ""
    model: Value | None = None
    harness: Value | None = None


class ActionDocument(BasePermission):
    """An action's document fields need SELECT on it, unless the caller just wrote it."""

    def has_permission(self, source: Any, info: Info, **kwargs: Any) -> bool:
        if not source.written:
            service.require_document(info.context.caller)  # raises AccessDenied
        return True


def _document() -> Any:
    return strawberry.field(permission_classes=[ActionDocument])


@strawberry.type
class Action(ActionExecutionFields, ActionMemoryFields, Node):
    account_id: strawberry.Private[UUID]
    record: strawberry.Private[ActionVersion]
    written: strawberry.Private[bool]  # returned by the mutation that wrote it
    action_id: UUID
    version: int
    current_version: int = _document()
    name: str = _document()
    instructions: str = _document()
    model: Value = _document()
    harness: Value = _document()
    created: Timestamp = _document()
    modified: Timestamp = _document()
    created_by: str = _document()

    @classmethod
    def of(cls, action: ActionVersion, *, written: bool = False) -> "Action":
        return cls(
            id=global_id("Action", action.action_id, action.version),
            account_id=action.account_id,
            record=action,
            written=written,
            action_id=action.action_id,
            version=action.version,
            current_version=action.current_version,
            name=action.name,
            instructions=action.instructions,
            model=Value(action.model_raw),
            harness=Value(action.harness.raw),
            created=Timestamp(action.created),
            modified=Timestamp(action.modified),
            created_by=action.created_by,
        )


async def load_action_version(info: Info, action_id: UUID, version: int) -> ActionVersion | None:
    return await service.get_action(info.context.pool, info.context.caller, action_id, version)


@node_type("Action")
async def _action_node(info: Info, parts: list[str]) -> Action | None:
    version = parse_int4(parts[1]) if len(parts) == 2 else None
    if version is None:
        raise BadInput("an Action ID names an action and a version")
    found = await service.get_action(
        info.context.pool, info.context.caller, parse_uuid(parts[0]), version
    )
    return Action.of(found) if found else None


@strawberry.type
class ActionQuery:
    @strawberry.field(description="An agent at its current version, or at `version`; null if none.")
    async def action(
        self, info: Info, action_id: UUID, version: int | None = None
    ) -> Action | None:
        found = await service.get_action(info.context.pool, info.context.caller, action_id, version)
        return Action.of(found) if found else None

    @strawberry.field(description="The account's agents, newest first.")
    async def actions(self, info: Info, first: int, after: str | None = None) -> Connection[Action]:
        check_first(first)
        cursor = decode_cursor(after, 2)
        if cursor is not None and not (
            isinstance(cursor[0], datetime) and isinstance(cursor[1], UUID)
        ):
            raise BadInput("`after` is not a cursor this connection issued")
        rows = await service.list_actions(
            info.context.pool,
            info.context.caller,
            first + 1,
            (cursor[0], cursor[1]) if cursor else None,
        )
        return connection(
            rows,
            first,
            lambda a: encode_cursor(a.created, a.action_id),
            Action.of,
            has_previous=after is not None,
        )


@strawberry.type
class ActionMutation:
    @strawberry.mutation
    async def create_action(self, info: Info, input: ActionInput) -> Action:
        created = await service.create_action(
            info.context.pool,
            info.context.caller,
            input.name,
            input.instructions,
            input.model,
            input.harness,
            settings=info.context.state.settings,
        )
        return Action.of(created, written=True)

    @strawberry.mutation(
        description="Writes the next version of an agent; old versions stay readable."
    )
    async def update_action(self, info: Info, action_id: UUID, input: ActionInput) -> Action:
        updated = await service.update_action(
            info.context.pool,
            info.context.caller,
            action_id,
            input.name,
            input.instructions,
            input.model,
            input.harness,
            settings=info.context.state.settings,
        )
        return Action.of(updated, written=True)
