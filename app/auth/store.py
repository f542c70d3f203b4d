"""SQL for accounts, clients and tokens."""

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal, TypeAlias
from uuid import UUID

import asyncpg

from app.auth import verified
from app.db.sql import NEWEST, by_page, held_token_sql, page_arrays

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


AccountLock: TypeAlias = Literal["write in", "rename", "delete"]

# How lock_account locks an account's row, by what the transaction does to it.
_ACCOUNT_LOCKS: dict[AccountLock, str] = {
    # A row written in the account (a client), as its foreign key holds the account: waits for
    # the account's deletion, and then finds none.
    "write in": "FOR KEY SHARE",
    # A rename: waits for another (whose name it then reads), not for writes in the account.
    "rename": "FOR NO KEY UPDATE",
    # A deletion: waits for every write in the account to commit, and holds off the next.
    "delete": "FOR UPDATE",
}


async def lock_account(
    conn: asyncpg.Connection, account_id: UUID, *, to: AccountLock
) -> Row | None:
    """The account's row, locked until the transaction ends as what it is locked `to` do needs
    (`_ACCOUNT_LOCKS`); None if there is no such account. Taken after the caller's client
    (auth/service.py `_as_now`), as a row written in the account takes the account by its
    foreign key after its client's lock (a token's lookup row, an idempotency key): a deletion
    taking them the other way round deadlocked with such a write by its own client."""
    return await conn.fetchrow(
        f"SELECT * FROM accounts WHERE account_id = $1 {_ACCOUNT_LOCKS[to]}", account_id
    )


async def rename_account(conn: asyncpg.Connection, account_id: UUID, name: str) -> Row:
    return await conn.fetchrow(
        "UPDATE accounts SET name = $2 WHERE account_id = $1 RETURNING *", account_id, name
    )


# What an account holds, by kind, each counted up to HELD_COUNTED (beyond, "more than").
HELD_COUNTED = 10_000
_HELD = {
    "client": "clients",
    "agent": "actions",
    "memory record": "agent_memories",
    "session": "sessions",
    "execution": "executions",
}


async def account_holdings(conn: asyncpg.Connection, account_id: UUID) -> dict[str, int]:
    """How many of each kind (`_HELD`) the account holds, each up to HELD_COUNTED + 1: every
    other row of an account hangs off one of its clients or agents."""
    counts = ",\n".join(
        f"(SELECT count(*) FROM (SELECT FROM {table} WHERE account_id = $1 LIMIT $2) t)"
        for table in _HELD.values()
    )
    row = await conn.fetchrow(f"SELECT {counts}", account_id, HELD_COUNTED + 1)
    return dict(zip(_HELD, row.values(), strict=True))


async def delete_account(conn: asyncpg.Connection, account_id: UUID) -> Row | None:
    return await conn.fetchrow("DELETE FROM accounts WHERE account_id = $1 RETURNING *", account_id)


async def list_accounts(
    conn: asyncpg.Connection, only: UUID | None, after: tuple[str, UUID] | None, limit: int
) -> list[Row]:
    """A page of the accounts by name, then ID, after the (name, account_id) `after`; `only`:
    that account alone. No index orders them: a deployment holds a few thousand accounts at
    most, which a page sorts in about a millisecond; at hundreds of thousands an index on
    (name, account_id) would make each page a range scan."""
    return await conn.fetch(
        """
        SELECT * FROM accounts
        WHERE ($1::uuid IS NULL OR account_id = $1)
          AND ($2::text IS NULL OR (name, account_id) > ($2, $3::uuid))
        ORDER BY name, account_id
        LIMIT $4
        """,
        only,
        after[0] if after else None,
        after[1] if after else None,
        limit,
    )


async def get_client(conn: asyncpg.Connection, account_id: UUID, principal: str) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM clients WHERE account_id = $1 AND principal = $2", account_id, principal
    )


async def get_accounts(conn: asyncpg.Connection, account_ids: list[UUID]) -> list[Row]:
    return await conn.fetch("SELECT * FROM accounts WHERE account_id = any($1)", account_ids)


