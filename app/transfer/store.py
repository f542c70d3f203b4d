"""SQL of `engram export` and `engram import`: an agent's rows, table by table, as JSON.

Rows travel as the JSON of the row (`to_jsonb`) without `account_id` (an account is a
deployment's own) and without generated columns; an import writes them back with
`jsonb_populate_recordset`, so every column keeps its exact value (times to the microsecond,
vectors as their text). Table and column names here come from `TABLES` and the catalog,
never from a file.
"""

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from app.db.pool import session_changed
from app.text import escaped


@dataclass(frozen=True)
class Table:
    name: str
    kind: str  # the `type` of its lines in an export
    key: tuple[str, ...]  # its primary key after account_id
    # Which of the agent's rows are exported: a condition on `t` with $1 account, $2 action,
    # which may read the temporary tables of `note_named`.
    where: str
    # The order of its rows: columns an index holds after (account_id, action_id), so that
    # each page is read from where the one before stopped rather than after a sort of them all.
    order: tuple[str, ...]
    # Columns never exported: the staging marks of a running turn, derived data.
    skip: tuple[str, ...] = ()


# In the order an import writes them: what a row refers to comes first.
TABLES: tuple[Table, ...] = (
    Table("actions", "action", ("action_id",), "true", ("action_id",)),
    Table("action_versions", "action_version", ("action_id", "version"), "true", ("version",)),
    Table(
        "sessions",
        "session",
        ("action_id", "session_id"),
        "t.session_id IN (SELECT session_id FROM export_sessions)",
        ("session_id",),
    ),
    Table(
        "executions",
        "execution",
        ("action_id", "execution_id"),
        "t.execution_id IN (SELECT execution_id FROM export_executions)",
        ("created", "execution_id"),
        # A token is its deployment's and its account's: imported elsewhere, it would name
        # another account's client (the operator's, from the default account).
        skip=("token_id",),
    ),
    Table(
        "transcript_events",
        "transcript_event",
        ("action_id", "execution_id", "sequence"),
        "t.execution_id IN (SELECT execution_id FROM export_executions)",
        ("execution_id", "sequence"),
    ),
    Table(
        "agent_memory_versions",
        "memory_version",
        ("action_id", "memory_id", "version"),
        "true",
        ("memory_id", "version"),  # its primary key: no index holds versions by time
    ),
    Table(
        "agent_memories",
        "memory",
        ("action_id", "memory_id"),
        "t.pending_execution IS NULL",
        ("created", "memory_id"),
        skip=("pending_execution", "pending_invocation"),
    ),
)
BY_KIND = {t.kind: t for t in TABLES}
# The vector column of every table that has one, compared by neither side of an import.
VECTOR_COLUMN = "embedding"


async def columns(conn: asyncpg.Connection, table: str) -> dict[str, str]:
    """The columns a row of `table` can be written with (not generated, not dropped), in
    order, with their types as PostgreSQL names them (`integer`, `timestamp with time zone`)."""
    rows = await conn.fetch(
        """
        SELECT attname, format_type(atttypid, NULL) AS type FROM pg_attribute
        WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
        ORDER BY attnum
        """,
        table,
    )
    return {r["attname"]: r["type"] for r in rows}


def _exported(table: Table, all_columns: Iterable[str], embeddings: bool) -> list[str]:
    skip = {"account_id", *table.skip}
    if not embeddings:
        skip.add(VECTOR_COLUMN)
    return [c for c in all_columns if c not in skip]


