"""The embedding provider interface: texts in, unit vectors and token usage out."""

import asyncio
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # shape (n, dimensions), float32, each row of unit length
    # Usage, recorded by the runtime as purpose `embed`: at least one a text, so that every
    # embedding made is recorded (M24, H11), also of a text the tokenizer drops whole.
    tokens: int


class Embeds(Protocol):
    """What a search or a write needs of the deployment's embedder."""

    name: str  # identifies the model, e.g. "static:wordllama-l2-supercat-256"

    async def embed(self, texts: list[str]) -> Embeddings: ...


class Embedder(Embeds, Protocol):
    dimensions: int

    async def aclose(self) -> None: ...


def normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


class LocalEmbedder:
    """A model in this process: `_embed` runs in a worker thread, off the event loop, except
    for texts of at most `inline_chars` in all (a search's query, for a cheap model), where
    handing them to a thread costs more CPU than embedding them."""

    name: str
    dimensions: int
    inline_chars = 0

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        raise NotImplementedError

    async def embed(self, texts: list[str]) -> Embeddings:
        if sum(len(t) for t in texts) <= self.inline_chars:
            vectors, tokens = self._embed(texts)
        else:
            vectors, tokens = await asyncio.to_thread(self._embed, texts)
        return Embeddings(vectors, max(tokens, len(texts)))

    async def aclose(self) -> None:
        return None
