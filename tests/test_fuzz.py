"""A fixed-seed sample of bench/fuzz_graphql.py in the suite (issue 11): operations generated
from the schema, as a hostile tenant, over real HTTP; none may answer 5xx or INTERNAL, and
none may read the other tenant's data."""

import os
from collections.abc import AsyncIterator

import pytest
from helpers import database_copy, db_settings
from servers import serving

from app.embeddings.static import StaticEmbedder
from bench.fuzz_graphql import fuzz, set_up

TOKEN = "test-fuzz-admin-token"


@pytest.fixture
async def fuzz_db_url(pg_server, template_db) -> AsyncIterator[str]:
    async with database_copy(pg_server, template_db, f"engram_fuzz_{os.getpid()}") as url:
        yield url


def test_fuzzed_operations_never_fail_internally_nor_cross_tenants(
    fuzz_db_url: str, embedder: StaticEmbedder
) -> None:
    settings = db_settings(
        fuzz_db_url,
        bootstrap_token=TOKEN,
        model_max_retries=0,
        model_base_url="http://127.0.0.1:9/v1",  # nothing listens: turns fail cleanly
    )
    with serving(settings, embedder) as url:
        world = set_up(url, TOKEN)
        report = fuzz(url, world, examples=300, seed_value=11)

    print("\n".join(report.lines()))
    assert report.sent == 300
    assert report.server_errors == 0, report.samples
    assert report.internal == 0, report.samples
    assert report.cross_tenant == 0, report.samples
    # Mostly operations that ran, not rejections: 256 of this seed's 300 alone (274 before a
    # mutation whose answer asks for a page out of range was refused before it ran), 245 once
    # in the suite beside other tests.
    assert sum(report.executed.values()) >= 225
    assert len(report.executed) >= 12  # across the root fields
