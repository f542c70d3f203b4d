"""`engram export` and `engram import`: an agent, its records and what they name, as JSONL.

An export holds, after a header line, the agent (`action`) with every version
(`action_version`), the sessions (`session`) and executions (`execution`, with their
`transcript_event`s) that the records name, every version of every record (`memory_version`)
and each record's current state (`memory`, with its vector unless `--no-embeddings`); one
JSON object a line, `{"type": ..., "row": {...}}`, each row every column of its table but the
account (an account belongs to a deployment: the import names its own).

An import checks every row (each line as app/transfer/jsonl.py reads it), then writes them
with the same IDs, times, versions and provenance, in batches of one transaction each: the
lines it checked (`_batches`' digests), each batch while the next is read. A row
already there with the same content is skipped, so importing twice changes nothing and an
interrupted import continues where it stopped; a row there with other content stops the import
with CONFLICT naming it. Vectors are copied when the file's embedding model is the
deployment's (same name and dimensions); otherwise, or when the file has none, each record is
embedded again with the deployment's model, as `engram reembed` would. A record the file has no
vector for, where it has vectors (an edited file), is embedded again too: stored without one, no
search would find it; so is one whose vector has no direction (of zeros: no search could rank
it). A record already there is not embedded (it is skipped, or refused as different).
"""

import asyncio
import contextlib
import hashlib
import io
import itertools
import json
import re
import struct
import sys
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, ClassVar, Protocol
from uuid import UUID

import asyncpg

from app.actions.harness import MemoryConfig, check_labels_kept, parse_harness
from app.auth.service import default_account, ensure_default_account
from app.db.errors import is_account_gone
from app.embeddings import store as embeddings_store
from app.embeddings.base import Embedder, vector_fault
from app.embeddings.setup import ensure_model
from app.errors import BadInput, Conflict, DomainError, NotFound
from app.memory import store as memory_store
from app.memory.vectors import VECTOR_COLUMNS, memory_text
from app.text import escaped, is_storable
from app.transfer import jsonl, store
from app.transfer.store import BY_KIND, TABLES, VECTOR_COLUMN, Differs, Table

BATCH_ROWS = 1000
# The most JSON a batch is sent as: PostgreSQL's bound on a jsonb array (268,435,455 bytes),
# held by the check on the batch's text, which is ASCII (json.dumps escapes the rest). Past it,
# the batch is refused whole, each row alone passing: --batch-size is then too large. Its write,
# with the vectors the import's embedding adds, is sent in as many statements as that takes,
# each measured as jsonb (`_jsonb_bound`): the bound is on the array's binary size, which for
# short numbers is several times their text (a vector of zeros: 2.4 times).
MAX_BATCH_BYTES = 2**28 - 1
# What jsonb takes for a value beyond its text, at most: a 4-byte entry, padding to 4 bytes and
# a number's or a container's header ("1.5" is 16 bytes in a jsonb array, with its ", " 5 as
# text; a string's bytes are fewer than its quoted, escaped text).
JSONB_VALUE_BYTES = 12

_NOUNS = {
    "actions": "action {action_id}",
    "action_versions": "version {version} of action {action_id}",
    "sessions": "session {session_id} of action {action_id}",
    "executions": "execution {execution_id}",
    "transcript_events": "transcript event {sequence} of execution {execution_id}",
    "agent_memory_versions": "version {version} of memory {memory_id}",
    "agent_memories": "memory {memory_id}",
}


class Output(Protocol):
    def write(self, text: str, /) -> object: ...


async def export_action(
    pool: asyncpg.Pool,
    *,
    account_id: UUID,
    action_id: UUID,
    out: Output,
    embeddings: bool = True,
    progress: bool = False,
    notice: Callable[[str], None] = lambda _: None,
) -> dict[str, int]:
    """Writes the agent to `out` as JSONL, from one snapshot; returns the rows per type.
    `notice` is told what a person should know about the file (vectors left out)."""
    from tqdm import tqdm

    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        await store.note_named(conn, account_id, action_id)
        counts = {t.kind: await store.count(conn, t, account_id, action_id) for t in TABLES}
        if counts["action"] == 0:
            raise NotFound(f"action {action_id} not found in account {account_id}")
        model = await embeddings_store.recorded_model(conn)
        if embeddings and model is not None and await embeddings_store.reembed_target(conn):
            # An `engram reembed` stopped part way: the vectors are of two models, or none, not
            # of the one recorded. Left out, the import embeds every record again.
            embeddings = False
            notice(
                "the vectors are left out: an `engram reembed` was interrupted, so they are not "
                f"all of {model['name']}; the import embeds the records again"
            )
        embeddings = embeddings and model is not None
        header = {
            "type": "header",
            "format": jsonl.FORMAT,
            "version": jsonl.FORMAT_VERSION,
            "actionId": str(action_id),
            "exported": datetime.now(UTC).isoformat(),
            "embedder": model,
            "embeddings": embeddings,
            "counts": counts,
        }
        out.write(json.dumps(header) + "\n")
        with tqdm(
            total=sum(counts.values()), unit="row", disable=not progress, desc="export"
        ) as bar:
            for table in TABLES:
                async for row in store.export_rows(
                    conn, table, account_id, action_id, embeddings=embeddings
                ):
                    out.write(f'{{"type":"{table.kind}","row":{row}}}\n')
                    bar.update()
    return counts


@dataclass
class ImportResult:
    # The account written into: the one named, or the default account (made by the import,
    # once the file was checked, if no start of the service had made it).
    account_id: UUID
    inserted: int = 0
    present: int = 0  # already there, identical: skipped
    # Records embedded by this import (vectors copied: those the file had none for); none that
    # was there already.
    reembedded: int = 0
    vectors: str = "copied"  # or "re-embedded"
    records_written: int = 0  # record rows written (not those already there)
    by_type: dict[str, int] = field(default_factory=dict)
    records: dict[UUID, int] = field(default_factory=dict)  # records written, by agent
    # Rows the header counts that the file did not hold, by type (found, counted): cut short.
    missing: dict[str, tuple[int, int]] = field(default_factory=dict)


