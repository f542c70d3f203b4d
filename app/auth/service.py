"""Accounts, clients and tokens: the rules, over auth/store.py."""

import hashlib
import logging
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import UUID

import asyncpg

from app.auth import events_store, resources, store, verified
from app.auth.caller import AGENT_PREFIX, Caller
from app.auth.events_store import Actor
from app.auth.policies import ADMIN_POLICIES, is_allowed, parse_policies
from app.auth.resources import Grant
from app.db.pool import Share, drawing_on
from app.errors import AccessDenied, BadInput, Conflict, NotFound, Unauthenticated
from app.text import check_one_line

log = logging.getLogger(__name__)

ADMIN_PRINCIPAL = "admin"
TOKEN_PREFIX = "eng_"
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/+-]{0,199}$")

# Who issued a token where no client is named (a token's `issued_by`, with no account): each
# holds a space, so no client's principal (check_principal) is ever one of them.
ISSUER_COMMAND_LINE = "command line"  # `engram client token`
ISSUER_BOOTSTRAP = "bootstrap setting"  # made from ENGRAM_BOOTSTRAP_TOKEN at a start
ISSUER_FIRST_START = "first start"  # the admin's token the first start printed
# Never stored: what a client outside the default account reads of a token a client of the
# default account issued in its account (TokenInfo.of), or a change one made there (AdminEvent.of).
ISSUER_DEFAULT_ACCOUNT = "default account"
ISSUERS = (ISSUER_COMMAND_LINE, ISSUER_BOOTSTRAP, ISSUER_FIRST_START, ISSUER_DEFAULT_ACCOUNT)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def check_principal(principal: str, field: str = "principal") -> None:
    """A client's principal, as a new client is given it, and so every principal a row names
    (who wrote an agent's version, ran an execution, wrote a record's version: a client, the
    `admin`, an agent's `action:ID`); `field`: how the caller names it."""
    if not _PRINCIPAL.fullmatch(principal):
        raise BadInput(
            f"{field} must be 1 to 200 characters: letters, digits and _ . : @ / + -, "
            "starting with a letter or digit"
        )


def _check_name(name: str, what: str, current: str | None = None) -> str:
    """A name given to a new account or client, or to a client whose name is `current`: one
    that keeps it as it is is taken as it was stored (check_one_line's `stored`)."""
    name = name.strip()
    if not name or len(name) > 200:
        raise BadInput(f"{what} name must be 1 to 200 characters")
    return check_one_line(name, f"{what} name", stored=name == current)


@dataclass(frozen=True)
class Account:
    account_id: UUID
    name: str
    created: datetime
    is_default: bool

    @classmethod
    def of(cls, row: asyncpg.Record) -> "Account":
        return cls(row["account_id"], row["name"], row["created"], row["is_default"])


@dataclass(frozen=True)
class Client:
    account_id: UUID
    principal: str
    name: str
    policies: list[dict[str, Any]]
    modified: datetime

    @classmethod
    def of(cls, row: asyncpg.Record) -> "Client":
        return cls(
            row["account_id"], row["principal"], row["name"], row["policies"], row["modified"]
        )


def covers_client(caller: Caller, *, client: Client) -> bool:
    """Whether the caller holds every grant `client` holds: only then may it issue the client a
    token or change it (`_lock_covered_client` refuses otherwise), its own grants permitting."""
    return caller.covers(parse_policies(client.policies))


async def _as_now(
    conn: asyncpg.Connection,
    caller: Caller,
    grant: Grant,
    account_id: UUID,
    principal: str | None = None,
) -> tuple[Caller, asyncpg.Record | None]:
    """The caller with its policies as its client's row holds them now, holding `grant` (the
    operation's own), and the row of client `principal` (None: no other), both locked until
    the transaction ends (`lock_clients`), and the caller's token too. A request's caller is
    read when it authenticates, or up to a second before from memory (verified.py): a grant
    an administrator has since taken from it, or a token revoked meanwhile, must not act. A
    caller made in process (the `engram` command's) is taken as it is."""
    keys = [(account_id, principal)] if principal is not None else []
    if caller.token_id is not None:
        keys.append((caller.account_id, caller.principal))
    rows = await store.lock_clients(conn, keys) if keys else {}
    if caller.token_id is not None:
        own = rows.get((caller.account_id, caller.principal))
        if own is None or not await store.lock_token(
            conn, caller.account_id, caller.principal, caller.token_id
        ):
            raise Unauthenticated("the API token was revoked, or its client deleted, meanwhile")
        caller = replace(caller, policies=parse_policies(own["policies"]))
        caller.require(grant)
    return caller, rows.get((account_id, principal)) if principal is not None else None


