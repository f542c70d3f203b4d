"""A session's records are found by an index in time order.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-05

`Action.memories(sessionId:)` lists one session's session-scope records by creation time. With
migration 0020's `agent_memories_session` on `(account_id, action_id, session_id)`, PostgreSQL
read a large session either by that index, every record of it then sorted, or by walking the
agent's records by time until the page was full, which for a conversation long past read every
newer record of the agent first (bench/session_listing.py). The index now holds `created` and
`memory_id` after the session, so a page of a session is read in order from where its keyset
starts, however large the session or the agent. It keeps its name and its rows (session scope
only), and serves the reads of a session it served (its columns lead the same way). Built in
the migration beside the old one, which writes to the table wait for; reads wait only for the
swap at the end.

Each lock it takes is waited for at most 5 s (lock_timeout, for this transaction): the swap's
DROP INDEX waits for every transaction already on the table (an export's, another process's
index build, a long search), and every read of the table queued behind it, refused past the
service's own lock bound (CONFLICT, 10 s by default), for as long as that transaction ran.
Now the migration fails instead, rolled back (`engram: migration 0032 failed (canceling
statement due to lock timeout)...`), and runs again at the next start or `engram migrate`.
Not built concurrently: a process of an earlier release waiting for the migration lock sits
in a statement that a concurrent build waits for (see 0024), a wait neither side would end.
"""

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("""
    -- Built beside the old one (writes wait, reads go on), which goes only then (a moment's
    -- lock that reads wait for too).
    CREATE INDEX agent_memories_session_next ON agent_memories
        (account_id, action_id, session_id, created, memory_id)
        WHERE scope = 'SESSION';
    DROP INDEX agent_memories_session;
    ALTER INDEX agent_memories_session_next RENAME TO agent_memories_session;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
