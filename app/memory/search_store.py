"""SQL for memory search: ranking by meaning and words, and the query-less listing.

The text score of a record is the sum of the weights of the query's words it holds (BM25's
IDF among the agent's records: a listed agent's counts, `query_words`, migration 0020, or
else counted over the records the search ranks; `_words` says which): within a search it
depends only on which of them it holds.

Two plans rank the same way (`app.memory.search` says when each is used, and why):

- `exact`: reads every row the reader sees under the filters once, scores each (cosine to the
  query vector, the text score when it holds any query word) and fuses them. No index decides
  what is found, so it is exact for any filter, and fastest while the filtered set is small.
- `index`: takes the top candidates of each signal from the agent's own indexes (an agent
  without them has the exact plan alone) and scores the union of both lists exactly.
  Meaning: HNSW with an iterative scan. Words: the exact text ranking, read from GIN tier by
  tier (`word_tiers`: records holding the best-weighted set of the query's words first, best
  cosine first within a tier; GIN asked for the set's rarest three words, fewer where few
  records hold them, the others tested on the rows it finds), until the list is full; in
  hybrid mode, only while a tier's records can still reach the page or raise the best text
  score (`_threshold`), and in lexical mode, only the page when the query has at most six
  words (a tier of common words read newest first by the created btree when that is cheaper,
  `_newest_first`). A long query's last tier (the records holding only words after the sixth,
  most of the agent for a recall's query) is read in its order, not whole: best cosine first by
  HNSW in hybrid mode (`_nearest_first`), newest first in lexical mode. Fast for an agent of
  any size; a record outside both lists is not found.

Both end in the same fusion (`_FUSED`), so a record scores the same whichever plan found it.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import asyncpg
import numpy as np

from app.db.fusion import cosine_of, fusion, held_lexemes
from app.db.sql import Params
from app.memory.records import MemoryRecord
from app.memory.store import RECORD_COLUMNS, has_labels, record
from app.memory.visibility import (
    AgentReader,
    OperatorReader,
    Reader,
    counted,
    in_session,
    scope_arms,
    visible,
)
from app.scope import Scope

Mode = Literal["hybrid", "lexical", "vector"]
Plan = Literal["exact", "index"]

_COLUMNS = ", ".join(f"m.{c}" for c in RECORD_COLUMNS)
# The columns of a record that `_signals` reads: what the exact plan's scan and the index
# plan's lists of candidates read (the covering index of migration 0024 holds them).
_SIGNAL_COLUMNS = "m.memory_id, m.created, m.embedding, m.tsv"


@dataclass(frozen=True)
class Filters:
    kind: str | None = None
    labels: Mapping[int, str] | None = None  # label number -> exact value
    ids: Sequence[UUID] | None = None

    @property
    def narrows(self) -> bool:
        """Label or ID filters, which may leave few of even a large agent's records."""
        return self.labels is not None or self.ids is not None


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
    ef_search: int  # index plan: HNSW candidate list size on an agent's own index
    # The text score divided by 1 + the log of the record's distinct words (the memory review:
    # a restatement, bench/review.py); search's own score is not.
    by_length: bool = False
    # A later page: only records ranked after this (score, created, memory_id), the last record
    # of the page before (the order is score DESC, created DESC, memory_id DESC).
    after: tuple[float, datetime, UUID] | None = None
    depth: int = 0  # how many records the pages before held
    # A later page ranks as the first did (the cursor carries both): the query words' weights,
    # in the order of their terms (`query_words`), and in hybrid mode the best text score that
    # normalized the text rank. None: weighed and normalized afresh, as a first page is.
    weights: tuple[float, ...] | None = None
    best: float | None = None

    @property
    def reach(self) -> int:
        """The ranks this page ends at: the pages before and this one."""
        return self.depth + self.limit


class Scored(list[MemoryRecord]):
    """A ranked page's records, best first, with what ranked them (`Ranking.weights` and
    `best`, as the statement used them: None where it used none), which a cursor carries to
    the next page."""

    weights: tuple[float, ...] | None = None
    best: float | None = None
    # A later page on the index plan: how many of its candidates ranked above its cursor (None
    # on a first page and on the exact plan, which scores every record). More than the pages
    # before held: records written since took candidates' places (`search._by_index`).
    above: int | None = None
    depth: int | None = None  # the depth it was ranked at, when deeper than its cursor's


def _filters(f: Filters, p: Params, m: str = "m", *, labels_index: bool = True) -> str:
    """SQL: the filters' conditions. Without `labels_index`, labels are tested on the rows read
    (the index plan, which walks the agent's own indexes), not found by their index."""
    where = ""
    if f.kind is not None:
        where += f" AND {m}.kind = {p(f.kind)}"
    if f.labels:
        where += f" AND {has_labels(f.labels, p, m, by_index=labels_index)}"
    if f.ids is not None:
        where += f" AND {m}.memory_id = any({p(list(f.ids))}::uuid[])"
    return where


def _words(r: Ranking, p: Params, reader: Reader, ranked: str | None = None) -> str:
    """The query's words, looked up once per search (a CTE `words`): `query`, any of them;
    `terms` and `weights`, each word and its weight, best first; `lexemes`, each word's lexeme
    (the exact plan's `held`). A word weighs its BM25 IDF among the records the reader sees, as
    the maintenance counted them for a listed agent (`query_words`, migration 0020; `_counts`
    says how for each reader). A preview reader of agent scope, who may see records no count
    holds, weighs every word the same (1). A preview reader of session scope alone, and any
    reader no count covers: with `ranked` (the rows the search ranks, as `agent_memories m
    WHERE ...`), counted over those rows now (by the index, a word at a time), and without it
    NULL (`ranked_exact` weighs them from the rows it reads). Empty without a query text."""
    if r.text is None:
        return ""
    text = p(r.text)
    if isinstance(reader, AgentReader) and reader.preview:
        own, weight = "", "NULL::float8"
        if Scope.AGENT in reader.scopes:
            weight = "CASE WHEN q.counted IS NOT NULL THEN 1::float8 END"
    else:
        own, counted, held = _counts(reader, p)
        weight = f"word_weight({counted}, {held})"
    session = _session(reader)
    if r.weights is not None:
        # The first page's weights, by the term's place in term order; a list of another
        # length (the words parse otherwise now) is not used.
        given = p(list(r.weights)) + "::float8[]"
        weight = (
            f"coalesce(CASE WHEN count(*) OVER () = cardinality({given})"
            f" THEN ({given})[row_number() OVER (ORDER BY q.term)] END, {weight})"
        )
    if ranked is not None:
        # Evaluated only for a reader not weighed by counts (COALESCE stops early).
        weight = (
            f"coalesce({weight}, word_weight((SELECT count(*) FROM {ranked}),"
            f" (SELECT count(*) FROM {ranked} AND m.tsv @@ q.term)))"
        )
    order = "ORDER BY w.weight DESC NULLS LAST, w.term"
    # `query` from the words `query_words` parsed (as `any_words` would parse them again);
    # '' for no session (no session ID is empty).
    session_sql = p(session) if session is not None else "''"
    return (
        f"{own}words AS MATERIALIZED (SELECT string_agg(w.term::text, ' | ')::tsquery AS query,"
        f" array_agg(w.term {order}) AS terms, array_agg(w.weight {order}) AS weights,"
        # Each word's lexeme (its tsquery's text form read back as a tsvector's), for `_signals`.
        f" array_agg((tsvector_to_array(w.term::text::tsvector))[1] {order}) AS lexemes"
        # OFFSET 0: each word is weighed once, not once per aggregate that reads its weight.
        f" FROM (SELECT q.term, {weight} AS weight FROM query_words({text},"
        f" {p(reader.account_id)}, {p(reader.action_id)}, {session_sql}) q OFFSET 0) w), "
    )


