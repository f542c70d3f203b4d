"""SQL for the rows every run leaves: executions (a turn, an MCP tool call, an operator write,
an erasure), their transcript events, and sessions with their recalls. Called by
app/executions/service.py (the reads GraphQL serves), app/runtime (turns, calls, erasure,
liveness) and app/memory/operator.py (an operator's write is an execution).

Beside it in this package: liveness_store.py (process heartbeats and the turns dead processes
left), summary_store.py (a session's running summary and the turns after it), review_store.py
(the memory review's marks) and erasure_store.py (eraseSession)."""

from collections.abc import Sequence
from typing import Any, TypeAlias
from uuid import UUID

import asyncpg

from app.db.sql import by_page, page_arrays

Row: TypeAlias = asyncpg.Record


async def insert_execution(
    conn: asyncpg.Connection,
    *,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    action_version: int,
    session_id: str | None,
    turn: int | None,
    kind: str,
    status: str,
    preview: bool,
    principal: str,
    input: Any,
    invocation_number: int = 1,
    boot_id: UUID | None = None,
    replay_of: UUID | None = None,
    output: Any = None,
) -> Row:
    """`boot_id`: the process running a RUNNING turn (app/runtime/liveness.py)."""
    return await conn.fetchrow(
        """
        INSERT INTO executions (account_id, action_id, execution_id, action_version, session_id,
                                turn, invocation_number, kind, status, preview, principal, input,
                                boot_id, replay_of, output)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
        RETURNING *
        """,
        account_id,
        action_id,
        execution_id,
        action_version,
        session_id,
        turn,
        invocation_number,
        kind,
        status,
        preview,
        principal,
        input,
        boot_id,
        replay_of,
        output,
    )


async def get_execution(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID | None, execution_id: UUID
) -> Row | None:
    return await conn.fetchrow(
        """
        SELECT * FROM executions
        WHERE account_id = $1 AND ($2::uuid IS NULL OR action_id = $2) AND execution_id = $3
        """,
        account_id,
        action_id,
        execution_id,
    )


async def replayed_turn(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, execution_id: UUID
) -> Row | None:
    """The turn a replay re-runs, through any replays between (a replay of a replay sees what
    its original saw, which is what the first turn saw): its `turn` and `preview`."""
    return await conn.fetchrow(
        """
        WITH RECURSIVE chain AS (
            SELECT execution_id, replay_of, turn, preview FROM executions
            WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
            UNION ALL
            SELECT e.execution_id, e.replay_of, e.turn, e.preview
            FROM chain c JOIN executions e
                ON e.account_id = $1 AND e.action_id = $2 AND e.execution_id = c.replay_of
        )
        SELECT turn, preview FROM chain WHERE replay_of IS NULL
        """,
        account_id,
        action_id,
        execution_id,
    )


async def get_executions(
    conn: asyncpg.Connection, account_id: UUID, execution_ids: list[UUID]
) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM executions WHERE account_id = $1 AND execution_id = any($2::uuid[])",
        account_id,
        execution_ids,
    )


