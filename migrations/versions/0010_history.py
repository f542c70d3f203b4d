"""Session history: what committed turns said, kept in parts indexed for words and meaning.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

`history_events` holds one row per kept event of a committed turn (the user's message, an
agent reply with the tools it called, a tool's result or error), written in the turn's commit
transaction (app/history/keeping.py). `history_parts` splits each event's text on sentence or
line boundaries into parts sized for the embedder; each part has its own `tsv` (GIN, keyed by
the session, btree_gin from 0005) and `embedding` (HNSW, cosine, like agent_memories: the
column's dimension and index are fixed by app/embeddings/store.py, here at once when the
deployment's model is already recorded). Keys lead with account_id, then action_id.

Executions gain the kind `ERASE`: `eraseSession` is recorded as one, naming who asked.
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE executions DROP CONSTRAINT executions_kind_check;
    ALTER TABLE executions ADD CONSTRAINT executions_kind_check
        CHECK (kind IN ('TURN', 'OPERATOR', 'ERASE'));
    CREATE INDEX executions_replay_of ON executions (account_id, action_id, replay_of)
        WHERE replay_of IS NOT NULL;

    CREATE TABLE history_events (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        session_id text NOT NULL,
        event_id uuid NOT NULL,
        turn integer NOT NULL,
        execution_id uuid NOT NULL,
        invocation_number integer NOT NULL,
        sequence integer NOT NULL,
        who text NOT NULL CHECK (who IN ('user', 'agent', 'tool')),
        call_id text,  -- a tool result's call
        tool text,  -- a tool result's tool
        data jsonb NOT NULL,  -- the event as kept: message, reply and calls, or output / error
        text text NOT NULL,  -- what is searched and read back
        parts integer NOT NULL,
        preview boolean NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id, session_id, event_id),
        FOREIGN KEY (account_id, action_id, session_id) REFERENCES sessions ON DELETE CASCADE
    );
    CREATE UNIQUE INDEX history_events_order ON history_events
        (account_id, action_id, session_id, turn, sequence);

    CREATE TABLE history_parts (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        session_id text NOT NULL,
        event_id uuid NOT NULL,
        part integer NOT NULL,
        turn integer NOT NULL,
        preview boolean NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        text text NOT NULL,
        embedding vector,
        tsv tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED,
        PRIMARY KEY (account_id, action_id, session_id, event_id, part),
        FOREIGN KEY (account_id, action_id, session_id, event_id)
            REFERENCES history_events ON DELETE CASCADE
    );
    -- The exact plan reads a session's parts before a turn by this btree; the index plan
    -- walks a large session's newest parts for words in it alone (index-only, `tsv` included).
    CREATE INDEX history_parts_session ON history_parts
        (account_id, action_id, session_id, turn DESC) INCLUDE (preview, event_id, part, tsv);
    CREATE INDEX history_parts_words ON history_parts
        USING gin (account_id, action_id, session_id, tsv) WITH (fastupdate = off);
    ALTER TABLE history_parts SET (toast_tuple_target = 8160);
    ALTER TABLE history_parts ALTER COLUMN embedding SET STORAGE MAIN;
    CREATE STATISTICS history_parts_session_stats (dependencies, mcv)
        ON account_id, action_id, session_id FROM history_parts;

    -- A database whose embedding model is already fixed: fix this column to it too.
    DO $$
    DECLARE dimensions integer;
    BEGIN
        SELECT (value->>'dimensions')::integer INTO dimensions
        FROM deployment WHERE key = 'embedding';
        IF dimensions IS NOT NULL THEN
            EXECUTE format(
                'ALTER TABLE history_parts ALTER COLUMN embedding TYPE vector(%s),'
                ' ALTER COLUMN embedding SET STORAGE MAIN', dimensions);
            CREATE INDEX history_parts_embedding ON history_parts
                USING hnsw (embedding vector_cosine_ops);
        END IF;
    END $$;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
