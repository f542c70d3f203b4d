"""SQL for session history: keeping a turn's events, ranking their parts, reading, erasing.

Ranking reuses memory search's fusion of meaning and words (`app.db.fusion`: 0.5 x cosine +
0.5 x the text score scaled by the best match) and its text score: the sum of BM25's IDF
(`word_weight`, migration 0018) over the query's words a part holds, a word few parts hold
weighing more than one most hold. The words are counted over the parts the reader sees (the
exact plan), or over the newest parts a large session's index plan walks; recency breaks ties
(later turn, then later event: a turn's events share its commit's time, and their IDs rise in
the order they were said, keeping._in_order). A reader sees one session's parts, from turns
before a bound, preview parts only for a preview reader.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias
from uuid import UUID

import asyncpg
import numpy as np
from pgvector import Vector

from app.db.cursors import INT4_MIN
from app.db.fusion import HYBRID_WEIGHT, cosine_of, fusion, held_lexemes
from app.db.sql import Params, by_page, page_arrays
from app.history.keeping import KeptEvent

# TypeAlias: asyncpg has no types, and mypy reads a bare `Row = asyncpg.Record` as a variable.
Row: TypeAlias = asyncpg.Record


@dataclass(frozen=True)
class HistoryScope:
    """Which history a reader sees: one session's turns before `before_turn` (None: every
    turn), preview turns' only when `preview`."""

    account_id: UUID
    action_id: UUID
    session_id: str
    before_turn: int | None
    preview: bool
    # Left out: a result of these tools, and each part of an agent message that holds a call of
    # one (a search by a reader who may not read what they hold: memory records, M55); the
    # message's own words, kept in parts of their own, are found (and shown reduced, by the
    # caller). Left out of the ranking itself, so that neither a score nor a short page tells
    # they matched.
    hidden_tools: tuple[str, ...] = ()


class SessionKey(Params):
    """Params that write the scope's session key (account, action, session) into the SQL as
    literals: the index plan's (a large session). With the key written out, the plan that a
    prepared statement caches (generic, from its sixth run on a connection) is the one a custom
    plan would take (HNSW for meaning, the session's btree for words, as the planner sees the
    session's size), so a remembered large session is searched in one statement with no
    setting sent first and no planning. The statement text is then the session's own: asyncpg
    caches 100 statements per connection, which large sessions, a few, share."""

    def __init__(self, scope: HistoryScope) -> None:
        super().__init__()
        self.key = (scope.account_id, scope.action_id, scope.session_id)

    def __call__(self, value: Any) -> str:
        if isinstance(value, UUID) and value in self.key[:2]:
            # Printed by uuid.UUID itself (hex digits and hyphens), whatever subclass came in.
            return f"'{UUID(int=value.int)}'::uuid"
        if isinstance(value, str) and value == self.key[2]:
            return text_literal(value)
        return super().__call__(value)


def text_literal(text: str) -> str:
    """A string constant, quoted as PostgreSQL's quote_literal does (whatever
    standard_conforming_strings says)."""
    quoted = text.replace("'", "''")
    if "\\" in text:
        return "E'" + quoted.replace("\\", "\\\\") + "'"
    return f"'{quoted}'"


@dataclass(frozen=True)
class Ranking:
    text: str
    vector: np.ndarray
    limit: int
    candidates: int  # index plan: how many parts each signal proposes


def _session(scope: HistoryScope, p: Params, h: str) -> str:
    """SQL: row `h` is of the scope's session."""
    return (
        f"{h}.account_id = {p(scope.account_id)} AND {h}.action_id = {p(scope.action_id)}"
        f" AND {h}.session_id = {p(scope.session_id)}"
    )


def _visible(scope: HistoryScope, p: Params, h: str) -> str:
    where = _session(scope, p, h)
    if scope.before_turn is not None:
        where += f" AND {h}.turn < {p(scope.before_turn)}"
    if not scope.preview:
        where += f" AND NOT {h}.preview"
    if scope.hidden_tools:
        where += f" AND NOT {_hidden(scope, p, h)}"
    return where


