"""`openai`: any OpenAI-compatible `POST {url}/embeddings` endpoint (OpenAI, vLLM, Ollama, ...).

Texts are sent in batches of `batch_size`, each request answered whole within
`timeout_seconds` or timed out. A transient failure (no connection, a timeout, 408, 429 or
5xx) is retried with exponential backoff, honouring `Retry-After`; any other 4xx is a mistake
in the request or the settings and fails at once, with the server's message.

With `dimensions` set, it is sent with each request (OpenAI's text-embedding-3 models shorten
their vectors to it) and every answer is checked against it; without it, `open()` learns the
dimension from one probe call.
"""

import math
from typing import Any

import httpx
import numpy as np

from app.embeddings.base import Embeddings, has_direction, normalize, vector_fault
from app.embeddings.errors import EmbedderUnavailable, EmbeddingFailed
from app.http_retry import (
    RetriesExhausted,
    TooLarge,
    Undecodable,
    post_with_retries,
    server_message,
    times,
)
from app.text import CHARS_PER_TOKEN, MAX_COUNT

_RETRIED_4XX = frozenset({408, 429})
# The most an answer is read of: each vector's floats written out in JSON (at most about 25
# characters each, "-1.2345678901234567e-05, "), with room for the rest; before the dimension
# is known, as many as any embedding model writes.
_FLOAT_BYTES = 32
_MOST_DIMENSIONS = 16_384


def _answer_bytes(texts: int, dimensions: int) -> int:
    return 65_536 + texts * (dimensions or _MOST_DIMENSIONS) * _FLOAT_BYTES


