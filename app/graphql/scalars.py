"""Custom scalars: `Timestamp` (RFC 3339, UTC) and `Value` (any JSON). `UUID` is strawberry's,
described here, with a parser whose refusal names the scalar and where the literal was."""

import base64
import binascii
import dataclasses
import json
import uuid
from datetime import UTC, datetime
from typing import Any, NewType

import strawberry
from graphql import ValueNode, value_from_ast_untyped
from strawberry.schema.types.base_scalars import UUIDDefinition
from strawberry.types.scalar import ScalarDefinition

from app.text import RFC3339_EXAMPLE, rfc3339

Timestamp = NewType("Timestamp", datetime)
Value = NewType("Value", object)


def _serialize_timestamp(value: datetime) -> str:
    # The driver's are in UTC already: not converted again (two a record, a hundred a page).
    utc = value if value.tzinfo is UTC else value.astimezone(UTC)
    return utc.isoformat().replace("+00:00", "Z")


def _parse_timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"a Timestamp is an RFC 3339 string such as {RFC3339_EXAMPLE}")
    return rfc3339(value)


UUID_EXAMPLE = "0a1b2c3d-0000-4000-8000-00000000000a"


def _parse_uuid(value: Any) -> uuid.UUID:
    # strawberry's parser said "Value cannot represent a UUID: ... badly formed hexadecimal UUID
    # string" (Value being another scalar here), and raised a GraphQLError, which GraphQL
    # reports without the literal's location; a ValueError is reported at it.
    if not isinstance(value, str):
        raise ValueError(f"a UUID is a string such as {UUID_EXAMPLE}")
    try:
        return uuid.UUID(value)
    except ValueError:
        pass
    if (type_name := _global_id_type(value)) is not None:
        raise ValueError(
            f"not a UUID but a global `id` (of {type_name}): pass the object's UUID here (its "
            "memoryId, actionId, executionId, tokenId or accountId field), or read it with "
            "node(id)"
        )
    raise ValueError(f"not a UUID: write it as 32 hex digits such as {UUID_EXAMPLE}")


def _global_id_type(value: str) -> str | None:
    """The type a global `id` (app/graphql/relay.py, global_id) names, if `value` is one."""
    if len(value) > 1000:
        return None
    try:
        parts = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        return None
    # Every part text, and a type's name first (Action, ActionAgentMemory...): a listing's
    # cursor is base64 JSON as well, led by its binding's hex digest (app/db/cursors.py).
    named = isinstance(parts, list) and len(parts) >= 2 and all(isinstance(p, str) for p in parts)
    name = parts[0] if named else ""
    return name if name[:1].isupper() and name.isidentifier() and len(name) <= 40 else None


def _parse_value_literal(node: ValueNode, variables: dict[str, Any] | None = None) -> Any:
    return value_from_ast_untyped(node, variables)


SCALARS: dict[object, ScalarDefinition] = {
    # strawberry's own UUID scalar (its serialization), described, with its own parser.
    uuid.UUID: dataclasses.replace(
        UUIDDefinition,
        parse_value=_parse_uuid,
        description="A UUID in its canonical text form, such as "
        "0a1b2c3d-0000-4000-8000-00000000000a: the ID of an account, agent, record or execution.",
    ),
    Timestamp: strawberry.scalar(
        name="Timestamp",
        description="An instant in time, as an RFC 3339 string in UTC.",
        serialize=_serialize_timestamp,
        parse_value=_parse_timestamp,
    ),
    Value: strawberry.scalar(
        name="Value",
        description="Any JSON value.",
        serialize=lambda v: v,
        parse_value=lambda v: v,
        parse_literal=_parse_value_literal,
    ),
}
