"""SQL for the memory review (migration 0009): committed turns whose messages await review,
what they said, and the marks of the review that covered them. Called by
app/runtime/review.py (what a review reads) and app/runtime/turns.py (a committing turn
records its review)."""

from uuid import UUID

import asyncpg

from app.db.sql import Params
from app.executions.store import Row, reviewed_others


async def pending_review(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str | None,
    preview: bool,
) -> list[Row]:
    """The session's (or the session-less agent's) committed turns not reviewed yet, oldest
    first, each with how many of its first messages an earlier review read (`review_read`,
    migration 0031); a preview turn's review covers preview turns, a live turn's live ones. A
    replay is none of them: it keeps no history and counts no turn, and its messages wait for
    no other turn's review (app/runtime/review.py, _pending)."""
    p = Params(account_id, action_id, preview)
    session = "session_id IS NULL" if session_id is None else f"session_id = {p(session_id)}"
    return await conn.fetch(
        f"""
        SELECT execution_id, turn, invocation_number, review_messages, review_read, created
        FROM executions
        WHERE account_id = $1 AND action_id = $2 AND {session} AND preview = $3
          AND review_messages IS NOT NULL AND reviewed_by IS NULL AND replay_of IS NULL
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
    others = {turn: before for turn, before in reviewed.items() if turn != execution_id}
    # One statement: the turn's own row, and the others while no other review covered them.
    marked = await conn.fetchval(
        f"""
        WITH own AS (
            UPDATE executions SET review_messages = $4,
                reviewed_by = CASE WHEN $3 = any($5::uuid[]) THEN $3 ELSE reviewed_by END
            WHERE account_id = $1 AND action_id = $2 AND execution_id = $3
        ), {reviewed_others(6)}
        SELECT count(*) FROM others
        """,
        account_id,
        action_id,
        execution_id,
        messages,
        list(reviewed),
        list(others),
        list(others.values()),
    )
    covered = marked == len(others)
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
