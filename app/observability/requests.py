"""Each HTTP request: its ID (X-Request-ID), its metrics and its log line.

A pure ASGI middleware, outermost, so that everything behind it (the guard, GraphQL, a turn's
model calls) logs with the request's ID and counts in the service's metrics.
"""

import logging
import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect

from app.observability import logs
from app.observability.metrics import Metrics, using

log = logging.getLogger("app.access")

HEADER = "x-request-id"
# A client's own ID is kept when it is short and plain (it lands in logs and headers).
_WELL_FORMED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# A request whose client closed the connection before sending its body whole.
CLIENT_CLOSED = 499
# Refusals answered before GraphQL runs, by HTTP status: each the code its body carries (a body
# too slow, 408, is BAD_REQUEST; a token check rolled back past the lock bound, 409, CONFLICT),
# so engram_requests_total's `code` is always OK, an error code or CLIENT_CLOSED.
_STATUS_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHENTICATED",
    403: "ACCESS_DENIED",
    408: "BAD_REQUEST",
    409: "CONFLICT",
    413: "BAD_REQUEST",
    429: "TOO_MANY_REQUESTS",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass
class Outcome:
    """Filled in by the GraphQL layer: which root fields ran, and the first error's code."""

    operation: str | None = None
    code: str | None = None


outcome: ContextVar[Outcome | None] = ContextVar("engram_outcome", default=None)


def request_id_from(value: str | None) -> str:
    if value is not None and _WELL_FORMED.match(value):
        return value
    return uuid.uuid4().hex


def _code(status: int) -> str:
    if status < 400:
        return "OK"
    return _STATUS_CODES.get(status, f"HTTP_{status}")


class Observe:
    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(HEADER.encode())
        rid = request_id_from(sent.decode("latin-1") if sent is not None else None)
        status = 500
        result = Outcome()

        async def send_with_id(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER.encode()]
                message = {**message, "headers": [*headers, (HEADER.encode(), rid.encode())]}
            await send(message)

        started = time.perf_counter()
        rid_token = logs.request_id.set(rid)
        outcome_token = outcome.set(result)
        try:
            with using(self.metrics):
                await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client went away before its request was read whole: no one to answer, and
            # no fault of the service (as nginx logs it, 499).
            status, result.code = CLIENT_CLOSED, "CLIENT_CLOSED"
        finally:
            seconds = time.perf_counter() - started
            graphql = scope["path"] == "/graphql" and scope["method"] == "POST"
            code = result.code or _code(status)
            if graphql:
                self.metrics.request(result.operation or "-", code, seconds)
            log.info(
                "%s %s %d %.1f ms",
                scope["method"],
                scope["path"],
                status,
                seconds * 1000,
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round(seconds * 1000, 2),
                    "operation": result.operation if graphql else None,
                    "code": code if graphql else None,
                },
            )
            outcome.reset(outcome_token)
            logs.request_id.reset(rid_token)
