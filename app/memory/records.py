"""Memory records as the layers pass them around, and the limits every write obeys."""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import numpy as np

from app.scope import Scope
from app.text import CHARS_PER_TOKEN, model_json

Status = Literal["ACTIVE", "DELETED", "SUPERSEDED"]
Source = Literal["EXTRACTION", "TOOL", "OPERATOR", "MCP"]

MAX_SUMMARY_BYTES = 512
MAX_CONTENT_BYTES = 16 * 1024


@dataclass(frozen=True, kw_only=True)
class RecordFields:
    """A record's columns that its writer gives; the database sets the others (MemoryRecord).

    The one field list of a record: app/memory/store.py derives its column lists, SELECTs and
    INSERTs from these dataclasses' fields."""

    account_id: UUID
    action_id: UUID
    memory_id: UUID
    summary: str
    content: str
    metadata: Any
    status: Status
    scope: Scope
    kind: str
    source: Source
    pinned: bool
    labels: dict[int, str]  # label number -> exact value
    replaces: UUID | None
    preview: bool
    execution_id: UUID
    invocation_number: int
    action_version: int
    session_id: str | None
    modified_by: str


@dataclass(frozen=True, kw_only=True)
class NewRecord(RecordFields):
    """A record to write, with the vector of its text (None: a tombstone, or not embedded)."""

    embedding: np.ndarray | None


@dataclass(frozen=True, kw_only=True)
class MemoryRecord(RecordFields):
    """A record as stored: its writer's fields and the database's."""

    version: int
    created: datetime
    modified: datetime
    replaced_by: UUID | None
    score: float | None = field(default=None, compare=False)  # set by search, not a column

    def pinned_line(self) -> str:
        """How a pinned record is listed in a turn's instructions (and counted for the budget)."""
        return pin_line(self.summary, self.memory_id)


def pin_line(summary: str, memory_id: UUID) -> str:
    """The summary as quoted data: a JSON string (a quote, a newline or a fake `(memory ...)`
    tag inside cannot end it), stripped of the characters that disguise text, its angle
    brackets and line separators escaped (`model_json`: no tag or chat template role marker
    such as `<|im_start|>` in the instructions)."""
    return f"- {model_json(summary)} (memory {memory_id})"


# What a pinned line adds to its summary's JSON string (`- `, ` (memory <ID>)`), with the line
# break before the next: a list is as long as its summaries' strings and this for each, less 1.
PIN_LINE_EXTRA = len(pin_line("", UUID(int=0))) - len('""') + 1


def pinned_listing(records: Iterable[MemoryRecord]) -> str:
    """The pinned records as a turn's instructions list them: one line each."""
    return "\n".join(r.pinned_line() for r in records)


def pinned_tokens(lines: Iterable[str]) -> int:
    """The budget a listing of these lines takes, at about four characters per token."""
    return math.ceil(len("\n".join(lines)) / CHARS_PER_TOKEN)
