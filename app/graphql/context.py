"""The per-request context: who is asking, and the service's state."""

from typing import Any

import asyncpg
from strawberry.fastapi import BaseContext
from strawberry.types import Info as StrawberryInfo

from app.auth.caller import Caller
from app.state import AppState


class Context(BaseContext):
    def __init__(self, state: AppState, caller: Caller) -> None:
        super().__init__()
        self.state = state
        self.caller = caller

    @property
    def pool(self) -> asyncpg.Pool:
        return self.state.pool


Info = StrawberryInfo[Context, Any]
