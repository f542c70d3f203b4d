"""The native memory tools: their JSON schemas, built from the agent's configuration, and
their executions during a turn.

A call the configuration does not allow (a tool not offered, `scope` or `pinned` where they
are not offered, a pin over budget, a malformed argument) fails with a message the model
reads, changes nothing, and the turn goes on. Each call is recorded in the transcript as an
execution of the native tool of its name.
"""

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
from pydantic import ValidationError

from app.actions.harness import MemoryConfig
from app.embeddings.base import Embeds
from app.embeddings.errors import EmbeddingFailed
from app.errors import DomainError
from app.history import search as history_search
from app.history.store import HistoryScope
from app.memory import search as memory_search
from app.memory.records import MemoryRecord
from app.memory.service import MemoryWork, NewMemory, check_label_filter
from app.runtime import redaction
from app.runtime import transcript as events
from app.runtime.model import ToolCall
from app.runtime.tool_args import (
    ADD_MEMORY,
    DELETE_MEMORY,
    MAX_SEARCH_LIMIT,
    NATIVE_TOOLS,
    READ_MEMORY,
    SEARCH_HISTORY,
    SEARCH_MEMORY,
    AddMemory,
    Arguments,
    DeleteMemory,
    ReadMemory,
    SearchHistory,
    SearchMemory,
    function_tool,
    schema_of,
)
from app.runtime.transcript import Transcript
from app.scope import Scope
from app.shapes import WRITTEN, first_error
from app.text import for_model, model_json, nests_deeper, shown, storable_json

log = logging.getLogger(__name__)

ARGUMENTS: dict[str, type[Arguments]] = {
    SEARCH_MEMORY: SearchMemory,
    ADD_MEMORY: AddMemory,
    READ_MEMORY: ReadMemory,
    DELETE_MEMORY: DeleteMemory,
    SEARCH_HISTORY: SearchHistory,
}
_SCHEMAS = {name: schema_of(arguments) for name, arguments in ARGUMENTS.items()}


class ToolRefused(Exception):
    """A call that fails with a message for the model; nothing was changed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def labels_property(memory: MemoryConfig, description: str) -> dict[str, Any]:
    """The agent's labels as one object property, each label a string the model fills in."""
    return {
        "type": "object",
        "description": description,
        "properties": {
            label.name: {"type": "string", "description": label.description}
            for label in memory.labels
        },
        "additionalProperties": False,
    }


def offers_scope(memory: MemoryConfig) -> bool:
    return Scope.AGENT in memory.write


def _tool(name: str, memory: MemoryConfig) -> dict[str, Any]:
    """The tool's schema from its arguments' model, completed from the configuration: the
    kinds, the labels, the scopes it may write and the pin budget, or without the properties
    the configuration does not offer."""
    description, declared, required = _SCHEMAS[name]
    properties = {}
    for key, prop in declared.items():
        if key == "kind":
            prop = {
                "type": "string",
                "enum": list(memory.kinds),
                "description": prop["description"],
            }
        elif key == "labels":
            if not memory.labels:
                continue
            prop = labels_property(
                memory, prop["description"] + " Keyed by label name; each value is an exact string."
            )
        elif key == "scope":
            if not offers_scope(memory):
                continue
            prop = {"type": "string", "enum": [s.value for s in memory.write], **prop}
        elif key == "pinned":
            if memory.pinned_max_tokens is None:
                continue
            prop = {
                **prop,
                "description": prop["description"].format(pinned=memory.pinned_max_tokens),
            }
        elif key == "limit" and name == SEARCH_MEMORY:
            default = memory.search.max_results
            prop = {**prop, "description": prop["description"].format(default=default)}
        properties[key] = prop
    return function_tool(name, description, properties, required)


def tool_schemas(memory: MemoryConfig) -> dict[str, dict[str, Any]]:
    """The native tools this configuration offers, by name, as OpenAI tool definitions."""
    if not memory.enabled:
        return {}
    offered = (SEARCH_MEMORY, *(name for name in NATIVE_TOOLS[1:] if name in memory.tools))
    return {name: _tool(name, memory) for name in offered}


