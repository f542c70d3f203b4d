"""GraphQL types and operations for agents (actions) and their versions."""

from typing import Annotated, Any
from uuid import UUID

import strawberry
from strawberry.permission import BasePermission
from strawberry.types.base import get_object_definition
from strawberry.utils.str_converters import to_camel_case

from app.actions import service
from app.actions.service import ActionVersion
from app.errors import BadInput
from app.graphql.context import Context, Info, batch_loader
from app.graphql.executions import ActionExecutionFields
from app.graphql.memory import ActionMemoryFields
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


@strawberry.input(
    description="An agent's configuration: createAction writes its first version, updateAction "
    "the next."
)
class ActionInput:
    name: str = strawberry.field(description="The agent's name.")
    instructions: str = strawberry.field(
        default="", description="What the agent is told at the start of every turn."
    )
    model: Value | None = strawberry.field(
        default=None,
        description="The model it calls, as JSON (baseUrl, name, apiKeyEnv, contextTokens...; "
        "docs/harness.md); by default the deployment's ENGRAM_MODEL_* settings.",
    )
    harness: Value | None = strawberry.field(
        default=None,
        description="What the runtime gives it, as JSON: memory, history and their options "
        "(docs/harness.md lists every option).",
    )


ACTION_ID = Annotated[UUID, strawberry.argument(description="The agent's `actionId`.")]


class ActionDocument(BasePermission):
    """An action's document fields need SELECT on it, unless the caller just wrote it."""

    def has_permission(self, source: Any, info: Info, **kwargs: Any) -> bool:
        if not source.written:
            service.require_document(info.context.caller)  # raises AccessDenied
        return True

    def allows(self, source: Any, context: Context) -> bool:
        """has_permission's answer when it is yes, without an Info: a page's document fields
        are then read directly (app/graphql/field_completion.py); no sends them to
        has_permission."""
        return source.written or service.may_read_document(context.caller)


def _document(description: str) -> Any:
    return strawberry.field(permission_classes=[ActionDocument], description=description)


@strawberry.type(
    description="An agent (an action) at one version: its instructions, model and harness. "
    "Needs SELECT on financial.Action.document for its document fields."
)
class Action(ActionExecutionFields, ActionMemoryFields, Node):
    account_id: strawberry.Private[UUID]
    record: strawberry.Private[ActionVersion]
    written: strawberry.Private[bool]  # returned by the mutation that wrote it
    action_id: UUID = strawberry.field(description="Unique identifier of the agent.")
    version: int = strawberry.field(
        description="The version read: 1 when created, one more with each updateAction."
    )
    current_version: int = _document("The agent's latest version.")
    name: str = _document("The agent's name.")
    instructions: str = _document("What the agent is told at the start of every turn.")
    model: Value = _document(
        "The model it calls, as written (docs/harness.md); {} for the deployment's default."
    )
    harness: Value = _document(
        "What the runtime gives it (memory, history and their options), with every default "
        "filled in (docs/harness.md)."
    )
    created: Timestamp = _document("When the agent's first version was written.")
    modified: Timestamp = _document("When this version was written.")
    created_by: str = _document("The principal that wrote this version.")

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


batch_loader("Action", service.get_action_versions, Action.of)

# Action's fields that need SELECT on financial.Action.document (app/graphql/selection.py).
DOCUMENT_FIELDS: tuple[str, ...] = tuple(
    to_camel_case(f.python_name)
    for f in get_object_definition(Action, strict=True).fields
    if ActionDocument in f.permission_classes
)


def _action_key(parts: list[str]) -> tuple[UUID, int]:
    version = parse_int4(parts[1]) if len(parts) == 2 else None
    if version is None:
        raise BadInput("an Action ID names an action and a version")
    return parse_uuid(parts[0]), version


@node_type("Action", _action_key)
async def _action_node(info: Info, key: tuple[UUID, int]) -> Action | None:
    return await info.context.load("Action", key)


@strawberry.type(description="Reading agents.")
class ActionQuery:
    @strawberry.field(description="An agent at its current version, or at `version`; null if none.")
    async def action(
        self,
        info: Info,
        action_id: ACTION_ID,
        version: Annotated[
            int | None,
            strawberry.argument(description="An exact version; by default the current one."),
        ] = None,
    ) -> Action | None:
        found = await service.get_action(
            info.context.pool, info.context.caller, action_id=action_id, version=version
        )
        return Action.of(found) if found else None

    @strawberry.field(description="The account's agents, newest first.")
    async def actions(self, info: Info, first: FIRST, after: AFTER = None) -> Connection[Action]:
        async with info.context.reads():
            return await keyset_connection(
                first,
                after,
                CREATED_ID.bound("actions", info.context.caller.account_id),
                lambda keyset, limit: service.list_actions(
                    info.context.pool,
                    info.context.caller,
                    limit=limit,
                    after=keyset,
                ),
                lambda a: (a.created, a.action_id),
                Action.of,
            )


INPUT = Annotated[ActionInput, strawberry.argument(description="The agent's configuration.")]


def _configuration(info: Info, input: ActionInput) -> dict[str, Any]:
    """What create and update write, checked against the deployment's allowed endpoints."""
    return {
        "name": input.name,
        "instructions": input.instructions,
        "model": input.model,
        "harness": input.harness,
        "settings": info.context.state.settings,
    }


@strawberry.type(description="Creating and changing agents.")
class ActionMutation:
    @strawberry.mutation(
        description="Creates an agent (version 1). Needs INSERT on financial.Action.document."
    )
    async def create_action(self, info: Info, input: INPUT) -> Action:
        created = await service.create_action(
            info.context.pool, info.context.caller, **_configuration(info, input)
        )
        return Action.of(created, written=True)

    @strawberry.mutation(
        description="Writes the next version of an agent; old versions stay readable. Needs "
        "UPDATE on financial.Action.document."
    )
    async def update_action(
        self,
        info: Info,
        action_id: ACTION_ID,
        input: INPUT,
        expected_version: Annotated[
            int | None,
            strawberry.argument(
                description="The agent's current version that this change was based on: if it "
                "is no longer the current one (someone saved the agent since), the update is "
                "CONFLICT and nothing is written. A form passes the version it was filled from; "
                "by default no check."
            ),
        ] = None,
    ) -> Action:
        configuration = _configuration(info, input)
        updated = await service.update_action(
            info.context.pool,
            info.context.caller,
            action_id=action_id,
            expected_version=expected_version,
            **configuration,
        )
        return Action.of(updated, written=True)
