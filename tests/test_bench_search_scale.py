"""bench/search_scale.py's online writes by several writers at once (`online_insert_rate`),
on a tiny data set: the setup they share is committed, so it must be removed after them
however they end."""

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import search_scale  # noqa: E402

from app.db import hnsw  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import maintenance  # noqa: E402

CONVERSATION = {
    "conversation": {
        "session_1": [
            {"speaker": "Ada", "text": f"line {k} about engines and numbers"} for k in range(20)
        ]
    }
}


async def left_behind(url: str, account: uuid.UUID) -> tuple[int, int, int]:
    """The account's agents, its records, and the agents' own indexes (of any account: the
    test's database has none of its own)."""
    conn = await asyncpg.connect(url)
    try:
        agents = await conn.fetchval("SELECT count(*) FROM actions WHERE account_id = $1", account)
        records = await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE account_id = $1", account
        )
        # An agent's own indexes: their prefixes, before the digest of its key.
        prefixes = [name[:-32] for name in maintenance.index_names(account, uuid.UUID(int=0))]
        indexes = await conn.fetchval(
            "SELECT count(*) FROM pg_indexes WHERE indexname LIKE ANY ($1)",
            [f"{prefix}%" for prefix in prefixes],
        )
        return agents, records, indexes
    finally:
        await conn.close()


@pytest.fixture
async def plan(db_url: str, monkeypatch: pytest.MonkeyPatch) -> search_scale.Plan:
    monkeypatch.setattr(search_scale, "SAMPLES", [CONVERSATION])
    plan = search_scale.Plan(0.001)
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "INSERT INTO accounts (account_id, name) VALUES ($1, 'bench')", plan.accounts[0]
        )
    finally:
        await conn.close()
    return plan


async def test_two_writers_leave_nothing_behind(
    db_url: str, plan: search_scale.Plan, embedder: StaticEmbedder
) -> None:
    rate = await asyncio.wait_for(
        search_scale.online_insert_rate(
            db_url, plan, embedder, 1000, hnsw.INSERT_EF_CONSTRUCTION, 100, writers=2
        ),
        60,
    )
    assert rate > 0
    assert await left_behind(db_url, plan.accounts[0]) == (0, 0, 0)


class Failed(Exception):
    """A writer's own failure, outside the database (its embedder's, say)."""


@pytest.mark.parametrize("failing", [0, 1])
@pytest.mark.parametrize("how", ["statement", "client"])
async def test_a_writer_that_fails_midway_leaves_nothing_behind(
    db_url: str,
    plan: search_scale.Plan,
    embedder: StaticEmbedder,
    monkeypatch: pytest.MonkeyPatch,
    failing: int,
    how: str,
) -> None:
    """A writer fails at its second batch, once the other wrote all of its own and holds its
    transaction open: by a statement of its own (its transaction aborted, its locks let go), or
    outside the database (its transaction left open, holding agent_memories). The run raises
    that error, and the setup they shared goes: the clean-up neither waits forever on another
    writer's lock (DROP INDEX), nor fails in the first writer's aborted transaction (it set
    up), nor runs in its open one, to be rolled back with it."""
    made: list[asyncpg.Connection] = []
    done: dict[int, int] = {0: 0, 1: 0}
    # Writer 0 sets up too: the base's one batch (100 records), then its two of 500.
    batches = {0: 3, 1: 2}

    class Faulty(asyncpg.Connection):
        async def copy_records_to_table(self, *args: Any, **kwargs: Any) -> Any:
            k = made.index(self)
            if k == failing and done[k] == batches[k] - 1:
                while done[1 - k] < batches[1 - k]:
                    await asyncio.sleep(0.01)
                if how == "client":
                    raise Failed
                await self.execute("SELECT 1 / 0")
            result = await super().copy_records_to_table(*args, **kwargs)
            done[k] += 1
            return result

    connect = asyncpg.connect

    async def faulty(*args: Any, **kwargs: Any) -> asyncpg.Connection:
        conn = await connect(*args, connection_class=Faulty, **kwargs)
        made.append(conn)
        return conn

    monkeypatch.setattr(search_scale, "copy_connection", _copy_connection_with(faulty))
    try:
        with pytest.raises(Failed if how == "client" else asyncpg.DivisionByZeroError):
            await asyncio.wait_for(
                search_scale.online_insert_rate(
                    db_url, plan, embedder, 2000, hnsw.INSERT_EF_CONSTRUCTION, 100, 2
                ),
                20,
            )
    finally:
        for conn in made:
            conn.terminate()  # what a run that hung left open
    assert done == {k: batches[k] - (k == failing) for k in (0, 1)}
    assert await left_behind(db_url, plan.accounts[0]) == (0, 0, 0)


def _copy_connection_with(connect: Any) -> Any:
    """search_scale.copy_connection, its connection made by `connect`."""
    real = search_scale.copy_connection

    async def copy_connection(url: str) -> asyncpg.Connection:
        saved = search_scale.asyncpg.connect
        search_scale.asyncpg.connect = connect
        try:
            return await real(url)
        finally:
            search_scale.asyncpg.connect = saved

    return copy_connection
