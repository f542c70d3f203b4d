"""The memory side of the end-of-turn review: candidates as records, exact duplicates, and
the neighbours a candidate is compared with. The runtime (app/runtime/review.py) asks the
model; this module knows the records.

Neighbours are found as recall finds records (the agent's reader, with the scope the candidate
goes to as well as those it reads: its session, live or preview, its turn's own staged
writes), by the agent's search mode but whatever its `min_score`, and ranked for a restatement
rather than a
question: the text score is divided by 1 + the log of the record's distinct words, and meaning
weighs 0.7; the best 40 by that are ranked again with 0.3 of a BM25 of the candidate's words,
weighted by their rarity among those 40. On the LoCoMo dev observations
(a dialog turn as the candidate, the facts citing it as what it restates) that finds 0.951 of
the citing facts among the top 5 (bench/review.py; bench/README.md has how the weights were
chosen).
"""

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

import asyncpg
import numpy as np

from app.actions.harness import MemoryConfig, SearchConfig
from app.embeddings.base import Embedder
from app.errors import BadInput
from app.memory import search as memory_search
from app.memory import store
from app.memory.records import MAX_CONTENT_BYTES, MAX_SUMMARY_BYTES, MemoryRecord, Scope
from app.memory.search_store import Filters
from app.memory.service import LINE_BREAKS, MAX_LABEL_VALUE_BYTES, label_value_fits
from app.memory.visibility import Reader
from app.scope import listed
from app.text import storable

# Weight of the cosine in a neighbour's score; the rest: the text rank. 0.4 found 0.952 of the
# citing facts when search's text score was `ts_rank`, 0.946 with its IDF score (migrations
# 0017-0020); with that, 0.3 / 0.5 / 0.6 / 0.7 / 0.8 / 0.9 give 0.946 / 0.945 / 0.949 / 0.951 /
# 0.950 / 0.946 (thirtieth session).
REVIEW_WEIGHT = 0.7
# The review ranks this many by that score, then re-ranks them with POOL_WORD_WEIGHT of an Okapi
# BM25 of the candidate's words (unstemmed) weighted by how rare each is among them (not the
# whole table): LoCoMo dev recall@5 0.948 -> 0.951 (bench/README.md; 20 of them: 0.947, 30:
# 0.949; weight 0.25-0.32: 0.950-0.952).
REVIEW_POOL = 40
POOL_WORD_WEIGHT = 0.3
BM25_K1, BM25_B = 1.2, 0.75
_WORDS = re.compile(r"[\w']+")
_SPACES = re.compile(r"\s+")
_TRAILING = re.compile(r"[\W_]+$")


def normalise(summary: str) -> str:
    """Lower case, whitespace collapsed, trailing punctuation dropped (as memory_summary_key)."""
    return _TRAILING.sub("", _SPACES.sub(" ", summary.lower()).strip())


@dataclass(frozen=True)
class Candidate:
    """Something the conversation said worth keeping, shaped like add_memory's arguments."""

    summary: str
    kind: str
    content: str = ""
    labels: Mapping[str | int, str] = field(default_factory=dict)  # by label number
    scope: Scope | None = None
    shortened: bool = False  # the summary or content was cut to fit the limits

    def view(self, config: MemoryConfig) -> dict[str, Any]:
        view: dict[str, Any] = {"summary": self.summary, "kind": self.kind}
        if self.content:
            view["content"] = self.content
        if self.labels:
            names = {label.number: label.name for label in config.labels}
            view["labels"] = {names.get(int(n), str(n)): v for n, v in self.labels.items()}
        if self.scope:
            view["scope"] = self.scope
        if self.shortened:
            view["shortened"] = True
        return view


