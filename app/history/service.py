"""Operators' reads of a session's history (ActionSession.history, searchHistory, node(id)),
with the grant that reads transcripts. Record text is shown only to a reader who may read the
agent's memory, as in transcripts: the GraphQL edge reduces it (app/graphql/history.py)."""

from collections.abc import Sequence
from typing import NamedTuple
from uuid import UUID

import asyncpg

from app.auth import resources
from app.auth.caller import Caller
from app.embeddings.base import Embeds
from app.history import search as history_search
from app.history import store
from app.history.search import Event
from app.history.store import HistoryScope
from app.text import MAX_QUERY_CHARS, check_query

READ_HISTORY = (("SELECT", resources.EXECUTION_TRANSCRIPT),)


def _scope(
    caller: Caller, action_id: UUID, session_id: str, hidden_tools: tuple[str, ...] = ()
) -> HistoryScope:
    # Operators see every turn, live and preview.
    return HistoryScope(caller.account_id, action_id, session_id, None, True, hidden_tools)


class EventPage(NamedTuple):
    """A page of a session's kept events, in conversation order: after the (turn, sequence)
    `after`, at most `limit`."""

    action_id: UUID
    session_id: str
    after: tuple[int, int] | None
    limit: int


async def list_event_pages(
    pool: asyncpg.Pool, caller: Caller, *, pages: Sequence[EventPage]
) -> list[list[Event]]:
    """Pages of sessions' kept events, in one query."""
    caller.require(*READ_HISTORY)
    async with pool.acquire() as conn:
        found = await store.list_event_pages(conn, caller.account_id, pages)
    return [[Event.of(r) for r in rows] for rows in found]


async def get_events(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, str, UUID]]
) -> dict[tuple[UUID, str, UUID], Event]:
    """The events of `keys` (action_id, session_id, event_id) that get_event finds, in one
    query."""
    caller.require(*READ_HISTORY)
    async with pool.acquire() as conn:
        rows = await store.read_events_at(conn, caller.account_id, keys)
    return {(r["action_id"], r["session_id"], r["event_id"]): Event.of(r) for r in rows}


async def search_events(
    pool: asyncpg.Pool,
    embedder: Embeds,
    caller: Caller,
    *,
    action_id: UUID,
    session_id: str,
    query: str,
    limit: int,
    max_query_chars: int = MAX_QUERY_CHARS,
    hidden_tools: tuple[str, ...] = (),
) -> list[Event]:
    """The session's best-matching parts, ranked as the agent's search_history ranks them;
    without the events of `hidden_tools` (their results and the calls of them)."""
    caller.require(*READ_HISTORY)
    check_query(query, max_query_chars)
    scope = _scope(caller, action_id, session_id, hidden_tools)
    found = await history_search.search(pool, embedder, scope, query=query, limit=limit)
    return found.events
