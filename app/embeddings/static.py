"""`static`: wordllama's bundled 256-d model, loaded offline from the package's own folder."""

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from app.embeddings.base import LocalEmbedder, normalize


def _give_back_freed_heap() -> None:
    """Loading the model frees about 40 MB of heap (its files read and parsed) that glibc's
    malloc keeps for later: its pages given back, a process with the app and the model loaded
    holds 199 MB RSS, not 234 (bench/README.md, "Growth"). Elsewhere than glibc, nothing."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


class StaticEmbedder(LocalEmbedder):
    dimensions = 256
    inline_chars = 256  # tens of microseconds: less than handing them to a thread

    def __init__(self) -> None:
        import wordllama
        from tokenizers import Tokenizer
        from wordllama import WordLlama

        # wordllama's loader looks in the wrong folder and then downloads; point it home.
        model = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
        self.name = "static:wordllama-256"
        self._table: np.ndarray = model.embedding
        # wordllama's own embed() pads every batch to its longest text and must be tokenized
        # again to count tokens; one unpadded pass does both, in bounded memory.
        self._tokenizer = Tokenizer.from_str(model.tokenizer.to_str())
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        # Its BPE model would keep the tokens of each distinct text under 256 bytes (this
        # tokenizer splits no words: a whole text is one), the first 10,000 for good: up to 81
        # MB a process for a client sending distinct queries, and no hit for a text that comes
        # after them. A hit saved about 3 us a query (bench/README.md, "Growth").
        self._tokenizer.model._resize_cache(0)
        del model  # (its loader's own tokenizer and weights; the table is kept)
        _give_back_freed_heap()

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        # The mean of a text's token vectors, summed a bounded piece at a time: a long text
        # never becomes a (tokens x 256) matrix (bench/README.md measures it).
        vectors = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        counts = np.zeros(len(texts), dtype=np.int64)
        last = len(self._table) - 1
        batch: list[tuple[int, str]] = []
        for row, text in enumerate(texts):
            for piece in _pieces(text):
                batch.append((row, piece))
                if len(batch) == _BATCH_PIECES:
                    self._add(batch, vectors, counts, last)
                    batch = []
        if batch:
            self._add(batch, vectors, counts, last)
        means = vectors / np.maximum(counts, 1)[:, None]
        return normalize(means), int(counts.sum())

    def _add(
        self, batch: list[tuple[int, str]], sums: np.ndarray, counts: np.ndarray, last: int
    ) -> None:
        if len(batch) == 1:
            # One piece (a search's query): encode_batch would hand it to the tokenizer's
            # thread pool and wait for it, which under load cost ten times the work.
            encoded = [self._tokenizer.encode(batch[0][1], add_special_tokens=False)]
        else:
            encoded = self._tokenizer.encode_batch([p for _, p in batch], add_special_tokens=False)
        for (row, _), piece in zip(batch, encoded, strict=True):
            if piece.ids:
                ids = np.minimum(np.asarray(piece.ids, dtype=np.int64), last)
                sums[row] += self._table[ids].sum(axis=0)
                counts[row] += len(ids)


# A text is tokenized in pieces of at most this many characters, cut before a space (which the
# tokenizer's normalizer turns back into the word's leading "▁"), so the pieces' tokens are the
# whole text's; at most _BATCH_PIECES pieces are tokenized at once.
_PIECE_CHARS = 2048
_BATCH_PIECES = 64


def _pieces(text: str) -> Iterator[str]:
    start = 0
    while len(text) - start > _PIECE_CHARS:
        end = start + _PIECE_CHARS
        cut = text.rfind(" ", start + 1, end)
        if cut == -1:
            yield text[start:end]
            start = end
        else:
            yield text[start:cut]
            start = cut + 1
    yield text[start:]
