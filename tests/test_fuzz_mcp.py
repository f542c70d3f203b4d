"""A fixed-seed sample of bench/fuzz_mcp.py in the suite: generated JSON-RPC to the MCP endpoint
over real HTTP, as two hostile tenants; none may answer 5xx or an internal error, log an
error, hang, or read the other tenant's data."""

import logging
import os
from collections.abc import AsyncIterator

import pytest
from helpers import database_copy, db_settings
from servers import serving

from app.embeddings.static import StaticEmbedder
from bench.fuzz_mcp import Log, Model, fuzz, set_up

TOKEN = "test-fuzz-mcp-admin-token"


@pytest.fixture
async def fuzz_db_url(pg_server, template_db) -> AsyncIterator[str]:
    async with database_copy(pg_server, template_db, f"engram_fuzz_mcp_{os.getpid()}") as url:
        yield url


def test_fuzzed_mcp_requests_never_fail_internally_nor_cross_tenants(
    fuzz_db_url: str, embedder: StaticEmbedder, caplog
) -> None:
    model = Model(11)  # the memory review's, for remember_conversation
    settings = db_settings(
        fuzz_db_url, bootstrap_token=TOKEN, model_max_retries=0, model_base_url=model.url
    )
    try:
        with serving(settings, embedder) as url:
            world = set_up(url, TOKEN)
            model.hostile = True
            with caplog.at_level(logging.ERROR):
                report = fuzz(url, world, operations=400, seed_value=11, log=Log(None))
    finally:
        model.close()

    print("\n".join(report.lines()))
    assert report.sent >= 380  # all but what httpx would not send
    assert report.server_errors == 0, report.samples
    assert report.internal == 0, report.samples
    assert report.hangs == 0, report.samples
    assert report.cross_tenant == 0, report.samples
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # Tool calls answered (a result or its refusal) of every tool, not only refused requests.
    assert sum(report.tool_calls.values()) >= 120
    tools = ("search_memory", "add_memory", "read_memory", "delete_memory", "search_history")
    assert {f'"{t}"' for t in (*tools, "remember_conversation")} <= set(report.tool_calls)