def _cut(text: str, limit: int) -> str:
    """At most `limit` UTF-8 bytes of `text`, cut at a word where one is near, marked with …."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    cut = encoded[: limit - len("…".encode())].decode(errors="ignore")
    space = cut.rfind(" ")
    if space > len(cut) * 0.8:
        cut = cut[:space]
    return cut.rstrip() + "…"


def candidate(value: Any, config: MemoryConfig, offers_scope: bool) -> Candidate:
    """A candidate from one element of the model's reply; ValueError says what is wrong.

    Text over a limit is shortened, never refused: a summary too long keeps its start, and
    the whole of it leads the content."""
    if not isinstance(value, dict):
        raise ValueError("each candidate must be an object with summary and kind")
    allowed = {"summary", "content", "kind", "labels", *(["scope"] if offers_scope else [])}
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(
            f"unknown field {unknown[0]!r}; a candidate has: {', '.join(sorted(allowed))}"
        )
    summary, content = value.get("summary"), value.get("content") or ""
    if not isinstance(summary, str) or not summary.strip():
        raise ValueError("summary must be a non-empty string: one line you can act on")
    if not isinstance(content, str):
        raise ValueError("content must be a string")
    kind = value.get("kind")
    if kind not in config.kinds:
        raise ValueError(f"kind must be one of {', '.join(config.kinds)}, got {kind!r}")
    summary = storable("".join(" " if c in LINE_BREAKS else c for c in summary)).strip()
    summary = _SPACES.sub(" ", summary)
    content = storable(content)
    shortened = False
    if len(summary.encode()) > MAX_SUMMARY_BYTES:
        content = summary + ("\n\n" + content if content else "")
        summary, shortened = _cut(summary, MAX_SUMMARY_BYTES), True
    if len(content.encode()) > MAX_CONTENT_BYTES:
        content, shortened = _cut(content, MAX_CONTENT_BYTES), True
    labels: dict[str | int, str] = {}
    raw_labels = value.get("labels") or {}
    if not isinstance(raw_labels, dict):
        raise ValueError("labels must be an object keyed by label name")
    for name, label_value in raw_labels.items():
        try:
            label = config.resolve_label(name)
        except BadInput as e:
            raise ValueError(e.message) from None
        if isinstance(label_value, bool) or not isinstance(label_value, str | int | float):
            raise ValueError(f"label {name!r} must be an exact string value")
        text = storable(str(label_value))
        if not label_value_fits(text):
            raise ValueError(f"label {name!r} must be 1 to {MAX_LABEL_VALUE_BYTES} bytes")
        labels[label.number] = text
    scope = value.get("scope")
    if scope is not None:
        scope = Scope.named(scope)
        if scope not in config.write:
            raise ValueError(f"scope must be one of {listed(config.write)}")
    return Candidate(summary, kind, content, labels, scope, shortened)


async def known(pool: asyncpg.Pool, reader: Reader, summaries: Sequence[str]) -> set[int]:
    """Positions of the summaries a visible record already says (normalised, word for word)."""
    if not summaries:
        return set()
    async with pool.acquire() as conn:
        return set(await store.summaries_known(conn, reader, summaries))


@dataclass(frozen=True)
class Neighbours:
    records: list[MemoryRecord]  # best first, each with its score
    # How like the candidate each record is (store.similarities: the larger of the cosine and
    # the share of the candidate's words it has), which the review's floor compares: the
    # score's text part is relative to the best match, so it says little on its own. Words
    # count as well as meaning because a correction ("lives in Rome" for "lives in Paris")
    # shares most words but may not reach the floor by the static embedder's cosine (0.34).
    similarity: dict[UUID, float]
    embed_tokens: int
    vector: np.ndarray | None = None  # the candidate's embedding (None in lexical mode)


def _words(text: str) -> list[str]:
    return [w for w in (m.strip("'_") for m in _WORDS.findall(text.lower())) if w]


def rerank(records: Sequence[MemoryRecord], text: str) -> list[MemoryRecord]:
    """`records` (ranked, each with its score) ranked again by (1 - POOL_WORD_WEIGHT) x their
    score over the best + POOL_WORD_WEIGHT x their BM25 for `text` over the best, the words'
    rarity (IDF) and the average length taken among `records`; the score is the new one."""
    if not records:
        return []
    docs = [_words(f"{r.summary} {r.content}") for r in records]
    counts = [Counter(d) for d in docs]
    found = Counter(w for c in counts for w in c)
    n, average = len(docs), max(sum(map(len, docs)) / len(docs), 1.0)
    query = set(_words(text))
    bm25 = []
    for doc, count in zip(docs, counts, strict=True):
        norm = BM25_K1 * (1 - BM25_B + BM25_B * len(doc) / average)
        bm25.append(
            sum(
                math.log(1 + (n - found[w] + 0.5) / (found[w] + 0.5))
                * count[w]
                * (BM25_K1 + 1)
                / (count[w] + norm)
                for w in query
                if w in count
            )
        )
    best_score = max((r.score or 0.0 for r in records), default=0.0) or 1.0
    best_bm25 = max(bm25) or 1.0
    scored = [
        replace(
            r,
            score=(1 - POOL_WORD_WEIGHT) * (r.score or 0.0) / best_score
            + POOL_WORD_WEIGHT * b / best_bm25,
        )
        for r, b in zip(records, bm25, strict=True)
    ]
    order = sorted(range(n), key=lambda i: (-(scored[i].score or 0.0), i))
    return [scored[i] for i in order]


async def neighbours(
    pool: asyncpg.Pool,
    embedder: Embedder,
    reader: Reader,
    config: SearchConfig,
    text: str,
    limit: int,
) -> Neighbours:
    """The `limit` records most like `text` that the reader sees, as the review shows them."""
    vector, tokens = None, 0
    if config.mode != "lexical":
        embedded = await embedder.embed([text])
        vector, tokens = embedded.vectors[0], embedded.tokens
    # Not the agent's min_score: that is what recall and search need of a record found by
    # meaning alone; a restatement is compared with the records most like it whatever their
    # cosine, and the review's floor decides whether the model is asked (M11).
    ranking = memory_search.make_ranking(
        config.mode,
        text,
        vector,
        None,
        max(limit, REVIEW_POOL),
        REVIEW_WEIGHT,
        by_length=True,
    )
    pool_records, _ = await memory_search.ranked(pool, reader, Filters(), ranking)
    records = rerank(pool_records, text)[:limit]
    similarity: dict[UUID, float] = {}
    if records:
        async with pool.acquire() as conn:
            similarity = await store.similarities(
                conn,
                reader.account_id,
                reader.action_id,
                [r.memory_id for r in records],
                text,
                vector,
            )
    return Neighbours(records, similarity, tokens, vector)


# From this similarity an earlier candidate of the same review is shown as one a candidate may
# restate. Higher than the floor for records (ENGRAM_MEMORY_REVIEW_FLOOR, 0.4), because one
# review's facts are mostly about the same people: of LoCoMo dev's 1,210 observation facts,
# each session's taken as one review's candidates (distinct facts), 54.9% have an earlier one
# at 0.4, 6.8% at 0.7, 2.8% at 0.8; twelve paraphrased pairs ("Bob is allergic to peanuts" /
# "Bob has a peanut allergy") score 0.736 to 1.0 (bench/README.md, thirtieth session).
RESTATES_FLOOR = 0.7


async def restated(
    pool: asyncpg.Pool, texts: Sequence[str], vectors: Sequence[np.ndarray | None]
) -> list[dict[int, float]]:
    """How like each candidate (`texts`, with their embeddings or None) each earlier candidate
    of the same review is, as `neighbours` measures a record (`store.similarities`): the
    larger of the cosine and the share of the candidate's stemmed words the earlier one has.
    Item i maps j < i to that similarity."""
    async with pool.acquire() as conn:
        words = await store.stemmed_words(conn, list(texts))
    alike: list[dict[int, float]] = []
    for i, (own, vector) in enumerate(zip(words, vectors, strict=True)):
        found: dict[int, float] = {}
        for j in range(i):
            share = len(own & words[j]) / max(len(own), 1)
            cosine = 0.0
            earlier = vectors[j]
            if vector is not None and earlier is not None:
                cosine = float(np.dot(vector, earlier))  # unit vectors (Embeddings)
            found[j] = max(share, cosine)
        alike.append(found)
    return alike
