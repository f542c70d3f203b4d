"""A label filter reads one agent's records of that value, not the agent's whole key.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03

`agent_memories_labels` was a GIN index on `labels` alone (jsonb_path_ops, migration 0002).
Under a label filter PostgreSQL ANDed its bitmap (every agent's rows of that value) with one
of the agent's whole key (every row of the agent, from another index), twice a search: a
200,000-record agent searched under a value 4,027 of its records hold took 383 ms p50, a
25,000-record agent under one of 466 took 54 (bench/README.md, twentieth session). It is now
a GIN index on `(account_id, action_id, labels jsonb_path_ops)` (btree_gin, migration 0005),
whose scan meets the key's posting lists at the value's: 53 and 6 ms p50. Searches and
listings under labels always name the agent.

It holds only the records that have a label (`labels <> '{}'`, which the exact plan's filter
repeats, app/memory/store.py `has_labels`): a record without one is not written to it, and
online writes keep their rate. Built in the migration beside the old index, while writes to
the table wait (reads only for the swap at the end): 1.8 s for bench/search_scale.py's
1,230,000 records, a tenth of them labelled, with its generous `maintenance_work_mem`; more
with the default.
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- Built beside the old one (writes wait, reads go on), which goes only then (a moment's
    -- lock that reads wait for too).
    CREATE INDEX agent_memories_labels_next ON agent_memories
        USING gin (account_id, action_id, labels jsonb_path_ops) WHERE labels <> '{}'::jsonb;
    DROP INDEX agent_memories_labels;
    ALTER INDEX agent_memories_labels_next RENAME TO agent_memories_labels;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
