"""One settings object for the whole service, read from ENGRAM_* environment variables."""

from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("engram"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_", env_file=None, extra="ignore")

    environment: Literal["development", "production", "test"] = "development"

    # With no database_url the service starts its own embedded PostgreSQL in data_dir.
    database_url: SecretStr | None = None
    data_dir: Path = Field(default_factory=_default_data_dir)
    pool_min_size: int = 2
    pool_max_size: int = 10

    host: str = "127.0.0.1"
    port: int = 8000
    bootstrap_token: SecretStr | None = None

    # Request limits: bodies larger than this are refused before parsing.
    max_body_bytes: int = 1_000_000
    max_query_depth: int = 12
    max_query_tokens: int = 5_000
    # JSON in a request body nested deeper than this is refused before anything parses it further.
    max_json_depth: int = Field(default=64, ge=4)
    # Search queries (searchMemories, the agent's search tools) longer than this are refused:
    # a query is embedded and matched whole, so its length is work the service does per request.
    max_search_query_chars: int = Field(default=4096, ge=1)
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
    embedding_dimensions: int | None = None
    embedding_api_key: SecretStr | None = None
    embedding_batch_size: int = 64
    embedding_timeout_seconds: float = 30.0

    # Search upkeep (app/memory/maintenance.py): every search_maintenance_seconds (0: never;
    # run `engram maintain-search` instead), agents with at least agent_index_min_records
    # records given their own search indexes, the largest agent_index_max_agents of them (each
    # adds two indexes to agent_memories, all locked by every statement planned on it or
    # writing to it: raise it with the server's max_locks_per_transaction), built with
    # agent_index_build_memory as maintenance_work_mem ("": the server's). Between rounds, a
    # write that takes an agent (or a session) past its threshold has its indexes built at
    # once, in the background, within the same caps. Their words are counted with them (search
    # weighs a word by how many of the agent's records hold it).
    search_maintenance_seconds: float = Field(default=600.0, ge=0)
    # 2,000: own indexes make a 5,000-record agent's hybrid search 3.3 ms p50 instead of 11.4
    # by scoring every record (1,000 records: 2.5 against 3.6; bench/README.md), and each
    # reader of a listed agent is weighed by the records it sees (migration 0020).
    agent_index_min_records: int = Field(default=2_000, ge=1)
    # 100: planning a search costs 1.9 ms with 100 agents' indexes (1.2 with 50, 4.6 with 300,
    # 10.8 with 500: bench/agent_index_cap.py), an agent beyond the cap 50 ms to seconds. With
    # the cap reached, an agent of twice the smallest listed one's records takes its place.
    agent_index_max_agents: int = Field(default=100, ge=0)
    agent_index_build_memory: str = Field(default="1GB", pattern=r"^(\d+ ?(kB|MB|GB|TB)?)?$")
    # The same rounds give sessions of at least history_index_min_parts kept parts their own
    # HNSW index on history_parts, the largest history_index_max_sessions of them (one index
    # each; app/history/indexes.py).
    history_index_min_parts: int = Field(default=10_000, ge=1)
    history_index_max_sessions: int = Field(default=50, ge=0)

    # Default model (LLM) used by actions that do not name their own.
    model_base_url: str = "http://127.0.0.1:11434/v1"
    model_name: str = "gpt-4o-mini"
    model_api_key: SecretStr | None = None
    model_timeout_seconds: float = 120.0
    model_max_retries: int = 2
    max_model_calls_per_turn: int = 16
    # The context budget of a model call, in tokens of about four characters, for actions whose
    # model sets no contextTokens: earlier turns are cleared and summarized to stay within it.
    model_context_tokens: int = Field(default=32_000, ge=256)
    # Endpoints and key variables an action's `model` may name: an action names them, so a
    # client that may write actions must not be able to send a host secret to its own server.
    # model_base_url is always allowed; a key variable only when listed.
    model_allowed_base_urls: list[str] = Field(default_factory=list)
    model_allowed_key_envs: list[str] = Field(default_factory=list)

    # Turns of a dead process (app/runtime/liveness.py): every process refreshes its heartbeat
    # and sweeps every turn_heartbeat_seconds; a turn whose process has not beaten for
    # turn_lease_seconds is failed (it can then be retried), and what it staged is dropped.
    turn_heartbeat_seconds: float = Field(default=10.0, gt=0)
    turn_lease_seconds: float = Field(default=60.0, gt=0)

    # The end-of-turn memory review (app/runtime/review.py): how many of its most similar
    # records each candidate is compared with, and the score a neighbour must reach for the
    # review to ask the model what to do (below it, candidates are added without asking).
    memory_review_neighbours: int = Field(default=5, ge=1, le=20)
    memory_review_floor: float = Field(default=0.4, ge=0, le=1)

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> "Settings":
        if self.turn_lease_seconds < 2 * self.turn_heartbeat_seconds:
            raise ValueError(
                "ENGRAM_TURN_LEASE_SECONDS must be at least twice ENGRAM_TURN_HEARTBEAT_SECONDS, "
                "or a live process's turns could be failed between two heartbeats"
            )
        if self.environment == "production":
            token = self.bootstrap_token.get_secret_value() if self.bootstrap_token else None
            if token is not None and len(token) < 32:
                raise ValueError(
                    "ENGRAM_BOOTSTRAP_TOKEN must be at least 32 characters in production"
                )
            if self.host == "0.0.0.0" and self.database_url is None:
                raise ValueError("production deployments must set ENGRAM_DATABASE_URL")
        return self

    def database_url_value(self) -> str | None:
        return self.database_url.get_secret_value() if self.database_url else None
