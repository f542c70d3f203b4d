"""Every reader of a listed agent weighs words by the records it sees, and a session's records
are found by an index.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02

Migration 0018 counted a listed agent's words over its live agent-scope records only, and
every other reader of it (session scope alone, the harness's default) weighed every word the
same: an agent that writes session scope (the default too) had no IDF at all, even for its
operators. Now:

- `agent_memories_session`: a partial btree on `(account_id, action_id, session_id)` of the
  session-scope rows. A session's records are read without walking the agent's: a reader of
  agent and session scope counts its own session's words at each search (unless they are
  kept, below), and a reader of session scope alone is ranked exactly over its session's rows
  when they are few, however large the agent (app/memory/search_store.py). Built in the
  migration, which writes to the table wait for (2 s at 1,230,000 records on 2 cores, the
  table in memory).
- `count_agent_words` counts every live record of the agent too (any scope, committed, not
  preview, not deleted or replaced): `agent_words.any_records` and
  `agent_indexes.words_counted_any`, which weigh an operator's searches (an operator sees every
  session). `agent_words.records` stays the agent-scope count, which weighs a live reader of
  agent scope, with its own session's counts added at search time, so that no reader's
  weights depend on records it cannot see. A word is stored when an agent-scope record holds
  it, or more than one record of any scope: a word not stored is in no agent-scope record
  (added to a session's count, exact) and in at most one record in all (as one: a word no
  record holds weighs nothing in any score).
- A listed agent's large sessions (the maintenance's SESSION_WORDS_MIN live records or more)
  have their words counted too (`count_session_words`: `session_words`, every word the
  session's live records hold, and `session_counts`), so that a turn of such a session is not
  weighed by counting its session at each search. They go with the agent's listing, or when
  the session falls under half that.
- `query_words(query, account, action, session)` returns the counts instead of a weight:
  `counted` and `held` (agent scope), `counted_any` and `held_any` (every scope),
  `session_counted` and `session_held` (the session's, when they are kept; `session` '' for
  none); NULL counts when not counted. The search composes the reader's weight from them.

Every listed agent's counts are cleared: the next maintenance round counts them again (until
then its searches count as an unlisted agent's do). A process of an older release fails its
listed agents' searches once this migration has run (`query_words` returns counts now):
restart every process with the new release.
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE INDEX agent_memories_session ON agent_memories (account_id, action_id, session_id)
        WHERE scope = 'SESSION';

    -- Locked first: an older process's count cannot store a row between the DELETE and the
    -- new column.
    LOCK TABLE agent_indexes, agent_words IN ACCESS EXCLUSIVE MODE;
    DELETE FROM agent_words;
    UPDATE agent_indexes SET words_counted = NULL, words_gone = NULL;
    ALTER TABLE agent_indexes ADD COLUMN words_counted_any bigint;
    ALTER TABLE agent_words ADD COLUMN any_records integer NOT NULL;

    CREATE OR REPLACE FUNCTION count_agent_words(account uuid, action uuid) RETURNS bigint
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        DELETE FROM agent_words WHERE account_id = account AND action_id = action;
        -- One statement, one snapshot: the words and the totals agree.
        WITH counted AS MATERIALIZED (
            SELECT m.tsv, m.scope = 'AGENT' AS agent FROM agent_memories m
            WHERE m.account_id = account AND m.action_id = action
              AND m.status = 'ACTIVE' AND m.pending_execution IS NULL AND NOT m.preview
        ), stored AS (
            INSERT INTO agent_words (account_id, action_id, lexeme, records, any_records)
            SELECT account, action, w, count(*) FILTER (WHERE c.agent), count(*)
            FROM counted c CROSS JOIN LATERAL unnest(tsvector_to_array(c.tsv)) w
            GROUP BY w HAVING count(*) > 1 OR bool_or(c.agent)
        )
        UPDATE agent_indexes SET
            words_counted = (SELECT count(*) FROM counted WHERE agent),
            words_counted_any = (SELECT count(*) FROM counted),
            words_gone = (SELECT count(*) FROM agent_memories m
                          WHERE m.account_id = account AND m.action_id = action
                            AND m.status <> 'ACTIVE' AND m.pending_execution IS NULL)
        WHERE account_id = account AND action_id = action
        RETURNING words_counted_any;
    END;

    CREATE TABLE session_counts (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        session_id text NOT NULL,
        counted bigint NOT NULL,  -- the session's live records when its words were counted
        gone bigint NOT NULL,  -- its rows deleted or replaced then
        PRIMARY KEY (account_id, action_id, session_id),
        FOREIGN KEY (account_id, action_id) REFERENCES agent_indexes ON DELETE CASCADE
    );

    CREATE TABLE session_words (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        session_id text NOT NULL,
        lexeme text NOT NULL,
        records integer NOT NULL,  -- of the session's counted records holding it (any)
        PRIMARY KEY (account_id, action_id, session_id, lexeme),
        FOREIGN KEY (account_id, action_id) REFERENCES agent_indexes ON DELETE CASCADE
    );

    CREATE FUNCTION count_session_words(account uuid, action uuid, session text) RETURNS bigint
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        DELETE FROM session_words
        WHERE account_id = account AND action_id = action AND session_id = session;
        -- One statement, one snapshot: the words and the totals agree.
        WITH counted AS MATERIALIZED (
            SELECT m.tsv FROM agent_memories m
            WHERE m.account_id = account AND m.action_id = action AND m.scope = 'SESSION'
              AND m.session_id = session
              AND m.status = 'ACTIVE' AND m.pending_execution IS NULL AND NOT m.preview
        ), stored AS (
            INSERT INTO session_words (account_id, action_id, session_id, lexeme, records)
            SELECT account, action, session, w, count(*)
            FROM counted c CROSS JOIN LATERAL unnest(tsvector_to_array(c.tsv)) w
            GROUP BY w
        )
        INSERT INTO session_counts (account_id, action_id, session_id, counted, gone)
        SELECT account, action, session, (SELECT count(*) FROM counted),
            (SELECT count(*) FROM agent_memories m
             WHERE m.account_id = account AND m.action_id = action AND m.scope = 'SESSION'
               AND m.session_id = session AND m.status <> 'ACTIVE'
               AND m.pending_execution IS NULL)
        ON CONFLICT (account_id, action_id, session_id) DO UPDATE
            SET counted = excluded.counted, gone = excluded.gone
        RETURNING counted;
    END;

    DROP FUNCTION query_words(text, uuid, uuid);

    CREATE FUNCTION query_words(query text, account uuid, action uuid, session text)
    RETURNS TABLE (term tsquery, counted bigint, held integer, counted_any bigint,
                   held_any integer, session_counted bigint, session_held integer)
    -- STRICT: the planner does not inline it, so that a custom plan, which would see the
    -- query's words, never looks cheaper than the cached generic one (every search of an
    -- operator was planned anew: 2 ms at 25,000 records). `session` '' reads no session.
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
        -- A lexeme's text form in a tsvector is quoted as tsquery input reads it. Each word
        -- is looked up by the primary key (LIMIT 1 keeps the lateral a lookup per word: as a
        -- join, the planner guessed a thousand words and read all of agent_words, 3 ms and
        -- 2,500 buffers for five words at 25,000 records).
        SELECT array_to_tsvector(ARRAY[w])::text::tsquery,
               a.words_counted, coalesce(s.records, 0),
               a.words_counted_any, coalesce(s.any_records, 1),
               n.counted, coalesce(o.records, 0)
        FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
        LEFT JOIN agent_indexes a ON a.account_id = account AND a.action_id = action
        LEFT JOIN session_counts n ON n.account_id = account AND n.action_id = action
            AND n.session_id = session
        LEFT JOIN LATERAL (
            SELECT c.records, c.any_records FROM agent_words c
            WHERE c.account_id = account AND c.action_id = action AND c.lexeme = w LIMIT 1
        ) s ON true
        LEFT JOIN LATERAL (
            SELECT c.records FROM session_words c
            WHERE c.account_id = account AND c.action_id = action AND c.session_id = session
              AND c.lexeme = w LIMIT 1
        ) o ON true;
    END;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
