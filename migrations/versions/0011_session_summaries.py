"""Bounded context: each session's running summary of its earlier turns.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

A session agent's context is bounded (spec H16): as it fills, older messages are summarized
into a running summary, stored here and updated incrementally. `through_turn` and
`through_message` say how far it reaches: the messages of turns before `through_turn`, and the
first `through_message` messages of that turn (0: the user's message, then the agent's replies
and tool results in order), so the next summary folds in only newer messages. A preview turn's
summary is kept apart (`preview`), so it never reaches a live turn. `version` counts its
updates: a turn writes the summary it built only if the row is still the one it started from.

`executions_session_turns` finds a session's committed turns from a turn number on: what a
turn reads of the turns after its summary.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE session_summaries (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        session_id text NOT NULL,
        preview boolean NOT NULL,
        summary text NOT NULL,
        through_turn integer NOT NULL,
        through_message integer NOT NULL,
        tokens integer NOT NULL,
        version integer NOT NULL DEFAULT 1,
        execution_id uuid NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        modified timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id, session_id, preview),
        FOREIGN KEY (account_id, action_id, session_id) REFERENCES sessions ON DELETE CASCADE
    );

    CREATE INDEX executions_session_turns ON executions (account_id, action_id, session_id, turn)
        WHERE kind = 'TURN' AND status = 'SUCCEEDED';
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