async def get_clients(conn: asyncpg.Connection, keys: Sequence[tuple[UUID, str]]) -> list[Row]:
    """The clients of `keys` (account, principal) that exist, in one statement."""
    return await conn.fetch(
        "SELECT c.* FROM clients c JOIN unnest($1::uuid[], $2::text[]) k(account_id, principal)"
        " USING (account_id, principal)",
        [k[0] for k in keys],
        [k[1] for k in keys],
    )


async def lock_clients(
    conn: asyncpg.Connection, keys: Iterable[tuple[UUID, str]]
) -> dict[tuple[UUID, str], Row]:
    """The clients of `keys` (account, principal) that exist, their rows locked until the
    transaction ends (FOR UPDATE), in one order (by account, then principal), so that two
    transactions locking the same two clients wait for one another instead of deadlocking."""
    accounts, principals = zip(*sorted(set(keys)), strict=True)
    rows = await conn.fetch(
        "SELECT c.* FROM clients c JOIN unnest($1::uuid[], $2::text[]) k(account_id, principal)"
        " USING (account_id, principal) ORDER BY c.account_id, c.principal FOR UPDATE OF c",
        list(accounts),
        list(principals),
    )
    return {(r["account_id"], r["principal"]): r for r in rows}


async def lock_token(
    conn: asyncpg.Connection, account_id: UUID, principal: str, token_id: UUID
) -> bool:
    """Whether the token of client `principal` of `account_id` still exists, locked against
    revocation until the transaction ends. Named by its client too, so that its key in
    `client_tokens_id` finds it (and on Citus, one shard holds it)."""
    found = await conn.fetchval(
        """
        SELECT true FROM client_tokens
        WHERE account_id = $1 AND principal = $2 AND token_id = $3
        FOR SHARE
        """,
        account_id,
        principal,
        token_id,
    )
    return bool(found)


async def share_token(
    conn: asyncpg.Connection, account_id: UUID, principal: str, token_id: UUID
) -> Row | None:
    """The client's policies while its token `token_id` exists, both rows locked until the
    transaction ends (`held_token_sql`)."""
    return await conn.fetchrow(held_token_sql("$1", "$2", "$3"), account_id, principal, token_id)


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
    row = await conn.fetchrow(
        """
        UPDATE clients
        -- The time of the change, not of its transaction's start (which may have waited for
        -- the row's lock behind a later change): `modified` never goes back.
        SET name = coalesce($3, name), policies = coalesce($4, policies),
            modified = greatest(clock_timestamp(), modified)
        WHERE account_id = $1 AND principal = $2
        RETURNING *
        """,
        account_id,
        principal,
        name,
        policies,
    )
    verified.forget()  # its tokens' callers had the old policies
    return row


async def delete_client(
    conn: asyncpg.Connection, account_id: UUID, principal: str
) -> tuple[Row | None, list[Row]]:
    """Deletes the client and its tokens: the client's row (None: there was none) and its
    tokens' (`token_id`, `account_id`, `principal`), each of which its admin event names."""
    async with conn.transaction():
        # Its tokens first, by name rather than by the cascade, to say which went with it (one
        # revoked meanwhile is not among them).
        tokens = await conn.fetch(
            """
            DELETE FROM client_tokens WHERE account_id = $1 AND principal = $2
            RETURNING token_hash, bootstrap, token_id, account_id, principal
            """,
            account_id,
            principal,
        )
        await _remember_revoked_bootstrap(conn, tokens)
        row = await conn.fetchrow(
            "DELETE FROM clients WHERE account_id = $1 AND principal = $2 RETURNING *",
            account_id,
            principal,
        )
        # Their lookup rows go too.
        await _forget_tokens(conn, account_id)
        # And its idempotency keys: a client made later with the same principal is another,
        # whose keys must not answer with the deleted one's results.
        if row is not None:
            await conn.execute(
                "DELETE FROM idempotency_keys WHERE account_id = $1 AND principal = $2",
                account_id,
                principal,
            )
    verified.forget()
    return row, list(tokens)


