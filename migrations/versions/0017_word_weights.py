"""A text score that weighs rare words above common ones, and the query's words in tiers.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02

Memory search's text score becomes the sum of BM25's IDF, `ln(1 + (N - n + 0.5) / (n + 0.5))`,
over the query words a record holds (N the table's records, n those holding the word, from
`search_words`; a word it does not list counts as in one record). On the LoCoMo dev half it
found more than `ts_rank` (hybrid R@10 0.627 -> 0.653, bench/README.md), and since a record's
score depends only on which of the query's words it holds, the index plan can read the exact
text ranking from GIN tier by tier (app/memory/search_store.py).

- `query_words(query)`: each of the query's words as a tsquery, with its weight.
- `word_tiers(terms, weights)`: the records holding the first six terms (the caller passes
  them rarest first) in tiers, best weight first: a tier is the subsets of those words of one
  weight sum (one subset, unless words weigh the same); `held`, for GIN, a record holding all
  the words of one of them; `exact`, that and none of the other five words. Last, the records
  holding only later words. `tier` orders them. Every record holding any of the query's words
  is in exactly one tier, and within the first six words a tier's records score alike.
- `rare_words` and `common_words` (migration 0005) are no longer used and are dropped.
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE FUNCTION query_words(query text) RETURNS TABLE (term tsquery, weight float8)
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
        -- A lexeme's text form in a tsvector is quoted as tsquery input reads it.
        SELECT array_to_tsvector(ARRAY[w])::text::tsquery,
               ln(1 + (greatest(t.n - d.n, 0) + 0.5) / (d.n + 0.5))
        FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, query))) w
        CROSS JOIN (
            SELECT greatest(c.reltuples, 1)::float8 AS n
            FROM pg_class c WHERE c.oid = 'agent_memories'::regclass
        ) t
        CROSS JOIN LATERAL (
            SELECT greatest(coalesce(
                (SELECT s.share FROM search_words s WHERE s.lexeme = w), 0) * t.n, 1) AS n
        ) d;
    END;

    CREATE FUNCTION word_tiers(terms tsquery[], weights float8[])
    RETURNS TABLE (tier bigint, held tsquery, exact tsquery)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
        -- Subsets of equal weight (words of equal weight) are one tier, read together.
        SELECT row_number() OVER (ORDER BY g.weight DESC),
               string_agg('(' || g.held || ')', ' | ')::tsquery,
               string_agg('(' || g.held || ')' || coalesce(' & !(' || g.others || ')', ''), ' | ')
                   ::tsquery
        FROM (
            SELECT mask, round(sum(weights[b.i]) FILTER (WHERE b.held)::numeric, 9) AS weight,
                   string_agg(terms[b.i]::text, ' & ' ORDER BY b.i) FILTER (WHERE b.held) AS held,
                   string_agg(terms[b.i]::text, ' | ' ORDER BY b.i) FILTER (WHERE NOT b.held)
                       AS others
            FROM generate_series(1, (1 << least(cardinality(terms), 6)) - 1) mask
            CROSS JOIN LATERAL (
                SELECT i, (mask >> (i - 1)) & 1 = 1 AS held
                FROM generate_series(1, least(cardinality(terms), 6)) i
            ) b
            GROUP BY mask
            UNION ALL
            -- Last, the records holding only words after the sixth.
            SELECT 0, -1,
                   string_agg(terms[i]::text, ' | ' ORDER BY i) FILTER (WHERE i > 6),
                   string_agg(terms[i]::text, ' | ' ORDER BY i) FILTER (WHERE i <= 6)
            FROM generate_series(1, cardinality(terms)) i
            HAVING cardinality(terms) > 6
        ) g
        GROUP BY g.weight;
    END;

    DROP FUNCTION rare_words(text, float8);
    DROP FUNCTION common_words(text, float8);
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
