"""The embedding provider interface: texts in, unit vectors and token usage out."""

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

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


_NUMBERS = {float, int}  # as JSON parses them (a bool is an int to isinstance, not to type)


def vector_fault(value: Any) -> str | None:
    """What makes `value`, a vector as JSON holds it, other than a list of numbers (`item 3 is
    a list`), or None when it is one: said in a refusal, where numpy's own error would be a
    paragraph on an "inhomogeneous shape"."""
    if not isinstance(value, list):
        return f"it is {_json_kind(value)}"
    if set(map(type, value)) <= _NUMBERS:  # at C speed: the answer of every embedding call
        return None
    for place, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float):
            return f"item {place} is {_json_kind(item)}"
    return None


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else type(value).__name__


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each vector at length 1, in float32 as stored. Its length is taken in float64: in
    float32 the squares of a value past about 1.8e19 overflowed (the vector was divided by
    infinity, to zeros) and those of one under about 1e-23 underflowed (it was left as it came),
    and pgvector's cosine of either is NaN, which no search can rank. A vector of zeros has no
    length and stays as it is (`has_direction`)."""
    wide = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(wide, axis=1, keepdims=True)
    return (wide / np.where(norms == 0, 1, norms)).astype(np.float32)


def has_direction(vectors: np.ndarray) -> np.ndarray:
    """Which vectors have a direction: not all zeros (a cosine to one is NaN)."""
    return np.any(np.asarray(vectors), axis=1)


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