async def ensure_session(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> Row:
    return await conn.fetchrow(
        """
        INSERT INTO sessions (account_id, action_id, session_id) VALUES ($1, $2, $3)
        ON CONFLICT (account_id, action_id, session_id) DO UPDATE SET modified = sessions.modified
        RETURNING *
        """,
        account_id,
        action_id,
        session_id,
    )


async def lock_session(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str,
    *,
    exclusive: bool = True,
) -> Row | None:
    """The session's row, locked until the caller's transaction ends (None: no such session).
    Exclusive for eraseSession and a commit, shared for a retry's or replay's start. Every path
    that locks a session does so before the rows it then writes (executions, memory records):
    one order, so no two of them deadlock."""
    return await conn.fetchrow(
        f"""
        SELECT * FROM sessions WHERE account_id = $1 AND action_id = $2 AND session_id = $3
        FOR {"UPDATE" if exclusive else "SHARE"}
        """,
        account_id,
        action_id,
        session_id,
    )


async def running_in_session(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> UUID | None:
    """An execution of the session that is running (a turn, an MCP call, an ingest), if any."""
    return await conn.fetchval(
        """
        SELECT execution_id FROM executions
        WHERE account_id = $1 AND action_id = $2 AND session_id = $3 AND status = 'RUNNING'
          AND kind NOT IN ('OPERATOR', 'ERASE')
        ORDER BY created LIMIT 1
        """,
        account_id,
        action_id,
        session_id,
    )


async def get_session(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM sessions WHERE account_id = $1 AND action_id = $2 AND session_id = $3",
        account_id,
        action_id,
        session_id,
    )


async def get_sessions(
    conn: asyncpg.Connection, account_id: UUID, keys: list[tuple[UUID, str]]
) -> list[Row]:
    """The sessions named by (action_id, session_id), those that exist, in any order."""
    return await conn.fetch(
        """
        SELECT * FROM sessions
        WHERE account_id = $1
          AND (action_id, session_id) IN (SELECT * FROM unnest($2::uuid[], $3::text[]))
        """,
        account_id,
        [k[0] for k in keys],
        [k[1] for k in keys],
    )


async def restart_execution(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    boot_id: UUID | None = None,
) -> Row | None:
    """A FAILED turn becomes RUNNING again as its next invocation, in process `boot_id`;
    None if it is not FAILED."""
    return await conn.fetchrow(
        """
        UPDATE executions
        SET status = 'RUNNING', invocation_number = invocation_number + 1,
            output = NULL, error = NULL, modified = now(), boot_id = $4
        WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
          AND kind = 'TURN' AND status = 'FAILED'
        RETURNING *
        """,
        account_id,
        action_id,
        execution_id,
        boot_id,
    )


async def next_sequence(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, execution_id: UUID
) -> int:
    return await conn.fetchval(
        """
        SELECT coalesce(max(sequence), 0) + 1 FROM transcript_events
        WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
        """,
        account_id,
        action_id,
        execution_id,
    )


async def count_turn(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> int:
    """Counts a committed turn in its session; returns the turn's number."""
    return await conn.fetchval(
        """
        UPDATE sessions SET turns = turns + 1, modified = now()
        WHERE account_id = $1 AND action_id = $2 AND session_id = $3
        RETURNING turns
        """,
        account_id,
        action_id,
        session_id,
    )


async def touch_execution(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    invocation_number: int,
) -> bool:
    """Marks a running attempt alive, so fail_stale_turns spares it; False if it no longer runs."""
    touched = await conn.fetchval(
        """
        UPDATE executions SET modified = now()
        WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
          AND status = 'RUNNING' AND invocation_number = $4
        RETURNING true
        """,
        account_id,
        action_id,
        execution_id,
        invocation_number,
    )
    return bool(touched)


async def touch_silent_execution(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    invocation_number: int,
    silent_seconds: float,
) -> bool:
    """touch_execution, for an attempt that has shown no sign of life for `silent_seconds`
    (else nothing is written); False if it was not touched."""
    touched = await conn.fetchval(
        """
        UPDATE executions SET modified = now()
        WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
          AND status = 'RUNNING' AND invocation_number = $4
          AND modified < now() - make_interval(secs => $5)
        RETURNING true
        """,
        account_id,
        action_id,
        execution_id,
        invocation_number,
        silent_seconds,
    )
    return bool(touched)


async def finish_execution(
    conn: asyncpg.Connection,
    *,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    invocation_number: int,
    status: str,
    output: Any,
    error: str | None,
    turn: int | None,
) -> Row | None:
    """Ends the attempt `invocation_number` while it still runs; None once it no longer does
    (swept as stale, or retried as a later invocation).

    A failing attempt may also re-mark its own invocation that a sweep already failed, so the
    execution keeps the real reason.
    """
    return await conn.fetchrow(
        """
        UPDATE executions
        SET status = $4, output = $5, error = $6, turn = coalesce($7, turn), modified = now()
        WHERE account_id = $1 AND action_id = $2 AND execution_id = $3 AND invocation_number = $8
          AND (status = 'RUNNING' OR (status = 'FAILED' AND $4 = 'FAILED'))
        RETURNING *
        """,
        account_id,
        action_id,
        execution_id,
        status,
        output,
        error,
        turn,
        invocation_number,
    )


async def insert_events(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    events: list[tuple[int, int, str, Any]],
) -> None:
    """Writes transcript events, each (sequence, invocation_number, type, data)."""
    await conn.executemany(
        """
        INSERT INTO transcript_events
            (account_id, action_id, execution_id, sequence, invocation_number, type, data)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        """,
        [(account_id, action_id, execution_id, *event) for event in events],
    )


async def list_event_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[UUID, UUID, int | None, int]],
) -> list[list[Row]]:
    """Pages of transcripts in one statement, each (action_id, execution_id, after_sequence,
    limit): the execution's events in order, after that sequence, at most `limit`."""
    rows = await conn.fetch(
        """
        SELECT k.n, t.* FROM unnest($2::uuid[], $3::uuid[], $4::int[], $5::int[])
            WITH ORDINALITY AS k(action_id, execution_id, after_sequence, lim, n)
        CROSS JOIN LATERAL (
            SELECT * FROM transcript_events e
            WHERE e.account_id = $1 AND e.action_id = k.action_id
              AND e.execution_id = k.execution_id AND e.sequence > coalesce(k.after_sequence, 0)
              -- An attempt's events are listed once it ends (they are written as it goes).
              AND NOT EXISTS (
                  SELECT 1 FROM executions x
                  WHERE x.account_id = e.account_id AND x.action_id = e.action_id
                    AND x.execution_id = e.execution_id AND x.status = 'RUNNING'
                    AND x.invocation_number = e.invocation_number
              )
            ORDER BY e.sequence
            LIMIT k.lim
        ) t
        ORDER BY k.n, t.sequence
        """,
        account_id,
        *page_arrays(pages, keys=2),
    )
    return by_page(rows, len(pages))


# Above every (created, ID) keyset: a page asked without `after` starts below it, so that the
# pages share one statement whose keyset is an index condition.
_NEWEST = "'infinity'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'"


async def list_session_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[UUID, tuple[Any, str] | None, int]],
) -> list[list[Row]]:
    """Pages of agents' sessions in one statement, each (action_id, after, limit): newest
    first after a (created, session_id) keyset, at most `limit`."""
    rows = await conn.fetch(
        f"""
        SELECT k.n, s.* FROM unnest($2::uuid[], $3::timestamptz[], $4::text[], $5::int[])
            WITH ORDINALITY AS k(action_id, after_created, after_id, lim, n)
        CROSS JOIN LATERAL (
            SELECT * FROM sessions s
            WHERE s.account_id = $1 AND s.action_id = k.action_id
              AND (s.created, s.session_id)
                  < (coalesce(k.after_created, {_NEWEST[0]}), coalesce(k.after_id, ''))
            ORDER BY s.created DESC, s.session_id DESC
            LIMIT k.lim
        ) s
        ORDER BY k.n, s.created DESC, s.session_id DESC
        """,
        account_id,
        *page_arrays(pages, keys=1, keyset=2),
    )
    return by_page(rows, len(pages))


