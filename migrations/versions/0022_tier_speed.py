"""The query's word tiers: built in half the time, and each with a lighter GIN probe.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02

`word_tiers(terms, weights)` (migrations 0017 and 0019) returns the same tiers, built another
way and planned once per connection, and a fifth column, `probe`:

- Each subset of the six rarest words is one row of `generate_series` whose weight and words
  are read off its bits by fixed expressions, where 0019 grouped six rows per subset under
  three ordered aggregates.
- `plan_cache_mode = force_generic_plan`: PostgreSQL 18 caches a SQL function's plan, but
  `auto` planned this one anew at every call (a custom plan, which sees the number of subsets,
  always looked cheaper than the generic one).
- `probe`: what GIN is asked for a tier's records, the rarest three words of each of its
  subsets (`terms` come rarest first), where the search asked for all of them (`held`). The
  tier's `exact` is tested on the rows GIN finds, as before, so the same records come back;
  GIN no longer reads the posting lists of a subset's most common words, which cost most in
  the tiers that turn out empty.

Together, on bench/search_scale.py's data set (bench/README.md, seventeenth session): the
function 1.6 -> 0.85 ms a call for six words; the 200,000-record agent's hybrid search p95
27.7 -> 22.6 ms and lexical 17.8 -> 12.4, pages identical. A subset's weight is summed in the
words' order here, where 0019's sum had no set order; `most` may differ in the last bit,
which its padding (a relative 1e-12) was made for.
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

PROBE_WORDS = 3  # fewer read more rows to test (one: 4 x slower); more saved less (measured)


def _each(value: str, test: str = "<> 0", also: str = "") -> list[str]:
    """For each of the first six words, `value` (`{i}`: the word's ordinal) when its bit in
    the subset's mask passes `test` (and `also`, with `{before}`: the mask's bits below it),
    else NULL."""
    return [
        f"CASE WHEN s.mask & {1 << (i - 1)} {test}"
        + (" AND " + also.format(before=(1 << (i - 1)) - 1) if also else "")
        + f" THEN {value.format(i=i)} END"
        for i in range(1, 7)
    ]


def upgrade() -> None:
    word = "terms[{i}]::text"
    weight = " + ".join(f"coalesce({w}, 0)" for w in _each("weights[{i}]"))
    held = f"concat_ws(' & ', {', '.join(_each(word))})"
    others = f"concat_ws(' | ', {', '.join(_each(word, '= 0'))})"
    rarest = f"bit_count((s.mask & {{before}})::bit(6)) < {PROBE_WORDS}"
    probe = f"concat_ws(' & ', {', '.join(_each(word, also=rarest))})"
    op.execute(f"""
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
            -- A subset's words and weight, from the bits of its mask (a word past the end of
            -- `terms` is NULL, and is left out).
            SELECT x.mask, round(x.weight::numeric, 9) AS weight, x.weight + r.later AS most,
                   x.held, nullif(x.others, '') AS others, x.probe
            FROM (
                SELECT s.mask, {weight} AS weight, {held} AS held, {others} AS others,
                       {probe} AS probe
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
