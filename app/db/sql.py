"""Building SQL statements with numbered parameters."""

from collections.abc import Sequence
from typing import Any

# Above every (timestamp, uuid) keyset read newest first, as SQL literals: a page asked without
# `after` compares with these (`coalesce(after, ...)`), so that its keyset stays an index
# condition whether or not one was given.
NEWEST = "'infinity'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'"


class Params:
    """Collects query parameters; calling it with a value returns its `$n` placeholder, so a
    statement assembled from optional parts numbers its parameters without counting."""

    def __init__(self, *values: Any) -> None:
        self.values: list[Any] = list(values)

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def page_arrays(
    pages: Sequence[Sequence[Any]], *, keys: int, keyset: int | None = None
) -> list[list[Any]]:
    """The arrays a statement that reads several pages at once unnests, from pages
    (*keys, after, limit): one array per key, then `after`'s, then the limits'. With `keyset`,
    `after` is a keyset of that many values (None on a first page), split into one array each."""
    arrays = [[page[i] for page in pages] for i in range(keys)]
    if keyset is None:
        arrays.append([page[keys] for page in pages])
    else:
        arrays += [[page[keys][i] if page[keys] else None for page in pages] for i in range(keyset)]
    arrays.append([page[keys + 1] for page in pages])
    return arrays


def by_page(rows: Sequence[Any], pages: int) -> list[list[Any]]:
    """The rows of a statement that reads several pages at once (each row naming its page by
    `n`, counted from 1, as `unnest(...) WITH ORDINALITY` numbers them), page by page."""
    found: list[list[Any]] = [[] for _ in range(pages)]
    for r in rows:
        found[r["n"] - 1].append(r)
    return found


def held_token_sql(account: str, principal: str, token: str, *, also: str = "") -> str:
    """A SELECT of client `principal`'s policies while its token `token` exists (each a SQL
    expression, a parameter), both rows locked until the transaction ends: the client's FOR
    SHARE (a change of its policies, or its deletion, waits), then the token's FOR KEY SHARE
    (its deletion waits; its `last_used` is still written). Client before token, as a client's
    deletion takes them, so no revocation holds the token while it waits for the client.
    `also`: a further condition (`AND ...`). auth/store.py `share_token`'s
    statement, and the one statement of a turn's commit (executions/store.py `commit_turn`):
    here, as a store imports no other."""
    return f"""
        SELECT c.policies FROM clients c
        JOIN client_tokens t ON t.account_id = c.account_id AND t.principal = c.principal
        WHERE c.account_id = {account} AND c.principal = {principal} AND t.token_id = {token}
          {also}
        FOR SHARE OF c FOR KEY SHARE OF t
        """
