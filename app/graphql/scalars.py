"""Custom scalars: `Timestamp` (RFC 3339, UTC) and `Value` (any JSON). `UUID` is strawberry's,
described here."""

import dataclasses
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
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"a Timestamp is an RFC 3339 string such as {RFC3339_EXAMPLE}")
    return rfc3339(value)


def _parse_value_literal(node: ValueNode, variables: dict[str, Any] | None = None) -> Any:
    return value_from_ast_untyped(node, variables)


SCALARS: dict[object, ScalarDefinition] = {
    # strawberry's own UUID scalar (its parsing and errors), described.
    uuid.UUID: dataclasses.replace(
        UUIDDefinition,
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
