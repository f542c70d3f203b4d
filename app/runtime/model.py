"""The model client: OpenAI-compatible chat completions with tool calling, over httpx.

Every request says why it is made: the header `X-Engram-Purpose` and `metadata.purpose` in
the body (`turn` for the agent's own calls, `memory` for memory reviews, `context` for the
summaries that keep a turn's context within its budget). A transient failure
(no connection, a connect timeout, 429 or 5xx) is retried with exponential backoff, honouring
`Retry-After` (app/http_retry.py); any other 4xx fails at once with the server's message. An
attempt not answered whole within ENGRAM_MODEL_TIMEOUT_SECONDS (connecting, waiting, and
reading the reply however slowly the server sends it) times out, and is not retried (the model
may still be working on it, and a retry would pay twice): a call takes at most its retries'
worth of that, plus the waits between them.

A reply is read up to `ENGRAM_MODEL_MAX_REPLY_BYTES`: a longer one fails the call, as one that
is not a chat completion does (not JSON, nested deeper than `MAX_REPLY_DEPTH`, a part of
another type, a body its Content-Encoding does not decode), naming what is wrong. Usage the
reply reports that is no count (negative, fractional, not a number, 2**53 or more) is recorded
as unknown, and logged.
"""

import asyncio
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from uuid import UUID

import httpx

from app.actions.model import ModelConfig, check_endpoint
from app.config import (
    FILE_SUFFIX,
    SECRET_FILE_WAIT_SECONDS,
    UNSENDABLE_KEY,
    SecretFileRefused,
    Settings,
    is_sendable_key,
    variable_or_file,
)
from app.http_retry import (
    CallFailed,
    RetriesExhausted,
    TooLarge,
    Undecodable,
    post_with_retries,
    server_message,
    times,
)
from app.observability import metrics
from app.state import ServiceKey
from app.text import MAX_COUNT, escaped, escaped_start, nests_deeper, storable

log = logging.getLogger(__name__)

Purpose = Literal["turn", "memory", "context"]
PURPOSE_HEADER = "X-Engram-Purpose"
_RETRIED_4XX = frozenset({429})
# An upstream error body may echo the request (or anything else): only its start is kept.
_EXCERPT_CHARS = 200
# A completion's own shape takes seven levels, the tool calls' arguments (sent as an object by
# some servers) a few more; a deeper reply is no model's answer, and walking it (json.dumps,
# repr, a later request that sends it back) would exhaust Python's stack.
MAX_REPLY_DEPTH = 64


