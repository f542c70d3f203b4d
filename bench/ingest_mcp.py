"""What an agent that runs elsewhere pays to use its memory: one MCP tool call's overhead
over the same call done natively. The service runs in a
process of its own (uvicorn, `create_app`, a fresh embedded PostgreSQL, the static embedder);
this process is the client, with the official SDK's streamable-HTTP client over loopback. The
same call done natively is what a turn does: `NativeTools.call` in process (and, for a write,
the commit of what it staged). The MCP figure adds the HTTP round trip, the bearer token check,
the agent's look-up, the execution's start and commit transactions and its transcript.

    python bench/ingest.py --no-bulk --mcp             # 200 calls a tool, 1,000 records
    python bench/ingest_mcp.py --calls 50 --records 200
"""

import argparse
import asyncio
import atexit
import json
import multiprocessing
import shlex
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import percentiles  # noqa: E402

SUBJECTS = ["invoice", "refund", "shipping", "password", "plan", "address", "email", "card"]
PEOPLE = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken"]


def _fact(i: int) -> str:
    person, subject = PEOPLE[i % len(PEOPLE)], SUBJECTS[(i // len(PEOPLE)) % len(SUBJECTS)]
    return f"{person}'s {subject} detail number {i} was confirmed on call {i * 7 % 997}"


def _question(i: int) -> str:
    person, subject = PEOPLE[i % len(PEOPLE)], SUBJECTS[(i * 3) % len(SUBJECTS)]
    return f"What do we know about {person}'s {subject}?"


def _serve(url: str, port: int, ready: Any) -> None:
    """The service, in a process of its own."""
    import uvicorn

    from app.config import Settings
    from app.main import create_app

    settings = Settings(
        database_url=url,
        search_maintenance_seconds=0,
        bootstrap_token="bench-admin-token",  # else the service prints a new admin token
    )
    config = uvicorn.Config(create_app(settings), port=port, log_level="warning", log_config=None)
    server = uvicorn.Server(config)
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets)
        ready.set()

    server.startup = startup  # type: ignore[method-assign]
    server.run()


async def _setup(url: str, records: int) -> tuple[Any, Any, Any, str]:
    """The agent with `records` records, and a client token: (state, admin, action, token)."""
    from app.actions.service import agent_principal, create_action
    from app.auth import service as auth_service
    from app.auth.caller import Caller
    from app.auth.policies import ADMIN_POLICIES
    from app.auth.service import ensure_default_account
    from app.config import Settings
    from app.db.pool import create_pool
    from app.embeddings.static import StaticEmbedder
    from app.executions import store as executions_store
    from app.memory.service import MemoryWork, NewMemory, Writer
    from app.state import AppState

    pool = await create_pool(url, min_size=2, max_size=4)
    settings = Settings(database_url=url, search_maintenance_seconds=0)
    state = AppState(settings=settings, pool=pool, embedder=StaticEmbedder())
    async with pool.acquire() as conn:
        account_id = await ensure_default_account(conn)
    admin = Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)
    harness = {
        "memory": {
            "enabled": True,
            "tools": ["add_memory"],
            "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        }
    }
    action = await create_action(
        pool, admin, name="remote", instructions="You help.", model=None, harness=harness
    )
    async with pool.acquire() as conn:
        await executions_store.ensure_session(conn, account_id, action.action_id, "s0")
    for start in range(0, records, 200):
        writer = Writer(
            account_id,
            action,
            uuid.uuid4(),
            1,
            "s0",
            agent_principal(action.action_id),
            "TOOL",
            False,
        )
        work = MemoryWork(pool, state.embedder, writer)  # type: ignore[arg-type]
        for i in range(start, min(records, start + 200)):
            await work.add(NewMemory(summary=_fact(i), kind="fact", scope="AGENT"))
        async with pool.acquire() as conn, conn.transaction():
            await work.commit(conn)
    async with pool.acquire() as conn:
        await conn.execute("VACUUM ANALYZE agent_memories")
    policies = [
        {"effect": "ALLOW", "actions": ["INSERT"], "resources": ["financial.ActionExecution.*"]},
        {
            "effect": "ALLOW",
            "actions": ["SELECT", "INSERT", "UPDATE"],
            "resources": ["financial.AgentMemory.*"],
        },
    ]
    await auth_service.create_client(
        pool,
        admin,
        account_id=None,
        principal="remote-agent",
        name="remote agent",
        policies=policies,
    )
    issued = await auth_service.issue_client_token(
        pool, admin, account_id=None, principal="remote-agent", expires=None
    )
    return state, admin, action, issued.token


async def _native(state: Any, action: Any, calls: int) -> dict[str, list[float]]:
    """The calls as a turn makes them: NativeTools in process, a write's commit included."""
    from app.actions.service import agent_principal
    from app.memory.service import MemoryWork, Writer
    from app.runtime.model import ToolCall
    from app.runtime.tools import NativeTools
    from app.runtime.transcript import Transcript

    timings: dict[str, list[float]] = {"search_memory": [], "add_memory": []}
    for i in range(calls + 10):
        writer = Writer(
            action.account_id,
            action,
            uuid.uuid4(),
            1,
            "s1",
            agent_principal(action.action_id),
            "TOOL",
            False,
        )
        work = MemoryWork(state.pool, state.embedder, writer)
        tools = NativeTools(work, action.harness.memory, Transcript(1, 1), state.embedder.name)
        started = time.perf_counter()
        await tools.call(ToolCall("c1", "search_memory", json.dumps({"query": _question(i)})))
        searched = time.perf_counter()
        arguments = {"summary": f"native note {i}", "kind": "fact"}
        await tools.call(ToolCall("c2", "add_memory", json.dumps(arguments)))
        async with state.pool.acquire() as conn, conn.transaction():
            await work.commit(conn)
        added = time.perf_counter()
        if i >= 10:
            timings["search_memory"].append((searched - started) * 1000)
            timings["add_memory"].append((added - searched) * 1000)
    return timings


async def _as_executions(state: Any, admin: Any, action: Any, calls: int) -> dict[str, list[float]]:
    """The calls as the MCP endpoint runs them once it has checked the request
    (app/runtime/calls.call_tool: an execution each), in process, without HTTP."""
    from app.runtime import calls as outside

    place = outside.Place(action.action_id, "s1")
    client = outside.ClientInfo("bench")
    timings: dict[str, list[float]] = {"search_memory": [], "add_memory": []}
    for i in range(calls + 10):
        started = time.perf_counter()
        await outside.call_tool(
            state, admin, place, client, "search_memory", {"query": _question(i)}, action
        )
        searched = time.perf_counter()
        arguments = {"summary": f"execution note {i}", "kind": "fact"}
        await outside.call_tool(state, admin, place, client, "add_memory", arguments, action)
        done = time.perf_counter()
        if i >= 10:
            timings["search_memory"].append((searched - started) * 1000)
            timings["add_memory"].append((done - searched) * 1000)
    return timings


async def _over_mcp(url: str, token: str, calls: int) -> dict[str, list[float]]:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    timings: dict[str, list[float]] = {"search_memory": [], "add_memory": []}
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for i in range(calls + 10):
            started = time.perf_counter()
            found = await session.call_tool("search_memory", {"query": _question(i)})
            searched = time.perf_counter()
            added = await session.call_tool(
                "add_memory", {"summary": f"mcp note {i}", "kind": "fact"}
            )
            done = time.perf_counter()
            assert not found.is_error and not added.is_error, (found, added)
            if i >= 10:
                timings["search_memory"].append((searched - started) * 1000)
                timings["add_memory"].append((done - searched) * 1000)
    return timings


def mcp_overhead(calls: int = 200, records: int = 1000) -> dict[str, dict[str, list[float]]]:
    """Times `calls` search_memory and add_memory calls natively and over MCP, against an agent
    holding `records` records; returns the samples (ms) by mode and tool."""
    from app.db import migrate
    from app.db.embedded import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="engram-bench-mcp-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # Ctrl-C as the server starts too
    pg = EmbeddedPostgres(root / "pgdata")
    context = multiprocessing.get_context("spawn")
    service = None
    try:

        async def create() -> None:
            conn = await asyncpg.connect(pg.uri())
            await conn.execute("CREATE DATABASE engram_bench")
            await conn.close()

        asyncio.run(create())
        url = pg.uri("engram_bench")
        migrate.upgrade(url)

        async def run() -> dict[str, dict[str, list[float]]]:
            nonlocal service
            state, admin, action, token = await _setup(url, records)
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            ready = context.Event()
            service = context.Process(target=_serve, args=(url, port, ready), daemon=True)
            service.start()
            if not await asyncio.to_thread(ready.wait, 60):
                raise RuntimeError("the service did not start in 60 s")
            endpoint = f"http://127.0.0.1:{port}/mcp/{action.action_id}?session=s1"
            results = {
                "native": await _native(state, action, calls),
                "execution": await _as_executions(state, admin, action, calls),
                "mcp": await _over_mcp(endpoint, token, calls),
            }
            await state.pool.close()
            return results

        return asyncio.run(run())
    finally:
        if service is not None:
            service.terminate()
            service.join(timeout=10)
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="timed calls a tool and mode")
    parser.add_argument("--records", type=int, default=1000, help="records the agent holds")
    args = parser.parse_args()
    print("$ python " + " ".join(shlex.quote(a) for a in sys.argv))
    report(args.calls, args.records)


def report(calls: int, records: int) -> None:
    """Prints one MCP tool call's overhead over the same call done natively."""
    results = mcp_overhead(calls, records)
    print(f"{calls} calls a tool, agent of {records} records, static embedder")
    for tool in ("search_memory", "add_memory"):
        native, mcp = results["native"][tool], results["mcp"][tool]
        print(f"  {tool:<14} native     {percentiles(native)}")
        print(f"  {tool:<14} execution  {percentiles(results['execution'][tool])}")
        print(f"  {tool:<14} MCP        {percentiles(mcp)}")
        overhead = statistics.median(mcp) - statistics.median(native)
        print(f"  {tool:<14} MCP overhead (p50 difference): {overhead:.2f} ms")


if __name__ == "__main__":
    main()
