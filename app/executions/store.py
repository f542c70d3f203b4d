"""SQL for the rows every run leaves: executions (a turn, an MCP tool call, an operator write,
an erasure), their transcript events, sessions with their running summaries and recalls, and
the heartbeats of the processes that run turns (app/runtime/liveness.py)."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias
from uuid import UUID

import asyncpg

from app.db.cursors import INT4_MIN
from app.db.sql import Params, by_page, page_arrays

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


async def fail_stale_turns(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, older_than_seconds: float
) -> list[UUID]:
    """Marks FAILED the turns still RUNNING long after any turn could have ended."""
    rows = await conn.fetch(
        """
        UPDATE executions
        SET status = 'FAILED', modified = now(),
            error = 'the turn stopped without finishing (its process ended); retry the execution'
        WHERE account_id = $1 AND action_id = $2 AND status = 'RUNNING' AND kind <> 'OPERATOR'
          AND modified < now() - make_interval(secs => $3)
        RETURNING execution_id
        """,
        account_id,
        action_id,
        older_than_seconds,
    )
    return [r["execution_id"] for r in rows]


async def ended_turns_with_pending_memory(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID
) -> list[Row]:
    """Turns no longer running that still have staged memory rows (their process died)."""
    return await conn.fetch(
        """
        SELECT e.* FROM executions e
        WHERE e.account_id = $1 AND e.action_id = $2 AND e.kind <> 'OPERATOR'
          AND e.status <> 'RUNNING'
          AND e.execution_id IN (
              SELECT DISTINCT m.pending_execution FROM agent_memories m
              WHERE m.account_id = $1 AND m.action_id = $2 AND m.pending_execution IS NOT NULL
          )
        """,
        account_id,
        action_id,
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


async def insert_recalls(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str,
    preview: bool,
    execution_id: UUID,
    versions: list[tuple[UUID, int]],
) -> None:
    await conn.execute(
        """
        INSERT INTO session_recalls
            (account_id, action_id, session_id, memory_id, version, preview, execution_id)
        SELECT $1, $2, $3, v.memory_id, v.version, $4, $5
        FROM unnest($6::uuid[], $7::int[]) AS v(memory_id, version)
        ON CONFLICT DO NOTHING
        """,
        account_id,
        action_id,
        session_id,
        preview,
        execution_id,
        [m for m, _ in versions],
        [v for _, v in versions],
    )


async def defer_durability(conn: asyncpg.Connection) -> None:
    """This transaction's commit need not wait for its WAL flush.

    For a turn's start only: until the turn's own (synchronous) end commits, nothing depends on
    the start surviving a crash, and a later synchronous commit flushes it first (WAL order).
    """
    await conn.execute("SET LOCAL synchronous_commit = off")


# Liveness of service processes (app/runtime/liveness.py)

DEAD_PROCESS_ERROR = "the turn stopped without finishing (its process ended); retry the execution"
UNRECORDED_ERROR = (
    "the turn failed but its end could not be recorded (the database was unreachable); retry "
    "the execution"
)


async def beat(
    conn: asyncpg.Connection, boot_id: UUID, host: str, pid: int, lease_seconds: float
) -> None:
    """Registers the process, or refreshes its heartbeat (its row may have been removed while
    it stalled: it comes back), with the lease after which its silence means it is gone."""
    await conn.execute(
        """
        INSERT INTO service_processes (boot_id, host, pid, lease_seconds) VALUES ($1, $2, $3, $4)
        ON CONFLICT (boot_id) DO UPDATE SET heartbeat = now(), lease_seconds = $4
        """,
        boot_id,
        host,
        pid,
        lease_seconds,
    )


def _lease(asker: str) -> str:
    """SQL: process `p`'s lease, its own or (a process of a release before migration 0028
    recorded none) the asker's, the parameter `asker`."""
    return f"make_interval(secs => coalesce(p.lease_seconds, {asker}))"


async def remove_process(conn: asyncpg.Connection, boot_id: UUID) -> None:
    await conn.execute("DELETE FROM service_processes WHERE boot_id = $1", boot_id)


