"""Agent indexes outlive their agent's unlisting by a set time, not by one round.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

A process remembers for `maintenance.OWN_INDEXES_SECONDS` that an agent has its own indexes, and
searches it through them without asking again. Maintenance used to drop an unlisted agent's
indexes at its next round, which can come sooner than that (several processes each run
rounds; `engram maintain-search` by hand), leaving such a process on the shared index with an
own index's settings (fewer of the exact top-10) until it forgot. `unlisted` records when the
agent left the list; its indexes are dropped by the first round `maintenance.LINGER_SECONDS`
after that. A row with `unlisted` set is not a listing: searches take it as no own indexes.
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE agent_indexes ADD COLUMN unlisted timestamptz")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
