"""SQL for memory records and their versions.

Which rows a reader sees is decided only by `app.memory.visibility`; every read here builds
its WHERE clause from it.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, TypeAlias
from uuid import UUID

import asyncpg
import numpy as np

from app.db.fusion import cosine_of
from app.db.sql import NEWEST, Params, by_page, page_arrays
from app.memory.records import PIN_LINE_EXTRA, MemoryRecord, NewRecord, RecordFields
from app.memory.visibility import (
    AgentReader,
    OperatorPages,
    OperatorReader,
    Reader,
    in_scopes,
    in_session,
    shadows,
    staged_by,
    visible,
)
from app.scope import Scope
from app.text import DISGUISING_SQL, UNQUOTED_SQL

# TypeAlias: asyncpg has no types, and mypy reads a bare `Row = asyncpg.Record` as a variable.
Row: TypeAlias = asyncpg.Record

# Every column of a record as readers get it: MemoryRecord's fields but the search score (not
# the vector, the tsvector or the staging marks).
RECORD_COLUMNS = tuple(f.name for f in fields(MemoryRecord) if f.name != "score")
_COLUMNS = ", ".join(RECORD_COLUMNS)
# The columns a writer gives a new record; the database sets version, times and replaced_by.
NEW_COLUMNS = tuple(f.name for f in fields(RecordFields))
JSON_COLUMNS = ("labels", "metadata")
# The vector of a record's text: named here alone, for the SQL that writes or compares it.
EMBEDDING = "embedding"
EMBEDDING_TYPE = "vector"


def _m(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in RECORD_COLUMNS)


def record(row: Row, *, score: float | None = None) -> MemoryRecord:
    """The record of a row of RECORD_COLUMNS, with a search's `score` (set here, not by a
    `replace` after, which builds the frozen dataclass a second time)."""
    values = {c: row[c] for c in RECORD_COLUMNS}
    values["labels"] = {int(number): value for number, value in row["labels"].items()}
    return MemoryRecord(**values, score=score)


def has_labels(labels: Mapping[int, str], p: Params, m: str = "m", *, by_index: bool = True) -> str:
    """SQL: the record holds these exact label values. `by_index`: found by
    `agent_memories_labels`, a GIN index on the agent's key and the labels of the records that
    have any (migration 0023), whose predicate is repeated so that a plan may use it."""
    held = f"{m}.labels @> {p(labels_json(dict(labels)))}::jsonb"
    return f"{m}.labels <> '{{}}'::jsonb AND {held}" if by_index else held


def labels_json(labels: dict[int, str]) -> dict[str, str]:
    return {str(number): labels[number] for number in sorted(labels)}


def _values(r: RecordFields, columns: Sequence[str], *, json_text: bool) -> list[Any]:
    """The record's values of `columns`, labels keyed by their number as text; JSON as text
    for COPY (binary COPY has no encoder for jsonb)."""
    values = [getattr(r, c) for c in columns]
    for c in JSON_COLUMNS:
        i = columns.index(c)
        value = labels_json(values[i]) if c == "labels" else values[i]
        values[i] = json.dumps(value) if json_text else value
    return values


def _typed(columns: Sequence[str]) -> str:
    """The columns of a load table (`_load_table`) as agent_memories types them."""
    return ", ".join(f"{c}::jsonb" if c in JSON_COLUMNS else c for c in columns)


async def _load_table(conn: asyncpg.Connection, name: str, columns: Sequence[str]) -> None:
    """A temporary table for binary COPY of `columns` (and `ord`, the order rows came in),
    typed as agent_memories' columns, JSON as text. WITH NO DATA only defines the table: no
    query is planned, so agent_memories' many indexes are not locked."""
    loaded = ", ".join(f"{c}::text AS {c}" if c in JSON_COLUMNS else c for c in columns)
    await conn.execute(
        f"CREATE TEMP TABLE {name} ON COMMIT DROP AS "
        f"SELECT 0 AS ord, {loaded} FROM agent_memories WITH NO DATA"
    )


def _with_versions(write: str, then: str = "") -> str:
    """A write to agent_memories (UPDATE or INSERT, RETURNING every record column) that also
    records the rows it writes as versions; the statement returns them, `then` ordering."""
    return f"""
        WITH written AS ({write} RETURNING {_COLUMNS}
        ), versions AS (
            INSERT INTO agent_memory_versions ({_COLUMNS})
            SELECT {_COLUMNS} FROM written
        )
        SELECT {_COLUMNS} FROM written {then}
        """


