"""`static`: wordllama's bundled 256-d model, loaded offline from the package's own folder."""

import asyncio
from pathlib import Path

import numpy as np

from app.embeddings.base import Embeddings, normalize


class StaticEmbedder:
    dimensions = 256

    def __init__(self) -> None:
        import wordllama
        from wordllama import WordLlama

        # wordllama's loader looks in the wrong folder and then downloads; point it home.
        self._model = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
        self.name = "static:wordllama-256"

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32), 0
        vectors = self._model.embed(texts, norm=False)
        tokens = sum(len(ids) for ids in self._model.tokenize(texts))
        return normalize(vectors), tokens

    async def embed(self, texts: list[str]) -> Embeddings:
        vectors, tokens = await asyncio.to_thread(self._embed, texts)
        return Embeddings(vectors, tokens)

    async def aclose(self) -> None:
        return None
