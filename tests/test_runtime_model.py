"""The model client against a scripted OpenAI-compatible server on loopback: the request it
sends, retries, timeouts, refusals, and which key goes where."""

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_server import CHAT, OpenAIServer
from pydantic import SecretStr

from app.actions.model import ModelConfig
from app.config import Settings
from app.embeddings.errors import EmbeddingFailed
from app.embeddings.openai import OpenAIEmbedder
from app.errors import BadInput
from app.http_retry import MAX_BACKOFF_SECONDS, backoff, server_message
from app.observability import metrics
from app.observability.metrics import Metrics
from app.runtime.model import (
    Completion,
    Endpoint,
    KeyFiles,
    ModelClient,
    ModelFailed,
    resolve_endpoint,
    unset_keys,
)

# The account of the actions whose model calls these are.
ACCOUNT = uuid.uuid4()
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {"name": "search_memory", "parameters": {"type": "object", "properties": {}}},
}


async def resolve(config: ModelConfig, settings: Settings) -> Endpoint:
    """`resolve_endpoint` for an action of ACCOUNT, its key read as a model client reads it."""
    keys = KeyFiles()
    try:
        return await resolve_endpoint(config, settings, ACCOUNT, keys=keys)
    finally:
        keys.close()


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


def settings_for(server: OpenAIServer, **values: object) -> Settings:
    return Settings(model_base_url=server.url, model_name="default-model", **values)  # type: ignore[arg-type]


async def one_call(settings: Settings) -> Completion:
    """A turn's model call, by a client opened for it (retrying at once) and closed."""
    client = ModelClient(settings, backoff_seconds=0.01)
    try:
        return await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    finally:
        await client.aclose()


@pytest.fixture
async def client(server: OpenAIServer) -> AsyncIterator[ModelClient]:
    client = ModelClient(settings_for(server, model_max_retries=2), backoff_seconds=0.01)
    yield client
    await client.aclose()


async def test_request_carries_purpose_tools_and_config(
    client: ModelClient, server: OpenAIServer
) -> None:
    server.call_tools(("search_memory", {"query": "Ada"}), content="Let me look.", purpose="memory")
    config = ModelConfig(name="house-model", temperature=0.3, max_tokens=50)
    completion = await client.complete(config, MESSAGES, [TOOL], "memory", account_id=ACCOUNT)

    (request,) = server.requests_to(CHAT)
    assert request.headers["x-engram-purpose"] == "memory"
    assert request.body == {
        "model": "house-model",
        "messages": MESSAGES,
        "metadata": {"purpose": "memory"},
        "tools": [TOOL],
        "tool_choice": "auto",
        "temperature": 0.3,
        "max_tokens": 50,
    }
    assert completion.content == "Let me look."
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [
        ("search_memory", '{"query": "Ada"}')
    ]
    assert completion.finish_reason == "tool_calls"
    assert completion.usage["total_tokens"] > 0 and completion.attempts == 1


async def test_transient_failures_are_retried_with_backoff(
    client: ModelClient, server: OpenAIServer
) -> None:
    server.fail_next(1, status=502, path=CHAT)
    server.fail_next(1, status=429, path=CHAT, retry_after=0.01)
    completion = await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    assert completion.content == "done" and completion.attempts == 3
    assert len(server.requests_to(CHAT)) == 3


async def test_retries_run_out_with_the_servers_message(
    client: ModelClient, server: OpenAIServer
) -> None:
    server.fail_next(5, status=503, path=CHAT, message="overloaded")
    with pytest.raises(ModelFailed, match="failed 3 times, last: HTTP 503: overloaded"):
        await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)


async def test_a_refused_request_is_not_retried(client: ModelClient, server: OpenAIServer) -> None:
    server.fail_next(1, status=400, path=CHAT, message="unknown model")
    with pytest.raises(ModelFailed, match=r"refused the request .*\(HTTP 400\): unknown model"):
        await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    assert len(server.requests_to(CHAT)) == 1


