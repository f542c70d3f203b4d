"""Memory search: ranks an agent's records by meaning, words and recency, or lists them.

Spec: "Search combines meaning, keywords, and recency: records are found by the similarity of
their text to the query, and by the words they share with it, and newer records win ties."

Signals
- Meaning: cosine similarity of the record's embedding (`memory_text(summary, content)`) to the
  query's embedding, from the deployment's embedder.
- Words: PostgreSQL full text over the stored English `tsv`, matching records that share ANY
  stemmed, stop-worded word with the query (`any_words`, migration 0003), ranked by `ts_rank`.
  Requiring every word (`websearch_to_tsquery`) found 0.116 of LoCoMo's evidence in the top 10;
  any word with `ts_rank` 0.593, about as well as BM25 (0.617).
- Recency: a pure tie-breaker, `created DESC` then `memory_id DESC`, in every mode and plan.

Fusion (hybrid), chosen on the LoCoMo dev half (bench/locomo_quality.py, bench/README.md):
    score = 0.5 * cosine + 0.5 * ts_rank / (best ts_rank among the agent's matches)
A record sharing no word scores 0.5 * cosine. Linear fusion of the raw cosine with the text
rank scaled to the best match beat the best weighted reciprocal-rank fusion (static 0.627 vs
0.617 recall@10, minilm 0.676 vs 0.672), and its recall@10 is flat for weights 0.4 to 0.6 with
both `static` (0.628 to 0.625, against 0.593 words alone and 0.413 meaning alone) and `minilm`
(0.675 to 0.681, against 0.593 and 0.510), so one weight serves both. Unlike rank fusion it
needs no rank over every record, so both plans below score a record identically.
`min_score` is the least cosine a record needs to be found by meaning alone: in hybrid mode a
record sharing a word with the query is found whatever its cosine; in vector mode it is a
plain threshold; lexical mode ignores it.

Plans (measured by bench/search_scale.py on 1,230,000 records, every agent's rows scattered
through the table; figures in bench/README.md)
- `exact` when the agent's rows under the label and ID filters number at most
  EXACT_MAX_ROWS and it has no indexes of its own: read those rows by the (account, action)
  btree and score every one. Exact whatever the filters (HNSW under a selective filter
  returns too few rows), and the faster plan for an agent without its own indexes: at 1,000
  records hybrid p50 8.9 ms (10 through the shared index); at 5,000, 30 ms against 103 ms,
  where the shared HNSW index reads past hundreds of other agents' rows for each of this
  one's. Its cost is one heap read per record (the rows are scattered), so it grows with the
  agent (25,000 records: 500 ms).
- `index` above it: the top CANDIDATES of each signal from an index, then exact scores and
  fusion over the union. Meaning: HNSW with an iterative scan (`relaxed_order`, so a filter
  that hides most rows still yields enough of them); an agent of 10,000 records or more has
  an HNSW index of its own (app/memory/maintenance.py), which the planner picks by itself
  and which needs no filtering (recall of the exact top-10 at 200,000 records: 0.96-0.98 at
  EF_SEARCH against 0.92 through the shared index at 200; hybrid p50 9-10 ms). Words: GIN on
  (agent, tsv), the agent's own when it has one, for the query's rare words
  (`rare_words`: each in at most RARE_WORD_ROWS records of the table, so GIN's work is
  bounded), and records sharing a common word (`common_words`: in COMMON_WORD_SHARE of
  records or more) among the agent's newest CANDIDATES / COMMON_WORD_SHARE (800).
  Words between the two propose no candidates (in the measured data they would cost a scan
  of most of the agent) but count in every candidate's rank. An OR query over every word,
  served by GIN, took seconds at 200,000 records, where names occur in half the rows. Word
  frequencies come from `search_words`, refreshed by the same maintenance.
  The decision and the plan's settings cost one round trip (`search_store.prepare`): an
  index-only count that stops at EXACT_MAX_ROWS + 1 rows, skipped for an agent with its own
  indexes unless label or ID filters narrow the search.
- An agent known to have its own indexes (learnt from `prepare`, remembered for
  OWN_INDEXES_SECONDS) is searched without it, in one statement: every connection starts
  with the HNSW settings of an own index (app/db/pool.py), and the statement names the
  agent's key as constants, so the plan the statement caches after five runs (generic: no
  planning per search) can still use the agent's partial indexes. At 200,000 records that
  saved the round trip (1.3 ms) and planning (2.2 ms p50, 3.6 ms p95 for an agent reader).
  An agent with its own indexes that the process does not remember runs the same statement
  after `prepare`, which then sets only `hnsw.ef_search`, so it too reaches the cached plan.
- An agent `prepare` found small (at most EXACT_MAX_ROWS records, no label or ID filter, no own
  indexes) is remembered as such for SMALL_AGENT_SECONDS: its next searches (the search_memory
  calls after a turn's recall) go straight to the exact plan. That statement hides the agent's
  key from the planner (`search_store.OpaqueKey`), so its generic plan is kept without a
  setting sent first. 30 of the 1,000-record agents searched in turn (260 hybrid searches,
  three runs each): p50 / p95 10.5-11.1 / 12.5-13.3 ms through `prepare` -> 8.9-9.5 /
  10.8-11.8 ms; remembered but with the key visible (a custom plan at every search):
  11.2-12.0 / 13.1-15.0 ms.
"""

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import asyncpg
import numpy as np

