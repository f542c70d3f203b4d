"""An agent's records of one kind are found by an index in time order.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05

`Action.memories(kind:)`, and `searchMemories(kind:)` without a query, list an agent's records
of one kind by creation time. No index held the kind: PostgreSQL walked the agent's records by
time until the page was full, or read every record of the agent and sorted those of the kind.
A kind many records hold fills a page at once; one few or none of the live records hold read
the whole agent: 50-500 ms at 200,000 records, growing with the agent (bench/kind_listing.py).
`agent_memories_kind`, on `(account_id, action_id, kind, created, memory_id)`, reads a page
of any kind in order from where its keyset starts, newest or oldest first: about 1 ms there.
Every row is in it, whatever its status or scope, so that every listing and reader may use
it (a status filter, an agent's own staged records). It costs each write one more entry: a
record's row was written to six of the table's indexes (its key, time, words, summary, search
entries and scope; the others hold only pinned, labelled, staged or replacing rows), now seven,
about 4-5% more of the database's CPU for a row inserted or updated (bench/README.md,
`kind_listing.py`, forty-fourth session).

Built in the migration, which writes to the table wait for; reads go on. The build waits for
the writes already running, and the writes that come meanwhile queue behind it, so it waits at
most 5 s (lock_timeout, for this transaction): past that the migration fails and is rolled
back (`engram: migration 0033 failed (canceling statement due to lock timeout)...`), and runs
again at the next start or `engram migrate`. Not built concurrently: a process of an earlier
release waiting for the migration lock sits in a statement that a concurrent build waits for
(see 0024), a wait neither side would end.
"""

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("""
    CREATE INDEX agent_memories_kind ON agent_memories
        (account_id, action_id, kind, created, memory_id);
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
