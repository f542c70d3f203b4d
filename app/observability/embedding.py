"""An embedder that times and counts its calls (purpose `embed`) in a service's metrics."""

import time
from typing import Any

from app.observability.metrics import Metrics


class MeteredEmbedder:
    """Wraps the service's embedder: every other attribute is the wrapped one's."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def embed(self, texts: list[str]) -> Any:
        started = time.perf_counter()
        try:
            result = await self.inner.embed(texts)
        except BaseException:
            self.metrics.embedding(False, time.perf_counter() - started, 0)
            raise
        self.metrics.embedding(True, time.perf_counter() - started, result.tokens)
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()
