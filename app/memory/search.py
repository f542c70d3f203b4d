"""Memory search: ranks an agent's records by meaning, words and recency, or lists them.

Spec: "Search combines meaning, keywords, and recency: records are found by the similarity of
their text to the query, and by the words they share with it, and newer records win ties."

Signals
- Meaning: cosine similarity of the record's embedding (`memory_text(summary, content)`) to the
  query's embedding, from the deployment's embedder.
- Words: PostgreSQL full text over the stored English `tsv`, matching records that share ANY
  stemmed, stop-worded word with the query (the OR of its words, as `any_words`, migration
  0003, builds it, here from `query_words`' terms; requiring every word found far less of
  LoCoMo's evidence, bench/README.md), scored by the sum of the weights of the query words a
  record holds: BM25's IDF of each, so a rare word counts for more than a common one (it found
  more of LoCoMo's evidence than `ts_rank`, which weighs every word alike). The counts never
  include a record of another tenant, agent or session, a preview record for a live reader, or
  (after the next maintenance round) a deleted one: whose records would otherwise shape the
  ranking, and whose words the scores would tell. A listed agent's are counted by the
  maintenance over its live records (`agent_words`, migration 0020): all of them weigh an
  operator's search (every session), those of agent scope a live reader's of agent scope, with
  its own session's (kept by the maintenance for a session of `maintenance.SESSION_WORDS_MIN` or
  more, `session_words`, or else counted as it searches, by the session index); a live reader
  of session scope alone is weighed by its session's kept counts; a preview reader of agent
  scope weighs every word the same. Any other reader of session scope alone, and any search of
  another agent, counts them itself, over the records it ranks (those the reader sees under
  the filters).
  So a record's score can move without a write to it (a write to another record the reader
  sees, or a recount); a ranked search's later page, read after such a change, may skip or
  repeat a record.
- Recency: a pure tie-breaker, `created DESC` then `memory_id DESC`, in every mode and plan.

Fusion (hybrid), chosen on the LoCoMo dev half (bench/locomo_quality.py, bench/README.md):
    score = 0.5 * cosine + 0.5 * text score / (best text score among the agent's matches)
A record sharing no word scores 0.5 * cosine. It beat weighted reciprocal-rank fusion with
both embedders, is flat for weights 0.4 to 0.6, and needs no rank over every record, so both
plans below score a record identically (but for the cases `search_store.ranked_index` names).
`min_score` is the least cosine a record needs to be found by meaning alone: in hybrid mode a
record sharing a word with the query is found whatever its cosine; in vector mode it is a
plain threshold; lexical mode ignores it.

Plans (measured by bench/search_scale.py; figures in bench/README.md)
- `exact` when the agent has no indexes of its own, whatever its size (an index plan without
  them was slower at every size measured: migration 0034), and for an agent with them when
  label or ID filters match at most EXACT_MAX_ROWS rows, or the reader's session holds that
  few, for a reader of session scope alone, or, for a turn, the rows of the scopes it reads,
  agent scope and its session's, are at most SCOPED_MAX_ROWS: read those rows and score every
  one. Exact whatever the filters. Each of
  a turn's scopes is a range of a covering index that holds what the scan reads (migration
  0024; an operator's, the agent's range), read index-only, so an agent's rows are read where
  they lie together, however scattered they are in the table; the few records too large for it
  are read from the table; label and ID filters find their rows by their own indexes. Its cost
  grows with the rows: 1-5 µs a record by the host, most of it the cosine and the text rank
  (bench/README.md).
- `index` otherwise: the top CANDIDATES of each signal from the agent's own indexes
  (app/memory/maintenance.py gives them to every agent of 2,000 records or more, built in the
  background soon after a write takes it there, up to `agent_index_max_agents` agents; no index
  is shared by all agents, migrations 0015 and 0034), then exact scores and fusion over the
  union. Meaning: its HNSW index, iterative scan (`relaxed_order`, so a filter that hides most
  rows still yields enough of them). Words: the exact text ranking, read from its GIN index on
  `tsv` in tiers (`word_tiers`): first the records holding the best-weighted subset of the
  query's six rarest words, best cosine first, then the next subset, until CANDIDATES are read
  (an agent whose words are not counted yet first counts its records and, by GIN, each query
  word's); GIN is asked for a subset's rarest three words (fewer where few of the
  agent's records hold them), the others tested on the rows it finds. The walk ends sooner
  where that changes no record of the page: in hybrid mode once no later subset's records can
  reach it nor raise the best text score (taking the vector list's last cosine as the most any
  other record has, which HNSW, being approximate, may rarely miss), in lexical mode once the
  page is read (a query of at most six words); in lexical mode a subset of common words is
  read newest first by the (agent, created) btree rather than all its holders by GIN, as is a
  long query's last subset (the records holding only words after the sixth: most of the agent
  for a recall's query), which hybrid mode reads best cosine first by HNSW when that should
  find its best records sooner (`search_store._nearest_first`), as it does the first subset
  that holds records when it should hold a thousand or more of an agent of 100,000 or more
  (a common name and a common word).
  With both lists the index plan found 0.98-1.00 of the exact hybrid top-10 at 25,000 and
  200,000 records in search_scale.py's samples, and 0.964-0.971 over two samples of 150
  questions at 200,000 records (bench/README.md, twenty-third session).
- The choice costs no round trip of its own: the exact plan's statement first looks the agent
  up in `agent_indexes`; with own indexes it reads nothing, returns none and the index plan
  runs. An agent it found listed is remembered (`_LISTED`), and its next search runs the index
  plan's statement alone, which looks the agent up itself (and a turn's scopes' counts, below)
  and reads nothing if that plan no longer holds; the exact plan's statement then decides.
  Every index statement checks that the agent is still listed: one unlisted since the
  gate read it (a round's, a moment before; its indexes may be gone, and the word tiers
  without them would read its rows once each) is ranked exactly.
  Under label or ID filters, or for a reader of one session alone, of an agent with own
  indexes, it first counts the rows matching them (or the session's, up to EXACT_MAX_ROWS + 1,
  whatever the reader sees of them, so a bounded number), and ranks exactly when they are few.
  A turn reading agent scope, of an agent with own indexes whose upkeep counted at most
  SCOPED_MAX_ROWS live records in its scopes (agent scope, and its session's when they are
  kept), costs one statement more: it does the same with the rows of its scopes, each counted
  by its partial index, so that an agent that writes mostly to other sessions is not ranked
  through its whole indexes for a turn that sees few of its records. Except under label or ID
  filters the statement's text is the same for every agent (`search_store.OpaqueKey`), so it
  runs on a cached generic plan (as every search of the service does: a reader with no turn,
  whose staged writes are NULL, would be planned anew at each search, bench/README.md). The
  index plan names a large agent's key as constants (`search_store.AgentKey`), so the plan it
  caches still uses the agent's partial indexes. The index plan's `hnsw.iterative_scan` is
  the connections' default (app/db/pool.py); its `hnsw.ef_search` (HYBRID_EF_SEARCH for a
  hybrid page, larger for a deeper page, or in vector mode for an agent listed with
  LARGE_AGENT_RECORDS or more) is set by the statement itself, for its own transaction.
"""

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import numpy as np

