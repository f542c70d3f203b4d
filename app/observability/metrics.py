"""Prometheus metrics, one registry per app (tests build several apps in one process).

The layers record through `current()`, which the request middleware sets for each request
(a turn runs inside its request, so its model calls and searches are counted too); outside a
request it is a recorder that keeps nothing. No label ever names an account or a principal:
operations are the schema's root field names, codes the error codes, purposes and modes fixed
words.

An operation that runs several root fields is labelled with their names joined by commas: a
client choosing its own combinations could make as many label sets as there are subsets of
the schema's root fields (a mutation's 13 alone make 8,191, each with a latency histogram of
20 series). So the first MAX_OPERATION_SETS distinct combinations each get their own label,
and later ones are counted together as `several`; a single root field always has its own.
"""

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.text import MAX_COUNT

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "current", "using"]

# Distinct combinations of several root fields with their own `operation` label (see above).
MAX_OPERATION_SETS = 100
SEVERAL = "several"
# Latency buckets from a millisecond to two minutes (a turn waits on a model).
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


# Each metric: the attribute that records it, its type, name, help text and label names.
_DECLARED: tuple[tuple[str, type, str, str, tuple[str, ...]], ...] = (
    (
        "requests",
        Counter,
        "engram_requests",
        "GraphQL requests by operation (root fields) and outcome code (OK or the error code)",
        ("operation", "code"),
    ),
    (
        "request_seconds",
        Histogram,
        "engram_request_seconds",
        "GraphQL request latency, from the request's arrival to its answer",
        ("operation",),
    ),
    (
        "turns",
        Counter,
        "engram_turns",
        "Agent turns by final status and kind (TURN: executeAction; INGEST: a conversation "
        "handed in, rememberConversation or MCP's remember_conversation)",
        ("status", "kind"),
    ),
    (
        "model_calls",
        Counter,
        "engram_model_calls",
        "Model calls by purpose (turn, memory, context, embed) and outcome (ok, failed)",
        ("purpose", "outcome"),
    ),
    (
        "model_call_seconds",
        Histogram,
        "engram_model_call_seconds",
        "Model call latency by purpose, retries included",
        ("purpose",),
    ),
    (
        "model_tokens",
        Counter,
        "engram_model_tokens",
        "Tokens used by purpose and kind (prompt, completion; input for embeddings)",
        ("purpose", "kind"),
    ),
    (
        "search_seconds",
        Histogram,
        "engram_search_seconds",
        "Memory searches with a query, by mode (hybrid, vector, lexical), with their latency",
        ("mode",),
    ),
    (
        "embedding_seconds",
        Histogram,
        "engram_embedding_seconds",
        "Time spent embedding texts (one call may embed several)",
        (),
    ),
    (
        "pool_connections",
        Gauge,
        "engram_pool_connections",
        "Database pool connections by state (in_use, idle), read when scraped",
        ("state",),
    ),
    ("pool_max", Gauge, "engram_pool_max_connections", "The database pool's maximum size", ()),
    (
        "search_upkeep_rounds",
        Counter,
        "engram_search_upkeep_rounds",
        "Search upkeep rounds of this process by outcome (done, failed, skipped: another "
        "process held the rounds' lock), read when scraped",
        ("outcome",),
    ),
    (
        "search_upkeep_done",
        Gauge,
        "engram_search_upkeep_last_done_timestamp_seconds",
        "When this process's last search upkeep round done finished, in unix time (0: none yet)",
        (),
    ),
)


