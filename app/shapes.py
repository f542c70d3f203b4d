"""Typed models of the JSON a client or a model writes (the harness, a model configuration,
policies, native tool arguments), and their first error in words a person or a model can act
on: the path of what is wrong and what is expected there, never pydantic's own text."""

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.errors import BadInput

T = TypeVar("T", bound=BaseModel)

# Validating with this context marks input written by a client or a model: unknown fields
# are refused by name. Without it (a model built in code), field names may be used.
WRITTEN: dict[str, Any] = {"written": True}


def refuse(
    message: str, *, at: str = "", inline: bool | None = None, whole: bool = False
) -> PydanticCustomError:
    """An error in our words, said of the value's path (extended by `at`): "path: message",
    or "path message" when `inline` (None: the style of the whole input, see `first_error`);
    a `whole` message names what it is about itself."""
    context = {"message": message, "at": at, "inline": inline, "whole": whole}
    return PydanticCustomError("engram", "{message}", context)


def first_error(error: ValidationError, root: str, *, inline: bool = False) -> str:
    """The first error as "path: what is expected" (`inline`: "path what is expected")."""
    e = error.errors(include_url=False)[0]
    parts = [root] if root else []
    for part in e["loc"]:
        if isinstance(part, int):
            parts[-1] += f"[{part}]"
        elif part != "[key]":  # a dict key's own error: the key is already in the path
            parts.append(part)
    ctx = e.get("ctx") or {}
    if e["type"] != "engram":  # pydantic's own check, in our words
        message = "is required" if e["type"] == "missing" else e["msg"]
        message, ctx = message.replace("Input should be", "must be"), {"inline": False}
    elif ctx["whole"]:
        return ctx["message"]
    else:
        message = ctx["message"]
        parts += [ctx["at"]] if ctx["at"] else []
    if not parts:
        return message
    separator = " " if (inline if ctx["inline"] is None else ctx["inline"]) else ": "
    return ".".join(parts) + separator + message


def parse(
    shape: type[T],
    value: Any,
    root: str,
    *,
    inline: bool = False,
    context: Mapping[str, Any] | None = None,
) -> T:
    """`value` as `shape`, or BadInput naming the first thing wrong with it."""
    try:
        return shape.model_validate(value, context={**WRITTEN, **(context or {})})
    except ValidationError as e:
        raise BadInput(first_error(e, root, inline=inline)) from None


def json_text(value: Any) -> str:
    """What to add when an object came as its JSON text (a client that serialized it once too
    often, `JSON.stringify` into a variable of type Value), a common slip."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return ""
        if isinstance(parsed, dict):
            return ", not a string holding its JSON: send the object itself, not its text"
    return ""


class Shape(BaseModel):
    """A JSON object with known fields; null reads as {} (every field's default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    not_object: ClassVar[str] = "must be an object"
    # A field that must be given -> what to say when it is not (at the object's own path).
    needs: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, value: Any, info: ValidationInfo) -> Any:
        if not info.context or isinstance(value, BaseModel):
            return value
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise refuse(cls.not_object + json_text(value))
        allowed = [f.alias or name for name, f in cls.model_fields.items()]
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise refuse(
                f"unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}", inline=False
            )
        for name, message in cls.needs.items():
            if name not in value:
                raise refuse(message, inline=False)
        cls.check(value)
        return value

    @classmethod
    def check(cls, value: Mapping[str, Any]) -> None:
        """Rules about the object as a whole, checked before its fields."""


def check_integer(
    value: Any, low: int, high: int, *, got: bool = True, suffix: str = "", at: str = ""
) -> int:
    """An int from low to high (not a bool, not a float that happens to be whole)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        said = f", got {value!r}" if got else ""
        raise refuse(f"must be an integer from {low} to {high}{suffix}{said}", at=at)
    return value


def Integer(low: int, high: int, *, got: bool = True, suffix: str = "") -> Any:  # noqa: N802
    """The type of check_integer's values; its bounds are also in the JSON schema."""

    def check(value: Any) -> int:
        return check_integer(value, low, high, got=got, suffix=suffix)

    return Annotated[int, Field(ge=low, le=high), BeforeValidator(check)]


def Number(low: float, high: float, *, got: bool = True, as_float: bool = True) -> Any:  # noqa: N802
    """An int or a float from low to high (`as_float`: read as a float)."""

    def check(value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise refuse(
                f"must be a number from {low} to {high}" + (f", got {value!r}" if got else "")
            )
        return float(value) if as_float else value

    kind = float if as_float else int | float
    return Annotated[kind, Field(ge=low, le=high), BeforeValidator(check)]


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise refuse("must be true or false")
    return value


Boolean = Annotated[bool, BeforeValidator(_boolean)]


def nonempty(value: Any) -> str:
    """A string with more than white space in it (null refused too)."""
    if not isinstance(value, str) or not value.strip():
        raise refuse("must be a non-empty string")
    return value


def One(choices: tuple[str, ...]) -> Any:  # noqa: N802
    """One of `choices`."""

    def check(value: Any) -> str:
        if value not in choices:
            raise refuse(f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    return Annotated[str, BeforeValidator(check)]


def Several(  # noqa: N802
    choices: tuple[str, ...], *, empty: str | None = None, why: Mapping[str, str] | None = None
) -> Any:
    """A list of distinct `choices`; `empty`: the message refusing an empty list (None: allowed);
    `why`: what a refusal adds for a value that is no choice for a reason worth saying."""

    def check(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise refuse(f"must be a list of {' / '.join(choices)}")
        for v in value:
            if v not in choices:
                reason = (why or {}).get(v)
                raise refuse(
                    f"{v!r} is not one of {', '.join(choices)}" + (f": {reason}" if reason else "")
                )
        if len(set(value)) != len(value):
            raise refuse("must not repeat a value")
        if not value and empty is not None:
            raise refuse(empty)
        return tuple(value)

    return Annotated[tuple[str, ...], BeforeValidator(check)]