async def fail_dead_turns(
    conn: asyncpg.Connection,
    *,
    boot_id: UUID,
    live: list[UUID],
    lease_seconds: float,
    grace_seconds: float,
    legacy_seconds: float,
) -> list[Row]:
    """Fails, in every account, the RUNNING turns no process runs any more: those of a process
    whose heartbeat is older than the lease (or whose row is gone); those of this process that
    it no longer runs (their end could not be recorded); and those without a boot ID (written
    before boot IDs) by their last sign of life. A turn that showed life in the last
    `grace_seconds` is spared (it may have started just now). Safe to run from several
    processes at once: each row is updated only while it is still RUNNING."""
    return await conn.fetch(
        f"""
        UPDATE executions e
        SET status = 'FAILED', modified = now(),
            error = CASE WHEN e.boot_id = $1 THEN $7 ELSE $6 END
        WHERE e.status = 'RUNNING' AND e.kind <> 'OPERATOR'
          AND e.modified < now() - make_interval(secs => $4)
          AND ((e.boot_id <> $1 AND NOT EXISTS (
                  SELECT 1 FROM service_processes p
                  WHERE p.boot_id = e.boot_id
                    AND p.heartbeat >= now() - {_lease("$3")}))
               OR (e.boot_id = $1 AND e.execution_id <> ALL($2::uuid[]))
               OR (e.boot_id IS NULL AND e.modified < now() - make_interval(secs => $5)))
        RETURNING e.account_id, e.action_id, e.execution_id
        """,
        boot_id,
        live,
        lease_seconds,
        grace_seconds,
        legacy_seconds,
        DEAD_PROCESS_ERROR,
        UNRECORDED_ERROR,
    )


async def drop_orphaned_staged(conn: asyncpg.Connection, grace_seconds: float) -> int:
    """Deletes, in every account, staged memory rows that can never commit: those of a turn
    attempt no longer running, and those of an operator write whose execution was never
    recorded (its process died between staging and committing) once `grace_seconds` old."""
    status = await conn.execute(
        """
        DELETE FROM agent_memories m
        WHERE m.pending_execution IS NOT NULL
          AND NOT EXISTS (
              SELECT 1 FROM executions e
              WHERE e.account_id = m.account_id AND e.action_id = m.action_id
                AND e.execution_id = m.pending_execution AND e.status = 'RUNNING'
                AND e.invocation_number = m.pending_invocation)
          AND (m.created < now() - make_interval(secs => $1) OR EXISTS (
              SELECT 1 FROM executions e
              WHERE e.account_id = m.account_id AND e.action_id = m.action_id
                AND e.execution_id = m.pending_execution))
        """,
        grace_seconds,
    )
    return int(status.split()[-1])


async def forget_dead_processes(conn: asyncpg.Connection, lease_seconds: float) -> None:
    """Removes the rows of processes past their lease that no longer own a RUNNING turn."""
    await conn.execute(
        f"""
        DELETE FROM service_processes p
        WHERE p.heartbeat < now() - {_lease("$1")}
          AND NOT EXISTS (
              SELECT 1 FROM executions e WHERE e.boot_id = p.boot_id AND e.status = 'RUNNING')
        """,
        lease_seconds,
    )


# Bounded context (runtime/context.py): the session's running summary and the turns after it


async def session_summary(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str, preview: bool
) -> Row | None:
    return await conn.fetchrow(
        """
        SELECT summary, through_turn, through_message, version FROM session_summaries
        WHERE account_id = $1 AND action_id = $2 AND session_id = $3 AND preview = $4
        """,
        account_id,
        action_id,
        session_id,
        preview,
    )


async def preview_turn_through(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str, turn: int
) -> bool:
    """Whether a preview turn of the session committed at or before turn `turn`."""
    return bool(
        await conn.fetchval(
            """
            SELECT true FROM executions
            WHERE account_id = $1 AND action_id = $2 AND session_id = $3
              AND kind = 'TURN' AND status = 'SUCCEEDED' AND preview AND turn <= $4
              AND replay_of IS NULL
            LIMIT 1
            """,
            account_id,
            action_id,
            session_id,
            turn,
        )
    )