from app.actions.harness import LABEL_NUMBERS, SEARCH_MODES, MemoryConfig, SearchConfig
from app.actions.service import load_action
from app.auth import resources
from app.auth.caller import Caller
from app.db import cursors
from app.db.pool import SESSION_SETTINGS
from app.embeddings.base import Embedder
from app.errors import BadInput, NotFound
from app.memory import search_store
from app.memory.maintenance import OWN_INDEXES_SECONDS
from app.memory.operator import LabelValue, MemoryView
from app.memory.records import MemoryRecord
from app.memory.search_store import Filters, Plan, Ranking
from app.memory.visibility import OperatorReader, Reader
from app.observability import metrics
from app.search.fusion import HYBRID_WEIGHT, MAX_QUERY_CHARS, check_query

# Measured (bench/README.md): at 5,000 records the exact plan took hybrid p50 30 ms, the shared
# index 103 ms; an agent of more records than this gets its own indexes (maintenance.py).
EXACT_MAX_ROWS = 10_000
CANDIDATES = 40  # per signal on the index plan, at least; 4 x the limit when that is more
# hnsw.ef_search on an agent's own index, measured at 200,000 records over 300 questions
# (bench/README.md): recall of the exact top-10 (top 10 of 40 candidates) 0.94 at 40, 0.97 at
# 60, 0.98 at 80, 0.99 at 100 (ef_construction 256; with 128: 0.92, 0.95, 0.97, 0.98), the
# HNSW scan p95 about 1 ms longer for each 20. The index shared by all agents is read through
# the agent's filter: 0.92 at 200 (200,000 records), so larger.
EF_SEARCH = int(SESSION_SETTINGS["hnsw.ef_search"])  # 60: every connection's default
EF_SEARCH_SHARED = 200
MAX_EF_SEARCH = 1000  # pgvector refuses a larger hnsw.ef_search; the iterative scan goes on
RARE_WORD_ROWS = 2000  # index plan: words in at most this many records are found by GIN
RARE_WORD_READS = 400  # index plan: the most records sharing a rare word ranked per search
COMMON_WORD_SHARE = 0.05  # index plan: words in this share of records are read newest first
# Agents known to have their own indexes ((pool, account, action) -> until when, by
# time.monotonic()), learnt from `prepare`: for OWN_INDEXES_SECONDS their searches skip it (1.3
# ms at 200,000 records) and are one statement whose cached plan uses the agent's indexes. The
# pool is part of the key, as a process may serve several databases (tests do). Maintenance
# drops an unlisted agent's indexes only maintenance.LINGER_SECONDS after unlisting it, so a
# remembered agent is searched through them still. New embedding dimensions drop them at once,
# which can leave it for the rest of that time on the shared indexes with an own index's
# settings: the same visibility, fewer of the exact top-10 found.
_OWN_INDEXES: dict[tuple[int, UUID, UUID], float] = {}
# Agents of at most EXACT_MAX_ROWS records without their own indexes, learnt from `prepare`'s
# count (without label or ID filters, which only narrow): for SMALL_AGENT_SECONDS their
# searches take the exact plan without asking (1,000 records: `prepare` took 1.2 / 1.7 ms p50 /
# p95). An agent that grows meanwhile is searched exactly a little longer: slower, as exact.
_SMALL_AGENTS: dict[tuple[int, UUID, UUID], float] = {}
SMALL_AGENT_SECONDS = 60.0
# Each memory keeps at most this many agents, the least lately learnt going first: a process
# that meets millions of agents does not keep them all.
MAX_REMEMBERED = 10_000