async def test_a_key_refused_when_none_was_sent_says_where_keys_go(server: OpenAIServer) -> None:
    """A server that wants a key, sent none (ENGRAM_MODEL_API_KEY unset, or an action's own
    endpoint, which the deployment's key never goes to): the refusal says so, and where a key
    is set; with a key sent, the server's own words stand alone."""
    server.fail_next(1, status=401, path=CHAT, message="You didn't provide an API key.")
    with pytest.raises(ModelFailed) as failed:
        await one_call(settings_for(server))
    assert failed.value.message.endswith(
        "(HTTP 401): You didn't provide an API key.; no key was sent: ENGRAM_MODEL_API_KEY is "
        "sent to ENGRAM_MODEL_BASE_URL only, and an action's model.apiKeyEnv names the key for "
        "an endpoint of its own"
    )
    server.fail_next(1, status=401, path=CHAT, message="Incorrect API key provided.")
    with pytest.raises(ModelFailed) as failed:
        await one_call(settings_for(server, model_api_key=SecretStr("sk-house")))
    assert failed.value.message.endswith("(HTTP 401): Incorrect API key provided.")


async def test_a_slow_model_times_out_without_a_retry(server: OpenAIServer) -> None:
    server.say("late", delay=1.0)
    with pytest.raises(ModelFailed, match="did not answer within 0.2 seconds"):
        await one_call(settings_for(server, model_timeout_seconds=0.2))
    assert len(server.requests_to(CHAT)) == 1


async def test_a_model_that_trickles_its_reply_times_out_at_the_whole_replys_deadline(
    server: OpenAIServer,
) -> None:
    """The timeout bounds the whole reply, not each read: a server that sends it in pieces,
    each well within the timeout, is cut off at it, and the call is not retried."""
    settings = settings_for(server, model_timeout_seconds=0.5, model_max_retries=2)
    client = ModelClient(settings, backoff_seconds=0.01)
    server.say("late", trickle=0.2)  # ten pieces 0.2 s apart: 2 s in all
    try:
        with pytest.raises(
            ModelFailed, match=r"did not answer within 0.5 seconds \(ENGRAM_MODEL_TIMEOUT_SECONDS\)"
        ):
            await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
        # Within the timeout, a reply in pieces is read as any other.
        server.say("in pieces", trickle=0.01)
        answered = await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    finally:
        await client.aclose()
    assert len(server.requests_to(CHAT)) == 2
    assert answered.content == "in pieces" and answered.attempts == 1


async def test_an_unreachable_model_fails_after_its_retries() -> None:
    settings = Settings(model_base_url="http://127.0.0.1:9/v1", model_max_retries=1)
    with pytest.raises(ModelFailed, match="failed 2 times, last: ConnectError"):
        await one_call(settings)


async def test_an_upstream_error_body_reaches_the_error_only_as_a_short_excerpt(
    client: ModelClient, server: OpenAIServer
) -> None:
    server.fail_next(1, status=400, path=CHAT, message="echo: " + "x" * 5000)
    with pytest.raises(ModelFailed) as refused:
        await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    assert "echo: xxx" in refused.value.message and refused.value.message.endswith("(cut)")
    assert len(refused.value.message) < 400

    server.fail_next(5, status=503, path=CHAT, message="echo: " + "y" * 5000)
    with pytest.raises(ModelFailed) as exhausted:
        await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    assert "failed 3 times" in exhausted.value.message and len(exhausted.value.message) < 400


@pytest.mark.parametrize("before", [197, 198, 199])
async def test_an_error_cut_at_its_length_keeps_no_part_of_an_escape(
    client: ModelClient, server: OpenAIServer, before: int
) -> None:
    """A server's words are escaped, then cut: a cut that falls inside an escape (`\\u001b`,
    six characters) drops what of it came before the cut, where it kept `\\u0`, `\\u00` or
    `\\u001`, which read as no character (or, with the text added after, another)."""
    server.fail_next(1, status=400, path=CHAT, message="a" * before + "\x1b[31m red")
    with pytest.raises(ModelFailed) as refused:
        await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    assert refused.value.message.endswith(": " + "a" * before + "... (cut)"), refused.value.message


