"""Turns of a dead process end promptly; retries after a lost answer do not write twice.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

`service_processes` has one row per running service process (its boot ID), whose `heartbeat`
the process refreshes every ENGRAM_TURN_HEARTBEAT_SECONDS. `executions.boot_id` names the
process running the current attempt of a turn. A background sweep in every process
(app/runtime/liveness.py) fails the RUNNING turns of a process whose heartbeat is older than
ENGRAM_TURN_LEASE_SECONDS (or whose row is gone), drops the memory rows staged by turns that no
longer run and by operator writes that never committed, and forgets idempotency keys older
than a day. A row with a NULL boot_id (written before this revision) is judged as before, by
how long ago its turn last showed life.

`idempotency_keys` holds, per (account, principal, operation, key), a digest of the request and
the result to answer its retries with; each key is written in the transaction of the write it
answers for, so a write that never committed leaves no key.
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE service_processes (
        boot_id uuid PRIMARY KEY,
        host text NOT NULL,
        pid integer NOT NULL,
        started timestamptz NOT NULL DEFAULT now(),
        heartbeat timestamptz NOT NULL DEFAULT now()
    );

    ALTER TABLE executions ADD COLUMN boot_id uuid;

    CREATE TABLE idempotency_keys (
        account_id uuid NOT NULL REFERENCES accounts ON DELETE CASCADE,
        principal text NOT NULL,
        operation text NOT NULL,
        key text NOT NULL,
        request text NOT NULL,
        result jsonb NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, principal, operation, key)
    );
    CREATE INDEX idempotency_keys_created ON idempotency_keys (created);
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
