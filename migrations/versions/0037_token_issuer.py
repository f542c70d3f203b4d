"""Each token records who issued it.

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-08

An operator auditing an account after a leak could not tell which client's `createClientToken`
made a token, nor whether it came from `engram client token` or ENGRAM_BOOTSTRAP_TOKEN, nor
which tokens a leaked one had issued. `client_tokens.issued_by` now holds the principal of the
client whose request issued it, with that client's account in `issued_by_account` (the token's
own, or the default account's for a token its clients issued in another) and the token the
request sent in `issued_by_token`; or, with neither, one of the service's own names, none of
which a client's principal can be (app/auth/service.py, `ISSUERS`). Tokens issued before stay
NULL (their issuer is not known), but the bootstrap tokens: those were made from
ENGRAM_BOOTSTRAP_TOKEN, and are named so here.

Adding nullable columns rewrites nothing, but takes the table's lock for an instant, after the
transactions already on it (a token's lookup, its `last_used` written); requests whose token
is looked up meanwhile queue behind it, so it waits at most 5 s (lock_timeout, for this
transaction), past which it fails and is rolled back, and runs again at the next start or
`engram migrate`. A process of the release before, still running on the migrated database,
keeps working: the tokens it issues name no one (NULL).
"""

from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        """
        ALTER TABLE client_tokens
            ADD COLUMN issued_by text,
            ADD COLUMN issued_by_account uuid,
            ADD COLUMN issued_by_token uuid;
        -- app.auth.service.ISSUER_BOOTSTRAP, as this release names it.
        UPDATE client_tokens SET issued_by = 'bootstrap setting' WHERE bootstrap;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