async def _remember_revoked_bootstrap(conn: asyncpg.Connection, deleted: Sequence[Row]) -> None:
    """Records the bootstrap tokens among `deleted` (rows with `token_hash` and `bootstrap`) in
    `revoked_bootstrap_tokens` (migration 0039), so that a start does not make them again.
    Written by each statement that deletes tokens, not by a trigger: `client_tokens` is
    distributed and the record a reference table (app/db/distribution.py), as with
    `token_accounts`; the first revocation's time is kept."""
    hashes = [r["token_hash"] for r in deleted if r["bootstrap"]]
    if hashes:
        await conn.execute(
            """
            INSERT INTO revoked_bootstrap_tokens (token_hash) SELECT unnest($1::bytea[])
            ON CONFLICT (token_hash) DO NOTHING
            """,
            hashes,
        )


async def bootstrap_token_revoked(conn: asyncpg.Connection, token_hash: bytes) -> datetime | None:
    """When the bootstrap token `token_hash` was revoked or replaced; None if it never was."""
    return await conn.fetchval(
        "SELECT revoked FROM revoked_bootstrap_tokens WHERE token_hash = $1", token_hash
    )


async def _forget_tokens(conn: asyncpg.Connection, account_id: UUID) -> None:
    """Deletes the account's `token_accounts` rows whose token is gone. The lookup is a
    reference table and `client_tokens` a distributed one (app/db/distribution.py), so no
    foreign key can do it; a row left behind would find nothing anyway."""
    await conn.execute(
        """
        DELETE FROM token_accounts ta
        WHERE ta.account_id = $1
          AND NOT EXISTS (SELECT FROM client_tokens t
                          WHERE t.account_id = $1 AND t.token_hash = ta.token_hash)
        """,
        account_id,
    )


_TOKEN_COLUMNS = (
    "token_id, account_id, principal, prefix, created, expires, last_used, bootstrap, issued_by,"
    " issued_by_account, issued_by_token"
)


async def insert_token(
    conn: asyncpg.Connection,
    token_hash: bytes,
    account_id: UUID,
    principal: str,
    *,
    issued_by: str,
    issued_by_account: UUID | None = None,
    issued_by_token: UUID | None = None,
    prefix: str | None = None,
    expires: datetime | None = None,
) -> Row:
    # A token hash belongs to one account: the lookup's primary key refuses a second.
    await conn.execute(
        "INSERT INTO token_accounts (token_hash, account_id) VALUES ($1, $2)",
        token_hash,
        account_id,
    )
    return await conn.fetchrow(
        f"""
        INSERT INTO client_tokens (token_hash, account_id, principal, prefix, expires,
            issued_by, issued_by_account, issued_by_token)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        RETURNING {_TOKEN_COLUMNS}
        """,
        token_hash,
        account_id,
        principal,
        prefix,
        expires,
        issued_by,
        issued_by_account,
        issued_by_token,
    )


async def replace_bootstrap_token(
    conn: asyncpg.Connection,
    token_hash: bytes,
    account_id: UUID,
    principal: str,
    prefix: str,
    issued_by: str,
) -> tuple[list[Row], list[Row]]:
    """Makes `token_hash` the client's one bootstrap token, issued by `issued_by`: an earlier
    one is deleted (and remembered as revoked), and a token of that value issued before tokens
    were marked becomes the bootstrap token (its issuer, if it recorded one, kept). Answers the
    tokens deleted and the token made, if it was (each `account_id`, `principal`, `token_id`)."""
    replaced = await conn.fetch(
        """
        DELETE FROM client_tokens
        WHERE account_id = $2 AND principal = $3 AND bootstrap AND token_hash <> $1
        RETURNING token_hash, bootstrap, account_id, principal, token_id
        """,
        token_hash,
        account_id,
        principal,
    )
    await _remember_revoked_bootstrap(conn, replaced)  # a rotated-out value stays out
    await _forget_tokens(conn, account_id)
    verified.forget()  # (at startup, before requests are served)
    owner = await conn.fetchval(
        """
        INSERT INTO token_accounts (token_hash, account_id) VALUES ($1, $2)
        ON CONFLICT (token_hash) DO UPDATE SET account_id = token_accounts.account_id
        RETURNING account_id
        """,
        token_hash,
        account_id,
    )
    if owner != account_id:
        return replaced, []  # another account's token has this value (as before: left as it is)
    made = await conn.fetch(
        """
        INSERT INTO client_tokens (token_hash, account_id, principal, prefix, bootstrap, issued_by)
        VALUES ($1, $2, $3, $4, true, $5)
        ON CONFLICT (account_id, token_hash) DO UPDATE
        SET bootstrap = true, prefix = coalesce(client_tokens.prefix, excluded.prefix),
            issued_by = coalesce(client_tokens.issued_by, excluded.issued_by)
        WHERE client_tokens.account_id = excluded.account_id
          AND client_tokens.principal = excluded.principal
        -- A row inserted, not one updated (whose xmax is the updating transaction's).
        RETURNING account_id, principal, token_id, xmax = 0 AS inserted
        """,
        token_hash,
        account_id,
        principal,
        prefix,
        issued_by,
    )
    return replaced, [r for r in made if r["inserted"]]


