"""SQL for the rows every run leaves: executions (a turn, an MCP tool call, an operator write,
an erasure), their transcript events, and sessions. Called by
app/executions/service.py (the reads GraphQL serves), app/runtime (turns, calls, erasure,
liveness) and app/memory/operator.py (an operator's write is an execution).

Beside it in this package: liveness_store.py (process heartbeats and the turns dead processes
left), summary_store.py (a session's running summary and the turns after it), review_store.py
(the memory review's marks) and erasure_store.py (eraseSession)."""

import json
from collections.abc import Sequence
from typing import Any, TypeAlias
from uuid import UUID

import asyncpg

from app.db.sql import NEWEST, by_page, held_token_sql, page_arrays

Row: TypeAlias = asyncpg.Record


# SQL that is true, and lets its transaction's commit (the statement's own, when it runs alone)
# not wait for its WAL flush, as `defer_durability` does, without a round trip of its own.
_DEFERRED = "(SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"


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
    token_id: UUID | None,
    input: Any,
    invocation_number: int = 1,
    boot_id: UUID | None = None,
    replay_of: UUID | None = None,
    output: Any = None,
    open_session: bool = False,
    next_turn: bool = False,
    deferred: bool = False,
) -> Row:
    """`boot_id`: the process running a RUNNING turn (app/runtime/liveness.py).
    `open_session`: the session is created if new (`ensure_session`) by the same statement,
    and with `next_turn` the execution is numbered after its last turn (`turn` unused; the
    commit numbers it). `deferred`: the transaction's commit need not wait for its WAL flush
    (`defer_durability`, for a turn's start only); run alone, the statement is that
    transaction, so a turn starts in one round trip. `token_id`: the token the starting
    request sent, one of a client of `account_id` (None: a caller made in process)."""
    values = "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16"
    session = ""
    if open_session:
        session = """
        WITH s AS (
            INSERT INTO sessions (account_id, action_id, session_id) VALUES ($1, $2, $5)
            ON CONFLICT (account_id, action_id, session_id)
                DO UPDATE SET modified = sessions.modified
            RETURNING turns
        )"""
        if next_turn:
            values = values.replace("$6", "coalesce($6, s.turns + 1)")  # $6 is None
    source = f"SELECT {values}" + (" FROM s" if open_session else "")
    if deferred:
        source += f" WHERE {_DEFERRED}"
    elif not open_session:
        source = f"VALUES ({values})"
    return await conn.fetchrow(
        f"""{session}
        INSERT INTO executions (account_id, action_id, execution_id, action_version, session_id,
                                turn, invocation_number, kind, status, preview, principal, input,
                                boot_id, replay_of, output, token_id)
        {source}
        RETURNING *
        """,
        account_id,
        action_id,
        execution_id,
        action_version,
        session_id,
        None if next_turn else turn,
        invocation_number,
        kind,
        status,
        preview,
        principal,
        input,
        boot_id,
        replay_of,
        output,
        token_id,
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
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str,
    *,
    lock: bool = False,
) -> int:
    """Counts a committed turn in its session; returns the turn's number. `lock`: the session
    is first locked as `lock_session` locks it (exclusively), in the same statement, until the
    caller's transaction ends."""
    locked = ""
    if lock:
        locked = """
        WITH locked AS (
            SELECT 1 FROM sessions WHERE account_id = $1 AND action_id = $2 AND session_id = $3
            FOR UPDATE
        )"""
    return await conn.fetchval(
        f"""{locked}
        UPDATE sessions SET turns = turns + 1, modified = now()
        WHERE account_id = $1 AND action_id = $2 AND session_id = $3
            {"AND EXISTS (SELECT FROM locked)" if lock else ""}
        RETURNING turns
        """,
        account_id,
        action_id,
        session_id,
    )


def _events_written(first: int, guard: str) -> str:
    """SQL: a data-modifying WITH item inserting the events passed as four arrays from
    parameter `first` on (`event_arrays`), for the execution of parameters $1-$3, when `guard`
    holds."""
    a, b, c, d = (f"${first + i}" for i in range(4))
    return f"""written AS (
            INSERT INTO transcript_events
                (account_id, action_id, execution_id, sequence, invocation_number, type, data)
            SELECT $1, $2, $3, e.sequence, e.invocation_number, e.type, e.data::jsonb
            FROM unnest({a}::int[], {b}::int[], {c}::text[], {d}::text[])
                AS e(sequence, invocation_number, type, data)
            WHERE {guard}
        )"""


def event_arrays(events: list[tuple[int, int, str, Any]]) -> list[list[Any]]:
    """Transcript events, each (sequence, invocation_number, type, data), as the four arrays
    `_events_written` inserts: each event's data as JSON text, as the connection's jsonb codec
    would send it (app/db/pool.py)."""
    return [
        [e[0] for e in events],
        [e[1] for e in events],
        [e[2] for e in events],
        [json.dumps(e[3]) for e in events],
    ]


