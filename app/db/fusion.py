"""The one fusion of meaning and words that memory search (app/memory/search.py) and session
history search (app/history/store.py) both rank by, and the words of the query a row holds,
which both weigh; bench/README.md measures it."""

from app.db.sql import Params

HYBRID_WEIGHT = 0.5  # weight of the cosine; the rest goes to the normalized text rank


def cosine_of(column: str, vector: str) -> str:
    """The cosine of a stored vector (`column`) to the query's (`vector`, a parameter), NULL
    for a stored vector without a direction (of zeros, or past what pgvector's float4 sums
    hold), whose cosine pgvector makes NaN: its row is then found by its words alone, as a row
    without a vector is, rather than ranked first by NaN, a score no answer can carry (one such
    record failed every search of its agent). No vector is stored so now (app/embeddings,
    app/transfer), but a release before may have stored one."""
    return f"nullif(1 - ({column} <=> {vector}), 'NaN')"


def held_lexemes(row: str) -> str:
    """The query's lexemes (the `lexemes` of a CTE `words`) that row `row`'s `tsv` holds, as a
    sorted array: the row's positions of them marked A and kept. `tsv` is to_tsvector's
    (migrations 0002, 0010), whose every lexeme has positions (one without would be dropped),
    all of weight D (another weight would only split a set). Functions on the row, not a
    sub-select per row (about a millisecond at 1,000 records, bench/README.md)."""
    return (
        f"tsvector_to_array(ts_filter(setweight({row}.tsv, 'A', (SELECT lexemes FROM words)),"
        " '{a}'))"
    )


def fusion(
    mode: str,
    weight: float,
    min_score: float | None,
    p: Params,
    best: str | None = None,
) -> tuple[str, str]:
    """Score expression and the condition a scored row must meet to be found, over a CTE
    `scored` with columns `cosine` (NULL without a query vector) and `words` (the row's
    text score, NULL when it shares no query word). `best`: the text score that normalizes
    the text rank, by default the best in `scored` (another bound of it, for a search that
    scores before it knows it; the same value read elsewhere, for one that knows it sooner)."""
    if mode == "lexical":
        return "words", "words IS NOT NULL"
    by_meaning = "cosine IS NOT NULL" if min_score is None else f"cosine >= {p(min_score)}::float8"
    if mode == "vector":
        return "cosine", by_meaning
    w = p(weight) + "::float8"
    # Text rank divided by the best rank among the matches: 1 for the best match, 0 when no
    # word is shared; the cosine enters raw, so the same row scores the same in every plan.
    # The best rank is a sub-select over `scored`, not a window: a window keeps every row
    # until its end (0.6 ms of a 5,000-record agent's 7 ms, bench/README.md).
    best = best or "(SELECT max(words) FROM scored)"
    score = f"{w} * coalesce(cosine, 0) + (1 - {w}) * coalesce(words / nullif({best}, 0), 0)"
    return score, f"(words IS NOT NULL OR {by_meaning})"