def _hidden(scope: HistoryScope, p: Params, h: str) -> str:
    """SQL: row `h` is one `hidden_tools` hides: an event that is a result of one, or a part
    that holds a call of one."""
    tools = p(list(scope.hidden_tools))
    result = f"(e.who = 'tool' AND coalesce(e.tool = any({tools}::text[]), false))"
    if h == "e":
        return result
    # A part names the tools it holds itself (migration 0027). A part kept by a process of the
    # release before names none (during a rolling upgrade): its event is read, and an agent
    # message's part then counts as holding each call of the message.
    calls = (
        "jsonb_array_elements(CASE WHEN jsonb_typeof(e.data->'toolCalls') = 'array'"
        " THEN e.data->'toolCalls' ELSE '[]'::jsonb END) c"
    )
    held = (
        f"({result} OR e.who = 'agent'"
        f" AND EXISTS (SELECT FROM {calls} WHERE c->>'name' = any({tools}::text[])))"
    )
    return (
        f"coalesce({h}.tools && {tools}::text[],"
        f" EXISTS (SELECT FROM history_events e WHERE e.account_id = {h}.account_id"
        f" AND e.action_id = {h}.action_id AND e.session_id = {h}.session_id"
        f" AND e.event_id = {h}.event_id AND {held}))"
    )


class Keeper(Protocol):
    """The execution whose committed turn keeps events (the runtime's Execution, read here
    without importing it)."""

    @property
    def account_id(self) -> UUID: ...
    @property
    def action_id(self) -> UUID: ...
    @property
    def session_id(self) -> str | None: ...
    @property
    def execution_id(self) -> UUID: ...
    @property
    def invocation_number(self) -> int: ...
    @property
    def preview(self) -> bool: ...


async def insert(
    conn: asyncpg.Connection,
    keeper: Keeper,
    turn: int,
    events: list[KeptEvent],
    vectors: np.ndarray | None,
) -> None:
    """Writes the events a committed turn `turn` keeps, and their parts, inside its commit
    transaction."""
    if not events:
        return
    assert keeper.session_id is not None  # history is a session's
    key = (keeper.account_id, keeper.action_id, keeper.session_id)
    await conn.execute(
        """
        INSERT INTO history_events
            (account_id, action_id, session_id, event_id, turn, execution_id, invocation_number,
             sequence, who, call_id, tool, data, text, parts, preview)
        SELECT $1, $2, $3, e.event_id, $4, $5, $6, e.sequence, e.who, e.call_id, e.tool,
               e.data, e.text, e.parts, $7
        FROM unnest($8::uuid[], $9::int[], $10::text[], $11::text[], $12::text[], $13::jsonb[],
                    $14::text[], $15::int[])
            AS e(event_id, sequence, who, call_id, tool, data, text, parts)
        """,
        *key,
        turn,
        keeper.execution_id,
        keeper.invocation_number,
        keeper.preview,
        [e.event_id for e in events],
        [e.sequence for e in events],
        [e.who for e in events],
        [e.call_id for e in events],
        [e.tool for e in events],
        [e.data for e in events],
        [e.text for e in events],
        [len(e.parts) for e in events],
    )
    ids = [e.event_id for e in events for _ in e.parts]
    numbers = [n for e in events for n in range(1, len(e.parts) + 1)]
    texts = [t for e in events for t in e.parts]
    tools = [json.dumps(t) for e in events for t in e.part_tools]  # (JSON text: rows of arrays)
    await conn.execute(
        """
        INSERT INTO history_parts
            (account_id, action_id, session_id, event_id, part, turn, preview, text, embedding,
             tools)
        SELECT $1, $2, $3, p.event_id, p.part, $4, $5, p.text, p.embedding,
               ARRAY(SELECT jsonb_array_elements_text(p.tools::jsonb))
        FROM unnest($6::uuid[], $7::int[], $8::text[], $9::vector[], $10::text[])
            AS p(event_id, part, text, embedding, tools)
        """,
        *key,
        turn,
        keeper.preview,
        ids,
        numbers,
        texts,
        [Vector(v) for v in vectors] if vectors is not None else [None] * len(texts),
        tools,
    )


_EVENT = (
    "e.event_id, e.session_id, e.turn, e.execution_id, e.invocation_number, e.sequence, e.who,"
    " e.call_id, e.tool, e.data, e.text, e.parts, e.preview, e.created"
)


def _words(r: Ranking, p: Params) -> str:
    """CTE `words`: the query's words, any of them (`query`), and their lexemes (`lexemes`)."""
    text = p(r.text)
    return (
        f"words AS MATERIALIZED (SELECT any_words({text}) AS query,"
        f" tsvector_to_array(to_tsvector('english'::regconfig, {text})) AS lexemes), "
    )


def _held(h: str) -> str:
    """The query's lexemes part `h` holds, sorted (NULL: none)."""
    return f"CASE WHEN {h}.tsv @@ (SELECT query FROM words) THEN {held_lexemes(h)} END"


