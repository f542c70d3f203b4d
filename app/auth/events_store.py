"""SQL for the events that record who changed accounts, clients and tokens (migration 0041)."""

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import asyncpg

from app.auth.store import Row
from app.db.sql import NEWEST


class Actor(NamedTuple):
    """Who made a change: a client's principal, its account and the token its request sent; or
    one of the words a token's `issued_by` uses where no client acted, with neither."""

    name: str
    account_id: UUID | None
    token_id: UUID | None


_COLUMNS = (
    "account_id, event_id, at, actor, actor_account, actor_token, operation, target_kind,"
    " target, target_principal, changes"
)


async def record(
    conn: asyncpg.Connection,
    actor: Actor,
    operation: str,
    *,
    account_id: UUID,
    kind: str,
    target: str,
    principal: str | None = None,
    changes: Mapping[str, Any] | None = None,
) -> None:
    """Records one change in `account_id`, in the caller's transaction, at its time (`now()`)."""
    await conn.execute(
        """
        INSERT INTO admin_events (account_id, actor, actor_account, actor_token, operation,
            target_kind, target, target_principal, changes)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        """,
        account_id,
        *actor,
        operation,
        kind,
        target,
        principal,
        dict(changes or {}),
    )


async def record_tokens(
    conn: asyncpg.Connection,
    actor: Actor,
    operation: str,
    tokens: Sequence[Row],
    changes: Mapping[str, Any] | None = None,
) -> None:
    """Records one change of each token of `tokens` (rows with `account_id`, `principal` and
    `token_id`), each in its own account, in one statement."""
    if not tokens:
        return
    await conn.execute(
        """
        INSERT INTO admin_events (account_id, actor, actor_account, actor_token, operation,
            target_kind, target, target_principal, changes)
        SELECT t.account_id, $4, $5, $6, $7, 'token', t.token_id::text, t.principal, $8
        FROM unnest($1::uuid[], $2::text[], $3::uuid[]) t(account_id, principal, token_id)
        """,
        [t["account_id"] for t in tokens],
        [t["principal"] for t in tokens],
        [t["token_id"] for t in tokens],
        *actor,
        operation,
        dict(changes or {}),
    )


# A page newest first after an (at, event_id) keyset ($2, $3): without one, above every keyset
# (NEWEST).
_PAGE = f"""
    AND (at, event_id) < (coalesce($2::timestamptz, {NEWEST[0]}), coalesce($3::uuid, {NEWEST[1]}))
    ORDER BY at DESC, event_id DESC
    LIMIT $4
"""


async def account_events(
    conn: asyncpg.Connection, account_id: UUID, after: tuple[datetime, UUID] | None, limit: int
) -> list[Row]:
    """A page of the account's events newest first (`admin_events_newest`)."""
    return await conn.fetch(
        f"SELECT {_COLUMNS} FROM admin_events WHERE account_id = $1 {_PAGE}",
        account_id,
        after[0] if after else None,
        after[1] if after else None,
        limit,
    )


async def token_events(
    conn: asyncpg.Connection,
    token_id: UUID,
    after: tuple[datetime, UUID] | None,
    limit: int,
    *,
    account_id: UUID | None = None,
    actor_account: UUID | None = None,
) -> list[Row]:
    """A page of the events the token made newest first, from `admin_events_token` (what one
    token did, not its account's every event): in every account (on Citus, on every shard), or
    in `account_id` alone, and then with `actor_account`, only where that account's clients
    made them."""
    if account_id is None:
        return await conn.fetch(
            f"SELECT {_COLUMNS} FROM admin_events WHERE actor_token = $1 {_PAGE}",
            token_id,
            after[0] if after else None,
            after[1] if after else None,
            limit,
        )
    return await conn.fetch(
        f"""
        SELECT {_COLUMNS} FROM admin_events
        WHERE account_id = $5 AND actor_token = $1
          AND ($6::uuid IS NULL OR actor_account = $6)
        {_PAGE}
        """,
        token_id,
        after[0] if after else None,
        after[1] if after else None,
        limit,
        account_id,
        actor_account,
    )


# A purge deletes old events this many at a time, each batch its own statement and transaction,
# and at most PURGE_BATCHES batches a call: a call took 0.2 s (at most 0.6) through a backlog of
# 1,000,000 (bench/event_purge.py), so a sweep that purges one stays short, the rest goes at the
# next ones, and no statement holds its locks long.
PURGE_BATCH = 1_000
PURGE_BATCHES = 20


async def forget_older_than(
    conn: asyncpg.Connection,
    days: int,
    *,
    batch: int = PURGE_BATCH,
    batches: int = PURGE_BATCHES,
) -> tuple[int, bool]:
    """Deletes events older than `days` (at most `batch` times `batches`), `batch` at a time,
    oldest first (`admin_events_at`), each batch its own statement outside a transaction; how
    many, and whether older ones remain. Several processes may purge at once: each locks the
    rows it deletes and skips those another holds, so none waits for another or deletes a row
    twice."""
    forgotten = 0
    for _ in range(batches):
        # By ctid: a join on the primary key was planned as a hash join over the whole table
        # (each batch read every event). A row locked here cannot move before it is deleted.
        status = await conn.execute(
            """
            DELETE FROM admin_events
            WHERE ctid = any(ARRAY(
                SELECT ctid FROM admin_events
                WHERE at < now() - make_interval(days => $1)
                ORDER BY at LIMIT $2
                FOR UPDATE SKIP LOCKED))
            """,
            days,
            batch,
        )
        done = int(status.split()[-1])
        forgotten += done
        if done < batch:
            return forgotten, False
    return forgotten, True
