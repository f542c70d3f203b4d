"""The agent's `harness` configuration: its typed shape, defaults, and the rules between
versions."""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator

from app.errors import BadInput
from app.scope import Scope
from app.shapes import (
    Boolean,
    Integer,
    Number,
    One,
    Several,
    Shape,
    check_integer,
    parse,
    refuse,
)
from app.text import shown

SCOPES = tuple(s.word for s in Scope)
SEARCH_MODES = ("hybrid", "lexical", "vector")
MEMORY_TOOLS = ("add_memory", "read_memory", "delete_memory")
# Tools a harness may name in memory.tools by mistake: offered without it.
_OFFERED_ANYWAY = {
    "search_memory": "search_memory is always offered when memory is enabled; leave it out",
    "search_history": "search_history is offered with harness.history; leave it out",
}
HISTORY_INDEXES = ("messages", "messages_and_tools")
DEFAULT_KINDS = ("guidance", "fact", "event", "reference")
LABEL_NUMBERS = range(5, 19)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# What _NAME takes, as refusals say it: a name of digits alone is lower case, yet refused.
NAME_RULE = "lower case letters, digits and _, starting with a letter, at most 63 characters"


def is_kind_name(text: object) -> bool:
    """`text` is a name `memory.kinds` takes: a record's kind is one of them."""
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


_NO_SCOPE = "must name at least one scope (session or agent)"


@dataclass(frozen=True)
class Label:
    name: str
    number: int
    description: str


class SearchConfig(Shape):
    """harness.memory.search."""

    mode: One(SEARCH_MODES) = "hybrid"  # type: ignore[valid-type]
    max_results: Integer(1, 100) = 5  # type: ignore[valid-type]
    min_score: Number(-1, 1) | None = None  # type: ignore[valid-type]


@dataclass(frozen=True)
class MemoryConfig:
    enabled: bool = False
    read: tuple[Scope, ...] = (Scope.SESSION,)
    write: tuple[Scope, ...] = (Scope.SESSION,)
    extraction_prompt: str | None = None
    extraction_every_messages: int | None = None  # None: review every turn
    search: SearchConfig = field(default_factory=SearchConfig)
    tools: tuple[str, ...] = ()
    pinned_max_tokens: int | None = None  # None: pins are not allowed
    kinds: tuple[str, ...] = DEFAULT_KINDS
    labels: tuple[Label, ...] = ()

    def label(self, key: str | int) -> Label | None:
        for label in self.labels:
            if label.name == key or label.number == key:
                return label
        return None

    def resolve_label(self, key: str | int, number: int | None = None) -> Label:
        """The declared label a name or a number names (with both, they must agree): the one
        label lookup of every writer and filter, a client's or the model's."""
        label = None if isinstance(key, bool) else self.label(key)
        if label is None:
            declared = ", ".join(f"{d.name} (number {d.number})" for d in self.labels)
            raise BadInput(
                f"label {shown(key)} is not declared by this agent; "
                + (f"its labels are: {declared}" if declared else "it declares no labels")
            )
        if number is not None and number != label.number:
            raise BadInput(f"label {label.name} has number {label.number}, not {number}")
        return label


@dataclass(frozen=True)
class HistoryConfig:
    index: Literal["messages", "messages_and_tools"]


@dataclass(frozen=True)
class Harness:
    memory: MemoryConfig
    history: HistoryConfig | None
    raw: dict[str, Any]  # normalized JSON, defaults filled in, as stored and returned


# The JSON shape, field by field; the order of fields is the order errors are found in.


class _ScopeShape(Shape):
    read: Several(SCOPES, empty=_NO_SCOPE) = ("session",)  # type: ignore[valid-type]
    write: Several(SCOPES, empty=_NO_SCOPE) = ("session",)  # type: ignore[valid-type]


def _every(value: Any) -> Any:
    if value == "turn":
        return value
    if isinstance(value, Mapping) and set(value) == {"messages"}:
        return {"messages": check_integer(value["messages"], 1, 10_000, at="messages")}
    raise refuse('must be "turn" or {"messages": N}')


