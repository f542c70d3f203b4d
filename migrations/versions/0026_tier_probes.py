"""A tier's GIN probe stops taking words once its rarer ones are held by few records.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-03

`word_tiers(terms, weights)` (migrations 0022 and 0025) asks GIN, for each subset of the
query's six rarest words, for the records holding its rarest three (`probe`), and tests the
tier's `exact` on the rows it finds. At 200,000 records most of an empty tier's probe was GIN
reading the posting lists of a subset's second and third words where these are common (about
20 buffers, 0.11 ms a probe), although the rarest word alone left few rows to test.

`word_tiers(terms, weights, records)` returns the same tiers (the same `tier`, `most`, `held`
and `exact`), but a subset's probe takes its next rarest word only while the words already in
it are expected in more than 20 of the agent's `records`: a word's weight is BM25's IDF, so
records * e^-(their weights) is about how many hold them all (as `_newest_first` reads it), and
a probe stops growing once their weights reach ln(records / 20). Still at most three words.
GIN then reads fewer posting lists and the heap a few more rows, each tested on `exact` as
before, so the same records come back. Words that go together ("outdoor" and "gear") are held
by far more records than chance would put them in, and there a shorter probe reads more rows
only to drop them; over whole samples of questions that cost is outweighed. Measured in
bench/README.md (twenty-ninth session).

The two-argument form is kept, for a process of the release before: it is the three-argument
form with `records` infinite (three words, as 0025, for weights without NULL or NaN), and so
depends on it: a migration that drops the three-argument form must first drop or replace it.
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE FUNCTION word_tiers(terms tsquery[], weights float8[], records float8)
    RETURNS TABLE (tier bigint, most float8, held tsquery, exact tsquery, probe tsquery)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET plan_cache_mode = force_generic_plan
    BEGIN ATOMIC
        WITH RECURSIVE n AS MATERIALIZED (
            -- The words that make subsets (the first six), the weight of those after, and the
            -- weight under which a probe's words still take another (records * e^-weight,
            -- the records expected to hold them, above 20).
            SELECT least(cardinality(terms), 6) AS six,
                   (SELECT coalesce(sum(w), 0) FROM unnest(weights[7:]) w) AS later,
                   ln(greatest(records, 1) / 20) AS room
        ), s(mask, top, weight, held, anyof, probe, words, probed, rarest) AS (
            -- Each subset of the first six words (bit i - 1: word i), grown one word at a
            -- time in their order: its weight, its words all (`held`) and any (`anyof`), and
            -- its rarest words (`probe`: at most three, and no more once they are rare
            -- enough; `probed` of them, weighing `rarest`).
            SELECT 1 << (i - 1), i, weights[i], terms[i], terms[i], terms[i], 1, 1, weights[i]
            FROM n, generate_series(1, n.six) i
            UNION ALL
            SELECT s.mask | (1 << (i - 1)), i, s.weight + weights[i], s.held && terms[i],
                   s.anyof || terms[i],
                   CASE WHEN x.grows THEN s.probe && terms[i] ELSE s.probe END, s.words + 1,
                   s.probed + x.grows::int,
                   CASE WHEN x.grows THEN s.rarest + weights[i] ELSE s.rarest END
            FROM s, n, generate_series(s.top + 1, n.six) i,
                LATERAL (SELECT s.probed < 3 AND s.rarest < n.room AS grows) x
        ), g AS (
            -- `most` is padded by a relative 1e-12 below: a record's score sums the same
            -- weights in another order, which can round to about an ulp per word above this.
            SELECT s.mask, round(s.weight * 1e9) AS weight, s.weight + n.later AS most, s.held,
                   CASE WHEN o.anyof IS NULL THEN s.held ELSE s.held && !! o.anyof END AS exact,
                   s.probe
            FROM n CROSS JOIN s LEFT JOIN s o ON o.mask = ((1 << n.six) - 1) # s.mask
            UNION ALL
            -- Last, the records holding only words after the sixth.
            SELECT 0, -1, sum(weights[i]) FILTER (WHERE i > 6),
                   tsquery_or_all(terms[i] ORDER BY i) FILTER (WHERE i > 6),
                   tsquery_or_all(terms[i] ORDER BY i) FILTER (WHERE i > 6)
                       && !! tsquery_or_all(terms[i] ORDER BY i) FILTER (WHERE i <= 6),
                   tsquery_or_all(terms[i] ORDER BY i) FILTER (WHERE i > 6)
            FROM generate_series(1, cardinality(terms)) i
            HAVING cardinality(terms) > 6
        )
        -- Subsets of equal weight (words of equal weight) are one tier, read together.
        SELECT row_number() OVER (ORDER BY g.weight DESC), max(g.most) * (1 + 1e-12),
               tsquery_or_all(g.held ORDER BY g.mask), tsquery_or_all(g.exact ORDER BY g.mask),
               tsquery_or_all(g.probe ORDER BY g.mask)
        FROM g
        GROUP BY g.weight;
    END;

    CREATE OR REPLACE FUNCTION word_tiers(terms tsquery[], weights float8[])
    RETURNS TABLE (tier bigint, most float8, held tsquery, exact tsquery, probe tsquery)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
        SELECT * FROM word_tiers(terms, weights, 'Infinity'::float8);
    END;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
