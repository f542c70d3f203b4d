"""The per-request context: who is asking, the service's state, and the request's DataLoaders."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import asyncpg
from strawberry.dataloader import DataLoader
from strawberry.fastapi import BaseContext
from strawberry.types import Info as StrawberryInfo

from app.auth.caller import Caller
from app.embeddings.base import Embedder
from app.state import AppState

# Searches of one request run two at a time: each holds a pooled connection while it ranks,
# and aliases ran 50 at once, so that every other request (any tenant's) waited for one.
SEARCHES_AT_ONCE = 2
# Reads of one request's pages run two at a time (a page a resolver reads, or a batch of what
# its resolvers asked for meanwhile): each page is held until its answer is complete, and nine
# aliased pages of agents' 64 KiB instructions, read at once, held 250-450 MB for an answer
# that ENGRAM_MAX_ANSWER_BYTES refused at its first page (bench/README.md, "An answer's bytes").
READS_AT_ONCE = 2

BatchLoad = Callable[[asyncpg.Pool, Caller, list[Any]], Awaitable[list[Any]]]
_BATCHES: dict[str, BatchLoad] = {}


def batch_loader(
    type_name: str,
    find: Callable[[asyncpg.Pool, Caller, list[Any]], Awaitable[Mapping[Any, Any]]],
    make: Callable[[Any], Any],
) -> None:
    """Registers how the objects of a type others point at are read, a batch of keys at a
    time: `find` returns the records at the keys that have one, in one query (`= any($n)`),
    with the grant checks of one read; `make` turns a record into the GraphQL object."""

    async def load(pool: asyncpg.Pool, caller: Caller, keys: list[Any]) -> list[Any]:
        found = await find(pool, caller, keys)
        return [make(found[k]) if k in found else None for k in keys]

    _BATCHES[type_name] = load


def batch_pages(field: str, find: Callable[..., Awaitable[Sequence[Any]]]) -> None:
    """Registers how a nested connection's pages (`Type.field`) are read, a batch at a time:
    `find(pool, caller, pages=keys)` gets the pages this request's resolvers asked for
    meanwhile, each a key naming its parent, `after` keyset and limit; it checks the field's
    grants once and returns, in the keys' order, each page's rows or that page's own error."""

    async def load(pool: asyncpg.Pool, caller: Caller, keys: list[Any]) -> list[Any]:
        return list(await find(pool, caller, pages=keys))

    _BATCHES[field] = load


class Reads:
    """A request's reads of pages: a page a resolver reads itself, or a batch of what its
    resolvers asked its DataLoaders for meanwhile. READS_AT_ONCE run at a time, so that the
    pages read first are answered (or refused) before the others are read; and none starts
    once the answer is refused (app/graphql/field_completion.py), whatever is still running."""

    def __init__(self) -> None:
        self._at_once = asyncio.Semaphore(READS_AT_ONCE)
        self.refusal: Exception | None = None

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[None]:
        async with self._at_once:
            if self.refusal is not None:
                raise self.refusal.with_traceback(None)
            yield


class Context(BaseContext):
    def __init__(self, state: AppState, caller: Caller) -> None:
        super().__init__()
        self.state = state
        self.caller = caller
        self._loaders: dict[str, DataLoader[Any, Any]] = {}
        # A loader's pending futures, each with how many resolvers wait for it (_shared).
        self._waiting: dict[asyncio.Future[Any], int] = {}
        self.searching = asyncio.Semaphore(SEARCHES_AT_ONCE)
        self.reads = Reads()

    @property
    def pool(self) -> asyncpg.Pool:
        return self.state.pool

    @property
    def embedder(self) -> Embedder:
        embedder = self.state.embedder
        assert embedder is not None, "the embedding service starts with the app"
        return embedder

    def load(self, type_name: str, key: Hashable) -> Awaitable[Any]:
        """The object of `type_name` at `key` (None if none), or the page of the connection
        `type_name` names at `key` (batch_pages), read with the others this request's resolvers
        ask for meanwhile, and kept for the rest of the query (or mutation)."""
        loader = self._loaders.get(type_name)
        if loader is None:
            # The pool and caller, not the context: a loader holding its context would make a
            # cycle that only the garbage collector frees, with everything the request loaded.
            loader = DataLoader(
                load_fn=partial(_read, self.reads, _BATCHES[type_name], self.pool, self.caller)
            )
            self._loaders[type_name] = loader
        return self._shared(asyncio.ensure_future(loader.load(key)))  # the loader's own future

    def _shared(self, future: asyncio.Future[Any]) -> Awaitable[Any]:
        """`future`, the one the loader hands every resolver of a key, for one more resolver:
        cancelled (graphql-core cancels a failed field's siblings), it is cancelled for that
        resolver alone, whose fellows' CancelledError escaped GraphQL's errors as a 500; and
        `future` with it once no resolver waits for it, which stops its batch (strawberry's
        DataLoader cancels a batch whose every future is) rather than leave it read on, holding
        a pooled connection, after the request has answered."""
        if future.done():
            return future
        waiting = self._waiting
        waiting[future] = waiting.get(future, 0) + 1
        mine = asyncio.shield(future)

        def left(mine: asyncio.Future[Any]) -> None:
            waiting[future] -= 1
            if waiting[future] == 0:
                del waiting[future]
                if mine.cancelled():
                    future.cancel()

        mine.add_done_callback(left)
        return mine


async def _read(
    reads: Reads, load: BatchLoad, pool: asyncpg.Pool, caller: Caller, keys: list[Any]
) -> list[Any]:
    async with reads():
        return await load(pool, caller, keys)


Info = StrawberryInfo[Context, Any]