def _weights(rows: str) -> str:
    """CTEs `counts` (how many of `rows` hold each set of the query's lexemes, `held`; NULL:
    none of them), `holding` (how many hold each lexeme) and `weights` (each lexeme's IDF among
    `rows`). Each set's lexemes are read once, not each set for each of the query's lexemes: a
    query of hundreds of words over thousands of sets took seconds."""
    return f"""counts AS MATERIALIZED (
        SELECT held, count(*) AS rows FROM {rows} GROUP BY held
    ), members AS MATERIALIZED (
        SELECT c.held, l.lexeme, c.rows FROM counts c CROSS JOIN LATERAL unnest(c.held) l(lexeme)
    ), holding AS MATERIALIZED (
        SELECT lexeme, sum(rows) AS rows FROM members GROUP BY lexeme
    ), weights AS MATERIALIZED (
        SELECT t.lexeme, word_weight((SELECT sum(rows) FROM counts), coalesce(h.rows, 0))
            AS weight
        FROM unnest((SELECT lexemes FROM words)) t(lexeme)
        LEFT JOIN holding h ON h.lexeme = t.lexeme
    )"""


def _sets(helds: str = "members") -> str:
    """Each set of the query's lexemes and its text score (`words`): their weights summed, best
    first (the same sum, to the last bit, wherever a set is scored). `helds`: rows of a set
    (`held`) and a lexeme of it each (`lexeme`), by default `members` (`_weights`). One join of
    two relations read once each, not `weights` read again for each set (which the planner
    chose for a lateral join when it thought the sets few)."""
    return (
        "SELECT m.held, sum(w.weight ORDER BY w.weight DESC, w.lexeme) AS words"
        f" FROM {helds} m JOIN weights w ON w.lexeme = m.lexeme GROUP BY m.held"
    )


def _signals(r: Ranking, p: Params, h: str) -> str:
    """A part's columns and cosine, and the query's lexemes it holds (`held`)."""
    cosine = cosine_of(f"{h}.embedding", p(r.vector))
    return f"{h}.event_id, {h}.part, {h}.turn, {h}.created, {cosine} AS cosine, {_held(h)} AS held"


def _ranked_sql(scope: HistoryScope, r: Ranking, p: Params, scored: str) -> str:
    score, found = fusion("hybrid", HYBRID_WEIGHT, None, p)
    return f"""
    {scored}, fused AS (
        SELECT event_id, part, turn, created, {score} AS score FROM scored WHERE {found}
    ), top AS (
        SELECT * FROM fused ORDER BY score DESC, turn DESC, created DESC, event_id DESC, part
        LIMIT {int(r.limit)}
    )
    SELECT {_EVENT}, top.part, top.score, h.text AS part_text, h.tools AS part_tools
    FROM top
    CROSS JOIN LATERAL {_by_key(scope, p, "h.text, h.tools", "top")} h
    CROSS JOIN LATERAL (SELECT {_EVENT} FROM history_events e WHERE {_session(scope, p, "e")}
        AND e.turn = top.turn AND e.event_id = top.event_id LIMIT 1) e
    ORDER BY top.score DESC, top.turn DESC, top.created DESC, top.event_id DESC, top.part
    """


def _by_key(scope: HistoryScope, p: Params, columns: str, k: str) -> str:
    """SQL: the `columns` of the part (`h`) that row `k` names (its turn, event and part), read
    by its key. A lateral subquery, which the planner cannot flatten into a join (LIMIT), and
    its turn, which bounds whichever index it takes: as a join, a session the statistics do not
    count (estimated at one part) was read whole for each row of `k`, however large."""
    return (
        f"(SELECT {columns} FROM history_parts h WHERE {_session(scope, p, 'h')}"
        f" AND h.turn = {k}.turn AND h.event_id = {k}.event_id AND h.part = {k}.part LIMIT 1)"
    )


async def count_parts(conn: asyncpg.Connection, scope: HistoryScope, limit: int) -> int:
    """The parts the scope sees, counted no further than `limit` (index-only, by the session's
    btree)."""
    p = Params()
    return await conn.fetchval(
        "SELECT count(*) FROM (SELECT FROM history_parts h"
        f" WHERE {_visible(scope, p, 'h')} LIMIT {p(limit)})",
        *p.values,
    )


async def ranked_exact(
    conn: asyncpg.Connection, scope: HistoryScope, r: Ranking, at_most: int | None = None
) -> list[Row]:
    """Scores every part the scope sees (read by the session's btree) and fuses. With
    `at_most`, only when the scope sees at most that many parts (counted first, in the same
    statement, no further than one more): otherwise nothing."""
    sql, values = exact_sql(scope, r, at_most)
    return await conn.fetch(sql, *values)


