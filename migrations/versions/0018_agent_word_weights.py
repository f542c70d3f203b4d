"""Word weights from the agent's own records, never from other agents', tenants' or sessions'.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02

Migration 0017 weighed a query word by BM25's IDF over the whole table (`search_words`, from
ANALYZE, and the table's `reltuples`): every tenant's records shaped every other's ranking,
and a lexical score, which search returns, told any caller how many records the deployment
holds and how common a word is across tenants. Now the counts are the agent's own:

- An agent with its own search indexes (listed in `agent_indexes`) has its words counted by
  the maintenance (`count_agent_words`), over its live agent-scope records only (committed,
  not preview, not deleted or replaced): what every live reader of the agent's agent scope
  sees, so that no session learns anything of another's records, of preview records or of
  deleted ones through a score. `agent_words` holds how many of them hold each word (words
  held by one are not stored: a word it does not list counts as in one);
  `agent_indexes.words_counted`, how many they were, and `words_gone`, how many of the agent's
  rows were deleted or replaced then (the maintenance counts again at its next round once a
  record is deleted or replaced, or the records grow by a tenth). Unlisting an agent deletes
  its counts (the foreign key). Until the first maintenance round after this migration
  (`engram maintain-search` when rounds are off), listed agents have no counts, and their
  searches count as any other agent's do.
- The counts weigh the searches of operators and of live readers of agent scope. Another
  reader of a listed agent (session scope alone, or preview) is not weighed by records it
  cannot see, nor made to count a large agent's words at each search: every word weighs the
  same for it. Any other agent's weights are counted by the search itself, over the records
  it ranks (app/memory/search_store.py).

- `word_weight(records, holding)`: BM25's IDF, `ln(1 + (N - n + 0.5) / (n + 0.5))`.
- `query_words(query, account, action)`: each of the query's words as a tsquery, with its
  weight from the agent's counts, or NULL when the agent's words are not counted.
- `search_words`, `refresh_search_words()` and `query_words(text)` are dropped.
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- NULL: not counted yet.
    ALTER TABLE agent_indexes ADD COLUMN words_counted bigint, ADD COLUMN words_gone bigint;

    CREATE TABLE agent_words (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        lexeme text NOT NULL,
        records integer NOT NULL,  -- of the agent's counted records (at least two) holding it
        PRIMARY KEY (account_id, action_id, lexeme),
        FOREIGN KEY (account_id, action_id) REFERENCES agent_indexes ON DELETE CASCADE
    );

    CREATE FUNCTION word_weight(records float8, holding float8) RETURNS float8
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ln(1 + (greatest(records - holding, 0) + 0.5) / (holding + 0.5));

    CREATE FUNCTION count_agent_words(account uuid, action uuid) RETURNS bigint
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        DELETE FROM agent_words WHERE account_id = account AND action_id = action;
        -- One statement, one snapshot: the words and the totals agree.
        WITH counted AS MATERIALIZED (
            SELECT m.tsv FROM agent_memories m
            WHERE m.account_id = account AND m.action_id = action AND m.scope = 'AGENT'
              AND m.status = 'ACTIVE' AND m.pending_execution IS NULL AND NOT m.preview
        ), stored AS (
            INSERT INTO agent_words (account_id, action_id, lexeme, records)
            SELECT account, action, w, count(*)
            FROM counted c CROSS JOIN LATERAL unnest(tsvector_to_array(c.tsv)) w
            GROUP BY w HAVING count(*) > 1
        )
        UPDATE agent_indexes SET
            words_counted = (SELECT count(*) FROM counted),
            words_gone = (SELECT count(*) FROM agent_memories m
                          WHERE m.account_id = account AND m.action_id = action
                            AND m.status <> 'ACTIVE')
        WHERE account_id = account AND action_id = action
        RETURNING words_counted;
    END;

    CREATE FUNCTION query_words(query text, account uuid, action uuid)
    RETURNS TABLE (term tsquery, weight float8)
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
        -- A lexeme's text form in a tsvector is quoted as tsquery input reads it. Each word
        -- is looked up by the primary key (as a join, the planner guessed a thousand words and
        -- read all of agent_words: 1.3 ms for two words at 25,000 records).
        SELECT array_to_tsvector(ARRAY[w])::text::tsquery,
               word_weight(a.words_counted, coalesce((
                   SELECT s.records FROM agent_words s
                   WHERE s.account_id = account AND s.action_id = action AND s.lexeme = w), 1))
        FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
        LEFT JOIN agent_indexes a ON a.account_id = account AND a.action_id = action;
    END;

    DROP FUNCTION query_words(text);
    DROP FUNCTION refresh_search_words();
    DROP TABLE search_words;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
