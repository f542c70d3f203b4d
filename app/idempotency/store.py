"""SQL for idempotency keys."""

from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg


async def find(
    conn: asyncpg.Connection, account_id: UUID, principal: str, operation: str, key: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """
        SELECT request, result, created FROM idempotency_keys
        WHERE account_id = $1 AND principal = $2 AND operation = $3 AND key = $4
        """,
        account_id,
        principal,
        operation,
        key,
    )


async def lock_client(
    conn: asyncpg.Connection, account_id: UUID, principal: str, created: datetime
) -> bool:
    """Whether the client made at `created` still exists; its row is then locked until the
    caller's transaction ends, so that its deletion (which deletes its keys) waits for it."""
    found = await conn.fetchval(
        """
        SELECT true FROM clients WHERE account_id = $1 AND principal = $2 AND created = $3
        FOR KEY SHARE
        """,
        account_id,
        principal,
        created,
    )
    return bool(found)


async def insert(
    conn: asyncpg.Connection,
    account_id: UUID,
    principal: str,
    operation: str,
    key: str,
    request: str,
    result: Any,
) -> bool:
    """Records the key in the caller's transaction; False when another transaction holds it
    (this waits until that one ends: it is False once it committed)."""
    inserted = await conn.fetchval(
        """
        INSERT INTO idempotency_keys (account_id, principal, operation, key, request, result)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT DO NOTHING
        RETURNING true
        """,
        account_id,
        principal,
        operation,
        key,
        request,
        result,
    )
    return bool(inserted)


FORGET_BATCH = 10_000


async def forget_older_than(
    conn: asyncpg.Connection, seconds: float, batch: int = FORGET_BATCH
) -> int:
    """Deletes the keys older than `seconds`, `batch` at a time, each batch its own statement
    (outside a transaction, each commits): a backlog, such as the first sweep after a long
    stop, stays within the pool's statement bound (ENGRAM_STATEMENT_TIMEOUT_SECONDS) and holds
    no lock on all of it at once."""
    forgotten = 0
    while True:
        status = await conn.execute(
            """
            DELETE FROM idempotency_keys k
            USING (SELECT account_id, principal, operation, key FROM idempotency_keys
                   WHERE created < now() - make_interval(secs => $1) LIMIT $2) old
            WHERE (k.account_id, k.principal, k.operation, k.key)
                = (old.account_id, old.principal, old.operation, old.key)
            """,
            seconds,
            batch,
        )
        done = int(status.split()[-1])
        forgotten += done
        if done < batch:
            return forgotten
