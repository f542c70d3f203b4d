"""Turns of a dead process end promptly, whatever process notices.

Every service process has a boot ID and a row in `service_processes` whose heartbeat it
refreshes every `turn_heartbeat_seconds`; a turn it runs carries that boot ID
(`executions.boot_id`). At start and then at each heartbeat, every process sweeps, in every
account (`sweep`):

- the RUNNING turns of a process whose heartbeat is older than `turn_lease_seconds` (killed,
  or its host gone) become FAILED, and can be retried at once; so do this process's own
  RUNNING turns that it no longer runs (their end could not be recorded, e.g. the database
  was unreachable when they failed);
- the memory rows staged by turn attempts that no longer run, and by operator writes
  (`addAgentMemory`) whose process died between staging and committing, are deleted;
- idempotency keys older than a day are forgotten, and so are processes long dead;
- events of administrative changes older than ENGRAM_ADMIN_EVENTS_RETENTION_DAYS are deleted,
  a bounded number a sweep (events_store.forget_older_than), so that a backlog (the first sweep
  after the setting was lowered) goes over several sweeps, each a fraction of a second longer.

A turn shows its own sign of life too (`executions.modified`): after each model call, and
from its process whenever it has been silent for a while (`running`); turns written without a
boot ID, and the turns a new turn of the same agent finds, are judged by it
(`stale_after_seconds`).

Several processes may share one database: each statement changes a row only while it still
qualifies (a turn only while RUNNING), so two sweeps never both act on one row, and a turn
that committed meanwhile is left alone. A turn's own end is conditional too
(store.finish_execution): a turn failed by a sweep while it ran stops at its next model call
and keeps nothing.
"""

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from app import tasks
from app.auth import events_store
from app.config import Settings
from app.db.errors import described, is_unavailable
from app.db.pool import lift_bounds
from app.executions import liveness_store, store
from app.executions.service import Execution
from app.http_retry import MAX_BACKOFF_SECONDS, MAX_RETRY_AFTER_SECONDS
from app.idempotency import store as idempotency_store
from app.idempotency.keys import KEEP_SECONDS
from app.state import AppState, ServiceKey

log = logging.getLogger(__name__)


def stale_after_seconds(settings: Settings) -> float:
    """How long a turn may show no sign of life (`executions.modified`) before it is judged
    dead when no process lease can say (written without a boot ID, `fail_dead_turns`; a new
    turn of its agent, `fail_stale_turns`, which judges every turn so). It counts, for each
    model call a turn may make, its worst: every attempt taking its whole timeout (which bounds
    the whole reply, app/http_retry.py), the longest wait before each retry; with ten minutes
    to spare.

    A live turn never stays silent that long, by construction: while an execution runs, its
    process gives it a sign of life whenever it has been silent for `pulse_seconds`
    (`running`), so no silence lasts much past half the bound, whatever the turn waits for.
    Every model call is followed by a sign of life as well (keep_alive, or the commit;
    tests/test_turn_liveness.py holds the runtime to both). The bound does not count the rest
    of a turn's work instead: its tool calls (up to ENGRAM_MAX_TOOL_CALLS_PER_REPLY a reply,
    each of which may embed), the review's embeddings (one or two for each of up to 20
    candidates), the batches that embed the history a turn keeps, have counts that follow the
    conversation and durations that follow other settings (the embedder's, the database's): a
    bound that counted them at their worst would run to days, and a dead turn would wait that
    long to be retried.

    Not capped near ENGRAM_TURN_TIMEOUT_SECONDS, though no turn of this release runs longer
    than its deadline and its commit: the turns judged by it alone (no boot ID) are those of
    releases before boot IDs, which had no deadline; the judge applies its own settings to
    other processes' turns, and a deadline may be set anywhere up to a day, so a process with a
    short one would fail the live turns of one with a long one; and a live turn is kept
    from it by its pulse anyway, while a dead one with a boot ID is failed by its process's
    lease (ENGRAM_TURN_LEASE_SECONDS) long before."""
    s = settings
    wait = max(MAX_RETRY_AFTER_SECONDS, MAX_BACKOFF_SECONDS)
    per_call = s.model_timeout_seconds * (s.model_max_retries + 1) + wait * s.model_max_retries
    return s.max_model_calls_per_turn * per_call + 600


def pulse_seconds(settings: Settings) -> float:
    """How long a running execution may be silent before its process gives it a sign of life
    (`running`): a quarter of the bound, so a silence ends by about half of it (the pulse looks
    every quarter), and a turn whose own model calls keep it alive costs no write."""
    return stale_after_seconds(settings) / 4


@contextlib.asynccontextmanager
async def running(state: AppState, execution: Execution) -> AsyncIterator[None]:
    """While an execution (a turn, an MCP call, an ingest) runs in this process: the process
    counts it as its own (its lease speaks for it), and gives it a sign of life every
    `pulse_seconds` it has shown none, until it ends."""
    process = state.services.get(TURN_LIVENESS)
    every = pulse_seconds(state.settings)
    pulse = asyncio.create_task(_pulse(state.pool, execution, every), name="engram turn pulse")
    try:
        with process.running(execution.execution_id) if process else contextlib.nullcontext():
            yield
    finally:
        pulse.cancel()
        # Not `tasks.stop`, which drops a cancellation of this task that comes while it waits
        # (the pulse may be giving its connection back): the execution's cancellation is its own.
        await asyncio.wait([pulse])