_IN_OWN = "(SELECT count(*) FROM own o WHERE o.tsv @@ q.term)"


def _counts(reader: Reader, p: Params, in_own: str = _IN_OWN) -> tuple[str, str, str]:
    """How the counts of `query_words`' row `q` weigh a word for the reader, as if it saw only
    the records they count (a preview reader sees more: `_words`): a CTE they need (`own`),
    then SQL for the records counted and for those holding the word, both NULL where no count
    covers the reader (an agent not counted; a reader of one session alone whose session's
    words are not kept). An operator by the counts over every scope; a reader of agent scope by
    the agent-scope counts plus its own session's (kept by the maintenance for a large
    session, or else counted now, `_own_session`, `in_own` of its records holding the word:
    only for a counted agent, as CASE stops before `own` is read)."""
    if isinstance(reader, OperatorReader):
        return "", "q.counted_any", "CASE WHEN q.counted_any IS NOT NULL THEN q.held_any END"
    if Scope.AGENT not in reader.scopes:
        return (
            "",
            "q.session_counted",
            "CASE WHEN q.session_counted IS NOT NULL THEN q.session_held END",
        )
    session = _session(reader)
    if session is None:
        return "", "q.counted", "CASE WHEN q.counted IS NOT NULL THEN q.held END"
    counted = "q.counted + coalesce(q.session_counted, (SELECT count(*) FROM own))"
    held = f"q.held + CASE WHEN q.session_counted IS NOT NULL THEN q.session_held ELSE {in_own} END"
    return (
        _own_session(reader, session, p),
        f"CASE WHEN q.counted IS NOT NULL THEN {counted} END",
        f"CASE WHEN q.counted IS NOT NULL THEN {held} END",
    )


def _session(reader: Reader) -> str | None:
    """The session whose session-scope records the reader sees, if any."""
    if isinstance(reader, AgentReader) and Scope.SESSION in reader.scopes:
        return reader.session_id
    return None


def _own_session(reader: AgentReader, session: str, p: Params) -> str:
    """CTE `own`: the words of the reader's session's records that the maintenance would count
    (`counted`), read by the session index (migration 0020)."""
    return (
        "own AS MATERIALIZED (SELECT m.tsv FROM agent_memories m"
        f" WHERE m.account_id = {p(reader.account_id)} AND m.action_id = {p(reader.action_id)}"
        f" AND {in_session(session, p)} AND {counted()}), "
    )


def _session_only(reader: Reader) -> bool:
    """A reader of one session's records alone, which the session index finds."""
    return (
        isinstance(reader, AgentReader)
        and Scope.AGENT not in reader.scopes
        and _session(reader) is not None
    )


def listing_key(reader: Reader, filters: Filters) -> tuple[UUID, UUID, bool, str | None] | None:
    """What, beside the agent's listing, decides whether `ranked_exact`'s gate leaves a search
    to the index plan, as a key: the agent and, for a turn reading agent scope, that and its
    session (its scopes' counts, `scoped`). None where the gate counts the rows first (label or
    ID filters, a reader of one session alone)."""
    if filters.narrows or _session_only(reader):
        return None
    return reader.account_id, reader.action_id, _scoping(reader, filters), _session(reader)


def _scoping(reader: Reader, filters: Filters) -> bool:
    """A turn reading agent scope without label or ID filters: of an agent with own indexes,
    `ranked_exact` ranks it over its scopes' rows when the upkeep counted few of them."""
    return not filters.narrows and isinstance(reader, AgentReader) and Scope.AGENT in reader.scopes


def _by_length(r: Ranking, score: str, words: str) -> str:
    """The text score, divided by 1 + the log of the record's distinct `words` for the review."""
    return f"{score} / (1 + ln(greatest({words}, 1)))" if r.by_length else score


def _weighed(r: Ranking) -> tuple[str, str | None]:
    """CTEs `counts`, `weights`, `sets` and `scored` after `ranked_exact`'s `scanned` (with a
    query text): how many rows hold each set of the query's words; the words' weights, the
    agent's counted ones or else BM25's IDF over the scanned rows; each set's text score; and
    each row's, its set's. With them, the fusion's best text score (`_finish`'s `best`; None:
    the best in `scored`). `scored` is read once, by the fusion, so it streams into the page's
    sort instead of being stored: the best text score is the best set's, and the rows are
    counted in `scanned` (1,000-record agents, 0.92-0.93 of the time, bench/README.md).
    Divided by length, a row's score is its own: the best is read from `scored`, which
    PostgreSQL then stores as it did."""
    # A set's words summed best first, as `_signals` sums them: the same score to the last bit.
    # Once per set, not per row (a sub-select for each of a 1,000-record agent's rows holding
    # a word cost about a millisecond, bench/README.md). With no row scanned (the gate found the
    # agent listed) nothing here reads `words`: the words are not looked up.
    # Each set's lexemes are read once (`members`), not each set for each of the query's words
    # and the weights again for each set: a 300-word query (a recall's, of a long message) over
    # a 1,000-record agent took 210-270 ms (bench/README.md, fifty-sixth session).
    pairs = "unnest((SELECT lexemes FROM words), (SELECT weights FROM weights)) w(lexeme, weight)"
    best = None if r.by_length else "(SELECT max(words) FROM sets)"
    ctes = f"""counts AS MATERIALIZED (
        SELECT held, count(*) AS rows FROM scanned GROUP BY held
    ), members AS MATERIALIZED (
        SELECT c.held, l.lexeme, c.rows
        FROM counts c CROSS JOIN LATERAL unnest(c.held::text[]) l(lexeme)
    ), weights AS MATERIALIZED (
        SELECT coalesce((SELECT weights FROM words WHERE weights[1] IS NOT NULL), ARRAY(
            SELECT word_weight((SELECT sum(rows) FROM counts), coalesce(h.rows, 0))
            FROM unnest((SELECT lexemes FROM words)) WITH ORDINALITY t(lexeme, i)
            LEFT JOIN (SELECT lexeme, sum(rows) AS rows FROM members GROUP BY lexeme) h
                ON h.lexeme = t.lexeme
            ORDER BY t.i
        )) AS weights
    ), sets AS MATERIALIZED (
        SELECT m.held, sum(w.weight ORDER BY w.weight DESC) AS words
        FROM members m JOIN {pairs} ON w.lexeme = m.lexeme GROUP BY m.held
    ), scored AS (
        SELECT s.memory_id, s.created, s.cosine, {_by_length(r, "h.words", "s.length")} AS words
        FROM scanned s LEFT JOIN sets h ON h.held = s.held
    )"""
    return ctes, best


def _signals(r: Ranking, p: Params, m: str = "m", *, scan: bool = False) -> str:
    """Select-list: the cosine to the query vector and the text score (NULL: no word shared),
    under a `words` CTE (`_words`). With `scan`, instead of the score the query's words the
    row holds (`held`, the text of their lexemes' array: one value for each set of words) and,
    for `by_length`, its words (`length`): what `_weighed` scores once the weights are known."""
    cosine = cosine_of(f"{m}.embedding", p(r.vector)) if r.vector is not None else "NULL::float8"
    words = "NULL::float8 AS words"
    if r.text is not None:
        # Sub-selects of the CTE are evaluated once per search, also in a generic plan; the
        # words only for a row that holds any.
        if scan:
            held = f"{held_lexemes(m)}::text"
        else:
            held = (
                "(SELECT sum(w.weight) FROM unnest((SELECT terms FROM words),"
                f" (SELECT weights FROM words)) w(term, weight) WHERE {m}.tsv @@ w.term)"
            )
            held = _by_length(r, held, f"length({m}.tsv)")
        words = f"CASE WHEN {m}.tsv @@ (SELECT query FROM words) THEN {held} END"
        words += " AS held" if scan else " AS words"
        if scan and r.by_length:
            words += f", length({m}.tsv) AS length"
    return f"{m}.memory_id, {m}.created, {cosine} AS cosine, {words}"


