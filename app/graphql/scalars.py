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

Timestamp = NewType("Timestamp", datetime)
Value = NewType("Value", object)


def _serialize_timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError("a Timestamp is an RFC 3339 string such as 2026-01-31T12:00:00Z")
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError("a Timestamp needs a time zone, e.g. a trailing Z")
    try:
        # In UTC, as stored: an instant past 9999-12-31T23:59:59Z cannot be represented.
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            "a Timestamp must fall between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC"
        ) from None


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
