"""Each service process records its own turn lease beside its heartbeat.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-04

Whether a process is alive was judged by the lease of whoever asked: a sweep by its own
`ENGRAM_TURN_LEASE_SECONDS`, and `engram reembed` by the lease of the shell it ran in, which
need not be the service's (a service given a lease of 10 minutes looked gone to a reembed run
under the default 60 s after a minute of silence, and its searches broke). A process now
writes its lease with each heartbeat, and each is judged by its own. A process of the release
before writes none (NULL): it is judged by the asker's lease, as before.
"""

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE service_processes ADD COLUMN lease_seconds double precision")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