from app.actions.harness import LABEL_NUMBERS, SEARCH_MODES, MemoryConfig, SearchConfig
from app.actions.service import ActionVersion, require_action
from app.auth import resources
from app.auth.caller import Caller
from app.auth.resources import Grant
from app.db import cursors
from app.db.cursors import MAX_WEIGHTS
from app.db.fusion import HYBRID_WEIGHT
from app.db.pool import SESSION_SETTINGS
from app.embeddings.base import Embedder
from app.errors import BadInput
from app.memory import search_store
from app.memory.operator import LabelValue, MemoryView, label_names_of
from app.memory.records import MemoryRecord
from app.memory.search_store import Filters, Plan, Ranking, Scored
from app.memory.service import check_label_filter
from app.memory.visibility import AgentReader, OperatorReader, Reader
from app.observability import metrics
from app.text import MAX_QUERY_CHARS, check_query

# An agent without its own indexes (under `agent_index_min_records`, not built yet, or beyond
# `agent_index_max_agents`) is ranked exactly whatever its size: 1-5 µs a record, 11 ms p50 at
# 5,000 records, 48 at 25,000 (its index plan, words by a GIN index over every agent, took
# 84; migration 0034). Label or ID filters, or a reader of one session alone, matching at most
# this many rows of an agent with them are ranked exactly too (figures in bench/README.md).
EXACT_MAX_ROWS = 10_000
# A turn of an agent with own indexes is ranked exactly over the rows of the scopes it reads
# (agent scope and its session) when they are at most this many: the default of
# `agent_index_min_records`, under which agents are ranked exactly anyway; at 1,900 rows the
# exact plan was still the faster at p95 (bench/README.md, fifteenth session).
SCOPED_MAX_ROWS = 2_000
CANDIDATES = 40  # per signal on the index plan, at least; 4 x the limit when that is more
# hnsw.ef_search on an agent's own index (recall against time, measured in bench/README.md).
EF_SEARCH = int(SESSION_SETTINGS["hnsw.ef_search"])  # every connection's default (app/db/pool.py)
# An agent listed with this many records or more is searched in vector mode with at least
# LARGE_AGENT_EF_SEARCH: 80 finds 0.99-1.00 of the exact vector top-10 at 25,000 records but
# 0.962-0.976 at 200,000, where 120 found 0.986-1.000 for about 0.5 ms more at p50
# (bench/README.md, ninth session). With the indexes' m 12 (nineteenth session), 80 finds
# 0.990-0.995 at 25,000 records and 120 0.977-0.991 at 200,000, 150 0.995-0.996, still 0.82 of
# m 16's time at 120. Not in hybrid mode: there a page found the same share of the exact hybrid
# top-10 with 80 as with 150 at 200,000 records (most of it from the words' tiers), for 1.7-2.4
# ms less at p50 (bench/README.md, twenty-third session).
LARGE_AGENT_RECORDS = 100_000
LARGE_AGENT_EF_SEARCH = 150
# A hybrid page takes few records by meaning alone (most come from its words' tiers): its vector
# list walks HNSW no wider than the list itself. Against 80, nearly the same share of the exact
# hybrid top-10 (5,000 / 25,000 / 200,000 records: 0.991 / 0.993 / 0.970 against 0.993 / 0.992 /
# 0.971) for 0.3-0.9 ms less at p50; 20 was no faster (bench/README.md, twenty-fifth session).
HYBRID_EF_SEARCH = CANDIDATES
# Agents found listed with own indexes, by pool and by what else decides their plan
# (`search_store.listing_key`): their next search runs the index statement at once, which
# checks the listing (and a turn's scopes) itself and reads nothing where the plan no longer
# holds; then the exact statement's gate decides, as for any agent. Nothing stale is trusted,
# so nothing expires; the records as listed, which the last search read, serve cost choices
# only (`LARGE_AGENT_RECORDS`, `_newest_first`). One statement a search instead of two
# (bench/README.md, twenty-fifth session). At most MAX_LISTED, the least recently used
# forgotten first.
_LISTED: dict[tuple[object, ...], int] = {}
MAX_LISTED = 10_000
MAX_EF_SEARCH = 1000  # pgvector refuses a larger hnsw.ef_search; the iterative scan goes on