def _param(column: str) -> str:
    """The parameter of `_STAGE` holding a new record's column."""
    return f"${NEW_COLUMNS.index(column) + 1}"


# One reading of the clock for both times: two calls of clock_timestamp() in a row can fall in
# different microseconds, and a new record's `modified` would then differ from `created`.
_STAGE = f"""
    WITH clock AS (SELECT clock_timestamp() AS now)
    INSERT INTO agent_memories (
        {", ".join(NEW_COLUMNS)},
        {EMBEDDING}, version, created, modified, pending_execution, pending_invocation, tombstone)
    VALUES ({", ".join(_param(c) for c in NEW_COLUMNS)},
            ${len(NEW_COLUMNS) + 1}, 1, (SELECT now FROM clock), (SELECT now FROM clock),
            {_param("execution_id")}, {_param("invocation_number")}, {_param("status")} = 'DELETED')
    RETURNING {_COLUMNS}
    """


async def insert_staged(conn: asyncpg.Connection, new: NewRecord) -> Row:
    """Stages a row that only its own attempt sees until `publish`; a row staged DELETED is a
    tombstone: the deletion of the record it names in `replaces`."""
    return await conn.fetchrow(_STAGE, *_values(new, NEW_COLUMNS, json_text=False), new.embedding)


async def insert_committed(conn: asyncpg.Connection, rows: Sequence[NewRecord]) -> list[Row]:
    """Writes new records of one agent as committed rows, each with its version 1, inside the
    caller's transaction, without staging them (a bulk write: nobody reads them before).

    Loaded by binary COPY into a temporary table, then moved by one INSERT; each row's
    `created` and `modified` are one reading of the clock, taken in the given order."""
    if not rows:
        return []
    columns = [*NEW_COLUMNS, EMBEDDING]
    await _load_table(conn, "memory_load", columns)
    await conn.copy_records_to_table(
        "memory_load",
        records=[
            (i, *_values(r, NEW_COLUMNS, json_text=True), r.embedding) for i, r in enumerate(rows)
        ],
        columns=["ord", *columns],
    )
    # A volatile call in the select list of a sorted query runs after the sort: in order.
    inserted = await conn.fetch(
        _with_versions(
            f"""
            INSERT INTO agent_memories ({", ".join(columns)}, version, created, modified, tombstone)
            SELECT {_typed(columns)}, 1, now, now, false
            FROM (SELECT l.*, clock_timestamp() AS now FROM memory_load l ORDER BY l.ord) timed
            """,
            "ORDER BY created, memory_id",
        )
    )
    await conn.execute("DROP TABLE memory_load")
    return inserted


async def get_visible(
    conn: asyncpg.Connection, reader: Reader, memory_id: UUID, *, for_update: bool = False
) -> Row | None:
    """One record the reader sees, whatever its status."""
    p = Params()
    where = visible(reader, p, "m", any_status=True)
    lock = "FOR UPDATE" if for_update else ""
    where += f" AND m.memory_id = {p(memory_id)}"
    return await conn.fetchrow(
        f"SELECT {_m('m')} FROM agent_memories m WHERE {where} {lock}", *p.values
    )


async def get_visible_many(
    conn: asyncpg.Connection, account_id: UUID, keys: Sequence[tuple[UUID, UUID]]
) -> list[Row]:
    """The records of `keys` (action_id, memory_id) an operator sees, whatever their status, in
    one statement (get_visible, for several agents' records)."""
    p = Params()
    asked = f"unnest({p([k[0] for k in keys])}::uuid[], {p([k[1] for k in keys])}::uuid[])"
    where = visible(OperatorPages(account_id, "k.action_id"), p, "m", any_status=True)
    return await conn.fetch(
        f"""
        SELECT {_m("m")} FROM {asked} AS k(action_id, memory_id)
        JOIN agent_memories m ON m.memory_id = k.memory_id AND {where}
        """,
        *p.values,
    )