async def check_still_allowed(
    conn: asyncpg.Connection, caller: Caller, *, grants: Sequence[Grant], what: str
) -> None:
    """Inside the transaction that commits work the caller's request started a while ago (a
    turn that waited on its model: `what`): refuses unless the token the request sent still
    exists and its client still holds `grants`, both rows locked until the transaction ends
    (`store.share_token`), so that a revocation, a deletion or a change of grants either
    committed first, and nothing of the work is kept, or waits for its commit. A caller made in
    process (the `engram` command's) is taken as it is."""
    if caller.token_id is None:
        return
    row = await store.share_token(conn, caller.account_id, caller.principal, caller.token_id)
    if row is None:
        raise Unauthenticated(
            f"the API token that started this {what} was revoked, or its client deleted, while "
            f"the {what} ran; nothing of this {what} was kept"
        )
    policies = parse_policies(row["policies"])
    for verb, resource in grants:
        if not is_allowed(policies, verb, resource):
            raise AccessDenied(
                f"the client whose API token started this {what} is no longer allowed to {verb} "
                f"{resource} (its grants changed while the {what} ran); nothing of this {what} "
                "was kept"
            )


async def _lock_covered_client(
    conn: asyncpg.Connection, caller: Caller, grant: Grant, account_id: UUID, principal: str
) -> tuple[Caller, asyncpg.Record]:
    """Locks the client's row for the transaction once the caller (as it is now, `_as_now`,
    holding `grant`) is found to hold every grant it holds, and returns that caller and the
    row: a client cannot change, or issue a token for, a client with more rights than its
    own. Deleting a client or revoking a token takes rights away, so it is not checked this
    way: a client allowed to revoke can revoke a leaked administrator's token."""
    caller, row = await _as_now(conn, caller, grant, account_id, principal)
    if row is None:
        raise NotFound(f"client {principal!r} not found")
    caller.require_covers(parse_policies(row["policies"]), f"client {principal!r} holds")
    return caller, row


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def token_prefix(token: str) -> str:
    """The first characters of a token, to tell tokens apart: at most a quarter of it."""
    return token[: min(8, len(token) // 4)]


@dataclass(frozen=True)
class TokenInfo:
    """A token as it may be shown: never its secret."""

    token_id: UUID
    account_id: UUID
    principal: str
    prefix: str | None
    created: datetime
    expires: datetime | None
    last_used: datetime | None
    bootstrap: bool
    # The principal of the client whose request issued it, or one of ISSUERS; None for a token
    # issued before this was recorded (migration 0037).
    issued_by: str | None
    # That client's account (the token's own, or the default account's) and the token its
    # request sent; None for ISSUERS.
    issued_by_account: UUID | None
    issued_by_token: UUID | None

    @classmethod
    def of(cls, row: asyncpg.Record, caller: Caller) -> "TokenInfo":
        """The token as `caller` may see it: a client outside the default account reads a
        token a client of the default account issued in its account as ISSUER_DEFAULT_ACCOUNT's,
        without that client's account and token, which are the operator's."""
        info = cls(
            row["token_id"],
            row["account_id"],
            row["principal"],
            row["prefix"],
            row["created"],
            row["expires"],
            row["last_used"],
            row["bootstrap"],
            row["issued_by"],
            row["issued_by_account"],
            row["issued_by_token"],
        )
        if caller.in_default_account or info.issued_by_account in (None, info.account_id):
            return info
        return replace(
            info,
            issued_by=ISSUER_DEFAULT_ACCOUNT,
            issued_by_account=None,
            issued_by_token=None,
        )


def _issuer(caller: Caller) -> tuple[str, UUID | None, UUID | None]:
    """Who a token the caller issues names as its issuer (TokenInfo's `issued_by` fields): the
    client whose token the request sent, its account, and that token; a caller made in process
    (no token: the `engram` command's, acting as the admin) is the command line, not the admin's
    client."""
    if caller.token_id is None:
        return ISSUER_COMMAND_LINE, None, None
    return caller.principal, caller.account_id, caller.token_id


def _actor(caller: Caller) -> Actor:
    """Who an admin event names as having made the caller's change: as `_issuer` names it."""
    return Actor(*_issuer(caller))


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once
    info: TokenInfo


# Said of a token no client holds: what may be wrong, and what to do (as for an expired one).
NOT_VALID = (
    "the API token is not valid (mistyped, revoked, or its client deleted); ask for a new one"
)


def sent_authorization(values: Sequence[str]) -> str | None:
    """The request's one Authorization header (None: it sent none). Two or more are refused,
    whatever they say: the header takes one value (RFC 9110), and a proxy in front may have
    checked or logged another of them than the first, which this service would read."""
    if len(values) > 1:
        raise Unauthenticated(
            f"the request sends {len(values)} Authorization headers: send one, "
            "`Authorization: Bearer <token>`"
        )
    return values[0] if values else None


async def authenticate_sent(
    pool: asyncpg.Pool, authorization: Sequence[str], *, recent: bool = False
) -> Caller:
    """The caller a request's Authorization headers (every one it sent) name: one is taken
    (`sent_authorization`), then `authenticate`."""
    return await authenticate(pool, sent_authorization(authorization), recent=recent)


async def authenticate(
    pool: asyncpg.Pool, authorization: str | None, *, recent: bool = False
) -> Caller:
    """The caller a bearer token names. `recent`: a verification of the last second may
    answer (auth/verified.py says when a revocation takes effect then)."""
    if not authorization:
        raise Unauthenticated("send an API token as `Authorization: Bearer <token>`")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("send an API token as `Authorization: Bearer <token>`")
    try:
        return await _caller(pool, hash_token(token), recent)
    except Unauthenticated as e:
        # A client that puts the scheme before a value holding it already: said so, where a
        # token no client holds is (a token of that form is one no client holds).
        if e.message == NOT_VALID and token[:7].lower() == "bearer ":
            raise Unauthenticated(
                "the Authorization header says `Bearer` twice: send `Authorization: Bearer "
                "<token>`, the word once"
            ) from None
        raise


async def _caller(pool: asyncpg.Pool, token_hash: bytes, recent: bool) -> Caller:
    if not recent:
        return await _verify(pool, token_hash)
    caller = verified.recall(pool, token_hash)
    if caller is None:
        since, started = verified.generation(), time.monotonic()
        caller = await _verify(pool, token_hash, keep=(since, started))
    return caller


# The share of the pool (app/db/pool.py `Share`) that lookups of tokens not known
# (verified.known) draw on, a quarter of it: one for a pool under 8. Random tokens sent by
# the thousand then queue there, as an account's work beyond its share does, and known
# tokens' lookups and the accounts' work keep the rest of the pool.
STRANGERS = "tokens not known"


def strangers_share(pool: asyncpg.Pool) -> Share:
    return Share(STRANGERS, max(1, pool.get_max_size() // 4))


async def _verify(
    pool: asyncpg.Pool, token_hash: bytes, keep: tuple[int, float] | None = None
) -> Caller:
    if verified.known(token_hash):
        row = await _look_up(pool, token_hash)
    else:
        with drawing_on(strangers_share(pool)):
            row = await _look_up(pool, token_hash)
    verified.note(token_hash, row is not None and not row["expired"])
    if row is None:
        raise Unauthenticated(NOT_VALID)
    if row["expired"]:
        raise Unauthenticated(f"the API token expired at {_utc(row['expires'])}; ask for a new one")
    caller = Caller(
        account_id=row["account_id"],
        principal=row["principal"],
        policies=parse_policies(row["policies"]),
        in_default_account=row["is_default"],
        token_id=row["token_id"],
        client_created=row["created"],
        stored_policies=row["policies"],
    )
    if keep is not None:
        verified.keep(pool, token_hash, caller, row["expires"], *keep)
    return caller


async def _look_up(pool: asyncpg.Pool, token_hash: bytes) -> asyncpg.Record | None:
    async with pool.acquire() as conn:
        row = await store.client_by_token(conn, token_hash)
        if row is not None and not row["expired"] and row["stale"]:
            await store.touch_token(conn, row["account_id"], token_hash)
    return row


async def default_account(conn: asyncpg.Connection) -> UUID | None:
    """The default account's ID; None until it is made (`ensure_default_account`)."""
    row = await store.default_account(conn)
    return None if row is None else row["account_id"]


async def ensure_default_account(conn: asyncpg.Connection) -> UUID:
    row = await store.default_account(conn)
    if row is None:
        row = await store.insert_account(conn, uuid.uuid4(), "default", is_default=True)
    return row["account_id"]


async def bootstrap_admin(pool: asyncpg.Pool, token: str | None) -> str | None:
    """Ensures the admin client of the default account.

    With `token` (ENGRAM_BOOTSTRAP_TOKEN), that value becomes the admin's bootstrap token,
    replacing the one an earlier value made (other admin tokens stay), unless a bootstrap token
    of that value was revoked or replaced before: then it stays revoked, nothing changes, and a
    warning says so (never the token). Without it, the first start creates an admin token and
    returns it (to be printed once); later starts return None, also once every admin token was
    revoked (`engram client token admin` issues one).
    """
    admin_policies = [p.as_json() for p in ADMIN_POLICIES]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('engram.bootstrap'))")
        account_id = await ensure_default_account(conn)
        first = await store.get_client(conn, account_id, ADMIN_PRINCIPAL) is None
        starter = Actor(ISSUER_BOOTSTRAP if token is not None else ISSUER_FIRST_START, None, None)
        if first:
            await store.insert_client(
                conn, account_id, ADMIN_PRINCIPAL, "Administrator", admin_policies
            )
            await events_store.record(
                conn,
                starter,
                "createClient",
                account_id=account_id,
                kind="client",
                target=ADMIN_PRINCIPAL,
                principal=ADMIN_PRINCIPAL,
                changes={"name": "Administrator", "policies": admin_policies},
            )
        if token is not None:
            revoked = await store.bootstrap_token_revoked(conn, hash_token(token))
            if revoked is not None:
                log.warning(
                    "ENGRAM_BOOTSTRAP_TOKEN holds a token that was revoked (at %s): it stays "
                    "revoked; give the setting a new value, or unset it",
                    revoked.astimezone(UTC).isoformat(timespec="seconds"),
                )
                return None
            # The setting's token replaces the one an earlier setting made; others stay.
            replaced, made = await store.replace_bootstrap_token(
                conn,
                hash_token(token),
                account_id,
                ADMIN_PRINCIPAL,
                token_prefix(token),
                ISSUER_BOOTSTRAP,
            )
            await events_store.record_tokens(conn, starter, "revokeClientToken", replaced)
            await events_store.record_tokens(conn, starter, "createClientToken", made)
            return None
        if not first:
            return None
        created = new_token()
        row = await store.insert_token(
            conn,
            hash_token(created),
            account_id,
            ADMIN_PRINCIPAL,
            issued_by=ISSUER_FIRST_START,
            prefix=token_prefix(created),
        )
        await events_store.record_tokens(conn, starter, "createClientToken", [row])
        return created


async def create_account(pool: asyncpg.Pool, caller: Caller, *, name: str) -> Account:
    caller.require(("INSERT", resources.ACCOUNT))
    if not caller.in_default_account:
        raise AccessDenied("accounts can be created only by clients of the default account")
    async with pool.acquire() as conn, conn.transaction():
        row = await store.insert_account(conn, uuid.uuid4(), _check_name(name, "account"))
        await events_store.record(
            conn,
            _actor(caller),
            "createAccount",
            account_id=row["account_id"],
            kind="account",
            target=str(row["account_id"]),
            changes={"name": row["name"]},
        )
    return Account.of(row)


async def update_account(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    name: str,
    expected_name: str | None = None,
) -> Account:
    """Renames the account (the caller's unless `account_id`: a client of the default account
    reaches every account, another client its own alone). With `expected_name` (the name the
    change was based on), an account named otherwise now is refused as a Conflict and nothing
    changes. Names need not be unique, as createAccount's."""
    caller.require(("UPDATE", resources.ACCOUNT))
    account_id = caller.reach_account(account_id)
    async with pool.acquire() as conn, conn.transaction():
        await _as_now(conn, caller, ("UPDATE", resources.ACCOUNT), account_id)
        current = await store.lock_account(conn, account_id, to="rename")
        if current is None:
            raise NotFound(f"account {account_id} not found")
        checked = _check_name(name, "account", current["name"])
        if expected_name is not None and current["name"] != expected_name:
            raise Conflict(
                f"account {account_id} was renamed to {current['name']!r} after the name this "
                f"change was based on ({expected_name!r}); nothing was changed: read it again "
                "and rename what it is now if it must change"
            )
        row = await store.rename_account(conn, account_id, checked)
        await events_store.record(
            conn,
            _actor(caller),
            "updateAccount",
            account_id=account_id,
            kind="account",
            target=str(account_id),
            changes={"name": checked, "previousName": current["name"]},
        )
    return Account.of(row)


def _held(counts: Mapping[str, int]) -> str:
    """`counts` by kind as words: "2 clients and 1 agent", "more than 10,000 executions"."""
    said = []
    for kind, n in counts.items():
        if n:
            number = f"more than {store.HELD_COUNTED:,}" if n > store.HELD_COUNTED else str(n)
            said.append(f"{number} {kind}{'' if n == 1 else 's'}")
    return said[0] if len(said) == 1 else f"{', '.join(said[:-1])} and {said[-1]}"


async def delete_account(pool: asyncpg.Pool, caller: Caller, *, account_id: UUID) -> Account:
    """Deletes an account that holds nothing: no client, no agent (and so no memory record,
    session or execution). One that holds any is refused as a Conflict counting what it holds
    and saying what to delete first. Only clients of the default account may, and never the
    default account. The account is locked before anything is counted (after the caller's
    client, as every write in it: store.lock_account): a client being created in it meanwhile
    is counted (its commit comes first), or finds no account (it waits for this one's)."""
    caller.require(("DELETE", resources.ACCOUNT))
    if not caller.in_default_account:
        raise AccessDenied("accounts can be deleted only by clients of the default account")
    async with pool.acquire() as conn, conn.transaction():
        await _as_now(conn, caller, ("DELETE", resources.ACCOUNT), caller.account_id)
        current = await store.lock_account(conn, account_id, to="delete")
        if current is None:
            raise NotFound(f"account {account_id} not found")
        if current["is_default"]:
            raise BadInput("the default account cannot be deleted: its clients manage the others")
        held = await store.account_holdings(conn, account_id)
        if any(held.values()):
            first = []
            if held["client"]:
                first.append(
                    "delete its clients first (deleteClient with its accountId, or `engram "
                    "client delete PRINCIPAL --account ID`)"
                )
            if held["agent"]:
                first.append(
                    "an agent is never deleted, so neither is an account that holds one, with "
                    "its memory records, sessions and executions: rename it instead"
                )
            raise Conflict(
                f"account {account_id} ({current['name']!r}) still holds {_held(held)}; "
                f"nothing was deleted: {'; '.join(first)}"
            )
        row = await store.delete_account(conn, account_id)
        # In the deleting client's account: the deleted account's own events went with it.
        await events_store.record(
            conn,
            _actor(caller),
            "deleteAccount",
            account_id=caller.account_id,
            kind="account",
            target=str(account_id),
            changes={"name": current["name"]},
        )
    return Account.of(row)


def _reachable(caller: Caller, keys: list[Any]) -> list[Any]:
    """The keys (each leading with an account) in accounts the caller reaches: those of another
    tenant's name nothing it may find."""
    reached = []
    for key in keys:
        try:
            caller.reach_account(key[0])
        except NotFound:
            continue
        reached.append(key)
    return reached


async def get_accounts(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID]]
) -> dict[tuple[UUID], Account]:
    """The accounts of `keys` (each a 1-tuple of its ID) that exist and the caller reaches
    (`_reachable`), in one query."""
    caller.require(("SELECT", resources.ACCOUNT))
    reached = _reachable(caller, keys)
    if not reached:
        return {}
    async with pool.acquire() as conn:
        rows = await store.get_accounts(conn, [k[0] for k in reached])
    return {(r["account_id"],): Account.of(r) for r in rows}


async def list_accounts(
    pool: asyncpg.Pool, caller: Caller, *, after: tuple[str, UUID] | None, limit: int
) -> list[Account]:
    """The accounts by name, then ID, after the (name, account_id) `after`: every account for a
    client of the default account, as it reaches every account (Caller.reach_account); another
    client's own alone, as it reaches no other."""
    caller.require(("SELECT", resources.ACCOUNT))
    only = None if caller.in_default_account else caller.account_id
    async with pool.acquire() as conn:
        rows = await store.list_accounts(conn, only, after, limit)
    return [Account.of(r) for r in rows]


async def create_client(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    principal: str,
    name: str,
    policies: Iterable[Mapping[str, Any]],
) -> Client:
    caller.require(("INSERT", resources.CLIENT))
    account_id = caller.reach_account(account_id)
    check_principal(principal)
    if principal.lower().startswith(AGENT_PREFIX):
        raise BadInput(
            f"principal must not start with {AGENT_PREFIX!r}, which names an agent (the "
            "`modifiedBy` of what it writes): a client so named would pass for one in every "
            "record and execution it changes"
        )
    given = parse_policies(policies, strict=True)
    what = f"the policies given to client {principal!r} allow"
    caller.require_covers(given, what)
    parsed = [p.as_json() for p in given]
    async with pool.acquire() as conn, conn.transaction():
        now, _ = await _as_now(conn, caller, ("INSERT", resources.CLIENT), account_id)
        # Locked until the client is written: an account being deleted is gone (or waits).
        if await store.lock_account(conn, account_id, to="write in") is None:
            raise NotFound(f"account {account_id} not found")
        now.require_covers(given, what)
        row = await store.insert_client(
            conn, account_id, principal, _check_name(name, "client"), parsed
        )
        if row is not None:
            await events_store.record(
                conn,
                _actor(caller),
                "createClient",
                account_id=account_id,
                kind="client",
                target=principal,
                principal=principal,
                changes={"name": row["name"], "policies": parsed},
            )
    if row is None:
        raise Conflict(f"a client with principal {principal!r} already exists in this account")
    return Client.of(row)


async def get_client(
    pool: asyncpg.Pool, caller: Caller, *, account_id: UUID | None, principal: str
) -> Client | None:
    caller.require(("SELECT", resources.CLIENT))
    account_id = caller.reach_account(account_id)
    async with pool.acquire() as conn:
        row = await store.get_client(conn, account_id, principal)
    return Client.of(row) if row else None


async def get_clients(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, str]]
) -> dict[tuple[UUID, str], Client]:
    """The clients of `keys` (account, principal) that get_client finds, in one query."""
    caller.require(("SELECT", resources.CLIENT))
    reached = _reachable(caller, keys)
    if not reached:
        return {}
    async with pool.acquire() as conn:
        rows = await store.get_clients(conn, reached)
    return {(r["account_id"], r["principal"]): Client.of(r) for r in rows}


