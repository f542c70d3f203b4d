"""Tokens this process verified in the last second, so that a client's stream of GraphQL
requests costs one token lookup a second instead of one each (a pool connection, a query and
the pool's reset: a quarter of a search's round trips).

A change to clients or tokens made through this process (auth/store.py: revoking a token,
deleting or changing a client, replacing the bootstrap token) forgets every entry once it
has committed, and a lookup that was under way meanwhile is not kept; so here it takes effect
for the next request. A change made by another process (another replica, `engram` on the
command line) takes effect here within VERIFIED_SECONDS. An entry never outlives its token's
expiry. Refusals are never kept: a token that did not verify is looked up every time.

Tokens verified in the last KNOWN_SECONDS are also noted as known (`known`), which decides
only which line a lookup waits in, never whether a token is taken without one: a token not
known (a stranger's random one, or a client's first after a restart) is looked up on a small
share of the pool (auth/service.py `STRANGERS`), so that a flood of tokens no client holds
queues there, while a known token's lookup and the tenants' work find the pool's other
connections. A lookup that refuses a token makes it unknown again.
"""

import time
from datetime import UTC, datetime
from typing import Any

VERIFIED_SECONDS = 1.0
KNOWN_SECONDS = 600.0
MAX_ENTRIES = 10_000

# (pool, token hash) -> (caller, monotonic time it stops serving). Keyed by the pool itself,
# not its id: several pools (databases) live in one process in tests, and a held pool's id
# cannot be reused by another.
_entries: dict[tuple[Any, bytes], tuple[Any, float]] = {}
_generation = 0
# Token hash -> monotonic time a lookup last verified it. Not per pool: a line to wait in,
# nothing more, so tests' many pools share it harmlessly.
_known: dict[bytes, float] = {}


def generation() -> int:
    """Read before a lookup and handed to `keep`: a change committed meanwhile wins."""
    return _generation


def forget() -> None:
    """Every entry goes: a client or token changed (called once the change committed)."""
    global _generation
    _generation += 1
    _entries.clear()


def recall(pool: Any, token_hash: bytes) -> Any | None:
    entry = _entries.get((pool, token_hash))
    if entry is None:
        return None
    if entry[1] <= time.monotonic():
        del _entries[(pool, token_hash)]
        return None
    return entry[0]


def keep(
    pool: Any, token_hash: bytes, caller: Any, expires: datetime | None, since: int, started: float
) -> None:
    """Keeps `caller` for VERIFIED_SECONDS from `started` (when its lookup began, by
    time.monotonic()), or until the token expires if sooner, unless `forget` ran since
    generation `since`."""
    if since != _generation:
        return
    until = started + VERIFIED_SECONDS
    if expires is not None:
        until = min(until, started + (expires - datetime.now(UTC)).total_seconds())
    if len(_entries) >= MAX_ENTRIES:
        now = time.monotonic()
        for key in [k for k, (_, end) in _entries.items() if end <= now]:
            del _entries[key]
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
    _entries[(pool, token_hash)] = (caller, until)


def known(token_hash: bytes) -> bool:
    """Whether a lookup verified the token in the last KNOWN_SECONDS."""
    at = _known.get(token_hash)
    return at is not None and time.monotonic() - at < KNOWN_SECONDS


def note(token_hash: bytes, verified: bool) -> None:
    """What a lookup found: the token verified (now known), or was refused (no longer)."""
    if not verified:
        _known.pop(token_hash, None)
        return
    now = time.monotonic()
    if len(_known) >= MAX_ENTRIES and token_hash not in _known:
        for key in [k for k, at in _known.items() if now - at >= KNOWN_SECONDS]:
            del _known[key]
        if len(_known) >= MAX_ENTRIES:
            _known.clear()
    _known[token_hash] = now
