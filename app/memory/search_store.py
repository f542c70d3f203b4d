"""SQL for memory search: ranking by meaning and words, and the query-less listing.

Two plans rank the same way (`app.memory.search` says when each is used, and why):

- `exact`: reads every row the reader sees under the filters once, scores each (cosine to the
  query vector, `ts_rank` when it matches any query word) and fuses them. No index decides
  what is found, so it is exact for any filter, and fastest while the filtered set is small.
- `index`: takes the top candidates of each signal from its index (HNSW with an iterative
  scan for meaning, GIN for words), then scores the union of both lists exactly and fuses
  them. Fast for an agent of any size; a record outside both candidate lists is not found.

Both end in the same fusion (`_FUSED`), so a record scores the same whichever plan found it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal
from uuid import UUID

import asyncpg
import numpy as np

from app.memory.records import MemoryRecord
from app.memory.store import RECORD_COLUMNS, record
from app.memory.visibility import Params, Reader, visible

Mode = Literal["hybrid", "lexical", "vector"]
Plan = Literal["exact", "index"]

_COLUMNS = ", ".join(f"m.{c}" for c in RECORD_COLUMNS)


@dataclass(frozen=True)
class Filters:
    kind: str | None = None
    labels: Mapping[int, str] | None = None  # label number -> exact value
    ids: Sequence[UUID] | None = None


@dataclass(frozen=True)
class Ranking:
    """How to rank: the query (its text and, for meaning, its vector) and the fusion."""

    mode: Mode
    text: str | None  # the query; None for vector mode (words are not used)
    vector: np.ndarray | None  # the query's embedding; None for lexical mode
    min_score: float | None  # least cosine for a record found by meaning alone
    limit: int
    weight: float  # hybrid: weight of cosine; 1 - weight goes to the normalized text rank
    candidates: int  # index plan: how many records each signal proposes
    ef_search: int  # index plan: HNSW candidate list size
    rare_rows: float  # index plan: words in at most this many records are looked up in GIN
    common_share: float  # index plan: words in this share of records are read newest first


def _filters(f: Filters, p: Params, m: str = "m") -> str:
    where = ""
    if f.kind is not None:
        where += f" AND {m}.kind = {p(f.kind)}"
    if f.labels:
        # jsonb containment, served by the GIN (jsonb_path_ops) index on labels.
        where += f" AND {m}.labels @> {p({str(n): v for n, v in f.labels.items()})}::jsonb"
    if f.ids is not None:
        where += f" AND {m}.memory_id = any({p(list(f.ids))}::uuid[])"
    return where


async def count_up_to(
    conn: asyncpg.Connection, reader: Reader, filters: Filters, limit: int
) -> int:
    """How many of the agent's rows match the label and ID filters, counting no further than
    `limit`: cheap (an index-only scan of at most `limit` entries) however large the agent."""
    p = Params(reader.account_id, reader.action_id)
    where = "m.account_id = $1 AND m.action_id = $2" + _filters(
        Filters(labels=filters.labels, ids=filters.ids), p
    )
    return await conn.fetchval(
        f"SELECT count(*) FROM (SELECT 1 FROM agent_memories m WHERE {where} LIMIT {p(limit)}) s",
        *p.values,
    )


def _signals(r: Ranking, p: Params, m: str = "m") -> str:
    """Select-list: the cosine to the query vector and the text rank (NULL: no word shared)."""
    cosine = f"1 - ({m}.embedding <=> {p(r.vector)})" if r.vector is not None else "NULL::float8"
    if r.text is not None:
        words = p(r.text)
        rank = (
            f"CASE WHEN {m}.tsv @@ any_words({words}) "
            f"THEN ts_rank({m}.tsv, any_words({words}))::float8 END"
        )
    else:
        rank = "NULL::float8"
    return f"{m}.memory_id, {m}.created, {cosine} AS cosine, {rank} AS words"


def _fused(r: Ranking, p: Params) -> tuple[str, str]:
    """Score expression and the condition a scored row must meet to be found, over `scored`."""
    if r.mode == "lexical":
        return "words", "words IS NOT NULL"
    if r.min_score is None:
        by_meaning = "cosine IS NOT NULL"
    else:
        by_meaning = f"cosine >= {p(r.min_score)}::float8"
    if r.mode == "vector":
        return "cosine", by_meaning
    weight = p(r.weight) + "::float8"
    # Text rank divided by the best rank among the agent's matches: 1 for the best match, 0 when
    # no word is shared; the cosine enters raw, so the same record scores the same in every plan.
    score = (
        f"{weight} * coalesce(cosine, 0) + (1 - {weight}) "
        "* coalesce(words / nullif(max(words) OVER (), 0), 0)"
    )
    return score, f"(words IS NOT NULL OR {by_meaning})"


_FUSED = """
    , fused AS (
        SELECT memory_id, created, {score} AS score FROM scored WHERE {found}
    ), top AS (
        SELECT memory_id, created, score FROM fused
        ORDER BY score DESC, created DESC, memory_id DESC LIMIT {limit}
    )
    SELECT {columns}, top.score FROM top
    JOIN agent_memories m ON m.account_id = $1 AND m.action_id = $2 AND m.memory_id = top.memory_id
    ORDER BY top.score DESC, top.created DESC, top.memory_id DESC
