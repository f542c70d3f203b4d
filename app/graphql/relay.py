"""Relay conventions: opaque global IDs, the Node interface, keyset connections."""

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any, Generic, TypeVar
from uuid import UUID

import strawberry

from app.errors import BadInput
from app.text import is_storable

T = TypeVar("T")
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
K = TypeVar("K", UUID, str)


@strawberry.enum(description="The order of a listing.")
class SortOrder(Enum):
    ASC = strawberry.enum_value("ASC", description="Oldest first.")
    DESC = strawberry.enum_value("DESC", description="Newest first.")


# The arguments of every connection (Relay forward paging), described once.
FIRST = Annotated[
    int, strawberry.argument(description="How many to return, from 0 to 1,000 (a page).")
]
AFTER = Annotated[
    str | None,
    strawberry.argument(
        description="The previous page's `pageInfo.endCursor`: the page after it. Omit it for "
        "the first page."
    ),
]


def global_id(type_name: str, *key: object) -> strawberry.ID:
    raw = json.dumps([type_name, *[str(k) for k in key]], separators=(",", ":"))
    return strawberry.ID(base64.urlsafe_b64encode(raw.encode()).decode().rstrip("="))


def parse_global_id(value: str) -> tuple[str, list[str]]:
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        raise BadInput(f"{value!r} is not a global ID") from None
    if (
        not isinstance(decoded, list)
        or len(decoded) < 2
        or not all(isinstance(p, str) and is_storable(p) for p in decoded)
    ):
        # A NUL or a lone surrogate names nothing stored, and must not reach the driver.
        raise BadInput(f"{value!r} is not a global ID")
    return decoded[0], decoded[1:]


def parse_int4(part: str) -> int | None:
    """A non-negative integer part of a global ID, or None when it is none PostgreSQL's int4
    can hold (a version above 2^31 names nothing)."""
    if part.isascii() and part.isdigit() and len(part) <= 10 and int(part) <= INT4_MAX:
        return int(part)
    return None


def parse_uuid(value: str, what: str = "ID") -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise BadInput(f"{value!r} is not a valid {what}") from None


@strawberry.interface(description="An object with a global identifier.")
class Node:
    id: strawberry.ID = strawberry.field(
        description="Global identifier for the `node(id)` query: reads the object back."
    )


@strawberry.type(description="Where a page is in its list (Relay).")
class PageInfo:
    has_next_page: bool = strawberry.field(
        description="Whether another page follows: ask for it with `after: endCursor`."
    )
    has_previous_page: bool = strawberry.field(
        description="Whether pages come before this one (it was asked with `after`)."
    )
    start_cursor: str | None = strawberry.field(
        description="The cursor of the page's first item; null for an empty page."
    )
    end_cursor: str | None = strawberry.field(
        description="The cursor of the page's last item: pass it as `after` for the next page; "
        "null for an empty page."
    )


@strawberry.type(description="One item of a page, with its cursor.")
class Edge(Generic[T]):
    cursor: str = strawberry.field(description="Pass as `after` for the items after this one.")
    node: T = strawberry.field(description="The item.")


@strawberry.type(
    description="A page of a list (a Relay connection): ask with `first`, and pass "
    "`pageInfo.endCursor` as `after` for the next page."
)
class Connection(Generic[T]):
    edges: list[Edge[T]] = strawberry.field(description="The page's items, with their cursors.")
    nodes: list[T] = strawberry.field(description="The page's items, without their cursors.")
    page_info: PageInfo = strawberry.field(
        description="Whether another page follows, and the cursor to ask for it."
    )


def encode_cursor(*values: Any) -> str:
    def plain(v: Any) -> Any:
        if isinstance(v, datetime):
            return {"t": v.isoformat()}
        if isinstance(v, UUID):
            return {"u": str(v)}
        return v

    raw = json.dumps([plain(v) for v in values], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _cursor_value(v: Any) -> Any:
    """One keyset value as `encode_cursor` wrote it; ValueError for anything else."""
    if isinstance(v, dict):
        if v.keys() == {"t"} and isinstance(v["t"], str):
            instant = datetime.fromisoformat(v["t"])
            if instant.tzinfo is None:
                raise ValueError("naive timestamp")
            return instant.astimezone(UTC)  # out of range here, not in the driver
        if v.keys() == {"u"} and isinstance(v["u"], str):
            return UUID(v["u"])
        raise ValueError("unknown value")
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise ValueError("unknown value")
    if isinstance(v, int) and not INT4_MIN <= v <= INT4_MAX:
        raise ValueError("integer out of range")  # cursor integers reach SQL as int4
    if isinstance(v, str) and "\x00" in v:
        raise ValueError("NUL in text")  # PostgreSQL text cannot hold it
    return v


def decode_cursor(cursor: str | None, arity: int) -> tuple[Any, ...] | None:
    """The keyset values of an `after` cursor, or None for the first page."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = json.loads(raw)
        if not isinstance(values, list) or len(values) != arity:
            raise ValueError("wrong arity")
        return tuple(_cursor_value(v) for v in values)
    except Exception:  # a crafted cursor is the client's error, whatever it trips
        raise BadInput("`after` is not a cursor this connection issued") from None


def decode_keyset(cursor: str | None, second: type[K]) -> tuple[datetime, K] | None:
    """The (created, id) keyset of an `after` cursor, or None for the first page."""
    values = decode_cursor(cursor, 2)
    if values is None:
        return None
    if not (isinstance(values[0], datetime) and isinstance(values[1], second)):
        raise BadInput("`after` is not a cursor this connection issued")
    return values[0], values[1]


def check_first(first: int, maximum: int = 1000) -> int:
    if first < 0 or first > maximum:
        raise BadInput(f"`first` must be from 0 to {maximum}, got {first}")
    return first


def connection(
    rows: Sequence[Any],
    first: int,
    cursor_of: Callable[[Any], str],
    node_of: Callable[[Any], T],
    *,
    has_previous: bool = False,
    edge: Callable[[str, Any], Edge[T]] | None = None,
) -> Connection[T]:
    """Builds a page from `rows` fetched with LIMIT first + 1 (the extra row means more)."""
    page = list(rows[:first])
    edges = [
        edge(cursor_of(r), r) if edge else Edge(cursor=cursor_of(r), node=node_of(r)) for r in page
    ]
    return Connection(
        edges=edges,
        nodes=[e.node for e in edges],
        page_info=PageInfo(
            has_next_page=len(rows) > first,
            has_previous_page=has_previous,
            start_cursor=edges[0].cursor if edges else None,
            end_cursor=edges[-1].cursor if edges else None,
        ),
    )