async def import_file(
    pool: asyncpg.Pool,
    *,
    account_id: UUID | None,
    lines: Iterable[str],
    open_embedder: Callable[[], Awaitable[Embedder]],
    batch_rows: int = BATCH_ROWS,
    progress: bool = False,
) -> ImportResult:
    """Writes an export's rows into `account_id` (see the module's docstring), or None: the
    default account, made (if no start of the service made it yet) once the file is checked,
    as the import writes. Every row is checked before any is written, so a file refused for a
    row writes nothing, and changes nothing; `lines` is read twice (a stream that cannot seek,
    standard input, through a temporary copy).

    A refusal quotes the file (and PostgreSQL, the file): its text is `escaped`, so that a
    hostile file's escape sequences, line breaks or bidi overrides never reach the terminal
    that shows the refusal as they are."""
    opened: list[Embedder] = []

    async def opening() -> Embedder:
        """`open_embedder`, closed as the import ends (a refused file's check opened it too)."""
        opened.append(await open_embedder())
        return opened[-1]

    try:
        return await _import_file(
            pool,
            account_id=account_id,
            lines=lines,
            open_embedder=opening,
            batch_rows=batch_rows,
            progress=progress,
        )
    except DomainError as e:
        e.message = escaped(e.message)
        e.args = (e.message,)
        raise
    finally:
        for embedder in opened:
            await embedder.aclose()


async def _import_file(
    pool: asyncpg.Pool,
    *,
    account_id: UUID | None,
    lines: Iterable[str],
    open_embedder: Callable[[], Awaitable[Embedder]],
    batch_rows: int,
    progress: bool,
) -> ImportResult:
    from tqdm import tqdm

    with _rereadable(lines) as read:
        header = jsonl.header(read())
        async with pool.acquire() as conn:
            if account_id is None:
                account_id = await default_account(conn)  # None: not made yet
            elif not await store.account_exists(conn, account_id):
                raise NotFound(f"account {account_id} not found")
            recorded = await embeddings_store.recorded_model(conn)
            catalog = {t.kind: await store.columns(conn, t.name) for t in TABLES}
        embedder: Embedder | None = None
        if recorded is None and header.get("embeddings"):
            # A deployment that has not started yet records no model: its configured one will
            # be recorded (below, once the file is checked, as its first start would), so a
            # file of that model's vectors is copied, not embedded again.
            embedder = await open_embedder()
            recorded = {"name": embedder.name, "dimensions": embedder.dimensions}
        copied = bool(
            header.get("embeddings") and recorded is not None and header["embedder"] == recorded
        )
        directionless: set[UUID] = set()
        digests: list[tuple[int, int, bytes]] = []  # of the batches checked (`_batches`)
        to_embed = await _check_file(
            pool,
            account_id,
            UUID(header["actionId"]),
            header["counts"],
            jsonl.rows(read(), header, catalog),
            copied,
            batch_rows,
            directionless,
            # Copied to a database no service started on, whose vector columns have no
            # dimensions yet (`ensure_model` fixes them below): checked against the model's.
            recorded["dimensions"]
            if copied and recorded is not None and embedder is not None
            else None,
            digests,
        )
        if to_embed or embedder is not None:
            # Embedded again with this deployment's model (which the database records, or will):
            # every record, or those of a file with vectors that has none for them (edited, or
            # written by hand), which copied as they are no search would find; of them, those
            # the account does not hold yet (an import run again skips the others).
            embedder = embedder or await open_embedder()
            await ensure_model(pool, embedder, VECTOR_COLUMNS)
        if account_id is None:
            async with pool.acquire() as conn:
                account_id = await ensure_default_account(conn)
        result = ImportResult(account_id)
        if not copied:
            result.vectors = "re-embedded"
        total = sum(header["counts"].values())
        with tqdm(total=total or None, unit="row", disable=not progress, desc="import") as bar:
            importer = _Importer(
                pool, account_id, embedder, copied, result, bar.update, directionless
            )
            try:
                await _write_file(importer, jsonl.parsed(read()), batch_rows, digests)
                result.missing = {
                    kind: (result.by_type.get(kind, 0), n)
                    for kind, n in header["counts"].items()
                    if result.by_type.get(kind, 0) < n
                }
            except BaseException:
                await importer.cancel()
                # The rows written so far are counted if the database still answers; the
                # import's own error is the one reported (re-running the import recounts).
                with contextlib.suppress(Exception):
                    await importer.count_pinned_lists()
                raise
            await importer.cancel()
            await importer.count_pinned_lists()
    return result


async def _write_file(
    importer: "_Importer",
    rows: Iterator[tuple[str, dict[str, Any], int, str]],
    batch_rows: int,
    digests: list[tuple[int, int, bytes]],
) -> None:
    """Writes the rows as the check read them (`digests`: each batch's first and last line
    and digest, `_batches`), so not checked again: parsed, each batch written while the next is
    read. A batch that is not as checked (the file changed in between) is refused, writing
    nothing of it; so is a file that ends before the lines checked. On any error, the batches
    before it are written first (or the first of them that fails is the error said)."""
    checked = iter(digests)
    try:
        async with contextlib.aclosing(_batches(rows, batch_rows)) as batches:
            async for batch in batches:
                was = next(checked, None)
                if was is None or was[2] != batch.digest:
                    raise _changed(batch.rows[0][1], batch.rows[-1][1])
                await importer.submit(batch.table, batch.rows)
        rest = next(checked, None)
        if rest is not None:  # (cut short where a batch ended)
            raise _changed(rest[0], rest[1])
    except Exception:
        await importer.drain()  # the batches before it written, or the first refusal of them
        raise
    await importer.drain()


def _changed(first: int, last: int) -> BadInput:
    return BadInput(
        f"lines {first} to {last} of the file changed after the import checked them: they were "
        "not imported (rows before them were). Import the file again once nothing writes to it"
    )


@contextmanager
def _rereadable(lines: Iterable[str]) -> Iterator[Callable[[], Iterator[str]]]:
    """`lines` to read from their start more than once: a list as it is, a stream from where it
    stood (`seekable`)."""
    if isinstance(lines, Sequence):
        yield lambda: iter(lines)
        return
    with seekable(lines) as file:
        yield _from(file, file.tell())


@contextmanager
def seekable(lines: Iterable[str]) -> Iterator[IO[str] | io.TextIOBase]:
    """`lines` as a file that can seek: a file that can as it is, any other stream (standard
    input from a pipe) through a temporary copy, read to its end first."""
    if isinstance(lines, io.TextIOBase) and lines.seekable():
        yield lines
        return
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape") as copy:
        copy.writelines(lines)
        copy.seek(0)
        yield copy


def _from(file: IO[str] | io.TextIOBase, start: int) -> Callable[[], Iterator[str]]:
    def again() -> Iterator[str]:
        file.seek(start)
        return iter(file)

    return again


