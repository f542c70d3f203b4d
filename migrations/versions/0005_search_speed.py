"""Search speed: word frequencies in a table, words indexed by agent, rows kept whole.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

Measured on the 1,230,000-record benchmark table (bench/search_scale.py, bench/README.md):

- `rare_words` and `common_words` read ANALYZE's most common elements of `tsv` from
  `pg_stats` on every call: unnesting that array of up to 10,000 lexemes took 8 ms and 3 ms
  a search, a third of a large agent's. `search_words` now holds those frequencies, one row
  per lexeme, copied from `pg_stats` by `refresh_search_words()`, which the service calls at
  start and then every few minutes (app/memory/maintenance.py); the functions look the
  query's words up by primary key. Before the first refresh the table is empty and every
  word counts as rare, as before the first ANALYZE.
- Words are found by GIN on `(account_id, action_id, tsv)` (btree_gin), not on `tsv` alone.
  The index plan looks up a query's rare words (each in at most 2,000 records of the table):
  on `tsv` alone GIN returned every agent's records holding them, and checking each one's
  agent cost 10 ms a search at 200,000 records (916 rows read, 149 the agent's); keyed by the
  agent it returns only the agent's, though intersecting with the agent's entries still took
  6-7 ms there, so large agents get a GIN index of their own (app/memory/maintenance.py),
  which took 0.2 ms. Built in the migration's transaction: writes to agent_memories wait for
  the build (13 s at 1,230,000 records).
- The old GIN index had `fastupdate` on: new entries wait in a pending list that every
  search scans in full until VACUUM merges it. 2,000 inserted records made a search for two
  words that no record holds read 284 pages (5.5 ms). With `fastupdate` off an insert
  updates the index itself (slower writes, bounded reads).
- A row over 2 kB (a 256-d vector is 1 kB) was compressed, its vector moved to TOAST first:
  10% of the vectors (209 MB) lived there, and `tsv` was compressed, decompressed at every read.
  `toast_tuple_target` 8160 keeps rows up to a page whole and uncompressed, and the vector's
  storage MAIN keeps it in the row unless nothing else can go (scoring 1,000 rows: cosine
  2.5 -> 1.8 ms, `ts_rank` 3.2 -> 2.6 ms, the heap 11% larger). The vector type's storage is
  reset by every change of its dimensions, so `app/embeddings/store.py` sets it again.
  Existing rows keep their layout until rewritten.
- `agent_indexes` lists the large agents whose own HNSW and GIN indexes (partial indexes on
  the agent's key) are built; app/memory/maintenance.py builds and drops them.
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE search_words (
        lexeme text PRIMARY KEY,
        share float8 NOT NULL  -- of the table's records that hold the lexeme, per ANALYZE
    );

    CREATE FUNCTION refresh_search_words() RETURNS integer
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        -- Two refreshes at once would both insert every lexeme; the second waits instead.
        SELECT pg_advisory_xact_lock(hashtext('engram.search_words'));
        DELETE FROM search_words;
        INSERT INTO search_words (lexeme, share)
        SELECT DISTINCT ON (e.lexeme) e.lexeme, e.frequency
        FROM pg_stats s
        CROSS JOIN LATERAL unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs)
            AS e(lexeme, frequency)
        WHERE s.schemaname = current_schema() AND s.tablename = 'agent_memories'
          AND s.attname = 'tsv' AND e.lexeme IS NOT NULL
        ORDER BY e.lexeme, e.frequency DESC;
        SELECT count(*)::integer FROM search_words;
    END;

    CREATE OR REPLACE FUNCTION rare_words(query text, max_rows float8) RETURNS tsquery
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN replace(
        strip(array_to_tsvector(array(
            SELECT w FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
            WHERE NOT EXISTS (
                SELECT FROM search_words s, pg_class c
                -- Rounded: the estimate is a count; a float4 share read as float8 (5 records
                -- of 2,760: 5.0000001) would otherwise push a word at the limit over it.
                WHERE s.lexeme = w AND c.oid = 'agent_memories'::regclass
                  AND round(s.share * c.reltuples) > max_rows
            )
        )))::text, ''' ''', ''' | '''
    )::tsquery;

    CREATE OR REPLACE FUNCTION common_words(query text, min_share float8) RETURNS tsquery
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN replace(
        strip(array_to_tsvector(array(
            SELECT w FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
            JOIN search_words s ON s.lexeme = w
            WHERE s.share >= min_share
        )))::text, ''' ''', ''' | '''
    )::tsquery;

    SELECT refresh_search_words();

    -- Large agents' own HNSW and GIN indexes (app/memory/maintenance.py): a row once both
    -- are built. No foreign key: the indexes outlive their agent until the next round.
    CREATE TABLE agent_indexes (
        account_id uuid NOT NULL,
        action_id uuid NOT NULL,
        vectors_index text NOT NULL,
        words_index text NOT NULL,
        created timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, action_id)
    );

    CREATE EXTENSION IF NOT EXISTS btree_gin;
    CREATE INDEX agent_memories_words ON agent_memories USING gin (account_id, action_id, tsv)
        WITH (fastupdate = off);
    DROP INDEX agent_memories_tsv;

    ALTER TABLE agent_memories SET (toast_tuple_target = 8160);
    ALTER TABLE agent_memories ALTER COLUMN embedding SET STORAGE MAIN;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