async def list_clients(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    after: str | None,
    limit: int,
) -> list[Client]:
    """The account's clients by principal, after the principal `after`."""
    caller.require(("SELECT", resources.CLIENT))
    account_id = caller.reach_account(account_id)
    async with pool.acquire() as conn:
        rows = await store.list_clients(conn, account_id, after, limit)
    return [Client.of(r) for r in rows]


async def update_client(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    principal: str,
    name: str | None,
    policies: Iterable[Mapping[str, Any]] | None,
    expected_modified: datetime | None = None,
) -> Client:
    """Changes what is given. With `expected_modified` (the `modified` the change was based
    on), a client changed since is refused as a Conflict and nothing changes."""
    caller.require(("UPDATE", resources.CLIENT))
    account_id = caller.reach_account(account_id)
    given = parse_policies(policies, strict=True) if policies is not None else ()
    what = f"the policies given to client {principal!r} allow"
    caller.require_covers(given, what)
    parsed = [p.as_json() for p in given] if policies is not None else None
    async with pool.acquire() as conn, conn.transaction():
        now, current = await _lock_covered_client(
            conn, caller, ("UPDATE", resources.CLIENT), account_id, principal
        )
        now.require_covers(given, what)
        if expected_modified is not None and current["modified"] != expected_modified:
            raise Conflict(
                f"client {principal!r} was changed at {_utc(current['modified'])}, after the "
                f"version this change was based on (modified {_utc(expected_modified)}); "
                "nothing was changed: read it again and make the change to what it holds now"
            )
        row = await store.update_client(
            conn,
            account_id,
            principal,
            _check_name(name, "client", current["name"]) if name is not None else None,
            parsed,
        )
        await events_store.record(
            conn,
            _actor(caller),
            "updateClient",
            account_id=account_id,
            kind="client",
            target=principal,
            principal=principal,
            changes=_client_changes(current, row),
        )
    verified.forget()  # again once committed: a lookup meanwhile may have kept the old policies
    return Client.of(row)