MAX_PAGE = 1000  # the most records one search returns (`first`, `limit`)
# A page is read with one more record, which tells whether another page follows.
MAX_LIMIT = MAX_PAGE + 1
MAX_IDS = 1000
# A ranked search pages at most this deep: each page's index plan reads candidates for every
# record before it, so deeper pages cost more (a listing without a query pages without end).
MAX_DEPTH = 10_000
# How many times a later page on the index plan is ranked deeper when records written since its
# cursor took its candidates' places (`_by_index`).
DEEPER_TRIES = 3


@dataclass(frozen=True)
class SearchResult:
    records: list[MemoryRecord]  # ranked by `score` (with a query) or newest first (without)
    next_cursor: str | None = None  # query-less listing: pass as `after` for the next page
    embed_tokens: int = 0  # usage of the query's embedding, recorded as purpose `embed`
    plan: Plan | None = field(default=None, compare=False)  # which plan ranked (benchmarks)
    # Each record's cursor: passed as `after` (with the same query and filters), the records
    # after it. A listing's is its (created, memory_id); a ranked search's its (score, created,
    # memory_id), how many records came before (the index plan reads that many more
    # candidates; more when records written since rank above it, `_by_index`) and what ranked
    # the first page (`Ranking.weights`, `best`). GraphQL's
    # searchMemories pages with them; the agent's tool, by next_cursor.
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
        listing = _listing(reader, filters)
        keyset = listing.decode(after)
        if limit == 0:
            return SearchResult([])
        async with pool.acquire() as conn:
            rows = await search_store.newest(conn, reader, filters, after=keyset, limit=limit + 1)
        more = len(rows) > limit
        page = rows[:limit]
        cursors = [listing.encode(r.created, r.memory_id) for r in page]
        return SearchResult(page, cursors[-1] if more else None, cursors=cursors)

    key = _search_key(reader, mode, query, filters)
    position = _decode_ranked(after, key)
    # The ranking is its best MAX_DEPTH records: a page ends there, and a caller that reads one
    # record more to learn whether another page follows learns that none does (a cursor past
    # the bound is refused, so promising one would lead nowhere).
    limit = min(limit, MAX_DEPTH - (position.depth if position else 0))
    if limit == 0:
        return SearchResult([])
    vector, tokens = None, 0
    with metrics.current().search(mode):
        if mode != "lexical":
            # Embedded before taking a connection: no transaction waits on the model.
            embedded = await embedder.embed([query])
            vector, tokens = embedded.vectors[0], embedded.tokens
        position = position or _Position(None, 0, None, None)
        ranking = make_ranking(
            mode,
            query,
            vector,
            config.min_score,
            limit,
            after=position.after,
            depth=position.depth,
            weights=position.weights,
            best=position.best,
        )
        records, plan = await ranked(pool, reader, filters, ranking)
    # Each cursor carries what ranked the first page, so that every later page ranks alike
    # (`Ranking.weights`): a record keeps its score while the agent writes. (A query of more
    # words than a cursor carries is weighed afresh on each page.)
    weights = records.weights
    if weights is not None and len(weights) > MAX_WEIGHTS:
        weights = None
    cursors = [
        RANKED.encode(
            key,
            r.score or 0.0,
            r.created,
            r.memory_id,
            (records.depth or position.depth) + i + 1,
            weights,
            records.best,
        )
        for i, r in enumerate(records)
    ]
    return SearchResult(records, None, tokens, plan, cursors)


