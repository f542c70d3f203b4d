"""GraphQL enums, each written once: a class whose members are their descriptions."""

from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

import strawberry

E = TypeVar("E", bound=type[Enum])


def graphql_enum(description: str) -> Callable[[E], E]:
    """The strawberry enum of a class whose member `NAME = "what it means"` is the value
    NAME, and `NAME = ("value", "what it means")` one of another value."""

    def build(cls: E) -> E:
        members: dict[str, Any] = {}
        for name, member in cls.__members__.items():
            value, text = member.value if isinstance(member.value, tuple) else (name, member.value)
            members[name] = strawberry.enum_value(value, description=text)
        if len(members) != len(cls):
            raise ValueError(f"{cls.__name__}: two values have the same description")
        rebuilt = Enum(cls.__name__, members, module=cls.__module__, qualname=cls.__qualname__)  # type: ignore[misc]
        return strawberry.enum(rebuilt, description=description)  # type: ignore[return-value]

    return build


M = TypeVar("M", bound=Enum)


def by_value(kind: type[M]) -> dict[Any, M]:
    """`kind`'s members by their values: a dict's lookup, where calling the enum takes about
    0.9 µs (three a record, a hundred records a listing page)."""
    return {member.value: member for member in kind}