class Metrics:
    """What one running service counts; `render()` is the text `GET /metrics` answers."""

    requests: Counter
    request_seconds: Histogram
    turns: Counter
    model_calls: Counter
    model_call_seconds: Histogram
    model_tokens: Counter
    search_seconds: Histogram
    embedding_seconds: Histogram
    pool_connections: Gauge
    pool_max: Gauge
    search_upkeep_rounds: Counter
    search_upkeep_done: Gauge

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for attribute, kind, name, doc, labels in _DECLARED:
            extra = {"buckets": _SECONDS} if kind is Histogram else {}
            metric = kind(name, doc, labels, registry=self.registry, **extra)
            setattr(self, attribute, metric)
        self._operation_sets: set[str] = set()
        self._upkeep_rounds: dict[str, int] = {}  # as last read, by outcome

    # --- recording ------------------------------------------------------------------------

    def request(self, operation: str, code: str, seconds: float) -> None:
        if "," in operation and operation not in self._operation_sets:
            if len(self._operation_sets) < MAX_OPERATION_SETS:
                self._operation_sets.add(operation)
            else:
                operation = SEVERAL
        self.requests.labels(operation, code).inc()
        self.request_seconds.labels(operation).observe(seconds)

    def turn(self, status: str, *, kind: str) -> None:
        self.turns.labels(status, kind).inc()

    def model_call(
        self, purpose: str, ok: bool, seconds: float | None, usage: Mapping[str, Any] | None = None
    ) -> None:
        """A model call counted by outcome, and its time unless it was never sent (None)."""
        self.model_calls.labels(purpose, "ok" if ok else "failed").inc()
        if seconds is not None:
            self.model_call_seconds.labels(purpose).observe(seconds)
        for kind in ("prompt", "completion"):
            count = (usage or {}).get(f"{kind}_tokens")
            if isinstance(count, int) and not isinstance(count, bool) and 0 < count < MAX_COUNT:
                self.model_tokens.labels(purpose, kind).inc(count)

    def embedding(self, ok: bool, seconds: float, tokens: int) -> None:
        self.model_calls.labels("embed", "ok" if ok else "failed").inc()
        self.model_call_seconds.labels("embed").observe(seconds)
        self.embedding_seconds.observe(seconds)
        if 0 < tokens < MAX_COUNT:
            self.model_tokens.labels("embed", "input").inc(tokens)

    @contextmanager
    def search(self, mode: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.search_seconds.labels(mode).observe(time.perf_counter() - started)

    def pool(self, in_use: int, idle: int, maximum: int) -> None:
        self.pool_connections.labels("in_use").set(in_use)
        self.pool_connections.labels("idle").set(idle)
        self.pool_max.set(maximum)

    def search_upkeep(self, rounds: Mapping[str, int], last_done: float | None) -> None:
        """The search upkeep's rounds so far by outcome (a few fixed words), and when the last
        one done finished: counted outside any request, read when scraped."""
        for outcome, count in rounds.items():
            seen = self._upkeep_rounds.get(outcome, 0)
            # A tally below the one last read started again (a second lifespan of one app):
            # all of it is new. A counter's increment may not be negative.
            self.search_upkeep_rounds.labels(outcome).inc(count - seen if count >= seen else count)
            self._upkeep_rounds[outcome] = count
        if last_done is not None:
            self.search_upkeep_done.set(last_done)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Discard(Metrics):
    """Keeps nothing: what `current()` is outside a request (scripts, tests of the layers)."""

    def __init__(self) -> None:
        pass

    def request(self, operation: str, code: str, seconds: float) -> None:
        pass

    def turn(self, status: str, *, kind: str) -> None:
        pass

    def model_call(
        self, purpose: str, ok: bool, seconds: float | None, usage: Mapping[str, Any] | None = None
    ) -> None:
        pass

    def embedding(self, ok: bool, seconds: float, tokens: int) -> None:
        pass

    @contextmanager
    def search(self, mode: str) -> Iterator[None]:
        yield

    def pool(self, in_use: int, idle: int, maximum: int) -> None:
        pass

    def search_upkeep(self, rounds: Mapping[str, int], last_done: float | None) -> None:
        pass

    def render(self) -> bytes:
        return b""


_DISCARD = _Discard()
_current: ContextVar[Metrics] = ContextVar("engram_metrics", default=_DISCARD)


def current() -> Metrics:
    """The metrics of the service whose request this code runs in."""
    return _current.get()


@contextmanager
def using(metrics: Metrics) -> Iterator[None]:
    token = _current.set(metrics)
    try:
        yield
    finally:
        _current.reset(token)
