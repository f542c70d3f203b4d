"""The bound on one turn's whole time, ENGRAM_TURN_TIMEOUT_SECONDS (and on one ingest's review).

A turn's parts each have their own bound (a model call ENGRAM_MODEL_TIMEOUT_SECONDS, a turn
ENGRAM_MAX_MODEL_CALLS_PER_TURN of them, a statement the database's), which together allow a
turn tens of minutes. The deadline bounds the whole, from the attempt's start: past it, what is
in flight (a model call, a retry's wait, a tool call) is cancelled, and `within` raises
TimedOut, which the caller turns into a failure (turns.py: the turn fails, keeping nothing but
its transcript) or, for the end-of-turn memory review, into the review's failure (review.py:
the turn commits its answer without the review's records, whose messages wait for the next
review). The embedding of the history a turn keeps (once it answered, before its review) or an
ingest keeps is bounded too, and fails the turn or the ingest. The commit itself, a short
transaction, is never cut, nor is the write of a sign of life (TurnContext.keep_alive), which
the cut waits for, so the failure knows what it stored.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from app.config import Settings

SETTING = "ENGRAM_TURN_TIMEOUT_SECONDS"


class TimedOut(Exception):
    """The deadline passed; the message says what was stopped and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def deadline(settings: Settings) -> float | None:
    """The event loop's time at which a turn starting now must stop (None: no bound)."""
    seconds = settings.turn_timeout_seconds
    return asyncio.get_running_loop().time() + seconds if seconds else None


def bound(settings: Settings) -> str:
    """The setting as a message names it, with its value."""
    return f"{SETTING} ({settings.turn_timeout_seconds:g} seconds)"


@contextlib.asynccontextmanager
async def within(at: float | None, message: str) -> AsyncIterator[None]:
    """Runs the body until the loop's time `at` (None: unbounded); then cancels what it awaits
    and raises TimedOut(message). A TimeoutError of the body's own (not the deadline's) passes
    unchanged."""
    if at is None:
        yield
        return
    timeout = asyncio.timeout_at(at)
    try:
        async with timeout:
            yield
    except TimeoutError:
        if not timeout.expired():
            raise
        raise TimedOut(message) from None
