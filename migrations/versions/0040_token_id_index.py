"""A token is found by its ID alone, and the tokens it issued in every account, from indexes.

Revision ID: 0040
Revises: 0039
Create Date: 2026-12-08

Revoking or reading what a token issued as a client of the default account first asks which
accounts hold the token or a token it issued (`accounts_issued_from`: `token_id` or
`issued_by_token` in any account). No index led with either column: PostgreSQL 18 skipped
through `client_tokens_id` (account, client, token) once per client and `client_tokens_issued`
(0038) once per account, reading most of the first; an older PostgreSQL reads the whole index
or table. With 200,000 tokens of 200 clients in 20 accounts that took 1.4 to 2.9 ms a round of
the walk (EXPLAIN ANALYZE, three runs of five; up to 11 ms under load), growing with the
clients; `client_tokens_token` and `client_tokens_issued_by` make it two lookups, 0.02 to 0.12
ms. (The lock a request takes on its own token in each of its writes, `lock_token`, now names
the token's account and client too, a lookup of 0.02 to 0.07 ms where it skipped through
`client_tokens_id` in 1.5 to 3.9 ms, up to 17 ms under load.) `client_tokens_issued` stays:
the walk within one account reads it, and dropping an index would lock out the reads that
authenticate requests.

Building them reads the token table twice (0.3 s and 0.1 s for 200,000 tokens); token writes wait
for them (at most 5 s, lock_timeout, past which it fails and is rolled back, and runs again at
the next start or `engram migrate`), reads do not. On Citus they are built on each shard of the
table (distributed by account_id): neither is unique, so neither has to lead with it. Processes
of the release before keep working, and their writes keep the indexes.
"""

from alembic import op

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        """
        CREATE INDEX client_tokens_token ON client_tokens (token_id);
        CREATE INDEX client_tokens_issued_by ON client_tokens (issued_by_token)
            WHERE issued_by_token IS NOT NULL;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