class ModelFailed(CallFailed):
    """The model could not be reached or answered unusably; the message says what to fix (and
    what its server said, which `logged` leaves out: it may quote the prompt)."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text exactly as the model sent it: it may be malformed


@dataclass(frozen=True)
class Completion:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    model: str
    usage: dict[str, int]
    attempts: int
    duration_ms: float
    message: dict[str, Any] = field(repr=False)  # the assistant message, to send back next call


def unique_call_ids(completion: Completion, called: set[str], reply: int) -> Completion:
    """The completion with each tool call's ID unique among the turn's so far (`called`, which
    it extends; `reply`: the reply's number in the turn). A server that sends no IDs has every
    reply's calls named call_0, call_1, ... (`_shape`), and one may repeat its own: a result is
    paired with its call by ID, in the requests that follow and in a later turn's window
    rebuilt from the transcript, so a repeated ID is renamed (`call_0~2.0`)."""
    calls = []
    for i, call in enumerate(completion.tool_calls):
        if call.id in called:
            renamed = f"{call.id}~{reply}.{i}"
            while renamed in called:
                renamed += "~"
            call = replace(call, id=renamed)
        called.add(call.id)
        calls.append(call)
    return replace(completion, tool_calls=tuple(calls))


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    api_key: str | None
    temperature: float | None
    max_tokens: int | None
    # What names this endpoint, for a failure message a person can act on.
    setting: str = "ENGRAM_MODEL_BASE_URL"


async def unset_keys(settings: Settings) -> list[str]:
    """What is wrong with each key ENGRAM_MODEL_ALLOWED_KEY_ENVS allows that a model call could
    not read now (neither NAME nor NAME_FILE set, or a file refused, or one not read within
    SECRET_FILE_WAIT_SECONDS): said at start, where an operator is looking, rather than first by
    an agent's failed turn. Never the key. The files are read as a model call reads them
    (`KeyFiles`), together: a file system that does not answer holds the start for that long
    once, not for each key."""
    allowed = settings.model_allowed_key_envs
    names = list(allowed if isinstance(allowed, list) else allowed.keys())
    keys = KeyFiles()
    try:
        read = await asyncio.gather(*(keys.read(name) for name in names), return_exceptions=True)
    finally:
        keys.close()
    said = []
    for name, key in zip(names, read, strict=True):
        if isinstance(key, SecretFileRefused):
            said.append(f"{name}: {key}")
        elif isinstance(key, BaseException):
            raise key
        elif not (key := (key or "").strip()):
            said.append(
                f"{name} is not set where Engram runs (neither {name} nor {name}{FILE_SUFFIX})"
            )
        elif not is_sendable_key(key):
            said.append(f"{name} {UNSENDABLE_KEY}")
    return said


class KeyFiles:
    """Reads model keys' files (`variable_or_file`) in threads of their own, off the event loop:
    a file on a file system that does not answer (a hung NFS or FUSE mount) held every request
    of the process. A read not done within SECRET_FILE_WAIT_SECONDS is refused; it goes on in its
    thread, and the calls that need the same key meanwhile wait for it rather than start another
    read, so that a hung file holds one thread, not one per call."""

    def __init__(self) -> None:
        self._threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="engram-key-file")
        self._reading: dict[str, asyncio.Future[str | None]] = {}

    async def read(self, name: str) -> str | None:
        path = os.environ.get(name + FILE_SUFFIX, "")
        if not path.strip():
            return variable_or_file(name)  # the variable alone: no file to wait for
        reading = self._reading.get(name)
        if reading is None or reading.get_loop() is not asyncio.get_running_loop():
            reading = asyncio.get_running_loop().run_in_executor(
                self._threads, variable_or_file, name
            )
            self._reading[name] = reading
            reading.add_done_callback(lambda done: self._done(name, done))
        try:
            async with asyncio.timeout(SECRET_FILE_WAIT_SECONDS):
                return await asyncio.shield(reading)
        except TimeoutError:
            raise SecretFileRefused(
                f"{name}{FILE_SUFFIX} ({path}) was not read within {SECRET_FILE_WAIT_SECONDS:g} s "
                "(a file system that does not answer?)"
            ) from None

    def _done(self, name: str, reading: asyncio.Future[str | None]) -> None:
        if self._reading.get(name) is reading:
            del self._reading[name]
        if not reading.cancelled():
            reading.exception()  # retrieved: the calls that waited for it may have given up

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


async def resolve_endpoint(
    config: ModelConfig, settings: Settings, account_id: UUID, *, keys: KeyFiles
) -> Endpoint:
    """The action's model configuration, completed from the settings, its key read by `keys`;
    BadInput if not allowed for the action's account (`account_id`)."""
    check_endpoint(config, settings, account_id)
    base_url = (config.base_url or settings.model_base_url).rstrip("/")
    api_key: str | None = None
    if config.api_key_env is not None:
        name = config.api_key_env
        try:
            # Read at each call, so that a key rotated in its file is sent from the next call
            # on, without a restart (its cost: bench/README.md, key_file.py).
            key = await keys.read(name)
        except SecretFileRefused as refused:
            # Its path and the system's reason are the operator's deployment, which the agent's
            # owner (a tenant, reading the turn's error) is not shown: the log says them.
            log.warning(
                "a model call of account %s failed: model.apiKeyEnv names %s: %s",
                account_id,
                name,
                refused,
            )
            raise ModelFailed(
                f"model.apiKeyEnv names {name}, whose key file {name}{FILE_SUFFIX} the service "
                "refused (logged by the service)"
            ) from None
        # Stripped: a key often ends in a newline, which no header may carry (and httpx's
        # refusal would quote it).
        api_key = (key or "").strip()
        if not api_key:
            raise ModelFailed(
                f"model.apiKeyEnv names {name}, which is not set where Engram runs (neither "
                f"{name} nor {name}{FILE_SUFFIX})"
            )
        if not is_sendable_key(api_key):
            raise ModelFailed(f"model.apiKeyEnv names {name}, whose key {UNSENDABLE_KEY}")
    elif settings.model_api_key is not None and base_url == settings.model_base_url.rstrip("/"):
        # The deployment's key goes only to the deployment's endpoint, never to a URL an
        # action names.
        api_key = settings.model_api_key.get_secret_value().strip() or None
    return Endpoint(
        url=base_url + "/chat/completions",
        model=config.name or settings.model_name,
        api_key=api_key,
        temperature=config.temperature,
        max_tokens=config.max_tokens,
        setting="ENGRAM_MODEL_BASE_URL"
        if config.base_url is None
        else "the action's model.baseUrl",
    )


# What a 404 from the model's server most often means: a base URL without its API's path (an
# Ollama's `http://host:11434`, whose API is under /v1), one that ends in /chat/completions
# already, or a model the endpoint does not serve (OpenAI answers an unknown model 404).
_NOT_THERE = (
    "; check {endpoint.setting}: the API's base URL, to which /chat/completions is added (such "
    "as https://api.openai.com/v1 or http://127.0.0.1:11434/v1), and that the endpoint serves "
    "the model {endpoint.model!r}"
)


# A server that wants a key, sent none: the deployment's key goes to its own endpoint only.
_NO_KEY = (
    "; no key was sent: ENGRAM_MODEL_API_KEY is sent to ENGRAM_MODEL_BASE_URL only, and an "
    "action's model.apiKeyEnv names the key for an endpoint of its own"
)


def _excerpt(text: str) -> str:
    """The start of what the model's server sent (its error's words, a header, a key of its
    reply), as an execution's error quotes it: on one line, each character that would disguise
    it (a control, a NUL, a bidi override or isolate, a lone surrogate) escaped (`escaped`), then
    cut to `_EXCERPT_CHARS` (not inside an escape, `escaped_start`)."""
    text = escaped(" ".join(text.split()))
    return (
        text if len(text) <= _EXCERPT_CHARS else escaped_start(text, _EXCERPT_CHARS) + "... (cut)"
    )


class _Unexpected(Exception):
    """What is wrong with a reply's shape, in words."""


_KINDS = {dict: "an object", list: "a list", str: "text", bool: "a boolean", type(None): "null"}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), "a number")