async def list_clients(
    conn: asyncpg.Connection, account_id: UUID, after: str | None, limit: int
) -> list[Row]:
    """A page of the account's clients by principal (the primary key's order)."""
    return await conn.fetch(
        """
        SELECT * FROM clients
        WHERE account_id = $1 AND ($2::text IS NULL OR principal > $2)
        ORDER BY principal
        LIMIT $3
        """,
        account_id,
        after,
        limit,
    )


async def list_token_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[str, tuple[datetime, UUID] | None, int | None]],
) -> list[list[Row]]:
    """Pages of clients' tokens in one statement, each (principal, after, limit): the client's
    tokens newest first, after a (created, token_id) keyset, at most `limit` (None: all)."""
    rows = await conn.fetch(
        f"""
        SELECT k.n, t.* FROM unnest($2::text[], $3::timestamptz[], $4::uuid[], $5::int[])
            WITH ORDINALITY AS k(principal, after_created, after_id, lim, n)
        CROSS JOIN LATERAL (
            SELECT {_TOKEN_COLUMNS} FROM client_tokens c
            WHERE c.account_id = $1 AND c.principal = k.principal
              -- Without `after`, above every keyset: the keyset stays an index condition.
              AND (c.created, c.token_id)
                  < (coalesce(k.after_created, {NEWEST[0]}), coalesce(k.after_id, {NEWEST[1]}))
            ORDER BY c.created DESC, c.token_id DESC
            LIMIT k.lim
        ) t
        ORDER BY k.n, t.created DESC, t.token_id DESC
        """,
        account_id,
        *page_arrays(pages, keys=1, keyset=2),
    )
    return by_page(rows, len(pages))


async def get_tokens(conn: asyncpg.Connection, keys: Sequence[tuple[UUID, str, UUID]]) -> list[Row]:
    """The tokens of `keys` (account, principal, token_id) that exist, in one statement."""
    return await conn.fetch(
        f"""
        SELECT {_TOKEN_COLUMNS} FROM client_tokens
        JOIN unnest($1::uuid[], $2::text[], $3::uuid[]) k(account_id, principal, token_id)
            USING (account_id, principal, token_id)
        """,
        *([k[i] for k in keys] for i in range(3)),
    )


async def delete_token(
    conn: asyncpg.Connection, account_id: UUID, principal: str, token_id: UUID
) -> Row | None:
    async with conn.transaction():
        row = await conn.fetchrow(
            f"""
            DELETE FROM client_tokens WHERE account_id = $1 AND principal = $2 AND token_id = $3
            RETURNING {_TOKEN_COLUMNS}, token_hash
            """,
            account_id,
            principal,
            token_id,
        )
        if row is not None:
            await _remember_revoked_bootstrap(conn, [row])
            await conn.execute(
                "DELETE FROM token_accounts WHERE account_id = $1 AND token_hash = $2",
                account_id,
                row["token_hash"],
            )
    verified.forget()
    return row