_FUSED = """
    , fused AS (
        SELECT memory_id, created, {score} AS score FROM scored WHERE {found}
    ), top AS (
        SELECT memory_id, created, score FROM fused{after}
        ORDER BY score DESC, created DESC, memory_id DESC LIMIT {limit}
    )
    SELECT {columns}, top.score{carry}{gate} FROM {source}top JOIN agent_memories m
        ON m.account_id = {account} AND m.action_id = {action} AND m.memory_id = top.memory_id
    {close}ORDER BY top.score DESC, top.created DESC, top.memory_id DESC
"""


def _finish(
    reader: Reader,
    r: Ranking,
    p: Params,
    *,
    gated: bool = False,
    holds: str | None = None,
    best: str | None = None,
    weights: str = "words",
    above: bool = False,
) -> str:
    """The fusion and the page; `gated`: one row more, the gate's answer (`_gate_cte`), with or
    without records; `holds`: a condition on the gate that row answers too (ranked_index);
    `best`: the text score that normalizes the text rank, when not the best in `scored` (the
    ranking's own when it has one); `weights`: the CTE whose `weights` weighed the words. A
    first page's rows also carry what ranked them (`Scored`), read once. With `above`, a later
    page's statement answers one row at least, which counts the scored rows that rank above
    its cursor (`Scored`)."""
    # Only hybrid normalizes: a crafted cursor's best in another mode is not read (a parameter
    # the statement never reads has no type, which PostgreSQL refuses).
    if r.best is not None and r.mode == "hybrid":
        best = f"{p(r.best)}::float8"
    score, found = fusion(r.mode, r.weight, r.min_score, p, best)
    carry = ""
    if r.text is not None and not r.by_length:
        if r.weights is None:
            terms = f"unnest((SELECT terms FROM words), (SELECT weights FROM {weights}))"
            carry += (
                f", CASE WHEN top.memory_id IS NOT NULL THEN ARRAY(SELECT x.weight FROM {terms}"
                " x(term, weight) ORDER BY x.term) END AS weights"
            )
        if r.mode == "hybrid" and r.best is None:
            normalizer = best or "(SELECT max(words) FROM scored)"
            carry += f", CASE WHEN top.memory_id IS NOT NULL THEN {normalizer} END AS best"
    after = ""
    source, close = ("gate g LEFT JOIN (", ") ON true\n    ") if gated else ("", "")
    if r.after is not None:
        # After the fusion: the text rank is still normalized over every match.
        keyset = _keyset(r.after, p)
        after = f" WHERE (score, created, memory_id) < {keyset}"
        if above:
            count = f"SELECT count(*) FROM fused WHERE NOT (score, created, memory_id) < {keyset}"
            carry += f", ({count}) AS above"
            if not gated:
                source, close = "(SELECT) g LEFT JOIN (", ") ON true\n    "
    return _FUSED.format(
        score=score,
        found=found,
        after=after,
        limit=int(r.limit),
        columns=_COLUMNS,
        carry=carry,
        gate=(
            ", g.listed AS gate_listed, g.seen AS gate_seen, g.rows AS gate_rows"
            + (f", (SELECT {holds} FROM gate) AS gate_holds" if holds else "")
            if gated
            else ""
        ),
        source=source,
        close=close,
        account=p(reader.account_id),
        action=p(reader.action_id),
    )


async def ranked_exact(
    conn: asyncpg.Connection,
    reader: Reader,
    filters: Filters,
    r: Ranking,
    max_rows: int | None = None,
    *,
    scoped: int | None = None,
    by_scope: bool = False,
) -> tuple[Scored | None, int | None]:
    """Scores every record the reader sees under the filters: (records, None). With
    `max_rows`, in the same statement, only if the agent has no own indexes (whatever its
    size: its index plan, without them, was slower, migration 0034), or under label or ID
    filters or for a reader of one session alone, if at most that many rows match them:
    otherwise it returns (None, the agent's records as listed with its own indexes), and the
    index plan ranks.

    With `scoped`, a turn reading agent scope, of an agent with own indexes whose upkeep
    counted at most that many live records in the turn's scopes (agent scope, and its session
    when the session's words are kept), is then ranked by a second statement (`by_scope`) as
    a reader of one session alone is: over the rows of its scopes, if they are at most
    `scoped`. A turn of an agent that writes mostly to other sessions then reads its few
    hundred rows, not the agent's whole indexes through a filter that hides most of them.

    Except under label or ID filters the statement is the same for every agent (`OpaqueKey`).
    Under ID filters the key is a plain parameter. Under label filters it is written out
    (`AgentKey`): a generic plan that cannot see it expects an agent of average size, reads
    the agent's key instead of the labels index (migration 0023), and took 330-380 ms p50 at
    200,000 records against 54 (bench/README.md, twentieth session)."""
    by_scope = by_scope or _session_only(reader)
    narrow = filters.narrows or by_scope
    # A turn this statement may leave to the second one: the gate reads what the upkeep counted.
    scoping = scoped is not None and not by_scope and _scoping(reader, filters)
    p: Params = OpaqueKey(reader)
    if filters.labels:
        p = AgentKey(reader)
    elif filters.narrows:
        p = Params()
    gate, bound = "", ""
    if max_rows is not None:
        gate, bound = _gate(
            reader, filters, p, max_rows, narrow=narrow, by_scope=by_scope, seen=scoping
        )
    # Words are tested in the select list, not the WHERE clause, so the planner reads the
    # agent's rows by their btrees (`_rows`), never by words.
    scan = f"SELECT {_signals(r, p, scan=True)} FROM ({_rows(reader, filters, p, bound)}) m"
    # Without a query text the scanned rows are scored (cosine only).
    scored, best = f"scored AS MATERIALIZED ({scan})", None
    if r.text is not None:
        weighed, best = _weighed(r)
        scored = f"scanned AS MATERIALIZED ({scan}), {weighed}"
    finish = _finish(reader, r, p, gated=max_rows is not None, best=best, weights="weights")
    sql = f"""
    WITH {gate}{_words(r, p, reader)}{scored}{finish}"""
    found = await conn.fetch(sql, *p.values)
    if max_rows is None:
        return _page(found, r), None
    listed, seen, counted_rows = (found[0][k] for k in ("gate_listed", "gate_seen", "gate_rows"))
    if listed is None or (narrow and counted_rows <= max_rows):
        return _page(found, r), None
    if scoping and seen is not None and seen <= scoped:
        return await ranked_exact(conn, reader, filters, r, scoped, by_scope=True)
    return None, listed


# A record whose entry fits in `agent_memories_entries` (migration 0024), as its predicate
# says it: a query names it so that the index may serve it.
_FITS = "memory_entry_fits(m.embedding, m.tsv, m.session_id, m.kind)"


def _rows(reader: Reader, filters: Filters, p: Params, bound: str) -> str:
    """SQL: the rows `ranked_exact` scores, the columns `_signals` reads. Without label or ID
    filters, an arm for each scope the reader reads (an operator's: the agent's), each in two:
    the records whose entry the covering index holds (migration 0024), read index-only from the
    scope's range of it, where an agent's entries lie together however scattered its rows are
    in the table (1,000-record agents, a turn's hybrid search: 7.11 / 10.10 -> 4.48 / 6.04 ms
    p50 / p95, bench/README.md, twenty-first session), and the others, read from the table.
    Label and ID filters find their few rows by their own indexes."""
    where = _filters(filters, p) + bound
    if filters.narrows:
        return f"SELECT {_SIGNAL_COLUMNS} FROM agent_memories m WHERE {visible(reader, p)}{where}"
    scopes = scope_arms(reader, p) if isinstance(reader, AgentReader) else []
    arms = [visible(reader, p, scope=scope) for scope in scopes] or [visible(reader, p)]
    return " UNION ALL ".join(
        f"SELECT {_SIGNAL_COLUMNS} FROM agent_memories m WHERE {arm}{where} AND {entries}"
        for arm in arms
        for entries in (_FITS, f"NOT {_FITS}")
    )


