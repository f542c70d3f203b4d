"""Past one machine (issue 16): two `engram serve` processes against one PostgreSQL
(ENGRAM_DATABASE_URL), started together on an empty database. They migrate it once between
them, a write through one is read through the other, and search upkeep runs in one process at
a time (the round's advisory lock; each round is recorded in `deployment`)."""

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from helpers import database_copy, eventually
from servers import Served, clean_env, free_port, post_graphql

from app.db.embedded import EmbeddedPostgres
from app.memory.maintenance import ROUND_KEY, ROUND_LOCK

CREATE = """mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"""
ADD = """mutation($a: UUID!, $input: AgentMemoryInput!) {
  addAgentMemory(actionId: $a, input: $input) { memoryId } }"""
READ = """query($a: UUID!, $id: UUID!) {
  agentMemory(actionId: $a, id: $id) { memoryId summary modifiedBy } }"""
SEARCH = """query($a: UUID!, $q: String!) {
  action(actionId: $a) { searchMemories(query: $q, first: 5) { edges { node { summary } } } } }"""
TOKEN = """mutation { createClientToken(principal: "admin") { token } }"""


@pytest.fixture
async def empty_db(pg_server: EmbeddedPostgres) -> AsyncIterator[str]:
    async with database_copy(pg_server, None, f"engram_two_{os.getpid()}") as url:
        yield url


async def _round(conn: asyncpg.Connection) -> dict | None:
    value = await conn.fetchval("SELECT value FROM deployment WHERE key = $1", ROUND_KEY)
    return None if value is None else json.loads(value)


async def test_two_serve_processes_share_one_database(empty_db: str, tmp_path: Path) -> None:
    token = secrets.token_hex(32)
    ports = [free_port(), free_port()]
    served = [
        Served(
            clean_env(
                database_url=empty_db,
                port=str(port),
                bootstrap_token=token,
                search_maintenance_seconds="0.2",
                data_dir=str(tmp_path / f"unused{i}"),
            ),
            tmp_path / f"serve{i}.log",
        )
        for i, port in enumerate(ports)
    ]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for s, url in zip(served, urls, strict=True):
            await asyncio.to_thread(s.wait_healthy, url, 120)
        a, b = urls

        # A write through one is read (and searched) through the other.
        harness = {"memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}}
        created = await asyncio.to_thread(
            post_graphql, a, token, CREATE, input={"name": "shared", "harness": harness}
        )
        action = created["createAction"]["actionId"]
        memory = {"summary": "the customer prefers invoices by post", "kind": "fact"}
        added = await asyncio.to_thread(post_graphql, a, token, ADD, a=action, input=memory)
        memory_id = added["addAgentMemory"]["memoryId"]
        read = await asyncio.to_thread(post_graphql, b, token, READ, a=action, id=memory_id)
        assert read["agentMemory"]["summary"] == memory["summary"]
        found = await asyncio.to_thread(
            post_graphql, b, token, SEARCH, a=action, q="invoices by post"
        )
        edges = found["action"]["searchMemories"]["edges"]
        assert [e["node"]["summary"] for e in edges] == [memory["summary"]]
        # A token issued through one process works on the other.
        issued = await asyncio.to_thread(post_graphql, b, token, TOKEN)
        other = issued["createClientToken"]["token"]
        assert await asyncio.to_thread(post_graphql, a, other, READ, a=action, id=memory_id)

        conn = await asyncpg.connect(empty_db)
        try:
            # Migrated once between them (both ran `alembic upgrade` at start, one at a time).
            assert await conn.fetchval("SELECT count(*) FROM alembic_version") == 1
            assert await conn.fetchval("SELECT count(*) FROM service_processes") == 2

            # Both processes run upkeep rounds, each recording itself; one at a time.
            pids = {f"{os.uname().nodename}:{s.proc.pid}" for s in served}
            seen: set[str] = set()

            async def both_ran() -> bool:
                value = await _round(conn)
                if value is not None:
                    seen.add(value["process"])
                return seen == pids

            await eventually(both_ran, "a round by each process", seconds=30)

            # While another holds the round's lock (as a process in its round does), neither
            # process starts a round; once it is released, rounds go on.
            await conn.execute(f"SELECT pg_advisory_lock({ROUND_LOCK})")
            held = await _round(conn)
            assert held is not None and held["finished"] is not None
            # A skipped round leaves no trace to wait for: several intervals of both processes.
            await asyncio.sleep(1.5)
            assert await _round(conn) == held
            await conn.execute(f"SELECT pg_advisory_unlock({ROUND_LOCK})")

            async def next_round() -> bool:
                return await _round(conn) != held

            await eventually(next_round, "a round after the lock's release")
        finally:
            await conn.close()
    finally:
        for s in served:
            s.kill()
    for s in served:
        assert "Traceback" not in s.log.read_text(), s.log.read_text()
