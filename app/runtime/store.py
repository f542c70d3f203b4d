"""SQL for sessions, executions and transcripts."""

from typing import Any
from uuid import UUID

import asyncpg

Row = asyncpg.Record


async def insert_execution(
    conn: asyncpg.Connection,
    *,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    action_version: int,
    session_id: str | None,
    turn: int | None,
    kind: str,
    status: str,
    preview: bool,
    principal: str,
    input: Any,
    invocation_number: int = 1,
) -> Row:
    return await conn.fetchrow(
        """
        INSERT INTO executions (account_id, action_id, execution_id, action_version, session_id,
                                turn, invocation_number, kind, status, preview, principal, input)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
        RETURNING *
        """,
        account_id,
        action_id,
        execution_id,
        action_version,
        session_id,
        turn,
        invocation_number,
        kind,
        status,
        preview,
        principal,
        input,
    )


async def get_execution(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID | None, execution_id: UUID
) -> Row | None:
    return await conn.fetchrow(
        """
        SELECT * FROM executions
        WHERE account_id = $1 AND ($2::uuid IS NULL OR action_id = $2) AND execution_id = $3
        """,
        account_id,
        action_id,
        execution_id,
    )


async def ensure_session(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> Row:
    return await conn.fetchrow(
        """
        INSERT INTO sessions (account_id, action_id, session_id) VALUES ($1, $2, $3)
        ON CONFLICT (account_id, action_id, session_id) DO UPDATE SET modified = sessions.modified
        RETURNING *
        """,
        account_id,
        action_id,
        session_id,
    )


async def get_session(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM sessions WHERE account_id = $1 AND action_id = $2 AND session_id = $3",
        account_id,
        action_id,
        session_id,
    )
