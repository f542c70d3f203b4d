"""SQL for a session's bounded context: its running summary (table session_summaries) and
the turns after it, with their tool calls, that a turn reads back. Called by
app/runtime/context.py."""

from uuid import UUID

import asyncpg

from app.executions.erasure_store import ERASED
from app.executions.store import Row


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
    """Whether a preview turn of the session committed at or before turn `turn`: a turn run in
    preview mode, or a conversation handed in in preview mode (kind INGEST, which a preview
    turn reads as one of the session's turns); not a replay, which keeps nothing."""
    return bool(
        await conn.fetchval(
            """
            SELECT true FROM executions
            WHERE account_id = $1 AND action_id = $2 AND session_id = $3
              AND kind IN ('TURN', 'INGEST') AND status = 'SUCCEEDED' AND preview
              AND turn <= $4
              AND replay_of IS NULL
            LIMIT 1
            """,
            account_id,
            action_id,
            session_id,
            turn,
        )
    )


# SQL, for an execution `e`: the agent's tool calls and their results in the transcript of its
# attempt `e.invocation_number`, in order, as a JSON array of `[type, data - 'input']`: its model
# calls (purpose `turn`) that called tools, and the tool executions of a call.
_CALLS = """
    SELECT jsonb_agg(jsonb_build_array(c.type, c.data - 'input') ORDER BY c.sequence)
    FROM transcript_events c
    WHERE c.account_id = e.account_id AND c.action_id = e.action_id
      AND c.execution_id = e.execution_id AND c.invocation_number = e.invocation_number
      AND (c.type = 'tool.execution' AND c.data ? 'callId'
           OR c.type = 'model.call' AND c.data ->> 'purpose' = 'turn'
              AND jsonb_typeof(c.data -> 'toolCalls') = 'array'
              AND c.data -> 'toolCalls' <> '[]'::jsonb)"""


async def summary_and_turns(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str,
    preview: bool,
    before_turn: int | None,
) -> tuple[Row | None, list[Row]]:
    """In one statement: the session's summary of the mode (`session_summary`), and its
    committed turns that a turn may read (live turns skip preview ones), in turn order, from
    the summary's last turn on (from the first, without one, or when `before_turn` is given
    and the summary reaches it) and before `before_turn`, conversations handed in (kind
    INGEST) among them: not a replay (which keeps nothing in its session, and has its
    original's number), nor a turn eraseSession erased (its words are gone; a turn retold as
    `[erased]` would only take room). Each turn's `calls`: the agent's tool calls and their
    results in its committed attempt's transcript, in order, each `[type, data]` without the
    data's `input` (`_CALLS`), or None."""
    rows = await conn.fetch(
        f"""
        WITH s AS (
            SELECT summary, through_turn, through_message, version FROM session_summaries
            WHERE account_id = $1 AND action_id = $2 AND session_id = $3 AND preview = $4
        )
        SELECT * FROM (
            SELECT NULL::integer AS turn, NULL::text AS kind, NULL::uuid AS execution_id,
                   NULL::integer AS invocation_number, NULL::jsonb AS input,
                   NULL::jsonb AS output, s.*, NULL::jsonb AS calls
            FROM s
            UNION ALL
            SELECT e.turn, e.kind, e.execution_id, e.invocation_number, e.input, e.output,
                   NULL, NULL, NULL, NULL, ({_CALLS}) AS calls
            FROM executions e
            WHERE e.account_id = $1 AND e.action_id = $2 AND e.session_id = $3
              AND e.kind IN ('TURN', 'INGEST') AND e.status = 'SUCCEEDED'
              AND (NOT e.preview OR $4)
              AND e.turn >= coalesce(
                  (SELECT through_turn FROM s WHERE $5::integer IS NULL OR through_turn < $5), 1)
              AND ($5::integer IS NULL OR e.turn < $5)
              AND e.replay_of IS NULL
              AND (SELECT t.data->>'erased' FROM transcript_events t
                  WHERE t.account_id = e.account_id AND t.action_id = e.action_id
                    AND t.execution_id = e.execution_id ORDER BY t.sequence LIMIT 1)
                  IS DISTINCT FROM $6
        ) x
        ORDER BY turn NULLS FIRST
        """,
        account_id,
        action_id,
        session_id,
        preview,
        before_turn,
        ERASED,
    )
    if rows and rows[0]["turn"] is None:
        return rows[0], rows[1:]
    return None, rows


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
