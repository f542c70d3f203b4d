"""An export's lines read back (`engram import`): its header, then each row parsed and checked
as the API would have written it, naming the line of what is wrong. The export itself and the
import's writes are app/transfer/service.py's."""

import json
import math
import re
import reprlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, get_args
from uuid import UUID

from app.actions.harness import LABEL_NUMBERS, NAME_RULE, is_kind_name, parse_harness
from app.actions.model import parse_model
from app.actions.service import check_instructions, check_name
from app.auth.service import check_principal
from app.errors import BadInput
from app.memory.records import Source, Status
from app.memory.service import (
    MAX_LABEL_VALUE_BYTES,
    MAX_METADATA_BYTES,
    check_content,
    check_metadata,
    check_summary,
    label_value_fits,
)
from app.runtime import transcript
from app.scope import Scope, check_session_id
from app.text import check_json, nests_deeper, shortened
from app.transfer.store import BY_KIND

FORMAT = "engram-export"
FORMAT_VERSION = 1


# A byte that is not UTF-8, as a file read with errors="surrogateescape" holds it (a valid
# file decodes to no surrogate: JSON writes one escaped).
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _utf8(line: str, number: int) -> str:
    if line.isascii():  # (most lines: read at once, where the search walks every character)
        return line
    found = _NOT_UTF8.search(line)
    if found is not None:
        raise BadInput(
            f"line {number} is not UTF-8 text (character {found.start() + 1} of the line): "
            "the file is damaged, or was saved in another encoding"
        )
    return line


def _blank(line: str) -> bool:
    return not line or line.isspace()  # (as `strip` tells, without a copy)


def header(lines: Iterator[str]) -> dict[str, Any]:
    """The export's header, its first line of `lines`, checked."""
    line = next(lines, None)
    if line is not None:
        # A byte order mark, which an editor saving the file may put before it: not text of
        # the header (JSON readers may ignore it, RFC 8259).
        line = _utf8(line, 1).removeprefix("\ufeff")
        if _blank(line) and all(_blank(rest) for rest in lines):
            line = None  # blank lines alone (a newline, a byte order mark): empty, to a reader
    try:
        header = json.loads(line) if line else None
    except (ValueError, RecursionError):  # (nested past Python's limit: not JSON to it)
        # The start of an export's header (as `export_action` writes it), cut short: said as
        # such, not as a file of another kind.
        if line is not None and (line.startswith('{"type": "header"') or f'"{FORMAT}"' in line):
            raise BadInput(
                "line 1, the export's header, is not JSON: the file is damaged or cut short"
            ) from None
        header = None
    if line is None:
        raise BadInput("the file is empty: an Engram export starts with its header line")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BadInput("this is not an Engram export: its first line is not an export header")
    version = header.get("version")
    if version != FORMAT_VERSION:
        # As the file has it: "1", the text, is not the version 1.
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise BadInput(
            f"this export has format version {shown(json.dumps(version), 40)}; this Engram "
            f"reads version {FORMAT_VERSION}"
            + (
                ": import it into an Engram at least as new as the one that exported it"
                if newer
                else " (the header is damaged)"
            )
        )
    action_id = header.get("actionId")
    try:
        UUID(action_id if isinstance(action_id, str) else "")
    except ValueError:
        raise BadInput("this export's header is damaged: its actionId is not an ID") from None
    counts = header.get("counts")
    if not isinstance(counts, dict) or not all(
        kind in BY_KIND and isinstance(n, int) and not isinstance(n, bool) and n >= 0
        for kind, n in counts.items()
    ):
        raise BadInput("this export's header is damaged: its counts are not rows by type")
    if header.get("embeddings") and header.get("embedder") is None:
        raise BadInput("this export's header is damaged: it has vectors but names no model")
    return header


def shown(value: Any, limit: int = 80) -> str:
    """A value of the file in a message, `shortened`: text as the file has it (an ID unquoted)."""
    return shortened(value if isinstance(value, str) else reprlib.repr(value), limit)


def rows(
    lines: Iterator[str], header: dict[str, Any], catalog: dict[str, dict[str, str]]
) -> Iterator[tuple[str, dict[str, Any], int, str]]:
    """The rows after the header, by type, each checked (`_check_row`) against the columns of
    its table (`catalog`: their types by type of row), with its line's number and text."""
    action_id = UUID(header["actionId"])
    columns: dict[str, tuple[str, ...]] = {}  # each type's columns, as its first row has them
    for number, line in _numbered(lines):
        kind, row, overflowed = _parse(_utf8(line, number), number)
        if kind not in columns:
            unknown = [c for c in row if c not in catalog[kind] and c != "account_id"]
            if unknown:
                raise BadInput(
                    f"line {number}: this export's {kind} rows have columns this deployment "
                    f"does not ({', '.join(unknown)}): import it into an Engram at least as new "
                    "as the one that exported it"
                )
        if tuple(row) != columns.setdefault(kind, tuple(row)):
            raise BadInput(
                f"line {number}: its {kind} row has other columns than the ones "
                "before it (the file was edited); every row of a type has the same"
            )
        _check_row(
            kind,
            row,
            number,
            action_id=action_id,
            types=catalog[kind],
            walk=overflowed or _suspect(line),
            # As many containers as levels, at least (braces in strings count too: a walk more).
            deep=line.count("{") + line.count("[") > MAX_ROW_DEPTH,
        )
        yield kind, row, number, line