async def key_words(pool: asyncpg.Pool, reader: AgentReader, text: str, count: int) -> str:
    """The `count` words of `text` that weigh most in a search by `reader` (those the fewest of
    the records it sees hold; words none holds left out; ties by their place), in their order
    in the text; the text itself when no word of it is held. A word of several lexemes (a
    hyphenated one, a URL) is kept for its rarest and counts once; a lexeme is kept for its
    first word."""
    words = text.split()
    async with pool.acquire() as conn:
        rows = await search_store.word_holders(conn, reader, words)
    first: dict[str, tuple[int, int]] = {}  # each held lexeme: its holders, its first word
    for place, lexeme, holders in rows:
        if holders:
            first.setdefault(lexeme, (holders, place))
    kept: set[int] = set()
    for _, place in sorted(first.values()):  # the rarest first, ties by place
        if len(kept) == count:
            break
        kept.add(place)
    return " ".join(words[place] for place in sorted(kept)) if kept else text


def _lists(mode: str, reach: int) -> tuple[int, int]:
    """The index plan's candidates per signal and `hnsw.ef_search` for a page ending at rank
    `reach`: enough for the records before it and its own."""
    base = EF_SEARCH if mode == "vector" else HYBRID_EF_SEARCH
    return max(CANDIDATES, 4 * reach), min(MAX_EF_SEARCH, max(base, 4 * reach))