def _gate(
    reader: Reader,
    filters: Filters,
    p: Params,
    max_rows: int,
    *,
    narrow: bool,
    by_scope: bool,
    seen: bool,
) -> tuple[str, str]:
    """`ranked_exact`'s choice: the CTE `gate` (`listed`: the agent's records as listed with
    own indexes; `seen`, only when asked: the live records of the reader's scopes as the
    upkeep counted them; `rows`: for a narrow reader, the rows matching its filters or scopes,
    up to `max_rows` + 1, only with own indexes), and the condition the scan adds."""
    rows, placeholders = "NULL::bigint", None
    if narrow:
        placeholders = account, action = p(reader.account_id), p(reader.action_id)
        # Counted under the key, the scopes and the label and ID filters alone, each scope by
        # its index up to `max_rows` + 1, so that an agent with own indexes reads a bounded
        # number of rows here whatever the reader sees of them.
        key = f"m.account_id = {account} AND m.action_id = {action}" + _filters(
            Filters(labels=filters.labels, ids=filters.ids), p
        )
        arms = [key]
        if by_scope and isinstance(reader, AgentReader):
            arms = [f"{key} AND {arm}" for arm in scope_arms(reader, p)]
        first = " UNION ALL ".join(
            f"(SELECT FROM agent_memories m WHERE {arm} LIMIT {int(max_rows) + 1})" for arm in arms
        )
        # Only for an agent with own indexes: one without is ranked here whatever its size.
        rows = f"CASE WHEN v.records IS NOT NULL THEN (SELECT count(*) FROM ({first}) c) END"
        bound = f" AND (SELECT listed IS NULL OR rows <= {int(max_rows)} FROM gate)"
    else:
        # An agent with own indexes is ranked by them: nothing is read.
        bound = " AND (SELECT listed IS NULL FROM gate)"
    return _gate_cte(reader, p, rows, seen=seen, key=placeholders), bound


def _gate_cte(
    reader: Reader,
    p: Params,
    rows: str = "NULL::bigint",
    *,
    seen: bool,
    key: tuple[str, str] | None = None,
) -> str:
    """The CTE `gate`, one row: `listed`, the agent's records as listed with own indexes (NULL
    without them); `seen`, only when asked, the live records of the reader's scopes as the
    upkeep counted them (agent scope, and its session's when they are kept); `rows`. `key`:
    the account's and the agent's placeholders, when the statement has them already."""
    account, action = key or (p(reader.account_id), p(reader.action_id))
    upkeep, kept = "NULL::bigint", ""
    session = _session(reader)
    if seen:
        upkeep = "v.words_counted"
        if session is not None:
            upkeep += " + coalesce(n.counted, 0)"
            kept = (
                f" LEFT JOIN session_counts n ON n.account_id = {account}"
                f" AND n.action_id = {action} AND n.session_id = {p(session)}"
            )
    return (
        f"gate AS MATERIALIZED (SELECT v.records AS listed, {upkeep} AS seen, {rows} AS rows"
        f" FROM (SELECT) o LEFT JOIN agent_indexes v ON v.account_id = {account}"
        f" AND v.action_id = {action}{kept}), "
    )


class _KeyParams(Params):
    """Params that write the reader's agent key (account and action) their own way."""

    def __init__(self, reader: Reader) -> None:
        super().__init__()
        self.key = (reader.account_id, reader.action_id)

    def is_key(self, value: Any) -> bool:
        return isinstance(value, UUID) and value in self.key


class AgentKey(_KeyParams):
    """Params that write the reader's agent key (account and action) into the SQL as literals.

    A large agent's own indexes are partial indexes on its key (maintenance.py), which a plan
    may use only where the query names that key as a constant. With the key written out, the
    plan that a prepared statement caches (generic, after five runs) can use them too, and the
    statement needs no planning at each search. The statement text is then the agent's own,
    which is why only large agents get it: asyncpg caches 100 statements per connection."""

    def __call__(self, value: Any) -> str:
        if self.is_key(value):
            # Printed by uuid.UUID itself (hex digits and hyphens), whatever subclass came in.
            return f"'{UUID(int=value.int)}'::uuid"
        return super().__call__(value)


class OpaqueKey(_KeyParams):
    """Params that hide the reader's agent key from the planner, as `(SELECT $n::uuid)`.

    The exact plan's statement is the same for every agent. With the key as a constant, a
    custom plan always looked cheaper than the generic one (its estimate is the agent's own
    size), so plan_cache_mode `auto` planned it at every search (its cost: bench/README.md).
    With the key hidden, both plans cost the same, and `auto` keeps the generic plan from the
    sixth run on a connection."""

    def __call__(self, value: Any) -> str:
        placeholder = super().__call__(value)
        return f"(SELECT {placeholder}::uuid)" if self.is_key(value) else placeholder


async def listed_records(conn: asyncpg.Connection, reader: Reader) -> int | None:
    """The agent's records as listed with its own indexes (maintenance.py), None without
    them; for a forced index plan."""
    return await conn.fetchval(
        "SELECT records FROM agent_indexes WHERE account_id = $1 AND action_id = $2",
        reader.account_id,
        reader.action_id,
    )