async def _pulse(pool: asyncpg.Pool, e: Execution, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            async with pool.acquire() as conn:
                await store.touch_silent_execution(
                    conn, e.account_id, e.action_id, e.execution_id, e.invocation_number, every
                )
        except Exception as error:
            # The database may be down or restarting: the next look tries again.
            log.warning(
                "could not keep execution %s alive (%s); next in %s s",
                e.execution_id,
                described(error),
                every,
            )


@dataclass(frozen=True)
class Swept:
    failed: list[UUID]  # execution IDs
    staged_dropped: int
    keys_forgotten: int
    events_forgotten: int = 0


class TurnLiveness:
    """One per process (AppState.services[TURN_LIVENESS]): its boot ID, its running turns, its
    sweep."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.boot_id = uuid.uuid4()
        self.heartbeat_seconds = settings.turn_heartbeat_seconds
        self.lease_seconds = settings.turn_lease_seconds
        self.legacy_seconds = stale_after_seconds(settings)
        self.events_retention_days = settings.admin_events_retention_days
        self._running: set[UUID] = set()
        self._host = socket.gethostname()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Registers the process and sweeps once (ending what a killed predecessor left, once
        its lease has run out), then sweeps at every heartbeat."""
        await self.sweep(starting=True)
        self._task = asyncio.create_task(self._loop(), name="engram turn liveness")

    @contextlib.contextmanager
    def running(self, execution_id: UUID) -> Iterator[None]:
        """Marks a turn as run by this process until it has ended (or could not record it)."""
        self._running.add(execution_id)
        try:
            yield
        finally:
            self._running.discard(execution_id)

    async def sweep(self, *, starting: bool = False) -> Swept:
        """`starting`: the start's, which waits past the pool's bounds (app/db/pool.py
        `bounds`) for what holds the rows it changes, as the start's check of the embedding
        model does: it is no request (`engram maintain-search --reorder` holds agent_memories
        for minutes, and the start would otherwise fail at the bound)."""
        async with self.pool.acquire() as conn:
            if starting:
                await lift_bounds(conn)
            await liveness_store.beat(
                conn, self.boot_id, self._host, os.getpid(), self.lease_seconds
            )
            failed = await liveness_store.fail_dead_turns(
                conn,
                boot_id=self.boot_id,
                live=list(self._running),
                lease_seconds=self.lease_seconds,
                # A turn registers as running just after its start commits.
                grace_seconds=self.heartbeat_seconds,
                legacy_seconds=self.legacy_seconds,
            )
            # After the failures above, so the staged rows of the turns just failed go too.
            dropped = await liveness_store.drop_orphaned_staged(conn, self.lease_seconds)
            forgotten = await idempotency_store.forget_older_than(conn, KEEP_SECONDS)
            await liveness_store.forget_dead_processes(conn, self.lease_seconds)
            events, more = 0, False
            if self.events_retention_days:
                try:
                    events, more = await events_store.forget_older_than(
                        conn, self.events_retention_days
                    )
                except asyncpg.PostgresError as e:
                    # The turns failed above are still said below; the next sweep tries again.
                    log.warning(
                        "deleting old administrative events failed (%s); next in %s s",
                        described(e),
                        self.heartbeat_seconds,
                    )
        if failed:
            log.warning(
                "failed %d turns no process runs any more: %s",
                len(failed),
                ", ".join(str(r["execution_id"]) for r in failed),
            )
        if dropped:
            log.info("dropped %d staged memory rows that could never commit", dropped)
        if events:
            log.info(
                "deleted %d administrative events older than %d days "
                "(ENGRAM_ADMIN_EVENTS_RETENTION_DAYS)%s",
                events,
                self.events_retention_days,
                "; older ones remain, for the next sweeps" if more else "",
            )
        return Swept([r["execution_id"] for r in failed], dropped, forgotten, events)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await self.sweep()
            except Exception as e:
                # The database may be down or restarting: the next heartbeat tries again. Any
                # other failure is a fault to find: its traceback.
                if is_unavailable(e):
                    log.warning(
                        "turn liveness sweep failed (%s); next in %s s",
                        described(e),
                        self.heartbeat_seconds,
                    )
                else:
                    log.exception(
                        "turn liveness sweep failed; next in %s s", self.heartbeat_seconds
                    )

    async def aclose(self) -> None:
        await tasks.stop(self._task)
        self._task = None
        # A clean stop: turns still marked running here are ended by the next sweep anywhere.
        with contextlib.suppress(Exception):
            async with self.pool.acquire() as conn:
                await liveness_store.remove_process(conn, self.boot_id)


TURN_LIVENESS: ServiceKey[TurnLiveness] = ServiceKey("turn_liveness")
