"""Tokens that can be listed, expired, revoked and rotated.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Each token gets an ID to list and revoke it by (the secret is never stored, only its hash),
the first characters of the secret so that a person can tell tokens apart, an optional
expiry, when it was last used (written at most once a minute), and whether it is the token
made from ENGRAM_BOOTSTRAP_TOKEN, which the service replaces at start when that setting
changes. Tokens that existed before get an ID and no prefix; a bootstrap token is marked at
the first start that names it.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE client_tokens
            ADD COLUMN token_id uuid NOT NULL DEFAULT gen_random_uuid(),
            ADD COLUMN prefix text,
            ADD COLUMN expires timestamptz,
            ADD COLUMN last_used timestamptz,
            ADD COLUMN bootstrap boolean NOT NULL DEFAULT false;
        CREATE UNIQUE INDEX client_tokens_id ON client_tokens (account_id, principal, token_id);
        CREATE INDEX client_tokens_bootstrap ON client_tokens (account_id) WHERE bootstrap;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
