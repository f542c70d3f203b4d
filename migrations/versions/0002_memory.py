"""Agent memory: the current state of each record and every version of it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

The embedding column is created without a dimension; `app.embeddings.setup` fixes it to the
deployment's embedding model (and builds the HNSW index) when the service first starts.
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE agent_memories (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        memory_id uuid NOT NULL,
        version integer NOT NULL,
        created timestamptz NOT NULL,
        modified timestamptz NOT NULL,
        summary text NOT NULL,
        content text NOT NULL DEFAULT '',
        metadata jsonb NOT NULL DEFAULT '{}',
        status text NOT NULL CHECK (status IN ('ACTIVE', 'DELETED', 'SUPERSEDED')),
        scope text NOT NULL CHECK (scope IN ('SESSION', 'AGENT')),
        kind text NOT NULL,
        source text NOT NULL CHECK (source IN ('EXTRACTION', 'TOOL', 'OPERATOR')),
        pinned boolean NOT NULL DEFAULT false,
        labels jsonb NOT NULL DEFAULT '{}',
        replaces uuid,
        replaced_by uuid,
        preview boolean NOT NULL DEFAULT false,
        -- Written as the deletion of the record it names in replaces (a preview turn's deletion
        -- of a live record), not a record deleted later: only these are listed (spec P5).
        tombstone boolean NOT NULL DEFAULT false,
        execution_id uuid NOT NULL,
        invocation_number integer NOT NULL,
        action_version integer NOT NULL,
        session_id text,
        modified_by text NOT NULL,
        -- Set while a running turn has staged this row: only that attempt (execution and
        -- invocation) sees it until it commits; a retried attempt never sees a failed one's rows.
        pending_execution uuid,
        pending_invocation integer,
        embedding vector,
        tsv tsvector GENERATED ALWAYS AS (
            to_tsvector('english'::regconfig, summary || ' ' || content)
        ) STORED,
        PRIMARY KEY (account_id, action_id, memory_id),
        FOREIGN KEY (account_id, action_id) REFERENCES actions ON DELETE CASCADE
    );
    CREATE INDEX agent_memories_created ON agent_memories
        (account_id, action_id, created DESC, memory_id DESC);
    CREATE INDEX agent_memories_replaces ON agent_memories (account_id, action_id, replaces)
        WHERE replaces IS NOT NULL;
    -- A record has at most one committed live successor, and at most one committed preview
    -- record naming it: concurrent writers replacing the same record cannot both win.
    CREATE UNIQUE INDEX agent_memories_one_successor ON agent_memories
        (account_id, action_id, replaces, preview)
        WHERE replaces IS NOT NULL AND pending_execution IS NULL;
    CREATE INDEX agent_memories_pinned ON agent_memories (account_id, action_id, created, memory_id)
        WHERE pinned AND status = 'ACTIVE';
    CREATE INDEX agent_memories_pending ON agent_memories (account_id, action_id, pending_execution)
        WHERE pending_execution IS NOT NULL;
    CREATE INDEX agent_memories_tsv ON agent_memories USING gin (tsv);
    CREATE INDEX agent_memories_labels ON agent_memories USING gin (labels jsonb_path_ops);

    CREATE TABLE agent_memory_versions (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        memory_id uuid NOT NULL,
        version integer NOT NULL,
        created timestamptz NOT NULL,
        modified timestamptz NOT NULL,
        summary text NOT NULL,
        content text NOT NULL,
        metadata jsonb NOT NULL,
        status text NOT NULL,
        scope text NOT NULL,
        kind text NOT NULL,
        source text NOT NULL,
        pinned boolean NOT NULL,
        labels jsonb NOT NULL,
        replaces uuid,
        replaced_by uuid,
        preview boolean NOT NULL,
        execution_id uuid NOT NULL,
        invocation_number integer NOT NULL,
        action_version integer NOT NULL,
        session_id text,
        modified_by text NOT NULL,
        PRIMARY KEY (account_id, action_id, memory_id, version)
    );

    -- Versions are never rewritten or removed.
    CREATE FUNCTION agent_memory_versions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'agent_memory_versions is append-only';
    END;
    $$;
    CREATE TRIGGER agent_memory_versions_append_only
        BEFORE UPDATE OR DELETE ON agent_memory_versions
        FOR EACH ROW EXECUTE FUNCTION agent_memory_versions_append_only();
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