async def touch_execution(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    invocation_number: int,
    events: list[tuple[int, int, str, Any]],
) -> bool:
    """Marks a running attempt alive, so fail_stale_turns spares it; False if it no longer runs.
    `events`: transcript events written with the sign of life, in the same statement, only if
    it runs (each as `insert_events` takes it).

    Its commit waits for its WAL flush, unlike a turn's start (`defer_durability`): a crash of
    the database does not end the attempt, whose next write reaches the restarted server on a
    new connection and finds its execution RUNNING, so a sign of life lost in it would leave
    the turn going on, to SUCCEEDED, without those transcript events (a model call's, with its
    usage, and its tool calls); a lost start instead ends its attempt (its execution is gone).
    tests/test_turn_liveness.py crashes the database after a sign of life."""
    return bool(
        await conn.fetchval(
            f"""
            WITH alive AS (
                UPDATE executions SET modified = now()
                WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
                  AND status = 'RUNNING' AND invocation_number = $4
                RETURNING true
            ), {_events_written(5, "EXISTS (SELECT FROM alive)")}
            SELECT EXISTS (SELECT FROM alive)
            """,
            account_id,
            action_id,
            execution_id,
            invocation_number,
            *event_arrays(events),
        )
    )


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
    events: list[tuple[int, int, str, Any]] | None = None,
) -> Row | None:
    """Ends the attempt `invocation_number` while it still runs; None once it no longer does
    (swept as stale, or retried as a later invocation). `events`: transcript events written
    by the same statement when it ends the attempt (each as `insert_events` takes it).

    A failing attempt may also re-mark its own invocation that a sweep already failed, so the
    execution keeps the real reason.
    """
    written, arrays = "", []
    if events is not None:
        written = ", " + _events_written(9, "EXISTS (SELECT FROM done)")
        arrays = event_arrays(events)
    return await conn.fetchrow(
        f"""
        WITH done AS (
            UPDATE executions
            SET status = $4, output = $5, error = $6, turn = coalesce($7, turn), modified = now()
            WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
              AND invocation_number = $8
              AND (status = 'RUNNING' OR (status = 'FAILED' AND $4 = 'FAILED'))
            RETURNING *
        ){written}
        SELECT * FROM done
        """,
        account_id,
        action_id,
        execution_id,
        status,
        output,
        error,
        turn,
        invocation_number,
        *arrays,
    )


def reviewed_others(first: int, guard: str = "true") -> str:
    """SQL: a data-modifying WITH item `others` marking the turns of the arrays in parameters
    `first` (execution IDs) and `first + 1` (the messages of each an earlier review had read)
    as covered by the review of execution $3 (of account $1 and action $2), each only while
    no other review covered it or read on in it, when `guard` holds; a row for each it marks
    (app/executions/review_store.py, record_review)."""
    return f"""others AS (
            UPDATE executions e SET reviewed_by = $3
            FROM unnest(${first}::uuid[], ${first + 1}::int[]) AS r(execution_id, review_read)
            WHERE e.account_id = $1 AND e.action_id = $2 AND e.execution_id = r.execution_id
              AND e.reviewed_by IS NULL AND e.review_read = r.review_read AND {guard}
            RETURNING 1
        )"""


