"""GraphQL types for executions (turns and operator writes) and sessions."""

from enum import Enum
from typing import Annotated
from uuid import UUID

import strawberry

from app.graphql.context import Info
from app.graphql.node import node_type
from app.graphql.relay import Node, global_id, parse_uuid
from app.graphql.scalars import Timestamp, Value
from app.runtime import executions
from app.runtime.executions import Execution, Session


@strawberry.enum
class ActionExecutionStatus(Enum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@strawberry.type
class ActionExecution(Node):
    record: strawberry.Private[Execution]
    execution_id: UUID
    action_id: UUID
    action_version: int
    session_id: str | None
    turn: int | None
    invocation_number: int
    status: ActionExecutionStatus
    preview: bool
    input: Value
    output: Value | None
    error: str | None
    created: Timestamp
    modified: Timestamp

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
            status=ActionExecutionStatus(e.status),
            preview=e.preview,
            input=Value(e.input),
            output=Value(e.output) if e.output is not None else None,
            error=e.error,
            created=Timestamp(e.created),
            modified=Timestamp(e.modified),
        )

    @strawberry.field(description="The agent at the version that ran this execution.")
    async def action(
        self, info: Info
    ) -> Annotated["Action", strawberry.lazy("app.graphql.actions")] | None:  # noqa: F821
        from app.graphql.actions import Action, load_action_version

        found = await load_action_version(info, self.action_id, self.action_version)
        return Action.of(found) if found else None


@strawberry.type
class ActionSession(Node):
    record: strawberry.Private[Session]
    session_id: str
    action_id: UUID
    turns: int
    created: Timestamp
    modified: Timestamp

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


async def load_execution(info: Info, action_id: UUID, execution_id: UUID) -> ActionExecution | None:
    found = await executions.get_execution(info.context.pool, info.context.caller, execution_id, action_id)
    return ActionExecution.of(found) if found else None


async def load_session(info: Info, action_id: UUID, session_id: str) -> ActionSession | None:
    found = await executions.get_session(info.context.pool, info.context.caller, action_id, session_id)
    return ActionSession.of(found) if found else None


@node_type("ActionExecution")
async def _execution_node(info: Info, parts: list[str]) -> ActionExecution | None:
    return await load_execution(info, parse_uuid(parts[0]), parse_uuid(parts[1]))


@node_type("ActionSession")
async def _session_node(info: Info, parts: list[str]) -> ActionSession | None:
    return await load_session(info, parse_uuid(parts[0]), parts[1])


@strawberry.type
class ExecutionQuery:
    @strawberry.field(description="One execution (a turn, or an operator's write); null if none.")
    async def execution(self, info: Info, execution_id: UUID) -> ActionExecution | None:
        found = await executions.get_execution(info.context.pool, info.context.caller, execution_id)
        return ActionExecution.of(found) if found else None
