"""Keyset cursors: the opaque `after` strings every list and search hands out.

A cursor is the base64url (unpadded) JSON list of the keyset values of a page's last item.
Each list declares its cursor's shape once (`Keyset`), which encodes its values and checks a
cursor sent back: anything a list did not issue is the client's error (BadInput), before any
value reaches SQL.

A GraphQL listing's cursor also names what it was issued for (`Keyset.bound`): the list, its
parent and the arguments that choose and order its items. Reused under others (another kind or
session, `sort: ASC`, another agent's or session's list of the same shape) it would page that
list from a place it never reached, silently leaving out what sorts before; it is refused
instead, as a ranked search's cursor is (app/memory/search.py, `_search_key`).
"""

import base64
import hashlib
import json
import math
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from typing import Any, Generic, TypeVar
from uuid import UUID

from app.errors import BadInput
from app.text import is_storable

INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
NOT_OURS = "`after` is not a cursor this connection issued"
# A bound listing's refusal: what to do instead, whether the cursor is crafted, of an older
# release (before cursors were bound), of another list or of other arguments.
NOT_THESE_ARGUMENTS = (
    NOT_OURS + " with these arguments: pass the `endCursor` of the previous page of this list, "
    "asked with the same arguments (filters, `sort`, `accountId`), or leave `after` out to start "
    "again from the first page"
)
V = TypeVar("V")


def pack(values: list[Any]) -> str:
    return _b64(json.dumps(values, separators=(",", ":")))


def _b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def unpack(cursor: str) -> Any:
    """The JSON a cursor holds; raises (ValueError and others) for anything else."""
    return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))


class Kind(Generic[V]):
    """One keyset value: how it is written in a cursor and read back (ValueError if not ours).
    `text`, when given, writes the value's JSON as `dump` and json.dumps would, only faster
    (a page encodes a cursor per item)."""

    def __init__(
        self,
        dump: Callable[[V], Any],
        load: Callable[[Any], V],
        text: Callable[[V], str] | None = None,
    ) -> None:
        self.dump, self.load = dump, load
        self.text = text or (lambda v: json.dumps(dump(v), separators=(",", ":")))


def _instant(text: Any) -> datetime:
    if not isinstance(text, str):
        raise ValueError("not a timestamp")
    instant = datetime.fromisoformat(text)
    if instant.tzinfo is None:
        raise ValueError("naive timestamp")
    return instant.astimezone(UTC)  # out of range here, not in the driver


def _tagged(tag: str, value: Any) -> Any:
    if not (isinstance(value, dict) and value.keys() == {tag}):
        raise ValueError(f"not a {tag!r} value")
    return value[tag]


def _int(low: int, high: int) -> Callable[[Any], int]:
    def load(v: Any) -> int:
        # Cursor integers reach SQL as int4.
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ValueError("not an integer of this list")
        return v

    return load


def _text(v: Any) -> str:
    if not isinstance(v, str) or not is_storable(v):  # a NUL, a lone surrogate: never stored
        raise ValueError("not text")
    return v


