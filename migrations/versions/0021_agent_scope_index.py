"""A listed agent's agent-scope records are found by an index.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02

`agent_memories_agent_scope`: a partial btree on `(account_id, action_id)` of the agent-scope
rows, beside migration 0020's `agent_memories_session` of the session-scope rows. A turn that
reads agent scope (and its session's) of an agent with own indexes, most of whose records are
in other sessions, counts the rows it reads through the two, and when they are few it is
ranked exactly over them instead of by the agent's whole HNSW and GIN indexes, which a filter
that hides most rows slows (app/memory/search_store.py, `ranked_exact`). Built in the
migration, which writes to the table wait for: 2 s in bench/search_scale.py's load of
1,230,000 agent-scope records on 2 cores, the table in memory, `maintenance_work_mem` 4GB.
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE INDEX agent_memories_agent_scope ON agent_memories (account_id, action_id)
        WHERE scope = 'AGENT';
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