def parsed(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any], int, str]]:
    """The rows after the header as `rows` gives them, parsed but not checked: lines that
    `rows` read before (the same text, which the caller makes sure of), whose rows are the same
    and passed its checks then. A line that is no row now (the file changed since) is given
    as an empty row of the type before it, its text as it is: not the text `rows` read, so the
    caller refuses it as changed (as when it is a row), the rows before it given first."""
    kind = "action"
    for number, line in _numbered(lines):
        try:
            kind, row, _ = _parse(line, number)
        except BadInput:
            row = {}
        yield kind, row, number, line


def _numbered(lines: Iterator[str]) -> Iterator[tuple[int, str]]:
    """The lines after the header that are not blank, with their numbers."""
    next(lines, None)
    for number, line in enumerate(lines, start=2):
        if not _blank(line):
            yield number, line


# The values of a record's words, as its table's CHECKs hold them (app/memory/records.py).
_WORDS: dict[str, tuple[str, ...]] = {
    "status": get_args(Status),
    "scope": tuple(s.value for s in Scope),
    "source": get_args(Source),
}


# A record's label values are keyed by number as the API writes them: "5", never "05" or "５"
# (each read as 5, but a filter on the label, which looks for "5", never found the record).
_LABEL_KEYS = frozenset(str(number) for number in LABEL_NUMBERS)


# The columns that name a principal (who wrote an agent's version, ran an execution, wrote a
# record's version), which the API names as it names a client's (`check_principal`).
_PRINCIPALS: dict[str, tuple[str, ...]] = {
    "action_version": ("created_by",),
    "execution": ("principal",),
    "memory_version": ("modified_by",),
    "memory": ("modified_by",),
}


# The deepest a row nests (the row's object: 1). The service takes JSON of at most
# ENGRAM_MAX_JSON_DEPTH levels (256 at most), and stores it a few levels down in a row; a row
# nested much deeper (Python reads some 990 levels) was imported, and reading it failed past
# Python's recursion limit (an execution's input, for a reader its memory is redacted for).
MAX_ROW_DEPTH = 300


# The counters that go on from an imported row (a session's turns, a record's or an agent's
# versions, an execution's attempts) are 32-bit columns: an import leaves room for a billion more.
MAX_COUNT = 2**30


# What a line holds, written as JSON, when it has a NUL, a lone surrogate (as an export writes
# them: escaped) or a number that is not finite; only then is the row walked for it (`walk`),
# which for every row would add a third to a large import's check.
_SUSPECT = re.compile(r"\\u0000|\\u[dD][89abcdefABCDEF]|NaN|Infinity")


def _suspect(line: str) -> bool:
    """Whether `_SUSPECT` finds something in the line: each of its words looked for as text
    first (a search for a text runs several times faster than the pattern's, on lines that are
    mostly a vector's digits), the pattern only on a line with an escape."""
    return "NaN" in line or "Infinity" in line or ("\\u" in line and bool(_SUSPECT.search(line)))


