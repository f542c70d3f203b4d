"""The query's word tiers built with tsquery operators, not parsed from text.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-03

`word_tiers(terms, weights)` (migrations 0017, 0019 and 0022) returns, for arrays without NULL
elements (what the search passes), the same rows as 0022's, to the text of each tsquery, but
where a sum of weights falls on a midpoint of the 1e-9 rounding that groups equal weights
(below). 0022 wrote each subset's words out as text (a `tsquery` converted to text once per
word, subset and column) and parsed three strings a tier back into `tsquery`: a quarter of
its CPU, in every statement of the index plan that has words (bench/README.md,
twenty-eighth session). Here a subset's `held` and `probe` grow from a smaller subset's by
one `&&` (a recursive query adding the words in their order, rarest first); `exact` is `held
&& !! others`, where `others` is the subset of the words left out, found by its mask; and
subsets of equal weight are joined by `tsquery_or_all`, an aggregate of `||`, in the order of
their masks (the order in which 0022's rows came). A subset's weight is summed in the words'
order, as before, and rounded to 1e-9 as a float for grouping (0022: as numeric, whose
conversion cost more than the sums; the two round a midpoint differently).

For six words of distinct weights a call takes about two thirds of 0022's time (a loop of
calls: 310-390 against 480-570 µs); with two or three words of equal weight about as long.
With four or more of equal weight it takes longer, up to about twice (six words all of
weight 1, as a preview turn weighs every word: 600-800 against 365-490 µs): each `||` of a
tier copies the tier's growing query, and such a tier joins up to 20 subsets.

`CREATE OR REPLACE` keeps the function's OID and signature: a process of the release before
calls it as before.
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE AGGREGATE tsquery_or_all(tsquery) (
        SFUNC = tsquery_or, STYPE = tsquery, PARALLEL = SAFE
    );

    CREATE OR REPLACE FUNCTION word_tiers(terms tsquery[], weights float8[])
    RETURNS TABLE (tier bigint, most float8, held tsquery, exact tsquery, probe tsquery)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET plan_cache_mode = force_generic_plan
    BEGIN ATOMIC
        WITH RECURSIVE n AS MATERIALIZED (
            -- The words that make subsets (the first six), and the weight of those after.
            SELECT least(cardinality(terms), 6) AS six,
                   (SELECT coalesce(sum(w), 0) FROM unnest(weights[7:]) w) AS later
        ), s(mask, top, weight, held, anyof, probe, words) AS (
            -- Each subset of the first six words (bit i - 1: word i), grown one word at a
            -- time in their order: its weight, its words all (`held`) and any (`anyof`), and
            -- its first three (`probe`).
            SELECT 1 << (i - 1), i, weights[i], terms[i], terms[i], terms[i], 1
            FROM n, generate_series(1, n.six) i
            UNION ALL
            SELECT s.mask | (1 << (i - 1)), i, s.weight + weights[i], s.held && terms[i],
                   s.anyof || terms[i],
                   CASE WHEN s.words < 3 THEN s.probe && terms[i] ELSE s.probe END, s.words + 1
            FROM s, n, generate_series(s.top + 1, n.six) i
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
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
