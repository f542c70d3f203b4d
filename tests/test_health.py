"""/healthz's own connection (app/db/health.py): a database that does not answer is reported
within the check's timeout, and a connection the server dropped is replaced at once."""

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.db.health import Health


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A port on loopback that accepts connections and never says a word, as a hung server."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()


async def test_a_database_that_does_not_answer_is_unavailable_within_the_timeout(
    silent_port: int,
) -> None:
    health = Health(f"postgresql://engram@127.0.0.1:{silent_port}/engram", timeout=0.3)
    checks = await asyncio.wait_for(asyncio.gather(health.answers(), health.answers()), 10)
    assert checks == [False, False]  # the second waited for the first within its own timeout
    await health.close()


async def test_a_connection_the_server_dropped_is_replaced_by_the_next_check(db_url: str) -> None:
    health = Health(db_url)
    assert await health.answers()
    async with asyncio.timeout(10):
        conn = await asyncpg.connect(db_url)
        try:
            # Every other backend of this database: the check's kept connection among them.
            ended = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity, pg_terminate_backend(pid)"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await conn.close()
    assert ended >= 1
    assert await health.answers()  # not a 503 for the server's restart, already over
    await health.close()
    assert await health.answers()  # opened again after a close
    await health.close()