async def note_named(conn: asyncpg.Connection, account_id: UUID, action_id: UUID) -> None:
    """Notes the executions and sessions the agent's records name (every version of every
    record) in temporary tables that `TABLES` read, once per export rather than once per
    statement, then makes the transaction read-only. Call first in a repeatable-read
    transaction; the tables go with it."""
    # Temporary tables belong to the session (its temporary schema stays): reset on release.
    session_changed(conn)
    await conn.execute(
        """
        CREATE TEMPORARY TABLE export_executions (execution_id uuid PRIMARY KEY) ON COMMIT DROP;
        CREATE TEMPORARY TABLE export_sessions (session_id text PRIMARY KEY) ON COMMIT DROP;
        SET TRANSACTION READ ONLY;
        """
    )
    await conn.execute(
        """
        INSERT INTO export_executions
        SELECT v.execution_id FROM agent_memory_versions v
        WHERE v.account_id = $1 AND v.action_id = $2
        UNION
        SELECT m.execution_id FROM agent_memories m
        WHERE m.account_id = $1 AND m.action_id = $2 AND m.pending_execution IS NULL
        """,
        account_id,
        action_id,
    )
    await conn.execute(
        """
        INSERT INTO export_sessions
        SELECT v.session_id FROM agent_memory_versions v
        WHERE v.account_id = $1 AND v.action_id = $2 AND v.session_id IS NOT NULL
        UNION
        SELECT e.session_id FROM executions e
        WHERE e.account_id = $1 AND e.action_id = $2 AND e.session_id IS NOT NULL
          AND e.execution_id IN (SELECT execution_id FROM export_executions)
        """,
        account_id,
        action_id,
    )
    # Their sizes, for the plans that read them (autovacuum never sees a temporary table).
    await conn.execute("ANALYZE export_executions, export_sessions")


async def count(conn: asyncpg.Connection, table: Table, account_id: UUID, action_id: UUID) -> int:
    return await conn.fetchval(
        f"SELECT count(*) FROM {table.name} t "
        f"WHERE t.account_id = $1 AND t.action_id = $2 AND {table.where}",
        account_id,
        action_id,
    )


async def export_rows(
    conn: asyncpg.Connection,
    table: Table,
    account_id: UUID,
    action_id: UUID,
    *,
    embeddings: bool,
    batch: int = 1000,
) -> AsyncIterator[str]:
    """The agent's rows of `table` as JSON text, in its `order`, a page of `batch` at a time,
    each after the last row of the one before; call after `note_named`, in its transaction
    (every page then reads the same snapshot)."""
    wanted = _exported(table, await columns(conn, table.name), embeddings)
    pairs = ", ".join(f"'{c}', t.{c}" for c in wanted)
    order = ", ".join(f"t.{c}" for c in table.order)
    last = ", ".join(f"${n}" for n in range(3, 3 + len(table.order)))
    # jsonb_build_object has a 100-argument limit; these tables have fewer than 50 columns.
    rows = (
        f"SELECT jsonb_build_object({pairs})::text AS row, {order} FROM {table.name} t "
        f"WHERE t.account_id = $1 AND t.action_id = $2 AND {table.where}"
    )
    first = f"{rows} ORDER BY {order} LIMIT {batch}"
    after = f"{rows} AND ({order}) > ({last}) ORDER BY {order} LIMIT {batch}"
    page = await conn.fetch(first, account_id, action_id)
    while page:
        for record in page:
            yield record["row"]
        if len(page) < batch:
            return
        page = await conn.fetch(after, account_id, action_id, *(page[-1][c] for c in table.order))


@dataclass(frozen=True)
class Written:
    inserted: int
    present: int  # already there with the same content
    # Records' rows: the first whose current version has no row in the account (a file cut
    # short or edited: every write records its version), or None.
    unversioned: UUID | None = None


class Differs(Exception):
    """A row of the import exists in the account with other content."""

    def __init__(self, table: Table, key: dict[str, object]) -> None:
        super().__init__(table.name)
        self.table = table
        self.key = key