async def turns_from(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str,
    preview: bool,
    first_turn: int,
) -> list[Row]:
    """The session's committed turns from `first_turn` on that a turn may read (live turns
    skip preview ones), in turn order, conversations handed in (kind INGEST) among them: not a
    replay (which keeps nothing in its session, and has its original's number), nor a turn
    eraseSession erased (its words are gone; a turn retold as `[erased]` would only take
    room)."""
    return await conn.fetch(
        """
        SELECT e.turn, e.kind, e.execution_id, e.invocation_number, e.input, e.output
        FROM executions e
        WHERE e.account_id = $1 AND e.action_id = $2 AND e.session_id = $3
          AND e.kind IN ('TURN', 'INGEST') AND e.status = 'SUCCEEDED' AND (NOT e.preview OR $4)
          AND e.turn >= $5 AND e.replay_of IS NULL
          AND (SELECT t.data->>'erased' FROM transcript_events t
              WHERE t.account_id = e.account_id AND t.action_id = e.action_id
                AND t.execution_id = e.execution_id ORDER BY t.sequence LIMIT 1)
              IS DISTINCT FROM $6
        ORDER BY e.turn
        """,
        account_id,
        action_id,
        session_id,
        preview,
        first_turn,
        ERASED,
    )


async def turn_calls(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, execution_ids: list[UUID]
) -> list[Row]:
    """The agent's tool calls and their results in these executions' transcripts, in order:
    its model calls (purpose `turn`) that called tools, and the tool executions of a call
    (every invocation's: the caller keeps the committed one's)."""
    return await conn.fetch(
        """
        SELECT execution_id, invocation_number, type, data - 'input' AS data
        FROM transcript_events
        WHERE account_id = $1 AND action_id = $2 AND execution_id = any($3::uuid[])
          AND (type = 'tool.execution' AND data ? 'callId'
               OR type = 'model.call' AND data ->> 'purpose' = 'turn'
                  AND jsonb_typeof(data -> 'toolCalls') = 'array'
                  AND data -> 'toolCalls' <> '[]'::jsonb)
        ORDER BY execution_id, sequence
        """,
        account_id,
        action_id,
        execution_ids,
    )


async def save_summary(
    conn: asyncpg.Connection,
    *,
    account_id: UUID,
    action_id: UUID,
    session_id: str,
    preview: bool,
    summary: str,
    through_turn: int,
    through_message: int,
    tokens: int,
    execution_id: UUID,
    base_version: int | None,
) -> bool:
    """Writes the session's summary if the stored one is still `base_version` (None: none was
    stored); False when another turn changed it meanwhile (its summary stays)."""
    written = await conn.fetchval(
        """
        INSERT INTO session_summaries AS s (account_id, action_id, session_id, preview, summary,
                                            through_turn, through_message, tokens, execution_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        ON CONFLICT (account_id, action_id, session_id, preview) DO UPDATE
        SET summary = excluded.summary, through_turn = excluded.through_turn,
            through_message = excluded.through_message, tokens = excluded.tokens,
            execution_id = excluded.execution_id, version = s.version + 1, modified = now()
        WHERE s.version = $10
        RETURNING true
        """,
        account_id,
        action_id,
        session_id,
        preview,
        summary,
        through_turn,
        through_message,
        tokens,
        execution_id,
        base_version,
    )
    return bool(written)


# The memory review (migration 0009): committed turns whose messages await review.


async def pending_review(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str | None,
    preview: bool,
) -> list[Row]:
    """The session's (or the session-less agent's) committed turns not reviewed yet, oldest
    first, each with how many of its first messages an earlier review read (`review_read`,
    migration 0031); a preview turn's review covers preview turns, a live turn's live ones."""
    p = Params(account_id, action_id, preview)
    session = "session_id IS NULL" if session_id is None else f"session_id = {p(session_id)}"
    return await conn.fetch(
        f"""
        SELECT execution_id, turn, invocation_number, review_messages, review_read, created
        FROM executions
        WHERE account_id = $1 AND action_id = $2 AND {session} AND preview = $3
          AND review_messages IS NOT NULL AND reviewed_by IS NULL
        ORDER BY created, execution_id
        """,
        *p.values,
    )


async def review_events(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, execution_ids: list[UUID]
) -> list[Row]:
    """What the given turns' committed attempts said, in order: the events a review reads."""
    return await conn.fetch(
        """
        SELECT t.execution_id, t.type, t.data, t.created FROM executions e
        JOIN transcript_events t ON t.account_id = e.account_id AND t.action_id = e.action_id
            AND t.execution_id = e.execution_id AND t.invocation_number = e.invocation_number
        WHERE e.account_id = $1 AND e.action_id = $2 AND e.execution_id = any($3::uuid[])
          AND t.type IN ('turn.input', 'model.call', 'tool.execution', 'turn.output')
        ORDER BY e.created, e.execution_id, t.sequence
        """,
        account_id,
        action_id,
        execution_ids,
    )