# An ID as an export writes it: lowercase, with its hyphens.
_EXPORTED_ID = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _id(text: str) -> int | str:
    """Text of a row that the checks compare, as they compare it (texts are equal exactly when
    these are) in half the memory when it is an ID as exported: its 128-bit number (44 bytes,
    not 85). Any other text is kept as it is (the same ID in capitals is another text)."""
    return int(text.replace("-", ""), 16) if _EXPORTED_ID.fullmatch(text) else text


# The key columns of type uuid: PostgreSQL reads an ID in capitals, in braces or without its
# hyphens as the same ID, so the checks must too (an edited file with one record twice, once
# in capitals, passed them, and the write stopped part way on "already exists").
_UUID_KEYS = frozenset({"action_id", "execution_id", "memory_id"})


def _uuid(value: Any) -> int | str:
    """A uuid column's value as PostgreSQL compares it: an ID's 128-bit number however it is
    written; anything else as its text (its row's check refuses it, naming it)."""
    if not isinstance(value, str):
        return str(value)
    if isinstance(exported := _id(value), int):
        return exported
    try:
        return UUID(value).int
    except ValueError:
        return value


def _same(column: str, value: Any, key: Any) -> bool:
    """Whether a row's `value` of a key column is `key`, as the database returned it."""
    if column in _UUID_KEYS:
        return _uuid(value) == _uuid(str(key))
    return value == key


# Each type's place in TABLES, the order of an export's rows.
_PLACES = {t.kind: place for place, t in enumerate(TABLES)}


def _instant(value: Any) -> Any:
    """A time as its instant, however its offset is written; anything else as it is."""
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return value


