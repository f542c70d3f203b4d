"""`node(id)` and `nodes(ids)`: any Node type from its global ID, behind that type's own grants.

Each type registers how the parts of its ID name a key (checked before anything is read: a
malformed ID is BAD_REQUEST) and how the object at a key is loaded; types that others point at
load through the request's DataLoaders (Context.load), so `nodes` reads the objects of one type
in one batch however many IDs name them."""

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import BadInput, DomainError, NotFound
from app.graphql.context import Info
from app.graphql.relay import ID_SHOWN, MAX_PAGE, parse_global_id
from app.text import shown

# The most IDs one `nodes` call reads: a page's worth (MAX_PAGE), as many as a page can return
# and as searchMemories' `ids` take, so that the IDs of any page refetch in one call.
MAX_IDS = MAX_PAGE


@dataclass(frozen=True)
class NodeType:
    key: Callable[[list[str]], Hashable]  # the parts of an ID -> its key, or BadInput
    load: Callable[[Info, Any], Awaitable[Any | None]]  # the object at a key, or None


_TYPES: dict[str, NodeType] = {}


def node_type(
    type_name: str, key: Callable[[list[str]], Hashable]
) -> Callable[[Callable[[Info, Any], Awaitable[Any | None]]], Any]:
    """Registers how a Node type's global ID names a key (`key`, from the ID's parts after the
    type name) and how the object at that key is loaded (the decorated function)."""

    def register(load: Callable[[Info, Any], Awaitable[Any | None]]) -> Any:
        _TYPES[type_name] = NodeType(key, load)
        return load

    return register


def _parsed(id: str) -> tuple[NodeType, Hashable] | None:
    """The type and key an ID names (None: a type no object has); BadInput if malformed."""
    type_name, parts = parse_global_id(id)
    found = _TYPES.get(type_name)
    return (found, found.key(parts)) if found else None


async def resolve_node(info: Info, id: str) -> Any:
    found = await _load(info, _parsed(id))
    if found is None:
        raise NotFound(f"no object has the ID {shown(id, ID_SHOWN)}")
    return found


async def resolve_nodes(info: Info, ids: Sequence[str]) -> list[Any]:
    """The objects of `ids`, in their order: null at an ID `node` would answer NOT_FOUND (as
    `action(actionId)` answers an agent it does not find: no error, so the request stands, and
    another tenant's object is null like an unknown one). A malformed ID, or an error `node`
    would answer otherwise (ACCESS_DENIED), fails the request, naming the position."""
    if len(ids) > MAX_IDS:
        raise BadInput(
            f"`ids` holds {len(ids):,} IDs; `nodes` reads at most {MAX_IDS:,} at once: send "
            "the others in further requests"
        )
    parsed = []
    for i, id in enumerate(ids):
        try:
            parsed.append(_parsed(id))
        except BadInput as refused:
            raise BadInput(f"`ids[{i}]`: {refused.message}") from None
    # Loaded together: each type's DataLoader reads its keys in one batch (duplicates once).
    loaded = await asyncio.gather(*(_load(info, p) for p in parsed), return_exceptions=True)
    answer: list[Any] = []
    for i, found in enumerate(loaded):
        if isinstance(found, NotFound) or found is None:
            answer.append(None)
        elif isinstance(found, BaseException):
            if isinstance(found, DomainError):
                raise type(found)(f"`ids[{i}]`: {found.message}") from None
            raise found
        else:
            answer.append(found)
    return answer


async def _load(info: Info, parsed: tuple[NodeType, Hashable] | None) -> Any:
    return await parsed[0].load(info, parsed[1]) if parsed else None
