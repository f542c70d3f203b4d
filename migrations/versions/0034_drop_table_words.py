"""No GIN index over every agent's words: an agent without its own indexes is ranked exactly.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06

`agent_memories_words` (migration 0005), a GIN index on `(account_id, action_id, tsv)`, served
only the index plan of an agent without its own indexes (app/memory/maintenance.py): one past
the exact plan's 10,000 records before its first build, or beyond
`ENGRAM_AGENT_INDEX_MAX_AGENTS`. That plan was slower than ranking every record, at every
size measured (bench/README.md, fifty-third session; 1,230,000 records, SQL alone, p50 / p95):
at 1,000 records hybrid 51 / 139 ms against 2.9 / 6.3 exactly (GIN intersects the agent's
entries with its account's, every record of the account), at 25,000 hybrid 84 / 153 against
48 / 63, vector 73 / 117 against 43 / 64, lexical 14 / 88 against 51 / 86. Such an agent is now
ranked exactly whatever its size (app/memory/search.py), as one with its own indexes is by
those (migration 0015 dropped the HNSW index shared by every agent for the same reason).

Every write paid for the index: with fastupdate off (0005) each record's every word went into
it as the record was written. 2,000 records inserted into a 10,000-record agent without own
indexes, SQL alone, rolled back, five rounds: 2,588-3,334 records/s with it, 4,743-7,009
without, WAL 22 -> 12 MB; with the agent's own indexes (its HNSW graph dominates) 437-680 ->
569-693.

Dropping the index takes the table's ACCESS EXCLUSIVE lock for an instant, after the reads
and writes running: it waits at most 5 s (lock_timeout, for this transaction), past which the
migration fails and is rolled back, and runs again at the next start or `engram migrate`.
"""

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP INDEX IF EXISTS agent_memories_words")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