def _client_changes(before: asyncpg.Record, after: asyncpg.Record) -> dict[str, Any]:
    """What an update changed of a client, as its event records it: the name and the
    policies, each with what it was, where they differ."""
    changes: dict[str, Any] = {}
    if after["name"] != before["name"]:
        changes |= {"name": after["name"], "previousName": before["name"]}
    if after["policies"] != before["policies"]:
        changes |= {"policies": after["policies"], "previousPolicies": before["policies"]}
    return changes


async def delete_client(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    principal: str,
    expected_modified: datetime | None = None,
) -> Client:
    """Deletes the client and its tokens. With `expected_modified` (the `modified` of the
    client the deletion was asked for), a client changed since, or deleted and created again
    with the same principal, is refused as a Conflict and nothing is deleted."""
    caller.require(("DELETE", resources.CLIENT))
    account_id = caller.reach_account(account_id)
    if account_id == caller.account_id and principal == caller.principal:
        raise BadInput("a client cannot delete itself")
    async with pool.acquire() as conn, conn.transaction():
        # The caller's grants as they are now, and the client, locked from the check to the
        # delete: no change can come between them.
        _, current = await _as_now(
            conn, caller, ("DELETE", resources.CLIENT), account_id, principal
        )
        if current is None:
            raise NotFound(f"client {principal!r} not found")
        if expected_modified is not None and current["modified"] != expected_modified:
            raise Conflict(
                f"client {principal!r} was changed or re-created since the version this "
                f"deletion was based on (modified {_utc(expected_modified)}; it is now "
                f"modified {_utc(current['modified'])}); nothing was deleted: read it again "
                "and delete what it is now if it must go"
            )
        row, tokens = await store.delete_client(conn, account_id, principal)
        await events_store.record(
            conn,
            _actor(caller),
            "deleteClient",
            account_id=account_id,
            kind="client",
            target=principal,
            principal=principal,
            changes={"name": current["name"]},
        )
        # And one for each token that went with it: what revoked a token is found by its ID
        # (`target`) whichever way it went, as with revokeClientToken.
        await events_store.record_tokens(conn, _actor(caller), "deleteClient", tokens)
    verified.forget()  # again once committed: a lookup meanwhile may have kept its tokens
    return Client.of(row)