async def get_shadow(conn: asyncpg.Connection, reader: AgentReader, memory_id: UUID) -> Row | None:
    """The row that hides `memory_id` from the reader, if any: its own staged replacement or
    deletion first, else (for a preview reader) the newest preview record naming it. Its
    `tombstone` tells a deletion from a replacement, which may itself be deleted since."""
    p = Params(reader.account_id, reader.action_id, memory_id)
    return await conn.fetchrow(
        f"""
        SELECT {_m("r")}, r.tombstone FROM agent_memories r
        WHERE r.account_id = $1 AND r.action_id = $2 AND r.replaces = $3
          AND {shadows(reader, p, "r")}
        ORDER BY r.pending_execution IS NULL, r.created DESC, r.memory_id DESC
        LIMIT 1
        """,
        *p.values,
    )


async def list_pinned(conn: asyncpg.Connection, reader: Reader) -> list[Row]:
    """The pinned records the reader sees, oldest first."""
    p = Params()
    where = visible(reader, p, "m")
    return await conn.fetch(
        f"SELECT {_m('m')} FROM agent_memories m WHERE {where} AND m.pinned "
        "ORDER BY m.created, m.memory_id",
        *p.values,
    )


def _listed_in_session(account_id: UUID, action_id: UUID, preview: bool, p: Params) -> str:
    """SQL: row `m` is a committed pinned session-scope record that a turn of its session lists,
    live or preview (`preview`): what an agent-scope pin joins in that session's turns."""
    turn = AgentReader(account_id, action_id, None, (Scope.SESSION,), preview)
    where = visible(turn, p, "m", scope="m.scope = 'SESSION'")
    return where + " AND m.pinned AND m.pending_execution IS NULL"


def _line_length(p: Params) -> str:
    """SQL: the characters row `m` adds to a pinned list (`pin_line`: its summary a JSON string
    stripped as `for_model` strips it, each character `model_json` escapes six (\\uXXXX), with
    its ID, and the line break before the next)."""
    stripped = f"regexp_replace(m.summary, {p(DISGUISING_SQL)}, '', 'g')"
    escaped = f"regexp_replace({stripped}, {p(UNQUOTED_SQL)}, 'uXXXX.', 'g')"
    return f"length(to_json({escaped})::text) + {PIN_LINE_EXTRA}"


async def other_sessions_pins(
    conn: asyncpg.Connection, reader: AgentReader, named: Sequence[str], most: int = 3
) -> list[Row]:
    """The committed pinned session-scope records of the `most` sessions with the longest
    pinned lists but those `named`, as a turn of the reader's mode (live, or preview) sees
    them: what an agent-scope pin joins in those sessions' turns. Longest as the lists are
    listed, so the longest is among them; the caller counts them exactly.

    The sessions are read from the lengths `count_pinned_lists` keeps (migration 0030), longest
    first by an index: the statement reads `most` entries and those sessions' pins, whatever
    the number of sessions."""
    p = Params()
    where = _listed_in_session(reader.account_id, reader.action_id, reader.preview, p)
    length = "preview_length" if reader.preview else "live_length"
    return await conn.fetch(
        f"""
        WITH longest AS (
            SELECT l.session_id FROM pinned_lists l
            WHERE l.account_id = {p(reader.account_id)} AND l.action_id = {p(reader.action_id)}
              AND l.{length} > 0 AND l.session_id <> ALL({p(list(named))}::text[])
            ORDER BY l.{length} DESC, l.session_id DESC LIMIT {p(most)}
        )
        SELECT {_m("m")} FROM agent_memories m JOIN longest l ON l.session_id = m.session_id
        WHERE {where} ORDER BY m.created, m.memory_id
        """,
        *p.values,
    )


# The sessions of an agent's pinned session-scope records, as rows to lock in `pinned_lists`.
_PINNED_SESSIONS = """
    SELECT DISTINCT m.session_id FROM agent_memories m
    WHERE m.account_id = $1 AND m.action_id = $2 AND m.scope = 'SESSION' AND m.pinned
      AND m.session_id IS NOT NULL
    """


