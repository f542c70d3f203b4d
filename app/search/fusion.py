"""The one fusion of meaning and words that memory search and session history both rank by
(measured and explained in app/memory/search.py and bench/README.md), and the SQL parameter
collector both build their statements with."""

from typing import Any, Protocol

import numpy as np

from app.errors import BadInput

HYBRID_WEIGHT = 0.5  # weight of the cosine; the rest goes to the normalized text rank
# The longest query a search entry point takes (ENGRAM_MAX_SEARCH_QUERY_CHARS is the setting).
MAX_QUERY_CHARS = 4096


def check_query(query: str | None, max_chars: int = MAX_QUERY_CHARS) -> None:
    """BadInput naming the limit when a search query is longer than a search entry point takes."""
    if query is not None and len(query) > max_chars:
        raise BadInput(
            f"the search query is {len(query):,} characters; at most {max_chars:,} are searched "
            "(ENGRAM_MAX_SEARCH_QUERY_CHARS): search for the words that matter"
        )


class Params:
    """Collects query parameters; calling it with a value returns its `$n` placeholder."""

    def __init__(self, *values: Any) -> None:
        self.values: list[Any] = list(values)

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def fusion(mode: str, weight: float, min_score: float | None, p: Params) -> tuple[str, str]:
    """Score expression and the condition a scored row must meet to be found, over a CTE
    `scored` with columns `cosine` (NULL without a query vector) and `words` (the row's
    `ts_rank`, NULL when it shares no query word)."""
    if mode == "lexical":
        return "words", "words IS NOT NULL"
    by_meaning = "cosine IS NOT NULL" if min_score is None else f"cosine >= {p(min_score)}::float8"
    if mode == "vector":
        return "cosine", by_meaning
    w = p(weight) + "::float8"
    # Text rank divided by the best rank among the matches: 1 for the best match, 0 when no
    # word is shared; the cosine enters raw, so the same row scores the same in every plan.
    score = (
        f"{w} * coalesce(cosine, 0) + (1 - {w}) "
        "* coalesce(words / nullif(max(words) OVER (), 0), 0)"
    )
    return score, f"(words IS NOT NULL OR {by_meaning})"


class Embedded(Protocol):
    vectors: np.ndarray
    tokens: int


class Embeds(Protocol):
    """What a search needs of the deployment's embedder (app/embeddings/base.py's Embedder)."""

    name: str

    async def embed(self, texts: list[str]) -> Embedded: ...