async def ranked_index(
    conn: asyncpg.Connection,
    reader: Reader,
    filters: Filters,
    r: Ranking,
    records: int,
    *,
    checked: bool = False,
    scoped: int | None = None,
) -> tuple[Scored | None, int | None]:
    """Candidates from an agent's own indexes (maintenance.py), scored as they are read; an
    agent without them is ranked exactly (`ranked_exact`: no index is shared by every agent,
    migrations 0015 and 0034). Meaning: the agent's HNSW index, iterative scan. Words: the
    records holding the query's words, best text score first, read by its GIN index one tier
    at a time (`word_tiers`, migrations 0017, 0022 and
    0026, GIN asked for at most three words of a subset and the rest tested on its rows): a
    tier is the records holding exactly one subset of the query's six rarest words (or several
    of equal weight), and tiers come in the order of their weight, so the list is the exact text
    ranking and stops reading once full. Within a tier, best cosine first (newest first in
    lexical mode, which is the lexical ranking's own order). Not exact in two cases: a query of
    more than six words, whose later words add to a record's score without moving its tier,
    and the review's division by length (`by_length`), which tiers ignore; there a record
    outside both lists is missed, and the best text score among the candidates, which
    normalizes the fusion, may be below the agent's best. In hybrid mode such a query's last
    tier, when it should hold enough of the agent's records, is read from HNSW
    (`_nearest_first`), approximate as the vector list is; so is, at an agent of
    `COMMON_TIER_MIN_RECORDS` or more, the first tier that holds records, when common.

    The walk ends early where that changes no record of the page (bench/README.md,
    thirteenth session): in hybrid mode at the first tier whose records can neither reach it
    nor raise the best text score (`_threshold`; on an agent's own HNSW index, which is
    approximate, a record that the vector list should have held but missed may be skipped),
    in lexical mode after the page's ranks when the query has at most six words (the tiers'
    order is then the lexical ranking).

    In lexical mode, for any reader but a preview one, a tier of
    common words is first walked newest first by the (agent, created) btree, testing its words
    on a bounded number of rows, when that should find the tier's newest records sooner than
    GIN reads all of them; a walk that comes back short leaves the tier to GIN
    (`_newest_first`). For an agent of `SHARED_PROBES_MIN_RECORDS` or more, a lexical walk
    reads a GIN probe that several of its tiers share once (`_shared_probes`).

    `records`: the agent's records as listed with its own indexes. The statement names the
    agent's key as literals (`AgentKey`), which their partial predicates need.

    Returns the records and the agent's records as listed: `records`, or with `checked` as the
    statement read them. Then the statement first checks in `agent_indexes`
    that the agent is still listed and, with `scoped`, that the upkeep counted more than
    `scoped` live records in the scopes of a turn reading agent scope (or none: else
    `ranked_exact` ranks it by scope); if not, it reads none of the agent's records and returns
    None for them."""
    p = AgentKey(reader)
    # A label held by more records than the exact plan ranks: not found by its index, whose
    # generic plan, blind to the value, expects a few rows and reads them all for each tier.
    where = visible(reader, p, "m") + _filters(filters, p, labels_index=False)
    gate, holds = "", None
    if checked:
        scoping = scoped is not None and _scoping(reader, filters)
        gate = _gate_cte(reader, p, seen=scoping)
        holds = "listed IS NOT NULL"
        if scoping:  # else `ranked_exact` ranks the turn over its scopes
            holds += f" AND (seen IS NULL OR seen > {int(scoped or 0)})"
        where += f" AND (SELECT {holds} FROM gate)"  # a one-time filter: read before any row
    agent = "agent_memories m WHERE " + where
    columns = _SIGNAL_COLUMNS
    limit = int(r.candidates)  # a constant: for a parameter a cached plan would guess a tenth

    def candidates(rows: str) -> str:
        # Signals are computed for the list's rows only, on the columns its scan read (no
        # second lookup); a record proposed by both lists scores the same in each, so UNION
        # keeps one.
        return f"(SELECT {_signals(r, p, 'c')} FROM ({rows}) c)"

    lists: list[str] = []
    ctes = ""
    nearest = f"m.embedding <=> {p(r.vector)}" if r.vector is not None else None
    if nearest is not None:
        # The walk's `hnsw.ef_search` on the agent's own index, set for this statement's
        # transaction by a one-time filter, which runs before the scan's first row: no
        # statement before the search, and no reset of the connection after it (0.18 and 0.29
        # ms p50 at 200,000 records, bench/README.md, twenty-second session).
        scan = f"SELECT {columns} FROM {agent}"
        scan += f" AND (SELECT set_config('hnsw.ef_search', {p(str(r.ef_search))}, true))"
        scan += " IS NOT NULL"
        lists.append(candidates(f"{scan} ORDER BY {nearest} LIMIT {limit}"))
    if r.text is not None:
        # GIN reads the rarest three words of each of the tier's subsets, fewer where the
        # rarer ones are held by few of the agent's records (`probe`, migrations 0022 and 0026:
        # the more common ones' postings cost most in tiers that turn out empty);
        # `exact` is tested on the rows it finds (as a function, which GIN cannot take: its
        # NOT would read the common words' postings, 1.5-2 x slower). Sorted outside the scan
        # (OFFSET 0), so that no index that supplies the order (HNSW, the created btree) is
        # walked instead, testing the words on every row (which `_newest_first` does on
        # purpose, and bounded, for a tier of common words).
        def read_tier(where: str = "") -> str:  # `where`: more conditions on its records
            return (
                f"SELECT * FROM (SELECT {columns} FROM {agent} AND m.tsv @@ t.probe"
                f" AND ts_match_vq(m.tsv, t.exact){where} OFFSET 0) m"
                f" ORDER BY {nearest or 'm.created DESC, m.memory_id DESC'} LIMIT {limit}"
            )

        tier = read_tier()

        # Tiers in order, each read only when the ones before hold too few records: the loop
        # keeps the order of its sorted outer side. (An outer ORDER BY would be planned as a
        # sort after reading every tier.)
        def walk(tiers: str, read: str) -> str:
            return candidates(
                f"SELECT c.* FROM ({tiers} ORDER BY tier) t CROSS JOIN LATERAL ({tier}) c {read}"
            )

        # A preview reader's words all weigh 1 (`_words`), which says nothing of how many hold
        # them: its probes keep three words.
        preview = isinstance(reader, AgentReader) and reader.preview
        tiers = _tiers(p, None if preview else records)
        if r.mode == "hybrid" and not r.by_length and nearest is not None:
            # (`records` None: `listed_records` of an unlisted agent, as tests pass it.)
            counted = p(float(max(records or 0, 1)))
            # Not for a preview reader, whose words all weigh 1 (the tier's size unknown).
            common = not preview and (records or 0) >= COMMON_TIER_MIN_RECORDS
            gin, tier = tier, _nearest_first(tier, agent, nearest, limit, counted)  # `walk`'s
            first = (
                _nearest_first(gin, agent, nearest, limit, counted, common=True) if common else tier
            )
            ctes, rest = _threshold(r, p, lists.pop(), candidates(first), walk, limit, tiers)
            lists += ["SELECT * FROM nearest", "SELECT * FROM head", rest]
        elif r.mode == "lexical" and not r.by_length:
            # The tiers' order is the lexical ranking when the query has at most six words:
            # then the page's ranks are enough; a later page ranked as its first (`weights`),
            # the records after its cursor (`_after_tier`).
            reach, below, after = r.reach, None, ""
            if r.after is not None and r.weights is not None:
                (follows, below), reach = _after_tier(r.after, p), r.limit
                tiers = f"SELECT * FROM ({tiers}) t WHERE {follows}"
                after = f" AND (m.created, m.memory_id) < {below}"
                tier = read_tier(after)
            want = (
                f"(SELECT CASE WHEN cardinality(terms) <= 6 THEN {p(int(reach))}"
                f" ELSE {limit} END FROM words)"
            )
            if records >= SHARED_PROBES_MIN_RECORDS:
                direct = read_tier(after + " AND NOT t.shared")
                ctes, tiers, tier = _shared_probes(agent, tiers, direct, limit, below)
            if not preview:
                tier = _newest_first(tier, reader, where, p, want, records, below)
            lists.append(walk(tiers, f"LIMIT {want}"))
        else:
            lists.append(walk(tiers, f"LIMIT {limit}"))
    words = _words(r, p, reader, agent)
    if r.text is not None:
        words += _LATER
    finish = _finish(reader, r, p, gated=bool(gate), holds=holds, above=True)
    sql = f"WITH {gate}{words}{ctes}scored AS ({' UNION '.join(lists)}){finish}"
    found = await conn.fetch(sql, *p.values)
    if not gate:
        return _page(found, r), records
    listed = found[0]["gate_listed"]
    if not found[0]["gate_holds"]:
        return None, listed
    return _page(found, r), listed


# A lexical walk reads each GIN probe shared by several of its tiers once, for an agent of
# this many records or more (`_shared_probes`; bench/README.md, forty-second session: at
# 200,000 records p95 8.04 -> 7.07 and 8.08 -> 6.90 ms, p50 3.44 -> 3.33 and 3.34 -> 3.27;
# at 5,000 and 25,000 records the CTEs cost 0.16-0.19 ms at p50 for nothing).
SHARED_PROBES_MIN_RECORDS = 100_000


