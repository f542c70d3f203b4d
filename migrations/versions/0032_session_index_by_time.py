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
only), and serves the reads of a session it served (its columns lead the same way).

Built and swapped CONCURRENTLY, outside a transaction: neither reads nor writes of
agent_memories wait for it. In a transaction, the swap's DROP INDEX waited for every transaction
already on the table (an export's, another process's index build, a long search), and every
read of the table queued behind it meanwhile, refused past the lock bound (CONFLICT). A process
waiting for the migration lock no longer sits in a statement that a concurrent build would wait
for (app/db/migrate.py tries the lock again and again), which is what kept migration 0024 from
building concurrently. Each step can run again: stopped part way (a failure, a kill), the next
`engram migrate` drops what was left of the new index and builds it anew.
"""

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        # One statement each: several in one string would run as one implicit transaction.
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS agent_memories_session_next")
        op.execute("""
        CREATE INDEX CONCURRENTLY agent_memories_session_next ON agent_memories
            (account_id, action_id, session_id, created, memory_id)
            WHERE scope = 'SESSION'
        """)
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS agent_memories_session")
        op.execute("ALTER INDEX agent_memories_session_next RENAME TO agent_memories_session")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
