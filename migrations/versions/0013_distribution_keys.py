"""Keys that a distributed PostgreSQL (Citus, by account_id) can keep: the token lookup.

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-01

Every table is either distributed by `account_id` (its primary key and unique indexes lead
with it) or a small reference table copied to every node (app/db/distribution.py lists them;
docs/scaling.md gives the DDL). `client_tokens` was keyed by the token's hash alone, as a
request names only its token: it is now keyed `(account_id, token_hash)`, and
`token_accounts`, a reference table, says which account a token hash belongs to, so that
authentication reads one account's shard. A token's row in `token_accounts` is written and
deleted with it (app/auth/store.py); the token itself is the one `client_tokens` holds, so a
row left without its token finds nothing.
"""

from alembic import op

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE token_accounts (
        token_hash bytea PRIMARY KEY,
        account_id uuid NOT NULL REFERENCES accounts ON DELETE CASCADE
    );
    INSERT INTO token_accounts (token_hash, account_id)
    SELECT token_hash, account_id FROM client_tokens;

    ALTER TABLE client_tokens DROP CONSTRAINT client_tokens_pkey;
    ALTER TABLE client_tokens ADD PRIMARY KEY (account_id, token_hash);
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