def _remember(
    known: dict[tuple[int, UUID, UUID], float], key: tuple[int, UUID, UUID], seconds: float
) -> None:
    known.pop(key, None)  # re-inserted last: dicts keep insertion order
    if len(known) >= MAX_REMEMBERED:
        del known[next(iter(known))]
    known[key] = time.monotonic() + seconds


MAX_PAGE = 1000  # the most records one search returns (`first`, `limit`)
# A page is read with one more record, which tells whether another page follows.
MAX_LIMIT = MAX_PAGE + 1
MAX_IDS = 1000
# A ranked search pages at most this deep: each page's index plan reads candidates for every
# record before it, so deeper pages cost more (a listing without a query pages without end).
MAX_DEPTH = 10_000


@dataclass(frozen=True)
class SearchResult:
    records: list[MemoryRecord]  # ranked by `score` (with a query) or newest first (without)
    next_cursor: str | None = None  # query-less listing: pass as `after` for the next page
    embed_tokens: int = 0  # usage of the query's embedding, recorded as purpose `embed`
    plan: Plan | None = field(default=None, compare=False)  # which plan ranked (benchmarks)
    # Each record's cursor: passed as `after` (with the same query and filters), the records
    # after it. A listing's is its (created, memory_id); a ranked search's its (score, created,
    # memory_id) and how many records came before (the index plan reads that many more
    # candidates). GraphQL's searchMemories pages with them; the agent's tool, by next_cursor.
    cursors: list[str] = field(default_factory=list, compare=False)