def _check_row(
    kind: str,
    row: dict[str, Any],
    number: int,
    *,
    action_id: UUID,
    types: dict[str, str],
    walk: bool = True,
    deep: bool = True,
) -> None:
    """What the API reads back from a row, or goes on from, holds as the API wrote it: an
    edited file is refused here rather than stored and failing every read after (PostgreSQL
    checks the rest). `types`: the row's columns' types, from the catalog; `walk`, `deep`:
    whether its line may hold what `_SUSPECT` finds, or nest past MAX_ROW_DEPTH (`rows` tells
    from the line's text, so that only those rows are walked for it)."""
    try:
        if "account_id" in row:
            raise ValueError("it names an account: an export's rows name none")
        if deep and nests_deeper(row, MAX_ROW_DEPTH):
            raise ValueError(
                f"it nests deeper than {MAX_ROW_DEPTH} levels, which the service never writes: "
                "reading it would fail"
            )
        # Text PostgreSQL cannot hold (a NUL, a lone surrogate), numbers JSON has not (NaN).
        if walk:
            check_json(row, "the row")
        agent = row.get("action_id")
        # (As exported, the text of the ID: equal to it, without parsing it.)
        if not isinstance(agent, str) or (agent != str(action_id) and UUID(agent) != action_id):
            named = repr(agent) if isinstance(agent, str) else shown(agent)  # an ID: short
            raise ValueError(f"action_id is {named}, not the exported agent {action_id}")
        for column, value in row.items():
            if value is None:
                continue
            if types[column] == "timestamp with time zone":
                _check_time(column, value)
            elif types[column] in ("smallint", "integer", "bigint") and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT
            ):
                raise ValueError(
                    f"{column} is not an integer from 0 to {MAX_COUNT}: {reprlib.repr(value)}"
                )
        # The API's rules for what names a session or an agent, as stored: a dump of an earlier
        # release may hold invisible characters a new name or ID may not.
        session_id = row.get("session_id")
        if not isinstance(session_id, str | None):
            raise ValueError("session_id is not text")
        check_session_id(session_id, "session_id", stored=True)
        for column in _PRINCIPALS.get(kind, ()):
            principal = row.get(column)
            if not isinstance(principal, str):
                raise ValueError(f"{column} is not text")
            check_principal(principal, column)
        # As the runtime writes them (a reader is shown the event's data by its type).
        if kind == "transcript_event" and row.get("type") not in transcript.TYPES:
            raise ValueError(
                f"type is {shown(json.dumps(row.get('type')), 40)}, not one of the event types "
                f"{', '.join(transcript.TYPES)}"
            )
        if kind in ("memory", "memory_version"):
            labels = row.get("labels")
            if not isinstance(labels, dict) or not all(
                key in _LABEL_KEYS and isinstance(value, str) for key, value in labels.items()
            ):
                raise ValueError("labels are not text values by label number (5 to 18)")
            for key, value in labels.items():
                if not label_value_fits(value):
                    raise ValueError(
                        f"labels.{key} is {len(value.encode())} bytes; a label value is 1 to "
                        f"{MAX_LABEL_VALUE_BYTES} bytes"
                    )
            # A version's row has no CHECK of these (its record's row has): one the API never
            # wrote failed every `history` read of its record.
            for column, allowed in _WORDS.items() if kind == "memory_version" else ():
                if row.get(column) not in allowed:
                    raise ValueError(
                        f"{column} is {shown(json.dumps(row.get(column)), 40)}, not one of "
                        f"{', '.join(allowed)}"
                    )
            if kind == "memory_version":
                _check_version(row)
            # As a harness names it (a long one failed the index of records by kind once the
            # rows before it were written).
            if not is_kind_name(row.get("kind")):
                raise ValueError(
                    f"kind is {shown(json.dumps(row.get('kind')), 40)}, not a memory kind's name "
                    f"({NAME_RULE})"
                )
            _check_metadata(row.get("metadata"))
            # The API's rules for a record's text: one line of summary, bounded text.
            summary, content = row.get("summary"), row.get("content")
            if not isinstance(summary, str) or not isinstance(content, str | None):
                raise ValueError("its summary and content are not text")
            check_summary(summary)
            if content is not None:
                check_content(content)
        if kind == "action_version":
            name = row.get("name")
            if not isinstance(name, str):
                raise ValueError("name is not text")
            check_name(name, stored=True)
            instructions = row.get("instructions")
            if not isinstance(instructions, str):
                raise ValueError("instructions are not text")
            check_instructions(instructions)
            for column, parse in (("harness", parse_harness), ("model", parse_model)):
                value = row.get(column)
                parse(json.loads(value) if isinstance(value, str) else value)
    except (ValueError, TypeError, KeyError, BadInput) as e:
        message = e.message if isinstance(e, BadInput) else str(e)
        raise BadInput(f"line {number}: its {kind} row is not valid ({message})") from None


