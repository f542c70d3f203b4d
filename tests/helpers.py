"""Helpers shared by the tests: in-process GraphQL, callers with given policies."""

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg

from app.auth import store
from app.auth.caller import Caller
from app.auth.policies import parse_policies
from app.config import Settings
from app.db.embedded import EmbeddedPostgres
from app.graphql.context import Context
from app.graphql.schema import schema
from app.state import AppState


@dataclass
class Result:
    data: dict[str, Any] | None
    errors: list[dict[str, Any]]

    @property
    def codes(self) -> list[str]:
        return [e["extensions"]["code"] for e in self.errors]

    def ok(self) -> dict[str, Any]:
        assert not self.errors, self.errors
        assert self.data is not None
        return self.data


class GQL:
    """Runs GraphQL operations in process, as a given caller."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    async def __call__(self, caller: Caller, query: str, **variables: Any) -> Result:
        result = await schema.execute(
            query, variable_values=variables, context_value=Context(self.state, caller)
        )
        errors = [e.formatted for e in result.errors or []]
        return Result(
            json.loads(json.dumps(result.data, default=str)) if result.data else None, errors
        )


async def make_account(state: AppState, name: str = "tenant") -> UUID:
    async with state.pool.acquire() as conn:
        row = await store.insert_account(conn, uuid.uuid4(), name)
    return row["account_id"]


def caller(account_id: UUID, *policies: dict[str, Any], principal: str = "someone") -> Caller:
    """A client of `account_id` holding exactly `policies`."""
    return Caller(account_id, principal, parse_policies(policies))


def allow(actions: list[str], *resources: str) -> dict[str, Any]:
    return {"effect": "ALLOW", "actions": actions, "resources": list(resources)}


def deny(actions: list[str], *resources: str) -> dict[str, Any]:
    return {"effect": "DENY", "actions": actions, "resources": list(resources)}


@asynccontextmanager
async def database_copy(server: EmbeddedPostgres, template: str, name: str) -> AsyncIterator[str]:
    """A database copied from `template`, dropped on exit; yields its URL."""
    conn = await asyncpg.connect(server.uri())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await conn.close()
    try:
        yield server.uri(name)
    finally:
        conn = await asyncpg.connect(server.uri())
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


def db_settings(db_url: str, **values: Any) -> Settings:
    """A test's settings: its own database, and no background search maintenance (tests that
    need a round run it themselves)."""
    return Settings(database_url=db_url, environment="test", search_maintenance_seconds=0, **values)