async def search(
    pool: asyncpg.Pool,
    embedder: Embedder,
    reader: Reader,
    config: SearchConfig,
    *,
    query: str | None,
    kind: str | None = None,
    labels: Mapping[int, str] | None = None,
    ids: Sequence[UUID] | None = None,
    limit: int | None = None,
    after: str | None = None,
    mode: str | None = None,
) -> SearchResult:
    """With a query, the best `limit` records by `mode`; without one, a page newest first.

    `labels` are label numbers (the caller resolves names with MemoryConfig.label).
    """
    mode = mode or config.mode
    if mode not in SEARCH_MODES:
        raise BadInput(f"search mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
    limit = config.max_results if limit is None else limit
    if isinstance(limit, bool) or not 0 <= limit <= MAX_LIMIT:
        raise BadInput(f"limit must be from 0 to {MAX_LIMIT}, got {limit!r}")
    if ids is not None and len(ids) > MAX_IDS:
        raise BadInput(
            f"ids names {len(ids)} records; at most {MAX_IDS} are read at once: split the IDs "
            "over several searches"
        )
    filters = Filters(kind=kind, labels=_labels(labels), ids=list(ids) if ids is not None else None)
    query = query.strip() if query is not None else None

    if not query:
        keyset = _decode(after)
        if limit == 0:
            return SearchResult([])
        async with pool.acquire() as conn:
            rows = await search_store.newest(conn, reader, filters, after=keyset, limit=limit + 1)
        more = len(rows) > limit
        page = rows[:limit]
        cursors = [_encode(r) for r in page]
        return SearchResult(page, cursors[-1] if more else None, cursors=cursors)

    position = _decode_ranked(after)
    if limit == 0:
        return SearchResult([])
    vector, tokens = None, 0
    with metrics.current().search(mode):
        if mode != "lexical":
            # Embedded before taking a connection: no transaction waits on the model.
            embedded = await embedder.embed([query])
            vector, tokens = embedded.vectors[0], embedded.tokens
        ranking = make_ranking(
            mode,
            query,
            vector,
            config.min_score,
            limit,
            after=position.keyset if position else None,
            depth=position.depth if position else 0,
        )
        records, plan = await ranked(pool, reader, filters, ranking)
    depth = position.depth if position else 0
    cursors = [_encode_ranked(r, depth + i + 1) for i, r in enumerate(records)]
    return SearchResult(records, None, tokens, plan, cursors)


def make_ranking(
    mode: str,
    query: str,
    vector: np.ndarray | None,
    min_score: float | None,
    limit: int,
    weight: float = HYBRID_WEIGHT,
    rank_normalization: int = 0,
    *,
    after: tuple[float, datetime, UUID] | None = None,
    depth: int = 0,
) -> Ranking:
    """`after` and `depth`: a later page, after that record with `depth` records before it
    (the index plan proposes enough candidates for them and this page)."""
    reach = depth + limit
    return Ranking(
        mode=mode,  # type: ignore[arg-type]
        text=query if mode != "vector" else None,
        vector=vector if mode != "lexical" else None,
        min_score=min_score,
        limit=limit,
        weight=weight,
        candidates=max(CANDIDATES, 4 * reach),
        ef_search=min(MAX_EF_SEARCH, max(EF_SEARCH, 4 * reach)),
        ef_search_shared=min(MAX_EF_SEARCH, max(EF_SEARCH_SHARED, 4 * reach)),
        rare_rows=RARE_WORD_ROWS,
        rare_reads=max(RARE_WORD_READS, 10 * reach),
        common_share=COMMON_WORD_SHARE,
        rank_normalization=rank_normalization,
        after=after,
    )


async def ranked(
    pool: asyncpg.Pool, reader: Reader, filters: Filters, ranking: Ranking, plan: Plan | None = None
) -> tuple[list[MemoryRecord], Plan]:
    """Ranks by the plan the filtered row count calls for (or by `plan`, for benchmarks)."""
    key = (id(pool), reader.account_id, reader.action_id)
    now = time.monotonic()
    own = _OWN_INDEXES.get(key, 0.0) > now
    # The connection's HNSW settings serve (or none are needed: no vector, no HNSW scan).
    defaults = ranking.vector is None or ranking.ef_search == EF_SEARCH
    # No transaction: the plan's settings last until the pool resets the connection.
    async with pool.acquire() as conn:
        if plan is None and filters.ids is not None and len(filters.ids) <= EXACT_MAX_ROWS:
            plan = "exact"
        if plan is None and _SMALL_AGENTS.get(key, 0.0) > now:
            plan = "exact"
        if plan is None and own and not filters.narrows and defaults:
            # Nothing to count, and the connection's HNSW settings are the search's.
            found = await search_store.ranked_index(conn, reader, filters, ranking, True)
            return found, "index"
        if plan != "exact":
            count = EXACT_MAX_ROWS + 1 if plan is None else None
            prepared = await search_store.prepare(conn, reader, filters, ranking, count)
            if prepared.own:
                _remember(_OWN_INDEXES, key, OWN_INDEXES_SECONDS)
            else:
                _OWN_INDEXES.pop(key, None)
            if plan is None:
                small = prepared.rows is not None and prepared.rows <= EXACT_MAX_ROWS
                plan = "exact" if small else "index"
                if small and not prepared.own and not filters.narrows:
                    _remember(_SMALL_AGENTS, key, SMALL_AGENT_SECONDS)
            if prepared.own or (prepared.rows is not None and prepared.rows > EXACT_MAX_ROWS):
                _SMALL_AGENTS.pop(key, None)  # learnt otherwise (a plan forced, or filters)
            if plan == "index":
                found = await search_store.ranked_index(
                    conn, reader, filters, ranking, prepared.own
                )
                return found, plan
        return await search_store.ranked_exact(conn, reader, filters, ranking), plan


async def search_as_operator(
    pool: asyncpg.Pool,
    embedder: Embedder,
    caller: Caller,
    action_id: UUID,
    *,
    query: str | None,
    mode: str | None = None,
    kind: str | None = None,
    labels: Sequence[LabelValue] = (),
    ids: Sequence[UUID] | None = None,
    limit: int,
    after: str | None = None,
    max_query_chars: int = MAX_QUERY_CHARS,
) -> tuple[list[MemoryView], list[str]]:
    """An operator's search of an agent's records (every session, live and preview), with the
    agent's search settings. A ranked search needs SELECT on the memory search index and
    documents; without a query it is a listing, and with `ids` a read, needing what those do.
    Returns the records with their cursors (`after` for the records after each)."""
    ranked_search = query is not None and bool(query.strip())
    if ranked_search:
        caller.require(*resources.SEARCH_MEMORY)
    if not ranked_search or ids is not None:
        caller.require(*resources.READ_MEMORY)
    check_query(query, max_query_chars)
    async with pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, action_id)
    if action is None:
        raise NotFound(f"action {action_id} not found")
    memory = action.harness.memory
    result = await search(
        pool,
        embedder,
        OperatorReader(caller.account_id, action_id),
        memory.search,
        query=query,
        kind=kind,
        labels=label_numbers(memory, labels),
        ids=ids,
        limit=limit,
        after=after,
        mode=mode,
    )
    names = {label.number: label.name for label in memory.labels}
    return [MemoryView(r, names) for r in result.records], result.cursors