def _check_version(row: dict[str, Any]) -> None:
    """A record's version as the API writes it (its status one of `_WORDS`): version 1 ACTIVE
    (or DELETED, a preview deletion: a preview record naming in `replaces` the record it
    deletes), at one time, its `created`; a later version only to delete or replace the
    record, after it was written; `replaced_by` on a SUPERSEDED version, and only there (M42).
    `_Across` holds the versions' order. Each was imported: the record's `history` said it was
    replaced at version 1, or made ACTIVE again (then listed and found by search beside what
    replaced it)."""
    version, status, replaced_by = row.get("version"), row.get("status"), row.get("replaced_by")
    if (status == "SUPERSEDED") != (replaced_by is not None):
        if replaced_by is None:
            raise ValueError(
                "its status is SUPERSEDED, but its replaced_by is null: a replaced record names "
                "the record that replaced it"
            )
        raise ValueError(
            f"its replaced_by is {shown(replaced_by)}, but its status is {status}: only a "
            "SUPERSEDED record names the record that replaced it"
        )
    if version == 1:
        if status == "SUPERSEDED" or (
            status == "DELETED" and not (row.get("preview") is True and row.get("replaces"))
        ):
            raise ValueError(
                f"its version 1 is {status}: a record is written ACTIVE, or DELETED as a preview "
                "record naming in replaces the record it deletes; a later version deletes or "
                "replaces it"
            )
    elif isinstance(version, int) and version > 1 and status == "ACTIVE":
        raise ValueError(
            f"its version {version} is ACTIVE: a record's later version deletes or replaces "
            "it (DELETED or SUPERSEDED), and none makes it ACTIVE again"
        )
    # (Most version 1 rows: the same text, not parsed.) Version 1 is written at its `created`
    # (records of the service's first days a few µs after it: not refused).
    times = _times(row) if row.get("created") != row.get("modified") else None
    if times is not None and times[1] < times[0]:
        raise ValueError(
            f"its version {version} was modified {shown(row['modified'])}, before the record "
            f"was created ({shown(row['created'])}): a version is written when or after the "
            "record is"
        )


def _times(row: dict[str, Any]) -> tuple[datetime, datetime] | None:
    """A record's row's `created` and `modified` as `_check_time` took them; None when one is
    null (PostgreSQL refuses it)."""
    created, modified = row.get("created"), row.get("modified")
    if not isinstance(created, str) or not isinstance(modified, str):
        return None
    return datetime.fromisoformat(created), datetime.fromisoformat(modified)


def _check_time(column: str, value: Any) -> None:
    """A time as exported (ISO 8601 with its offset) that Python's datetime holds in UTC, as
    every read gets it: from year 1 to 9999, not infinity, not BC."""
    try:
        when = datetime.fromisoformat(value)
        if when.tzinfo is None:
            raise ValueError
        # PostgreSQL rounds a fraction past microseconds, where Python cuts it.
        (when + timedelta(microseconds=1)).astimezone(UTC)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"{column} is not a time from year 1 to 9999 with its offset: {reprlib.repr(value)}"
        ) from None


def _check_metadata(metadata: Any) -> None:
    """`check_metadata` of a record's metadata as stored: jsonb writes a number out in full
    (1e300 a 1 and 300 zeros, 2.5e20 as 250000000000000000000), which the API measured as its
    client wrote it (`1e+300`). Past the bound as it is, it is measured again with each
    integer's trailing zeros as an exponent (1e300), never longer than the API's measure of
    the number it took: metadata the API took as 500 bytes of 60 such numbers was refused."""
    try:
        check_metadata(metadata)
    except BadInput as refused:
        try:
            size = len(json.dumps(metadata, allow_nan=False).encode()) - _written_out(metadata)
        except (TypeError, ValueError):  # not JSON: as `check_metadata` says
            raise refused from None
        if size > MAX_METADATA_BYTES:
            raise BadInput(
                f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} are allowed"
            ) from None


def _written_out(value: Any) -> int:
    """How many characters fewer the integers of decoded JSON take written with their trailing
    zeros as an exponent (250000000000000000000: 25e19); walked without recursion."""
    saved, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool) and item:
            digits = str(abs(item))
            significant = digits.rstrip("0")
            zeros = len(digits) - len(significant)
            saved += max(0, zeros - 1 - len(str(zeros)))
    return saved


class _Overflow(Exception):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Overflow
    return value


# Python reads a number too large for a float (1e999) as inf, which no escape or word of the
# line shows to `_SUSPECT`: a line of one is read again, and its row walked (`_check_row`).
_DECODER = json.JSONDecoder(parse_float=_finite)


def _parse(line: str, number: int) -> tuple[str, dict[str, Any], bool]:
    """The line's type and row, and whether a number of it was too large for a float."""
    overflowed = False
    try:
        try:
            item = _DECODER.decode(line)
        except _Overflow:
            item, overflowed = json.loads(line), True
    except (ValueError, RecursionError):
        raise BadInput(f"line {number} is not JSON: the file is damaged or cut short") from None
    if not isinstance(item, dict) or item.get("type") not in BY_KIND:
        known = ", ".join(BY_KIND)
        raise BadInput(f"line {number} is not an exported row (a type among {known})")
    if not isinstance(item.get("row"), dict):
        raise BadInput(f"line {number} has no row")
    if len(item) > 2:
        # What a line says besides its row would not be imported (an edited file, or a format
        # that says more of a row): refused, as a column this deployment lacks is.
        more = ", ".join(shown(k, 40) for k in item if k not in ("type", "row"))
        raise BadInput(
            f"line {number} holds more than its type and row ({more}): the file was edited, "
            "or written by another Engram; import it into one at least as new"
        )
    return item["type"], item["row"], overflowed
