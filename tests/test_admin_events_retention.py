"""Events of administrative changes are kept ENGRAM_ADMIN_EVENTS_RETENTION_DAYS (0: as long as
their account): every process's liveness sweep deletes older ones, oldest first, a bounded
number a sweep in batches of their own statements, and two processes purging at once delete
each event once, neither waiting for the other."""

import asyncio
import logging

import asyncpg
import pytest

from app.auth import events_store
from app.auth.caller import Caller
from app.runtime import liveness
from app.state import AppState

RETENTION = 30
# A heartbeat that does not come during a test: each test sweeps when it means to.
pytestmark = pytest.mark.settings(
    admin_events_retention_days=RETENTION, turn_heartbeat_seconds=3600, turn_lease_seconds=7200
)


async def add_events(conn: asyncpg.Connection, account_id: object, count: int, days: float) -> None:
    """`count` events `days` old in the account."""
    await conn.execute(
        """
        INSERT INTO admin_events (account_id, at, actor, operation, target_kind, target)
        SELECT $1, now() - make_interval(days => $3) - i * interval '1 ms', 'command line',
               'createClient', 'client', 'bot-' || i
        FROM generate_series(1, $2) i
        """,
        account_id,
        count,
        days,
    )


async def ages(conn: asyncpg.Connection) -> list[int]:
    """The events' ages in whole days, those of the test's own (made days ago) alone."""
    rows = await conn.fetch(
        "SELECT extract(day FROM now() - at)::int AS days FROM admin_events"
        " WHERE target LIKE 'bot-%' ORDER BY at"
    )
    return [r["days"] for r in rows]


def sweeper(state: AppState) -> liveness.TurnLiveness:
    found = state.services.get(liveness.TURN_LIVENESS)
    assert found is not None
    return found


async def test_a_sweep_deletes_events_older_than_the_retention_and_keeps_newer(
    state: AppState, admin: Caller, caplog: pytest.LogCaptureFixture
) -> None:
    async with state.pool.acquire() as conn:
        await add_events(conn, admin.account_id, 3, RETENTION + 5)
        await add_events(conn, admin.account_id, 2, RETENTION - 1)
        kept = await conn.fetchval("SELECT count(*) FROM admin_events")
    with caplog.at_level(logging.INFO, logger=liveness.__name__):
        swept = await sweeper(state).sweep()
    assert swept.events_forgotten == 3
    async with state.pool.acquire() as conn:
        assert await ages(conn) == [RETENTION - 1] * 2
        assert await conn.fetchval("SELECT count(*) FROM admin_events") == kept - 3
    said = [r.getMessage() for r in caplog.records if "administrative events" in r.getMessage()]
    assert said == [
        f"deleted 3 administrative events older than {RETENTION} days "
        "(ENGRAM_ADMIN_EVENTS_RETENTION_DAYS)"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=liveness.__name__):
        assert (await sweeper(state).sweep()).events_forgotten == 0
    assert not [r for r in caplog.records if "administrative events" in r.getMessage()]


@pytest.mark.settings(admin_events_retention_days=0)
async def test_a_retention_of_0_keeps_every_event(state: AppState, admin: Caller) -> None:
    async with state.pool.acquire() as conn:
        await add_events(conn, admin.account_id, 3, 36_000)
    assert (await sweeper(state).sweep()).events_forgotten == 0
    async with state.pool.acquire() as conn:
        assert await ages(conn) == [36_000] * 3


async def test_a_purge_goes_batch_by_batch_and_leaves_the_rest_for_the_next(
    state: AppState, admin: Caller
) -> None:
    """Each batch its own statement, committed as it goes; a purge stops after its batches and
    says older events remain, the next goes on; the oldest go first."""
    async with state.pool.acquire() as conn:
        await add_events(conn, admin.account_id, 25, RETENTION + 2)
        await add_events(conn, admin.account_id, 20, RETENTION + 1)
        await add_events(conn, admin.account_id, 5, 1)
        purge = events_store.forget_older_than
        assert await purge(conn, RETENTION, batch=10, batches=2) == (20, True)
        assert await ages(conn) == [RETENTION + 2] * 5 + [RETENTION + 1] * 20 + [1] * 5
        assert await purge(conn, RETENTION, batch=10, batches=2) == (20, True)
        assert await purge(conn, RETENTION, batch=10, batches=2) == (5, False)
        assert await ages(conn) == [1] * 5
        assert await purge(conn, RETENTION, batch=10, batches=2) == (0, False)


async def test_a_sweep_purges_a_backlog_over_several_sweeps(
    state: AppState,
    admin: Caller,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The sweep's purge in batches of 10, two a sweep.
    monkeypatch.setattr(
        events_store.forget_older_than, "__kwdefaults__", {"batch": 10, "batches": 2}
    )
    async with state.pool.acquire() as conn:
        await add_events(conn, admin.account_id, 30, RETENTION + 1)
    with caplog.at_level(logging.INFO, logger=liveness.__name__):
        assert (await sweeper(state).sweep()).events_forgotten == 20
        assert (await sweeper(state).sweep()).events_forgotten == 10
    said = [r.getMessage() for r in caplog.records if "administrative events" in r.getMessage()]
    assert said[0].endswith("; older ones remain, for the next sweeps")
    assert said[1].endswith("(ENGRAM_ADMIN_EVENTS_RETENTION_DAYS)")


async def test_two_purges_at_once_delete_each_event_once_without_waiting(
    state: AppState, admin: Caller
) -> None:
    """Two processes' sweeps purging together: between them every old event goes, each once,
    none waits for the other's locks (a short lock_timeout would fail it), newer ones stay."""
    async with state.pool.acquire() as conn:
        await add_events(conn, admin.account_id, 3_000, RETENTION + 1)
        await add_events(conn, admin.account_id, 7, 1)

    async def purge() -> list[int]:
        counts = []
        async with state.pool.acquire() as conn:
            await conn.execute("SET lock_timeout = '50ms'")
            while True:
                done, more = await events_store.forget_older_than(
                    conn, RETENTION, batch=100, batches=3
                )
                counts.append(done)
                await asyncio.sleep(0)
                if not more:
                    return counts

    first, second = await asyncio.gather(purge(), purge())
    assert sum(first) + sum(second) == 3_000
    async with state.pool.acquire() as conn:
        assert await ages(conn) == [1] * 7


async def test_a_purge_that_fails_leaves_the_rest_of_the_sweep_done(
    state: AppState, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A purge the database refuses (cancelled, or on Citus, docs/scaling.md) is said, and the
    sweep still ends with what it did before it."""

    async def refused(*args: object, **kwargs: object) -> tuple[int, bool]:
        raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")

    monkeypatch.setattr(events_store, "forget_older_than", refused)
    with caplog.at_level(logging.WARNING, logger=liveness.__name__):
        swept = await sweeper(state).sweep()
    assert swept.events_forgotten == 0
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "deleting old administrative events failed (QueryCanceledError (SQLSTATE 57014)); "
        "next in 3600.0 s"
    ]