def label_numbers(config: MemoryConfig, labels: Sequence[LabelValue]) -> dict[int, str]:
    """Label filters by number: names resolve through the agent's declarations."""
    numbers: dict[int, str] = {}
    for label in labels:
        if label.name is not None:
            declared = config.label(label.name)
            if declared is None:
                known = ", ".join(f"{d.name} ({d.number})" for d in config.labels) or "none"
                raise BadInput(f"the agent declares no label {label.name!r}; its labels: {known}")
            if label.number is not None and label.number != declared.number:
                raise BadInput(
                    f"label {label.name} has number {declared.number}, not {label.number}"
                )
            number = declared.number
        elif label.number is not None:
            number = label.number
        else:
            raise BadInput("each label filter needs the label's name or number, and a value")
        if number not in LABEL_NUMBERS:
            raise BadInput(f"label numbers are from 5 to 18, got {number}")
        if number in numbers and numbers[number] != label.value:
            raise BadInput(f"label {number} is given twice with different values")
        numbers[number] = label.value
    return numbers


def _labels(labels: Mapping[int, str] | None) -> dict[int, str] | None:
    if not labels:
        return None
    for number, value in labels.items():
        if isinstance(number, bool) or not isinstance(number, int) or not isinstance(value, str):
            raise BadInput(
                f"labels filter by number and exact string value, got {number!r}: {value!r}"
            )
    return dict(labels)


LISTING = cursors.Keyset(
    cursors.INSTANT_TEXT,
    cursors.ID_TEXT,
    error="`after` is not a cursor a search issued: pass the previous page's next cursor",
)
RANKED = cursors.Keyset(
    cursors.constant("ranked"),
    cursors.SCORE,
    cursors.INSTANT_TEXT,
    cursors.ID_TEXT,
    cursors.COUNT,
    error="`after` is not a cursor a search with this query issued: pass the cursor of the "
    "last record of the previous page, with the same query",
)


def _encode(last: MemoryRecord) -> str:
    return LISTING.encode(last.created, last.memory_id)


def _decode(after: str | None) -> tuple[datetime, UUID] | None:
    return LISTING.decode(after)  # type: ignore[return-value]


@dataclass(frozen=True)
class _Position:
    keyset: tuple[float, datetime, UUID]  # the last record of the page before
    depth: int  # how many records the pages before held


def _encode_ranked(last: MemoryRecord, depth: int) -> str:
    score = last.score if last.score is not None else 0.0
    return RANKED.encode("ranked", score, last.created, last.memory_id, depth)


def _decode_ranked(after: str | None) -> _Position | None:
    values = RANKED.decode(after)
    if values is None:
        return None
    _, score, created, memory_id, depth = values
    position = _Position((score, created, memory_id), depth)
    if position.depth >= MAX_DEPTH:
        raise BadInput(
            f"a ranked search pages through its best {MAX_DEPTH:,} records; narrow the query or "
            "filter by kind or labels to reach others"
        )
    return position
