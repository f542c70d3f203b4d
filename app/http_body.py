"""A request's body read whole before anything acts on it, within a size limit and a time."""

import asyncio

from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive


async def read_limited(receive: Receive, limit: int, seconds: float) -> bytes | None:
    """The request body, or None once it grows past `limit` (chunked bodies have no length).
    ClientDisconnect when the client goes away first (app/observability/requests.py: a 499);
    TimeoutError when it is not whole within `seconds` (a client that never sends its last
    bytes held its buffer, up to `limit`, for as long as it kept the connection)."""
    body = bytearray()
    async with asyncio.timeout(seconds):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect
            body += message.get("body", b"")
            if len(body) > limit:
                return None
            if not message.get("more_body", False):
                return bytes(body)


# Sent with the 408 of a body that stalled: the server would otherwise keep the connection
# for its keep-alive time (5 s). Not with a 413: a client still sending its body would find
# the connection reset and never read the answer.
CLOSE = {"Connection": "close"}


def too_big(limit: int) -> str:
    """What a client whose body is over ENGRAM_MAX_BODY_BYTES is told."""
    return (
        f"request bodies are limited to {limit} bytes (ENGRAM_MAX_BODY_BYTES): nothing ran; "
        "send less in one request (fewer records or messages at once), or have the operator "
        "raise the limit"
    )


def too_slow(seconds: float) -> str:
    """What a client whose body did not arrive in time is told."""
    return (
        f"the request body did not arrive whole within {seconds:g} seconds "
        "(ENGRAM_BODY_TIMEOUT_SECONDS): send it at once"
    )


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, as read, then whatever comes next (a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