async def issue_client_token(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    principal: str,
    expires: datetime | None = None,
) -> IssuedToken:
    """A new token for the client, valid until `expires` (None: until revoked), naming who
    issued it (`_issuer`)."""
    caller.require(("INSERT", resources.CLIENT_TOKEN))
    account_id = caller.reach_account(account_id)
    if expires is not None and expires <= datetime.now(UTC):
        raise BadInput(f"expires must be in the future, got {_utc(expires)}")
    token = new_token()
    async with pool.acquire() as conn, conn.transaction():
        await _lock_covered_client(
            conn, caller, ("INSERT", resources.CLIENT_TOKEN), account_id, principal
        )
        issued_by, issued_by_account, issued_by_token = _issuer(caller)
        row = await store.insert_token(
            conn,
            hash_token(token),
            account_id,
            principal,
            issued_by=issued_by,
            issued_by_account=issued_by_account,
            issued_by_token=issued_by_token,
            prefix=token_prefix(token),
            expires=expires,
        )
        await events_store.record_tokens(
            conn,
            _actor(caller),
            "createClientToken",
            [row],
            {"expires": _utc(expires) if expires is not None else None},
        )
    return IssuedToken(token, TokenInfo.of(row, caller))


async def create_client_token(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    principal: str,
    expires: datetime | None = None,
) -> str:
    """`issue_client_token`'s secret alone."""
    return (
        await issue_client_token(
            pool, caller, account_id=account_id, principal=principal, expires=expires
        )
    ).token


