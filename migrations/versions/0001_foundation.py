"""Foundation: accounts, clients and tokens, versioned actions, sessions and executions.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Every table leads its primary key with account_id (then action_id where it applies) so the
schema can be distributed on Citus unchanged. client_tokens is the one routing table keyed
by token hash: authentication must find the account from the token alone.
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE EXTENSION IF NOT EXISTS vector;

    CREATE TABLE deployment (
        key text PRIMARY KEY,
        value jsonb NOT NULL,
        modified timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE accounts (
        account_id uuid PRIMARY KEY,
        name text NOT NULL,
        is_default boolean NOT NULL DEFAULT false,
        created timestamptz NOT NULL DEFAULT now()
    );
    CREATE UNIQUE INDEX accounts_one_default ON accounts (is_default) WHERE is_default;

    CREATE TABLE clients (
        account_id uuid NOT NULL REFERENCES accounts ON DELETE CASCADE,
        principal text NOT NULL,
        name text NOT NULL,
        policies jsonb NOT NULL DEFAULT '[]',
        created timestamptz NOT NULL DEFAULT now(),
        modified timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, principal)
    );

    CREATE TABLE client_tokens (
        token_hash bytea PRIMARY KEY,
        account_id uuid NOT NULL,
        principal text NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        FOREIGN KEY (account_id, principal) REFERENCES clients ON DELETE CASCADE
    );
    CREATE INDEX client_tokens_client ON client_tokens (account_id, principal);

    CREATE TABLE actions (
        account_id uuid NOT NULL REFERENCES accounts ON DELETE CASCADE,
        action_id uuid NOT NULL,
        current_version integer NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        modified timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id)
    );
    CREATE INDEX actions_created ON actions (account_id, created DESC, action_id DESC);

    CREATE TABLE action_versions (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        version integer NOT NULL,
        name text NOT NULL,
        instructions text NOT NULL,
        model jsonb NOT NULL,
        harness jsonb NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        created_by text NOT NULL,
        PRIMARY KEY (account_id, action_id, version),
        FOREIGN KEY (account_id, action_id) REFERENCES actions ON DELETE CASCADE
    );

    CREATE TABLE sessions (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        session_id text NOT NULL,
        turns integer NOT NULL DEFAULT 0,
        created timestamptz NOT NULL DEFAULT now(),
        modified timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id, session_id),
        FOREIGN KEY (account_id, action_id) REFERENCES actions ON DELETE CASCADE
    );
    CREATE INDEX sessions_created ON sessions
        (account_id, action_id, created DESC, session_id DESC);

    -- One execution per turn (or per operator write); each attempt at it is an invocation.
    CREATE TABLE executions (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        execution_id uuid NOT NULL,
        action_version integer NOT NULL,
        session_id text,
        turn integer,
        invocation_number integer NOT NULL DEFAULT 1,
        kind text NOT NULL CHECK (kind IN ('TURN', 'OPERATOR')),
        status text NOT NULL CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED')),
        preview boolean NOT NULL DEFAULT false,
        principal text NOT NULL,
        input jsonb NOT NULL DEFAULT 'null',
        output jsonb,
        error text,
        replay_of uuid,
        created timestamptz NOT NULL DEFAULT now(),
        modified timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id, execution_id),
        FOREIGN KEY (account_id, action_id) REFERENCES actions ON DELETE CASCADE
    );
    CREATE INDEX executions_session ON executions
        (account_id, action_id, session_id, created DESC, execution_id DESC);

    CREATE TABLE transcript_events (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        execution_id uuid NOT NULL,
        sequence integer NOT NULL,
        invocation_number integer NOT NULL,
        type text NOT NULL,
        data jsonb NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id, execution_id, sequence),
        FOREIGN KEY (account_id, action_id, execution_id) REFERENCES executions ON DELETE CASCADE
    );
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