async def record_review(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    messages: int,
    reviewed: dict[UUID, int],
    partly: tuple[UUID, int, int] | None = None,
) -> bool:
    """Counts a committing turn's messages for review, and marks the turns `reviewed` (this
    one among them, when its review ran; each with the messages of it an earlier review had
    read) as covered by its review; `partly` (a turn, the messages of it read before, and now)
    records a turn the review stopped inside, left unreviewed. False when another turn's
    review, committed meanwhile, covered one of them or read on in it (the other's mark stays;
    the caller decides whether its transaction goes on)."""
    await conn.execute(
        """
        UPDATE executions SET review_messages = $4,
            reviewed_by = CASE WHEN $3 = any($5::uuid[]) THEN $3 ELSE reviewed_by END
        WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
        """,
        account_id,
        action_id,
        execution_id,
        messages,
        list(reviewed),
    )
    others = {turn: before for turn, before in reviewed.items() if turn != execution_id}
    status = await conn.execute(
        """
        UPDATE executions e SET reviewed_by = $3
        FROM unnest($4::uuid[], $5::int[]) AS r(execution_id, review_read)
        WHERE e.account_id = $1 AND e.action_id = $2 AND e.execution_id = r.execution_id
          AND e.reviewed_by IS NULL AND e.review_read = r.review_read
        """,
        account_id,
        action_id,
        execution_id,
        list(others),
        list(others.values()),
    )
    covered = int(status.split()[-1]) == len(others)  # "UPDATE n"
    if partly is not None:
        turn, before, read = partly
        status = await conn.execute(
            """
            UPDATE executions SET review_read = $5
            WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
              AND reviewed_by IS NULL AND review_read = $4
            """,
            account_id,
            action_id,
            turn,
            before,
            read,
        )
        covered = covered and status == "UPDATE 1"
    return covered


# Erasure (eraseSession): a person's request that what a session said be gone for good.

ERASED = "[erased]"


# Executions a statement of an erasure rewrites, and transcript events (eraseSession): a long
# session is erased in statements of these many rows, each well within
# ENGRAM_STATEMENT_TIMEOUT_SECONDS (bench/bounds.py). The transcripts are counted apart: a
# turn's is a few events, but may be a thousand (ENGRAM_MAX_MODEL_CALLS_PER_TURN model calls,
# each with up to ENGRAM_MAX_TOOL_CALLS_PER_REPLY tool calls), a batch of such turns' a million.
ERASE_BATCH = 1_000
ERASE_TRANSCRIPT_BATCH = 10_000

# A batch of the session's executions after the cursor ($4, $5: created, execution_id, newest
# first, by executions_session), their text replaced by the marker $6.
_ERASE_EXECUTIONS = """
    WITH batch AS (
        SELECT execution_id FROM executions
        WHERE account_id = $1 AND action_id = $2 AND session_id = $3 AND kind <> 'ERASE'
          AND (created, execution_id) < ($4, $5)
        ORDER BY created DESC, execution_id DESC LIMIT $7)
    UPDATE executions x SET input = to_jsonb($6::text),
        output = CASE WHEN x.output IS NULL THEN NULL ELSE to_jsonb($6::text) END,
        error = CASE WHEN x.error IS NULL THEN NULL ELSE $6::text END,
        modified = now()
    FROM batch b
    WHERE x.account_id = $1 AND x.action_id = $2 AND x.execution_id = b.execution_id
    RETURNING x.execution_id, x.created
"""

# A batch of the transcript events of executions $3 after the cursor ($4, $5: execution_id,
# sequence, in the primary key's order), their words replaced by the marker $6. A transcript
# keeps its shape (types, sequences, and a model call's purpose, model and usage, which limits
# and accounting read); every word goes.
_ERASE_TRANSCRIPTS = """
    WITH batch AS (
        SELECT execution_id, sequence FROM transcript_events
        WHERE account_id = $1 AND action_id = $2 AND execution_id = any($3::uuid[])
          AND (execution_id, sequence) > ($4, $5)
        ORDER BY execution_id, sequence LIMIT $7),
    words AS (
        UPDATE transcript_events t SET data = CASE
            WHEN t.type IN ('model.call', 'embedding') THEN jsonb_strip_nulls(
                jsonb_build_object('purpose', t.data->'purpose', 'model', t.data->'model',
                    'usage', t.data->'usage', 'tokens', t.data->'tokens', 'erased', $6::text))
            ELSE jsonb_build_object('erased', $6::text) END
        FROM batch b
        WHERE t.account_id = $1 AND t.action_id = $2 AND t.execution_id = b.execution_id
          AND t.sequence = b.sequence)
    SELECT (SELECT count(*) FROM batch) AS events, last.execution_id, last.sequence
    FROM (SELECT execution_id, sequence FROM batch
          ORDER BY execution_id DESC, sequence DESC LIMIT 1) last
"""


