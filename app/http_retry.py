"""POST JSON to an OpenAI-compatible endpoint, retrying transient failures.

Shared by the embeddings client and the model client. Transient means: no connection, a
dropped connection, a timeout (read and write timeouts only when the caller allows it), a 5xx,
or one of the 4xx statuses the caller names. Retries back off exponentially with jitter, up to
`MAX_BACKOFF_SECONDS`, and honour the server's `Retry-After` up to `MAX_RETRY_AFTER_SECONDS` (a
value that is no wait, negative or NaN, is ignored: the backoff applies). An answer is read up
to the caller's `max_bytes` (TooLarge beyond); one whose `Content-Encoding` does not decode it
is Undecodable, not retried (it came whole, and a server or proxy that garbled it once will
again). Any other answer, success or not, goes back to the caller, which words its own errors.

Each attempt, from connecting to the answer's last byte, takes at most the caller's
`attempt_seconds`, and running out of it is a read timeout: the client's own timeouts bound
each read, so a server that trickles its answer would otherwise hold an attempt as long as
it liked.
"""

import asyncio
import contextlib
import math
import random
from collections.abc import AsyncIterator, Container
from typing import Any
from urllib.parse import quote, quote_plus

import httpx

from app.text import escaped, escaped_start

MAX_RETRY_AFTER_SECONDS = 30.0
# The longest computed wait between attempts (0.5 s doubled reaches it at the seventh retry).
MAX_BACKOFF_SECONDS = 30.0