class OpenAIEmbedder:
    def __init__(
        self,
        *,
        url: str,
        model: str,
        api_key: str | None = None,
        dimensions: int | None = None,
        batch_size: int = 64,
        timeout_seconds: float = 30.0,
        max_retries: int = 4,
        backoff_seconds: float = 0.5,
    ) -> None:
        if batch_size < 1:
            raise ValueError("the embedding batch size must be at least 1")
        self.name = f"openai:{model}"
        self.model = model
        self._requested_dimensions = dimensions
        # 0 until open() learns it, when the settings do not fix it.
        self.dimensions: int = dimensions or 0
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.timeout_seconds = timeout_seconds
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._endpoint = url.rstrip("/") + "/embeddings"
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_seconds, connect=min(timeout_seconds, 10.0)),
        )

    async def open(self) -> "OpenAIEmbedder":
        """Learns the model's dimension with one probe call, unless the settings fix it."""
        if not self.dimensions:
            try:
                vectors, _ = await self._embed_batch(["dimension probe"])
            except EmbeddingFailed as e:
                # Said as a log line says it (`logged`): `engram serve` prints it as it stops.
                raise EmbedderUnavailable(
                    f"could not learn the dimension of {self.model} from {self._endpoint}: "
                    f"{e.logged}; "
                    "check ENGRAM_EMBEDDING_URL and ENGRAM_EMBEDDING_MODEL, or set "
                    "ENGRAM_EMBEDDING_DIMENSIONS"
                ) from e
            self.dimensions = int(vectors.shape[1])
        return self

    async def embed(self, texts: list[str]) -> Embeddings:
        if not self.dimensions:
            raise RuntimeError("OpenAIEmbedder.open() must learn the dimension before use")
        if not texts:
            return Embeddings(np.zeros((0, self.dimensions), dtype=np.float32), 0)
        parts: list[np.ndarray] = []
        tokens = 0
        for start in range(0, len(texts), self.batch_size):
            vectors, used = await self._embed_batch(texts[start : start + self.batch_size])
            parts.append(vectors)
            tokens += used
        return Embeddings(normalize(np.concatenate(parts)), tokens)

    async def _embed_batch(self, texts: list[str]) -> tuple[np.ndarray, int]:
        # OpenAI refuses empty strings; a blank text embeds the same with any model.
        inputs = [text or " " for text in texts]
        body: dict[str, Any] = {"model": self.model, "input": inputs, "encoding_format": "float"}
        if self._requested_dimensions is not None:
            body["dimensions"] = self._requested_dimensions
        try:
            response, _ = await post_with_retries(
                self._client,
                self._endpoint,
                body,
                max_retries=self.max_retries,
                backoff_seconds=self.backoff_seconds,
                retried_4xx=_RETRIED_4XX,
                retry_read_timeouts=True,
                attempt_seconds=self.timeout_seconds,
                max_bytes=_answer_bytes(len(texts), self.dimensions),
            )
        except TooLarge as e:
            raise EmbeddingFailed(
                f"{self._endpoint} answered {len(texts)} texts with more than {e.limit:,} bytes,"
                f" far more than {self.dimensions or 'any'}-d vectors take; it must be an"
                " OpenAI-compatible embeddings endpoint for this model",
                transient=False,
            ) from e
        except Undecodable as e:
            raise EmbeddingFailed(
                f"{self._endpoint} answered with a body that does not decode as its "
                f"Content-Encoding ({e.encoding}) says; it must be an OpenAI-compatible "
                "embeddings endpoint",
                transient=False,
            ) from e
        except RetriesExhausted as e:
            failed = f"{self._endpoint} failed {times(e.attempts)}, last: "
            raise EmbeddingFailed(f"{failed}{e.last}", f"{failed}{e.last.logged}") from e
        if response.status_code >= 400:
            refused = (
                f"{self._endpoint} refused the request for model {self.model} "
                f"(HTTP {response.status_code})"
            )
            raise EmbeddingFailed(
                f"{refused}: {server_message(response)}",
                refused,
                transient=response.status_code >= 500,
            )
        try:
            answer = response.json()
        except (ValueError, RecursionError) as e:  # httpx raises the latter on deep bodies
            raise EmbeddingFailed(
                f"{self._endpoint} answered with invalid JSON", transient=False
            ) from e
        return self._parse(answer, texts)

    def _unexpected(self, error: object) -> EmbeddingFailed:
        return EmbeddingFailed(
            f"{self._endpoint} answered in an unexpected shape ({error!r}); it must be an "
            "OpenAI-compatible embeddings endpoint",
            transient=False,
        )

    def _not_vectors(self, embeddings: list[Any]) -> EmbeddingFailed | None:
        """The first fault of embeddings that are not a vector each (a nested list, a value
        that is not a number, vectors of different lengths), if any: looked for before numpy,
        which reads some values that are not numbers as numbers ("0.5", true) and says its own
        faults as a paragraph on an "inhomogeneous shape"."""
        for number, embedding in enumerate(embeddings):
            fault = vector_fault(embedding)
            if fault is not None:
                return EmbeddingFailed(
                    f"{self.model} returned a vector that is not a list of numbers (embedding "
                    f"{number}: {fault}): it must be an OpenAI-compatible embeddings endpoint "
                    "for this model",
                    transient=False,
                )
        lengths = {len(embedding) for embedding in embeddings}
        if len(lengths) > 1:
            return EmbeddingFailed(
                f"{self.model} returned vectors of different lengths ({min(lengths)} to "
                f"{max(lengths)}), expected {self.dimensions or 'one length'}: it must be "
                "an OpenAI-compatible embeddings endpoint for this model",
                transient=False,
            )
        return None

    def _not_finite(self) -> EmbeddingFailed:
        return EmbeddingFailed(
            f"{self.model} returned a vector holding NaN or infinity (from {self._endpoint});"
            " it must be an OpenAI-compatible embeddings endpoint for this model",
            transient=False,
        )

    def _parse(self, answer: Any, texts: list[str]) -> tuple[np.ndarray, int]:
        count = len(texts)
        try:
            data = sorted(answer["data"], key=lambda item: item["index"])
            embeddings = [item["embedding"] for item in data]
        except (KeyError, TypeError, ValueError) as e:
            raise self._unexpected(e) from e
        if len(embeddings) != count:
            raise EmbeddingFailed(
                f"{self._endpoint} returned {len(embeddings)} embeddings for {count} texts",
                transient=False,
            )
        fault = self._not_vectors(embeddings)
        if fault is not None:
            raise fault
        try:
            with np.errstate(over="ignore"):  # a value past float32's range: inf, refused below
                vectors = np.array(embeddings, dtype=np.float32)
        except OverflowError:  # an integer past a float's range (10**400): no finite value
            raise self._not_finite() from None
        except (TypeError, ValueError) as e:
            raise self._unexpected(e) from None
        if vectors.ndim != 2:  # lists of numbers (or of nothing), of one length: never
            raise self._unexpected(vectors.shape)
        if self.dimensions and vectors.shape[1] != self.dimensions:
            raise EmbeddingFailed(
                f"{self.model} returned {vectors.shape[1]}-d vectors, expected {self.dimensions}: "
                "fix ENGRAM_EMBEDDING_DIMENSIONS, or run `engram reembed` after changing model",
                transient=False,
            )
        if not np.isfinite(vectors).all():
            # PostgreSQL would refuse to store it (pgvector allows no NaN or infinity), nor
            # could it be searched.
            raise self._not_finite()
        pointless = np.flatnonzero(~has_direction(vectors))
        if pointless.size:
            # Stored, its cosine to any query would be NaN: its text found by meaning never.
            raise EmbeddingFailed(
                f"{self.model} returned a vector of zeros (embedding {int(pointless[0])}), which "
                "has no direction: it must be an OpenAI-compatible embeddings endpoint for this "
                "model",
                transient=False,
            )
        usage = answer.get("usage") or {}
        tokens = usage.get("total_tokens") or usage.get("prompt_tokens")
        # (compared, not converted: an int past a float's range, 10**400, is no count either)
        if (
            isinstance(tokens, int | float)
            and not isinstance(tokens, bool)
            and 1 <= tokens < MAX_COUNT
        ):
            return vectors, int(tokens)
        # A server that reports no usage (some OpenAI-compatible ones), or nonsense: estimated
        # at about four characters a token, at least one a text, so that every embedding made
        # is recorded as usage (M24, H11).
        return vectors, sum(max(1, math.ceil(len(t) / CHARS_PER_TOKEN)) for t in texts)

    async def aclose(self) -> None:
        await self._client.aclose()
