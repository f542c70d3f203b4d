"""A client's tokens are listed from an index in their order (newest first).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-04

`Client.tokens` (and `engram` token listings) read every token of the client and sorted them
for each page: 6 ms for a page of 20 of a client with 10,000 tokens, growing with the count
(bench/README.md, `operator_lists.py`). The index on (account_id, principal) is replaced by one
on (account_id, principal, created DESC, token_id DESC): it serves what the old one did (its
leading columns: a client's tokens, the cascade of a deleted client) and a page reads only its
own rows. The table keeps as many indexes. Building it reads the table once (tokens are few:
a write of a token waits for it, no read does).
"""

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE INDEX client_tokens_newest ON client_tokens
            (account_id, principal, created DESC, token_id DESC);
        DROP INDEX client_tokens_client;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
