"""Each execution records the token whose request started it.

Revision ID: 0042
Revises: 0041
Create Date: 2026-12-08

After a leak an operator revokes the token and what it issued, and reads what it changed
administratively (`admin_events`, 0041), but could not tell which turns, ingests, MCP tool calls
and memory writes it made: an execution named only its `principal`, the client, which holds its
legitimate tokens too. `executions.token_id` now holds the token the starting request sent (a
token of a client of the execution's own account: every execution is in its caller's account);
NULL for a caller made in process (the `engram` command) and for executions started before.
`executions_token` reads an account's executions by token, newest first, and holds only the
rows that name one: a token's page of 51 among 200,000 executions of 20 accounts and 50 tokens
reads 54 buffers, 0.13 ms (EXPLAIN ANALYZE). Each execution written adds an entry to it: a
turn's start (its one statement) went from 179, 237 and 200 us to 186, 264 and 216 us (median
of 6 to 10 alternating rounds of 1,000 against a database at 0041, three runs, load 2.6 to 3.5
on 2 cores): 7 to 27 us more, within the rounds' own spread (163 to 318 us).

Adding a nullable column rewrites nothing, but takes the table's lock for an instant, after the
transactions already on it; building the index then reads the table once (0.04 s for 200,000
executions), meanwhile executions wait to be written and reads go on. Both wait at most 5 s
for their lock (lock_timeout, for this transaction), past which the migration fails, is rolled
back, and runs again at the next start or `engram migrate`. Not concurrently: a concurrent
build waits for every running transaction, among them another process's call waiting for the
migration lock, which this migration holds (0024). On Citus the index is built on each shard
of the table (distributed by account_id), which it leads with. A process of the release before,
still running on the migrated database, keeps working: the executions it starts name no token.
"""

from alembic import op

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        """
        ALTER TABLE executions ADD COLUMN token_id uuid;
        CREATE INDEX executions_token ON executions
            (account_id, token_id, created DESC, execution_id DESC)
            WHERE token_id IS NOT NULL;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