class CallFailed(Exception):
    """A call to an outside server (the model's, the embedding provider's) that failed, said
    twice: `message` for whoever sent what it carried (an execution's error keeps it), with the
    server's own words; `logged` for the service's log, without them, since a server may quote
    the request it refused (a prompt, a record's text, a search's query): the server's address,
    the HTTP status and what kind of failure it was."""

    def __init__(self, message: str, logged: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.logged = logged or message


class Transient(Exception):
    """A failure worth retrying; its message is what to tell if the retries run out. `status`:
    the HTTP status of an answer (None: no answer, a transport error)."""

    def __init__(
        self, message: str, retry_after: float | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status

    @property
    def logged(self) -> str:
        """What a log says of it (CallFailed.logged): an answer's HTTP status, without the
        server's words; a transport error as its message says it (no server's words)."""
        return str(self) if self.status is None else f"HTTP {self.status}"


def times(attempts: int) -> str:
    """'once', '2 times', ...: how many attempts failed, as a message says it."""
    return "once" if attempts == 1 else f"{attempts} times"


class TooLarge(Exception):
    """The answer's body was longer than the caller reads; the rest was not read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is longer than {limit} bytes")
        self.limit = limit


class Undecodable(Exception):
    """The answer's body did not decode by its Content-Encoding (gzip over plain bytes)."""

    def __init__(self, encoding: str, reason: str) -> None:
        super().__init__(f"its body does not decode as its Content-Encoding ({encoding}) says")
        self.encoding = encoding
        self.reason = reason


class RetriesExhausted(Exception):
    """Every attempt failed transiently; `last` is the final failure."""

    def __init__(self, attempts: int, last: Transient) -> None:
        super().__init__(f"failed {times(attempts)}, last: {last}")
        self.attempts = attempts
        self.last = last


def server_message(response: httpx.Response) -> str:
    """The error an OpenAI-compatible server explains itself with, or the start of its body,
    without the credential the request sent: a server that quotes the key it refused ("Incorrect
    API key provided: Bearer sk-...") would otherwise put the operator's secret in a message
    that an execution's error, and its readers, keep. On one line, each character that would
    disguise it (a control, an escape sequence's ESC, a NUL, a bidi override or isolate, a lone
    surrogate) written as its escape (`escaped`): the server's words are kept in an execution's
    error, a console shows them, a log line and a terminal (`engram reembed`) print them."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError, RecursionError):  # the last: a body nested too deep
        message = None
    try:
        sent = response.request.headers.get("authorization")
    except RuntimeError:  # a response built without its request
        sent = None
    text = without_credential(str(message or response.text or response.reason_phrase), sent)
    text = escaped(" ".join(text.split()))
    return text if message else escaped_start(text, 300)


def without_credential(text: str, sent: str | None) -> str:
    """`text` with the Authorization value `sent` (and its credential alone, also URL-encoded
    or escaped as bytes) replaced by `[credential]`."""
    if not sent:
        return text
    _, _, credential = sent.partition(" ")
    secrets = {sent, sent.strip(), credential, credential.strip()}
    secrets |= {quote(s, safe="") for s in list(secrets)} | {quote_plus(s) for s in list(secrets)}
    secrets |= {repr(s.encode())[2:-1] for s in list(secrets)}  # as a refused header quotes it
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "[credential]")
    return text


def backoff(attempt: int, base_seconds: float) -> float:
    """The wait after failed attempt `attempt` (1: the first): `base_seconds` doubled for each
    attempt before it, with up to a quarter more of jitter, at most MAX_BACKOFF_SECONDS."""
    exponential = base_seconds * 2.0 ** min(attempt - 1, 64)  # (2**1024 is no float)
    return min(exponential * (1 + random.random() / 4), MAX_BACKOFF_SECONDS)


def _retry_after(response: httpx.Response) -> float | None:
    """The server's wait in seconds, at most MAX_RETRY_AFTER_SECONDS; None when it gives none
    that is a wait (absent, a date, negative, NaN: asyncio.sleep(nan) would never end)."""
    try:
        seconds = float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None
    if math.isnan(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


async def post_with_retries(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    max_retries: int,
    backoff_seconds: float,
    retried_4xx: Container[int],
    retry_read_timeouts: bool,
    attempt_seconds: float,
    max_bytes: int | None = None,
) -> tuple[httpx.Response, int]:
    """The first answer that is not transient, and the number of attempts it took.

    Raises RetriesExhausted after `max_retries` retries; with `retry_read_timeouts` false,
    httpx.ReadTimeout and httpx.WriteTimeout propagate at once; TooLarge (not retried) for a
    body longer than `max_bytes`, once decoded; Undecodable (not retried) for one that does not
    decode.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            response = await _post(
                client,
                url,
                body,
                headers,
                retried_4xx,
                retry_read_timeouts,
                max_bytes,
                attempt_seconds,
            )
        except Transient as e:
            if attempt > max_retries:
                raise RetriesExhausted(attempt, e) from e
            wait = backoff(attempt, backoff_seconds) if e.retry_after is None else e.retry_after
            await asyncio.sleep(wait)
        else:
            return response, attempt


@contextlib.asynccontextmanager
async def _within(seconds: float) -> AsyncIterator[None]:
    """Ends what it holds after `seconds`, raising httpx.ReadTimeout as a read timeout does."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as e:
        raise httpx.ReadTimeout(f"no whole answer within {seconds:g} s") from e


async def _post(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None,
    retried_4xx: Container[int],
    retry_read_timeouts: bool,
    max_bytes: int | None,
    attempt_seconds: float,
) -> httpx.Response:
    sent = (headers or {}).get("Authorization") or client.headers.get("authorization")
    try:
        async with (
            _within(attempt_seconds),
            client.stream("POST", url, json=body, headers=headers) as streamed,
        ):
            response = await _read(streamed, max_bytes)
    except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
        if not retry_read_timeouts:
            raise
        raise Transient(without_credential(f"{type(e).__name__}: {e}", sent)) from e
    except httpx.TransportError as e:  # no connection, connect timeout, dropped connection
        # (one refusing the header itself, a key with a newline, quotes it)
        raise Transient(without_credential(f"{type(e).__name__}: {e}", sent)) from e
    if response.status_code in retried_4xx or response.status_code >= 500:
        raise Transient(
            f"HTTP {response.status_code}: {server_message(response)}",
            _retry_after(response),
            response.status_code,
        )
    return response


# Headers that describe the body as it came over the wire, not as it was read (decoded).
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


async def _read(response: httpx.Response, max_bytes: int | None) -> httpx.Response:
    """The response with its body read, decoded, at most `max_bytes` of it (TooLarge beyond,
    having read no more than that: a body's length, or a compressed one's, is no promise);
    Undecodable when its Content-Encoding does not decode it (httpx's DecodingError is no
    TransportError, and would otherwise reach the caller as an error of its own)."""
    try:
        return await _read_decoded(response, max_bytes)
    except httpx.DecodingError as e:
        encoding = " ".join(response.headers.get("content-encoding", "").split())[:100]
        raise Undecodable(encoding, str(e)[:200]) from e


async def _read_decoded(response: httpx.Response, max_bytes: int | None) -> httpx.Response:
    if max_bytes is None:
        await response.aread()
        return response
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(max_bytes)
        chunks.append(chunk)
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(
        response.status_code, headers=headers, content=b"".join(chunks), request=response.request
    )
