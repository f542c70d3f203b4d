"""What the running service holds for its lifetime: the pool, settings and providers."""

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import asyncpg

from app.config import Settings
from app.embeddings.base import Embedder

T = TypeVar("T")


@dataclass(frozen=True)
class ServiceKey(Generic[T]):
    """Names one of the process's services, typed by it: `MODEL: ServiceKey[ModelClient]`. The
    layer that owns a service defines its key beside it (`runtime/model.MODEL`): those layers
    sit above this module, which cannot name their types."""

    name: str


class Services:
    """The process's services (model client, search maintenance, turn liveness), each under its
    key and read back as its key's type; stopped in the reverse of the order they were added."""

    def __init__(self) -> None:
        self._by_key: dict[ServiceKey[Any], Any] = {}

    def __getitem__(self, key: ServiceKey[T]) -> T:
        value: T = self._by_key[key]
        return value

    def __setitem__(self, key: ServiceKey[T], service: T) -> None:
        self._by_key[key] = service

    def get(self, key: ServiceKey[T]) -> T | None:
        value: T | None = self._by_key.get(key)
        return value

    def values(self) -> list[object]:
        return list(self._by_key.values())


@dataclass
class AppState:
    settings: Settings
    pool: asyncpg.Pool
    embedder: Embedder | None = None
    # Filled in by the layers that own them (app/services.py, runtime/turns.model_client).
    services: Services = field(default_factory=Services)
