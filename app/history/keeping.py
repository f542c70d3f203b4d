"""What a committed turn keeps in its session's history (H2-H5).

- `messages`: the turn's message as the agent received it, and each reply of the agent (its
  model calls of purpose `turn`) with the tools that reply called.
- `messages_and_tools`: also each result of those calls, or its error.
- A conversation handed in (`rememberConversation`, an execution of kind INGEST, counted as
  one turn of its session): its user messages, its assistant messages (as the agent's) and,
  with `messages_and_tools`, its tool messages (`ingested_events`).
- Never: the agent's own retrievals (recalls and `search_memory`, `read_memory` and
  `search_history` results: they are copies of what memory and history already hold) and
  skill loads; nor what memory reviews or context summaries (other purposes) said.

The events come from the committing attempt's own transcript, and are written only in the
turn's commit transaction (app/runtime/turns.py), so a failed attempt's words stay in its
transcript and are never searchable (H5).

Transcript event types are named here as strings (history does not import the runtime):
`turn.input`, `model.call` and `tool.execution`, as app/runtime/transcript.py writes them.
"""

import json
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import numpy as np

from app.embeddings.base import Embeds
from app.history import parts as partition
from app.text import storable, storable_json

MESSAGES = "messages"
MESSAGES_AND_TOOLS = "messages_and_tools"
# The agent's own retrievals and skill loads: their results are never kept (H4).
RETRIEVALS = frozenset({"search_memory", "read_memory", "search_history", "load_skill"})


@dataclass(frozen=True)
class KeptEvent:
    event_id: UUID
    sequence: int  # of the transcript event it keeps
    who: str  # user, agent or tool
    data: dict[str, Any]
    text: str
    parts: list[str]
    # Per part, the tools it names: a tool result's tool, or the tools an agent message calls
    # in each part holding its calls (a message that calls a tool some reader may not see has
    # its words and its calls kept in parts of their own, so that reader still finds the
    # words; `kept_events`' `apart`).
    part_tools: list[list[str]]
    call_id: str | None = None
    tool: str | None = None


def render(who: str, data: dict[str, Any]) -> str:
    """An event's searchable text, from what it keeps."""
    if who == "user":
        return str(data.get("message") or "")
    if who == "agent":
        return "\n".join(_words(data) + _calls(data))
    if "error" in data:
        return f"{data.get('name')} failed: {data['error']}"
    output = data.get("output")
    if isinstance(output, str):  # a tool message handed in: its text as it was
        return output
    return json.dumps(output, ensure_ascii=False)


def _words(data: dict[str, Any]) -> list[str]:
    """An agent message's words, as its text shows them."""
    return [data["content"]] if data.get("content") else []


def _calls(data: dict[str, Any]) -> list[str]:
    """An agent message's tool calls, a line each, as its text shows them."""
    return [
        f"called {call.get('name')} {call.get('arguments') or '{}'}"
        for call in data.get("toolCalls") or []
    ]


def _parts(
    who: str, data: dict[str, Any], text: str, tool: str | None, apart: Collection[str]
) -> tuple[list[str], list[list[str]]]:
    """An event's parts and the tools each names. An agent message that calls a tool of
    `apart` has its words apart from its calls, whose parts name every tool it calls; any other
    is split as it reads, each part naming the tools it calls (H2: a reply with its tools; H8:
    only a long event in parts)."""
    if who == "tool":
        parts = partition.split(text)
        return parts, [[tool] if tool is not None else [] for _ in parts]
    words, calls = _words(data), _calls(data)
    named = [c["name"] for c in data.get("toolCalls") or [] if isinstance(c.get("name"), str)]
    if who != "agent" or set(named).isdisjoint(apart):
        parts = partition.split(text)  # (a user's message, or a reply calling no tool: none)
        return parts, [named for _ in parts]
    said = partition.split(storable(words[0])) if words and words[0].strip() else []
    called = partition.split(storable("\n".join(calls)))
    return said + called, [[] for _ in said] + [named for _ in called]


