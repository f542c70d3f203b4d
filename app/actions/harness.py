"""The agent's `harness` configuration: parsing, defaults, and the rules between versions."""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.errors import BadInput

SCOPES = ("session", "agent")
SEARCH_MODES = ("hybrid", "lexical", "vector")
MEMORY_TOOLS = ("add_memory", "read_memory", "delete_memory")
HISTORY_INDEXES = ("messages", "messages_and_tools")
DEFAULT_KINDS = ("guidance", "fact", "event", "reference")
LABEL_NUMBERS = range(5, 19)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Label:
    name: str
    number: int
    description: str


@dataclass(frozen=True)
class SearchConfig:
    mode: Literal["hybrid", "lexical", "vector"] = "hybrid"
    max_results: int = 5
    min_score: float | None = None


@dataclass(frozen=True)
class MemoryConfig:
    enabled: bool = False
    read: tuple[str, ...] = ("session",)
    write: tuple[str, ...] = ("session",)
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


@dataclass(frozen=True)
class HistoryConfig:
    index: Literal["messages", "messages_and_tools"]


@dataclass(frozen=True)
class Harness:
    memory: MemoryConfig
    history: HistoryConfig | None
    raw: dict[str, Any]  # normalized JSON, defaults filled in, as stored and returned


def _fail(path: str, message: str) -> BadInput:
    return BadInput(f"harness{'.' + path if path else ''}: {message}")


