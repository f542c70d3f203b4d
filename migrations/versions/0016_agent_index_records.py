"""How many records each agent with its own indexes had at the last maintenance round.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01

`agent_indexes.records` is the agent's record count when a round (or a build) last listed it.
Search reads it in the statement that already looks the agent up, and searches a very large
agent's own HNSW index with a larger `hnsw.ef_search` (app/memory/search.py
LARGE_AGENT_RECORDS): at 200,000 records the default 80 found 0.962-0.976 of the exact vector
top-10, 120 found 0.986-1.000 (bench/README.md), and at 25,000 records 80 already finds 0.99.
Filled here by counting each listed agent's records once.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE agent_indexes ADD COLUMN records bigint NOT NULL DEFAULT 0;
    UPDATE agent_indexes v SET records = (
        SELECT count(*) FROM agent_memories m
        WHERE m.account_id = v.account_id AND m.action_id = v.action_id);
    ALTER TABLE agent_indexes ALTER COLUMN records DROP DEFAULT;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
