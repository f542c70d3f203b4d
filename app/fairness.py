"""Fairness between accounts in one process: what one account's work may hold at once.

Each bound is per account and per process (several processes each apply their own):

- requests in progress (GraphQL and MCP, counted once authenticated): beyond the bound a
  request waits up to `ENGRAM_ACCOUNT_QUEUE_SECONDS`, the first as many as the bound in line
  for the places that free, and is then refused (TooManyRequests: 429 with Retry-After);
- turns in progress (executeAction, and a conversation handed in for review): a turn waits on
  its model for seconds to minutes, so it gives its request's place back to the account's other
  requests and holds a turn's place instead, waiting and refused the same way;
- pooled connections held at once by all of the account's requests and turns (app/db/pool.py
  `drawing_on`, `Connections`): beyond it they wait for one of the account's own to be
  released; an account already holding some leaves one connection of the pool free for an
  account holding none, and a connection given back goes to the account waiting that holds the
  fewest.
"""

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from uuid import UUID

from app.config import Settings
from app.db.pool import Share, drawing_on
from app.errors import TooManyRequests

# What a refusal's Retry-After says: a place frees as soon as one of the account's requests
# ends, and a request waits in the queue meanwhile anyway.
RETRY_AFTER_SECONDS = 1


class Slots:
    """At most `limit` holders at once; beyond, at most `queue` wait in line (None: any number),
    each for at most `wait` seconds (None: as long as it takes), served in arrival order."""

    def __init__(self, limit: int, queue: int | None = None, wait: float | None = None) -> None:
        self.limit, self.queue, self.wait = limit, queue, wait
        self.held = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._beyond = 0  # waiting beyond the line

    @property
    def idle(self) -> bool:
        return self.held == 0 and not self._waiting and not self._beyond

    async def acquire(self) -> bool:
        """Whether a place was taken (False: the queue was full, or the wait ran out)."""
        if self.held < self.limit and not self._waiting:
            self.held += 1
            return True
        if self.queue is not None and len(self._waiting) >= self.queue:
            # No place in the queue: answered after the same wait all the same (taking a place
            # free by then), so that a client sending again at once is slowed to one refusal a
            # wait, which costs nothing meanwhile, rather than kept busy refusing it.
            if self.wait:
                self._beyond += 1
                try:
                    await asyncio.sleep(self.wait)
                finally:
                    self._beyond -= 1
            if self.held < self.limit and not self._waiting:
                self.held += 1
                return True
            return False
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            async with asyncio.timeout(self.wait):
                await turn
        except TimeoutError:
            self._give_up(turn)
            return False
        except BaseException:
            self._give_up(turn)
            raise
        return True

    def _give_up(self, turn: asyncio.Future[None]) -> None:
        if turn.done() and not turn.cancelled():
            self.release()  # handed a place just as it gave up: the next one takes it
        else:
            turn.cancel()
            if turn in self._waiting:  # a release may have passed over it already
                self._waiting.remove(turn)

    def release(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)  # the place passes on: `held` stays
                return
        self.held -= 1


class PerAccount:
    """`Slots` of the same bounds for each account, forgotten while an account holds none."""

    def __init__(self, limit: int, queue: int | None = None, wait: float | None = None) -> None:
        self.limit, self.queue, self.wait = limit, queue, wait
        self._slots: dict[UUID, Slots] = {}

    def held(self, account_id: UUID) -> int:
        slots = self._slots.get(account_id)
        return slots.held if slots is not None else 0

    async def take(self, account_id: UUID) -> bool:
        slots = self._slots.get(account_id)
        if slots is None:
            slots = self._slots[account_id] = Slots(self.limit, self.queue, self.wait)
        try:
            return await slots.acquire()
        finally:
            if slots.idle:  # e.g. cancelled waiting beyond the line of an account holding none
                self._slots.pop(account_id, None)

    def give_back(self, account_id: UUID) -> None:
        slots = self._slots[account_id]
        slots.release()
        if slots.idle:
            del self._slots[account_id]


class Fairness:
    """The process's bounds, from the settings (each `ENGRAM_MAX_*_PER_ACCOUNT`)."""

    def __init__(self, settings: Settings) -> None:
        wait = settings.account_queue_seconds
        requests, turns = settings.requests_per_account(), settings.turns_per_account()
        self.requests = PerAccount(requests, queue=requests if wait else 0, wait=wait)
        self.turns = PerAccount(turns, queue=turns if wait else 0, wait=wait)
        self.connection_share = settings.connections_per_account()

    async def admit(self, account_id: UUID) -> "Admission":
        """A place for one of the account's requests, or TooManyRequests."""
        if not await self.requests.take(account_id):
            raise TooManyRequests(_too_many(self.requests.limit))
        return Admission(self, account_id)


def _too_many(limit: int) -> str:
    return (
        f"this account already has {limit} requests in progress here, and more waiting: retry "
        f"in {RETRY_AFTER_SECONDS} s, or send fewer at once"
    )


_admitted: ContextVar["Admission | None"] = ContextVar("engram_admission", default=None)


class Admission:
    """A request's place among its account's; `running()` holds it while the request runs."""

    def __init__(self, fairness: Fairness, account_id: UUID) -> None:
        self.fairness, self.account_id = fairness, account_id
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.fairness.requests.give_back(self.account_id)

    async def again(self) -> None:
        """The place taken again when a turn gave it back (`turn`), before more of the
        request's work: an MCP batch's next message, which would otherwise run holding no place
        (any number of batches at once, each past its first remember_conversation). Waits and
        is refused as a new request is (TooManyRequests)."""
        if self._held:
            return
        if not await self.fairness.requests.take(self.account_id):
            raise TooManyRequests(_too_many(self.fairness.requests.limit))
        self._held = True

    @contextmanager
    def running(self) -> Iterator[None]:
        """The request's work, its connections drawn on its account's share; the place is given
        back when it ends, however it ends (an error, a cancellation, a client gone)."""
        token = _admitted.set(self)
        try:
            with drawing_on(Share(self.account_id, self.fairness.connection_share)):
                yield
        finally:
            _admitted.reset(token)
            self.release()


@asynccontextmanager
async def turn() -> AsyncIterator[None]:
    """Model work (a turn, a conversation's review) of the request running: its request's
    place goes back to its account's other requests, and it holds a turn's place instead, or
    raises TooManyRequests. Outside a request (the `engram` command, a test's direct call),
    nothing is bounded."""
    admission = _admitted.get()
    if admission is None:
        yield
        return
    admission.release()
    turns = admission.fairness.turns
    if not await turns.take(admission.account_id):
        raise TooManyRequests(
            f"this account already has {turns.limit} turn{'s' if turns.limit != 1 else ''} in "
            "progress here, and more waiting: "
            f"retry in {RETRY_AFTER_SECONDS} s, or run fewer at once"
        )
    try:
        yield
    finally:
        turns.give_back(admission.account_id)