def _hashable(value: Any) -> Any:
    """JSON as a value equal where jsonb's is (an object's keys in any order), and hashable."""
    if isinstance(value, dict):
        try:
            return frozenset(value.items())  # (most: labels, metadata of numbers and text)
        except TypeError:
            return frozenset((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


# A record's columns that none of its versions changes, and those a version does (but its
# number, which says which version a record's row is); those a file may write in more than one
# way for one value (an ID, a time, JSON) compared as PostgreSQL compares them.
_KEPT = memory_store.KEPT_ACROSS_VERSIONS
_CHANGED = tuple(c for c in memory_store.CHANGED_BY_A_VERSION if c != "version")
_AS_COMPARED = {
    "created": _instant,
    "modified": _instant,
    "execution_id": _uuid,
    "replaces": _uuid,
    "replaced_by": _uuid,
    "labels": _hashable,
    "metadata": _hashable,
}
_COMPARED = (*_KEPT, *_CHANGED)
_CONVERTED = [(place, _AS_COMPARED[c]) for place, c in enumerate(_COMPARED) if c in _AS_COMPARED]
# A record's row as `_Across.kept` notes it, in one int of 124 bytes (a tuple, some 800):
# its line's number, then 32 bits of the hash of each value of _KEPT; and again its line, then
# those of each value of _CHANGED, the part a later version's row takes over. A value edited
# passes one time in four billion.
_MARKS = struct.Struct(f"<Q{len(_KEPT)}IQ{len(_CHANGED)}I")
_MARK_BITS, _MARK_MASK = 32, 2**32 - 1
_LINE_BITS, _LINE_MASK = 64, 2**64 - 1
_FIRST_BITS = _LINE_BITS + len(_KEPT) * _MARK_BITS  # the part of the record's first row
_FIRST_MASK = 2**_FIRST_BITS - 1


def _marks(row: dict[str, Any], number: int) -> int:
    """A record's row (of line `number`) as `_Across.kept` notes it (`_MARKS`)."""
    values = [row.get(c) for c in _COMPARED]
    for place, compared in _CONVERTED:
        values[place] = compared(values[place])
    try:
        hashes = [hash(v) & _MARK_MASK for v in values]
    except TypeError:  # a list or an object where PostgreSQL refuses one (after this check)
        hashes = [hash(_hashable(v)) & _MARK_MASK for v in values]
    kept = len(_KEPT)
    return int.from_bytes(_MARKS.pack(number, *hashes[:kept], number, *hashes[kept:]), "little")


def _differing(columns: Sequence[str], differs: int) -> str:
    """The first of `columns` whose hash differs, in the bits of two rows' marks XORed (their
    line's number shifted out)."""
    return next(
        c for place, c in enumerate(columns) if differs >> (place * _MARK_BITS) & _MARK_MASK
    )


@dataclass
class _Across:
    """What a row is checked against in the rows before it: each key once, the export's order
    of types, and what rows of other types it names.

    Every row is noted, so what is noted of a row is kept small (an agent may have a million):
    its IDs are noted by `_id`, and the file's agent, whose ID every row has, as one object."""

    agent: str  # the file's agent's ID, as exported
    seen: dict[tuple[Any, ...], int] = field(default_factory=dict)  # each row's key: its line
    kinds: int = 0  # the place in TABLES of the type of the rows so far
    # The agent's current version (and its line), and the versions the file has: every read of
    # the agent is of its current version, so one the file lacks would hide the agent.
    current: tuple[Any, int] | None = None
    versions: set[Any] = field(default_factory=set)
    executions: set[int | str] = field(default_factory=set)  # a transcript's events follow them
    held: set[tuple[int | str, Any]] = field(default_factory=set)  # (record, version) held
    latest: dict[int | str, int] = field(default_factory=dict)  # each record's last version held
    # The records whose version 1 is DELETED: preview deletions (`jsonl` holds), a few.
    deletions: set[int | str] = field(default_factory=set)
    # A record replaces, and is replaced by, records of its own agent: the records the file
    # has, and where each record is first named (by their IDs' numbers).
    records: set[int] = field(default_factory=set)
    named: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    # A record has one successor, and one preview record naming it (a unique index, which
    # refused the second only once the batches before it were written): (record, preview).
    successors: dict[tuple[int | str, bool], int] = field(default_factory=dict)
    # What `end` matches of the records' own rows (`_links`): each record naming the record it
    # replaces, and each SUPERSEDED one the record that replaced it, with the row's line (both
    # few: the records of a correction); the preview records; how many records' rows.
    replacing: dict[int, tuple[int, int]] = field(default_factory=dict)
    replaced: dict[int, tuple[int, int]] = field(default_factory=dict)
    previews: set[int] = field(default_factory=set)
    memory_rows: int = 0
    # The versions of the agent that executions and records name, each with the first line
    # naming it (a few: every row of a version names it).
    named_versions: dict[str, tuple[int, str]] = field(default_factory=dict)
    # The labels each version of the agent declares, with its row's line; and each record's
    # first row, by what its versions keep (`_marks`: kept small, no record's values).
    declared: dict[int, tuple[int, MemoryConfig]] = field(default_factory=dict)
    kept: dict[int | str, int] = field(default_factory=dict)
    _agent_key: int | str = field(init=False)

    def __post_init__(self) -> None:
        self._agent_key = _id(self.agent)

    def row(self, kind: str, row: dict[str, Any], number: int) -> None:
        table, place = BY_KIND[kind], _PLACES[kind]
        if place < self.kinds:
            order = ", ".join(t.kind for t in TABLES)
            raise BadInput(
                f"line {number}: a {kind} row after {TABLES[self.kinds].kind} rows; an export "
                f"holds its rows in the order {order} (the file was edited)"
            )
        self.kinds = place
        if kind != "action" and self.current is None:
            # Every row is of the agent: without its row first, the first write fails on the
            # reference, a batch in, naming no line.
            raise BadInput(
                f"line {number}: a {kind} row, but no action row before it: an export holds "
                "its agent's row first (the file was edited)"
            )
        key = (table.kind, *(self._key(k, row.get(k)) for k in table.key))
        earlier = self.seen.setdefault(key, number)
        if earlier != number:
            raise BadInput(
                f"line {number}: its {kind} row has the key of line {earlier}'s "
                f"({_noun(table, row)}): the file was edited"
            )
        if kind == "action":
            self.current = (row.get("current_version"), number)
        elif kind == "action_version":
            self.versions.add(row.get("version"))
            if isinstance(version := row.get("version"), int):
                harness = row.get("harness")  # (the row's check parsed it: valid)
                parsed = parse_harness(json.loads(harness) if isinstance(harness, str) else harness)
                self.declared[version] = (number, parsed.memory)
        elif kind == "execution":
            self.executions.add(_uuid(row.get("execution_id")))
        elif kind == "transcript_event":
            if _uuid(row.get("execution_id")) not in self.executions:
                raise BadInput(
                    f"line {number}: its transcript_event row is not valid (execution_id "
                    f"{jsonl.shown(row.get('execution_id'))} is no execution of this export)"
                )
        elif kind in ("memory", "memory_version"):
            self._record(kind, row, number)
        if kind in ("execution", "memory_version", "memory"):
            version = sys.intern(str(row.get("action_version")))
            self.named_versions.setdefault(version, (number, kind))

    def _key(self, column: str, value: Any) -> int | str:
        """A value of a row's key as PostgreSQL compares it (an ID by `_uuid`, text by `_id`),
        held once when every row has it: the file's agent, a counter (a version: the same few
        texts in every row)."""
        if value == self.agent:
            return self._agent_key
        if column in _UUID_KEYS:
            return _uuid(value)
        return _id(value) if isinstance(value, str) else sys.intern(str(value))

    def _record(self, kind: str, row: dict[str, Any], number: int) -> None:
        memory_id = _uuid(row.get("memory_id"))
        self._labels(kind, row, number)
        marks = self._kept(kind, row, number, memory_id)
        version = row.get("version")
        if kind == "memory_version":
            self._follows(row, number, memory_id, version)
            self.held.add((memory_id, version))
            if isinstance(version, int):  # (one more than the last: `_follows`)
                self.latest[memory_id] = version
                # The row of the record's latest version so far, which its own row is held to.
                self.kept[memory_id] = self.kept[memory_id] & _FIRST_MASK | marks & ~_FIRST_MASK
        elif version is not None and version == self.latest.get(memory_id):
            # (At another version, `stored` refuses it: it names the version the file has.)
            self._current(row, number, marks, memory_id)
            self._tombstone(row, number, memory_id)
        try:
            record = UUID(row["memory_id"]).int
            self.records.add(record)
            for column in ("replaces", "replaced_by"):
                if row.get(column) is not None:
                    named = UUID(row[column]).int
                    self.named.setdefault(named, (number, kind, column))
                    if kind == "memory":
                        links = self.replacing if column == "replaces" else self.replaced
                        links[record] = (named, number)
        except (KeyError, TypeError, ValueError, AttributeError):  # UUID(5): AttributeError
            pass  # not IDs: the row's check in its table's copy refuses it, naming it
        else:
            if kind == "memory":
                self.memory_rows += 1
                if row.get("preview") is True:
                    self.previews.add(record)
        if kind == "memory" and row.get("replaces") is not None:
            preview = bool(row.get("preview"))
            key = (_uuid(row["replaces"]), preview)
            earlier = self.successors.setdefault(key, number)
            if earlier != number:
                raise BadInput(
                    f"line {number}: its memory row is not valid (it replaces record "
                    f"{jsonl.shown(row['replaces'])}, as the {'preview ' * preview}record of line "
                    f"{earlier} does: a record has one successor, and one preview record naming "
                    "it)"
                )

    def _follows(
        self, row: dict[str, Any], number: int, memory_id: int | str, version: Any
    ) -> None:
        """A record's versions come in order from 1, one more each time (as the export writes
        them), each after one that leaves the record ACTIVE: the API writes a next version of
        an ACTIVE record only, which deletes or replaces it (`jsonl` holds a version after the
        first to DELETED or SUPERSEDED), and none after that (M58: deleting a deleted record
        returns it unchanged). Versions 1 and 3 were imported (`history` listed the two, and
        version 2 read as none), a version 0, and a version after the record was deleted."""
        if not isinstance(version, int):
            return  # (a null: PostgreSQL refuses it, naming it)
        before = self.latest.get(memory_id)
        if before is None:
            if version != 1:
                raise _unordered(
                    row,
                    number,
                    "and no row of its version 1 comes before it: a record's versions come in "
                    "order, from 1",
                )
            if row.get("status") == "DELETED":
                self.deletions.add(memory_id)
            return
        if version != before + 1:
            raise _unordered(
                row,
                number,
                f"after its version {before} of line {self._line_of_latest(memory_id)}: a "
                "record's versions come in order, from 1, one more each time",
            )
        if before > 1 or memory_id in self.deletions:
            ended = "a preview deletion" if before == 1 else "which deleted or replaced it"
            raise _unordered(
                row,
                number,
                f"after its version {before} of line {self._line_of_latest(memory_id)}, {ended}: "
                "nothing changes a deleted or replaced record",
            )

    def _line_of_latest(self, memory_id: int | str) -> int:
        """The line of the record's latest version so far (`kept`)."""
        return self.kept[memory_id] >> _FIRST_BITS & _LINE_MASK

    def _labels(self, kind: str, row: dict[str, Any], number: int) -> None:
        """A record's labels (by number, as the row's check found them) are labels the agent
        version that wrote it declares (M36): the API writes a record's labels once, as its
        agent then declares them (`_kept` holds them the same in every row of the record)."""
        written_by = row.get("action_version")
        if isinstance(written_by, int) and written_by in self.declared:
            memory = self.declared[written_by][1]
            for key in row["labels"]:
                if memory.label(int(key)) is None:
                    declared = ", ".join(f"{d.name} (number {d.number})" for d in memory.labels)
                    raise BadInput(
                        f"line {number}: its {kind} row is not valid (labels.{key}: version "
                        f"{written_by} of the agent, which wrote it, declares no label number "
                        f"{key}; "
                        + (f"its labels are {declared})" if declared else "it declares none)")
                    )

    def _kept(self, kind: str, row: dict[str, Any], number: int, memory_id: int | str) -> int:
        """A record's row holds what its first row does in each column a new version keeps
        (`_KEPT`): the API writes them once, with the record (its labels too, M36). A row
        edited apart from the others made the record's `history` say that its text, scope or
        labels changed, and a read of its current version disagree with a read of it. Returns
        the row's marks (`_marks`)."""
        marks = _marks(row, number)
        first = self.kept.setdefault(memory_id, marks)
        differs = ((first ^ marks) & _FIRST_MASK) >> _LINE_BITS
        if not differs:
            return marks
        column = _differing(_KEPT, differs)
        said = "labels are not those" if column == "labels" else f"{column} is not that"
        raise BadInput(
            f"line {number}: its {kind} row is not valid (its {said} of line "
            f"{first & _LINE_MASK}, a row of the same record {jsonl.shown(row['memory_id'])}: "
            f"a record keeps its {column} in every version)"
        )

    def _current(self, row: dict[str, Any], number: int, marks: int, memory_id: int | str) -> None:
        """A record's row is its current version: it holds what that version's row does in
        each column a version changes (`_CHANGED`). A record's row ACTIVE where its version 2
        said SUPERSEDED was imported as a replaced record still read beside its replacement."""
        latest = self.kept[memory_id] >> _FIRST_BITS
        differs = (latest ^ (marks >> _FIRST_BITS)) >> _LINE_BITS
        if not differs:
            return
        column = _differing(_CHANGED, differs)
        raise BadInput(
            f"line {number}: its memory row is not valid (its {column} is not that of line "
            f"{latest & _LINE_MASK}, the memory_version row of its version {row['version']} in "
            f"record {jsonl.shown(row['memory_id'])}: a record's row is its current version)"
        )

    def _tombstone(self, row: dict[str, Any], number: int, memory_id: int | str) -> None:
        """A record's row at its current version is a tombstone exactly when the record is a
        preview deletion, DELETED at version 1 (`deletions`): listed as one (P5), and telling a
        preview reader that the record it names is deleted, not replaced. Edited apart from its
        version 1, the deletion was left out of `Action.memories`, or a record listed as one."""
        tombstone = row.get("tombstone", False)  # (without the column: PostgreSQL's default)
        deletion = memory_id in self.deletions
        if not isinstance(tombstone, bool) or tombstone == deletion:
            return  # (not a boolean: PostgreSQL refuses it, naming it)
        first = self.kept[memory_id] & _LINE_MASK  # its version 1's line
        raise BadInput(
            f"line {number}: its memory row is not valid (its tombstone is "
            f"{json.dumps(tombstone)}, but its version 1 of line {first} is "
            f"{'DELETED' if deletion else 'ACTIVE'}: a record's row is a tombstone exactly when "
            "the record is a preview deletion, DELETED at version 1)"
        )

    def stored(self, table: Table, batch: list[tuple[dict[str, Any], int]]) -> None:
        """After the batch's rows passed PostgreSQL's checks (so their columns are there)."""
        for row, number in batch if table.kind == "memory" else ():
            memory_id, version = _uuid(row["memory_id"]), row["version"]
            if (memory_id, version) not in self.held:
                raise BadInput(
                    f"line {number}: memory {row['memory_id']} has no row for its current "
                    f"version ({version}) in this export (the file is cut short or edited): its "
                    "history would be empty"
                )
            if version < self.latest[memory_id]:
                raise BadInput(
                    f"line {number}: memory {row['memory_id']} is at version {version}, but "
                    f"this export has its version {self.latest[memory_id]} (the file was "
                    "edited): its next change would be refused as that version's"
                )

    async def end(
        self,
        conn: asyncpg.Connection,
        account_id: UUID | None,
        action_id: UUID,
        expected: dict[str, int],
    ) -> None:
        # Each version keeps the labels of the one before it (M36), as `updateAction` holds it.
        for (before, (_, earlier)), (version, (number, later)) in itertools.pairwise(
            sorted(self.declared.items())
        ):
            try:
                check_labels_kept(earlier, later)
            except BadInput as e:
                raise BadInput(
                    f"line {number}: its action_version row is not valid ({e.message}; the "
                    f"earlier version is {before}, this row's is {version})"
                ) from None
        # A file cut short before all of the agent's versions imports what it holds.
        whole = len(self.versions) >= expected.get("action_version", 0)
        if self.current is not None and whole:
            version, number = self.current
            if version not in self.versions:
                raise BadInput(
                    f"line {number}: its action row is not valid (current_version is {version}, "
                    "a version no action_version row of this export has)"
                )
            last = max(v for v in self.versions if isinstance(v, int))
            if version < last:
                raise BadInput(
                    f"line {number}: its action row is not valid (current_version is {version}, "
                    f"but this export has its version {last}: its next version would be refused "
                    "as that one)"
                )
            # A record's `action` (an execution's too) is the agent at the version it names.
            held = {str(v) for v in self.versions}
            for named, (line, kind) in self.named_versions.items():
                if named not in held:
                    raise BadInput(
                        f"line {line}: its {kind} row is not valid (action_version is {named}, "
                        "a version no action_version row of this export has: reading its "
                        "agent would fail)"
                    )
        records_whole = self.memory_rows >= expected.get("memory", 0)
        # A record the file does not hold may be in its part not written yet (a file cut short
        # imports what it holds), never another agent's. (An account not made yet holds none.)
        elsewhere = [UUID(int=m) for m in self.named if m not in self.records]
        if account_id is not None:
            foreign = await store.other_agents_record(conn, account_id, action_id, elsewhere)
            if foreign is not None:
                number, kind, column = self.named[foreign.int]
                raise BadInput(
                    f"line {number}: its {kind} row is not valid ({column} names record "
                    f"{foreign}, which is another agent's: a record replaces, and is replaced by, "
                    "records of its own agent only)"
                )
        self._links(records_whole)
        # An export holds every record of its agent: one a whole file lacks was edited in.
        if records_whole and elsewhere:
            number, kind, column = min(self.named[m.int] for m in elsewhere)
            absent = next(m for m in elsewhere if self.named[m.int][0] == number)
            raise BadInput(
                f"line {number}: its {kind} row is not valid ({column} names record {absent}, "
                "which this export does not hold: an export holds every record of its agent)"
            )

    def _links(self, whole: bool) -> None:
        """A record replaced names in `replaced_by` the record that names it in `replaces`, of
        its own kind (live or preview): the API writes the two in one transaction. A record
        naming another in `replaces` replaced it so, but a preview record naming a live record,
        which it leaves unchanged (P3, P5): a preview replacement or deletion. Without its
        pair, a record was read as replaced by one that replaces another, or none, or still
        ACTIVE beside a live record replacing it. `whole`: the file holds all its records' rows
        (one cut short imports what it holds: a record it lacks may be in its part not written
        yet)."""
        for record, (successor, number) in self.replaced.items():
            names = self.replacing.get(successor)
            rule = "a replaced record names the record that replaced it"
            if names is not None and names[0] == record:
                if (successor in self.previews) == (record in self.previews):
                    continue
                which = (
                    f"of line {names[1]} is {self._kind(successor)}, and this one is "
                    f"{self._kind(record)}"
                )
                rule = (
                    "a record is replaced by one of its own kind (a preview record leaves a live "
                    "record it names unchanged)"
                )
            elif names is not None:
                which = f"of line {names[1]} replaces record {UUID(int=names[0])}"
            elif whole and successor in self.records:
                which = "replaces none"
            else:
                continue  # (absent: `end` refuses it)
            raise BadInput(
                f"line {number}: its memory row is not valid (replaced_by names record "
                f"{UUID(int=successor)}, which {which}: {rule})"
            )
        for record, (replaced, number) in self.replacing.items():
            by = self.replaced.get(replaced)
            if by is not None and by[0] == record:
                continue  # (its kind: above)
            if record in self.previews and replaced not in self.previews:
                continue  # a live record a preview record leaves unchanged (P3)
            if by is not None:
                which = f"of line {by[1]} is replaced by record {UUID(int=by[0])}"
            elif whole and replaced in self.records:
                which = "is not SUPERSEDED naming it in replaced_by"
            else:
                continue  # (absent: `end` refuses it)
            raise BadInput(
                f"line {number}: its memory row is not valid (it replaces record "
                f"{UUID(int=replaced)}, which {which}: a record replaces the record it names, "
                "the two written at once, unless it is a preview record naming a live record, "
                "which it leaves unchanged)"
            )

    def _kind(self, record: int) -> str:
        """How `_links` names a record's kind."""
        return "a preview record" if record in self.previews else "a live record"


def _unordered(row: dict[str, Any], number: int, why: str) -> BadInput:
    """The refusal of a record's version out of its order (`_Across._follows`)."""
    return BadInput(
        f"line {number}: its memory_version row is not valid (it is version {row['version']} "
        f"of record {jsonl.shown(row['memory_id'])}, {why})"
    )


@dataclass
class _Batch:
    """Rows of one type that are checked, and written, together (`_batches`)."""

    table: Table
    rows: list[tuple[dict[str, Any], int]]  # each with its line's number
    digest: bytes  # of its lines, their numbers and text (any text: `surrogatepass`)


# Rows read between two turns of the event loop, while the batch before them is checked or
# written: its statements go on meanwhile (about a millisecond of reading a turn).
_ROWS_A_TURN = 16


async def _batches(
    rows: Iterator[tuple[str, dict[str, Any], int, str]], batch_rows: int
) -> AsyncGenerator[_Batch, None]:
    """The rows in batches of one type and at most `batch_rows`, each given once the row after
    it is read (and, where `rows` checks each, checked), with a digest of its lines: the check
    pass notes them, and the write pass compares its own, so that the rows written are the ones
    checked. Every _ROWS_A_TURN rows it hands the event loop a turn, so that the statements of a
    batch given before go on while the rows after it are read."""
    table: Table | None = None
    batch: list[tuple[dict[str, Any], int]] = []
    digest = hashlib.sha256()
    for kind, row, number, line in rows:
        if table is not None and (kind != table.kind or len(batch) >= batch_rows):
            yield _Batch(table, batch, digest.digest())
            batch, digest = [], hashlib.sha256()
        table = BY_KIND[kind]
        batch.append((row, number))
        text = line.encode("utf-8", "surrogatepass")
        digest.update(b"%d %d\n" % (number, len(text)))
        digest.update(text)
        if len(batch) % _ROWS_A_TURN == 0:
            await asyncio.sleep(0)
    if table is not None and batch:
        yield _Batch(table, batch, digest.digest())


async def _check_file(
    pool: asyncpg.Pool,
    account_id: UUID | None,
    action_id: UUID,
    expected: dict[str, int],
    rows: Iterator[tuple[str, dict[str, Any], int, str]],
    copied: bool,
    batch_rows: int,
    directionless: set[UUID],
    dimensions: int | None = None,
    digests: list[tuple[int, int, bytes]] | None = None,
) -> int:
    """Every row as `jsonl.rows` checks it, against the rows before it (`_Across`), and as
    PostgreSQL would store it (its types and checks, `store.check_rows`, a batch at a time), so
    that a file refused for a row writes nothing. `expected`: the header's counts; `copied`:
    whether the file's vectors are stored (else they are replaced, and not checked), then the
    records whose vector has no direction are added to `directionless`: embedded again, as if
    the file had none for them; `dimensions`: those of the copied vectors (`store.checking`);
    `digests`: where each batch's first and last line and digest are added (`_batches`).
    Returns how many records the import will embed (`_to_embed`).

    PostgreSQL tries a batch while the rows after it are read and checked here; a row refused
    meanwhile is said once the batch is tried, and the batch's refusal, if any, in its place:
    the refusal is the first in the file's order, as when each batch was tried before the
    rows after it were read."""
    across = _Across(str(action_id))
    to_embed = 0

    def each(
        rows: Iterator[tuple[str, dict[str, Any], int, str]],
    ) -> Iterator[tuple[str, dict[str, Any], int, str]]:
        for kind, row, number, line in rows:
            across.row(kind, row, number)
            if copied and kind == "memory" and isinstance(row.get(VECTOR_COLUMN), list):
                # Written as a JSON list rather than as exported (a vector's text): PostgreSQL
                # would refuse one nested with its own message, quoting the whole vector.
                fault = vector_fault(row[VECTOR_COLUMN])
                if fault is not None:
                    raise BadInput(
                        f"line {number}: its memory row is not valid ({VECTOR_COLUMN} is not a "
                        f"list of numbers: {fault})"
                    )
            yield kind, row, number, line

    async def check(conn: asyncpg.Connection, table: Table, batch: list[tuple[Any, int]]) -> None:
        nonlocal to_embed
        columns = [c for c in batch[0][0] if copied or c != VECTOR_COLUMN]
        # A transaction a batch, not one for the file: see `store.checking`.
        async with store.checking(conn, table, dimensions):
            refused = await _refusal(
                conn, table, [r for r, _ in batch], columns, directionless if copied else None
            )
            if refused is not None:
                for row, number in batch:  # which one: each alone
                    error = await _refusal(conn, table, [row], columns)
                    if error is not None:  # PostgreSQL's message quotes the value it refused
                        raise BadInput(
                            f"line {number}: its {table.kind} row is not valid "
                            f"({jsonl.shown(error, 300)})"
                        )
                raise BadInput(  # none alone: the batch together (its size)
                    f"lines {batch[0][1]} to {batch[-1][1]}: their {table.kind} rows are not "
                    f"valid together ({jsonl.shown(refused, 300)}); import with a smaller "
                    "--batch-size"
                )
        across.stored(table, batch)
        if table.name == "agent_memories":
            rows = [_without_pointless(r, directionless) for r, _ in batch]
            to_embed += len(await _to_embed(conn, account_id, rows, copied))

    async with pool.acquire() as conn:
        pending: asyncio.Task[None] | None = None  # the batch PostgreSQL tries
        try:
            async with contextlib.aclosing(_batches(each(rows), batch_rows)) as batches:
                async for batch in batches:
                    if pending is not None:
                        await pending
                    if digests is not None:
                        digests.append((batch.rows[0][1], batch.rows[-1][1], batch.digest))
                    pending = asyncio.create_task(check(conn, batch.table, batch.rows))
            if pending is not None:
                await pending
        except Exception:
            if pending is not None:  # a row after the batch refused: the batch's refusal first
                await pending  # (or its own refusal again)
            raise
        finally:
            if pending is not None and not pending.done():  # interrupted
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
        await across.end(conn, account_id, action_id, expected)
    return to_embed


def _jsonb_bound(text: str) -> int:
    """The most bytes PostgreSQL's jsonb takes for this JSON text: its bytes, and
    JSONB_VALUE_BYTES a value, each value counted by the comma, bracket or brace that comes
    with it (those inside strings count too: more, never fewer)."""
    values = text.count(",") + text.count("[") + text.count("{") + 1
    return len(text) + JSONB_VALUE_BYTES * values


def _in_statements(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """A batch's rows as the JSON arrays its writes send, each within MAX_BATCH_BYTES as jsonb
    (`_jsonb_bound`), and how many rows each holds: one, but where the vectors this deployment's
    model gave the records (about 34 kB a record at 1,536 dimensions), or numbers that take more
    as jsonb than as text, take a batch that passed the check past it. (Each row alone fits: the
    check stored it as jsonb without its vector, and a vector is at most 2,000 numbers.)"""
    parts = [json.dumps(row) for row in rows]
    arrays: list[tuple[str, int]] = []
    empty = _jsonb_bound("[]")
    start, size = 0, empty
    for i, part in enumerate(parts):
        cost = _jsonb_bound(part) + 1  # with the comma before it
        if i > start and size + cost > MAX_BATCH_BYTES:
            arrays.append(("[" + ",".join(parts[start:i]) + "]", i - start))
            start, size = i, empty
        size += cost
    arrays.append(("[" + ",".join(parts[start:]) + "]", len(parts) - start))
    return arrays


async def _refusal(
    conn: asyncpg.Connection,
    table: Table,
    rows: list[dict[str, Any]],
    columns: list[str],
    directionless: set[UUID] | None = None,
) -> str | None:
    """Why these rows would not be stored in one statement (inside `store.checking`): their
    size, or PostgreSQL's refusal (`store.check_rows`, which adds to `directionless`); None if
    they would."""
    rows_json = json.dumps(rows)
    if len(rows_json) > MAX_BATCH_BYTES:
        return (
            f"{len(rows_json):,} bytes as JSON, past the {MAX_BATCH_BYTES:,} PostgreSQL takes "
            "in one statement"
        )
    return await store.check_rows(conn, table, rows_json, columns, directionless)


def _pointless(row: dict[str, Any], directionless: set[UUID]) -> bool:
    """Whether a memory row's vector has no direction (`store.check_rows`): the record is
    then embedded again. Stored, its cosine to any query was NaN, which every hybrid or vector
    search of the agent failed on (before `fusion.cosine_of` read it as none)."""
    if not directionless or row.get(VECTOR_COLUMN) is None:
        return False
    try:
        return UUID(row["memory_id"]) in directionless
    except (KeyError, TypeError, ValueError, AttributeError):
        return False  # PostgreSQL refused it: the check says so


def _without_pointless(row: dict[str, Any], directionless: set[UUID]) -> dict[str, Any]:
    """A memory row, without its vector when it has no direction (`_pointless`)."""
    return {**row, VECTOR_COLUMN: None} if _pointless(row, directionless) else row


async def _to_embed(
    conn: asyncpg.Connection, account_id: UUID | None, rows: list[dict[str, Any]], copied: bool
) -> list[dict[str, Any]]:
    """The records among these memory rows that the import embeds with this deployment's
    model: every record, or (`copied`) those the file has no vector for, but a tombstone (a
    preview deletion: it has none) and a record the account holds already (it is skipped;
    None: the default account, not made yet, holds none)."""
    wanting = [
        r for r in rows if not r.get("tombstone") and (not copied or r.get(VECTOR_COLUMN) is None)
    ]
    if not wanting or account_id is None:
        return wanting
    keys = json.dumps([{"action_id": r["action_id"], "memory_id": r["memory_id"]} for r in wanting])
    stored = await store.stored_records(conn, account_id, keys)
    return [r for place, r in enumerate(wanting) if place not in stored]


def _noun(table: Table, row: dict[str, Any]) -> str:
    return _NOUNS[table.name].format(**{k: jsonl.shown(row.get(k)) for k in table.key})


@dataclass
class _Importer:
    """Writes batches in order, each while the rows after it are read, except the records'
    current rows (the last and costliest: each goes into the table's indexes), of which
    PARALLEL batches are written at once, on connections of their own, so that PostgreSQL
    inserts into the indexes on more than one core. They are independent of each other:
    nothing they refer to is written at the same time (a batch of another type waits for
    those before it)."""

    PARALLEL: ClassVar[int] = 2

    pool: asyncpg.Pool
    account_id: UUID
    embedder: Embedder | None
    copied: bool  # the file's vectors are stored: only records it has none for are embedded
    result: ImportResult
    done: Callable[[int], object]
    # Records whose vector in the file has no direction (`_check_file`): embedded again.
    directionless: set[UUID] = field(default_factory=set)
    _running: list[asyncio.Task[None]] = field(default_factory=list)
    _writing: Table | None = None  # the table of the batches running

    async def submit(self, table: Table, numbered: list[tuple[dict[str, Any], int]]) -> None:
        """Writes the rows (each with its line's number) once those before them are."""
        if table is not self._writing or table.name != "agent_memories":
            await self.drain()
        while len(self._running) >= self.PARALLEL:
            await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)
            if any(
                t.done() and (t.cancelled() or t.exception() is not None) for t in self._running
            ):
                # The first to fail in the file's order is said, once those before it are
                # written: a later batch may fail first (it stays listed, as in `drain`).
                await self.drain()
            self._running = [t for t in self._running if not t.done()]
        self._writing = table
        rows, numbers = [row for row, _ in numbered], [number for _, number in numbered]
        self._running.append(asyncio.create_task(self.write(table, rows, numbers)))

    async def drain(self) -> None:
        """Waits for the batches written, in order: the first that failed raises its error
        (and stays listed, so that a drain again raises it again; `cancel` ends the others)."""
        while self._running:
            await self._running[0]
            self._running.pop(0)

    async def cancel(self) -> None:
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running = []

    async def write(self, table: Table, rows: list[dict[str, Any]], numbers: list[int]) -> None:
        """Writes a batch in one transaction; a refusal names the line of the row it is about
        (`numbers`: each row's), or the batch's lines when PostgreSQL says of no one row."""
        first, last = numbers[0], numbers[-1]
        lines = f"line {first}: " if first == last else f"lines {first} to {last}: "

        def line(key: dict[str, Any]) -> str:
            for row, number in zip(rows, numbers, strict=True):
                if all(_same(k, row.get(k), v) for k, v in key.items()):
                    return f"line {number}: "
            return lines

        row_columns = list(rows[0])
        if table.name == "agent_memories":
            await self._embed(rows)
            if VECTOR_COLUMN not in row_columns:
                row_columns.append(VECTOR_COLUMN)
        async with self.pool.acquire() as conn:
            try:
                async with conn.transaction():
                    inserted = present = 0
                    for rows_json, count in _in_statements(rows):
                        written = await store.write_rows(
                            conn, table, self.account_id, rows_json, count, row_columns
                        )
                        inserted, present = inserted + written.inserted, present + written.present
                        if written.unversioned is not None:
                            # A record's current version is among its versions (which the file
                            # holds before the records): else its `history` would be empty.
                            raise BadInput(
                                f"{line({'memory_id': written.unversioned})}"
                                f"memory {written.unversioned} has no row for its current "
                                "version in this export (the file is cut short or edited): "
                                "nothing of its batch was imported"
                            )
            except Differs as e:
                raise Conflict(
                    f"{line(e.key)}{_NOUNS[table.name].format(**e.key)} already exists in account "
                    f"{self.account_id} with other content; nothing of it was changed (rows "
                    "before it were imported). Import into another account (--account), or "
                    "leave this agent out"
                ) from None
            except asyncpg.UniqueViolationError as e:
                raise Conflict(
                    f"{lines}a {table.kind} row of this export clashes with a row of account "
                    f"{self.account_id}: {store.one_line(e)}"
                ) from None
            except asyncpg.ForeignKeyViolationError as e:
                if is_account_gone(e):
                    # Deleting an account deletes every row of it, and none holding an agent
                    # is deleted: the import had kept nothing in it, and keeps nothing now.
                    raise NotFound(
                        f"account {self.account_id} was deleted while the import ran; nothing "
                        "from the file was kept"
                    ) from None
                raise BadInput(
                    f"{lines}a {table.kind} row names a row this export does not hold (the file is "
                    f"cut short or edited): {store.one_line(e)}"
                ) from None
            except (
                asyncpg.DataError,
                asyncpg.IntegrityConstraintViolationError,
                asyncpg.ProgramLimitExceededError,
            ) as e:
                raise BadInput(
                    f"{lines}a {table.kind} row of this export is not valid: {store.one_line(e)}"
                ) from None
        self.result.inserted += inserted
        self.result.present += present
        self.result.by_type[table.kind] = self.result.by_type.get(table.kind, 0) + len(rows)
        if table.name == "agent_memories":
            self.result.records_written += inserted
            for row in rows:
                action_id = UUID(row["action_id"])
                self.result.records[action_id] = self.result.records.get(action_id, 0) + 1
        self.done(len(rows))

    async def count_pinned_lists(self) -> None:
        """Counts the pinned lists of every agent whose records were written, once they all
        are: a batch's preview record may replace a record of a batch written beside it."""
        async with self.pool.acquire() as conn:
            for action_id in sorted(self.result.records):
                async with conn.transaction():
                    await memory_store.count_pinned_lists(conn, self.account_id, action_id, None)

    async def _embed(self, rows: list[dict[str, Any]]) -> None:
        """Vectors of this deployment's model for the records that need one (`_to_embed`); the
        file's vectors are dropped unless `copied`."""
        for r in rows:
            if not self.copied or _pointless(r, self.directionless):
                r[VECTOR_COLUMN] = None
            r.setdefault(VECTOR_COLUMN, None)
        async with self.pool.acquire() as conn:
            embedded = await _to_embed(conn, self.account_id, rows, self.copied)
        for r in embedded:
            if not all(
                isinstance(r.get(c), str) and is_storable(r[c]) for c in ("summary", "content")
            ):
                raise BadInput(
                    f"memory row {r.get('memory_id')!r} has no summary and content as text: "
                    "the file was edited"
                )
        if not embedded:
            return
        # The check found records to embed, so opened the embedder: a record the account held
        # then is held still (a committed record's row is never removed).
        assert self.embedder is not None
        vectors = await self.embedder.embed(
            [memory_text(r["summary"], r["content"]) for r in embedded]
        )
        for r, vector in zip(embedded, vectors.vectors, strict=True):
            r[VECTOR_COLUMN] = vector.tolist()
        self.result.reembedded += len(embedded)
