"""/healthz's own connection (app/db/health.py): a database that does not answer is reported
within the check's timeout, and a connection the server dropped is replaced at once."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import end_other_backends

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
        # Every other backend of this database: the check's kept connection among them.
        ended = await end_other_backends(db_url)
    assert ended >= 1
    assert await health.answers()  # not a 503 for the server's restart, already over
    await health.close()
    assert await health.answers()  # opened again after a close
    await health.close()


async def pipe(
    source: asyncio.StreamReader, to: asyncio.StreamWriter, hold: float = 0, hang_up: float = 0
) -> None:
    """Passes what `source` sends to `to`, its first data `hold` seconds late and its end
    `hang_up` seconds late."""
    try:
        while data := await source.read(65536):
            await asyncio.sleep(hold)
            hold = 0
            to.write(data)
            await to.drain()
        await asyncio.sleep(hang_up)
    except OSError:
        pass
    finally:
        to.close()


@asynccontextmanager
async def proxied(db_url: str, hold: float = 0, hang_up: float = 0) -> AsyncIterator[str]:
    """A URL of the test database behind a loopback proxy: what the client sends passes at
    once, what the server sends as `pipe` passes it."""
    socket = next(Path(parse_qs(urlsplit(db_url).query)["host"][0]).glob(".s.PGSQL.*"))

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_unix_connection(socket)
        await asyncio.gather(
            pipe(reader, server_writer), pipe(server_reader, writer, hold, hang_up)
        )

    proxy = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    yield f"postgresql://{urlsplit(db_url).username}@127.0.0.1:{port}{urlsplit(db_url).path}"
    proxy.close()


@pytest.fixture
async def slow_to_let_in(db_url: str) -> AsyncIterator[str]:
    """A URL of the test database behind a proxy that holds each connection's first answer
    from the server back SLOW_START seconds (a server far away, or busy starting backends);
    what follows passes at once."""
    async with proxied(db_url, hold=SLOW_START) as url:
        yield url


SLOW_START = 1.0


async def test_a_server_slower_to_let_in_than_the_timeout_is_seen_answering(
    slow_to_let_in: str,
) -> None:
    """Opening the check's connection goes on past a check's timeout: the checks after it use
    it, rather than each opening another and giving it up (503 for good)."""
    health = Health(slow_to_let_in, timeout=0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await health.answers()  # no answer within the timeout...
    assert loop.time() - started < 0.5 + 0.3
    await asyncio.sleep(SLOW_START)
    assert await health.answers()  # ...but the database answers, and says so from then on
    assert await health.answers()
    await health.close()


@pytest.fixture
async def slow_to_hang_up(db_url: str) -> AsyncIterator[str]:
    """A URL of the test database behind a proxy that passes everything at once, but passes
    the server's hanging up (its end of the connection) only HANG_UP seconds later: the
    server's last words (a FATAL) are read well before the connection is seen closed, as a
    busy process or a slow network may read them."""

    async with proxied(db_url, hang_up=HANG_UP) as url:
        yield url


HANG_UP = 1.0


async def test_a_connection_ended_and_not_yet_seen_closed_is_replaced_by_the_next_check(
    slow_to_hang_up: str, db_url: str
) -> None:
    """The check's connection is ended by the server (pg_terminate_backend: an operator, an
    idle-session bound, a restart) and its FATAL read, but not yet its hanging up: asyncpg then
    refuses the next statement with an error of its own (InternalClientError, "cannot switch
    to state"). The check opens another connection and reports the database answering, not a
    503 for a database that is up."""
    health = Health(slow_to_hang_up)
    assert await health.answers()
    assert await end_other_backends(db_url) == 1
    await asyncio.sleep(HANG_UP / 4)  # the FATAL read, the hanging up not yet
    assert await health.answers()
    await health.close()
