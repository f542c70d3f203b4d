"""Runtime: listing executions, finding stale turns, and what recalls put before a session.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

`session_recalls` holds the record versions a committed turn's recalls put before its
session's conversation, so a later turn of the session does not record the same recall again
(spec: "a recall that finds the same record versions an earlier recall already put before the
same conversation ... is not recorded again"). A preview turn's rows are seen only by preview
turns, as everything a preview turn writes.
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE INDEX executions_created ON executions
        (account_id, action_id, created DESC, execution_id DESC);
    -- Turns still running: a turn's start looks here for turns whose process died.
    CREATE INDEX executions_running ON executions (account_id, action_id, modified)
        WHERE status = 'RUNNING';

    CREATE TABLE session_recalls (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        session_id text NOT NULL,
        memory_id uuid NOT NULL,
        version integer NOT NULL,
        preview boolean NOT NULL,
        execution_id uuid NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id, session_id, memory_id, version, preview),
        FOREIGN KEY (account_id, action_id, session_id) REFERENCES sessions ON DELETE CASCADE
    );
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