def test_a_server_body_cut_at_its_length_keeps_no_part_of_an_escape() -> None:
    """A body that is no error's JSON is quoted by its start, escaped, then cut: not inside an
    escape (it kept `\\u0` of `\\u001b`)."""
    request = httpx.Request("POST", "https://models.example/v1/embeddings")
    for before in (295, 297, 299):
        response = httpx.Response(502, text="b" * before + "\x1b[0m gateway", request=request)
        assert server_message(response) == "b" * before, before
    whole = httpx.Response(502, text="b" * 290 + "\x1b[0m", request=request)
    assert server_message(whole) == "b" * 290 + "\\u001b[0m"


def completion_body(message: Any, **rest: Any) -> dict[str, Any]:
    """A chat completion's body as a server would send it, with `message` as its first choice's."""
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], **rest}


def assistant(**fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, **fields}


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("body", "told"),
    [
        (b"<html>gateway</html>", "answered with invalid JSON"),
        ([1, 2], "(the answer is a list, not an object)"),
        ({"choices": []}, "(choices is empty)"),
        ({"object": "error"}, "(choices is null, not a list)"),
        (completion_body(None), "(choices[0].message is null, not an object)"),
        (completion_body(assistant(content=["hi"])), "(message.content is a list, not text or"),
        (
            completion_body(assistant(tool_calls=5)),
            "(message.tool_calls is a number, not a list or null)",
        ),
        (
            completion_body(assistant(tool_calls=["search_memory"])),
            "(message.tool_calls[0] is text, not an object)",
        ),
        (
            completion_body(assistant(tool_calls=[{"id": "c1", "name": "search_memory"}])),
            "(message.tool_calls[0].function is null, not an object)",
        ),
        (
            completion_body(assistant(tool_calls=[{"id": "c1", "function": {"name": 5}}])),
            "(message.tool_calls[0].function.name is a number, not text)",
        ),
        (
            completion_body(assistant(tool_calls=[{"id": [[]], "function": {"name": "t"}}])),
            "(message.tool_calls[0].id is a list, not text or null)",
        ),
        # Deeper than Python's parser goes, and deep enough to exhaust a walk of it.
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000, "(it nests deeper than 64 levels)", id="100000-deep"
        ),
        pytest.param(
            completion_body(assistant(content="hi", extra=nested(500))),
            "(it nests deeper than 64 levels)",
            id="500-deep",
        ),
    ],
)
async def test_a_reply_of_another_shape_fails_the_call_saying_what_is_wrong(
    client: ModelClient, server: OpenAIServer, body: Any, told: str
) -> None:
    """The model's words are read only from a chat completion; anything else is a clear
    failure (its message becomes the turn's error), never an error of the code that reads it."""
    server.answer_with(body)
    with pytest.raises(ModelFailed) as failed:
        await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    assert told in failed.value.message
    assert failed.value.message.startswith(f"the model at {server.url}/chat/completions answered")


