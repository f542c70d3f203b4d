"""Stopping a background loop the service started with itself (search maintenance, turn
liveness, the embedded server's supervisor)."""

import asyncio
import contextlib


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancels a background loop and waits until it has ended; None (never started) is a no-op."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