async def list_execution_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[UUID, str | None, tuple[Any, UUID] | None, int]],
    *,
    by_session: bool,
) -> list[list[Row]]:
    """Pages of executions in one statement, each (action_id, session_id, after, limit): newest
    first after a (created, execution_id) keyset, at most `limit`; each the session's when
    `by_session`, else the agent's (of every session or none; session_id unused)."""
    session = "AND x.session_id = k.session_id" if by_session else ""
    rows = await conn.fetch(
        f"""
        SELECT k.n, x.* FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::uuid[],
                                    $6::int[])
            WITH ORDINALITY AS k(action_id, session_id, after_created, after_id, lim, n)
        CROSS JOIN LATERAL (
            SELECT * FROM executions x
            WHERE x.account_id = $1 AND x.action_id = k.action_id {session}
              AND (x.created, x.execution_id)
                  < (coalesce(k.after_created, {_NEWEST[0]}), coalesce(k.after_id, {_NEWEST[1]}))
            ORDER BY x.created DESC, x.execution_id DESC
            LIMIT k.lim
        ) x
        ORDER BY k.n, x.created DESC, x.execution_id DESC
        """,
        account_id,
        *page_arrays(pages, keys=2, keyset=2),
    )
    return by_page(rows, len(pages))


async def defer_durability(conn: asyncpg.Connection) -> None:
    """This transaction's commit need not wait for its WAL flush.

    For a turn's start only: until the turn's own (synchronous) end commits, nothing depends on
    the start surviving a crash, and a later synchronous commit flushes it first (WAL order).
    """
    await conn.execute("SET LOCAL synchronous_commit = off")
