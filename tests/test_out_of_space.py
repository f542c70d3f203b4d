"""A database out of disk space (or of memory for its locks): PostgreSQL refuses the write
with SQLSTATE class 53 and rolls it back. A request is answered 503 UNAVAILABLE with
Retry-After, logged in one line, and a command says so in one line, never a traceback.

The refusal comes from a trigger that raises PostgreSQL's own `disk_full` error at the write,
as a full disk does at the next page it extends (filling a real disk needs a mount of its own)."""

import asyncio
import logging
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import httpx
import pytest
from factories import allow, full_memory, make_agent_id, memory_harness, token_for
from mcp_support import mcp_session, mcp_url, result_json
from servers import clean_env, engram_command

from app.auth.caller import Caller
from app.db.errors import is_out_of_resources, is_unavailable
from app.observability.logs import OutageInOneLine
from app.state import AppState

TOKEN = "test-out-of-space-admin-token"
FULL = 'could not extend file "base/5/16822": No space left on device'
ADD = (
    "mutation($a: UUID!, $i: AgentMemoryInput!) { addAgentMemory(actionId: $a, input: $i) "
    "{ memoryId } }"
)


@asynccontextmanager
async def disk_full(db_url: str, table: str) -> AsyncIterator[None]:
    """Every row written to `table` meanwhile is refused as a full disk refuses it."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            f"""
            CREATE FUNCTION test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION '{FULL.replace("'", "''")}'
                  USING ERRCODE = 'disk_full', HINT = 'Check free disk space.'; END $$;
            CREATE TRIGGER test_disk_full BEFORE INSERT ON {table}
                FOR EACH ROW EXECUTE FUNCTION test_disk_full();
            """
        )
        yield
    finally:
        await conn.execute(
            f"DROP TRIGGER test_disk_full ON {table}; DROP FUNCTION test_disk_full()"
        )
        await conn.close()


async def count(db_url: str, table: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval(f"SELECT count(*) FROM {table}")
    finally:
        await conn.close()


@pytest.mark.settings(bootstrap_token=TOKEN)
async def test_a_write_the_full_disk_refuses_is_503_unavailable_in_one_line(
    state: AppState, admin: Caller, db_url: str, base_url: str, caplog
) -> None:
    """It was answered INTERNAL (status 200), and logged with asyncpg's traceback."""
    agent = await make_agent_id(state, admin, harness=memory_harness())
    add = {
        "query": ADD,
        "variables": {"a": agent, "i": {"summary": "tea", "kind": "fact", "sessionId": "s"}},
    }
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        async with disk_full(db_url, "agent_memories"):
            caplog.clear()
            refused = await client.post("/graphql", json=add)
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) > 0
            body = refused.json()
            assert body["data"] is None
            assert [e["extensions"]["code"] for e in body["errors"]] == ["UNAVAILABLE"]
            assert await count(db_url, "agent_memories") == 0
            assert await count(db_url, "executions") == 0  # the write's execution too
            logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert logged and all(r.levelno == logging.WARNING for r in logged), logged
            for record in logged:
                OutageInOneLine().filter(record)
                assert record.exc_info is None, record.getMessage()
            # Said by its kind: its words are not logged (app/db/errors.py `described`).
            assert any("DiskFullError (SQLSTATE 53100" in r.getMessage() for r in logged)
        written = await client.post("/graphql", json=add)  # space again: written
        assert written.json()["data"]["addAgentMemory"]["memoryId"]


async def test_an_import_the_full_disk_refuses_says_so_in_one_line(
    state: AppState, admin: Caller, db_url: str, tmp_path
) -> None:
    """`engram import` printed asyncpg's traceback; now one line with PostgreSQL's reason
    and what is left, exit status 2."""
    agent = await make_agent_id(state, admin, harness=memory_harness())
    dump = tmp_path / "agent.jsonl"
    env = clean_env(database_url=db_url)
    exported = subprocess.run(
        [*engram_command(), "export", "--action", agent, "-o", str(dump)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DELETE FROM action_versions; DELETE FROM actions")
    finally:
        await conn.close()
    async with disk_full(db_url, "actions"):
        proc = await asyncio.create_subprocess_exec(
            *engram_command(),
            "import",
            str(dump),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
    said = err.decode()
    assert proc.returncode == 2 and "Traceback" not in said, said
    last = said.strip().splitlines()[-1]
    assert last.startswith(
        f"engram import: the database stopped its work ({FULL} HINT: Check free disk space.): "
        "the batches stored stay; run the same import again"
    ), said
    assert await count(db_url, "actions") == 0


async def test_a_tool_call_the_full_disk_refuses_is_told_so_and_recorded(
    state: AppState, admin: Caller, db_url: str, base_url: str
) -> None:
    """A turn's work the full disk refuses (here an MCP tool call's record) was told "the
    database became unavailable ... (restarting, or its connection was ended)", which no
    operator looking for a full disk would read as one: the call's answer and its execution's
    error say the database ran out of room."""
    agent = await make_agent_id(state, admin, harness=full_memory())
    token = await token_for(
        state,
        admin,
        "out-of-space-runner",
        allow(["INSERT"], "financial.ActionExecution.document"),
        allow(["SELECT", "INSERT", "UPDATE"], "financial.AgentMemory.*"),
    )
    told = (
        "the database ran out of disk space or memory for the tool call's work (logged by the "
        "service), and rolled it back; send it again once the operator has made room"
    )  # an MCP call: no executionId retries it (executeAction's retry is a turn's)
    async with (
        disk_full(db_url, "agent_memories"),
        mcp_session(mcp_url(base_url, agent), token) as session,
    ):
        result = await asyncio.wait_for(
            session.call_tool("add_memory", {"summary": "tea", "kind": "fact"}), 30
        )
    assert result.is_error, result
    assert result_json(result) == {"error": told}
    conn = await asyncpg.connect(db_url)
    try:
        row = await conn.fetchrow(
            "SELECT status, error FROM executions WHERE action_id = $1 AND kind = 'MCP'",
            uuid.UUID(agent),
        )
    finally:
        await conn.close()
    assert (row["status"], row["error"]) == ("FAILED", told)
    assert await count(db_url, "agent_memories") == 0


def test_a_configured_limit_is_not_told_to_retry() -> None:
    """53400 (a limit the operator set, such as temp_file_limit) is met again by the same work
    at every retry: not unavailable, unlike the rest of class 53."""
    limit = asyncpg.exceptions.ConfigurationLimitExceededError("temporary file size exceeds")
    full = asyncpg.exceptions.DiskFullError(FULL)
    assert (limit.sqlstate, full.sqlstate) == ("53400", "53100")
    assert not is_unavailable(limit) and not is_out_of_resources(limit)
    assert is_unavailable(full) and is_out_of_resources(full)
