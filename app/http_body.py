"""A request's body read whole before anything acts on it, within a size limit."""

from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive


async def read_limited(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None once it grows past `limit` (chunked bodies have no length).
    ClientDisconnect when the client goes away first (app/observability/requests.py: a 499)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


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