"""


def _finish(r: Ranking, p: Params) -> str:
    score, found = _fused(r, p)
    return _FUSED.format(score=score, found=found, limit=p(r.limit), columns=_COLUMNS)


async def ranked_exact(
    conn: asyncpg.Connection, reader: Reader, filters: Filters, r: Ranking
) -> list[MemoryRecord]:
    p = Params(reader.account_id, reader.action_id)
    where = visible(reader, p, "m") + _filters(filters, p)
    # Words are tested in the select list, not the WHERE clause, so the planner reads the agent's
    # rows by its btree instead of the GIN index over every agent (slow for an OR query).
    sql = f"""
    WITH scored AS MATERIALIZED (
        SELECT {_signals(r, p)} FROM agent_memories m WHERE {where}
    ){_finish(r, p)}"""
    return [_scored(row) for row in await conn.fetch(sql, *p.values)]


async def ranked_index(
    conn: asyncpg.Connection, reader: Reader, filters: Filters, r: Ranking
) -> list[MemoryRecord]:
    """Candidates from the indexes, then exact scores. Meaning: HNSW, iterative scan. Words:
    records sharing a rare word, by GIN (bounded: each rare word is in few records), best
    `ts_rank` first; and the newest records sharing a common word, by the (agent, created)
    btree (bounded too: a common word is met within a few rows). Words between the two find
    no candidates of their own; they still count in the rank of every candidate."""
    # force_custom_plan: a cached generic plan cannot see the tsquery and took a GIN-less walk
    # of all 200,000 rows (0.9 s) where the plan for the actual words takes 1 ms.
    settings = await conn.fetchrow(
        "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),"
        " set_config('hnsw.ef_search', $1, true),"
        " set_config('plan_cache_mode', 'force_custom_plan', true),"
        " CASE WHEN $2::text IS NOT NULL THEN rare_words($2, $3)::text END AS rare,"
        " CASE WHEN $2::text IS NOT NULL THEN common_words($2, $4)::text END AS common",
        str(r.ef_search),
        r.text,
        r.rare_rows,
        r.common_share,
    )
    p = Params(reader.account_id, reader.action_id)
    lists: list[str] = []

    def where() -> str:
        return visible(reader, p, "m") + _filters(filters, p)

    if r.vector is not None:
        lists.append(
            f"(SELECT m.memory_id FROM agent_memories m WHERE {where()} "
            f"ORDER BY m.embedding <=> {p(r.vector)} LIMIT {p(r.candidates)})"
        )
    if r.text is not None:
        if settings["rare"]:
            words = p(r.text)
            lists.append(
                f"(SELECT m.memory_id FROM agent_memories m WHERE {where()} "
                f"AND m.tsv @@ {p(settings['rare'])}::tsquery "
                f"ORDER BY ts_rank(m.tsv, any_words({words})) DESC, m.created DESC "
                f"LIMIT {p(r.candidates)})"
            )
        if settings["common"]:
            lists.append(
                f"(SELECT m.memory_id FROM agent_memories m WHERE {where()} "
                f"AND m.tsv @@ {p(settings['common'])}::tsquery "
                f"ORDER BY m.created DESC, m.memory_id DESC LIMIT {p(r.candidates)})"
            )
    if not lists:
        return []  # lexical, and no rare or common word: nothing proposes a candidate
    sql = f"""
    WITH candidates AS ({" UNION ".join(lists)}),
    scored AS (
        SELECT {_signals(r, p)} FROM candidates c
        -- LIMIT 1 keeps this a primary-key lookup per candidate whatever the planner estimates;
        -- as a plain join it may choose to read the whole agent to meet a hundred candidates.
        CROSS JOIN LATERAL (
            SELECT * FROM agent_memories m
            WHERE m.account_id = $1 AND m.action_id = $2 AND m.memory_id = c.memory_id LIMIT 1
        ) m
    ){_finish(r, p)}"""
    return [_scored(row) for row in await conn.fetch(sql, *p.values)]


async def newest(
    conn: asyncpg.Connection,
    reader: Reader,
    filters: Filters,
    *,
    after: tuple[datetime, UUID] | None,
    limit: int,
) -> list[MemoryRecord]:
    """The records the reader sees under the filters, newest first, after a keyset."""
    p = Params()
    where = visible(reader, p, "m") + _filters(filters, p)
    if after is not None:
        where += (
            f" AND (m.created, m.memory_id) < ({p(after[0])}::timestamptz, {p(after[1])}::uuid)"
        )
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM agent_memories m WHERE {where} "
        f"ORDER BY m.created DESC, m.memory_id DESC LIMIT {p(limit)}",
        *p.values,
    )
    return [record(row) for row in rows]


def _scored(row: asyncpg.Record) -> MemoryRecord:
    return replace(record(row), score=row["score"])
