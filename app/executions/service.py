"""Executions, sessions and transcript events as records, and their reads behind the grants
on financial.ActionExecution.*."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, NamedTuple, Self
from uuid import UUID

import asyncpg

from app.auth import resources
from app.auth.caller import Caller
from app.errors import AccessDenied
from app.executions import store


class _OfRow:
    """A record read from its row: the columns share the dataclass's field names."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @classmethod
    def of(cls, row: asyncpg.Record) -> Self:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Execution(_OfRow):
    account_id: UUID
    action_id: UUID
    execution_id: UUID
    action_version: int
    session_id: str | None
    turn: int | None
    invocation_number: int
    kind: str
    status: str
    preview: bool
    principal: str
    input: Any
    output: Any
    error: str | None
    created: datetime
    modified: datetime
    replay_of: UUID | None = None  # a replay: the committed turn whose input it re-ran
    # The token the starting request sent, of a client of the execution's account (migration
    # 0042); None for a caller made in process and for executions started before.
    token_id: UUID | None = None


@dataclass(frozen=True)
class TranscriptEvent(_OfRow):
    account_id: UUID
    action_id: UUID
    execution_id: UUID
    sequence: int
    invocation_number: int
    type: str
    data: Any
    created: datetime


@dataclass(frozen=True)
class Session(_OfRow):
    account_id: UUID
    action_id: UUID
    session_id: str
    turns: int
    created: datetime
    modified: datetime


async def get_execution(
    pool: asyncpg.Pool, caller: Caller, *, execution_id: UUID, action_id: UUID | None = None
) -> Execution | None:
    caller.require(("SELECT", resources.EXECUTION_DOCUMENT))
    async with pool.acquire() as conn:
        row = await store.get_execution(conn, caller.account_id, action_id, execution_id)
    return Execution.of(row) if row else None


async def get_executions(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, UUID]]
) -> dict[tuple[UUID, UUID], Execution]:
    """The executions named by (action_id, execution_id) that exist, in one query."""
    caller.require(("SELECT", resources.EXECUTION_DOCUMENT))
    async with pool.acquire() as conn:
        rows = await store.get_executions(conn, caller.account_id, [k[1] for k in keys])
    found = {(r["action_id"], r["execution_id"]): Execution.of(r) for r in rows}
    return {k: found[k] for k in keys if k in found}


async def get_sessions(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, str]]
) -> dict[tuple[UUID, str], Session]:
    """The sessions named by (action_id, session_id) that exist, in one query."""
    caller.require(("SELECT", resources.SESSION_INDEX))
    async with pool.acquire() as conn:
        rows = await store.get_sessions(conn, caller.account_id, keys)
    return {(r["action_id"], r["session_id"]): Session.of(r) for r in rows}


class TranscriptPage(NamedTuple):
    """A page of an execution's transcript: its events after `after_sequence`, at most `limit`."""

    action_id: UUID
    execution_id: UUID
    after_sequence: int | None
    limit: int


# Reading transcript events, listed or by their IDs.
READ_TRANSCRIPT: tuple[resources.Grant, ...] = (("SELECT", resources.EXECUTION_TRANSCRIPT),)


async def list_transcript_pages(
    pool: asyncpg.Pool, caller: Caller, *, pages: Sequence[TranscriptPage]
) -> list[list[TranscriptEvent]]:
    """Pages of transcripts, in one query: each execution's events in order, every
    invocation's, failed attempts included (an attempt's once it has ended)."""
    caller.require(*READ_TRANSCRIPT)
    async with pool.acquire() as conn:
        found = await store.list_event_pages(conn, caller.account_id, pages)
    return [[TranscriptEvent.of(r) for r in rows] for rows in found]


async def get_transcript_events(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, UUID, int]]
) -> dict[tuple[UUID, UUID, int], TranscriptEvent]:
    """The transcript events named by (action_id, execution_id, sequence) that the
    transcripts list (none of an attempt still running), in one query, behind the grant that
    lists them."""
    caller.require(*READ_TRANSCRIPT)
    async with pool.acquire() as conn:
        rows = await store.get_events(conn, caller.account_id, keys)
    return {(r["action_id"], r["execution_id"], r["sequence"]): TranscriptEvent.of(r) for r in rows}


class SessionPage(NamedTuple):
    """A page of an agent's sessions, newest first: after `after`, at most `limit`."""

    action_id: UUID
    after: tuple[datetime, str] | None
    limit: int


async def list_session_pages(
    pool: asyncpg.Pool, caller: Caller, *, pages: Sequence[SessionPage]
) -> list[list[Session]]:
    """Pages of agents' sessions, in one query."""
    caller.require(("SELECT", resources.SESSION_INDEX))
    async with pool.acquire() as conn:
        found = await store.list_session_pages(conn, caller.account_id, pages)
    return [[Session.of(r) for r in rows] for rows in found]


class ExecutionPage(NamedTuple):
    """A page of a session's executions (or, with `session_id` None, of the agent's), newest
    first: after `after`, at most `limit`."""

    action_id: UUID
    session_id: str | None
    after: tuple[datetime, UUID] | None
    limit: int


async def list_execution_pages(
    pool: asyncpg.Pool, caller: Caller, *, pages: Sequence[ExecutionPage]
) -> list[list[Execution] | AccessDenied]:
    """Pages of executions, in one query for the sessions' and one for the agents': a
    session's need SELECT on the session index, an agent's on the execution index, both on the
    execution document; a page whose grants are missing is that AccessDenied."""
    found: list[list[Execution] | AccessDenied] = [[] for _ in pages]
    async with pool.acquire() as conn:
        for by_session in (True, False):
            asked = [i for i, p in enumerate(pages) if (p.session_id is not None) == by_session]
            if not asked:
                continue
            index = resources.SESSION_INDEX if by_session else resources.EXECUTION_INDEX
            try:
                caller.require(("SELECT", index), ("SELECT", resources.EXECUTION_DOCUMENT))
            except AccessDenied as denied:
                for i in asked:
                    found[i] = denied
                continue
            rows = await store.list_execution_pages(
                conn, caller.account_id, [pages[i] for i in asked], by_session=by_session
            )
            for i, page_rows in zip(asked, rows, strict=True):
                found[i] = [Execution.of(r) for r in page_rows]
    return found


# Listing executions across agents: the grants an agent's executions list needs.
LIST_EXECUTIONS: tuple[resources.Grant, ...] = (
    ("SELECT", resources.EXECUTION_INDEX),
    ("SELECT", resources.EXECUTION_DOCUMENT),
)


async def list_token_executions(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    token_id: UUID,
    after: tuple[datetime, UUID] | None,
    limit: int,
) -> list[Execution]:
    """The executions of the caller's account, of every agent, that requests sending the token
    `token_id` started, newest first after a (created, execution_id) keyset. Each execution is
    in its caller's account, so a token of another account's client (the operator's, for a
    tenant) finds none."""
    caller.require(*LIST_EXECUTIONS)
    async with pool.acquire() as conn:
        rows = await store.token_executions(conn, caller.account_id, token_id, after, limit)
    return [Execution.of(r) for r in rows]