async def write_rows(
    conn: asyncpg.Connection,
    table: Table,
    account_id: UUID,
    rows_json: str,
    rows: int,
    row_columns: Sequence[str],
) -> Written:
    """Writes rows (a JSON array of objects with `row_columns`) into the account: new ones are
    inserted, identical ones skipped; Differs when one exists with other content (the caller's
    transaction then rolls back). The vector column is never compared (a re-embedding may
    differ in the last bits).

    Inserted first, compared after, by a statement of its own: a row another writer inserted
    meanwhile (a turn's session, started on the agent the import already wrote), which the
    insert waited for and skipped, is then compared too. Compared first, it was not there yet,
    and was skipped as if it were the file's. When the insert wrote every row, none was there
    to differ: the comparison is left out (a new agent's import pays for the insert alone).

    Records' rows (`agent_memories`) are also looked up among the account's versions, by the
    same statement (the JSON read once): `Written.unversioned`."""
    columns_sql = ", ".join(row_columns)
    incoming = f"jsonb_populate_recordset(NULL::{table.name}, $2::text::jsonb)"
    insert = f"""
        INSERT INTO {table.name} (account_id, {columns_sql})
        SELECT $1, {", ".join(f"i.{c}" for c in row_columns)} FROM {{}} i
        ON CONFLICT (account_id, {", ".join(table.key)}) DO NOTHING
        """
    unversioned = None
    if table.name == "agent_memories":
        written = await conn.fetchrow(
            f"""
            WITH i AS MATERIALIZED (SELECT * FROM {incoming}),
            written AS ({insert.format("i")} RETURNING 1)
            SELECT (SELECT count(*) FROM written) AS inserted, (
                SELECT i.memory_id FROM i
                WHERE NOT EXISTS (
                    SELECT FROM agent_memory_versions v
                    WHERE v.account_id = $1 AND v.action_id = i.action_id
                      AND v.memory_id = i.memory_id AND v.version = i.version)
                LIMIT 1) AS unversioned
            """,
            account_id,
            rows_json,
        )
        inserted, unversioned = written["inserted"], written["unversioned"]
    else:
        status = await conn.execute(insert.format(incoming), account_id, rows_json)
        inserted = int(status.split()[-1])
    if inserted == rows:
        return Written(inserted, 0, unversioned)
    key_match = " AND ".join(f"e.{k} = i.{k}" for k in table.key)
    compared = [c for c in row_columns if c != VECTOR_COLUMN]
    mine = ", ".join(f"i.{c}" for c in compared)
    theirs = ", ".join(f"e.{c}" for c in compared)
    differing = await conn.fetchrow(
        f"""
        SELECT {", ".join(f"i.{k}" for k in table.key)} FROM {incoming} i
        JOIN {table.name} e ON e.account_id = $1 AND {key_match}
        WHERE ROW({mine}) IS DISTINCT FROM ROW({theirs})
        LIMIT 1
        """,
        account_id,
        rows_json,
    )
    if differing is not None:
        raise Differs(table, dict(differing))
    return Written(inserted, rows - inserted, unversioned)


@asynccontextmanager
async def checking(
    conn: asyncpg.Connection, table: Table, dimensions: int | None = None
) -> AsyncIterator[None]:
    """A transaction, rolled back on exit, holding an empty copy of `table` with its types,
    defaults, NOT NULL and CHECK constraints (no keys, no indexes), in which `check_rows` tries
    rows. One a batch: the copy locks its table against a command that needs it alone (CLUSTER,
    ALTER TABLE), and every request waits behind such a command, so the lock is held as long as
    one batch's check, never a whole file's. `dimensions`: those the table's vectors will have
    when the rows are written, which a database no service has started on has not fixed yet
    (the import's `ensure_model` does, after the check): the copy's vectors have them already."""
    session_changed(conn)  # a temporary schema stays with the session
    transaction = conn.transaction()
    await transaction.start()
    try:
        await conn.execute(
            f"CREATE TEMPORARY TABLE check_{table.name} "
            f"(LIKE {table.name} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) ON COMMIT DROP"
        )
        if dimensions is not None and table.kind == "memory":
            await conn.execute(
                f"ALTER TABLE check_{table.name} ALTER COLUMN {VECTOR_COLUMN} "
                f"TYPE vector({int(dimensions)})"
            )
        yield
    finally:
        await transaction.rollback()  # the copy goes with it