async def was_erased(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, execution_id: UUID
) -> bool:
    """Whether eraseSession erased the execution's words: its transcript events carry the
    marker (what a turn's events never hold at their top level), or, for one that had written
    none yet, its input is the marker. The execution's row is locked
    FOR SHARE until the caller's transaction ends, so an erasure not yet seen waits for it."""
    return await conn.fetchval(
        """
        WITH locked AS (
            SELECT 1 FROM executions WHERE account_id = $1 AND action_id = $2
                AND execution_id = $3 FOR SHARE)
        SELECT EXISTS (SELECT 1 FROM locked) AND (EXISTS (SELECT 1 FROM transcript_events
            WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
              AND data->>'erased' = $4)
            OR (SELECT input = to_jsonb($4::text) FROM executions
                WHERE account_id = $1 AND action_id = $2 AND execution_id = $3))
        """,
        account_id,
        action_id,
        execution_id,
        ERASED,
    )


async def erase_executions(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> dict[str, int]:
    """Replaces the text of the session's executions' inputs, outputs and transcripts by a
    marker (eraseSession), ERASE_BATCH executions and then ERASE_TRANSCRIPT_BATCH of their
    transcript events a statement, inside the caller's transaction (all or nothing); returns
    counts."""
    counts = {"executions": 0, "transcriptEvents": 0}
    after: tuple[Any, Any] = (datetime.max.replace(tzinfo=UTC), UUID(int=2**128 - 1))
    batch = ERASE_BATCH
    while True:
        rows = await conn.fetch(
            _ERASE_EXECUTIONS, account_id, action_id, session_id, *after, ERASED, batch
        )
        counts["executions"] += len(rows)
        ids = [r["execution_id"] for r in rows]
        counts["transcriptEvents"] += await _erase_transcripts(conn, account_id, action_id, ids)
        if len(rows) < batch:
            return counts
        after = min((r["created"], r["execution_id"]) for r in rows)


async def _erase_transcripts(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, execution_ids: list[UUID]
) -> int:
    erased, after, batch = 0, (UUID(int=0), INT4_MIN), ERASE_TRANSCRIPT_BATCH
    while execution_ids:
        done = await conn.fetchrow(
            _ERASE_TRANSCRIPTS, account_id, action_id, execution_ids, *after, ERASED, batch
        )
        if done is None:  # the batch was empty
            break
        erased += done["events"]
        if done["events"] < batch:
            break
        after = (done["execution_id"], done["sequence"])
    return erased


async def live_memories(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> list[UUID]:
    """The session's live memory records (what erasure leaves to deleteAgentMemory): its
    session-scope records and the agent-scope records its turns wrote. Asked by scope, each
    is read by its scope's index, within the agent (asked together, no index served
    `session_id` of both, and the whole table was read: 340 ms at 450,000 records)."""
    rows = await conn.fetch(
        """
        SELECT memory_id, created FROM agent_memories
        WHERE account_id = $1 AND action_id = $2 AND session_id = $3 AND status = 'ACTIVE'
          AND pending_execution IS NULL AND NOT tombstone AND scope = 'SESSION'
        UNION ALL
        SELECT memory_id, created FROM agent_memories
        WHERE account_id = $1 AND action_id = $2 AND session_id = $3 AND status = 'ACTIVE'
          AND pending_execution IS NULL AND NOT tombstone AND scope = 'AGENT'
        ORDER BY created, memory_id
        """,
        account_id,
        action_id,
        session_id,
    )
    return [r["memory_id"] for r in rows]


async def erase_summaries(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> None:
    """Removes the session's running summaries (live and preview): they retell its words."""
    await conn.execute(
        "DELETE FROM session_summaries"
        " WHERE account_id = $1 AND action_id = $2 AND session_id = $3",
        account_id,
        action_id,
        session_id,
    )
