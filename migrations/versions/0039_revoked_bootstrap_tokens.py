"""A revoked bootstrap token stays revoked across starts.

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-08

Every start with ENGRAM_BOOTSTRAP_TOKEN set made that value the admin's bootstrap token again,
so a leaked bootstrap token that was revoked came back at the next start while the setting kept
its value. `revoked_bootstrap_tokens` holds the hash of each bootstrap token deleted since
(revoked on its own or with the tokens it issued, gone with the admin client, or replaced by a
new setting value), and when; a start whose setting hashes to one of them leaves it revoked
and logs a warning (app/auth/service.bootstrap_admin). Tokens revoked before this migration
are not known: the setting still brings those back once.

A reference table (app/db/distribution.py): one row per bootstrap token ever replaced or revoked,
a few rows in a deployment's life. Creating it locks nothing that exists (at most 5 s,
lock_timeout, to be safe). Processes of the release before neither write nor read it: a token
they revoke during a rolling upgrade is not remembered.
"""

from alembic import op

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        """
        CREATE TABLE revoked_bootstrap_tokens (
            token_hash bytea PRIMARY KEY,
            revoked timestamptz NOT NULL DEFAULT now()
        );
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