async def count_pinned_lists(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    memory_ids: Sequence[UUID] | None,
) -> None:
    """Counts again the pinned lists (`pinned_lists`, migration 0030) of the sessions of these
    records, pinned and of session scope (None: of every session of the agent), as
    `other_sessions_pins` ranks them: in the writing transaction, after every write of it that
    adds, removes, replaces or hides such a record, and before the pin lock (`lock_pins`).
    Pass the records written, and those a preview record replaces (which preview turns no
    longer list).

    Each session's row is locked first (in session order: writers of several sessions wait
    for each other, never in a cycle), then counted by a statement of its own, whose snapshot
    holds whatever the writers that held the lock before committed: the last writer to commit
    counted every write before its own."""
    if memory_ids is None:
        chosen = f"""
            {_PINNED_SESSIONS}
            UNION SELECT session_id FROM pinned_lists WHERE account_id = $1 AND action_id = $2
            """
        values: list[Any] = [account_id, action_id]
    else:
        chosen = _PINNED_SESSIONS + " AND m.memory_id = any($3::uuid[])"
        values = [account_id, action_id, list(memory_ids)]
    locked = await conn.fetch(
        f"""
        INSERT INTO pinned_lists AS l (account_id, action_id, session_id, live_length,
            preview_length)
        SELECT $1, $2, s.session_id, 0, 0 FROM ({chosen}) s ORDER BY s.session_id
        ON CONFLICT (account_id, action_id, session_id) DO UPDATE SET live_length = l.live_length
        RETURNING l.session_id
        """,
        *values,
    )
    if not locked:
        return
    p = Params(account_id, action_id, [r["session_id"] for r in locked])
    live = _listed_in_session(account_id, action_id, False, p)
    preview = _listed_in_session(account_id, action_id, True, p)
    length = _line_length(p)
    await conn.execute(
        f"""
        WITH counted AS (
            SELECT s.session_id,
                (SELECT coalesce(sum({length}), 0) FROM agent_memories m
                 WHERE {live} AND m.session_id = s.session_id) AS live,
                (SELECT coalesce(sum({length}), 0) FROM agent_memories m
                 WHERE {preview} AND m.session_id = s.session_id) AS preview
            FROM unnest($3::text[]) s(session_id)
        ), emptied AS (
            DELETE FROM pinned_lists l USING counted c
            WHERE l.account_id = $1 AND l.action_id = $2 AND l.session_id = any($3::text[])
              AND l.session_id = c.session_id AND c.live = 0 AND c.preview = 0
        )
        UPDATE pinned_lists l SET live_length = c.live, preview_length = c.preview
        FROM counted c
        WHERE l.account_id = $1 AND l.action_id = $2 AND l.session_id = any($3::text[])
          AND l.session_id = c.session_id AND (c.live > 0 OR c.preview > 0)
        """,
        *p.values,
    )


@dataclass(frozen=True)
class ListFilters:
    """Optional filters of an operator's listing; None: no filter on that field."""

    kind: str | None = None
    labels: dict[int, str] | None = None  # label number -> exact value
    scope: str | None = None
    preview: bool | None = None
    statuses: Sequence[str] | None = None  # None: the spec's listing (live records)
    session_id: str | None = None  # the session-scope records of this session


async def list_page(
    conn: asyncpg.Connection,
    reader: Reader,
    *,
    after: tuple[datetime, UUID] | None,
    limit: int,
    ascending: bool,
    filters: ListFilters | None = None,
) -> list[Row]:
    """A page of the records the reader lists, by (created, memory_id), after a keyset."""
    f = filters or ListFilters()
    sql, values = _page(reader, after, limit, ascending, f)
    return await _listed(conn, sql, values, filtered=f != ListFilters())


async def list_pages_apart(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[UUID, tuple[datetime, UUID] | None, int, bool, ListFilters]],
) -> list[list[Row]]:
    """Pages of several agents' filtered listings, each (action_id, after, limit, ascending,
    filters) read as list_page reads it for an operator, a statement each, planned for its own
    values, in one transaction."""
    found = []
    async with conn.transaction():
        await conn.execute(_PLANNED_FOR_VALUES)
        for action_id, after, limit, ascending, filters in pages:
            reader = OperatorReader(account_id, action_id)
            sql, values = _page(reader, after, limit, ascending, filters)
            found.append(await conn.fetch(sql, *values))
    return found


