"""What the running service holds for its lifetime: the pool, settings and providers."""

from dataclasses import dataclass, field
from typing import Any

import asyncpg

from app.config import Settings
from app.embeddings.base import Embedder


@dataclass
class AppState:
    settings: Settings
    pool: asyncpg.Pool
    embedder: Embedder | None = None
    # Filled in by the layers that own them (e.g. the embedding provider), keyed by name.
    services: dict[str, Any] = field(default_factory=dict)