SEARCH_HISTORY_SCHEMA = function_tool(SEARCH_HISTORY, *_SCHEMAS[SEARCH_HISTORY])


@dataclass(frozen=True)
class HistoryAccess:
    """What a turn's search_history reads: the session's history its scope allows."""

    pool: asyncpg.Pool
    embedder: Embeds
    scope: HistoryScope
    # Whether the reader may read memory records (M55): a client over MCP without the memory
    # read grants is not shown, nor told of, an event that holds a record's text.
    memory_text: bool = True


def record_view(record: MemoryRecord, memory: MemoryConfig) -> dict[str, Any]:
    """A record as the model and the transcript read it (labels by name)."""
    labels = {}
    for number, value in sorted(record.labels.items()):
        label = memory.label(int(number))
        labels[label.name if label else str(number)] = value
    view: dict[str, Any] = {
        "id": str(record.memory_id),
        "version": record.version,
        "summary": record.summary,
        "kind": record.kind,
        "scope": record.scope,
    }
    if record.content:
        view["content"] = record.content
    if labels:
        view["labels"] = labels
    if record.pinned:
        view["pinned"] = True
    if record.status != "ACTIVE":
        view["status"] = record.status
    if record.replaces:
        view["replaces"] = str(record.replaces)
    if record.replaced_by:
        view["replacedBy"] = str(record.replaced_by)
    if record.preview:
        view["preview"] = True
    view["created"] = record.created.isoformat()
    if record.score is not None:
        view["score"] = round(float(record.score), 4)
    return view


# What a write shows of a record of a scope the agent writes but does not read.
UNREAD_VIEW = ("id", "version", "kind", "scope", "status", "replaces", "created")


def versions(records: list[MemoryRecord]) -> list[dict[str, Any]]:
    return [{"id": str(r.memory_id), "version": r.version} for r in records]


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number} is beyond what a number can hold")
    return value


# The deepest arguments a call may send: the native tools' take two levels (labels), and
# what reads them (making them storable, validating them) recurses as deep as they go.
# Results of search_history whose texts reach this many characters are shown in a thread.
THREAD_TEXT_CHARS = 64 * 1024
MAX_ARGUMENT_DEPTH = 32
_TOO_DEEP = (
    f"the arguments are not valid JSON for a tool: they nest deeper than {MAX_ARGUMENT_DEPTH} "
    "levels; send one JSON object"
)


def parse_arguments(raw: str) -> dict[str, Any]:
    try:
        # NaN and Infinity are not JSON, and 1e400 no number (no JSON column would store them).
        value = (
            json.loads(raw, parse_constant=_not_json, parse_float=_finite) if raw.strip() else {}
        )
    except ValueError as e:
        raise ToolRefused(f"the arguments are not valid JSON ({e}); send one JSON object") from None
    except RecursionError:
        raise ToolRefused(_TOO_DEEP) from None
    if not isinstance(value, dict):
        raise ToolRefused("the arguments must be one JSON object")
    if nests_deeper(value, MAX_ARGUMENT_DEPTH):
        raise ToolRefused(_TOO_DEEP)
    # JSON escapes can still spell NUL or a lone surrogate: the model's words are made storable.
    return storable_json(value)


A = TypeVar("A", bound=Arguments)

# Why an argument the schema leaves out is refused, when it is one the configuration withholds.
_WITHHELD = {
    "scope": "scope is not available: this agent writes only session scope "
    "(harness.memory.scope.write does not include agent)",
    "pinned": "pinning is not available: harness.memory.pinned is not configured, "
    "so nothing can be pinned",
}


def _arguments(
    kind: type[A], args: dict[str, Any], schema: dict[str, Any], memory: MemoryConfig
) -> A:
    """The arguments as the offered schema allows them: its properties, its required ones."""
    properties = schema["function"]["parameters"]["properties"]
    for key in args:
        if key not in properties:
            raise ToolRefused(
                (_WITHHELD.get(key) if kind is AddMemory else None)
                or f"unknown parameter {shown(key)}; the parameters are: {', '.join(properties)}"
            )
    for key in schema["function"]["parameters"]["required"]:
        if args.get(key) in (None, ""):
            raise ToolRefused(f"{key} is required")
    try:
        return kind.model_validate(args, context={**WRITTEN, "memory": memory})
    except ValidationError as e:
        raise ToolRefused(first_error(e, "", inline=True)) from None