def _score(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError("not a score")
    return float(v)


def _plain_uuid(v: Any) -> UUID:
    if not isinstance(v, str):
        raise ValueError("not a UUID")
    return UUID(v)


def _same(v: Any) -> Any:
    return v


def constant(tag: str) -> Kind[str]:
    """A fixed marker, telling one list's cursors from another's."""

    def load(v: Any) -> str:
        if v != tag:
            raise ValueError("another list's cursor")
        return tag

    quoted = json.dumps(tag)
    return Kind(lambda _: tag, load, lambda _: quoted)


# The GraphQL connections' values: timestamps and UUIDs tagged, so a cursor reads back typed.
# (ISO timestamps and UUIDs hold no character JSON escapes.)
INSTANT: Kind[datetime] = Kind(
    lambda t: {"t": t.isoformat()},
    lambda v: _instant(_tagged("t", v)),
    lambda t: '{"t":"' + t.isoformat() + '"}',
)
ID: Kind[UUID] = Kind(
    lambda u: {"u": str(u)}, lambda v: UUID(_tagged("u", v)), lambda u: '{"u":"' + str(u) + '"}'
)
# An int's JSON is its repr, as is a finite float's (SCORE): a ranked search's cursor, one per
# record, holds three values that json.dumps wrote in 15 us a cursor, repr in 8 (bench/README.md).
INT4: Kind[int] = Kind(_same, _int(INT4_MIN, INT4_MAX), int.__repr__)
SEQUENCE: Kind[int] = Kind(_same, _int(0, INT4_MAX), int.__repr__)
TEXT: Kind[str] = Kind(_same, _text, encode_basestring_ascii)
# Memory search's values (app/memory/search.py), written plain.
INSTANT_TEXT: Kind[datetime] = Kind(
    lambda t: t.isoformat(), _instant, lambda t: '"' + t.isoformat() + '"'
)
ID_TEXT: Kind[UUID] = Kind(str, _plain_uuid, lambda u: '"' + str(u) + '"')
SCORE: Kind[float] = Kind(_same, _score, float.__repr__)
COUNT: Kind[int] = Kind(_same, _int(1, 2**63), int.__repr__)
MAX_WEIGHTS = 64  # the most numbers a cursor carries (WEIGHTS), 8 bytes each
# A word's weight is BM25's IDF (about 21 at a billion records) or 1; a best text score sums
# such weights. Past these bounds a crafted cursor's sums and quotients would overflow float8.
MAX_WEIGHT = 1e6
BEST_RANGE = (1e-12, 1e12)
# A word's weight, if not 0, is at least this (BM25's IDF of a word all of 2^63 records hold is
# about 5e-20): a smaller one divided by the best text score, or weighed, would underflow float8
# to 0, which PostgreSQL raises as an error too ("value out of range: underflow").
MIN_WEIGHT = 1e-30


def _weights_text(weights: tuple[float, ...] | None) -> str:
    if weights is None:
        return "null"
    packed = struct.pack(f"<{len(weights)}d", *weights)
    return '"' + base64.urlsafe_b64encode(packed).decode().rstrip("=") + '"'


def _weights(v: Any) -> tuple[float, ...] | None:
    if v is None:
        return None
    packed = base64.b64decode(_text(v) + "=" * (-len(v) % 4), altchars=b"-_", validate=True)
    if len(packed) % 8 or len(packed) > 8 * MAX_WEIGHTS:
        raise ValueError("not weights")
    weights = struct.unpack(f"<{len(packed) // 8}d", packed)
    if not all(w == 0 or MIN_WEIGHT <= w <= MAX_WEIGHT for w in weights):  # (NaN: false)
        raise ValueError("not weights")
    return weights


def _best(v: Any) -> float | None:
    if v is None:
        return None
    if not BEST_RANGE[0] <= _score(v) <= BEST_RANGE[1]:
        raise ValueError("not a best score")
    return float(v)


# A ranked search's weights of its words, exactly (binary, not decimal: 11 characters a word),
# and its best text score: what ranked its first page (app/memory/search.py). Either may be null.
WEIGHTS: Kind[tuple[float, ...] | None] = Kind(
    lambda w: json.loads(_weights_text(w)), _weights, _weights_text
)
BEST: Kind[float | None] = Kind(_same, _best, lambda v: "null" if v is None else float.__repr__(v))


class Keyset:
    """The shape of one list's cursors: the kinds of its keyset values, in order."""

    def __init__(self, *kinds: Kind[Any], error: str = NOT_OURS) -> None:
        self.kinds, self.error = kinds, error

    def encode(self, *values: Any) -> str:
        texts = [k.text(v) for k, v in zip(self.kinds, values, strict=True)]
        return _b64("[" + ",".join(texts) + "]")

    def decode(
        self, cursor: str | None, *, key: str | None = None, error: str | None = None
    ) -> tuple[Any, ...] | None:
        """The keyset values of an `after` cursor, or None for the first page. `key`: the
        binding a bound listing's cursor carries before its values (BoundKeyset), refused if
        another; `error`: the refusal, this keyset's own if not given."""
        if cursor is None:
            return None
        lead = 0 if key is None else 1
        try:
            values = unpack(cursor)
            if not isinstance(values, list) or len(values) != lead + len(self.kinds):
                raise ValueError("wrong arity")
            if lead and values[0] != key:
                raise ValueError("another binding")
            return tuple(k.load(v) for k, v in zip(self.kinds, values[lead:], strict=True))
        except Exception:  # a crafted cursor is the client's error, whatever it trips
            raise BadInput(error or self.error) from None

    def bound(
        self, listing: str, *arguments: Any, error: str = NOT_THESE_ARGUMENTS
    ) -> "BoundKeyset":
        """This shape's cursors for one listing: `listing` names the list (`Action.memories`),
        `arguments` its parent and whatever chooses or orders its items, each JSON-able (UUIDs
        and enums as str), spelled the same however a client may spell the same choice.
        `error`: the refusal of a cursor it did not issue, in the words of whoever passes it
        (a connection's by default; a model's tool names its own cursor and arguments)."""
        return BoundKeyset(self, binding(listing, *arguments), error)


def binding(listing: str, *arguments: Any) -> str:
    """What a bound listing's cursors carry first: its name and arguments, digested (64 bits:
    a guard against a client's mistake, not a secret; the position it guards is no secret
    either, every read is of the caller's own account)."""
    spelled = json.dumps([listing, *arguments], ensure_ascii=False, default=str)
    return hashlib.sha256(spelled.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class BoundKeyset:
    """A keyset's cursors for one listing and its arguments (Keyset.bound): each carries the
    binding before its values, and a cursor of another binding is refused."""

    def __init__(self, keyset: Keyset, key: str, error: str = NOT_THESE_ARGUMENTS) -> None:
        self.keyset, self.key, self.error = keyset, key, error
        self._head = '["' + key + '",'

    def encode(self, *values: Any) -> str:
        texts = [k.text(v) for k, v in zip(self.keyset.kinds, values, strict=True)]
        return _b64(self._head + ",".join(texts) + "]")

    def decode(self, cursor: str | None) -> tuple[Any, ...] | None:
        """The keyset values of an `after` cursor issued with this binding, or None for the
        first page."""
        return self.keyset.decode(cursor, key=self.key, error=self.error)
