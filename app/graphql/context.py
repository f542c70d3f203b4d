"""The per-request context: who is asking, the service's state, and the request's DataLoaders."""

from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any

import asyncpg
from strawberry.dataloader import DataLoader
from strawberry.fastapi import BaseContext
from strawberry.types import Info as StrawberryInfo

from app.auth.caller import Caller
from app.state import AppState

# (pool, caller, keys) -> the objects at the keys, None where there is none.
BatchLoad = Callable[[asyncpg.Pool, Caller, list[Any]], Awaitable[list[Any]]]
_BATCHES: dict[str, BatchLoad] = {}


def batch_loader(type_name: str) -> Callable[[BatchLoad], BatchLoad]:
    """Registers how the objects of a type others point at are read by key, a batch at a time
    (one query with `= any($n)`), so that a page's fields pointing at them cost one query."""

    def register(load: BatchLoad) -> BatchLoad:
        _BATCHES[type_name] = load
        return load

    return register


class Context(BaseContext):
    def __init__(self, state: AppState, caller: Caller) -> None:
        super().__init__()
        self.state = state
        self.caller = caller
        self._loaders: dict[str, DataLoader[Any, Any]] = {}

    @property
    def pool(self) -> asyncpg.Pool:
        return self.state.pool

    def load(self, type_name: str, key: Hashable) -> Awaitable[Any]:
        """The object of `type_name` at `key` (None if none), read with the others this
        request's resolvers ask for meanwhile, and kept for the rest of the request."""
        loader = self._loaders.get(type_name)
        if loader is None:
            # The pool and caller, not the context: a loader holding its context would make a
            # cycle that only the garbage collector frees, with everything the request loaded.
            loader = DataLoader(load_fn=partial(_BATCHES[type_name], self.pool, self.caller))
            self._loaders[type_name] = loader
        return loader.load(key)


Info = StrawberryInfo[Context, Any]