def _label_numbers(memory: MemoryConfig, labels: dict[str, str]) -> dict[int, str]:
    """A search's or listing's label filters by number."""
    numbers = {}
    for name, value in labels.items():
        numbers[memory.resolve_label(name).number] = value
        check_label_filter(name, value)
    return numbers


@dataclass(frozen=True)
class ToolMessage:
    content: str  # what the model reads: the output or the error, as JSON
    text: str  # the words of it that describe the work (record summaries, an error), for recall


@dataclass
class ToolResult:
    output: dict[str, Any]
    embed_tokens: int = 0
    retrieved: list[MemoryRecord] = field(default_factory=list)  # records that reach the model
    # History that does: a search_history's, even none (H10: each search is a RETRIEVED use).
    retrieved_events: list[dict[str, Any]] | None = None
    # What the transcript records, where it differs from what the model reads (None: the same).
    transcript_output: dict[str, Any] | None = None


@dataclass
class NativeTools:
    """Executes the model's native tool calls for one turn, on its unit of memory work."""

    work: MemoryWork | None
    memory: MemoryConfig
    transcript: Transcript
    embedder_name: str
    history: HistoryAccess | None = None
    max_query_chars: int = memory_search.MAX_QUERY_CHARS
    # A turn holds each memory call's RETRIEVED uses until the model call that reads its
    # result (`release_uses`): a result cleared before any call read it reached no model (M32).
    # None: recorded at once (over MCP the client reads the result as it is).
    held: list[tuple[str, dict[str, Any]]] | None = None

    def __post_init__(self) -> None:
        self.schemas = tool_schemas(self.memory)
        if self.history is not None:
            self.schemas[SEARCH_HISTORY] = SEARCH_HISTORY_SCHEMA
        self._handlers: dict[str, Callable[[dict[str, Any]], Awaitable[ToolResult]]] = {
            SEARCH_MEMORY: self._search,
            ADD_MEMORY: self._add,
            READ_MEMORY: self._read,
            DELETE_MEMORY: self._delete,
            SEARCH_HISTORY: self._search_history,
        }

    @property
    def offered(self) -> list[dict[str, Any]]:
        return list(self.schemas.values())

    def _use(self, call_id: str, use: dict[str, Any]) -> None:
        if self.held is None:
            self.transcript.add(events.OUTPUT_USE, use)
        else:
            self.held.append((call_id, use))

    def release_uses(self, read: Callable[[str], bool]) -> None:
        """Records the held uses of the results the next model call reads (`read(call_id)`),
        and drops the others: cleared before any call read them."""
        assert self.held is not None
        for call_id, use in self.held:
            if read(call_id):
                self.transcript.add(events.OUTPUT_USE, use)
        self.held.clear()

    async def call(self, call: ToolCall) -> "ToolMessage":
        """Runs one call; returns the tool message the model reads next."""
        args: dict[str, Any] | None = None
        record: dict[str, Any] = {"name": call.name, "callId": call.id}
        try:
            args = parse_arguments(call.arguments)
            self._check_offered(call.name)
            result = await self._handlers[call.name](args)
        except (ToolRefused, DomainError, EmbeddingFailed) as e:
            if isinstance(e, EmbeddingFailed):
                # The log names the provider's endpoint, which the model is not told.
                log.warning("%s: the embedding model failed: %s", call.name, e.logged)
                message = (
                    f"{call.name} could not run: the embedding model failed; try again later, "
                    "or go on without it"
                    if e.transient
                    else f"{call.name} could not run: the embedding model refused the text (the "
                    "service's configuration; retrying will not help); go on without it"
                )
            else:
                message = e.message
            return self._refused(call, args, message)
        if result.embed_tokens:
            self.transcript.embedding(self.embedder_name, result.embed_tokens, call.name)
        recorded = result.transcript_output
        record.update(input=args, output=result.output if recorded is None else recorded)
        sequence = self.transcript.add(events.TOOL_EXECUTION, record)
        use = {"use": "RETRIEVED", "execution": sequence, "tool": call.name}
        if result.retrieved:
            self._use(call.id, {**use, "records": versions(result.retrieved)})
        if result.retrieved_events is not None:
            # Each history search is a RETRIEVED use (H10), even one whose result is cleared
            # before a model call reads it: unlike a memory search's (M32), recorded at once.
            self.transcript.add(events.OUTPUT_USE, {**use, "events": result.retrieved_events})
        summaries = [
            view["summary"]
            for views in result.output.values()
            if isinstance(views, list)
            for view in views
            if isinstance(view, dict) and "summary" in view
        ]
        # Records are data: what could disguise them is stripped before the model reads them.
        return ToolMessage(model_json(result.output), "\n".join(summaries))

    def refuse(self, call: ToolCall, message: str) -> "ToolMessage":
        """Answers a call without running it: the model reads `message` as its error."""
        return self._refused(call, None, message)

    def _refused(self, call: ToolCall, args: dict[str, Any] | None, message: str) -> "ToolMessage":
        record: dict[str, Any] = {
            "name": call.name,
            "callId": call.id,
            "input": args if args is not None else {"arguments": call.arguments},
            "error": message,
        }
        self.transcript.add(events.TOOL_EXECUTION, record)
        return ToolMessage(json.dumps({"error": for_model(message)}, ensure_ascii=False), message)

    def _check_offered(self, name: str) -> None:
        if name in self.schemas:
            return
        if name == SEARCH_HISTORY:
            raise ToolRefused(
                "search_history is not available: this agent keeps no history "
                "(harness.history), or this turn has no session"
            )
        if name in NATIVE_TOOLS:
            if not self.memory.enabled:
                raise ToolRefused(f"{name} is not available: this agent's memory is not enabled")
            raise ToolRefused(
                f"{name} is not available to this agent: harness.memory.tools does not name it"
            )
        offered = ", ".join(self.schemas) or "none"
        raise ToolRefused(f"there is no tool named {shown(name)}; your tools are: {offered}")

    def _views(self, records: list[MemoryRecord]) -> list[dict[str, Any]]:
        return [record_view(r, self.memory) for r in records]

    def _changed_views(self, records: list[MemoryRecord]) -> list[dict[str, Any]]:
        """What a write shows of the records it wrote, replaced or deleted: one it replaced or
        deleted in a scope the agent writes but does not read tells that it changed, never
        what it said (what the agent wrote now, it is shown)."""
        views = self._views(records)
        return [
            {k: v[k] for k in UNREAD_VIEW if k in v}
            if r.status in ("SUPERSEDED", "DELETED") and r.scope not in self.memory.read
            else v
            for r, v in zip(records, views, strict=True)
        ]

    async def search(
        self,
        *,
        query: str | None,
        kind: str | None = None,
        labels: dict[int, str] | None = None,
        ids: list[UUID] | None = None,
        limit: int,
        after: str | None = None,
    ) -> memory_search.SearchResult:
        assert self.work is not None
        return await memory_search.search(
            self.work.pool,
            self.work.embedder,
            self.work.writer.reader(),
            self.memory.search,
            query=query,
            kind=kind,
            labels=labels or {},
            ids=ids,
            limit=limit,
            after=after,
            mode=self.memory.search.mode,
        )

    async def key_words(self, text: str, count: int) -> str:
        """`text`'s `count` words that weigh most in this agent's search (a recall's query)."""
        assert self.work is not None
        return await memory_search.key_words(self.work.pool, self.work.writer.reader(), text, count)

    async def _search(self, args: dict[str, Any]) -> ToolResult:
        a = _arguments(SearchMemory, args, self.schemas[SEARCH_MEMORY], self.memory)
        memory_search.check_query(a.query, self.max_query_chars)
        query = a.query.strip() if a.query and a.query.strip() else None
        if query is not None and a.after:
            # A ranked search issues no nextCursor: its best records are what it returns.
            raise ToolRefused(
                "after pages a listing (search_memory without a query); a search with a query "
                f"returns its best `limit` records: to see more, raise limit (at most "
                f"{MAX_SEARCH_LIMIT}) or narrow the search with kind, labels or other words"
            )
        found = await self.search(
            query=query,
            kind=a.kind,
            labels=_label_numbers(self.memory, a.labels),
            ids=a.ids,
            limit=self.memory.search.max_results if a.limit is None else a.limit,
            after=a.after,
        )
        records = list(found.records)
        output: dict[str, Any] = {"records": self._views(records)}
        if found.next_cursor:
            output["nextCursor"] = found.next_cursor
        return ToolResult(output, embed_tokens=found.embed_tokens, retrieved=records)

    async def _add(self, args: dict[str, Any]) -> ToolResult:
        a = _arguments(AddMemory, args, self.schemas[ADD_MEMORY], self.memory)
        assert self.work is not None
        before = len(self.work.embed_tokens)
        written = await self.work.add(
            NewMemory(
                summary=a.summary or "",
                kind=a.kind or "",
                content=a.content or "",
                # Bounded by the record's checks, whose words are about a value to save
                # (_label_numbers' check is a search filter's).
                labels={
                    self.memory.resolve_label(name).number: value
                    for name, value in a.labels.items()
                },
                scope=Scope(a.scope) if a.scope else None,
                pinned=a.pinned,
                replaces=a.replaces,
            )
        )
        return ToolResult(
            {"memories": self._changed_views(written)},
            embed_tokens=sum(self.work.embed_tokens[before:]),
        )

    async def _read(self, args: dict[str, Any]) -> ToolResult:
        memory_id = _arguments(ReadMemory, args, self.schemas[READ_MEMORY], self.memory).id
        assert self.work is not None
        found = await self.work.read(memory_id)
        if found is None:
            raise ToolRefused(f"no memory record {memory_id} is visible to you")
        return ToolResult({"sources": self._views([found])})

    async def _delete(self, args: dict[str, Any]) -> ToolResult:
        a = _arguments(DeleteMemory, args, self.schemas[DELETE_MEMORY], self.memory)
        assert self.work is not None
        deleted = await self.work.delete(a.id)
        return ToolResult({"memories": self._changed_views([deleted])})

    async def _search_history(self, args: dict[str, Any]) -> ToolResult:
        assert self.history is not None
        a = _arguments(SearchHistory, args, self.schemas[SEARCH_HISTORY], self.memory)
        memory_search.check_query(a.query, self.max_query_chars)
        access = self.history
        scope = access.scope
        if not access.memory_text:  # not ranked at all: neither a score nor a short page tells
            scope = replace(scope, hidden_tools=NATIVE_TOOLS)
        tokens = 0
        query = a.query if a.query and a.query.strip() else None  # a blank one: none given
        if a.ids is not None and query is not None:
            # Either would leave the other unanswered without a word to the model.
            raise ToolRefused("pass a query to search, or ids to read events whole, not both")
        if a.ids is not None:
            found = await history_search.read(access.pool, scope, a.ids)
        elif query is not None:
            searched = await history_search.search(
                access.pool, access.embedder, scope, query=query, limit=a.limit
            )
            found, tokens = searched.events, searched.embed_tokens
        else:
            raise ToolRefused("pass a query to search, or ids to read events whole")

        def shown_all() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            views, recorded = [], []
            for event in found:
                if not access.memory_text:  # an agent message that called a memory tool
                    event = redaction.history_event(event)
                memory = access.memory_text and redaction.carries_memory_text(event)
                shown = history_search.view(event)
                shown["text"] = for_model(shown["text"])
                views.append(shown)
                # Marked in the transcript: a reader without the memory read grants sees its
                # text reduced there (app/runtime/redaction.py).
                recorded.append({**shown, "memory": True} if memory else shown)
            return views, recorded

        # Reading a text as a model may (quoting its header-like lines) takes about 15 ms a
        # 64 KiB event: a long read is made in a thread, so the event loop keeps serving others.
        if sum(len(e.part_text or e.text) for e in found) > THREAD_TEXT_CHARS:
            views, recorded = await asyncio.to_thread(shown_all)
        else:
            views, recorded = shown_all()
        used = [{"id": v["id"], **({"part": v["part"]} if "part" in v else {})} for v in views]
        return ToolResult(
            {"events": views},
            embed_tokens=tokens,
            retrieved_events=used,
            transcript_output={"events": recorded},
        )
