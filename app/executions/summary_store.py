"""SQL for a session's bounded context: its running summary (table session_summaries) and
the turns after it, with their tool calls, that a turn reads back. Called by
app/runtime/context.py."""

from typing import Any, NamedTuple
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


class Turn(NamedTuple):
    """A committed turn a window reads (`summary_and_turns`): its `executions` row (turn,
    kind, execution_id, invocation_number, input, output), and the agent's tool calls and their
    results in its committed attempt's transcript, in order, each `(type, data)` without the
    data's `input`: its model calls (purpose `turn`) that called tools, and the tool executions
    of a call (none read for a conversation handed in, kind INGEST)."""

    row: Row
    calls: list[tuple[str, Any]]


async def summary_and_turns(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    session_id: str,
    preview: bool,
    before_turn: int | None,
) -> tuple[Row | None, list[Turn]]:
    """In one statement: the session's summary of the mode (`session_summary`), and its
    committed turns that a turn may read (live turns skip preview ones), in turn order, from
    the summary's last turn on (from the first, without one, or when `before_turn` is given
    and the summary reaches it) and before `before_turn`, conversations handed in (kind
    INGEST) among them: not a replay (which keeps nothing in its session, and has its
    original's number), nor a turn eraseSession erased (its words are gone; a turn retold as
    `[erased]` would only take room); each with its tool calls (`Turn`).

    Each tool call event is a row of its own, after its turn's: one JSON array of a turn's
    events could not hold more than 256 MB (jsonb's bound on a value's elements), which the
    results of a turn's many tool calls can reach, and every later turn of the session would
    fail to read its window."""
    rows = await conn.fetch(
        """
        WITH s AS (
            SELECT summary, through_turn, through_message, version FROM session_summaries
            WHERE account_id = $1 AND action_id = $2 AND session_id = $3 AND preview = $4
        ), turns AS (
            SELECT e.turn, e.kind, e.execution_id, e.invocation_number, e.input, e.output
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
        )
        SELECT * FROM (
            SELECT NULL::integer AS turn, NULL::uuid AS execution_id, NULL::integer AS sequence,
                   NULL::text AS kind, NULL::integer AS invocation_number, NULL::jsonb AS input,
                   NULL::jsonb AS output, s.*, NULL::text AS type, NULL::jsonb AS data
            FROM s
            UNION ALL
            SELECT t.turn, t.execution_id, NULL, t.kind, t.invocation_number, t.input, t.output,
                   NULL, NULL, NULL, NULL, NULL, NULL
            FROM turns t
            UNION ALL
            SELECT t.turn, t.execution_id, c.sequence, NULL, NULL, NULL, NULL,
                   NULL, NULL, NULL, NULL, c.type, c.data
            FROM turns t CROSS JOIN LATERAL (
                -- OFFSET 0: read for each turn by its execution (the key's prefix), as a
                -- correlated sub-select is, whatever the table's statistics say.
                SELECT c.sequence, c.type, c.data - 'input' AS data
                FROM transcript_events c
                WHERE c.account_id = $1 AND c.action_id = $2
                  AND c.execution_id = t.execution_id
                  AND c.invocation_number = t.invocation_number
                  AND (c.type = 'tool.execution' AND c.data ? 'callId'
                       OR c.type = 'model.call' AND c.data ->> 'purpose' = 'turn'
                          AND jsonb_typeof(c.data -> 'toolCalls') = 'array'
                          AND c.data -> 'toolCalls' <> '[]'::jsonb)
                OFFSET 0
            ) c
            WHERE t.kind = 'TURN'
        ) x
        ORDER BY turn NULLS FIRST, execution_id, sequence NULLS FIRST
        """,
        account_id,
        action_id,
        session_id,
        preview,
        before_turn,
        ERASED,
    )
    summary: Row | None = None
    turns: list[Turn] = []
    for r in rows:
        if r["turn"] is None:
            summary = r
        elif r["sequence"] is None:
            turns.append(Turn(r, []))
        else:  # an event of the turn before it (same execution_id: the order)
            turns[-1].calls.append((r["type"], r["data"]))
    return summary, turns


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