async def test_usage_that_is_no_count_is_recorded_as_unknown_and_logged(
    client: ModelClient, server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply's usage is bookkeeping: numbers that are no count (past 2**53, negative,
    fractional, true, text) are left out of the usage and the token metrics, and a warning says
    so, naming a value that is no number by its kind (a server's text may quote the prompt);
    the reply itself is used."""
    usage = {
        "prompt_tokens": 10**400,
        "completion_tokens": 7,
        "total_tokens": -1,
        "cached_tokens": True,
        "reasoning_tokens": 2.5,
        "audio_tokens": "none, for: hello there",  # (the server's words: told by their kind)
        "queue_time": 0.01,  # (a timing some servers add: not a count of tokens, not told)
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    server.answer_with(completion_body(assistant(content="hi"), usage=usage))
    counted = Metrics()
    with metrics.using(counted), caplog.at_level(logging.WARNING):
        completion = await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)

    assert completion.content == "hi" and completion.usage == {"completion_tokens": 7}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "reported usage that is no count, recorded as unknown: prompt_tokens 1000" in warning
    assert all(k in warning for k in ("total_tokens -1", "cached_tokens true", "reasoning_tokens"))
    assert "audio_tokens text" in warning and "hello" not in warning
    assert "queue_time" not in warning and len(warning) < 800
    rendered = counted.render().decode()
    assert 'engram_model_tokens_total{kind="completion",purpose="turn"} 7.0' in rendered
    assert 'kind="prompt"' not in rendered


def test_the_token_metrics_count_no_usage_past_what_a_float_holds() -> None:
    counted = Metrics()
    counted.model_call("turn", True, 0.1, {"prompt_tokens": 10**400, "completion_tokens": 2**53})
    counted.embedding(True, 0.1, 10**400)
    assert "engram_model_tokens_total{" not in counted.render().decode()


async def test_a_reply_longer_than_its_bound_fails_without_being_read_or_retried(
    server: OpenAIServer,
) -> None:
    client = ModelClient(
        settings_for(server, model_max_retries=2, model_max_reply_bytes=10_000),
        backoff_seconds=0.01,
    )
    try:
        server.say("x" * 9_000)
        replied = await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
        assert replied.content == "x" * 9_000
        server.say("x" * 20_000)
        with pytest.raises(ModelFailed) as failed:
            await client.complete(ModelConfig(), MESSAGES, [], "turn", account_id=ACCOUNT)
    finally:
        await client.aclose()
    assert "answered with more than 10,000 bytes (ENGRAM_MODEL_MAX_REPLY_BYTES)" in str(
        failed.value
    )
    assert "model.maxTokens" in failed.value.message
    assert len(server.requests_to(CHAT)) == 2


def test_the_backoff_between_retries_is_capped() -> None:
    """0.5 s doubled after each failed attempt, with up to a quarter more, reaches the cap at
    the seventh retry and stays there (it once grew without bound: 2**39 s at the fortieth)."""
    assert 0.5 <= backoff(1, 0.5) <= 0.625 and 16 <= backoff(6, 0.5) <= 20
    assert all(backoff(attempt, 0.5) <= MAX_BACKOFF_SECONDS for attempt in (7, 8, 40, 5000))
    assert backoff(40, 0.5) >= MAX_BACKOFF_SECONDS * 0.99


async def test_an_action_names_only_allowed_endpoints_and_key_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    settings = Settings(model_base_url="http://models.internal/v1/")
    # The deployment's own endpoint is always allowed, with or without the trailing slash.
    assert await resolve(ModelConfig(base_url="http://models.internal/v1"), settings)
    with pytest.raises(BadInput, match="add it to ENGRAM_MODEL_ALLOWED_KEY_ENVS"):
        await resolve(ModelConfig(api_key_env="AWS_SECRET_ACCESS_KEY"), settings)
    with pytest.raises(BadInput, match="add it to ENGRAM_MODEL_ALLOWED_BASE_URLS"):
        await resolve(ModelConfig(base_url="https://attacker.example/v1"), settings)

    allowed = Settings(
        model_base_url="http://models.internal/v1",
        model_allowed_base_urls=["https://team.example/v1/"],
        model_allowed_key_envs=["TEAM_MODEL_KEY"],
    )
    assert await resolve(ModelConfig(base_url="https://team.example/v1"), allowed)
    with pytest.raises(BadInput, match="ENGRAM_MODEL_ALLOWED_BASE_URLS"):
        await resolve(ModelConfig(base_url="https://attacker.example/v1"), allowed)
    with pytest.raises(BadInput, match="ENGRAM_MODEL_ALLOWED_KEY_ENVS"):
        await resolve(ModelConfig(api_key_env="AWS_SECRET_ACCESS_KEY"), allowed)


async def test_keys_go_only_where_they_belong(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(
        model_base_url="http://models.internal/v1",
        model_api_key=SecretStr("sk-house"),
        model_allowed_base_urls=["https://example.com/v1"],
        model_allowed_key_envs=["TEAM_MODEL_KEY", "MISSING_KEY"],
    )
    assert (await resolve(ModelConfig(), settings)).api_key == "sk-house"
    # The deployment's key never goes to an endpoint an action names.
    elsewhere = ModelConfig(base_url="https://example.com/v1")
    assert (await resolve(elsewhere, settings)).api_key is None

    monkeypatch.setenv("TEAM_MODEL_KEY", "sk-team")
    own = ModelConfig(base_url="https://example.com/v1", api_key_env="TEAM_MODEL_KEY")
    endpoint = await resolve(own, settings)
    assert (endpoint.url, endpoint.api_key) == (
        "https://example.com/v1/chat/completions",
        "sk-team",
    )

    with pytest.raises(ModelFailed, match="MISSING_KEY, which is not set"):
        await resolve(ModelConfig(api_key_env="MISSING_KEY"), settings)
    # The service's own settings are never sent as a model key: a list naming one is refused
    # at start, and one listed all the same (settings built without that check) sends nothing.
    with pytest.raises(ValueError, match="service's own settings"):
        Settings(model_allowed_key_envs=["ENGRAM_BOOTSTRAP_TOKEN"])
    listed = settings.model_copy(
        update={"model_allowed_key_envs": ["TEAM_MODEL_KEY", "ENGRAM_BOOTSTRAP_TOKEN"]}
    )
    monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN", "secret")
    with pytest.raises(BadInput, match="may not name ENGRAM_BOOTSTRAP_TOKEN"):
        await resolve(ModelConfig(api_key_env="ENGRAM_BOOTSTRAP_TOKEN"), listed)


async def test_an_allowed_key_variable_may_be_given_as_a_file(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """TEAM_MODEL_KEY_FILE, as the secret settings' ENGRAM_<NAME>_FILE: the file's text less
    the newline that ends it and a byte order mark that begins it, read at each call, sent as
    the bearer token."""
    settings = settings_for(server, model_allowed_key_envs=["TEAM_MODEL_KEY"])
    key_file = tmp_path / "key"
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", str(key_file))
    client = ModelClient(settings)
    try:
        for rotated in (b"sk-from-file\r\n", b"\xef\xbb\xbfsk-rotated\n"):
            key_file.write_bytes(rotated)
            config = ModelConfig(api_key_env="TEAM_MODEL_KEY")
            await client.complete(config, MESSAGES, [], "turn", account_id=ACCOUNT)
    finally:
        await client.aclose()
    assert [r.headers["authorization"] for r in server.requests_to(CHAT)] == [
        "Bearer sk-from-file",
        "Bearer sk-rotated",
    ]


# What the agent's owner reads of a key's file the service refused, and what its log says.
UNREADABLE_KEY_FILE = (
    "model.apiKeyEnv names TEAM_MODEL_KEY, whose key file TEAM_MODEL_KEY_FILE the service "
    "refused (logged by the service)"
)
KEY_FILE_FAILED = (
    f"a model call of account {ACCOUNT} failed: model.apiKeyEnv names TEAM_MODEL_KEY: "
)


@pytest.mark.parametrize(
    ("content", "told"),
    [
        (None, "TEAM_MODEL_KEY_FILE ({path}) cannot be read: No such file or directory"),
        ("folder", "TEAM_MODEL_KEY_FILE ({path}) cannot be read: Is a directory"),
        (b"\n", "TEAM_MODEL_KEY_FILE ({path}) is empty (or only whitespace)"),
        (b"sk-S3CRET\xff", "TEAM_MODEL_KEY_FILE ({path}) is not UTF-8 text"),
        (
            b"sk-S3CRET" * 7282,
            "TEAM_MODEL_KEY_FILE ({path}) holds more than 65,536 bytes: a secret file holds its "
            "value alone",
        ),
        ("both", "TEAM_MODEL_KEY and TEAM_MODEL_KEY_FILE are both set: set one or the other"),
        ("both empty", "TEAM_MODEL_KEY and TEAM_MODEL_KEY_FILE are both set: set one or the other"),
    ],
    ids=["missing", "folder", "empty", "not-utf8", "too-large", "both", "both-empty"],
)
async def test_a_key_file_that_cannot_be_the_key_fails_the_call_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    content: Any,
    told: str,
) -> None:
    """Refused as the secret settings' files are, as a ModelFailed (what a turn, a review or a
    summary reports of a key not set) that names the variable alone: the file's path and the
    system's reason are the operator's deployment, not the agent's owner's to read, and the
    service's warning says them. Neither quotes the file."""
    path = tmp_path / "key"
    if content == "folder":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text("sk-S3CRET\n")
        monkeypatch.setenv("TEAM_MODEL_KEY", "" if content == "both empty" else "sk-S3CRET")
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", str(path))
    settings = Settings(model_allowed_key_envs=["TEAM_MODEL_KEY"])
    with (
        caplog.at_level(logging.WARNING, logger="app.runtime.model"),
        pytest.raises(ModelFailed) as failed,
    ):
        await resolve(ModelConfig(api_key_env="TEAM_MODEL_KEY"), settings)
    assert failed.value.message == UNREADABLE_KEY_FILE
    assert failed.value.logged == UNREADABLE_KEY_FILE
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"{KEY_FILE_FAILED}{told.format(path=path)}")
    ]
    assert "S3CRET" not in caplog.text


