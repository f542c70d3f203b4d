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
  agent and session scope counts its own session's words at each search, and a reader of
  session scope alone is ranked exactly over its session's rows when they are few, however
  large the agent (app/memory/search_store.py). Built in the migration, which writes to the
  table wait for (2 s at 1,230,000 records on 2 cores, the table in memory).
- `count_agent_words` counts every live record of the agent too (any scope, committed, not
  preview, not deleted or replaced): `agent_words.any_records` and
  `agent_indexes.words_counted_any`, which weigh an operator's searches (an operator sees every
  session). `agent_words.records` stays the agent-scope count, which weighs a live reader of
  agent scope, with its own session's counts added at search time, so that no reader's
  weights depend on records it cannot see. A word is stored when an agent-scope record holds
  it, or more than one record of any scope: a word not stored is in no agent-scope record
  (added to a session's count, exact) and in at most one record in all (as one: a word no
  record holds weighs nothing in any score).
- `query_words(query, account, action)` returns the counts instead of a weight: `counted`
  and `held` (agent scope), `counted_any` and `held_any` (every scope); NULL counts when the
  agent's words are not counted. The search composes the reader's weight from them.

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
                            AND m.status <> 'ACTIVE')
        WHERE account_id = account AND action_id = action
        RETURNING words_counted_any;
    END;

    DROP FUNCTION query_words(text, uuid, uuid);

    CREATE FUNCTION query_words(query text, account uuid, action uuid)
    RETURNS TABLE (term tsquery, counted bigint, held integer, counted_any bigint,
                   held_any integer)
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
        -- A lexeme's text form in a tsvector is quoted as tsquery input reads it. Each word
        -- is looked up by the primary key (LIMIT 1 keeps the lateral a lookup per word: as a
        -- join, the planner guessed a thousand words and read all of agent_words, 3 ms and
        -- 2,500 buffers for five words at 25,000 records).
        SELECT array_to_tsvector(ARRAY[w])::text::tsquery,
               a.words_counted, coalesce(s.records, 0),
               a.words_counted_any, coalesce(s.any_records, 1)
        FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
        LEFT JOIN agent_indexes a ON a.account_id = account AND a.action_id = action
        LEFT JOIN LATERAL (
            SELECT c.records, c.any_records FROM agent_words c
            WHERE c.account_id = account AND c.action_id = action AND c.lexeme = w LIMIT 1
        ) s ON true;
    END;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
