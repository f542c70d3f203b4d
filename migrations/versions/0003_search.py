"""Search: the text queries that the lexical side of memory search uses.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

`any_words(text)` turns a question into a tsquery matching records that share ANY of its
stemmed, stop-worded English words (`websearch_to_tsquery` and `plainto_tsquery` require
every word, and a natural-language question rarely contains every word of its answer).
It is built from `to_tsvector` so query and records are normalized by the same
configuration as the stored `tsv` column; stripped lexemes are quoted in the tsvector's text
form, which the tsquery input reads unchanged, and no lexeme contains a space.

`rare_words(text, max_rows)` keeps only the words that the table's statistics (ANALYZE's most
common elements of `tsv`, with a larger statistics target so more lexemes keep their
frequencies) do not put in more than `max_rows` records; `common_words(text, min_share)` the
words they put in at least that share of the records. The index plan of search finds
candidates for rare words through the GIN index, whose work is then bounded, and for common
words by reading the agent's newest records, where they are soon met (app/memory/search.py).

Extended statistics on (account_id, action_id) give the planner each agent's real size.
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE FUNCTION any_words(query text) RETURNS tsquery
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN replace(
        strip(to_tsvector('english'::regconfig, query))::text, ''' ''', ''' | '''
    )::tsquery;

    CREATE FUNCTION rare_words(query text, max_rows float8) RETURNS tsquery
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN replace(
        strip(array_to_tsvector(array(
            SELECT w FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
            EXCEPT
            SELECT e.lexeme
            FROM pg_stats s
            CROSS JOIN LATERAL unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs)
                AS e(lexeme, frequency)
            JOIN pg_class c ON c.oid = 'agent_memories'::regclass
            WHERE s.schemaname = current_schema() AND s.tablename = 'agent_memories'
              AND s.attname = 'tsv' AND e.frequency * c.reltuples > max_rows
        )))::text, ''' ''', ''' | '''
    )::tsquery;

    CREATE FUNCTION common_words(query text, min_share float8) RETURNS tsquery
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN replace(
        strip(array_to_tsvector(array(
            SELECT e.lexeme
            FROM pg_stats s
            CROSS JOIN LATERAL unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs)
                AS e(lexeme, frequency)
            WHERE s.schemaname = current_schema() AND s.tablename = 'agent_memories'
              AND s.attname = 'tsv' AND e.frequency >= min_share
            INTERSECT
            SELECT w FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
        )))::text, ''' ''', ''' | '''
    )::tsquery;

    ALTER TABLE agent_memories ALTER COLUMN tsv SET STATISTICS 1000;

    -- An agent belongs to one account: without this the planner multiplies the two columns'
    -- selectivities and takes a 200,000-record agent for 53,000, so it may sort, not use HNSW.
    CREATE STATISTICS agent_memories_agent (dependencies, mcv) ON account_id, action_id
        FROM agent_memories;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