def exact_sql(scope: HistoryScope, r: Ranking, at_most: int | None = None) -> tuple[str, list[Any]]:
    p = Params()
    words = _words(r, p)
    visible = _visible(scope, p, "h")
    size, small = "", ""
    if at_most is not None:
        # An uncorrelated condition: a one-time filter, so a larger session is not scored.
        size = (
            "size AS MATERIALIZED (SELECT count(*) AS n FROM (SELECT FROM history_parts h"
            f" WHERE {visible} LIMIT {p(at_most + 1)})), "
        )
        small = f" AND (SELECT n FROM size) <= {p(at_most)}"
    # The words weighed over the parts scanned; each set of them scored once, not each part.
    scored = f"""
    WITH {words}{size}scanned AS MATERIALIZED (
        SELECT {_signals(r, p, "h")} FROM history_parts h WHERE {visible}{small}
    ), {_weights("scanned")}, sets AS MATERIALIZED ({_sets()}), scored AS MATERIALIZED (
        SELECT s.event_id, s.part, s.turn, s.created, s.cosine, t.words
        FROM scanned s LEFT JOIN sets t ON t.held = s.held
    )"""
    return _ranked_sql(scope, r, p, scored), p.values


async def ranked_index(
    conn: asyncpg.Connection, scope: HistoryScope, r: Ranking, walk: int
) -> list[Row]:
    """A large session: the nearest parts by HNSW (iterative scan under the session filter),
    and the parts sharing a query word among the session's newest `walk` parts (by the
    btree), scored exactly and fused."""
    sql, values = index_sql(scope, r, walk)
    return await conn.fetch(sql, *values)


def index_sql(scope: HistoryScope, r: Ranking, walk: int) -> tuple[str, list[Any]]:
    p = SessionKey(scope)
    visible = _visible(scope, p, "h")
    columns = "h.event_id, h.part, h.turn, h.created, h.embedding, h.tsv"
    # The newest `walk` parts, read from the session index alone (it holds `tsv`): the words
    # are weighed over them (the whole session is not read), and the best `candidates` of them
    # by words are read from the table. Each walked part is kept, `held` NULL where it holds
    # no query word, so that the one read of the index also counts the walk (`counts`).
    walked = (
        f"walked AS MATERIALIZED (SELECT w.event_id, w.part, w.turn, {_held('w')} AS held"
        f" FROM (SELECT h.event_id, h.part, h.turn, h.tsv FROM history_parts h WHERE {visible}"
        f" ORDER BY h.turn DESC LIMIT {int(walk)}) w), "
    )
    sets = f"sets AS MATERIALIZED ({_sets()})"
    # Ties cut as the page orders them (a turn's parts share `created`, its commit's), not in
    # the btree's order: a page is the start of a longer one, and the exact plan's.
    best = (
        "(SELECT w.event_id, w.part, w.turn FROM walked w JOIN sets s ON s.held = w.held"
        f" ORDER BY s.words DESC, w.turn DESC, w.event_id DESC, w.part LIMIT {int(r.candidates)})"
    )
    lists = [
        f"(SELECT {_signals(r, p, 'c')} FROM (SELECT {columns}"
        f" FROM history_parts h WHERE {visible} ORDER BY h.embedding <=> {p(r.vector)}"
        f" LIMIT {int(r.candidates)}) c)",
        f"(SELECT {_signals(r, p, 'h')} FROM {best} k"
        f" CROSS JOIN LATERAL {_by_key(scope, p, columns, 'k')} h)",
    ]
    # A part both lists propose scores the same in each: it is one result, before the limit
    # (taken after it, a page came back short by every part found both ways). Each part's
    # words scored by itself: a part of the nearest may hold a set no walked part holds.
    both = " UNION ALL ".join(lists)
    own = (
        "(SELECT c.held, l.lexeme FROM (SELECT DISTINCT held FROM proposed) c"
        " CROSS JOIN LATERAL unnest(c.held) l(lexeme))"
    )
    scored = f"""WITH {_words(r, p)}{walked}{_weights("walked")},
    {sets}, proposed AS MATERIALIZED (
        SELECT DISTINCT ON (event_id, part) * FROM ({both}) u
    ), own AS MATERIALIZED ({_sets(own)}), scored AS (
        SELECT u.event_id, u.part, u.turn, u.created, u.cosine, o.words
        FROM proposed u LEFT JOIN own o ON o.held = u.held
    )"""
    return _ranked_sql(scope, r, p, scored), p.values


