"""Idempotency keys of writes (`addAgentMemory`, `addAgentMemories`, `deleteAgentMemory`,
`executeAction`, `rememberConversation` and MCP's `remember_conversation`).

A key is scoped to (account, principal, operation) and kept at least `KEEP_SECONDS`. A write
that carries one:
1. looks the key up first (`Key.previous`): a key already used with the same arguments answers
   with the first write's result (the caller re-reads what it names); with other arguments it
   is CONFLICT, naming the key;
2. otherwise writes, and records the key with its result in the write's own transaction
   (`Key.record`), so a write that never committed leaves no key. A concurrent duplicate's
   `record` waits for the first transaction and then raises `Duplicate`: its transaction rolls
   back, and it answers as in 1.

A client's keys go with it (deleteClient), and a client made again with its principal starts
with none: a write whose client was deleted after its request authenticated is refused when it
records its key (UNAUTHENTICATED), writing nothing, and a deletion waits for the writes
recording a key of the client.
"""

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from app.auth.caller import Caller
from app.errors import BadInput, Conflict, DomainError, Unauthenticated
from app.idempotency import store
from app.text import check_storable

MAX_KEY_LENGTH = 200
KEEP_SECONDS = 24 * 3600


class Duplicate(Exception):
    """Another request with this key committed first: roll back and answer with its result."""


@dataclass(frozen=True)
class Key:
    account_id: UUID
    principal: str
    operation: str
    key: str
    request: str  # digest of the arguments
    client_created: datetime | None = None  # the caller's client (None: a caller in process)

    async def previous(self, conn: asyncpg.Connection) -> dict[str, Any] | None:
        """The first write's result, or None when the key is new; CONFLICT for other arguments."""
        row = await store.find(conn, self.account_id, self.principal, self.operation, self.key)
        if row is None:
            return None
        if row["request"] != self.request:
            raise Conflict(
                f"idempotency key {self.key!r} was already used by {self.operation} with other "
                "arguments; a new request needs a new key"
            )
        return row["result"]

    async def record(self, conn: asyncpg.Connection, result: dict[str, Any]) -> None:
        """Stores the key with the write, inside the write's transaction."""
        if self.client_created is not None and not await store.lock_client(
            conn, self.account_id, self.principal, self.client_created
        ):
            raise self._client_gone()
        if not await store.insert(
            conn, self.account_id, self.principal, self.operation, self.key, self.request, result
        ):
            raise Duplicate(self.key)

    def lost(self) -> DomainError:
        """The refusal of a write that lost to the key's first request (`Duplicate`) and then
        found the key gone: its client was deleted meanwhile, with its keys (or, for a caller
        in process, the key was forgotten)."""
        if self.client_created is not None:
            return self._client_gone()
        return Conflict(
            f"idempotency key {self.key!r}: the request that used it first is no longer "
            "recorded; nothing was written by this one: send it again"
        )

    def _client_gone(self) -> Unauthenticated:
        return Unauthenticated(
            f"client {self.principal!r} was deleted while this request ran; nothing was written"
        )


def key_for(key: str | None, caller: Caller, operation: str, arguments: Any) -> Key | None:
    """The caller's key of a write (None without one), its arguments digested to compare
    retries."""
    if key is None:
        return None
    check_storable(key, "idempotencyKey")
    if not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise BadInput(f"idempotencyKey must be 1 to {MAX_KEY_LENGTH} characters, not blank")
    canonical = json.dumps(arguments, sort_keys=True, default=str, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return Key(caller.account_id, caller.principal, operation, key, digest, caller.client_created)
