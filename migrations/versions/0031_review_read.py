"""Memory review: how many of a turn's messages an earlier review read, when it read some.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-05

A review takes at most MAX_CANDIDATES candidates (app/runtime/review.py) and stops reading once
it holds them. The turns it did not reach stay unreviewed; the first turn it read was marked
reviewed all the same when the review stopped inside it (so that reviews move on), and the rest
of that turn's messages were never read. Now that turn keeps how many of its messages were read
(`review_read`, 0 until a review stops inside it) and stays unreviewed: the next review reads
its messages from there, so every message is read once and each review moves on by at least a
part of the conversation.

A process of an older release ignores the column: it reads such a turn from its start again.
"""

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE executions ADD COLUMN review_read integer NOT NULL DEFAULT 0")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
