"""The query's word tiers are built in half the time.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02

`word_tiers(terms, weights)` (migrations 0017 and 0019) returns the same tiers, built another
way, and is planned once per connection:

- Each subset of the six rarest words is one row of `generate_series` whose weight and words
  are read off its bits by fixed expressions, where 0019 grouped six rows per subset and sorted
  each subset's words three times (one sort per ordered aggregate: 189 small sorts).
- `plan_cache_mode = force_generic_plan`: PostgreSQL 18 caches a SQL function's plan, but
  `auto` planned this one anew at every call (a custom plan, which sees the number of subsets,
  always looked cheaper than the generic one).

Together: 1.6 -> 0.85 ms a call for six words, paid by every search the index plan ranks by
words (bench/README.md, seventeenth session). A subset's weight is summed in the words' order
here, where 0019's sum had no set order; `most` may differ in the last bit, which its padding
(a relative 1e-12) was made for.
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def _each(test: str, value: str) -> list[str]:
    """For each of the first six words, `value` (`{i}`: the word's ordinal) when its bit in
    the subset's mask passes `test`, else NULL."""
    return [
        f"CASE WHEN s.mask & {1 << (i - 1)} {test} THEN {value.format(i=i)} END"
        for i in range(1, 7)
    ]


def upgrade() -> None:
    weight = " + ".join(f"coalesce({word}, 0)" for word in _each("<> 0", "weights[{i}]"))
    held = f"concat_ws(' & ', {', '.join(_each('<> 0', 'terms[{i}]::text'))})"
    others = f"concat_ws(' | ', {', '.join(_each('= 0', 'terms[{i}]::text'))})"
    op.execute(f"""
    CREATE OR REPLACE FUNCTION word_tiers(terms tsquery[], weights float8[])
    RETURNS TABLE (tier bigint, most float8, held tsquery, exact tsquery)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET plan_cache_mode = force_generic_plan
    BEGIN ATOMIC
        -- Subsets of equal weight (words of equal weight) are one tier, read together.
        -- `most` is padded by a relative 1e-12: a record's score sums the same weights in
        -- another order, which can round to about an ulp per word above this sum.
        SELECT row_number() OVER (ORDER BY g.weight DESC), max(g.most) * (1 + 1e-12),
               string_agg('(' || g.held || ')', ' | ')::tsquery,
               string_agg('(' || g.held || ')' || coalesce(' & !(' || g.others || ')', ''), ' | ')
                   ::tsquery
        FROM (
            -- A subset's words and weight, from the bits of its mask (a word past the end of
            -- `terms` is NULL, and is left out).
            SELECT x.mask, round(x.weight::numeric, 9) AS weight, x.weight + r.later AS most,
                   x.held, nullif(x.others, '') AS others
            FROM (
                SELECT s.mask, {weight} AS weight, {held} AS held, {others} AS others
                FROM generate_series(1, (1 << least(cardinality(terms), 6)) - 1) s(mask)
            ) x, (SELECT coalesce(sum(w), 0) AS later FROM unnest(weights[7:]) w) r
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
