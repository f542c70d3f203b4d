"""What a reader without the memory grants sees of memory inside executions and transcripts.

Spec M55: reading records through the API needs READ_MEMORY's grants, "whoever asks, including
whoever starts or calls the agent". A turn's transcript holds the records its recalls and
memory tools returned or wrote, and the text the agent gave `add_memory`; an operator's
execution names the records it wrote. To a reader without READ_MEMORY each record is reduced
to its identity (`id` or `memoryId`, and `version`), a memory tool's arguments to those
that carry no record text, a search_history result that holds record text (a memory tool's
result or call, kept in the session's history) to the line saying who it is from, and a
session's running summary (a `context.summary` event, a model call of purpose `context`) to a
note: it folds in the memory tools' calls and results. Formats are
those of app/runtime/transcript.py.
"""

import json
from dataclasses import replace
from typing import Any

from app.auth import resources
from app.auth.caller import Caller
from app.auth.policies import is_allowed
from app.history import keeping
from app.history.search import Event
from app.runtime import transcript as events
from app.runtime.tool_args import NATIVE_TOOLS

# Keys of a record view (app.runtime.tools.record_view) that carry what the record says.
RECORD_TEXT = frozenset({"summary", "content", "labels", "metadata"})
# A memory tool's arguments that may carry it too: a recall's query is built from recalled
# summaries, and `arguments` holds the raw text of a call whose JSON did not parse.
ARGUMENT_TEXT = RECORD_TEXT | {"query", "arguments"}
IDENTITY = ("id", "memoryId", "version")


def may_read(caller: Caller) -> bool:
    """Whether the caller holds the grants to read the agent's memory records."""
    return all(is_allowed(caller.policies, verb, name) for verb, name in resources.READ_MEMORY)


def hidden_tools(caller: Caller) -> tuple[str, ...]:
    """The tools whose history events a search by `caller` leaves out: the memory tools', for
    a caller without the memory read grants (their calls and results hold record text)."""
    return () if may_read(caller) else NATIVE_TOOLS