async def accounts_issued_from(conn: asyncpg.Connection, token_ids: Sequence[UUID]) -> list[UUID]:
    """The accounts holding one of the tokens `token_ids`, or a token one of them issued: the
    accounts `token_chain` and `delete_token_chain` have to look in. It reads every account (on
    Citus, a multi-shard query on the coordinator), as only a client of the default account
    asks it, from `client_tokens_token` and `client_tokens_issued_by` (migration 0040)."""
    return await conn.fetchval(
        """
        SELECT coalesce(array_agg(DISTINCT account_id), '{}') FROM client_tokens
        WHERE token_id = any($1::uuid[]) OR issued_by_token = any($1::uuid[])
        """,
        list(token_ids),
    )


# The tokens of account $1 that are among `roots` ($2) or whose chain of issuers
# (`issued_by_token`) leads back to one of them; with $3 (own issuers), a root's tokens only where
# the account's own clients issued them (not the default account's, whose tokens a tenant may not
# name). UNION, not UNION ALL: a token reached twice is walked once, so the walk ends whatever
# the rows say. Each step looks up the tokens one issued in `client_tokens_issued` (migration
# 0038). Written once: the read (`token_chain`) and the revocation (`delete_token_chain`) walk
# the same tokens.
_CHAIN = """
    WITH RECURSIVE chain(token_id) AS (
        SELECT token_id FROM client_tokens
        WHERE account_id = $1
          AND (token_id = any($2::uuid[])
               OR (issued_by_token = any($2::uuid[]) AND (NOT $3 OR issued_by_account = $1)))
      UNION
        SELECT t.token_id FROM client_tokens t
        JOIN chain c ON t.issued_by_token = c.token_id
        WHERE t.account_id = $1
    )
"""


async def token_chain(
    conn: asyncpg.Connection, account_id: UUID, roots: Sequence[UUID], *, own_issuers: bool
) -> list[Row]:
    """The tokens `delete_token_chain` would delete, left as they are."""
    return await conn.fetch(
        f"""{_CHAIN}
        SELECT {_TOKEN_COLUMNS} FROM client_tokens
        WHERE account_id = $1 AND token_id IN (SELECT token_id FROM chain)
        """,
        account_id,
        list(roots),
        own_issuers,
    )


async def delete_token_chain(
    conn: asyncpg.Connection, account_id: UUID, roots: Sequence[UUID], *, own_issuers: bool
) -> list[Row]:
    """Deletes, in the account, the tokens `roots` that are still there and every token one of
    them issued (its `issued_by_token`), every token those issued, and so on (`_CHAIN`)."""
    async with conn.transaction():
        rows = await conn.fetch(
            f"""{_CHAIN}
            DELETE FROM client_tokens
            WHERE account_id = $1 AND token_id IN (SELECT token_id FROM chain)
            RETURNING {_TOKEN_COLUMNS}, token_hash
            """,
            account_id,
            list(roots),
            own_issuers,
        )
        if rows:
            await _remember_revoked_bootstrap(conn, rows)
            await conn.execute(
                "DELETE FROM token_accounts"
                " WHERE account_id = $1 AND token_hash = any($2::bytea[])",
                account_id,
                [r["token_hash"] for r in rows],
            )
    verified.forget()
    return rows


async def client_by_token(conn: asyncpg.Connection, token_hash: bytes) -> Row | None:
    """The client a token names, whether the token has expired, and whether its `last_used`
    is a minute old or more (so that it is written at most once a minute)."""
    return await conn.fetchrow(
        """
        SELECT c.account_id, c.principal, c.policies, c.created, a.is_default, t.token_id,
               t.expires,
               coalesce(t.expires <= now(), false) AS expired,
               coalesce(t.last_used < now() - interval '1 minute', true) AS stale
        FROM token_accounts ta
        JOIN client_tokens t ON t.account_id = ta.account_id AND t.token_hash = ta.token_hash
        JOIN clients c ON c.account_id = t.account_id AND c.principal = t.principal
        JOIN accounts a ON a.account_id = c.account_id
        WHERE ta.token_hash = $1
        """,
        token_hash,
    )


async def touch_token(conn: asyncpg.Connection, account_id: UUID, token_hash: bytes) -> None:
    await conn.execute(
        """
        UPDATE client_tokens SET last_used = now()
        WHERE account_id = $1 AND token_hash = $2
          AND (last_used IS NULL OR last_used < now() - interval '1 minute')
        """,
        account_id,
        token_hash,
    )
