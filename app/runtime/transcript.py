"""A turn's transcript: written as the turn goes (after each model call) and when it ends.

Events of an attempt that is still running are stored but not listed (see
store.list_event_pages), so a transcript still appears whole when its attempt ends; and when a
process dies mid-turn, what the attempt said up to its last model call stays in its transcript
once the stale-turn sweep marks it FAILED.

Event types and what their `data` holds:

- `turn.input`: `{input}`: what the turn was asked (the model reads a string as it is, any
  other value as its JSON).
- `memory.pinned`: `{records: [{id, version}], tokens}`: the pins the instructions listed.
- `model.call`: `{purpose, model, usage, attempts, durationMs, finishReason, content,
  toolCalls}`: one chat completion, with its usage and why it was made (`turn`, `memory`,
  `context`).
- `embedding`: `{purpose: "embed", model, tokens, for}`: usage of the embedding model, for a
  recall, a `search_memory` or `search_history` query, the records `add_memory` wrote, or the
  parts of the events the turn kept in its session's history (`for: "history"`).
- `tool.execution`: `{name, callId, input, output}` or `{..., error}`: one execution of a
  native tool; a recall is one of `search_memory` with `recall: true` in its input.
- `output.use`: `{use: "RETRIEVED", execution, tool, records}`: the records of the
  `tool.execution` event numbered `execution` reached the model; for `search_history`,
  `events: [{id, part}]` instead of `records`.
- `context.cleared`: `{results, turns, tokens, reason}`: how many tool results were cleared
  to keep the context within its budget, of which turns (null: the running turn), the tokens
  that saved, and why (`budget`, or `too large` for the latest call's own results).
- `context.summary`: `{through: {turn, message}, messages, turns, calls, tokens, summary}`:
  older messages folded into the session's running summary by `calls` model calls of purpose
  `context`; it now reaches through message `message` of turn `turn` (null: the running turn).
- `memory.review`: `{messages: {count, from, to}, candidates, neighbours, decisions, written}`
  or `{..., error}`: one end-of-turn memory review (app/runtime/review.py); its model calls
  are `model.call` events of purpose `memory`.
- `turn.output` `{output}` or `turn.failed` `{error}`: how the attempt ended. When the
  database refused the failed attempt's last events, `turn.failed` is written alone and says
  so in `transcriptLost`.
- `memory.review.dropped`: `{reason, records}`, after `turn.output`, written only by the commit
  it describes: the turn committed without the records its review wrote (`records`, their
  versions), since another turn's review, committed meanwhile, covered an earlier turn this
  one read too, or another writer changed a record the review changes after it read it; this
  turn's messages wait for the next review.

What a model or a tool said is stored as it was, except NUL and lone surrogates (which no
PostgreSQL text or JSON value can hold), each replaced by U+FFFD (app.text.storable).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.text import storable_json

if TYPE_CHECKING:
    from app.runtime.model import Completion

TURN_INPUT = "turn.input"
MEMORY_PINNED = "memory.pinned"
MODEL_CALL = "model.call"
EMBEDDING = "embedding"
TOOL_EXECUTION = "tool.execution"
OUTPUT_USE = "output.use"
CONTEXT_CLEARED = "context.cleared"
CONTEXT_SUMMARY = "context.summary"
MEMORY_REVIEW = "memory.review"
MEMORY_REVIEW_DROPPED = "memory.review.dropped"
TURN_OUTPUT = "turn.output"
TURN_FAILED = "turn.failed"
# Every type an event is written with (an import takes no other).
TYPES = (
    TURN_INPUT,
    MEMORY_PINNED,
    MODEL_CALL,
    EMBEDDING,
    TOOL_EXECUTION,
    OUTPUT_USE,
    CONTEXT_CLEARED,
    CONTEXT_SUMMARY,
    MEMORY_REVIEW,
    MEMORY_REVIEW_DROPPED,
    TURN_OUTPUT,
    TURN_FAILED,
)


def model_call(completion: "Completion", purpose: str) -> dict[str, Any]:
    """The data of a `model.call` event."""
    return {
        "purpose": purpose,
        "model": completion.model,
        "usage": completion.usage,
        "attempts": completion.attempts,
        "durationMs": round(completion.duration_ms, 2),
        "finishReason": completion.finish_reason,
        "content": completion.content,
        "toolCalls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in completion.tool_calls
        ],
    }


@dataclass(frozen=True)
class Event:
    sequence: int
    invocation_number: int
    type: str
    data: dict[str, Any]


class Transcript:
    """The events of one invocation, numbered after those earlier invocations already wrote."""

    def __init__(self, invocation_number: int, first_sequence: int = 1) -> None:
        self.invocation_number = invocation_number
        self._next = first_sequence
        self.events: list[Event] = []
        self.written = 0  # how many of `events` are stored

    def unwritten(self) -> list[tuple[int, int, str, Any]]:
        """The rows (sequence, invocation_number, type, data) not stored yet."""
        return [
            (e.sequence, e.invocation_number, e.type, e.data) for e in self.events[self.written :]
        ]

    def add(self, type: str, data: dict[str, Any]) -> int:
        sequence = self._next
        self._next += 1
        # Events carry what models and tools said: stored whatever characters it holds.
        self.events.append(Event(sequence, self.invocation_number, type, storable_json(data)))
        return sequence

    def embedding(self, model: str, tokens: int, used_for: str) -> None:
        self.add(EMBEDDING, {"purpose": "embed", "model": model, "tokens": tokens, "for": used_for})
