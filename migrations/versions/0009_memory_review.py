"""Memory review: which turns' messages await the end-of-turn review, and exact duplicates.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

A committed turn of an agent with memory stores how many messages it added
(`review_messages`: its input, the agent's replies and tool calls, the tools' results), and
the execution whose review covered them (`reviewed_by`, NULL until one does). The messages
awaiting review in a session (or, for an agent without sessions, the agent) are those of its
committed turns with `reviewed_by` NULL: a review that was not due, or failed, leaves them for
the next, and a turn that rolls back marks nothing. The marks are per turn rather than one
position per session, so two turns committing at once never mark each other's messages.

`memory_summary_key` is the normalised summary (lower case, whitespace collapsed, trailing
punctuation dropped) that the review compares to skip a candidate a visible record already
says word for word, through the index below.
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE executions ADD COLUMN review_messages integer, ADD COLUMN reviewed_by uuid;
    CREATE INDEX executions_review_pending ON executions
        (account_id, action_id, session_id, preview, created, execution_id)
        WHERE review_messages IS NOT NULL AND reviewed_by IS NULL;

    CREATE FUNCTION memory_summary_key(summary text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN
        regexp_replace(
            btrim(regexp_replace(lower(summary), '\\s+', ' ', 'g')),
            '[[:punct:][:space:]]+$', ''
        );
    CREATE INDEX agent_memories_summary_key ON agent_memories
        (account_id, action_id, memory_summary_key(summary));
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