def _field(container: dict[str, Any], key: str, where: str, *kinds: type) -> Any:
    """`container[key]`, which must be of one of `kinds` (NoneType among them: may be null or
    absent)."""
    value = container.get(key)
    if not isinstance(value, kinds):
        expected = " or ".join(_KINDS[kind] for kind in kinds)
        raise _Unexpected(f"{where} is {_kind(value)}, not {expected}")
    return value


@dataclass(frozen=True)
class _Reply:
    message: dict[str, Any]
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: dict[str, int]
    unknown_usage: list[str]  # usage fields whose values are no count
    model: str | None


def _shape(answer: Any) -> _Reply:
    """The parts of a chat completion; _Unexpected naming the first that is not as OpenAI's
    API defines it. Fields Engram does not act on (finish_reason, model, usage) are taken when
    they are right and otherwise left out."""
    if not isinstance(answer, dict):
        raise _Unexpected(f"the answer is {_kind(answer)}, not an object")
    choices = _field(answer, "choices", "choices", list)
    if not choices:
        raise _Unexpected("choices is empty")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _Unexpected(f"choices[0] is {_kind(choice)}, not an object")
    message = _field(choice, "message", "choices[0].message", dict)
    content = _field(message, "content", "message.content", str, type(None))
    calls: list[ToolCall] = []
    raw_calls = _field(message, "tool_calls", "message.tool_calls", list, type(None)) or []
    for i, call in enumerate(raw_calls):
        where = f"message.tool_calls[{i}]"
        if not isinstance(call, dict):
            raise _Unexpected(f"{where} is {_kind(call)}, not an object")
        function = _field(call, "function", f"{where}.function", dict)
        name = _field(function, "name", f"{where}.function.name", str)
        call_id = _field(call, "id", f"{where}.id", str, type(None))
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                id=storable(call_id or f"call_{i}"),
                name=storable(name),
                # Some servers send arguments as an object rather than JSON text.
                arguments=storable(
                    arguments if isinstance(arguments, str) else json.dumps(arguments or {})
                ),
            )
        )
    usage: dict[str, int] = {}
    unknown: list[str] = []
    raw_usage = answer.get("usage")
    for key, value in (raw_usage if isinstance(raw_usage, dict) else {}).items():
        # Counts of tokens only (some servers add timings, and objects of details).
        if not key.endswith("_tokens") or value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT:
            usage[storable(key)] = value
        else:
            # Logged: a value that is no number by its kind, not its words (a server's text).
            said = json.dumps(value) if isinstance(value, int | float) else _kind(value)
            unknown.append(f"{_excerpt(storable(key))} {_excerpt(said)}")
    finish_reason = choice.get("finish_reason")
    model = answer.get("model")
    return _Reply(
        message,
        storable(content) if content is not None else None,
        tuple(calls),
        finish_reason if isinstance(finish_reason, str) else None,
        usage,
        unknown,
        storable(model) if isinstance(model, str) and model else None,
    )