def deeper(ranking: Ranking, depth: int) -> Ranking:
    """`ranking` as a page after `depth` records ranks: its lists as long as such a page's."""
    candidates, ef_search = _lists(ranking.mode, depth + ranking.limit)
    return replace(
        ranking,
        depth=depth,
        candidates=max(ranking.candidates, candidates),
        ef_search=max(ranking.ef_search, ef_search),
    )


def make_ranking(
    mode: str,
    query: str,
    vector: np.ndarray | None,
    min_score: float | None,
    limit: int,
    weight: float = HYBRID_WEIGHT,
    by_length: bool = False,
    *,
    after: tuple[float, datetime, UUID] | None = None,
    depth: int = 0,
    weights: tuple[float, ...] | None = None,
    best: float | None = None,
) -> Ranking:
    """`after` and `depth`: a later page, after that record with `depth` records before it
    (the index plan proposes enough candidates for them and this page); `weights` and `best`:
    what ranked the first page (`Ranking`)."""
    candidates, ef_search = _lists(mode, depth + limit)
    return Ranking(
        mode=mode,  # type: ignore[arg-type]
        text=query if mode != "vector" else None,
        vector=vector if mode != "lexical" else None,
        min_score=min_score,
        limit=limit,
        weight=weight,
        candidates=candidates,
        ef_search=ef_search,
        by_length=by_length,
        after=after,
        depth=depth,
        weights=weights,
        best=best,
    )


async def ranked(
    pool: asyncpg.Pool, reader: Reader, filters: Filters, ranking: Ranking, plan: Plan | None = None
) -> tuple[Scored, Plan]:
    """Ranks by the plan the agent's indexes and filtered row count call for (or by `plan`,
    for benchmarks). An agent found listed with own indexes (`_LISTED`) is ranked by the index
    statement first, which checks that it still is."""
    async with pool.acquire() as conn:
        if plan is None and filters.ids is not None and len(filters.ids) <= EXACT_MAX_ROWS:
            plan = "exact"
        listing = search_store.listing_key(reader, filters) if plan is None else None
        # (A pool's id may name a later pool once it is gone: harmless, as nothing is trusted.)
        key = (id(pool), *listing) if listing is not None else None
        remembered = _LISTED.get(key) if key is not None else None
        if key is not None and remembered is not None:
            found, records = await _by_index(conn, reader, filters, ranking, remembered, key)
            if found is not None:
                return found, "index"
            _LISTED.pop(key, None)
        # (An agent without own indexes has no index plan: forced, it is ranked exactly.)
        records = await search_store.listed_records(conn, reader) if plan == "index" else None
        if records is None:
            gate = None if plan is not None else EXACT_MAX_ROWS
            found, records = await search_store.ranked_exact(
                conn, reader, filters, ranking, gate, scoped=SCOPED_MAX_ROWS if gate else None
            )
            if found is not None:
                return found, "exact"
            assert records is not None, "ranked_exact leaves only listed agents to the index plan"
        found, listed = await _by_index(conn, reader, filters, ranking, records, key)
        if found is None and listed is not None:
            # A turn whose scopes the upkeep counted few but hold more since (the gate's second
            # statement counted them): one statement more than before this memory, until the
            # next count, its listing alone checked.
            found, listed = await _by_index(conn, reader, filters, ranking, listed, None)
        if found is None:
            # Unlisted since the gate read it, a moment ago: its indexes may be gone, and the
            # index plan without them would read the agent's rows for each tier of words.
            found, _ = await search_store.ranked_exact(conn, reader, filters, ranking)
            return found if found is not None else Scored(), "exact"  # (never None ungated)
        return found, "index"


