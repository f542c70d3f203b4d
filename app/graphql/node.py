"""`node(id)`: resolves any Node type from its global ID, behind that type's own grants."""

from collections.abc import Awaitable, Callable
from typing import Any

from app.errors import NotFound
from app.graphql.context import Info
from app.graphql.relay import parse_global_id

NodeResolver = Callable[[Info, list[str]], Awaitable[Any | None]]
_RESOLVERS: dict[str, NodeResolver] = {}


def node_type(type_name: str) -> Callable[[NodeResolver], NodeResolver]:
    """Registers how a Node type is loaded from the parts of its global ID."""

    def register(resolver: NodeResolver) -> NodeResolver:
        _RESOLVERS[type_name] = resolver
        return resolver

    return register


async def resolve_node(info: Info, id: str) -> Any:
    type_name, parts = parse_global_id(id)
    resolver = _RESOLVERS.get(type_name)
    found = await resolver(info, parts) if resolver else None
    if found is None:
        raise NotFound(f"no object has the ID {id!r}")
    return found
