"""Each HTTP request: its ID (X-Request-ID), its metrics and its log line.

A pure ASGI middleware, outermost, so that everything behind it (the guard, GraphQL, a turn's
model calls) logs with the request's ID and counts in the service's metrics.
"""

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

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
    """`on_error` answers what escapes the app (the app's handler of Exception): here, inside
    this middleware, so that its answer carries the request's ID and is logged and counted with
    the status and code the client gets (Starlette's own handler answers outside it)."""

    def __init__(
        self,
        app: Any,
        metrics: Metrics,
        on_error: Callable[[Request, Exception], Awaitable[Response]] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.on_error = on_error

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(HEADER.encode())
        rid = request_id_from(sent.decode("latin-1") if sent is not None else None)
        status = 500
        started = False
        result = Outcome()

        async def send_with_id(message: Any) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER.encode()]
                message = {**message, "headers": [*headers, (HEADER.encode(), rid.encode())]}
            await send(message)

        began = time.perf_counter()
        rid_token = logs.request_id.set(rid)
        outcome_token = outcome.set(result)
        try:
            with using(self.metrics):
                await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client went away before its request was read whole: no one to answer, and
            # no fault of the service (as nginx logs it, 499).
            status, result.code = CLIENT_CLOSED, "CLIENT_CLOSED"
        except Exception as error:
            if started or self.on_error is None:
                raise
            answer = await self.on_error(Request(scope, receive), error)
            await answer(scope, receive, send_with_id)
            result.code = None  # the answer's status names its code (_STATUS_CODES)
        finally:
            seconds = time.perf_counter() - began
            graphql = scope["path"] == "/graphql" and scope["method"] == "POST"
            code = result.code or _code(status)
            if graphql:
                self.metrics.request(result.operation or "-", code, seconds)
            line = "%s %s %d %.1f ms"
            args: list[object] = [scope["method"], scope["path"], status, seconds * 1000]
            if graphql:
                # Its operation and outcome too: an answer's errors (BAD_REQUEST, NOT_FOUND,
                # CONFLICT, ...) mostly come with status 200.
                line += " %s %s"
                args += [result.operation or "-", code]
            log.info(
                line,
                *args,
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