async def _by_index(
    conn: asyncpg.Connection,
    reader: Reader,
    filters: Filters,
    ranking: Ranking,
    records: int,
    key: tuple[object, ...] | None,
) -> tuple[Scored | None, int | None]:
    """The index plan for an agent with `records` as listed with its own indexes. Its
    statement checks that the agent is still listed and, with `key`, that its plan holds (a
    turn's scopes' counts); the agent is remembered under `key` when it does. Returns the
    records (None: the check failed, and nothing was read) and the agent's records as listed
    (None: unlisted)."""
    if records >= LARGE_AGENT_RECORDS and ranking.mode == "vector":
        ranking = replace(ranking, ef_search=max(ranking.ef_search, LARGE_AGENT_EF_SEARCH))
    depth_asked = ranking.depth
    for _ in range(DEEPER_TRIES):
        found, listed = await search_store.ranked_index(
            conn,
            reader,
            filters,
            ranking,
            records,
            checked=True,
            scoped=SCOPED_MAX_ROWS if key is not None else None,
        )
        # A later page whose candidates hold more records above its cursor than the pages
        # before held: records written since (a score is the first page's, `Ranking.weights`,
        # so unchanged records stay where they were) took candidates' places, and records after
        # the cursor may be missing. Ranked again as deep as those records reach (the lists
        # hold more candidates), as if the pages before had held them.
        if found is None or found.above is None or found.above <= ranking.depth:
            break
        depth = min(found.above, MAX_DEPTH - ranking.limit)
        if depth <= ranking.depth:
            break
        ranking = deeper(ranking, depth)
    if found is not None and ranking.depth > depth_asked:
        found.depth = ranking.depth
    if key is not None and found is not None and listed is not None:
        _LISTED.pop(key, None)  # re-inserted last: dicts keep insertion order
        if len(_LISTED) >= MAX_LISTED:
            del _LISTED[next(iter(_LISTED))]  # the oldest
        _LISTED[key] = listed
    return found, listed


def search_grants(query: str | None, ids: Sequence[Any] | None) -> tuple[Grant, ...]:
    """What an operator's search needs: SELECT on the search index and documents with a query;
    without one (a listing), or with `ids` (a read), what those need."""
    ranked = query is not None and bool(query.strip())
    grants = resources.SEARCH_MEMORY if ranked else ()
    if not ranked or ids is not None:
        grants += resources.READ_MEMORY
    return grants


async def search_as_operator(
    pool: asyncpg.Pool,
    embedder: Embedder,
    caller: Caller,
    *,
    action_id: UUID,
    query: str | None,
    mode: str | None = None,
    kind: str | None = None,
    labels: Sequence[LabelValue] = (),
    ids: Sequence[UUID] | None = None,
    limit: int,
    after: str | None = None,
    max_query_chars: int = MAX_QUERY_CHARS,
    action: ActionVersion | None = None,
) -> tuple[list[MemoryView], list[str]]:
    """An operator's search of an agent's records (every session, live and preview), with the
    agent's search settings. A ranked search needs SELECT on the memory search index and
    documents; without a query it is a listing, and with `ids` a read, needing what those do.
    Returns the records with their cursors (`after` for the records after each). `action`:
    the agent's current version when the caller has just read it, not read again unless label
    filters are given or a record holds a label it does not declare (a version written since
    may have added it)."""
    caller.require(*search_grants(query, ids))
    check_query(query, max_query_chars)
    # A label filter reads the agent: it may have been updated since `action` was read.
    given = action if action is not None and not labels else None
    if given is not None and (given.account_id, given.action_id) != (caller.account_id, action_id):
        given = None
    action = given or await require_action(pool, caller, action_id=action_id)
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
    names = label_names_of(action)
    if given is not None and any(n not in names for r in result.records for n in r.labels):
        names = label_names_of(await require_action(pool, caller, action_id=action_id))
    return [MemoryView(r, names) for r in result.records], result.cursors


