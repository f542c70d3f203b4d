"""One settings object for the whole service, read from ENGRAM_* environment variables."""

import ipaddress
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit
from uuid import UUID

import platformdirs
from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from app.text import is_storable

DAY = 86_400.0
WEEK = 7 * DAY
# The longest ENGRAM_ADMIN_EVENTS_RETENTION_DAYS.
MAX_RETENTION_DAYS = 36_500
# pgvector's HNSW indexes, which the searches read, take vectors of at most 2,000 dimensions.
INDEXED_DIMENSIONS = 2000
# PostgreSQL's range for maintenance_work_mem, in kB.
_BUILD_MEMORY_KB = (1024, 2_147_483_647)
_SIZE = re.compile(r"(\d+) ?(kB|MB|GB|TB)?")
_KB_PER = {"kB": 1, "MB": 1024, "GB": 1024**2, "TB": 1024**3}


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("engram"))


def _is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def is_loopback(host: str) -> bool:
    """Whether listening on `host` stays on this machine ('localhost' or a loopback address)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _plain(value: Any) -> Any:
    """A setting's value as given, a secret's text unwrapped (for the validators that read it
    before pydantic wraps it)."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


# An allow-list of model endpoints or key variables: a list (every account may use each), or
# each mapped to the account IDs that may use it (canonical UUID text, or EVERY_ACCOUNT).
AllowList = list[str] | dict[str, list[str]]
EVERY_ACCOUNT = "*"
# An environment variable an action's model.apiKeyEnv may name; ENGRAM_* ones never (they hold
# the service's own secrets).
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
RESERVED_ENV_PREFIX = "ENGRAM_"


def _allowed_name(name: str, index: int, urls: bool, place: str = "entry") -> str:
    """An allow-list object's key (`place` "entry") or a list's item ("item"), refused when it
    is no endpoint or variable an action could name; named by its place, not quoted (a URL may
    carry a password, a name may be a key pasted in the wrong place)."""
    at = f"{place} {index}"
    if urls:
        if not _is_http_url(name):
            raise ValueError(f"{at} is not an http:// or https:// URL")
    elif not name.strip():
        raise ValueError(f"{at} names no variable (an empty name)")
    elif not ENV_NAME.fullmatch(name):
        raise ValueError(f"{at} is not an environment variable name (A-Z, digits, _)")
    elif name.startswith(RESERVED_ENV_PREFIX):
        raise ValueError(
            f"{at} ({name}): ENGRAM_* variables hold the service's own settings and "
            "cannot be an action's model key"
        )
    return name


def _accounts(accounts: Any, name: str, index: int, urls: bool) -> list[str]:
    """An allow-list entry's accounts, each as canonical UUID text or EVERY_ACCOUNT."""
    entry = f"entry {index}" if urls else name
    if not isinstance(accounts, list):
        raise ValueError(
            f'{entry}: must be a list of the account IDs that may use it, or ["*"] for every '
            "account"
        )
    canonical = []
    for position, account in enumerate(accounts):
        if account == EVERY_ACCOUNT:
            canonical.append(EVERY_ACCOUNT)
            continue
        try:
            canonical.append(str(UUID(account)))
        except (TypeError, ValueError, AttributeError):
            raise ValueError(
                f'{entry}: account {position} is not an account ID (a UUID), nor "*" for every '
                "account"
            ) from None
    return canonical


def _allowed_for(allowed: AllowList, account_id: UUID) -> list[str]:
    """The names of `allowed` that `account_id` may use."""
    if isinstance(allowed, list):
        return allowed
    account = str(account_id)
    return [
        name
        for name, accounts in allowed.items()
        if EVERY_ACCOUNT in accounts or account in accounts
    ]


def _seconds(default: float, *, low: float = 0, high: float = DAY) -> Any:
    """A finite duration above `low`, at most `high` (larger ones overflow timers and intervals)."""
    return Field(default=default, gt=low, le=high, allow_inf_nan=False)


