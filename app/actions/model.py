"""The `model` configuration of an action: which OpenAI-compatible endpoint runs it."""

from typing import Annotated, Any
from uuid import UUID

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from app.config import ENV_NAME, RESERVED_ENV_PREFIX, Settings
from app.errors import BadInput
from app.shapes import Integer, Number, Shape, nonempty, parse, refuse

# The least context budget a turn can work in: instructions, tools, an input and a reply.
MIN_CONTEXT_TOKENS = 256
MAX_CONTEXT_TOKENS = 10_000_000


def _url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise refuse("must be an http:// or https:// URL")
    return value


def _env(value: str) -> str:
    if not ENV_NAME.fullmatch(value):
        raise refuse("must name an environment variable, e.g. OPENAI_API_KEY")
    return value


class ModelConfig(Shape):
    """An action's `model`; a field left out takes the deployment's setting."""

    not_object = 'must be an object such as {"baseUrl": "...", "name": "..."}'

    base_url: Annotated[str | None, BeforeValidator(nonempty), AfterValidator(_url)] = Field(
        default=None, alias="baseUrl"
    )
    name: Annotated[str | None, BeforeValidator(nonempty)] = None
    api_key_env: Annotated[str | None, BeforeValidator(nonempty), AfterValidator(_env)] = Field(
        default=None, alias="apiKeyEnv"
    )
    temperature: Number(0, 2, got=False, as_float=False) | None = None  # type: ignore[valid-type]
    max_tokens: Integer(1, 1_000_000, got=False) | None = Field(default=None, alias="maxTokens")  # type: ignore[valid-type]
    # The most a request may send, counted at about four characters a token (runtime/context.py);
    # None: ENGRAM_MODEL_CONTEXT_TOKENS.
    context_tokens: (
        Integer(  # type: ignore[valid-type]
            MIN_CONTEXT_TOKENS,
            MAX_CONTEXT_TOKENS,
            got=False,
            suffix=": the most a model call may send, in tokens of about four characters",
        )
        | None
    ) = Field(default=None, alias="contextTokens")

    @model_validator(mode="after")
    def _reply_fits(self) -> "ModelConfig":
        if (
            self.context_tokens is not None
            and self.max_tokens is not None
            and 2 * self.max_tokens >= self.context_tokens
        ):
            raise refuse(
                f"model.maxTokens ({self.max_tokens}) must be less than half of "
                f"model.contextTokens ({self.context_tokens}): the reply's room comes out of the "
                "context budget",
                whole=True,
            )
        return self


def parse_model(value: Any) -> tuple[ModelConfig, dict[str, Any]]:
    """The configuration, and the JSON as given (stored and returned)."""
    if value is None:
        return ModelConfig(), {}
    return parse(ModelConfig, value, "model", inline=True), dict(value)


def check_endpoint(config: ModelConfig, settings: Settings, account_id: UUID) -> None:
    """Refuses a model configuration that names an endpoint or key variable the operator has
    not allowed for the action's account: whoever may write an action must not be able to send
    a host secret to a server of its own choosing, nor run on a key given to another account.
    Checked when an action is written (createAction, updateAction), when a turn or an ingest
    starts and again at each model call, as the allow-lists may change meanwhile. One message
    whether the name is allowed for no account or for others only: a refusal never tells an
    account what another one may use."""
    if config.api_key_env is not None:
        if config.api_key_env.startswith(RESERVED_ENV_PREFIX):
            raise BadInput(
                f"model.apiKeyEnv may not name {config.api_key_env}: ENGRAM_* variables hold the "
                "service's own settings; put the model's key in another variable"
            )
        if not settings.allows_key_env(config.api_key_env, account_id):
            raise BadInput(
                f"model.apiKeyEnv names {config.api_key_env}, which is not allowed for this "
                "account: the operator must add it to ENGRAM_MODEL_ALLOWED_KEY_ENVS for this "
                "account, or the action must drop apiKeyEnv"
            )
    if config.base_url is not None and not settings.allows_base_url(config.base_url, account_id):
        raise BadInput(
            f"model.baseUrl {config.base_url} is not an endpoint allowed for this account: the "
            "operator must add it to ENGRAM_MODEL_ALLOWED_BASE_URLS for this account, or the "
            "action must drop baseUrl to use ENGRAM_MODEL_BASE_URL"
        )