async def read_events(conn: asyncpg.Connection, scope: HistoryScope, ids: list[UUID]) -> list[Row]:
    p = Params()
    return await _events(conn, scope, p, f"e.event_id = any({p(ids)}::uuid[])")


async def read_events_at(
    conn: asyncpg.Connection, account_id: UUID, keys: Sequence[tuple[UUID, str, UUID]]
) -> list[Row]:
    """The events of `keys` (action_id, session_id, event_id) that exist, as an operator reads
    them (read_events of an operator's scope: every turn, live and preview), in one statement
    however many sessions they are of; each row names its agent."""
    return await conn.fetch(
        f"""
        SELECT k.action_id, {_EVENT}
        FROM unnest($2::uuid[], $3::text[], $4::uuid[]) AS k(action_id, session_id, event_id)
        JOIN history_events e ON e.account_id = $1 AND e.action_id = k.action_id
            AND e.session_id = k.session_id AND e.event_id = k.event_id
        """,
        account_id,
        *([k[i] for k in keys] for i in range(3)),
    )


async def list_event_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[UUID, str, tuple[int, int] | None, int]],
) -> list[list[Row]]:
    """Pages of sessions' events in one statement, as an operator reads them (every turn, live
    and preview), each (action_id, session_id, after, limit): in conversation order after a
    (turn, sequence) keyset, at most `limit`."""
    rows = await conn.fetch(
        f"""
        SELECT k.n, e.* FROM unnest($2::uuid[], $3::text[], $4::int[], $5::int[], $6::int[])
            WITH ORDINALITY AS k(action_id, session_id, after_turn, after_sequence, lim, n)
        CROSS JOIN LATERAL (
            SELECT {_EVENT} FROM history_events e
            WHERE e.account_id = $1 AND e.action_id = k.action_id AND e.session_id = k.session_id
              AND (e.turn, e.sequence)
                  > (coalesce(k.after_turn, {_LOWEST}), coalesce(k.after_sequence, {_LOWEST}))
            ORDER BY e.turn, e.sequence
            LIMIT k.lim
        ) e
        ORDER BY k.n, e.turn, e.sequence
        """,
        account_id,
        *page_arrays(pages, keys=2, keyset=2),
    )
    return by_page(rows, len(pages))


# Below every (turn, sequence) keyset: a page asked without `after` starts above it, so that the
# pages share one statement whose keyset is an index condition.
_LOWEST = f"'{INT4_MIN}'::int"


async def _events(
    conn: asyncpg.Connection,
    scope: HistoryScope,
    p: Params,
    condition: str,
    limit: int | None = None,
) -> list[Row]:
    """The events the scope sees that meet `condition` (on `e`, with `p`'s parameters), in
    conversation order."""
    where = f"{_visible(scope, p, 'e')} AND {condition}"
    limited = "" if limit is None else f" LIMIT {p(limit)}"
    return await conn.fetch(
        f"SELECT {_EVENT} FROM history_events e WHERE {where} ORDER BY e.turn, e.sequence{limited}",
        *p.values,
    )


# Events a statement of an erasure deletes, with their parts (eraseSession): a long session is
# erased in statements of this many, each well within ENGRAM_STATEMENT_TIMEOUT_SECONDS.
ERASE_BATCH = 5_000


async def erase(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, session_id: str
) -> int:
    """Deletes the session's history for good: its events, and with them their parts and
    vectors (eraseSession), ERASE_BATCH events a statement in conversation order, inside the
    caller's transaction (all or nothing). Returns how many events went."""
    erased, after, batch = 0, (INT4_MIN, INT4_MIN), ERASE_BATCH
    while True:
        done = await conn.fetchrow(
            """
            WITH batch AS (
                SELECT event_id, turn, sequence FROM history_events
                WHERE account_id = $1 AND action_id = $2 AND session_id = $3
                  AND (turn, sequence) > ($4, $5)
                ORDER BY turn, sequence LIMIT $6),
            gone AS (
                DELETE FROM history_events e USING batch b
                WHERE e.account_id = $1 AND e.action_id = $2 AND e.session_id = $3
                  AND e.event_id = b.event_id)
            SELECT count(*) AS events, max(turn) AS turn,
                   max(sequence) FILTER (WHERE turn = (SELECT max(turn) FROM batch)) AS sequence
            FROM batch
            """,
            account_id,
            action_id,
            session_id,
            *after,
            batch,
        )
        erased += done["events"]
        if done["events"] < batch:
            return erased
        after = (done["turn"], done["sequence"])