def _shared_probes(
    agent: str, tiers: str, direct: str, limit: int, below: str | None
) -> tuple[str, str, str]:
    """A lexical walk whose tiers that share a GIN probe read it once. A tier's probe is the
    rarest (up to three) of its words (`word_tiers`), so the tiers of subsets that share those
    words share it: at 200,000 records a slow question's walk read 24 tiers by 8 probes, one of
    them (305 records, all but a few dropped by each tier's `exact`) 14 times. Returns CTEs
    `all_tiers`, `walk_tiers` (the tiers, with `k`, the first tier of a probe that others
    share, and `shared`) and `probed` (a shared probe's records as arrays, a row a probe in the
    order of `k`, each computed only when the walk first asks for it: a CTE is read lazily);
    the tiers to walk; and a tier's records: a shared probe's from `probed`, tested on the
    tier's `exact` (and a later page's `below`), in `direct`'s order and limit, else read by
    `direct` (GIN, a tier that shares no probe). The same records in the same order either way
    (`NULL` vectors: lexical mode reads none)."""
    ctes = f"""all_tiers AS MATERIALIZED ({tiers}), walk_tiers AS MATERIALIZED (
        SELECT t.*, s.k, s.k IS NOT NULL AS shared FROM all_tiers t LEFT JOIN (
            SELECT probe, min(tier) AS k FROM all_tiers GROUP BY probe HAVING count(*) > 1
        ) s ON s.probe = t.probe
    ), probed AS MATERIALIZED (
        SELECT s.k, x.* FROM (
            SELECT DISTINCT k, probe FROM walk_tiers WHERE shared ORDER BY k) s
        CROSS JOIN LATERAL (
            SELECT array_agg(m.memory_id) AS ids, array_agg(m.created) AS created,
                array_agg(m.tsv) AS tsvs FROM {agent} AND m.tsv @@ s.probe) x
    ), """
    pooled = (
        "SELECT u.memory_id, u.created, NULL::vector AS embedding, u.tsv"
        " FROM (SELECT * FROM probed WHERE probed.k = t.k LIMIT 1) p,"
        " unnest(p.ids, p.created, p.tsvs) u(memory_id, created, tsv)"
        " WHERE t.shared AND ts_match_vq(u.tsv, t.exact)"
        + (f" AND (u.created, u.memory_id) < {below}" if below else "")
        + f" ORDER BY u.created DESC, u.memory_id DESC LIMIT {limit}"
    )
    rows = f"SELECT * FROM (({pooled}) UNION ALL ({direct})) r"
    return ctes, "SELECT * FROM walk_tiers", rows


def _after_tier(after: tuple[float, datetime, UUID], p: Params) -> tuple[str, str]:
    """A later lexical page of a query of at most six words, whose tiers' records all score
    their tier's `most` (to 9 decimals: `word_tiers`), with the first page's weights: the
    condition on a tier that some of its records may follow the cursor, and the (created,
    memory_id) its records are read below: the cursor's in the cursor's tier, else above any
    (records written since the first page above the cursor take no place in the walk's count).
    With more words, every tier and record."""
    score, created, memory_id = after
    s = f"{p(score)}::float8"
    more = "(SELECT cardinality(terms) > 6 FROM words)"
    whole = f"{more} OR t.most < {s} - 1e-7"
    return (
        f"{more} OR t.most <= {s} + 1e-7",
        f"(CASE WHEN {whole} THEN 'infinity'::timestamptz ELSE {p(created)}::timestamptz END,"
        f" CASE WHEN {whole} THEN 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid"
        f" ELSE {p(memory_id)}::uuid END)",
    )


# A query of more than six words has a last tier (`word_tiers`): the records holding none of
# the first six words but any after them. Its `most` is the later words' weights summed; every
# other tier's adds at least the sixth's, which weighs as much as any later word, so half of it
# tells them apart whatever the rounding. `rarity`: -ln of the share of the agent's records
# expected in it, 1 - the product of 1 - e^-weight over the later words (a word's weight is
# BM25's IDF: e^-weight is about the share of the records holding it), where e^-most, the share
# holding all of a tier's words, would take the last tier for the rarest. The CTE is empty for
# a query of at most six words. (exp bounded both ways: PostgreSQL refuses an underflow, and a
# later page's cursor may carry weights up to `cursors.MAX_WEIGHT`.)
_LATER = """later AS MATERIALIZED (
    SELECT sum(w) + 0.5 * weights[6] AS below, -ln(greatest(
        1 - exp(greatest(sum(ln(greatest(1 - exp(-least(w, 700)), 1e-300))), -700)), 1e-300))
        AS rarity
    FROM words, unnest(weights[7:]) w GROUP BY weights[6]
), """
_LAST = "t.most < (SELECT below FROM later)"  # whether tier `t` is the last (`_LATER`)
# How rare tier `t`'s records are: e^-rarity is about the share of the agent's records it holds.
_RARITY = f"CASE WHEN {_LAST} THEN (SELECT rarity FROM later) ELSE t.most END"


# What a row read best cosine first through an agent's HNSW index costs against a row GIN reads,
# for `_nearest_first` (bench/README.md, fifty-ninth session: 2, 4, 8 and 16 measured).
NEAREST_ROW_COST = 4
# The hybrid walk's first tier read best cosine first too (`_nearest_first` with `common`) at an
# agent of this many records or more, when expected in `COMMON_TIER_RECORDS` of them or more,
# over at most `COMMON_TIER_ROWS` (bench/README.md, fifty-ninth session: "What does Nate like?"
# 37.3 -> 4.9 ms at 200,000 records, 1,000 other questions level; level at 5,000 and 25,000).
COMMON_TIER_MIN_RECORDS = 100_000
COMMON_TIER_RECORDS = 1_000
COMMON_TIER_ROWS = 300


def _nearest_first(
    tier: str, agent: str, nearest: str, limit: int, records: str, *, common: bool = False
) -> str:
    """A hybrid tier's best-cosine `limit` records (SQL; `tier` reads them all by GIN and sorts
    them), read best cosine first by the agent's HNSW index instead when it is a long query's
    last tier (`_LATER`: the records holding only words after the sixth) and expected to hold
    enough of the agent's records that the walk should find `limit` of them sooner; `agent`:
    the reader's rows, as `ranked_index` selects them; `records`: the agent's records as listed
    (SQL). For a recall's query (bench/README.md, fifty-seventh session) GIN read nearly the
    whole agent for that tier whenever the six rarest words' tiers held fewer than the list
    (a 300-word query at 5,000 records: 4,977 rows, 53-58 ms p50 against 8-12 walked).

    With e^-rarity the share of the records the tier holds (`_RARITY`), the walk finds `limit`
    of them in about `limit * e^rarity` rows, where GIN reads `records * e^-rarity`, each at
    about `NEAREST_ROW_COST` times less: the walk is taken when the first costs less, that is
    when `rarity` is under ln(records / (NEAREST_ROW_COST * limit)) / 2 (at 5,000 records and a
    list of 40, a tier of 18% of them or more; at 200,000, 3%). Until the fifty-ninth session
    only a tier of half of the agent or more was walked: a recall's key words (30-40 words)
    left a last tier of a quarter to a half of a 5,000-record agent to GIN, 2,200 rows (p95
    12.0-14.0 ms against 5.4-5.5 now). Its records are then those the HNSW walk finds, as the
    vector list's are. The walk stops after twice the rows it should need (words held together
    more often than chance make a tier smaller than its estimate, and an HNSW walk for records
    few hold reads the index far: at 200,000 records 2,767 rows, 37 ms, for a tier of 483,
    forty-fourth session); a walk that comes back short leaves the tier to GIN. A query of at
    most six words has no such tier: its tiers are read by GIN as before, to the same page.

    With `common` (the walk's first tier, `first` in `_threshold`, at a large agent, for any
    reader but a preview one, whose words all weigh 1), also a tier that is not the last when
    expected in `COMMON_TIER_RECORDS` of the agent's records or more (records x e^-most), over
    at most `COMMON_TIER_ROWS`: a question about a common name
    and a common word ({nate, like}: 11,111 of 200,000 records) had GIN read the tier whole for
    its best 40 cosines, where the records holding the query's words lie near the query and the
    walk finds them in tens of rows. Its words often go together (a speaker and what they do),
    so the estimate may be far off either way, and the bound caps what a wrong one costs; the
    later tiers, several of which may pass the estimate in one search, are left to GIN (walked
    too, one question took 58 ms against 14)."""
    # The nearest rows tested as they come (no sort between: the walk stops at its `limit`-th
    # record or its bound, whichever first; with the bound not a constant, the planner may
    # read the few rows of a narrow reader whole and sort them instead, where that costs
    # less). exp() kept finite whatever the tier and the list (`most` may come from a
    # cursor's weights; a list 10,000 deep is 44,004 long).
    rows = f"least(ceil(2 * {limit} * exp(least({_RARITY}, 600))), {records})"
    if common:
        rows = f"least({rows}, CASE WHEN {_LAST} THEN {records} ELSE {COMMON_TIER_ROWS} END)"
    bound = f"{rows}::bigint"
    walked = (
        f"walked AS MATERIALIZED (SELECT * FROM (SELECT {_SIGNAL_COLUMNS} FROM {agent}"
        f" ORDER BY {nearest} LIMIT {bound}) m WHERE ts_match_vq(m.tsv, t.exact) LIMIT {limit})"
    )
    cut = f"0.5 * ln({records}::float8 / {NEAREST_ROW_COST * limit})"
    # Never NULL (no last tier): NOT NULL would read the walk for every tier.
    wide = f"coalesce({_LAST} AND (SELECT rarity FROM later) < {cut}, false)"
    if common:
        large = f"t.most < ln({records}::float8 / {COMMON_TIER_RECORDS})"
        wide = f"({wide} OR (NOT coalesce({_LAST}, false) AND {large}))"
    short = f"(SELECT count(*) FROM walked) < {limit}"
    # Sorted again: the iterative scan (relaxed_order) may return a row out of its order.
    return (
        f"WITH {walked} (SELECT * FROM walked m WHERE {wide} AND NOT {short} ORDER BY {nearest})"
        f" UNION ALL SELECT * FROM ({tier}) g WHERE NOT {wide} OR {short}"
    )