_TOO_DEEP = f"it nests deeper than {MAX_REPLY_DEPTH} levels"


def _unexpected(endpoint: Endpoint, what: str) -> ModelFailed:
    """The failure of a reply that is not a chat completion, saying what is wrong with it."""
    return ModelFailed(
        f"the model at {endpoint.url} answered in an unexpected shape ({what}); it must be an "
        "OpenAI-compatible chat completions endpoint"
    )


class ModelClient:
    """One per process (in AppState.services[MODEL]): it pools connections to every endpoint."""

    def __init__(
        self,
        settings: Settings,
        *,
        backoff_seconds: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.max_retries = settings.model_max_retries
        self.max_reply_bytes = settings.model_max_reply_bytes
        self.backoff_seconds = backoff_seconds
        timeout = settings.model_timeout_seconds
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)), transport=transport
        )
        self._keys = KeyFiles()

    async def complete(
        self,
        config: ModelConfig,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        purpose: Purpose,
        *,
        account_id: UUID,
        tool_choice: Literal["auto", "none"] = "auto",
        max_tokens: int | None = None,
    ) -> Completion:
        """One chat completion for an action of `account_id` (whose allowed endpoints and keys
        it may use); `max_tokens` caps this reply below the action's own maxTokens."""
        try:
            endpoint = await resolve_endpoint(config, self.settings, account_id, keys=self._keys)
        except BaseException:
            # A call that cannot be sent (a key unset or refused, an endpoint no longer
            # allowed) failed as much as one refused by the model, and took no time of its.
            metrics.current().model_call(purpose, False, None)
            raise
        body: dict[str, Any] = {
            "model": endpoint.model,
            "messages": messages,
            "metadata": {"purpose": purpose},
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = tool_choice
        if endpoint.temperature is not None:
            body["temperature"] = endpoint.temperature
        caps = [t for t in (endpoint.max_tokens, max_tokens) if t is not None]
        if caps:
            body["max_tokens"] = min(caps)
        headers: dict[str, str] = {PURPOSE_HEADER: purpose}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"

        started = time.perf_counter()
        try:
            answer, attempts = await self._post(endpoint, body, headers)
            reply = self._parse(answer, endpoint)
        except BaseException:
            metrics.current().model_call(purpose, False, time.perf_counter() - started)
            raise
        metrics.current().model_call(purpose, True, time.perf_counter() - started, reply.usage)
        return Completion(
            content=reply.content,
            tool_calls=reply.tool_calls,
            finish_reason=reply.finish_reason,
            model=reply.model or endpoint.model,
            usage=reply.usage,
            attempts=attempts,
            duration_ms=(time.perf_counter() - started) * 1000,
            message=reply.message,
        )

    def _parse(self, answer: Any, endpoint: Endpoint) -> _Reply:
        unexpected = None
        if nests_deeper(answer, MAX_REPLY_DEPTH):
            unexpected = _TOO_DEEP
        else:
            try:
                reply = _shape(answer)
            except _Unexpected as e:
                unexpected = str(e)
        if unexpected is not None:
            raise _unexpected(endpoint, unexpected)
        if reply.unknown_usage:
            # Bookkeeping, not the answer: the turn goes on, and the operator is told.
            log.warning(
                "the model at %s reported usage that is no count, recorded as unknown: %s",
                endpoint.url,
                "; ".join(reply.unknown_usage),
            )
        return reply

    async def _post(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[Any, int]:
        try:
            response, attempts = await post_with_retries(
                self._client,
                endpoint.url,
                body,
                headers=headers,
                max_retries=self.max_retries,
                backoff_seconds=self.backoff_seconds,
                retried_4xx=_RETRIED_4XX,
                # The model may still be working on it, and a retry would pay twice.
                retry_read_timeouts=False,
                # The whole reply, however the server sends it (a trickle keeps each read short).
                attempt_seconds=self.settings.model_timeout_seconds,
                max_bytes=self.max_reply_bytes,
            )
        except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
            raise ModelFailed(
                f"the model at {endpoint.url} did not answer within "
                f"{self.settings.model_timeout_seconds:g} seconds (ENGRAM_MODEL_TIMEOUT_SECONDS)"
            ) from e
        except TooLarge as e:
            # Not retried: a model that wrote this much once would again, at the same cost.
            raise ModelFailed(
                f"the model at {endpoint.url} answered with more than {e.limit:,} bytes "
                "(ENGRAM_MODEL_MAX_REPLY_BYTES), so nothing of its reply was used: bound its "
                "replies with model.maxTokens, or raise the setting"
            ) from e
        except Undecodable as e:
            # Not retried: it came whole, and whatever garbled it (a proxy) would again.
            raise ModelFailed(
                f"the model at {endpoint.url} answered with a body that does not decode as its "
                f"Content-Encoding ({_excerpt(e.encoding)}) says, so nothing of its reply was "
                "used; check the endpoint, or the proxy in front of it"
            ) from e
        except RetriesExhausted as e:
            fix = ""
            if isinstance(e.last.__cause__, httpx.TransportError):
                # No answer at all: most often the endpoint is wrong or its server is down.
                fix = (
                    f"; no model server answers there: start one, or point {endpoint.setting} "
                    "at an OpenAI-compatible endpoint that runs"
                )
            failed = f"the model at {endpoint.url} failed {times(e.attempts)}, last: "
            raise ModelFailed(
                f"{failed}{_excerpt(str(e.last))}{fix}", f"{failed}{_excerpt(e.last.logged)}{fix}"
            ) from e
        if response.status_code >= 400:
            refused = (
                f"the model at {endpoint.url} refused the request for {endpoint.model} "
                f"(HTTP {response.status_code})"
            )
            fix = ""
            if response.status_code == 404:
                fix = _NOT_THERE.format(endpoint=endpoint)
            elif response.status_code in (401, 403) and endpoint.api_key is None:
                fix = _NO_KEY
            said = f"{refused}: {_excerpt(server_message(response))}{fix}"
            raise ModelFailed(said, f"{refused}{fix}")
        try:
            return response.json(), attempts
        except ValueError as e:
            raise ModelFailed(f"the model at {endpoint.url} answered with invalid JSON") from e
        except RecursionError:
            raise _unexpected(endpoint, _TOO_DEEP) from None

    async def aclose(self) -> None:
        await self._client.aclose()
        self._keys.close()


MODEL: ServiceKey[ModelClient] = ServiceKey("model")