async def list_client_tokens(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    principal: str,
    after: tuple[datetime, UUID] | None = None,
    limit: int | None = None,
) -> list[TokenInfo]:
    """The client's tokens, newest first: IDs, prefixes and times, never the secrets; after a
    (created, token_id) keyset, at most `limit` (None: all)."""
    caller.require(("SELECT", resources.CLIENT_TOKEN))
    account_id = caller.reach_account(account_id)
    async with pool.acquire() as conn:
        (rows,) = await store.list_token_pages(conn, account_id, [(principal, after, limit)])
    return [TokenInfo.of(r, caller) for r in rows]


class TokenPage(NamedTuple):
    """A page of a client's tokens, as `list_client_tokens` takes its arguments."""

    account_id: UUID | None
    principal: str
    after: tuple[datetime, UUID] | None
    limit: int | None


async def list_client_token_pages(
    pool: asyncpg.Pool, caller: Caller, *, pages: Sequence[TokenPage]
) -> list[list[TokenInfo] | NotFound]:
    """Pages of many clients' tokens, each as `list_client_tokens` reads it, in one query per
    account; a page in an account the caller cannot reach is that account's NotFound."""
    caller.require(("SELECT", resources.CLIENT_TOKEN))
    found: list[list[TokenInfo] | NotFound] = [[] for _ in pages]
    by_account: dict[UUID, list[int]] = {}
    for i, page in enumerate(pages):
        try:
            by_account.setdefault(caller.reach_account(page.account_id), []).append(i)
        except NotFound as error:
            found[i] = error
    async with pool.acquire() as conn:
        for account_id, indexes in by_account.items():
            asked = [(pages[i].principal, pages[i].after, pages[i].limit) for i in indexes]
            rows = await store.list_token_pages(conn, account_id, asked)
            for i, page_rows in zip(indexes, rows, strict=True):
                found[i] = [TokenInfo.of(r, caller) for r in page_rows]
    return found


