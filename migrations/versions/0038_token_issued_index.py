"""The tokens a token issued are found from an index.

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-08

`revokeTokensIssuedBy` follows `client_tokens.issued_by_token` from a leaked token to every
token it issued, in turn, one step of the chain at a time. Without an index on the column each
step read every token of the account, so a chain cost the square of its length: 4,000 tokens,
each issued by the one before, took 2.3 s, and the 30,000 a leaked token can make one request
at a time ran past ENGRAM_STATEMENT_TIMEOUT_SECONDS (60 s), so that the revocation failed whole
(tests/test_revoke_issued.py). `client_tokens_issued` (account, issuing token; tokens naming
one) makes each step a lookup: 30,000 in 0.6 s.

Building it reads the token table once (0.1 s for 200,000 tokens); token writes wait for it
(at most 5 s, lock_timeout, past which it fails and is rolled back, and runs again at the next
start or `engram migrate`), reads do not. Processes of the release before keep working, and
their writes keep the index.
"""

from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        """
        CREATE INDEX client_tokens_issued ON client_tokens (account_id, issued_by_token)
            WHERE issued_by_token IS NOT NULL;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
