"""A fixed-seed sample of bench/fuzz_model.py in the suite: turns, replays, retries and handed-in
conversations of two tenants' agents whose model is hostile (replies broken at the transport
and the envelope, hostile tool calls, hostile memory reviews and summaries), over real HTTP.
None may answer 5xx or INTERNAL, log an error, hang, show tenant A tenant B's data, or break an
invariant of memory, history and transcripts; and each of those counters fires on a fault
injected once (the canaries)."""

import logging
import os
from collections.abc import AsyncIterator

import pytest
from helpers import database_copy, db_settings
from servers import serving

from app.embeddings.static import StaticEmbedder
from bench.fuzz_model import Database, Log, Model, canaries, fuzz, set_up

TOKEN = "test-fuzz-model-admin-token"


@pytest.fixture
async def fuzz_db_url(pg_server, template_db) -> AsyncIterator[str]:
    async with database_copy(pg_server, template_db, f"engram_fuzz_model_{os.getpid()}") as url:
        yield url


def test_a_hostile_model_never_fails_the_service_internally_nor_breaks_its_invariants(
    fuzz_db_url: str, embedder: StaticEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    model = Model(11)
    settings = db_settings(
        fuzz_db_url,
        bootstrap_token=TOKEN,
        model_base_url=model.url,
        model_timeout_seconds=model.timeout,
        model_max_retries=1,
        max_model_calls_per_turn=6,
        model_max_reply_bytes=1_000_000,
        turn_timeout_seconds=120,
        memory_review_floor=0.2,
    )
    db = Database(fuzz_db_url)
    try:
        with serving(settings, embedder) as url:
            world = set_up(url, TOKEN)
            with caplog.at_level(logging.ERROR):
                report = fuzz(url, world, model, 80, 11, Log(None), db, timeout=60)
            fired = canaries(world, db)
    finally:
        db.close()
        model.close()

    print("\n".join(report.lines()))
    assert report.server_errors == 0, report.samples
    assert report.internal == 0, report.samples
    assert report.hangs == 0, report.samples
    assert report.cross_tenant == 0, report.samples
    assert report.breaches == 0, report.samples
    assert report.reads_refused == 0, report.samples
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # Turns that ran to their end both ways, reviews and faults of every layer among them.
    assert report.statuses["turn SUCCEEDED"] >= 15 and report.statuses["turn FAILED"] >= 10
    kinds = model.served.kinds
    for layer in ("fault: ", "envelope: ", "turn: ", "review: ", "decide: "):
        assert sum(n for k, n in kinds.items() if k.startswith(layer)) >= 3, (layer, kinds)
    assert report.checks["failed leaves nothing"] >= 100 and report.checks["reads"] >= 50
    assert fired and all(fired.values()), fired