def execution_value(value: Any) -> Any:
    """An execution's input or output with every record view reduced to its identity, and
    every search_history result that holds record text reduced to who said it."""
    if isinstance(value, list):
        return [execution_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if ("id" in value or "memoryId" in value) and "version" in value and _has_text(value):
        return {k: value[k] for k in IDENTITY if k in value}
    if _is_history_view(value) and _holds_memory_text(value):
        header = value["text"].split("\n", 1)[0]  # "turn 3, tool add_memory"
        return {**value, "text": f"{header}\n{HIDDEN}"}
    if value.get("tool") in NATIVE_TOOLS and isinstance(value.get("arguments"), dict):
        # An MCP call's input (app/runtime/calls.py): the arguments may carry record text.
        reduced = {k: execution_value(v) for k, v in value.items() if k != "arguments"}
        return {**reduced, "arguments": _without_text(value["arguments"])}
    if "candidate" in value and "action" in value:
        # A decision of rememberConversation: the candidate's summary is memory text.
        return {k: v for k, v in value.items() if k not in ("summary", "note")}
    return {k: execution_value(v) for k, v in value.items()}


def event_data(type: str, data: Any) -> Any:
    """A transcript event's data as a reader without READ_MEMORY sees it."""
    if not isinstance(data, dict):
        return execution_value(data)
    if type == events.TOOL_EXECUTION and data.get("name") in NATIVE_TOOLS:
        reduced = dict(data)
        if isinstance(data.get("input"), dict):
            reduced["input"] = _without_text(data["input"])
        if "output" in data:
            reduced["output"] = execution_value(data["output"])
        return reduced
    if type == events.MODEL_CALL:
        reduced = dict(data)
        review = data.get("purpose") == "memory"  # a memory review's words are memory text
        if review:
            reduced["content"] = None
        elif data.get("purpose") == "context" and reduced.get("content") is not None:
            reduced["content"] = HIDDEN_SUMMARY
        calls = data.get("toolCalls")
        if isinstance(calls, list):
            reduced["toolCalls"] = [
                _call_without_arguments(c)
                if review
                else _call_without_text(c)
                if _names_memory_tool(c)
                else c
                for c in calls
            ]
        return reduced
    if type == events.MEMORY_REVIEW:
        return _review_without_text(data)
    if type == events.CONTEXT_SUMMARY and "summary" in data:
        return {**data, "summary": HIDDEN_SUMMARY}
    return execution_value(data)


def history_event(event: Event) -> Event:
    """A kept event of session history as a reader without READ_MEMORY sees it: a memory
    tool's arguments and the records its result names reduced as in transcripts."""
    if event.who == "user":
        return event
    if event.who == "agent":
        reduced = event_data(events.MODEL_CALL, {"purpose": "turn", **event.data})
        data = {"content": reduced.get("content"), "toolCalls": reduced.get("toolCalls") or []}
    else:
        data = event_data(events.TOOL_EXECUTION, event.data)
    if data == event.data:
        return event
    text = keeping.render(event.who, data)
    if event.part_text is None:
        return replace(event, data=data, text=text)
    # A search result's part that held what is reduced: the event's reduced text whole.
    part = text if carries_memory_text(event) else event.part_text
    return replace(event, data=data, text=text, part_text=part)


def carries_memory_text(event: Event) -> bool:
    """A kept event, or the part of it a search found, that holds memory record text: a memory
    tool's result (the records it returned or wrote), or an agent message's call of one (its
    arguments). A part decides by the tools it names: one holding only the message's words
    names none (a part kept before parts named tools counts as the whole message)."""
    if event.who == "tool":
        return event.tool in NATIVE_TOOLS
    if event.who != "agent" or not isinstance(event.data, dict):
        return False
    if event.part_text is not None and event.part_tools is not None:
        return not set(event.part_tools).isdisjoint(NATIVE_TOOLS)
    calls = event.data.get("toolCalls") or []
    return any(isinstance(c, dict) and c.get("name") in NATIVE_TOOLS for c in calls)


def _review_without_text(data: dict[str, Any]) -> dict[str, Any]:
    """A memory review's event: its candidates reduced to their handles, and its decisions
    to what was decided (a delete's evidence quotes the conversation's memory text)."""
    reduced = dict(data)
    if isinstance(data.get("candidates"), list):
        reduced["candidates"] = [
            {"handle": c.get("handle")} if isinstance(c, dict) else None for c in data["candidates"]
        ]
    if isinstance(data.get("decisions"), list):
        reduced["decisions"] = [_decision_without_text(d) for d in data["decisions"]]
    for key in ("malformed", "dropped"):  # may quote what the model wrote
        if key in data:
            reduced[key] = [] if isinstance(data[key], list) else None
    return reduced


HIDDEN = "[memory record text: shown only with the memory read grants]"
# A session's running summary (purpose `context`) folds in the conversation's memory tool calls
# and results, so it may hold record text anywhere in it.
HIDDEN_SUMMARY = (
    "[conversation summary: shown only with the memory read grants, as it may hold memory text]"
)


def _is_history_view(value: dict[str, Any]) -> bool:
    """A search_history result as app.history.search.view makes it."""
    return isinstance(value.get("text"), str) and "execution" in value and "sequence" in value


def _holds_memory_text(view: dict[str, Any]) -> bool:
    """Marked so when it was found (`carries_memory_text`); a result recorded before the
    marks, by its call's tool, or by its text naming a call of a memory tool."""
    if view.get("memory") is True:
        return True
    call = view.get("call")
    if isinstance(call, dict) and call.get("name") in NATIVE_TOOLS:
        return True
    return any(f"called {name} " in view["text"] for name in NATIVE_TOOLS)


def _has_text(value: dict[str, Any]) -> bool:
    return not RECORD_TEXT.isdisjoint(value)


def _without_text(arguments: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if k not in ARGUMENT_TEXT}


def _names_memory_tool(call: Any) -> bool:
    return isinstance(call, dict) and call.get("name") in NATIVE_TOOLS


def _decision_without_text(decision: Any) -> Any:
    if not isinstance(decision, dict):
        return None
    kept = {k: v for k, v in decision.items() if k not in ("evidence", "ignored")}
    if "ignored" in decision:  # it quotes the handle the model wrote, which may be any text
        kept["ignored"] = "the record handle was not shown; nothing changed"
    return kept


def _call_without_arguments(call: Any) -> Any:
    """A memory review's call: its arguments are candidates and decisions, memory text."""
    return {**call, "arguments": "{}"} if isinstance(call, dict) else call


def _call_without_text(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    try:
        arguments = json.loads(call.get("arguments") or "{}")
    except (TypeError, ValueError, RecursionError):
        arguments = None
    kept = _without_text(arguments) if isinstance(arguments, dict) else {}
    return {**call, "arguments": json.dumps(kept, ensure_ascii=False)}