def _newest_first(
    tier: str, reader: Reader, where: str, p: Params, want: str, records: int, below: str | None
) -> str:
    """A lexical tier's newest `want` records (SQL; `tier` reads them all by GIN and sorts
    them), read newest first by the (agent, created) btree instead when the tier's words are
    common; `where`: the reader's rows, as `ranked_index` selects them; `below`: a later page's
    (created, memory_id) the tier is read below (`_after_tier`), where the btree walk starts.

    A word's weight is BM25's IDF, so e^-weight is about the share of the records that hold it,
    and e^-most about the share holding all of a tier's words (`most`: their summed weights,
    and those of any words after the sixth, so never less; for a long query's last tier, whose
    records hold any of its words, its own estimate, `_RARITY`). The walk finds `want` of them in
    about `want * e^most` rows, where GIN reads `records * e^-most` at about three times the
    cost a row: it is tried when the first is less, that is when `most` is under ln(3 *
    records / want) / 2, over at most twice the rows it should need (the agent's newest rows,
    whatever the reader sees of them: a reader who sees few, or words that seldom meet, such as
    two speakers' names, leave it short, and GIN reads the tier as before). Measured in
    bench/README.md (sixteenth and seventeenth sessions)."""
    want = f"greatest({want}, 1)"
    common = f"{_RARITY} < 0.5 * ln(3 * {p(float(max(records, 1)))}::float8 / {want})"
    newest = "m.created DESC, m.memory_id DESC"  # the (agent, created) btree's order
    rows = f"CASE WHEN {common} THEN ceil(2 * {want} * exp({_RARITY}))::bigint ELSE 0 END"
    first = (
        f"SELECT * FROM agent_memories m WHERE m.account_id = {p(reader.account_id)}"
        f" AND m.action_id = {p(reader.action_id)}"
        + (f" AND (m.created, m.memory_id) < {below}" if below else "")
        + f" ORDER BY {newest} LIMIT {rows}"
    )
    # The words as functions, which no index takes: the btree's order is read, not GIN (and
    # the walk stops at the tier's `want`-th record: no sort).
    walked = (
        f"walked AS MATERIALIZED (SELECT {_SIGNAL_COLUMNS} FROM ({first}) m WHERE {where}"
        " AND ts_match_vq(m.tsv, t.held) AND ts_match_vq(m.tsv, t.exact)"
        f" ORDER BY {newest} LIMIT {want})"
    )
    # The walk runs only for a tier of common words (a CTE is read only where referenced).
    short = f"(SELECT count(*) FROM walked) < {want}"
    return (
        f"WITH {walked} SELECT * FROM walked WHERE {common} AND NOT {short}"
        f" UNION ALL SELECT * FROM ({tier}) g WHERE NOT {common} OR {short}"
    )


def _tiers(p: Params, records: int | None) -> str:
    """The query's words in tiers (migrations 0019, 0022 and 0026), under a `words` CTE.
    `records`: the agent's as listed, which lets a tier's GIN probe stop at the words that
    few of them hold (None: the rarest three words of each subset, as before 0026)."""
    counted = "'Infinity'" if records is None else p(float(records))
    return (
        "SELECT * FROM word_tiers((SELECT terms FROM words), (SELECT weights FROM words),"
        f" {counted}::float8)"
    )


def _threshold(
    r: Ranking,
    p: Params,
    nearest: str,
    tier: str,
    walk: Callable[[str, str], str],
    limit: int,
    tiers: str,
) -> tuple[str, str]:
    """CTEs for the hybrid index plan's tier walk, which reads no tier whose records cannot
    change the page (the threshold algorithm): `nearest`, the vector list, scored; `best`, its
    best text score, its length and its last cosine; `first` and `head`, the records (scored,
    from `tier`) of the first tier that holds any and may score `best` or more. Then `bound`:
    `low`, the best text score read so far (the fusion's normalizer, unless a later tier's
    `most`, the most its records can score, is above it: such a tier is read); `last`, the
    most cosine a record outside the vector list can have (1 when the list is short); and
    `floor`, the reach-th score among the records read, normalized by the most the normalizer
    can be (`top`), so at most the page's last score. Any other tier is read only if one of
    its records could score `w * last + (1 - w) * most / low >= floor`: the tiers skipped are
    the last ones, which the full walk reads only after those read here, and none of their
    records could reach the page. A later page ranked with its first page's normalizer
    (`Ranking.best`) takes `floor` among the records after its cursor; without it (a query of
    more words than a cursor carries), it trusts the cursor's count of the records before it,
    and after writes that moved more records above it a record may be skipped, as such a page
    may skip or repeat one anyway. `tiers`: the query's tiers (`_tiers`). Returns
    the CTEs and the walk over the tiers after `first`."""
    w = p(r.weight) + "::float8"
    # The fusion's own score, normalized by `top`: never above the score it gives the row.
    score, found = fusion(r.mode, r.weight, r.min_score, p, best="h.top")
    # A later page's normalizer is its first page's (`Ranking.best`): the fusion's, whatever
    # the tiers hold.
    low, top = (
        "greatest(n.words, (SELECT max(words) FROM head))",
        "greatest(b.low, (SELECT most FROM first))",
    )
    # `floor`: the reach-th score, or with the first page's normalizer, whose scores are the
    # page's own, the limit-th after the cursor (records written above it since then do not
    # raise it).
    after, offset = "", int(r.reach) - 1
    if r.best is not None:
        low = top = f"{p(r.best)}::float8"
        if r.after is not None:
            after, offset = (
                f" AND ({score}, created, memory_id) < {_keyset(r.after, p)}",
                r.limit - 1,
            )
    rest = (
        "SELECT * FROM tiers t WHERE CASE WHEN (SELECT tier FROM first) IS NULL"
        " THEN t.most < (SELECT words FROM best) ELSE t.tier > (SELECT tier FROM first) END"
        " AND (t.most >= (SELECT low FROM bound) OR (SELECT floor FROM bound) IS NULL"
        f" OR {w} * (SELECT last FROM bound) + (1 - {w}) * (t.most / (SELECT low FROM bound))"
        " >= (SELECT floor FROM bound))"
    )
    rest = walk(rest, f"LIMIT (SELECT {limit} - count(*) FROM head)")
    ctes = f"""nearest AS MATERIALIZED {nearest}, tiers AS MATERIALIZED ({tiers}),
    best AS MATERIALIZED (
        SELECT max(words) AS words, count(*) AS rows, min(cosine) AS last FROM nearest
    ), first AS MATERIALIZED (
        SELECT t.tier, t.most, x.* FROM (
            SELECT * FROM tiers WHERE most >= coalesce((SELECT words FROM best), '-Infinity')
            ORDER BY tier) t
        CROSS JOIN LATERAL (
            SELECT array_agg(c.memory_id) AS ids, array_agg(c.created) AS created,
                array_agg(c.cosine) AS cosines, array_agg(c.words) AS words FROM {tier} c) x
        WHERE x.ids IS NOT NULL LIMIT 1
    ), head AS MATERIALIZED (
        SELECT u.* FROM first f, unnest(f.ids, f.created, f.cosines, f.words)
            u(memory_id, created, cosine, words)
    ), bound AS MATERIALIZED (
        SELECT b.low, CASE WHEN n.rows < {limit} THEN 1 ELSE greatest(n.last, 0) END AS last, (
            SELECT {score} FROM (SELECT * FROM nearest UNION SELECT * FROM head) s
            WHERE {found}{after} ORDER BY 1 DESC OFFSET {p(offset)} LIMIT 1) AS floor
        FROM best n, LATERAL (SELECT {low} AS low) b, LATERAL (SELECT {top} AS top) h
    ), """
    return ctes, rest