async def check_rows(
    conn: asyncpg.Connection,
    table: Table,
    rows_json: str,
    row_columns: Sequence[str],
    directionless: set[UUID] | None = None,
) -> str | None:
    """Why PostgreSQL would not store these rows (a JSON array of objects with `row_columns`),
    or None: they are inserted into the copy of their table (inside `checking`) in a savepoint
    rolled back after. `directionless`, for records with their vectors: where the IDs of those
    whose vector has no direction are added (pgvector's cosine of it is NaN: of zeros, or of
    squares past float4), which no search could rank."""
    columns_sql = ", ".join(row_columns)
    savepoint = conn.transaction()
    await savepoint.start()
    try:
        await conn.execute(
            f"""
            INSERT INTO check_{table.name} (account_id, {columns_sql})
            SELECT gen_random_uuid(), {", ".join(f"i.{c}" for c in row_columns)}
            FROM jsonb_populate_recordset(NULL::{table.name}, $1::text::jsonb) i
            """,
            rows_json,
        )
        if directionless is not None and VECTOR_COLUMN in row_columns:
            found = await conn.fetch(
                f"SELECT memory_id FROM check_{table.name}"
                f" WHERE ({VECTOR_COLUMN} <=> {VECTOR_COLUMN}) = 'NaN'"
            )
            directionless.update(r["memory_id"] for r in found)
    except (
        asyncpg.DataError,
        asyncpg.IntegrityConstraintViolationError,
        asyncpg.ProgramLimitExceededError,
    ) as e:
        return one_line(e).replace(f"check_{table.name}", table.name)
    finally:
        await savepoint.rollback()
    return None


def one_line(error: asyncpg.PostgresError) -> str:
    """PostgreSQL's refusal in one line: its message, its hint, and its detail but for the row
    it failed on (`Failing row contains (...)`: every column of the row, the account a random
    one of the check's copy), where `str` gave them on lines of their own (`DETAIL:  ...`).
    The file's text it quotes is kept as it is, its line breaks and what else would break or
    disguise the line written as escapes (`escaped`): collapsing white space misquoted it
    ("x\\u00a0y\\ny" said as "x y y", a value the file does not hold)."""
    said = str(error.args[0] if error.args else error)
    detail, hint = getattr(error, "detail", None), getattr(error, "hint", None)
    if detail and not detail.startswith("Failing row contains"):
        said = f"{said}: {detail}"
    if hint:
        said = f"{said} ({hint})"
    return escaped(said)


async def other_agents_record(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, memory_ids: Sequence[UUID]
) -> UUID | None:
    """The first of these records that is another agent's in the account, if any."""
    if not memory_ids:
        return None
    return await conn.fetchval(
        """
        SELECT memory_id FROM agent_memories
        WHERE account_id = $1 AND memory_id = any($2::uuid[]) AND action_id <> $3
        LIMIT 1
        """,
        account_id,
        list(memory_ids),
        action_id,
    )


async def stored_records(conn: asyncpg.Connection, account_id: UUID, rows_json: str) -> set[int]:
    """Which of these memory rows (a JSON array; their places in it, from 0) the account holds
    committed (a turn's staged row may yet be removed): an import writes none of them, so
    embeds none of them."""
    rows = await conn.fetch(
        """
        SELECT a.n - 1 AS place
        FROM jsonb_array_elements($2::text::jsonb) WITH ORDINALITY AS a (row, n),
             jsonb_populate_record(NULL::agent_memories, a.row) i
        WHERE EXISTS (
            SELECT FROM agent_memories e
            WHERE e.account_id = $1 AND e.action_id = i.action_id AND e.memory_id = i.memory_id
              AND e.pending_execution IS NULL)
        """,
        account_id,
        rows_json,
    )
    return {row["place"] for row in rows}


async def account_exists(conn: asyncpg.Connection, account_id: UUID) -> bool:
    return bool(await conn.fetchval("SELECT true FROM accounts WHERE account_id = $1", account_id))
