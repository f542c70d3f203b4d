"""Reading executions and sessions, behind the grants on financial.ActionExecution.*."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from app.auth import resources
from app.auth.caller import Caller
from app.runtime import store


@dataclass(frozen=True)
class Execution:
    account_id: UUID
    action_id: UUID
    execution_id: UUID
    action_version: int
    session_id: str | None
    turn: int | None
    invocation_number: int
    kind: str
    status: str
    preview: bool
    principal: str
    input: Any
    output: Any
    error: str | None
    created: datetime
    modified: datetime

    @classmethod
    def of(cls, row: asyncpg.Record) -> "Execution":
        return cls(
            **{k: row[k] for k in cls.__dataclass_fields__}  # columns share the field names
        )


@dataclass(frozen=True)
class Session:
    account_id: UUID
    action_id: UUID
    session_id: str
    turns: int
    created: datetime
    modified: datetime

    @classmethod
    def of(cls, row: asyncpg.Record) -> "Session":
        return cls(**{k: row[k] for k in cls.__dataclass_fields__})


async def get_execution(
    pool: asyncpg.Pool, caller: Caller, execution_id: UUID, action_id: UUID | None = None
) -> Execution | None:
    caller.require(("SELECT", resources.EXECUTION_DOCUMENT))
    async with pool.acquire() as conn:
        row = await store.get_execution(conn, caller.account_id, action_id, execution_id)
    return Execution.of(row) if row else None


async def get_session(
    pool: asyncpg.Pool, caller: Caller, action_id: UUID, session_id: str
) -> Session | None:
    caller.require(("SELECT", resources.SESSION_INDEX))
    async with pool.acquire() as conn:
        row = await store.get_session(conn, caller.account_id, action_id, session_id)
    return Session.of(row) if row else None