async def word_holders(
    conn: asyncpg.Connection, reader: AgentReader, words: Sequence[str]
) -> list[tuple[int, str, int]]:
    """Each of `words`' lexemes, by the word's place in them (from 0, in that order), and how
    many of the records the reader sees hold it, as its search weighs words: by the
    maintenance's counts (`_counts`, a preview reader as a live one), or, where they do not
    cover the reader, over its records now, all the words in one pass (an agent not listed
    has at most `agent_index_min_records`). A lexeme the counts say no record holds is counted
    now over the records they do not hold (`_held_since`). A lexeme no record holds: 0. A word
    without a lexeme (a stop word, punctuation) has no row."""
    p = Params()
    text = p(" ".join(words))
    lexeme = "(tsvector_to_array(q.term::text::tsvector))[1]"
    # A session the upkeep does not count: its records counted now in one pass, as a small
    # agent's are (word by word, the statement took 8.7-9.3 ms for 150-300 words at a session
    # of 900 records; so, 6.1-6.8).
    own, _, held = _counts(
        reader, p, f"coalesce((SELECT n.held FROM own_held n WHERE n.lexeme = {lexeme}), 0)"
    )
    if own:
        own += (
            "own_held AS MATERIALIZED (SELECT l.lexeme, count(*) AS held FROM own o"
            " CROSS JOIN LATERAL unnest(tsvector_to_array(o.tsv)) l(lexeme)"
            f" JOIN unnest(tsvector_to_array(to_tsvector('english'::regconfig, {text}))) w(lexeme)"
            " ON w.lexeme = l.lexeme GROUP BY l.lexeme), "
        )
    session = _session(reader)
    session_sql = p(session) if session is not None else "''"
    sql = f"""
    WITH {own}weighed AS MATERIALIZED (
        SELECT {lexeme} AS lexeme, {held} AS held
        FROM query_words({text}, {p(reader.account_id)}, {p(reader.action_id)}, {session_sql}) q
    ), uncounted AS MATERIALIZED (
        -- Each row's lexemes joined to the words': as fast for 300 words as for 20 (at 1,000
        -- records 7-8 ms warm, where testing each row for the words, as `held_lexemes` does,
        -- took 5 ms for 20 words and 13 for 300).
        -- The rows as the exact plan reads them (`_rows`: most from the covering index).
        SELECT l.lexeme, count(*) AS held
        FROM ({_rows(reader, Filters(), p, "")}) m
        CROSS JOIN LATERAL unnest(tsvector_to_array(m.tsv)) l(lexeme)
        JOIN weighed w ON w.lexeme = l.lexeme AND w.held IS NULL
        -- A one-time filter: no row is read when the counts weigh every word.
        WHERE (SELECT bool_or(held IS NULL) FROM weighed)
        GROUP BY l.lexeme
    )
    SELECT t.place - 1 AS place, w.lexeme, coalesce(w.held, u.held, 0) AS held,
        w.held = 0 AS unseen
    FROM unnest({p(list(words))}::text[]) WITH ORDINALITY t(word, place)
    CROSS JOIN LATERAL unnest(tsvector_to_array(to_tsvector('english'::regconfig, t.word)))
        l(lexeme)
    JOIN weighed w ON w.lexeme = l.lexeme LEFT JOIN uncounted u ON u.lexeme = w.lexeme
    ORDER BY t.place"""
    rows = await conn.fetch(sql, *p.values)
    unseen = sorted({row["lexeme"] for row in rows if row["unseen"]})
    since = await _held_since(conn, reader, unseen) if unseen else {}
    return [(row["place"], row["lexeme"], since.get(row["lexeme"], row["held"])) for row in rows]


async def _held_since(
    conn: asyncpg.Connection, reader: AgentReader, lexemes: Sequence[str]
) -> dict[str, int]:
    """How many of the records the reader sees hold each of `lexemes`, which the counts of a
    listed agent say none holds: records they do not hold (written since they were counted, a
    preview turn's preview records, the turn's own staged ones), few, found by the agent's own
    GIN index (its key as constants, `AgentKey`): a record written since the last count holds
    what a recall most often asks about."""
    p = AgentKey(reader)
    given = p(list(lexemes))
    sql = f"""
    SELECT l.lexeme, count(*) AS held
    FROM agent_memories m CROSS JOIN LATERAL unnest(tsvector_to_array(m.tsv)) l(lexeme)
    WHERE {visible(reader, p)}
      AND m.tsv @@ (SELECT string_agg(array_to_tsvector(ARRAY[x])::text, ' | ')::tsquery
                    FROM unnest({given}::text[]) x)
      AND l.lexeme = any({given}::text[])
    GROUP BY l.lexeme"""
    return {row["lexeme"]: row["held"] for row in await conn.fetch(sql, *p.values)}


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


def _keyset(after: tuple[float, datetime, UUID], p: Params) -> str:
    """A ranked page's cursor as a row, to compare (score, created, memory_id) with."""
    score, created, memory_id = after
    return f"({p(score)}::float8, {p(created)}::timestamptz, {p(memory_id)}::uuid)"


def _page(rows: list[asyncpg.Record], r: Ranking) -> Scored:
    """The records of a ranked statement's rows (not its gate's alone), with what ranked them:
    the ranking's own, or what the statement read (`_finish`)."""
    all_rows, rows = rows, [row for row in rows if row["memory_id"] is not None]
    page = Scored(_scored(row) for row in rows)
    page.weights, page.best = r.weights, r.best
    if r.after is not None and all_rows:  # a later page's count (`_finish`), where it has one
        page.above = all_rows[0].get("above")
    if rows:  # a first page's columns (`_finish`), where it has them
        weights, best = rows[0].get("weights"), rows[0].get("best")
        if weights is not None and None not in weights:
            page.weights = tuple(weights)
        page.best = best if best is not None else page.best
    return page


def _scored(row: asyncpg.Record) -> MemoryRecord:
    return record(row, score=row["score"])