def _object(value: Any, path: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(path, "must be an object")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise _fail(path, f"unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return value


def _int(value: Any, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(path, f"must be an integer from {low} to {high}, got {value!r}")
    return value


def _string_list(value: Any, path: str, choices: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, f"must be a list of {' / '.join(choices)}")
    for v in value:
        if v not in choices:
            raise _fail(path, f"{v!r} is not one of {', '.join(choices)}")
    if len(set(value)) != len(value):
        raise _fail(path, "must not repeat a value")
    return tuple(value)


def _scope(value: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    scope = _object(value, "memory.scope", ("read", "write"))
    read = _string_list(scope.get("read", ["session"]), "memory.scope.read", SCOPES)
    write = _string_list(scope.get("write", ["session"]), "memory.scope.write", SCOPES)
    if not read:
        raise _fail("memory.scope.read", "must name at least one scope (session or agent)")
    if not write:
        raise _fail("memory.scope.write", "must name at least one scope (session or agent)")
    return read, write


def _extraction(value: Any) -> tuple[str | None, int | None]:
    extraction = _object(value, "memory.extraction", ("prompt", "every"))
    prompt = extraction.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise _fail("memory.extraction.prompt", "must be a non-empty string")
    every = extraction.get("every", "turn")
    if every == "turn":
        return prompt, None
    if isinstance(every, Mapping) and set(every) == {"messages"}:
        return prompt, _int(every["messages"], "memory.extraction.every.messages", 1, 10_000)
    raise _fail("memory.extraction.every", 'must be "turn" or {"messages": N}')


def _search(value: Any) -> SearchConfig:
    search = _object(value, "memory.search", ("mode", "max_results", "min_score"))
    mode = search.get("mode", "hybrid")
    if mode not in SEARCH_MODES:
        raise _fail("memory.search.mode", f"must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
    max_results = _int(search.get("max_results", 5), "memory.search.max_results", 1, 100)
    min_score = search.get("min_score")
    if min_score is not None and (
        isinstance(min_score, bool)
        or not isinstance(min_score, int | float)
        or not -1 <= min_score <= 1
    ):
        raise _fail("memory.search.min_score", f"must be a number from -1 to 1, got {min_score!r}")
    return SearchConfig(mode, max_results, float(min_score) if min_score is not None else None)


def _kinds(value: Any) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_KINDS
    if not isinstance(value, list) or not value or not all(isinstance(k, str) for k in value):
        raise _fail("memory.kinds", "must be a non-empty list of kind names")
    for kind in value:
        if not _NAME.fullmatch(kind):
            raise _fail("memory.kinds", f"{kind!r} must be lower case letters, digits and _")
    if len(set(value)) != len(value):
        raise _fail("memory.kinds", "must not repeat a kind")
    return tuple(value)


def _labels(value: Any) -> tuple[Label, ...]:
    labels = _object(value, "memory.labels", tuple(value) if isinstance(value, Mapping) else ())
    result: list[Label] = []
    for name, spec in labels.items():
        path = f"memory.labels.{name}"
        if not _NAME.fullmatch(name):
            raise _fail(path, "label names are lower case letters, digits and _")
        spec = _object(spec, path, ("number", "description"))
        if "number" not in spec:
            raise _fail(path, "needs a number from 5 to 18")
        number = _int(spec["number"], f"{path}.number", LABEL_NUMBERS.start, LABEL_NUMBERS.stop - 1)
        description = spec.get("description")
        if not isinstance(description, str) or not description.strip():
            raise _fail(path, "needs a description the agent reads")
        for other in result:
            if other.number == number:
                raise _fail(path, f"number {number} is already used by label {other.name!r}")
        result.append(Label(name, number, description.strip()))
    return tuple(sorted(result, key=lambda label: label.number))


def _memory(value: Any) -> MemoryConfig:
    memory = _object(
        value,
        "memory",
        ("enabled", "scope", "extraction", "search", "tools", "pinned", "kinds", "labels"),
    )
    enabled = memory.get("enabled", False)
    if not isinstance(enabled, bool):
        raise _fail("memory.enabled", "must be true or false")
    read, write = _scope(memory.get("scope"))
    prompt, every = _extraction(memory.get("extraction"))
    tools = _string_list(memory.get("tools", []), "memory.tools", MEMORY_TOOLS)
    pinned_max: int | None = None
    if memory.get("pinned") is not None:
        pinned = _object(memory["pinned"], "memory.pinned", ("max_tokens",))
        if "max_tokens" not in pinned:
            raise _fail("memory.pinned", 'needs max_tokens, e.g. {"max_tokens": 2000}')
        pinned_max = _int(pinned["max_tokens"], "memory.pinned.max_tokens", 1, 100_000)
    return MemoryConfig(
        enabled=enabled,
        read=read,
        write=write,
        extraction_prompt=prompt,
        extraction_every_messages=every,
        search=_search(memory.get("search")),
        tools=tools,
        pinned_max_tokens=pinned_max,
        kinds=_kinds(memory.get("kinds")),
        labels=_labels(memory.get("labels")),
    )


def _history(value: Any) -> HistoryConfig | None:
    if value is None:
        return None
    history = _object(value, "history", ("index",))
    index = history.get("index", "messages")
    if index not in HISTORY_INDEXES:
        raise _fail("history.index", f"must be one of {', '.join(HISTORY_INDEXES)}, got {index!r}")
    return HistoryConfig(index)


def _normalized(memory: MemoryConfig, history: HistoryConfig | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "memory": {
            "enabled": memory.enabled,
            "scope": {"read": list(memory.read), "write": list(memory.write)},
            "extraction": {
                **({"prompt": memory.extraction_prompt} if memory.extraction_prompt else {}),
                "every": {"messages": memory.extraction_every_messages}
                if memory.extraction_every_messages
                else "turn",
            },
            "search": {
                "mode": memory.search.mode,
                "max_results": memory.search.max_results,
                **(
                    {"min_score": memory.search.min_score}
                    if memory.search.min_score is not None
                    else {}
                ),
            },
            "tools": list(memory.tools),
            **(
                {"pinned": {"max_tokens": memory.pinned_max_tokens}}
                if memory.pinned_max_tokens
                else {}
            ),
            "kinds": list(memory.kinds),
            "labels": {
                label.name: {"number": label.number, "description": label.description}
                for label in memory.labels
            },
        }
    }
    if history is not None:
        raw["history"] = {"index": history.index}
    return raw


def parse_harness(value: Any, previous: Harness | None = None) -> Harness:
    """Validates a harness; `previous` is the agent's prior version, whose labels must stay."""
    harness = _object(value, "", ("memory", "history")) if value is not None else {}
    memory = _memory(harness.get("memory"))
    history = _history(harness.get("history"))
    if previous is not None:
        for label in previous.memory.labels:
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
    return Harness(memory=memory, history=history, raw=_normalized(memory, history))