@pytest.mark.timeout(10)  # the read it replaced waited for a writer, with the event loop
@pytest.mark.parametrize("kind", ["pipe", "link-to-pipe", "device"])
async def test_a_key_file_that_is_not_a_regular_file_is_refused_unread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """A named pipe as TEAM_MODEL_KEY_FILE held the model call, and with it the whole service,
    until a writer came, and the start (unset_keys) before that: a key's file read at each call
    must be a regular file, followed through a symlink as Kubernetes' ..data links are. Refused
    before anything is read, naming the variable and the path (to the operator)."""
    pipe = tmp_path / "team_model_key"
    os.mkfifo(pipe)
    path = {"pipe": pipe, "link-to-pipe": tmp_path / "link", "device": Path(os.devnull)}[kind]
    if kind == "link-to-pipe":
        path.symlink_to(pipe)
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", str(path))
    settings = Settings(model_allowed_key_envs=["TEAM_MODEL_KEY"])
    what = "a device" if kind == "device" else "a pipe"
    refused = (
        f"TEAM_MODEL_KEY_FILE ({path}) is {what}, not a regular file: a file read at each call "
        "must be one (a pipe or a device would hold the service waiting)"
    )
    assert await unset_keys(settings) == [f"TEAM_MODEL_KEY: {refused}"]
    with (
        caplog.at_level(logging.WARNING, logger="app.runtime.model"),
        pytest.raises(ModelFailed) as failed,
    ):
        await resolve(ModelConfig(api_key_env="TEAM_MODEL_KEY"), settings)
    assert failed.value.message == UNREADABLE_KEY_FILE
    assert [r.getMessage() for r in caplog.records] == [f"{KEY_FILE_FAILED}{refused}"]
    # A regular file behind the same link is read.
    if kind == "link-to-pipe":
        path.unlink()
        (tmp_path / "key").write_text("sk-team\n")
        path.symlink_to(tmp_path / "key")
        config = ModelConfig(api_key_env="TEAM_MODEL_KEY")
        assert (await resolve(config, settings)).api_key == "sk-team"