def _page(
    reader: Reader,
    after: tuple[datetime, UUID] | None,
    limit: int,
    ascending: bool,
    f: ListFilters,
) -> tuple[str, list[Any]]:
    """list_page's statement and its values."""
    p = Params()
    where = _narrowed(visible(reader, p, "m", any_status=f.statuses is not None), f, p)
    if after is not None:
        keyset = f"({p(after[0])}::timestamptz, {p(after[1])}::uuid)"
        where += f" AND (m.created, m.memory_id) {'>' if ascending else '<'} {keyset}"
    order = "ASC" if ascending else "DESC"
    sql = (
        f"SELECT {_m('m')} FROM agent_memories m WHERE {where} "
        f"ORDER BY m.created {order}, m.memory_id {order} LIMIT {p(limit)}"
    )
    return sql, p.values


# A filtered listing is planned for its values each time. How many records a label, kind or
# status holds decides between walking the agent by time and reading the few that match; the
# plan a prepared statement caches (generic, from its sixth run on a connection) chose one for
# every value: 175-225 ms at 200,000 records for a rare label or a common one, 10-15 ms planned
# for each (bench/README.md, "Thirty-fifth session").
_PLANNED_FOR_VALUES = "SET LOCAL plan_cache_mode = force_custom_plan"


# Beyond every (created, memory_id) keyset, oldest first (True) or newest first: a page asked
# without `after` starts there, so that the pages of one statement share a keyset that is an
# index condition.
_BEYOND = {
    True: ("'-infinity'", "'00000000-0000-0000-0000-000000000000'"),
    False: NEWEST,
}


async def list_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    pages: Sequence[tuple[UUID, tuple[datetime, UUID] | None, int]],
    *,
    ascending: bool,
    filters: ListFilters | None = None,
) -> list[list[Row]]:
    """Pages of several agents' listings in one statement, each (action_id, after, limit) read
    as list_page reads it for an operator, all in the same order with the same filters (none
    by label: a label's number is its agent's)."""
    f = filters or ListFilters()
    assert not f.labels, "a page filtered by labels is its agent's own (list_page)"
    p = Params()
    action_ids, after_created, after_ids, limits = page_arrays(pages, keys=1, keyset=2)
    asked = (
        f"unnest({p(action_ids)}::uuid[], {p(after_created)}::timestamptz[], "
        f"{p(after_ids)}::uuid[], {p(limits)}::int[])"
    )
    reader = OperatorPages(account_id, "k.action_id")
    where = _narrowed(visible(reader, p, "m", any_status=f.statuses is not None), f, p)
    created, memory_id = _BEYOND[ascending]
    where += (
        f" AND (m.created, m.memory_id) {'>' if ascending else '<'} "
        f"(coalesce(k.after_created, {created}), coalesce(k.after_id, {memory_id}))"
    )
    order = "ASC" if ascending else "DESC"
    sql = f"""
        SELECT k.n, m.* FROM {asked}
            WITH ORDINALITY AS k(action_id, after_created, after_id, lim, n)
        CROSS JOIN LATERAL (
            SELECT {_m("m")} FROM agent_memories m WHERE {where}
            ORDER BY m.created {order}, m.memory_id {order}
            LIMIT k.lim
        ) m
        ORDER BY k.n, m.created {order}, m.memory_id {order}
        """
    rows = await _listed(conn, sql, p.values, filtered=f != ListFilters())
    return by_page(rows, len(pages))


async def _listed(
    conn: asyncpg.Connection, sql: str, values: list[Any], *, filtered: bool
) -> list[Row]:
    if not filtered:
        return await conn.fetch(sql, *values)
    async with conn.transaction():
        await conn.execute(_PLANNED_FOR_VALUES)
        return await conn.fetch(sql, *values)


def _narrowed(where: str, f: ListFilters, p: Params) -> str:
    """`where`, and the listing's filters."""
    if f.statuses is not None:
        where += f" AND m.status = any({p(list(f.statuses))}::text[])"
    if f.kind is not None:
        where += f" AND m.kind = {p(f.kind)}"
    if f.scope is not None:
        where += f" AND m.scope = {p(f.scope)}"
    if f.preview is not None:
        where += f" AND m.preview = {p(f.preview)}"
    if f.labels:
        where += f" AND {has_labels(f.labels, p)}"
    if f.session_id is not None:
        where += f" AND {in_session(f.session_id, p)}"
    return where


