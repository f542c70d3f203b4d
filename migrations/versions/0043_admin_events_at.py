"""Administrative events are found by their age, in every account: `admin_events_at`.

Revision ID: 0043
Revises: 0042
Create Date: 2026-12-08

Events older than ENGRAM_ADMIN_EVENTS_RETENTION_DAYS are deleted by every process's liveness
sweep (app/auth/events_store.py `forget_older_than`, oldest first, a batch at a time). No index
led with `at`: each sweep would have read every account's events to find none old enough
(`admin_events_newest` leads with the account). With it, a sweep that finds none reads one
index page.

Building it reads the table once; event writes (every admin mutation) wait for it (at most 5 s,
lock_timeout, past which it fails and is rolled back, and runs again at the next start or
`engram migrate`), reads do not. On Citus it is built on each shard (distributed by account_id):
it is not unique, so it need not lead with it. Processes of the release before purge nothing,
and their writes keep the index.
"""

from alembic import op

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("CREATE INDEX admin_events_at ON admin_events (at)")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
