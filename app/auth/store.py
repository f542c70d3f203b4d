"""SQL for accounts, clients and tokens."""

from typing import Any, TypeAlias
from uuid import UUID

import asyncpg

Row: TypeAlias = asyncpg.Record


async def default_account(conn: asyncpg.Connection) -> Row | None:
    return await conn.fetchrow("SELECT * FROM accounts WHERE is_default")


async def insert_account(
    conn: asyncpg.Connection, account_id: UUID, name: str, *, is_default: bool = False
) -> Row:
    return await conn.fetchrow(
        "INSERT INTO accounts (account_id, name, is_default) VALUES ($1, $2, $3) RETURNING *",
        account_id,
        name,
        is_default,
    )


async def get_account(conn: asyncpg.Connection, account_id: UUID) -> Row | None:
    return await conn.fetchrow("SELECT * FROM accounts WHERE account_id = $1", account_id)


async def get_client(conn: asyncpg.Connection, account_id: UUID, principal: str) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM clients WHERE account_id = $1 AND principal = $2", account_id, principal
    )


async def insert_client(
    conn: asyncpg.Connection, account_id: UUID, principal: str, name: str, policies: list[Any]
) -> Row | None:
    return await conn.fetchrow(
        """
        INSERT INTO clients (account_id, principal, name, policies) VALUES ($1, $2, $3, $4)
        ON CONFLICT DO NOTHING
        RETURNING *
        """,
        account_id,
        principal,
        name,
        policies,
    )


async def update_client(
    conn: asyncpg.Connection,
    account_id: UUID,
    principal: str,
    name: str | None,
    policies: list[Any] | None,
) -> Row | None:
    return await conn.fetchrow(
        """
        UPDATE clients
        SET name = coalesce($3, name), policies = coalesce($4, policies), modified = now()
        WHERE account_id = $1 AND principal = $2
        RETURNING *
        """,
        account_id,
        principal,
        name,
        policies,
    )


async def delete_client(conn: asyncpg.Connection, account_id: UUID, principal: str) -> Row | None:
    return await conn.fetchrow(
        "DELETE FROM clients WHERE account_id = $1 AND principal = $2 RETURNING *",
        account_id,
        principal,
    )


async def insert_token(
    conn: asyncpg.Connection, token_hash: bytes, account_id: UUID, principal: str
) -> None:
    await conn.execute(
        """
        INSERT INTO client_tokens (token_hash, account_id, principal) VALUES ($1, $2, $3)
        ON CONFLICT (token_hash) DO NOTHING
        """,
        token_hash,
        account_id,
        principal,
    )


async def count_tokens(conn: asyncpg.Connection, account_id: UUID, principal: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM client_tokens WHERE account_id = $1 AND principal = $2",
        account_id,
        principal,
    )


async def client_by_token(conn: asyncpg.Connection, token_hash: bytes) -> Row | None:
    return await conn.fetchrow(
        """
        SELECT c.account_id, c.principal, c.policies, a.is_default
        FROM client_tokens t
        JOIN clients c ON c.account_id = t.account_id AND c.principal = t.principal
        JOIN accounts a ON a.account_id = c.account_id
        WHERE t.token_hash = $1
        """,
        token_hash,
    )