async def get_version(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, memory_id: UUID, version: int
) -> Row | None:
    return await conn.fetchrow(
        f"""
        SELECT {_COLUMNS} FROM agent_memory_versions
        WHERE account_id = $1 AND action_id = $2 AND memory_id = $3 AND version = $4
        """,
        account_id,
        action_id,
        memory_id,
        version,
    )


async def get_versions(
    conn: asyncpg.Connection, account_id: UUID, keys: Sequence[tuple[UUID, UUID, int]]
) -> list[Row]:
    """The versions of `keys` (action_id, memory_id, version) that exist, in one statement."""
    return await conn.fetch(
        f"""
        SELECT {_COLUMNS} FROM agent_memory_versions
        JOIN unnest($2::uuid[], $3::uuid[], $4::int[]) AS k(action_id, memory_id, version)
            USING (action_id, memory_id, version)
        WHERE account_id = $1
        """,
        account_id,
        *([k[i] for k in keys] for i in range(3)),
    )


async def visible_ids(
    conn: asyncpg.Connection, reader: Reader, memory_ids: list[UUID]
) -> set[UUID]:
    """Which of the records the reader sees, whatever their status."""
    p = Params()
    where = visible(reader, p, "m", any_status=True)
    where += f" AND m.memory_id = any({p(memory_ids)}::uuid[])"
    rows = await conn.fetch(f"SELECT m.memory_id FROM agent_memories m WHERE {where}", *p.values)
    return {r["memory_id"] for r in rows}


async def list_version_pages(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    pages: Sequence[tuple[UUID, int | None, int]],
) -> list[list[Row]]:
    """Pages of versions of an agent's records in one statement, each (memory_id, before,
    limit): the record's versions newest first, below version `before` (None: from the
    newest), at most `limit`."""
    rows = await conn.fetch(
        f"""
        SELECT k.n, v.* FROM unnest($3::uuid[], $4::int[], $5::int[])
            WITH ORDINALITY AS k(memory_id, before, lim, n)
        CROSS JOIN LATERAL (
            SELECT {_COLUMNS} FROM agent_memory_versions
            WHERE account_id = $1 AND action_id = $2 AND memory_id = k.memory_id
              -- Without `before`, above every version: the bound stays an index condition.
              AND version < coalesce(k.before::bigint, 2147483648)
            ORDER BY version DESC
            LIMIT k.lim
        ) v
        ORDER BY k.n, v.version DESC
        """,
        account_id,
        action_id,
        *page_arrays(pages, keys=1),
    )
    return by_page(rows, len(pages))


async def publish(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    memory_ids: Sequence[UUID],
) -> list[Row]:
    """Commits staged rows: every reader may now see them; each one's version 1 is recorded."""
    return await conn.fetch(
        _with_versions(
            """
            UPDATE agent_memories SET pending_execution = NULL, pending_invocation = NULL
            WHERE account_id = $1 AND action_id = $2 AND memory_id = any($4::uuid[])
              AND pending_execution = $3
            """,
            "ORDER BY created, memory_id",
        ),
        account_id,
        action_id,
        execution_id,
        list(memory_ids),
    )


# The columns `change_status` writes in a record's next version: every other column of a
# record is the same in each of its versions (`engram import` refuses a file where it is not).
CHANGED_BY_A_VERSION = ("status", "replaced_by", "modified_by", "version", "modified")
KEPT_ACROSS_VERSIONS = tuple(
    c
    for c in RECORD_COLUMNS
    if c not in CHANGED_BY_A_VERSION and c not in ("account_id", "action_id", "memory_id")
)


async def change_status(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    memory_id: UUID,
    *,
    expected_version: int,
    status: str,
    replaced_by: UUID | None,
    modified_by: str,
) -> Row | None:
    """Writes the next version of a committed, active record, if it is still at the version
    the writer read; None when it changed meanwhile (the caller reports the conflict). Its
    `modified` never before the last (a clock stepped back meanwhile): history reads in order,
    and `engram import` refuses a version modified before the record was created."""
    return await conn.fetchrow(
        _with_versions(
            """
            UPDATE agent_memories
            SET status = $5, replaced_by = $6, modified_by = $7,
                version = version + 1, modified = greatest(clock_timestamp(), modified)
            WHERE account_id = $1 AND action_id = $2 AND memory_id = $3 AND version = $4
              AND status = 'ACTIVE' AND pending_execution IS NULL
            """
        ),
        account_id,
        action_id,
        memory_id,
        expected_version,
        status,
        replaced_by,
        modified_by,
    )