# A secret setting (a SecretStr) may be given as a file instead, named by its variable with _FILE
# added (ENGRAM_BOOTSTRAP_TOKEN_FILE=/run/secrets/...), as Docker and Kubernetes mount secrets: a
# variable's value shows in `docker inspect` and /proc/PID/environ.
FILE_SUFFIX = "_FILE"
# A secret file holds its value alone: a larger one is the wrong file (a log, a device), not
# read further.
SECRET_FILE_MAX_BYTES = 65_536
# A file read at each call is read off the event loop and waited for this long at most: one on a
# file system that does not answer (a hung NFS mount) is refused rather than waited for.
SECRET_FILE_WAIT_SECONDS = 2.0


class SecretFileRefused(SettingsError):
    """A secret setting's file that cannot be its value: the message names the variable and the
    path, never what the file holds."""


def _is_secret(field: FieldInfo) -> bool:
    return field.annotation is SecretStr or SecretStr in get_args(field.annotation)


def _environment() -> dict[str, str]:
    # The names in any case, as pydantic-settings reads them (case_sensitive is off).
    return {name.upper(): value for name, value in os.environ.items()}


def _file_path(variable: str, environment: Mapping[str, str]) -> str | None:
    """The file `variable`_FILE names; None when that is unset or empty."""
    path = environment.get(variable + FILE_SUFFIX, "")
    return path if path.strip() else None


# What a file read at each call is when it is not a regular file (stat's type; a folder is
# refused by open itself).
_NOT_REGULAR = {
    stat.S_IFIFO: "a pipe",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}


def _open_nonblocking(path: str, flags: int) -> int:
    # A named pipe opens at once, with no writer, to be refused (`_read_secret_file`).
    return os.open(path, flags | os.O_NONBLOCK)