@pytest.mark.parametrize(
    "content", [b"sk-S3CRET\nsk-other\n", "sk-S3CRÉT\n".encode()], ids=["two-lines", "not-ascii"]
)
async def test_a_key_no_header_may_carry_fails_the_call_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: bytes
) -> None:
    """Sent, it failed as a model server that does not answer (httpx's refusal of the header)
    or as an internal error (UnicodeEncodeError); said at start too."""
    path = tmp_path / "key"
    path.write_bytes(content)
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", str(path))
    settings = Settings(model_allowed_key_envs=["TEAM_MODEL_KEY"])
    unsendable = (
        "holds a character no HTTP header may carry (a line break or another control character, "
        "or one that is not ASCII)"
    )
    with pytest.raises(ModelFailed) as failed:
        await resolve(ModelConfig(api_key_env="TEAM_MODEL_KEY"), settings)
    assert failed.value.message == f"model.apiKeyEnv names TEAM_MODEL_KEY, whose key {unsendable}"
    assert await unset_keys(settings) == [f"TEAM_MODEL_KEY {unsendable}"]


async def test_an_empty_key_file_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", "")
    settings = Settings(model_allowed_key_envs=["TEAM_MODEL_KEY"])
    config = ModelConfig(api_key_env="TEAM_MODEL_KEY")
    with pytest.raises(ModelFailed, match="neither TEAM_MODEL_KEY nor TEAM_MODEL_KEY_FILE"):
        await resolve(config, settings)
    monkeypatch.setenv("TEAM_MODEL_KEY", "sk-team")
    assert (await resolve(config, settings)).api_key == "sk-team"