async def lock_unchanged(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, memory_id: UUID, version: int
) -> bool:
    """Locks a committed, active record still at `version` until the transaction ends."""
    found = await conn.fetchval(
        """
        SELECT true FROM agent_memories
        WHERE account_id = $1 AND action_id = $2 AND memory_id = $3 AND version = $4
          AND status = 'ACTIVE' AND pending_execution IS NULL
        FOR UPDATE
        """,
        account_id,
        action_id,
        memory_id,
        version,
    )
    return bool(found)


async def lock_pins(conn: asyncpg.Connection, account_id: UUID, action_id: UUID) -> None:
    """Serializes, per agent, the commits that add pins, so each checks the budget it ends at."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('engram.pins:' || $1 || ':' || $2, 0))",
        str(account_id),
        str(action_id),
    )


async def delete_staged(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    execution_id: UUID,
    memory_ids: Sequence[UUID] | None = None,
    *,
    through_invocation: int | None = None,
    invocation: int | None = None,
    keep: Sequence[UUID] = (),
) -> int:
    """Removes staged rows of an execution (all of them, or those of `memory_ids`) but those
    of `keep`; with `through_invocation`, only those its attempts up to that one staged (a
    later attempt, a retry started meanwhile, keeps its own); with `invocation`, only that
    attempt's."""
    status = await conn.execute(
        """
        DELETE FROM agent_memories
        WHERE account_id = $1 AND action_id = $2 AND pending_execution = $3
          AND ($4::uuid[] IS NULL OR memory_id = any($4::uuid[]))
          AND ($5::integer IS NULL OR pending_invocation <= $5)
          AND ($6::integer IS NULL OR pending_invocation = $6)
          AND NOT memory_id = any($7::uuid[])
        """,
        account_id,
        action_id,
        execution_id,
        list(memory_ids) if memory_ids is not None else None,
        through_invocation,
        invocation,
        list(keep),
    )
    return int(status.split()[-1])


async def delete_earlier_attempts(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, execution_id: UUID, invocation: int
) -> None:
    """Removes what earlier, failed attempts of an execution staged and never committed."""
    await conn.execute(
        """
        DELETE FROM agent_memories
        WHERE account_id = $1 AND action_id = $2 AND pending_execution = $3
          AND pending_invocation < $4
        """,
        account_id,
        action_id,
        execution_id,
        invocation,
    )


async def copy_committed(
    conn: asyncpg.Connection,
    records: Iterable[MemoryRecord],
    embeddings: Iterable[np.ndarray | None],
) -> int:
    """Bulk-loads committed records, as given (versions, times), with their version rows, by
    COPY, and counts their agents' pinned lists again. For benchmarks' and tests' loads (an
    import writes its rows through app/transfer/store.py): no rule is checked here."""
    columns = [*RECORD_COLUMNS, EMBEDDING]
    records = list(records)
    rows = [
        (i, *_values(r, RECORD_COLUMNS, json_text=True), vector)
        for i, (r, vector) in enumerate(zip(records, embeddings, strict=True))
    ]
    async with conn.transaction():
        await _load_table(conn, "agent_memories_load", columns)
        await conn.copy_records_to_table(
            "agent_memories_load", records=rows, columns=["ord", *columns]
        )
        await conn.execute(
            f"""
            INSERT INTO agent_memories ({", ".join(columns)})
            SELECT {_typed(columns)} FROM agent_memories_load
            """
        )
        await conn.execute(
            f"""
            INSERT INTO agent_memory_versions ({_COLUMNS})
            SELECT {_typed(RECORD_COLUMNS)} FROM agent_memories_load
            """
        )
        await conn.execute("DROP TABLE agent_memories_load")
        for account_id, action_id in sorted({(r.account_id, r.action_id) for r in records}):
            await count_pinned_lists(conn, account_id, action_id, None)
    return len(rows)


