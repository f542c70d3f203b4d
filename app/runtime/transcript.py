"""A turn's transcript: written as the turn goes (after each model call) and when it ends.

Events of an attempt that is still running are stored but not listed (see
store.list_events), so a transcript still appears whole when its attempt ends; and when a
process dies mid-turn, what the attempt said up to its last model call stays in its transcript
once the stale-turn sweep marks it FAILED.

Event types and what their `data` holds:

- `turn.input`: `{input, message}`: what the turn was asked, and the text the model read.
- `memory.pinned`: `{records: [{id, version}], tokens}`: the pins the instructions listed.
- `model.call`: `{purpose, model, usage, attempts, durationMs, finishReason, content,
  toolCalls}`: one chat completion, with its usage and why it was made (`turn`, `memory`).
- `embedding`: `{purpose: "embed", model, tokens, for}`: usage of the embedding model, for a
  recall, a `search_memory` or `search_history` query, the records `add_memory` wrote, or the
  parts of the events the turn kept in its session's history (`for: "history"`).
- `tool.execution`: `{name, callId, input, output}` or `{..., error}`: one execution of a
  native tool; a recall is one of `search_memory` with `recall: true` in its input.
- `output.use`: `{use: "RETRIEVED", execution, tool, records}`: the records of the
  `tool.execution` event numbered `execution` reached the model; for `search_history`,
  `events: [{id, part}]` instead of `records`.
- `turn.output` `{output}` or `turn.failed` `{error}`: how the attempt ended.
"""

from dataclasses import dataclass
from typing import Any

TURN_INPUT = "turn.input"
MEMORY_PINNED = "memory.pinned"
MODEL_CALL = "model.call"
EMBEDDING = "embedding"
TOOL_EXECUTION = "tool.execution"
OUTPUT_USE = "output.use"
TURN_OUTPUT = "turn.output"
TURN_FAILED = "turn.failed"


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
        self.events.append(Event(sequence, self.invocation_number, type, data))
        return sequence

    def embedding(self, model: str, tokens: int, used_for: str) -> None:
        self.add(EMBEDDING, {"purpose": "embed", "model": model, "tokens": tokens, "for": used_for})