def _event(
    sequence: int,
    who: str,
    data: dict[str, Any],
    apart: Collection[str] = (),
    **call: str | None,
) -> KeptEvent | None:
    data = storable_json(data)
    text = storable(render(who, data))
    if not text.strip():
        return None
    parts, tools = _parts(who, data, text, call.get("tool"), apart)
    return KeptEvent(uuid.uuid4(), sequence, who, data, text, parts, tools, **call)


def _in_order(kept: list[KeptEvent]) -> list[KeptEvent]:
    """The events with random IDs that rise in the order they were said: a turn's events share
    its commit's time, and a search breaks their ties by ID, the later event first (recency,
    app/history/store.py)."""
    ids = sorted(uuid.uuid4() for _ in kept)
    return [replace(e, event_id=i) for e, i in zip(kept, ids, strict=True)]


def kept_events(
    events: Iterable[tuple[int, str, dict[str, Any]]],
    index: str,
    message: str,
    apart: Collection[str],
) -> list[KeptEvent]:
    """The events a turn keeps, from its transcript rows (sequence, type, data) in order;
    `apart`: the tools whose calls some reader may not see (a search's `hidden_tools`), so
    that a reply calling one keeps its words in parts of their own."""
    kept: list[KeptEvent] = []
    calls: dict[str, str] = {}  # the agent's calls this turn: call ID -> tool name
    for sequence, type, data in events:
        found: KeptEvent | None = None
        if type == "turn.input":
            found = _event(sequence, "user", {"message": message})
        elif type == "model.call" and data.get("purpose") == "turn":
            tool_calls = [
                {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
                for c in data.get("toolCalls") or []
            ]
            calls.update((c["id"], c["name"]) for c in tool_calls)
            found = _event(
                sequence,
                "agent",
                {"content": data.get("content"), "toolCalls": tool_calls},
                apart,
            )
        elif type == "tool.execution" and index == MESSAGES_AND_TOOLS:
            name, call_id = data.get("name"), data.get("callId")
            # Only the agent's own calls (not a review's), and never a retrieval or recall.
            if call_id in calls and calls[call_id] == name and name not in RETRIEVALS:
                result = {"name": name, "callId": call_id}
                if "error" in data:
                    result["error"] = data["error"]
                else:
                    result["output"] = data.get("output")
                found = _event(sequence, "tool", result, call_id=call_id, tool=name)
        if found is not None:
            kept.append(found)
    return _in_order(kept)


def ingested_events(messages: Iterable[tuple[str, str]], index: str) -> list[KeptEvent]:
    """The events an ingested conversation keeps, from its (role, content) messages in order;
    each event's sequence is its message's place among them, from 1."""
    kept: list[KeptEvent] = []
    for sequence, (role, content) in enumerate(messages, start=1):
        found: KeptEvent | None = None
        if role == "user":
            found = _event(sequence, "user", {"message": content})
        elif role == "assistant":
            found = _event(sequence, "agent", {"content": content, "toolCalls": []})
        elif role == "tool" and index == MESSAGES_AND_TOOLS:
            found = _event(sequence, "tool", {"output": content})
        if found is not None:
            kept.append(found)
    return _in_order(kept)


@dataclass(frozen=True)
class Prepared:
    """A turn's kept events with each part's vector, ready for the commit transaction."""

    events: list[KeptEvent]
    vectors: np.ndarray | None  # one row per part, events in order
    embed_tokens: int


async def embed(embedder: Embeds, events: list[KeptEvent]) -> Prepared:
    """Embeds every part; run before the commit transaction (no transaction waits on it)."""
    texts = [p for e in events for p in e.parts]
    if not texts:
        return Prepared(events, None, 0)
    embedded = await embedder.embed(texts)
    return Prepared(events, embedded.vectors, embedded.tokens)
