"""SQL for actions and their versions."""

from typing import Any
from uuid import UUID

import asyncpg

# The model and harness as their JSON text: a version's document never changes, so a parse of
# the same text is reused (`service.ActionVersion.of`).
_VERSION = """
    SELECT v.account_id, v.action_id, v.version, v.name, v.instructions,
        v.model::text AS model, v.harness::text AS harness, v.created, v.created_by,
        a.current_version, a.created AS action_created
    FROM action_versions v
    JOIN actions a ON a.account_id = v.account_id AND a.action_id = v.action_id
"""


async def insert_action(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    values: dict[str, Any],
    created_by: str,
) -> None:
    await conn.execute(
        "INSERT INTO actions (account_id, action_id, current_version) VALUES ($1, $2, 1)",
        account_id,
        action_id,
    )
    await insert_version(conn, account_id, action_id, 1, values, created_by)


async def insert_version(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    version: int,
    values: dict[str, Any],
    created_by: str,
) -> None:
    await conn.execute(
        """
        INSERT INTO action_versions
            (account_id, action_id, version, name, instructions, model, harness, created_by)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        """,
        account_id,
        action_id,
        version,
        values["name"],
        values["instructions"],
        values["model"],
        values["harness"],
        created_by,
    )


async def lock_current(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID
) -> asyncpg.Record | None:
    """The agent's current version, its row locked for a new version. The row is locked
    alone first: locked in a join, a row another update changed meanwhile is re-checked
    against the old version's row, which no longer joins, and the agent read as missing."""
    locked = await conn.fetchval(
        "SELECT true FROM actions WHERE account_id = $1 AND action_id = $2 FOR UPDATE",
        account_id,
        action_id,
    )
    if locked is None:
        return None
    return await get_version(conn, account_id, action_id, None)


async def bump_version(conn: asyncpg.Connection, account_id: UUID, action_id: UUID) -> int:
    return await conn.fetchval(
        """
        UPDATE actions SET current_version = current_version + 1, modified = now()
        WHERE account_id = $1 AND action_id = $2
        RETURNING current_version
        """,
        account_id,
        action_id,
    )


async def get_version(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, version: int | None
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        _VERSION
        + """
        WHERE v.account_id = $1 AND v.action_id = $2
          AND v.version = coalesce($3, a.current_version)
        """,
        account_id,
        action_id,
        version,
    )


async def get_versions(
    conn: asyncpg.Connection, account_id: UUID, keys: list[tuple[UUID, int]]
) -> list[asyncpg.Record]:
    """The versions named by (action_id, version), those that exist, in any order."""
    return await conn.fetch(
        _VERSION
        + """
        WHERE v.account_id = $1
          AND (v.action_id, v.version) IN (SELECT * FROM unnest($2::uuid[], $3::int[]))
        """,
        account_id,
        [k[0] for k in keys],
        [k[1] for k in keys],
    )


async def get_current(
    conn: asyncpg.Connection, account_id: UUID, action_ids: list[UUID]
) -> list[asyncpg.Record]:
    """The current versions of the actions of `action_ids` that exist, in any order."""
    return await conn.fetch(
        _VERSION
        + """
        WHERE a.account_id = $1 AND a.action_id = any($2::uuid[])
          AND v.version = a.current_version
        """,
        account_id,
        action_ids,
    )


async def list_current(
    conn: asyncpg.Connection, account_id: UUID, limit: int, after: tuple[Any, UUID] | None
) -> list[asyncpg.Record]:
    return await conn.fetch(
        _VERSION
        + """
        WHERE a.account_id = $1 AND v.version = a.current_version
          AND ($2::timestamptz IS NULL OR (a.created, a.action_id) < ($2, $3))
        ORDER BY a.created DESC, a.action_id DESC
        LIMIT $4
        """,
        account_id,
        after[0] if after else None,
        after[1] if after else None,
        limit,
    )