async def get_client_tokens(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, str, UUID]]
) -> dict[tuple[UUID, str, UUID], TokenInfo]:
    """The tokens of `keys` (account, principal, token_id) in accounts the caller reaches, in
    one query (`node(id)` and `nodes(ids)` read a token this way)."""
    caller.require(("SELECT", resources.CLIENT_TOKEN))
    reached = _reachable(caller, keys)
    if not reached:
        return {}
    async with pool.acquire() as conn:
        rows = await store.get_tokens(conn, reached)
    return {(r["account_id"], r["principal"], r["token_id"]): TokenInfo.of(r, caller) for r in rows}


async def revoke_client_token(
    pool: asyncpg.Pool, caller: Caller, *, account_id: UUID | None, principal: str, token_id: UUID
) -> TokenInfo:
    """Deletes one of the client's tokens: requests sending it are refused from now on."""
    caller.require(("DELETE", resources.CLIENT_TOKEN))
    account_id = caller.reach_account(account_id)
    async with pool.acquire() as conn, conn.transaction():
        # The caller's grants as they are now, locked until the token is deleted.
        await _as_now(conn, caller, ("DELETE", resources.CLIENT_TOKEN), account_id)
        row = await store.delete_token(conn, account_id, principal, token_id)
        if row is not None:
            await events_store.record_tokens(conn, _actor(caller), "revokeClientToken", [row])
    verified.forget()  # again once committed: a lookup meanwhile may have kept the token
    if row is None:
        raise NotFound(f"client {principal!r} has no token {token_id}")
    return TokenInfo.of(row, caller)


async def revoke_tokens_issued_by(
    pool: asyncpg.Pool, caller: Caller, *, token_id: UUID
) -> list[TokenInfo]:
    """Deletes the token `token_id` if it is still there (it is usually revoked first) and every
    token whose chain of issuers (`issued_by_token`) leads back to it, in the accounts the
    caller reaches: every account for a client of the default account; its own otherwise,
    through the tokens its account's clients issued. All or none, oldest first; none found is
    an empty list, not NotFound: a revoked token leaves nothing but its ID in what it issued,
    so an unknown ID cannot be told from one whose tokens are gone, and a second call (a retry)
    answers what the first left, nothing."""
    caller.require(("DELETE", resources.CLIENT_TOKEN))
    for attempt in range(1, REVOKE_TRIES + 1):
        try:
            revoked = await _revoke_chain(pool, caller, token_id)
            break
        except asyncpg.DeadlockDetectedError:
            # Another revocation of an overlapping chain, each waiting on the other's deletes:
            # PostgreSQL rolled this one back whole, so it starts again.
            if attempt == REVOKE_TRIES:
                raise Conflict(
                    "other revocations of the same tokens ran at the same time; nothing was "
                    "revoked by this one: send it again"
                ) from None
    verified.forget()  # again once committed: a lookup meanwhile may have kept a token
    return [TokenInfo.of(r, caller) for r in revoked]


REVOKE_TRIES = 3  # revoke_tokens_issued_by's attempts when overlapping revocations deadlock


async def _revoke_chain(pool: asyncpg.Pool, caller: Caller, token_id: UUID) -> list[asyncpg.Record]:
    async with pool.acquire() as conn, conn.transaction():
        # The caller's grants as they are now, locked until the tokens are deleted.
        await _as_now(conn, caller, ("DELETE", resources.CLIENT_TOKEN), caller.account_id)
        revoked = await _walk_chain(conn, caller, token_id, store.delete_token_chain)
        # One event for each token revoked, in its account, naming the token asked for.
        await events_store.record_tokens(
            conn, _actor(caller), "revokeTokensIssuedBy", revoked, {"tokenId": str(token_id)}
        )
        return revoked