def _prompt(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise refuse("must be a non-empty string")
    return value


class _ExtractionShape(Shape):
    prompt: Annotated[str | None, BeforeValidator(_prompt)] = None
    every: Annotated[str | dict[str, int], BeforeValidator(_every)] = "turn"


class _PinnedShape(Shape):
    needs: ClassVar[dict[str, str]] = {"max_tokens": 'needs max_tokens, e.g. {"max_tokens": 2000}'}
    max_tokens: Integer(1, 100_000)  # type: ignore[valid-type]


def _kinds(value: Any) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_KINDS
    if not isinstance(value, list) or not value or not all(isinstance(k, str) for k in value):
        raise refuse("must be a non-empty list of kind names")
    for kind in value:
        if not _NAME.fullmatch(kind):
            raise refuse(f"{kind!r} must be {NAME_RULE}")
    if len(set(value)) != len(value):
        raise refuse("must not repeat a kind")
    return tuple(value)


class _LabelShape(Shape):
    needs: ClassVar[dict[str, str]] = {
        "number": "needs a number from 5 to 18",
        "description": "needs a description the agent reads",
    }
    number: Integer(LABEL_NUMBERS.start, LABEL_NUMBERS.stop - 1)  # type: ignore[valid-type]
    description: Annotated[str, AfterValidator(str.strip)]

    @classmethod
    def check(cls, value: Mapping[str, Any]) -> None:
        description = value["description"]
        if not isinstance(description, str) or not description.strip():
            raise refuse(cls.needs["description"], inline=False)


def _label_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise refuse(f"label names are {NAME_RULE}")
    return name


def _labels_object(value: Any) -> Any:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise refuse("must be an object")
    return value


def _distinct_numbers(labels: dict[str, _LabelShape]) -> dict[str, _LabelShape]:
    seen: dict[int, str] = {}
    for name, label in labels.items():
        if label.number in seen:
            raise refuse(
                f"number {label.number} is already used by label {seen[label.number]!r}", at=name
            )
        seen[label.number] = name
    return dict(sorted(labels.items(), key=lambda item: item[1].number))


class _MemoryShape(Shape):
    enabled: Boolean = False
    scope: _ScopeShape = _ScopeShape()
    extraction: _ExtractionShape = _ExtractionShape()
    search: SearchConfig = SearchConfig()
    tools: Several(MEMORY_TOOLS, why=_OFFERED_ANYWAY) = ()  # type: ignore[valid-type]
    pinned: _PinnedShape | None = None
    kinds: Annotated[tuple[str, ...], BeforeValidator(_kinds)] = DEFAULT_KINDS
    labels: Annotated[
        dict[Annotated[str, AfterValidator(_label_name)], _LabelShape],
        BeforeValidator(_labels_object),
        AfterValidator(_distinct_numbers),
    ] = {}


class _HistoryShape(Shape):
    index: One(HISTORY_INDEXES) = "messages"  # type: ignore[valid-type]


class _HarnessShape(Shape):
    memory: _MemoryShape = _MemoryShape()
    history: _HistoryShape | None = None


def _memory(shape: _MemoryShape) -> MemoryConfig:
    every = shape.extraction.every
    return MemoryConfig(
        enabled=shape.enabled,
        read=tuple(map(Scope.from_word, shape.scope.read)),
        write=tuple(map(Scope.from_word, shape.scope.write)),
        extraction_prompt=shape.extraction.prompt,
        extraction_every_messages=every["messages"] if isinstance(every, dict) else None,
        search=shape.search,
        tools=shape.tools,
        pinned_max_tokens=shape.pinned.max_tokens if shape.pinned else None,
        kinds=shape.kinds,
        labels=tuple(Label(n, s.number, s.description) for n, s in shape.labels.items()),
    )


def _fail(path: str, message: str) -> BadInput:
    return BadInput(f"harness.{path}: {message}")


def check_labels_kept(previous: MemoryConfig, memory: MemoryConfig) -> None:
    """A later version (`memory`) keeps every label an earlier one declares, with its number
    (M36); it may add labels."""
    for label in previous.labels:
        kept = memory.label(label.name)
        if kept is None:
            raise _fail(
                f"memory.labels.{label.name}",
                f"an earlier version declares this label (number {label.number}); "
                "later versions must keep it with the same number",
            )
        if kept.number != label.number:
            raise _fail(
                f"memory.labels.{label.name}.number",
                f"an earlier version declares this label with number {label.number}; "
                f"it cannot change to {kept.number}",
            )


def parse_harness(value: Any, previous: Harness | None = None) -> Harness:
    """Validates a harness; `previous` is the agent's prior version, whose labels must stay."""
    shape = parse(_HarnessShape, value, "harness")
    memory = _memory(shape.memory)
    if previous is not None:
        check_labels_kept(previous.memory, memory)
    history = HistoryConfig(shape.history.index) if shape.history else None
    return Harness(memory, history, shape.model_dump(mode="json", exclude_none=True))