@dataclass
class HungFileSystem:
    opened: list[str] = field(default_factory=list)  # the files opened
    ticks: int = 0  # the event loop's turns meanwhile, one each 10 ms it was free
    took: float = 0.0  # seconds, from entering to leaving


@contextlib.asynccontextmanager
async def hung_file_system(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[HungFileSystem]:
    """Key files on a file system that does not answer (a hung NFS mount): while inside, their
    open waits (3 s at most, a thread's); counts the event loop's turns meanwhile."""
    hung = HungFileSystem()
    answering = threading.Event()

    def hung_open(file: str, flags: int) -> int:
        hung.opened.append(file)
        answering.wait(3)
        return os.open(file, flags | os.O_NONBLOCK)

    monkeypatch.setattr("app.config._open_nonblocking", hung_open)

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            hung.ticks += 1

    ticking = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        yield hung
    finally:
        hung.took = time.monotonic() - started
        answering.set()
        ticking.cancel()


@pytest.mark.timeout(30)
async def test_a_key_file_that_does_not_answer_fails_the_call_and_holds_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    server: OpenAIServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key file on a file system that does not answer (a hung NFS mount; here its open waits)
    was read on the event loop, which held every request of the process as long as it did not
    answer: it is read in a thread, and a call whose key is not read within 2 s fails as for a
    key file refused, naming the variable and the path to the operator, never the key. The
    calls that need it meanwhile wait for the same read rather than each start one."""
    path = tmp_path / "key"
    path.write_text("sk-S3CRET\n")
    monkeypatch.setenv("TEAM_MODEL_KEY_FILE", str(path))
    client = ModelClient(settings_for(server, model_allowed_key_envs=["TEAM_MODEL_KEY"]))
    config = ModelConfig(api_key_env="TEAM_MODEL_KEY")
    try:
        async with hung_file_system(monkeypatch) as hung:
            with caplog.at_level(logging.WARNING, logger="app.runtime.model"):
                calls = await asyncio.gather(
                    *(
                        client.complete(config, MESSAGES, [], "turn", account_id=ACCOUNT)
                        for _ in range(3)
                    ),
                    return_exceptions=True,
                )
    finally:
        await client.aclose()
    assert [getattr(call, "message", call) for call in calls] == [UNREADABLE_KEY_FILE] * 3
    assert 2 <= hung.took < 2.9
    assert hung.ticks >= 50  # the event loop ran meanwhile
    assert hung.opened == [str(path)]
    late = (
        f"TEAM_MODEL_KEY_FILE ({path}) was not read within 2 s (a file system that does not "
        "answer?)"
    )
    assert [r.getMessage() for r in caplog.records] == [f"{KEY_FILE_FAILED}{late}"] * 3
    assert "S3CRET" not in caplog.text
    assert server.requests_to(CHAT) == []


@pytest.mark.timeout(30)
async def test_the_start_waits_for_key_files_that_do_not_answer_once_not_on_the_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The start's check of the allowed keys (unset_keys) read their files on the event loop: a
    key file on a file system that does not answer held the start for as long, silently. They
    are read as a model call reads them, together: two hung files say so, each naming its
    variable and path, after 2 s in all, and a readable key beside them is fine."""
    for name in ("TEAM_A_KEY", "TEAM_B_KEY"):
        path = tmp_path / name.lower()
        path.write_text("sk-S3CRET\n")
        monkeypatch.setenv(f"{name}_FILE", str(path))
    monkeypatch.setenv("TEAM_C_KEY", "sk-fine")
    settings = Settings(model_allowed_key_envs=["TEAM_A_KEY", "TEAM_B_KEY", "TEAM_C_KEY"])
    async with hung_file_system(monkeypatch) as hung:
        said = await unset_keys(settings)
    assert said == [
        f"{name}: {name}_FILE ({tmp_path / name.lower()}) was not read within 2 s (a file "
        "system that does not answer?)"
        for name in ("TEAM_A_KEY", "TEAM_B_KEY")
    ]
    assert 2 <= hung.took < 2.9
    assert hung.ticks >= 50  # the event loop ran meanwhile


async def test_the_key_is_sent_as_a_bearer_token(server: OpenAIServer) -> None:
    await one_call(settings_for(server, model_api_key=SecretStr("sk-house")))
    assert server.requests_to(CHAT)[0].headers["authorization"] == "Bearer sk-house"


async def test_a_server_that_quotes_the_key_it_refused_never_puts_it_in_the_error(
    server: OpenAIServer,
) -> None:
    """The failure is kept as the execution's error, which tenants read: the operator's key
    a model server quotes back is not in it (nor in an embedding provider's failure)."""
    key = "sk-house-0123456789"
    server.chat_error(status=401, message=f"Incorrect API key provided: Bearer {key}.")
    with pytest.raises(ModelFailed) as failed:
        await one_call(settings_for(server, model_api_key=SecretStr(key), model_max_retries=0))
    assert (
        "HTTP 401" in failed.value.message and "Incorrect API key provided" in failed.value.message
    )
    assert key not in failed.value.message and "[credential]" in failed.value.message

    server.fail_next(1, status=403, message=f"key {key} may not use this model")
    embedder = OpenAIEmbedder(
        url=server.url, model=server.embedding_model, api_key=key, dimensions=48, max_retries=0
    )
    try:
        with pytest.raises(EmbeddingFailed) as refused:
            await embedder.embed(["hello"])
    finally:
        await embedder.aclose()
    assert "may not use this model" in str(refused.value) and key not in str(refused.value)


async def test_a_key_read_with_a_newline_is_sent_stripped_and_a_refused_one_never_quoted(
    server: OpenAIServer,
) -> None:
    """A key from a secret file often ends in a newline: it is sent without it. A key no header
    can carry (a newline inside it) is refused with the settings; one that got past them would
    fail the call, and httpx's refusal, which quotes the header, reach the error without it."""
    await one_call(settings_for(server, model_api_key=SecretStr("sk-house-42\n")))
    assert server.requests_to(CHAT)[-1].headers["authorization"] == "Bearer sk-house-42"

    broken = "sk-house-4242\nsecond-line-of-the-key"
    with pytest.raises(ValueError, match="no HTTP header may carry") as refused:
        settings_for(server, model_api_key=SecretStr(broken))
    assert "sk-house-4242" not in str(refused.value)
    unchecked = settings_for(server, model_max_retries=0).model_copy(
        update={"model_api_key": SecretStr(broken)}
    )
    with pytest.raises(ModelFailed) as failed:
        await one_call(unchecked)
    assert "[credential]" in failed.value.message, failed.value.message
    assert "failed once, last: LocalProtocolError" in failed.value.message
    assert "sk-house-4242" not in failed.value.message
    assert "second-line" not in failed.value.message
