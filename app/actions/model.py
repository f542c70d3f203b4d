"""The `model` configuration of an action: which OpenAI-compatible endpoint runs it."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.config import Settings
from app.errors import BadInput

_FIELDS = ("baseUrl", "name", "apiKeyEnv", "temperature", "maxTokens", "contextTokens")
# The least context budget a turn can work in: instructions, tools, an input and a reply.
MIN_CONTEXT_TOKENS = 256
MAX_CONTEXT_TOKENS = 10_000_000
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# The service's own secrets (database URL, bootstrap token) must never leave with a request
# to an endpoint an action names.
_RESERVED_ENV_PREFIX = "ENGRAM_"


@dataclass(frozen=True)
class ModelConfig:
    base_url: str | None = None
    name: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    # The most a request may send, counted at about four characters a token (runtime/context.py);
    # None: ENGRAM_MODEL_CONTEXT_TOKENS.
    context_tokens: int | None = None


def _integer(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def parse_model(value: Any) -> tuple[ModelConfig, dict[str, Any]]:
    if value is None:
        return ModelConfig(), {}
    if not isinstance(value, Mapping):
        raise BadInput('model must be an object such as {"baseUrl": "...", "name": "..."}')
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise BadInput(f"model: unknown field {unknown[0]!r}; allowed: {', '.join(_FIELDS)}")
    for key in ("baseUrl", "name", "apiKeyEnv"):
        if key in value and (not isinstance(value[key], str) or not value[key].strip()):
            raise BadInput(f"model.{key} must be a non-empty string")
    base_url = value.get("baseUrl")
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise BadInput("model.baseUrl must be an http:// or https:// URL")
    env = value.get("apiKeyEnv")
    if env is not None and not _ENV.fullmatch(env):
        raise BadInput("model.apiKeyEnv must name an environment variable, e.g. OPENAI_API_KEY")
    temperature = value.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 <= temperature <= 2
    ):
        raise BadInput("model.temperature must be a number from 0 to 2")
    max_tokens = value.get("maxTokens")
    if max_tokens is not None and not _integer(max_tokens, 1, 1_000_000):
        raise BadInput("model.maxTokens must be an integer from 1 to 1000000")
    context_tokens = value.get("contextTokens")
    if context_tokens is not None:
        if not _integer(context_tokens, MIN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS):
            raise BadInput(
                f"model.contextTokens must be an integer from {MIN_CONTEXT_TOKENS} to "
                f"{MAX_CONTEXT_TOKENS}: the most a model call may send, in tokens of about four "
                "characters"
            )
        if max_tokens is not None and max_tokens >= context_tokens // 2:
            raise BadInput(
                f"model.maxTokens ({max_tokens}) must be less than half of model.contextTokens "
                f"({context_tokens}): the reply's room comes out of the context budget"
            )
    config = ModelConfig(base_url, value.get("name"), env, temperature, max_tokens, context_tokens)
    return config, dict(value)


def check_endpoint(config: ModelConfig, settings: Settings) -> None:
    """Refuses a model configuration that names an endpoint or key variable the operator has
    not allowed: whoever may write an action must not be able to send a host secret to a
    server of its own choosing. Checked when an action is written (createAction,
    updateAction) and again at each model call, as the allow-lists may change meanwhile."""
    if config.api_key_env is not None:
        if config.api_key_env.startswith(_RESERVED_ENV_PREFIX):
            raise BadInput(
                f"model.apiKeyEnv may not name {config.api_key_env}: ENGRAM_* variables hold the "
                "service's own settings; put the model's key in another variable"
            )
        if config.api_key_env not in settings.model_allowed_key_envs:
            raise BadInput(
                f"model.apiKeyEnv names {config.api_key_env}, which this deployment does not "
                "allow: the operator must add it to ENGRAM_MODEL_ALLOWED_KEY_ENVS (a JSON list), "
                "or the action must drop apiKeyEnv"
            )
    if config.base_url is not None:
        allowed = [settings.model_base_url, *settings.model_allowed_base_urls]
        if config.base_url.rstrip("/") not in {u.rstrip("/") for u in allowed}:
            raise BadInput(
                f"model.baseUrl {config.base_url} is not an endpoint this deployment allows: the "
                "operator must add it to ENGRAM_MODEL_ALLOWED_BASE_URLS (a JSON list), or the "
                "action must drop baseUrl to use ENGRAM_MODEL_BASE_URL"
            )
