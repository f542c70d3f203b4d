"""The query's word tiers: built faster, and each with a lighter GIN probe.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02

`word_tiers(terms, weights)` (migrations 0017 and 0019) returns the same tiers for arrays
without NULL elements (what the search passes), built another way and planned once per
connection, and a fifth column, `probe`:

- Each subset of the six rarest words is one row of `generate_series` whose weight and words
  are read off its mask's bits, where 0019 grouped six rows per subset under three ordered
  aggregates.
- `plan_cache_mode = force_generic_plan`: PostgreSQL 18 caches a SQL function's plan, but
  `auto` planned this one anew at every call (a custom plan, which sees the number of subsets,
  always looked cheaper than the generic one).
- `probe`: what GIN is asked for a tier's records, the rarest three words of each of its
  subsets (`terms` come rarest first), where the search asked for all of them (`held`). The
  tier's `exact` is tested on the rows GIN finds, as before, so the same records come back;
  GIN no longer reads the posting lists of a subset's more common words, which cost most in
  the tiers that turn out empty. One word read too many rows to test, four saved less
  (bench/README.md, seventeenth session, has the figures).

A subset's weight is summed in the words' order here, where 0019's sum had no set order;
`most` may differ in the last bit, which its padding (a relative 1e-12) was made for. The
function gets a new OID: a process of the release before re-plans its statements and keeps
asking GIN for `held`.
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    DROP FUNCTION word_tiers(tsquery[], float8[]);

    CREATE FUNCTION word_tiers(terms tsquery[], weights float8[])
    RETURNS TABLE (tier bigint, most float8, held tsquery, exact tsquery, probe tsquery)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET plan_cache_mode = force_generic_plan
    BEGIN ATOMIC
        -- Subsets of equal weight (words of equal weight) are one tier, read together.
        -- `most` is padded by a relative 1e-12: a record's score sums the same weights in
        -- another order, which can round to about an ulp per word above this sum.
        SELECT row_number() OVER (ORDER BY g.weight DESC), max(g.most) * (1 + 1e-12),
               string_agg('(' || g.held || ')', ' | ')::tsquery,
               string_agg('(' || g.held || ')' || coalesce(' & !(' || g.others || ')', ''), ' | ')
                   ::tsquery,
               string_agg('(' || g.probe || ')', ' | ')::tsquery
        FROM (
            SELECT x.mask, round(x.weight::numeric, 9) AS weight, x.weight + r.later AS most,
                   x.held, nullif(x.others, '') AS others, x.probe
            FROM (
                -- A subset's weight and words, from the bits of its mask (bit i - 1: word i,
                -- of the first six; a word past the end of `terms` is NULL, and left out).
                SELECT s.mask,
                    coalesce(CASE WHEN s.mask & 1 <> 0 THEN weights[1] END, 0)
                    + coalesce(CASE WHEN s.mask & 2 <> 0 THEN weights[2] END, 0)
                    + coalesce(CASE WHEN s.mask & 4 <> 0 THEN weights[3] END, 0)
                    + coalesce(CASE WHEN s.mask & 8 <> 0 THEN weights[4] END, 0)
                    + coalesce(CASE WHEN s.mask & 16 <> 0 THEN weights[5] END, 0)
                    + coalesce(CASE WHEN s.mask & 32 <> 0 THEN weights[6] END, 0) AS weight,
                    concat_ws(' & ',
                        CASE WHEN s.mask & 1 <> 0 THEN terms[1]::text END,
                        CASE WHEN s.mask & 2 <> 0 THEN terms[2]::text END,
                        CASE WHEN s.mask & 4 <> 0 THEN terms[3]::text END,
                        CASE WHEN s.mask & 8 <> 0 THEN terms[4]::text END,
                        CASE WHEN s.mask & 16 <> 0 THEN terms[5]::text END,
                        CASE WHEN s.mask & 32 <> 0 THEN terms[6]::text END) AS held,
                    concat_ws(' | ',
                        CASE WHEN s.mask & 1 = 0 THEN terms[1]::text END,
                        CASE WHEN s.mask & 2 = 0 THEN terms[2]::text END,
                        CASE WHEN s.mask & 4 = 0 THEN terms[3]::text END,
                        CASE WHEN s.mask & 8 = 0 THEN terms[4]::text END,
                        CASE WHEN s.mask & 16 = 0 THEN terms[5]::text END,
                        CASE WHEN s.mask & 32 = 0 THEN terms[6]::text END) AS others,
                    -- The subset's first three words: a word whose bit has three set below
                    -- it is left out.
                    concat_ws(' & ',
                        CASE WHEN s.mask & 1 <> 0 THEN terms[1]::text END,
                        CASE WHEN s.mask & 2 <> 0 THEN terms[2]::text END,
                        CASE WHEN s.mask & 4 <> 0 THEN terms[3]::text END,
                        CASE WHEN s.mask & 8 <> 0 AND bit_count((s.mask & 7)::bit(6)) < 3
                            THEN terms[4]::text END,
                        CASE WHEN s.mask & 16 <> 0 AND bit_count((s.mask & 15)::bit(6)) < 3
                            THEN terms[5]::text END,
                        CASE WHEN s.mask & 32 <> 0 AND bit_count((s.mask & 31)::bit(6)) < 3
                            THEN terms[6]::text END) AS probe
                FROM generate_series(1, (1 << least(cardinality(terms), 6)) - 1) s(mask)
            ) x, (SELECT coalesce(sum(w), 0) AS later FROM unnest(weights[7:]) w) r
            UNION ALL
            -- Last, the records holding only words after the sixth.
            SELECT 0, -1, sum(weights[i]) FILTER (WHERE i > 6),
                   string_agg(terms[i]::text, ' | ' ORDER BY i) FILTER (WHERE i > 6),
                   string_agg(terms[i]::text, ' | ' ORDER BY i) FILTER (WHERE i <= 6),
                   string_agg(terms[i]::text, ' | ' ORDER BY i) FILTER (WHERE i > 6)
            FROM generate_series(1, cardinality(terms)) i
            HAVING cardinality(terms) > 6
        ) g
        GROUP BY g.weight;
    END;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