async def summaries_known(
    conn: asyncpg.Connection, reader: Reader, summaries: Sequence[str]
) -> list[int]:
    """The positions (from 0) of the summaries whose normalised form (`memory_summary_key`,
    migration 0009) equals that of a record the reader sees."""
    p = Params()
    where = visible(reader, p, "m")
    rows = await conn.fetch(
        f"""
        SELECT DISTINCT c.i - 1 AS i FROM unnest({p(list(summaries))}::text[])
            WITH ORDINALITY c(summary, i)
        WHERE EXISTS (
            SELECT 1 FROM agent_memories m
            WHERE {where} AND memory_summary_key(m.summary) = memory_summary_key(c.summary)
        )
        ORDER BY 1
        """,
        *p.values,
    )
    return [r["i"] for r in rows]


async def restated_staged(
    conn: asyncpg.Connection, reader: AgentReader, memory_ids: Sequence[UUID]
) -> list[UUID]:
    """Of the given rows the reader's attempt staged, those whose summary (normalised, as
    `summaries_known` compares) a committed record the reader sees, or one of the row's own
    scope (which its writer may not read), already says. Locks those
    summaries for the agent first, until the caller's transaction ends (in one order, so two
    commits never deadlock: the locks' own 64-bit keys, sorted, so that even two summaries
    whose keys collide take their locks in the one order): of two commits adding the same
    summary at once, the second finds the first's record."""
    if not memory_ids:
        return []
    p = Params()
    staged = (
        f"s.account_id = {p(reader.account_id)} AND s.action_id = {p(reader.action_id)}"
        f" AND s.memory_id = any({p(list(memory_ids))}::uuid[]) AND {staged_by(reader, p, 's')}"
    )
    await conn.execute(
        f"""
        SELECT count(pg_advisory_xact_lock(k)) FROM (
            SELECT DISTINCT hashtextextended('engram.summary:' || s.account_id || ':'
                || s.action_id || ':' || memory_summary_key(s.summary), 0) AS k
            FROM agent_memories s WHERE {staged} ORDER BY 1) keys
        """,
        *p.values,
    )
    # Every scope as the reader would see it, then those it reads or the staged row's own.
    where = visible(replace(reader, scopes=tuple(Scope)), p, "m")
    where += f" AND (m.scope = s.scope OR {in_scopes(reader, p, 'm')})"
    return [
        r["memory_id"]
        for r in await conn.fetch(
            f"""
            SELECT s.memory_id FROM agent_memories s WHERE {staged} AND EXISTS (
                SELECT 1 FROM agent_memories m
                WHERE {where} AND m.pending_execution IS NULL
                  AND memory_summary_key(m.summary) = memory_summary_key(s.summary))
            """,
            *p.values,
        )
    ]


async def stemmed_words(conn: asyncpg.Connection, texts: list[str]) -> list[set[str]]:
    """Each text's stemmed words, as a record's `tsv` holds them (to_tsvector('english'))."""
    rows = await conn.fetch(
        """
        SELECT tsvector_to_array(to_tsvector('english', t)) AS words
        FROM unnest($1::text[]) WITH ORDINALITY u(t, i) ORDER BY i
        """,
        texts,
    )
    return [set(r["words"]) for r in rows]


async def similarities(
    conn: asyncpg.Connection,
    account_id: UUID,
    action_id: UUID,
    memory_ids: Sequence[UUID],
    text: str,
    vector: np.ndarray | None,
) -> dict[UUID, float]:
    """How like `text` each record is: the larger of its embedding's cosine to `vector` and
    the share of the text's stemmed words (to_tsvector) that the record has."""
    rows = await conn.fetch(
        f"""
        WITH q AS (SELECT tsvector_to_array(to_tsvector('english', $4)) AS words)
        SELECT m.memory_id, greatest(
            CASE WHEN $5::{EMBEDDING_TYPE} IS NOT NULL AND m.{EMBEDDING} IS NOT NULL
                THEN {cosine_of(f"m.{EMBEDDING}", f"$5::{EMBEDDING_TYPE}")} END,
            (SELECT count(*) FILTER (WHERE w = any(tsvector_to_array(m.tsv)))::float8
                    / greatest(count(*), 1)
             FROM q, unnest(q.words) w)
        ) AS similarity
        FROM agent_memories m
        WHERE m.account_id = $1 AND m.action_id = $2 AND m.memory_id = any($3::uuid[])
        """,
        account_id,
        action_id,
        list(memory_ids),
        text,
        vector,
    )
    return {r["memory_id"]: float(r["similarity"] or 0) for r in rows}