async def commit_turn(
    conn: asyncpg.Connection,
    *,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    invocation_number: int,
    output: Any,
    session_id: str | None,
    count: bool,
    review: tuple[int, dict[UUID, int]] | None,
    events: list[tuple[int, int, str, Any]],
    authority: tuple[str, UUID, Any] | None = None,
) -> Row | None:
    """Ends the running attempt `invocation_number` as SUCCEEDED in one statement, its own
    transaction, for a turn whose commit writes nothing else (no memory records, summary or
    history): its session (if any) locked first, as `lock_session` locks it for a commit;
    with `count`, the turn counted in it and numbered so (`count_turn`); `review`, the
    messages it adds for review and the turns its review covered (as
    `review_store.record_review` marks them, without `partly`); its transcript `events`.
    `authority` (principal, token ID, policies): only while that client of the account still
    holds its token and those policies, both locked (db/sql.py `held_token_sql`).
    None once the attempt no longer runs (swept as stale, or retried), or the authority no
    longer holds, and then nothing was written."""
    messages, reviewed = review if review is not None else (None, {})
    others = {turn: before for turn, before in reviewed.items() if turn != execution_id}
    principal, token_id, policies = authority if authority is not None else (None, None, None)
    return await conn.fetchrow(
        f"""
        WITH held AS ({held_token_sql("$1", "$16", "$17", also="AND c.policies = $18::jsonb")}
        ), locked AS (
            SELECT turns FROM sessions
            WHERE account_id = $1 AND action_id = $2 AND session_id = $6
            FOR UPDATE
        ), done AS (
            UPDATE executions
            SET status = 'SUCCEEDED', output = $5, error = NULL,
                turn = coalesce((SELECT turns + 1 FROM locked WHERE $7), turn),
                review_messages = coalesce($8, review_messages),
                reviewed_by = CASE WHEN $3 = any($9::uuid[]) THEN $3 ELSE reviewed_by END,
                modified = now()
            WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
              AND invocation_number = $4 AND status = 'RUNNING'
              -- The session locked before the row (this filter is evaluated first).
              AND (SELECT count(*) FROM locked) IS NOT NULL
              AND ($17::uuid IS NULL OR EXISTS (SELECT FROM held))
            RETURNING *
        ), counted AS (
            UPDATE sessions SET turns = turns + 1, modified = now()
            WHERE account_id = $1 AND action_id = $2 AND session_id = $6 AND $7
              AND EXISTS (SELECT FROM done)
        ), {reviewed_others(10, "EXISTS (SELECT FROM done)")},
        {_events_written(12, "EXISTS (SELECT FROM done)")}
        SELECT * FROM done
        """,
        account_id,
        action_id,
        execution_id,
        invocation_number,
        output,
        session_id,
        count,
        messages,
        list(reviewed),
        list(others),
        list(others.values()),
        *event_arrays(events),
        principal,
        token_id,
        policies,
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


# A transcript event `e` is read once its attempt has ended (events are written as it goes):
# listed in its transcript, and read by its ID.
_ATTEMPT_ENDED = """
    NOT EXISTS (
        SELECT 1 FROM executions x
        WHERE x.account_id = e.account_id AND x.action_id = e.action_id
          AND x.execution_id = e.execution_id AND x.status = 'RUNNING'
          AND x.invocation_number = e.invocation_number
    )
"""


async def list_event_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[UUID, UUID, int | None, int]],
) -> list[list[Row]]:
    """Pages of transcripts in one statement, each (action_id, execution_id, after_sequence,
    limit): the execution's events in order, after that sequence, at most `limit`."""
    rows = await conn.fetch(
        f"""
        SELECT k.n, t.* FROM unnest($2::uuid[], $3::uuid[], $4::int[], $5::int[])
            WITH ORDINALITY AS k(action_id, execution_id, after_sequence, lim, n)
        CROSS JOIN LATERAL (
            SELECT * FROM transcript_events e
            WHERE e.account_id = $1 AND e.action_id = k.action_id
              AND e.execution_id = k.execution_id AND e.sequence > coalesce(k.after_sequence, 0)
              AND {_ATTEMPT_ENDED}
            ORDER BY e.sequence
            LIMIT k.lim
        ) t
        ORDER BY k.n, t.sequence
        """,
        account_id,
        *page_arrays(pages, keys=2),
    )
    return by_page(rows, len(pages))


async def get_events(
    conn: asyncpg.Connection, account_id: UUID, keys: Sequence[tuple[UUID, UUID, int]]
) -> list[Row]:
    """The transcript events of `keys` (action_id, execution_id, sequence) that a transcript
    lists (list_event_pages: none of an attempt still running), in one statement, in any
    order."""
    return await conn.fetch(
        f"""
        SELECT e.* FROM unnest($2::uuid[], $3::uuid[], $4::int[])
            AS k(action_id, execution_id, sequence)
        JOIN transcript_events e ON e.account_id = $1 AND e.action_id = k.action_id
            AND e.execution_id = k.execution_id AND e.sequence = k.sequence
        WHERE {_ATTEMPT_ENDED}
        """,
        account_id,
        *([k[i] for k in keys] for i in range(3)),
    )


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
                  < (coalesce(k.after_created, {NEWEST[0]}), coalesce(k.after_id, ''))
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
                  < (coalesce(k.after_created, {NEWEST[0]}), coalesce(k.after_id, {NEWEST[1]}))
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

    For a turn's start only (a retry's too): until the turn's own (synchronous) end commits,
    nothing depends on the start surviving a crash, and a later synchronous commit flushes it
    first (WAL order); a start lost in a crash of the database ends its attempt, whose next
    write finds no execution running. (`insert_execution(deferred=True)` sets it inside its
    statement.) Not its signs of life, which the attempt goes on past (`touch_execution`).
    """
    await conn.execute("SET LOCAL synchronous_commit = off")


async def token_executions(
    conn: asyncpg.Connection,
    account_id: UUID,
    token_id: UUID,
    after: tuple[Any, UUID] | None,
    limit: int,
) -> list[Row]:
    """A page of the account's executions, of every agent, that requests sending the token
    started, newest first after a (created, execution_id) keyset (`executions_token`)."""
    return await conn.fetch(
        f"""
        SELECT * FROM executions
        WHERE account_id = $1 AND token_id = $2
          AND (created, execution_id)
              < (coalesce($3::timestamptz, {NEWEST[0]}), coalesce($4::uuid, {NEWEST[1]}))
        ORDER BY created DESC, execution_id DESC
        LIMIT $5
        """,
        account_id,
        token_id,
        after[0] if after else None,
        after[1] if after else None,
        limit,
    )