def label_numbers(config: MemoryConfig, labels: Sequence[LabelValue]) -> dict[int, str]:
    """Label filters by number: names resolve through the agent's declarations."""
    numbers: dict[int, str] = {}
    for label in labels:
        if label.name is not None:
            number = config.resolve_label(label.name, label.number).number
        elif label.number is not None:  # a number the agent has not declared finds nothing
            number = label.number
        else:
            raise BadInput("each label filter needs the label's name or number, and a value")
        if number not in LABEL_NUMBERS:
            raise BadInput(f"label numbers are from 5 to 18, got {number}")
        declared = config.label(number)
        check_label_filter(declared.name if declared is not None else number, label.value)
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


LISTING = cursors.Keyset(cursors.INSTANT_TEXT, cursors.ID_TEXT)
# Said to an operator (searchMemories) and to a model (search_memory, its `nextCursor`) alike,
# as RANKED's refusal is: neither pages a GraphQL connection of `endCursor`, `sort` and
# `accountId`.
NOT_THIS_LISTING = (
    "`after` is not a cursor this listing issued: pass the next cursor of the previous page "
    "(search_memory's `nextCursor`, or the `cursor` of its last record), of the same agent "
    "with the same kind, labels and ids, or leave `after` out to start again from the first "
    "page"
)
RANKED = cursors.Keyset(
    cursors.TEXT,  # the search it belongs to (`_search_key`)
    cursors.SCORE,
    cursors.INSTANT_TEXT,
    cursors.ID_TEXT,
    cursors.COUNT,
    cursors.WEIGHTS,
    cursors.BEST,
    error="`after` is not a cursor this search issued: pass the cursor of the last record of "
    "the previous page, of the same agent, with the same query, mode and filters (a cursor of "
    "an older release's: start again from the first page)",
)


def _spelled(reader: Reader, filters: Filters) -> tuple[list[str], list[Any]]:
    """The agent searched (its account and ID: an import can give an agent of another account
    the same ID) and the filters, as a search's cursors are bound to them: labels and IDs in
    one order however a client orders them."""
    labels = sorted((filters.labels or {}).items())
    ids = sorted(map(str, filters.ids)) if filters.ids is not None else None
    return [str(reader.account_id), str(reader.action_id)], [filters.kind, labels, ids]


def _listing(reader: Reader, filters: Filters) -> cursors.BoundKeyset:
    """A query-less search's cursors, bound to the agent listed and the filters: passed with
    others, a cursor would page that listing from a place it never reached."""
    agent, chosen = _spelled(reader, filters)
    return LISTING.bound("searchMemories", *agent, *chosen, error=NOT_THIS_LISTING)


@dataclass(frozen=True)
class _Position:
    after: tuple[float, datetime, UUID] | None  # the last record of the page before
    depth: int  # how many records the pages before held
    weights: tuple[float, ...] | None  # what ranked the first page (`Ranking`)
    best: float | None


def _search_key(reader: Reader, mode: str, query: str, filters: Filters) -> str:
    """What a ranked search's cursors belong to, digested: the agent searched (its account and
    ID: an import can give an agent of another account the same ID), its mode, query and
    filters. A cursor passed with another search, of another agent too, would page that one
    from a place it never reached, with the word weights of another agent's records."""
    agent, chosen = _spelled(reader, filters)
    spelled = json.dumps([*agent, mode, query, *chosen], ensure_ascii=False)
    return "ranked:" + hashlib.sha256(spelled.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _decode_ranked(after: str | None, key: str) -> _Position | None:
    values = RANKED.decode(after)
    if values is None:
        return None
    issued_for, score, created, memory_id, depth, weights, best = values
    if issued_for != key:
        raise BadInput(RANKED.error)
    position = _Position((score, created, memory_id), depth, weights, best)
    if position.depth >= MAX_DEPTH:
        raise BadInput(
            f"a ranked search pages through its best {MAX_DEPTH:,} records; narrow the query or "
            "filter by kind or labels to reach others"
        )
    return position
