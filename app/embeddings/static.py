"""`static`: wordllama's bundled 256-d model, loaded offline from the package's own folder."""

from pathlib import Path

import numpy as np

from app.embeddings.base import LocalEmbedder, normalize


class StaticEmbedder(LocalEmbedder):
    dimensions = 256

    def __init__(self) -> None:
        import wordllama
        from tokenizers import Tokenizer
        from wordllama import WordLlama

        # wordllama's loader looks in the wrong folder and then downloads; point it home.
        model = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
        self.name = "static:wordllama-256"
        self._table: np.ndarray = model.embedding
        # wordllama's own embed() pads every batch to its longest text and must be tokenized
        # again to count tokens; one unpadded pass does both, twice as fast, in bounded memory.
        self._tokenizer = Tokenizer.from_str(model.tokenizer.to_str())
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        vectors = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        tokens = 0
        last = len(self._table) - 1
        for row, encoded in zip(
            vectors, self._tokenizer.encode_batch(texts, add_special_tokens=False), strict=True
        ):
            if encoded.ids:
                ids = np.minimum(np.asarray(encoded.ids, dtype=np.int64), last)
                row[:] = self._table[ids].mean(axis=0)
                tokens += len(ids)
        return normalize(vectors), tokens
