"""A word tier tells the most its records can score, so that the index plan can stop early.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

`word_tiers(terms, weights)` (migration 0017) also returns each tier's `most`: the most text
score a record of it can have. For a tier of the first six words that is the sum of the
weights of the subset its records hold, plus every word after the sixth (which add to a
record's score without moving its tier); for the last tier, the records holding only words
after the sixth, the sum of those words' weights (each padded by a relative 1e-12 against
the rounding of sums in another order). So `most` never grows from one tier to the next. The
hybrid index plan stops before a tier whose records can no longer reach the page
(app/memory/search_store.py).
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    DROP FUNCTION word_tiers(tsquery[], float8[]);

    CREATE FUNCTION word_tiers(terms tsquery[], weights float8[])
    RETURNS TABLE (tier bigint, most float8, held tsquery, exact tsquery)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
        -- Subsets of equal weight (words of equal weight) are one tier, read together.
        -- `most` is padded by a relative 1e-12: a record's score sums the same weights in
        -- another order, which can round to about an ulp per word above this sum.
        SELECT row_number() OVER (ORDER BY g.weight DESC), max(g.most) * (1 + 1e-12),
               string_agg('(' || g.held || ')', ' | ')::tsquery,
               string_agg('(' || g.held || ')' || coalesce(' & !(' || g.others || ')', ''), ' | ')
                   ::tsquery
        FROM (
            SELECT mask, round(sum(weights[b.i]) FILTER (WHERE b.held)::numeric, 9) AS weight,
                   sum(weights[b.i]) FILTER (WHERE b.held)
                       + coalesce((SELECT sum(x) FROM unnest(weights[7:]) x), 0) AS most,
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
            SELECT 0, -1, sum(weights[i]) FILTER (WHERE i > 6),
                   string_agg(terms[i]::text, ' | ' ORDER BY i) FILTER (WHERE i > 6),
                   string_agg(terms[i]::text, ' | ' ORDER BY i) FILTER (WHERE i <= 6)
            FROM generate_series(1, cardinality(terms)) i
            HAVING cardinality(terms) > 6
        ) g
        GROUP BY g.weight;
    END;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
