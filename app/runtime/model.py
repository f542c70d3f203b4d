"""The model client: OpenAI-compatible chat completions with tool calling, over httpx.

Every request says why it is made: the header `X-Engram-Purpose` and `metadata.purpose` in
the body (`turn` for the agent's own calls, `memory` for memory reviews, `context` for the
summaries that keep a turn's context within its budget). A transient failure
(no connection, a connect timeout, 429 or 5xx) is retried with exponential backoff, honouring
`Retry-After`; a read timeout is not retried (the model may still be working on it, and a
retry would pay twice), and any other 4xx fails at once with the server's message.
"""

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from app.actions.model import ModelConfig, check_endpoint
from app.config import Settings
from app.http_retry import RetriesExhausted, post_with_retries, server_message, times
from app.observability import metrics
from app.text import storable

Purpose = Literal["turn", "memory", "context"]
PURPOSE_HEADER = "X-Engram-Purpose"
_RETRIED_4XX = frozenset({429})
# An upstream error body may echo the request (or anything else): only its start is kept.
_EXCERPT_CHARS = 200


class ModelFailed(Exception):
    """The model could not be reached or answered unusably; the message says what to fix."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    api_key: str | None
    temperature: float | None
    max_tokens: int | None
    # What names this endpoint, for a failure message a person can act on.
    setting: str = "ENGRAM_MODEL_BASE_URL"


def resolve_endpoint(config: ModelConfig, settings: Settings) -> Endpoint:
    """The action's model configuration, completed from the settings; BadInput if not allowed."""
    check_endpoint(config, settings)
    base_url = (config.base_url or settings.model_base_url).rstrip("/")
    api_key: str | None = None
    if config.api_key_env is not None:
        # Stripped: a key read from a secret file often ends in a newline, which no header
        # may carry (and httpx's refusal would quote it).
        api_key = (os.environ.get(config.api_key_env) or "").strip()
        if not api_key:
            raise ModelFailed(
                f"model.apiKeyEnv names {config.api_key_env}, which is not set where Engram runs"
            )
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


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "... (cut)"


def _parse(
    answer: Any, endpoint: Endpoint
) -> tuple[dict[str, Any], str | None, dict[str, int], str]:
    try:
        choice = answer["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
    except (KeyError, IndexError, TypeError) as e:
        raise ModelFailed(
            f"{endpoint.url} answered in an unexpected shape ({e!r}); it must be an "
            "OpenAI-compatible chat completions endpoint"
        ) from e
    raw_usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    usage = {
        k: int(v) for k, v in raw_usage.items() if isinstance(v, int) and not isinstance(v, bool)
    }
    return message, choice.get("finish_reason"), usage, str(answer.get("model") or endpoint.model)


def _tool_calls(message: dict[str, Any]) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                id=storable(str(call.get("id") or f"call_{i}")),
                name=storable(str(function.get("name") or "")),
                # Some servers send arguments as an object rather than JSON text.
                arguments=storable(
                    arguments if isinstance(arguments, str) else json.dumps(arguments or {})
                ),
            )
        )
    return tuple(calls)


class ModelClient:
    """One per process (in AppState.services["model"]): it pools connections to every endpoint."""

    def __init__(
        self,
        settings: Settings,
        *,
        backoff_seconds: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.max_retries = settings.model_max_retries
        self.backoff_seconds = backoff_seconds
        timeout = settings.model_timeout_seconds
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)), transport=transport
        )

    async def complete(
        self,
        config: ModelConfig,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        purpose: Purpose,
        *,
        tool_choice: Literal["auto", "none"] = "auto",
        max_tokens: int | None = None,
    ) -> Completion:
        """One chat completion; `max_tokens` caps this reply below the action's own maxTokens."""
        endpoint = resolve_endpoint(config, self.settings)
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
            message, finish_reason, usage, model = _parse(answer, endpoint)
        except BaseException:
            metrics.current().model_call(purpose, False, time.perf_counter() - started)
            raise
        metrics.current().model_call(purpose, True, time.perf_counter() - started, usage)
        content = message.get("content")
        return Completion(
            # What a model says is stored (transcript, output): NUL and lone surrogates replaced.
            content=storable(content) if isinstance(content, str) else None,
            tool_calls=_tool_calls(message),
            finish_reason=finish_reason if isinstance(finish_reason, str) else None,
            model=model,
            usage=usage,
            attempts=attempts,
            duration_ms=(time.perf_counter() - started) * 1000,
            message=message,
        )

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
            )
        except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
            raise ModelFailed(
                f"the model at {endpoint.url} did not answer within "
                f"{self.settings.model_timeout_seconds:g} seconds (ENGRAM_MODEL_TIMEOUT_SECONDS)"
            ) from e
        except RetriesExhausted as e:
            last = _excerpt(str(e.last))
            fix = ""
            if isinstance(e.last.__cause__, httpx.TransportError):
                # No answer at all: most often the endpoint is wrong or its server is down.
                fix = (
                    f"; no model server answers there: start one, or point {endpoint.setting} "
                    "at an OpenAI-compatible endpoint that runs"
                )
            raise ModelFailed(
                f"the model at {endpoint.url} failed {times(e.attempts)}, last: {last}{fix}"
            ) from e
        if response.status_code >= 400:
            raise ModelFailed(
                f"the model at {endpoint.url} refused the request for {endpoint.model} "
                f"(HTTP {response.status_code}): {_excerpt(server_message(response))}"
            )
        try:
            return response.json(), attempts
        except ValueError as e:
            raise ModelFailed(f"the model at {endpoint.url} answered with invalid JSON") from e

    async def aclose(self) -> None:
        await self._client.aclose()
