"""SQL for erasure (eraseSession): a person's request that what a session said be gone for
good. Rewrites the session's executions and transcripts to a marker, removes its running
summaries, and lists the memory records it leaves to deleteAgentMemory. Called by
app/runtime/erase.py, and by app/runtime/turns.py (a turn asks whether its execution was
erased) and summary_store.py (a turn's context skips erased turns)."""

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg

from app.db.cursors import INT4_MIN

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
