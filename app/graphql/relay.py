"""Relay conventions: opaque global IDs, the Node interface, keyset connections."""

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from json.encoder import encode_basestring_ascii as quoted
from typing import Annotated, Any, Generic, TypeVar
from uuid import UUID

import strawberry

from app.db import cursors
from app.db.cursors import INT4_MAX, BoundKeyset, Keyset
from app.errors import BadInput
from app.graphql.enums import graphql_enum
from app.text import is_storable, shown

T = TypeVar("T")
R = TypeVar("R")
E = TypeVar("E")
C = TypeVar("C")


@graphql_enum("The order of a listing.")
class SortOrder(Enum):
    ASC = "Oldest first."
    DESC = "Newest first."


# The arguments of every connection (Relay forward paging), described once.
FIRST = Annotated[
    int, strawberry.argument(description="How many to return, from 1 to 1,000 (a page).")
]
AFTER = Annotated[
    str | None,
    strawberry.argument(
        description="The previous page's `pageInfo.endCursor`: the page after it. Omit it for "
        "the first page."
    ),
]


# How much of a wrong ID a refusal quotes: every ID this service issues whole (the longest, of
# a session ID of 200 emoji written as JSON escapes, about 3,300 characters), a longer value
# (as long as its request) by its start, end and length.
ID_SHOWN = 4000
# How a refusal of an ID that decodes, but not as this service writes it, ends.
UNCHANGED = "pass an object's `id` exactly as a field returned it"


def global_id(type_name: str, *key: object) -> strawberry.ID:
    # The JSON list of the parts as text, as json.dumps writes it (a page writes one per item).
    raw = "[" + ",".join([quoted(type_name), *[quoted(str(k)) for k in key]]) + "]"
    return strawberry.ID(base64.urlsafe_b64encode(raw.encode()).decode().rstrip("="))


def _not_global(value: str) -> BadInput:
    message = f"{shown(value, ID_SHOWN)} is not a global ID"
    try:
        UUID(value)
    except ValueError:
        return BadInput(message)
    # An actionId, memoryId or executionId where an object's `id` goes: a common slip.
    return BadInput(
        f"{message} but a UUID (an object's memoryId, actionId, executionId, tokenId or accountId "
        "field): pass the object's `id` field here, or read it by its UUID with the field of its "
        "type (`action(actionId)`, `agentMemory(actionId, id)`, `execution(executionId)`)"
    )


def parse_global_id(value: str) -> tuple[str, list[str]]:
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        raise _not_global(value) from None
    if (
        not isinstance(decoded, list)
        or len(decoded) < 2
        or not all(isinstance(p, str) and is_storable(p) for p in decoded)
    ):
        # A NUL or a lone surrogate names nothing stored, and must not reach the driver.
        raise _not_global(value)
    if global_id(decoded[0], *decoded[1:]) != value:
        # Decodable, but not as global_id writes it (padding, spacing, characters base64
        # skips, text unescaped): the object it found would answer another `id` than the one
        # asked, so a client's cache, keyed by `id`, would hold it twice.
        raise BadInput(f"{shown(value, ID_SHOWN)} is not a global ID: {UNCHANGED}")
    return decoded[0], decoded[1:]


def parse_int4(part: str) -> int | None:
    """A non-negative integer part of a global ID, or None when it is none PostgreSQL's int4
    can hold (a version above 2^31 names nothing), or not written as global_id writes it
    (`01`: the object read would answer the `id` with `1`)."""
    if part.isascii() and part.isdigit() and len(part) <= 10 and int(part) <= INT4_MAX:
        return int(part) if str(int(part)) == part else None
    return None


def parse_uuid(value: str, what: str = "ID") -> UUID:
    """A UUID part of a global ID, in the form global_id writes it (lowercase, with hyphens):
    another spelling of the same UUID finds the object, which would answer another `id`."""
    try:
        parsed = UUID(value)
    except ValueError:
        raise BadInput(f"{shown(value, ID_SHOWN)} is not a valid {what}") from None
    if str(parsed) != value:
        raise BadInput(f"{shown(value, ID_SHOWN)} is not a valid {what}: {UNCHANGED}")
    return parsed


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


MAX_PAGE = 1000  # the most items of a page; a list may allow fewer (check_first's maximum)


def check_first(first: int, maximum: int = MAX_PAGE) -> int:
    # Not 0: an empty page has no endCursor, so one that says more follows (hasNextPage) would
    # leave a client that pages by endCursor nowhere to go on from.
    if first < 1 or first > maximum:
        raise BadInput(f"`first` must be from 1 to {maximum}, got {first}")
    return first


def page(
    rows: Sequence[R],
    first: int,
    after: str | None,
    edge_of: Callable[[R], E],
    make: Callable[..., C],
) -> C:
    """A connection of `rows` fetched with LIMIT first + 1 (the extra row means more); `first`
    passed check_first."""
    edges = [edge_of(r) for r in rows[:first]]
    return make(
        edges=edges,
        nodes=[e.node for e in edges],  # type: ignore[attr-defined]
        page_info=PageInfo(
            has_next_page=len(rows) > first,
            has_previous_page=after is not None,
            start_cursor=edges[0].cursor if edges else None,  # type: ignore[attr-defined]
            end_cursor=edges[-1].cursor if edges else None,  # type: ignore[attr-defined]
        ),
    )


async def keyset_connection(
    first: int,
    after: str | None,
    keyset: BoundKeyset,
    fetch: Callable[[tuple[Any, ...] | None, int], Awaitable[Sequence[R]]],
    key: Callable[[R], tuple[Any, ...]],
    node: Callable[[R], T],
) -> Connection[T]:
    """Every list's page: `first` checked, `after` decoded by the list's `keyset` (bound to the
    list and its arguments: a cursor of another is BAD_REQUEST), `fetch`ed
    (after that keyset, first + 1 rows) and each row's cursor encoded from its `key`. A list
    nested in another's items fetches through the request's DataLoader (Context.load of a
    field registered with batch_pages), so the parents' pages are read in one query."""
    check_first(first)
    rows = await fetch(keyset.decode(after), first + 1)
    return page(
        rows, first, after, lambda r: Edge(cursor=keyset.encode(*key(r)), node=node(r)), Connection
    )


# The keysets of the lists: (created, id) for most, newest first.
CREATED_ID = Keyset(cursors.INSTANT, cursors.ID)
