"""No `session_recalls`: no code has read it, and none has written it since commit da1e682.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-07

`session_recalls` (migration 0004) held, for each session, the record versions its committed
turns' recalls had put before the model (with the turn and whether it was a preview), so that
a later turn would not record the same recall again. No code has read it since commit
609f3b1 made it (each turn's `Recall` began with no versions seen): a turn's recalls are
compared only with its own (app/runtime/recall.py, `Recall.seen`), since the conversation is
the turn's and earlier turns' memory blocks are not replayed into it (spec, M31). Commit
da1e682 ("turns: recalls no longer write session_recalls") removed its one writer, an INSERT
that each committed turn with a recall ran into a table that only grew; the table stayed so
that processes of the release before, still writing it during a rolling upgrade, kept working.
Every release that brings migration 0034 comes after that commit and never touches the table,
nor do those after it that bring 0033. A process of a release before that commit (migration
0033 or before), still running on the migrated database, fails the commit of each turn whose
recall found records: upgrade every such process at once.

Dropping the table takes ACCESS EXCLUSIVE locks on it and on `sessions`, whose triggers for its
foreign key go with it, for an instant (0.4 s for the whole migration with 2,000,000 rows,
437 MB), after the transactions already on `sessions` (a turn starting or committing, an
`engram export`), with those that come meanwhile queued behind it: it waits at most 5 s
(lock_timeout, for this transaction), past which the migration fails and is rolled back, and
runs again at the next start or `engram migrate`.
"""

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP TABLE IF EXISTS session_recalls")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