def _read_secret_file(variable: str, path: str, *, regular_only: bool = False) -> str:
    """The value the file at `path` holds, less the newline that ends it and a byte order mark
    that begins it (as a Windows editor saves text), which no value holds. `regular_only`: for
    a file read at each call, refused unless it is a regular file (a symlink to one, as
    Kubernetes mounts secrets, is followed), before anything is read from it: a named pipe
    would hold its reader until a writer came. The settings' files, read once
    before the service starts, may be pipes (`<(...)`, /dev/stdin)."""
    if not is_storable(path):
        raise SecretFileRefused(
            f"{variable} is not valid text (a NUL, or bytes that are not UTF-8)"
        )
    where = f"{variable} ({path})"
    try:
        with open(path, "rb", opener=_open_nonblocking if regular_only else None) as file:
            kind = stat.S_IFMT(os.fstat(file.fileno()).st_mode)
            if regular_only and kind != stat.S_IFREG:
                what = _NOT_REGULAR.get(kind, "another kind of file")
                raise SecretFileRefused(
                    f"{where} is {what}, not a regular file: a file read at each call must be "
                    "one (a pipe or a device would hold the service waiting)"
                )
            data = file.read(SECRET_FILE_MAX_BYTES + 1)
    except OSError as e:
        raise SecretFileRefused(f"{where} cannot be read: {e.strerror or e}") from None
    if len(data) > SECRET_FILE_MAX_BYTES:
        raise SecretFileRefused(
            f"{where} holds more than {SECRET_FILE_MAX_BYTES:,} bytes: a secret file holds its "
            "value alone"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SecretFileRefused(f"{where} is not UTF-8 text") from None
    text = text.rstrip("\r\n")
    if not text.strip():
        raise SecretFileRefused(f"{where} is empty (or only whitespace)")
    return text


def _file_value(
    variable: str, environment: Mapping[str, str], *, regular_only: bool = False
) -> str | None:
    """The value of the file `variable`_FILE names (`_read_secret_file`); None when that is
    unset or empty. Refused when `variable` is set too (even empty: either could be the one
    meant)."""
    path = _file_path(variable, environment)
    if path is None:
        return None
    if variable in environment:
        raise SecretFileRefused(
            f"{variable} and {variable}{FILE_SUFFIX} are both set: set one or the other"
        )
    return _read_secret_file(variable + FILE_SUFFIX, path, regular_only=regular_only)


# A key is sent in a header (`Authorization: Bearer <key>`), which carries printable ASCII alone:
# a key with another character (a file's second line, a letter that is not ASCII) failed each
# call, as a model server that does not answer or as an internal error.
UNSENDABLE_KEY = (
    "holds a character no HTTP header may carry (a line break or another control character, "
    "or one that is not ASCII)"
)


def is_sendable_key(key: str) -> bool:
    return key.isascii() and key.isprintable()


def variable_or_file(name: str) -> str | None:
    """The secret the environment variable `name` holds, or the file `name`_FILE names (as the
    secret settings are read, with the same refusals, and a file that is not a regular file
    refused too), read anew at each call: a file rotated in place is read as it is now. None
    when neither is set."""
    from_file = _file_value(name, os.environ, regular_only=True)
    return os.environ.get(name) if from_file is None else from_file


class _SecretFiles(PydanticBaseSettingsSource):
    """Each secret setting (a SecretStr) whose ENGRAM_<NAME>_FILE is set, read from that file;
    refused when ENGRAM_<NAME> is set too (either could be the one meant)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if not _is_secret(field):
            return None, field_name, False
        variable = f"{RESERVED_ENV_PREFIX}{field_name.upper()}"
        return _file_value(variable, _environment()), field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, field in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field, name)
            if value is not None:
                values[key] = value
        return values


class Settings(BaseSettings):
    # hide_input_in_errors: a refused value may be a secret (a database URL with its password,
    # a key); the messages name the variable and what it accepts, never the value.
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_", env_file=None, extra="ignore", hide_input_in_errors=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        secret_files = _SecretFiles(settings_cls)
        return (init_settings, env_settings, secret_files, dotenv_settings, file_secret_settings)

    # Only "production" changes anything (the refusals below); no other value is accepted, so
    # that a name such as "test" or "staging" cannot look as if it did.
    environment: Literal["development", "production"] = "development"

    # With no database_url the service starts its own embedded PostgreSQL in data_dir.
    # An empty one counts as unset, as does an empty data_dir.
    database_url: SecretStr | None = None
    data_dir: Path = Field(default_factory=_default_data_dir)
    pool_min_size: int = Field(default=2, ge=0)
    pool_max_size: int = Field(default=10, ge=1)
    # Bounds on the database work of requests and turns, set on each pooled connection as it
    # connects (0: none): a statement's run, a wait for a lock (a row another transaction
    # holds), and a transaction left idle (a process stalled mid-transaction). Search upkeep
    # lifts them for its own connection (index builds take minutes), and the command line's
    # pool (exports, imports, reembed, maintain-search) has none. Generous for every request's
    # statements: work that grows with what is stored (eraseSession) is done in statements of
    # a bounded size, each under a second (bench/bounds.py).
    statement_timeout_seconds: float = Field(default=60.0, ge=0, le=DAY, allow_inf_nan=False)
    lock_timeout_seconds: float = Field(default=10.0, ge=0, le=DAY, allow_inf_nan=False)
    idle_in_transaction_seconds: float = Field(default=60.0, ge=0, le=DAY, allow_inf_nan=False)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    # Surrounding whitespace (a secret file's newline) is stripped.
    bootstrap_token: SecretStr | None = None

    # Request limits: bodies larger than this are refused before parsing.
    max_body_bytes: int = Field(default=1_000_000, ge=1)
    # ... and bodies that do not arrive whole within this (each held its buffer meanwhile).
    body_timeout_seconds: float = _seconds(30.0)
    max_query_depth: int = Field(default=12, ge=1)
    max_query_tokens: int = Field(default=5_000, ge=1)
    # The most objects an answer may hold, each list counted at its `first` (app/graphql/limits.py):
    # aliases and the schema's loops (a record's action's records) repeated one page without end.
    max_query_nodes: int = Field(default=10_000, ge=1)
    # The most ranked searches one request may run (aliases ran 50 at once, holding every
    # pooled connection while other tenants' requests waited).
    max_query_searches: int = Field(default=20, ge=1)
    # The most an answer may hold, counted as it is built (its field names and the text of its
    # values, app/graphql/field_completion.py): the object count bounds no text, and nine aliased
    # pages of agents' 64 KiB instructions were 590 MB. At least 1 MiB, so that one execution's
    # input (a request body, ENGRAM_MAX_BODY_BYTES) is read; at most 1 GiB.
    max_answer_bytes: int = Field(default=32 * 2**20, ge=2**20, le=2**30)
    # JSON in a request body nested deeper than this is refused before anything parses it further.
    # At most 256: Python's recursion limit (1000 frames) bounds how deep json and the walks of
    # a value (dataclasses.asdict, two frames a level) can go below a request's own frames; a
    # memory's metadata 500 levels deep already failed as INTERNAL (470 passed), so 256 keeps
    # room for deeper call paths, and a RecursionError of the parser still means "too deep".
    max_json_depth: int = Field(default=64, ge=4, le=256)
    # Search queries (searchMemories, the agent's search tools) longer than this are refused:
    # a query is embedded and matched whole, so its length is work the service does per request.
    max_search_query_chars: int = Field(default=4096, ge=1)
    # Fairness between accounts, per process (app/fairness.py): one account's requests in
    # progress (GraphQL and MCP), its turns in progress, and the pooled connections its work
    # holds at once. Unset: twice the pool for requests (those beyond the connections' share
    # wait for the account's own connections: 20 of a search-heavy account served its others
    # as well as 5 did, bench/README.md), the pool's size for turns (which hold none while their
    # model works), half the pool for connections (so that another account's requests find
    # one). Beyond a bound a request waits up to account_queue_seconds (0: not
    # at all), and is then answered 429.
    max_requests_per_account: int | None = Field(default=None, ge=1, le=10_000)
    max_turns_per_account: int | None = Field(default=None, ge=1, le=10_000)
    max_connections_per_account: int | None = Field(default=None, ge=1)
    account_queue_seconds: float = Field(default=1.0, ge=0, le=60, allow_inf_nan=False)
    # Schema introspection (__schema, __type) for authenticated clients; off: refused, and
    # GraphiQL says why it cannot load the schema.
    introspection: bool = True

    # Logs on stderr: "text" (a line each) or "json" (an object a line, with the request ID).
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # OpenTelemetry traces (the `otel` extra) to this OTLP/HTTP endpoint, e.g.
    # http://127.0.0.1:4318/v1/traces; unset: no tracing.
    otel_endpoint: str | None = None

    # Embeddings: "static" (wordllama, bundled), "minilm" (extra), or "openai".
    embedder: Literal["static", "minilm", "openai"] = "static"
    embedding_url: str = "http://127.0.0.1:11434/v1"
    embedding_model: str = "text-embedding-3-small"
    embedding_dimensions: int | None = Field(default=None, ge=1, le=INDEXED_DIMENSIONS)
    embedding_api_key: SecretStr | None = None
    embedding_batch_size: int = Field(default=64, ge=1)
    embedding_timeout_seconds: float = _seconds(30.0)

    # Search upkeep (app/memory/maintenance.py): every search_maintenance_seconds (0: never;
    # run `engram maintain-search` instead), agents with at least agent_index_min_records
    # records given their own search indexes, the largest agent_index_max_agents of them (each
    # adds two indexes to agent_memories, all locked by every statement planned on it or
    # writing to it: raise it with the server's max_locks_per_transaction), built with
    # agent_index_build_memory as maintenance_work_mem ("": the server's). Between rounds, a
    # write that takes an agent (or a session) past its threshold has its indexes built at
    # once, in the background, within the same caps. Their words are counted with them (search
    # weighs a word by how many of the agent's records hold it).
    search_maintenance_seconds: float = Field(default=600.0, ge=0, le=WEEK, allow_inf_nan=False)
    # 2,000: own indexes make a 5,000-record agent's hybrid search 3.3 ms p50 instead of 11.4
    # by scoring every record (1,000 records: 2.5 against 3.6; bench/README.md), and each
    # reader of a listed agent is weighed by the records it sees (migration 0020).
    agent_index_min_records: int = Field(default=2_000, ge=1)
    # 100: planning a search costs 1.9 ms with 100 agents' indexes (1.2 with 50, 4.6 with 300,
    # 10.8 with 500: bench/agent_index_cap.py), an agent beyond the cap 50 ms to seconds. With
    # the cap reached, an agent of twice the smallest listed one's records takes its place.
    agent_index_max_agents: int = Field(default=100, ge=0)
    agent_index_build_memory: str = "1GB"
    # The same rounds give sessions of at least history_index_min_parts kept parts their own
    # HNSW index on history_parts, the largest history_index_max_sessions of them (one index
    # each; app/history/indexes.py).
    history_index_min_parts: int = Field(default=10_000, ge=1)
    history_index_max_sessions: int = Field(default=50, ge=0)

    # Default model (LLM) used by actions that do not name their own.
    model_base_url: str = "http://127.0.0.1:11434/v1"
    model_name: str = "gpt-4o-mini"
    model_api_key: SecretStr | None = None
    model_timeout_seconds: float = _seconds(120.0)
    # At most 10: with the backoff capped at 30 s, ten retries already wait up to 2.5 minutes
    # beyond their timeouts, and the turn's liveness bound counts every retry.
    model_max_retries: int = Field(default=2, ge=0, le=10)
    # At most 1024, as the tool calls of one reply: the turn's liveness bound multiplies it.
    max_model_calls_per_turn: int = Field(default=16, ge=1, le=1024)
    # One reply's tool calls that run; those beyond are each answered with a refusal the model
    # reads (OpenAI's API takes at most 128 tools in a request; no agent needs to fan out
    # further in one reply, and each call may embed, search or write).
    max_tool_calls_per_reply: int = Field(default=64, ge=1, le=1024)
    # The longest one turn may run, its end-of-turn memory review included (0: no bound): past
    # it the turn stops what it awaits (a model call, a tool call) and fails, keeping nothing;
    # a review cut by it is dropped and the turn commits its answer (app/runtime/deadline.py).
    # Ten minutes: five model calls each taking its whole ENGRAM_MODEL_TIMEOUT_SECONDS.
    turn_timeout_seconds: float = Field(default=600.0, ge=0, le=DAY, allow_inf_nan=False)
    # The most a model's reply may take, read decoded: 2 MB holds the longest replies models
    # write (128k tokens, ~0.5 MB of English, ~1.2 MB of escaped CJK); a longer one fails the
    # call, unread and unstored.
    model_max_reply_bytes: int = Field(default=2_000_000, ge=10_000, le=100_000_000)
    # The context budget of a model call, in tokens of about four characters, for actions whose
    # model sets no contextTokens: earlier turns are cleared and summarized to stay within it.
    model_context_tokens: int = Field(default=32_000, ge=256)
    # Endpoints and key variables an action's `model` may name: an action names them, so a
    # client that may write actions must not be able to send a host secret to its own server,
    # nor run on a key the operator gave another account. A JSON list: for every account; a
    # JSON object: each to the accounts that may use it (account IDs, or "*" for every one).
    # model_base_url (and model_api_key, sent only there) is every account's; a key variable
    # is allowed only when listed. Parsed by _allow_list, not by pydantic-settings, so a wrong
    # one names its variable; read through allows_base_url and allows_key_env.
    model_allowed_base_urls: Annotated[AllowList, NoDecode] = Field(default_factory=list)
    model_allowed_key_envs: Annotated[AllowList, NoDecode] = Field(default_factory=list)

    # Turns of a dead process (app/runtime/liveness.py): every process refreshes its heartbeat
    # and sweeps every turn_heartbeat_seconds; a turn whose process has not beaten for
    # turn_lease_seconds is failed (it can then be retried), and what it staged is dropped.
    turn_heartbeat_seconds: float = _seconds(10.0)
    # At most a week: the sweep subtracts it from now() as a PostgreSQL interval.
    turn_lease_seconds: float = _seconds(60.0, high=WEEK)
    # Events of administrative changes (admin_events) older than this many days are deleted by
    # the same sweeps, oldest first, a batch at a time (0: kept as long as their account). A
    # year: what audits commonly look back over, and a tenant that issues a token per job
    # writes an event each time, which would otherwise grow without end. At most
    # MAX_RETENTION_DAYS: a sweep subtracts it from now(), which a far larger value would take
    # out of PostgreSQL's dates at every heartbeat.
    admin_events_retention_days: int = Field(default=365, ge=0, le=MAX_RETENTION_DAYS)

    # The end-of-turn memory review (app/runtime/review.py): how many of its most similar
    # records each candidate is compared with, and the score a neighbour must reach for the
    # review to ask the model what to do (below it, candidates are added without asking).
    memory_review_neighbours: int = Field(default=5, ge=1, le=20)
    memory_review_floor: float = Field(default=0.4, ge=0, le=1)

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        # Bytes that are not UTF-8 in a variable reach Python as lone surrogates, which fail
        # only where the value is first encoded (the bootstrap token: after the database started).
        text = _plain(value)
        if isinstance(text, str) and not is_storable(text):
            raise ValueError("is not valid text (a NUL, or bytes that are not UTF-8)")
        return value

    @field_validator("environment", "log_format", "log_level", "embedder", mode="before")
    @classmethod
    def _any_case(cls, value: Any, info: ValidationInfo) -> Any:
        # A word from a fixed list, in any case (`ENGRAM_LOG_LEVEL=debug`): as the list has it.
        if not isinstance(value, str):
            return value
        return value.upper() if info.field_name == "log_level" else value.lower()

    @field_validator("database_url", mode="before")
    @classmethod
    def _postgresql_url(cls, value: Any) -> Any:
        url = _plain(value)
        if not isinstance(url, str):
            return value
        if not url.strip():
            return None
        if not url.startswith(("postgresql://", "postgres://")):
            # The value is not echoed: it may hold a password.
            raise ValueError(
                "must be a postgresql:// URL, e.g. postgresql://engram:PASSWORD@db:5432/engram "
                "(unset: the embedded PostgreSQL)"
            )
        authority = re.split(r"[/?]", url.split("://", 1)[1], maxsplit=1)[0]
        if authority.count("@") > 1:
            # libpq would take what follows the first '@' for the host, and say it (a part of
            # the password) in its refusal to connect.
            raise ValueError(
                "holds '@' more than once before its host: write an '@' of the user name or "
                "password as %40"
            )
        for host in authority.rpartition("@")[2].split(","):
            if host.startswith("[") and "]" not in host:
                continue  # an IPv6 address left open: libpq's own refusal says so
            port = host.rpartition("]")[2] if host.startswith("[") else host
            port = port.partition(":")[2]
            if port and not port.isdigit():
                # A '/' or '?' of a password ends the authority early: libpq then reads the
                # password's first part as the host and its next as the port, and says them.
                raise ValueError(
                    "has a port that is not a number: write a '/' or '?' of the user name or "
                    "password as %2F or %3F"
                )
        return value

    @field_validator("data_dir", mode="before")
    @classmethod
    def _empty_is_default(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return _default_data_dir()
        return value

    @field_validator("host", mode="before")
    @classmethod
    def _empty_host_is_default(cls, value: Any) -> Any:
        # An empty host would listen on every interface (asyncio's reading of ""), the opposite
        # of what an unset one does.
        if isinstance(value, str) and not value.strip():
            return "127.0.0.1"
        return value

    @field_validator("model_name", "embedding_model")
    @classmethod
    def _names_a_model(cls, value: str) -> str:
        # An empty name was sent to the endpoint as it was, whose refusal named no setting.
        if not value.strip():
            raise ValueError("must name a model (unset, it takes its default)")
        return value

    @field_validator("bootstrap_token", mode="before")
    @classmethod
    def _strip_token(cls, value: Any) -> Any:
        token = _plain(value)
        if not isinstance(token, str):
            return value
        if not token.strip():
            raise ValueError("is empty (or only whitespace): set a token, or unset it")
        return token.strip()

    @field_validator("model_api_key", "embedding_api_key")
    @classmethod
    def _sendable_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not is_sendable_key(value.get_secret_value().strip()):
            raise ValueError(UNSENDABLE_KEY)
        return value

    @field_validator("agent_index_build_memory")
    @classmethod
    def _build_memory(cls, value: str) -> str:
        if value == "":
            return value
        size = _SIZE.fullmatch(value)
        kb = int(size[1]) * _KB_PER[size[2] or "kB"] if size else None
        if kb is None or not _BUILD_MEMORY_KB[0] <= kb <= _BUILD_MEMORY_KB[1]:
            raise ValueError(
                "must be a size from 1MB to 2047GB (PostgreSQL's maintenance_work_mem), such "
                "as 512MB or 2GB (units kB, MB, GB, TB; none: kB), or empty for the server's"
            )
        return value

    @field_validator("model_allowed_base_urls", "model_allowed_key_envs", mode="before")
    @classmethod
    def _allow_list(cls, value: Any, info: ValidationInfo) -> Any:
        urls = info.field_name == "model_allowed_base_urls"
        if isinstance(value, str):
            if not value.strip():
                return []
            try:
                value = json.loads(value)
            except ValueError:
                value = None
        if isinstance(value, list):
            for index, item in enumerate(value):
                if not isinstance(item, str):
                    raise ValueError(f"item {index}: must be a string")
                _allowed_name(item, index, urls, "item")
            return value
        if not isinstance(value, dict):
            example = (
                '["https://models.example.com/v1"]' if urls else '["TEAM_MODEL_KEY"]',
                '{"https://models.example.com/v1": ["*"]}'
                if urls
                else '{"TEAM_MODEL_KEY": ["<account ID>"], "SHARED_KEY": ["*"]}',
            )
            raise ValueError(
                f"must be a JSON list of strings, e.g. {example[0]} (every account may use "
                "each), or a JSON object from each to the accounts that may use it (account "
                f'IDs, or "*" for every account), e.g. {example[1]}'
            )
        return {
            _allowed_name(name, index, urls): _accounts(accounts, name, index, urls)
            for index, (name, accounts) in enumerate(value.items())
        }

    @field_validator("admin_events_retention_days", mode="wrap")
    @classmethod
    def _retention_days(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            # pydantic's "greater than or equal to 0" does not say what 0 means.
            raise ValueError(
                f"must be a whole number of days from 1 to {MAX_RETENTION_DAYS} (100 years), "
                "or 0 to keep events as long as their account"
            ) from None

    @field_validator("otel_endpoint", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("model_base_url", "embedding_url", "otel_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not _is_http_url(value):
            # (not quoted: a URL may carry a password)
            raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _refuse_inconsistent_or_unsafe(self) -> "Settings":
        if self.pool_min_size > self.pool_max_size:
            raise ValueError(
                "ENGRAM_POOL_MIN_SIZE must not be more than ENGRAM_POOL_MAX_SIZE "
                f"({self.pool_min_size} > {self.pool_max_size})"
            )
        shared = self.max_connections_per_account
        if shared is not None and shared > self.pool_max_size:
            raise ValueError(
                "ENGRAM_MAX_CONNECTIONS_PER_ACCOUNT must not be more than ENGRAM_POOL_MAX_SIZE "
                f"({shared} > {self.pool_max_size}): it is each account's share of the pool"
            )
        if self.turn_lease_seconds < 2 * self.turn_heartbeat_seconds:
            raise ValueError(
                "ENGRAM_TURN_LEASE_SECONDS must be at least twice ENGRAM_TURN_HEARTBEAT_SECONDS, "
                "or a live process's turns could be failed between two heartbeats"
            )
        if isinstance(self.model_allowed_base_urls, dict):
            default = self.model_base_url.rstrip("/")
            for index, (url, accounts) in enumerate(self.model_allowed_base_urls.items()):
                if url.rstrip("/") == default and EVERY_ACCOUNT not in accounts:
                    # It would read as limited, and is not: agents that name no model use it.
                    raise ValueError(
                        f"ENGRAM_MODEL_ALLOWED_BASE_URLS: entry {index} is ENGRAM_MODEL_BASE_URL, "
                        "the default model, which every account uses: it cannot be limited to "
                        "accounts (remove the entry)"
                    )
        if self.environment == "production":
            token = self.bootstrap_token_value()
            if token is not None and len(token) < 32:
                raise ValueError(
                    f"{variable_of('bootstrap_token')} must be at least 32 characters in production"
                )
            refusal = self.exposed_refusal(self.host, f"ENGRAM_HOST={self.host}")
            if refusal is not None:
                raise ValueError(refusal)
        return self

    def exposed_refusal(self, host: str, named: str) -> str | None:
        """Why this deployment may not listen on `host` (`named` says where it was set): in
        production, listening beyond this machine needs a database of its own, not the
        embedded one."""
        if self.environment == "production" and not is_loopback(host) and self.database_url is None:
            return (
                f"production deployments listening beyond this machine ({named}) must set "
                "ENGRAM_DATABASE_URL (or ENGRAM_DATABASE_URL_FILE)"
            )
        return None

    def allows_base_url(self, url: str, account_id: UUID) -> bool:
        """Whether an action of `account_id` may name `url` as its model.baseUrl."""
        url = url.rstrip("/")
        if url == self.model_base_url.rstrip("/"):
            return True
        return any(
            url == allowed.rstrip("/")
            for allowed in _allowed_for(self.model_allowed_base_urls, account_id)
        )

    def allows_key_env(self, name: str, account_id: UUID) -> bool:
        """Whether an action of `account_id` may name `name` as its model.apiKeyEnv."""
        return name in _allowed_for(self.model_allowed_key_envs, account_id)

    def requests_per_account(self) -> int:
        return self.max_requests_per_account or 2 * self.pool_max_size

    def turns_per_account(self) -> int:
        return self.max_turns_per_account or self.pool_max_size

    def connections_per_account(self) -> int:
        return self.max_connections_per_account or max(1, self.pool_max_size // 2)

    def database_url_value(self) -> str | None:
        return self.database_url.get_secret_value() if self.database_url else None

    def bootstrap_token_value(self) -> str | None:
        return self.bootstrap_token.get_secret_value() if self.bootstrap_token else None


def variable_of(field: str) -> str:
    """The variable that gave `field` its value, as a refusal of the value names it:
    ENGRAM_<FIELD>, or for a secret read from a file, ENGRAM_<FIELD>_FILE and that file."""
    variable = f"{RESERVED_ENV_PREFIX}{field.upper()}"
    setting = Settings.model_fields.get(field)
    secret = setting is not None and _is_secret(setting)
    path = _file_path(variable, _environment()) if secret else None
    return variable if path is None else f"{variable}{FILE_SUFFIX} ({path})"