async def _walk_chain(
    conn: asyncpg.Connection,
    caller: Caller,
    token_id: UUID,
    step: Callable[..., Awaitable[list[asyncpg.Record]]],
) -> list[asyncpg.Record]:
    """The token `token_id` and every token whose chain of issuers leads back to it, oldest
    first, in the accounts the caller reaches, as `step` (store.token_chain, which reads them, or
    store.delete_token_chain) finds them in one account. Again from every token found so far,
    until a round finds no other: a round reaches the accounts where the tokens it starts from
    issued some, and (deleting) one issued meanwhile by a token of the chain (whose issuing
    request holds it locked, so that its delete waits for that commit) after the round read
    the chain."""
    chain: dict[UUID, asyncpg.Record] = {}
    roots = [token_id]
    while True:
        if caller.in_default_account:
            accounts = await store.accounts_issued_from(conn, roots)
        else:
            accounts = [caller.account_id]
        new: list[UUID] = []
        for account_id in accounts:
            for row in await step(
                conn, account_id, roots, own_issuers=not caller.in_default_account
            ):
                if row["token_id"] not in chain:
                    chain[row["token_id"]] = row
                    new.append(row["token_id"])
        if not new:
            return sorted(chain.values(), key=lambda r: (r["created"], r["token_id"]))
        roots += new


async def list_tokens_issued_by(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    token_id: UUID,
    after: tuple[datetime, UUID] | None = None,
    limit: int | None = None,
) -> list[TokenInfo]:
    """The tokens `revoke_tokens_issued_by` would revoke now, left as they are: the token
    `token_id` if it is still there and every token whose chain of issuers leads back to it, in
    the accounts the caller reaches, oldest first; after a (created, token_id) keyset, at most
    `limit` (None: all). Each page walks the whole chain (in one snapshot) to tell which tokens
    are in it."""
    caller.require(("SELECT", resources.CLIENT_TOKEN))
    async with (
        pool.acquire() as conn,
        conn.transaction(isolation="repeatable_read", readonly=True),
    ):
        rows = await _walk_chain(conn, caller, token_id, store.token_chain)
    if after is not None:
        rows = [r for r in rows if (r["created"], r["token_id"]) > after]
    return [TokenInfo.of(r, caller) for r in rows[:limit]]


@dataclass(frozen=True)
class AdminEvent:
    """A change to an account, a client or a token, and who made it (migration 0041)."""

    event_id: UUID
    account_id: UUID  # the account it is in (for a deleted account, the deleting client's)
    at: datetime
    # The principal of the client whose request made it, or one of ISSUERS; with that client's
    # account and the token its request sent (None for ISSUERS).
    actor: str
    actor_account: UUID | None
    actor_token: UUID | None
    operation: str  # the GraphQL mutation's name
    target_kind: str  # account, client or token
    target: str  # the account's ID, the client's principal or the token's ID
    target_principal: str | None  # the client, for a client or a token
    changes: dict[str, Any]

    @classmethod
    def of(cls, row: asyncpg.Record, caller: Caller) -> "AdminEvent":
        """The event as `caller` may see it: a client outside the default account reads a change
        a client of the default account made in its account as ISSUER_DEFAULT_ACCOUNT's, without
        that client's account and token, or the token it revoked the tokens issued by, which are
        the operator's (as TokenInfo.of shows a token's issuer); nor that token where the
        command line revoked them."""
        event = cls(
            row["event_id"],
            row["account_id"],
            row["at"],
            row["actor"],
            row["actor_account"],
            row["actor_token"],
            row["operation"],
            row["target_kind"],
            row["target"],
            row["target_principal"],
            row["changes"],
        )
        if caller.in_default_account or event.actor_account == event.account_id:
            return event
        # Not its account's clients': the operator's. The token a revocation was given is then
        # one of any account's (the operator's own, by the `engram` command too).
        changes = {k: v for k, v in event.changes.items() if k != "tokenId"}
        if event.actor_account is None:  # a start's or the command line's: no ID to hide
            return replace(event, changes=changes)
        return replace(
            event,
            actor=ISSUER_DEFAULT_ACCOUNT,
            actor_account=None,
            actor_token=None,
            changes=changes,
        )


async def list_admin_events(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    account_id: UUID | None,
    token_id: UUID | None,
    after: tuple[datetime, UUID] | None,
    limit: int,
) -> list[AdminEvent]:
    """Who changed accounts, clients and tokens, newest first, after an (at, event_id) keyset:
    the events of the account (the caller's unless `account_id`, which a client of the default
    account may name for any account, another client for its own alone); with `token_id`, those
    the requests sending that token made alone, and then, without `account_id`, in every
    account the caller reaches: every account for a client of the default account, its own for
    another, where only its account's clients' tokens are found (not the operator's)."""
    caller.require(("SELECT", resources.ACCOUNT_EVENTS))
    if token_id is not None and account_id is None and caller.in_default_account:
        async with pool.acquire() as conn:
            rows = await events_store.token_events(conn, token_id, after, limit)
        return [AdminEvent.of(r, caller) for r in rows]
    reached = caller.reach_account(account_id)
    async with pool.acquire() as conn:
        if token_id is None:
            rows = await events_store.account_events(conn, reached, after, limit)
        else:
            rows = await events_store.token_events(
                conn,
                token_id,
                after,
                limit,
                account_id=reached,
                actor_account=None if caller.in_default_account else reached,
            )
    return [AdminEvent.of(r, caller) for r in rows]
