"""Who changed accounts, clients and tokens, and when: `admin_events`.

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-08

Records' versions name who wrote them, executions who ran them, and tokens who issued them, but
nothing named who created, changed or deleted a client, revoked a token, or created, renamed
or deleted an account; after a leak an operator could not ask what the leaked token changed.
Each such change now writes one row here in its own transaction (app/auth/events_store.py), so a
change that rolls back leaves none and none commits without its row: in the account the change
is in (a deleted account's in the account of the client that deleted it, as its own rows go
with it), at the transaction's time, naming the client that acted (its principal, account and
the token its request sent) or, with no client, one of the words a token's `issued_by` uses
(`command line`, `bootstrap setting`, `first start`), the operation (the GraphQL mutation's
name), the target (an account, a client or a token, with its client) and what changed, never
a token's secret or hash.

Distributed by `account_id` like every account's rows (app/db/distribution.py): its primary
key leads with it. `admin_events_newest` reads an account's events newest first;
`admin_events_token` one token's, in every account (on Citus, on every shard). Creating them
locks nothing that exists (at most 5 s, lock_timeout, to be safe). Processes of the release
before write no events: changes they make during a rolling upgrade are not recorded.
"""

from alembic import op

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        """
        CREATE TABLE admin_events (
            account_id uuid NOT NULL REFERENCES accounts ON DELETE CASCADE,
            event_id uuid NOT NULL DEFAULT gen_random_uuid(),
            at timestamptz NOT NULL DEFAULT now(),
            actor text NOT NULL,
            actor_account uuid,
            actor_token uuid,
            operation text NOT NULL,
            target_kind text NOT NULL CHECK (target_kind IN ('account', 'client', 'token')),
            target text NOT NULL,
            target_principal text,
            changes jsonb NOT NULL DEFAULT '{}',
            PRIMARY KEY (account_id, event_id)
        );
        CREATE INDEX admin_events_newest ON admin_events (account_id, at DESC, event_id DESC);
        CREATE INDEX admin_events_token ON admin_events (actor_token, at DESC, event_id DESC)
            WHERE actor_token IS NOT NULL;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
