"""Crash test: kill -9 the service, and separately a PostgreSQL backend, mid-burst.

Starts `engram serve` (`python -m app.cli serve`, a real subprocess on loopback) on its own
embedded PostgreSQL in a /tmp/engram-crash-* data directory, with a scripted OpenAI-compatible
model (the tests' server, answering each turn with one `add_memory` call and then a reply,
each call after --model-delay seconds). Then two phases, each a write burst over --workers
connections (addAgentMemory, and executeAction turns for --turn-share of the writes, every
one with an idempotency key; a write not answered, answered 5xx, or answered INTERNAL or
UNAVAILABLE is sent again with its key until answered):

1. after --burst seconds, `kill -9` of the service, and a restart;
2. after --burst seconds, `kill -9` of one PostgreSQL backend serving the service (found in
   pg_stat_activity), which makes PostgreSQL end every backend and recover.

Each phase's load runs --after seconds past the kill, then stops; --settle seconds after the
restart (or the backend's kill) the phase checks, in the database: acknowledged writes and
how many are missing (must be 0), writes committed twice (0), staged memory rows left
(orphans, after the sweep: 0), executions still RUNNING (0), and it counts the answers seen:
plain-text 5xx (0), JSON 5xx by code, GraphQL errors by code, transport errors.

The service runs with ENGRAM_TURN_HEARTBEAT_SECONDS=1 and ENGRAM_TURN_LEASE_SECONDS=5, so a
dead process's turns end within seconds (the defaults are 10 and 60).

    python bench/crash.py                           # about 2.5 minutes
    python bench/crash.py --burst 8 --after 5 --settle 30 --workers 10
"""

import argparse
import asyncio
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the scripted model server of the tests

from openai_server import OpenAIServer  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402

from app.db.embedded import EmbeddedPostgres  # noqa: E402

RETRIED_CODES = {"INTERNAL", "UNAVAILABLE"}
ADD = """mutation($a: UUID!, $input: AgentMemoryInput!, $key: String) {
  addAgentMemory(actionId: $a, input: $input, idempotencyKey: $key) { memoryId }
}"""
EXECUTE = """mutation($input: ExecuteActionInput!) {
  executeAction(input: $input) { executionId status error }
}"""
CREATE = """mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"""


class TurnModel(OpenAIServer):
    """Each turn: one add_memory call naming the turn's input, then a reply."""

    delay = 0.3

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        await asyncio.sleep(self.delay)
        messages = body.get("messages", [])
        if messages and messages[-1]["role"] != "tool" and body.get("tool_choice") != "none":
            arguments = {"summary": f"turn said {messages[-1]['content']}", "kind": "fact"}
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add_memory", "arguments": json.dumps(arguments)},
                    }
                ],
            }
        else:
            message = {"role": "assistant", "content": "noted"}
        return JSONResponse(
            {
                "id": "chatcmpl-crash",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """`engram serve` as a subprocess."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.env, self.port, self.log = env, port, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        command = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"engram serve exited; see {self.log}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).is_success:
                    return time.monotonic()
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"engram serve did not answer /healthz; see {self.log}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()


@dataclass
class Figures:
    adds_acked: dict[str, str] = field(default_factory=dict)  # memory ID -> summary
    turns_acked: dict[str, str] = field(default_factory=dict)  # execution ID -> status
    sent: int = 0
    plain_5xx: int = 0
    json_5xx: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    transport_errors: int = 0
    plain_samples: list[str] = field(default_factory=list)
    unanswered: int = 0


class Load:
    def __init__(self, url: str, token: str, action_id: str, args: argparse.Namespace) -> None:
        self.url, self.action_id, self.args = url, action_id, args
        self.headers = {"Authorization": f"Bearer {token}"}
        self.figures = Figures()

    async def request(self, client: httpx.AsyncClient, query: str, **variables: Any) -> Any:
        """Sends until answered (the variables hold the idempotency key): data, or None when
        refused for good (the figure counts the code)."""
        f = self.figures
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            f.sent += 1
            try:
                r = await client.post(
                    self.url, json={"query": query, "variables": variables}, headers=self.headers
                )
            except httpx.TransportError:
                f.transport_errors += 1
                await asyncio.sleep(0.2)
                continue
            is_json = r.headers.get("content-type", "").startswith("application/json")
            if r.status_code >= 500 and not is_json:
                f.plain_5xx += 1
                if len(f.plain_samples) < 3:
                    f.plain_samples.append(f"{r.status_code} {r.text[:80]!r}")
                await asyncio.sleep(0.2)
                continue
            payload = r.json()
            errors = payload.get("errors") or []
            code = errors[0].get("extensions", {}).get("code", "?") if errors else None
            if r.status_code >= 500:
                f.json_5xx[f"{r.status_code} {code}"] += 1
                await asyncio.sleep(0.2)
                continue
            if code is None:
                return payload["data"]
            still_running = code == "CONFLICT" and "still running" in errors[0]["message"]
            f.errors[f"{code} (turn still running)" if still_running else code] += 1
            if code in RETRIED_CODES or still_running:
                await asyncio.sleep(0.3)
                continue
            return None
        f.unanswered += 1
        return None

    async def worker(self, i: int, stop: asyncio.Event, client: httpx.AsyncClient) -> None:
        rng = random.Random(i)
        n = 0
        while not stop.is_set():
            n += 1
            name = f"{self.args.run}-w{i}-{n}"
            if rng.random() < self.args.turn_share:
                request = {
                    "actionId": self.action_id,
                    "sessionId": f"w{i}",
                    "input": name,
                    "idempotencyKey": f"turn-{name}",
                }
                data = await self.request(client, EXECUTE, input=request)
                if data is not None:
                    executed = data["executeAction"]
                    self.figures.turns_acked[executed["executionId"]] = executed["status"]
            else:
                fact = {"summary": f"operator wrote {name}", "kind": "fact"}
                data = await self.request(
                    client, ADD, a=self.action_id, input=fact, key=f"add-{name}"
                )
                if data is not None:
                    self.figures.adds_acked[data["addAgentMemory"]["memoryId"]] = fact["summary"]

    async def run(self, stop: asyncio.Event) -> None:
        limits = httpx.Limits(max_connections=self.args.workers)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(self.worker(i, stop, client) for i in range(self.args.workers)))


async def check(db_url: str, figures: Figures) -> dict[str, Any]:
    conn = await asyncpg.connect(db_url)
    try:
        committed = {
            str(r["memory_id"])
            for r in await conn.fetch(
                "SELECT memory_id FROM agent_memories "
                "WHERE memory_id = any($1::uuid[]) AND pending_execution IS NULL",
                list(figures.adds_acked),
            )
        }
        succeeded = [e for e, status in figures.turns_acked.items() if status == "SUCCEEDED"]
        turns_kept = await conn.fetchval(
            "SELECT count(*) FROM executions "
            "WHERE execution_id = any($1::uuid[]) AND status = 'SUCCEEDED'",
            succeeded,
        )
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT summary FROM agent_memories "
            "WHERE pending_execution IS NULL GROUP BY summary HAVING count(*) > 1) d"
        )
        return {
            "acknowledged writes": len(figures.adds_acked) + len(figures.turns_acked),
            "  addAgentMemory / turns (SUCCEEDED, FAILED)": (
                f"{len(figures.adds_acked)} / {len(succeeded)}, "
                f"{len(figures.turns_acked) - len(succeeded)}"
            ),
            "acknowledged writes missing": len(figures.adds_acked)
            - len(committed)
            + len(succeeded)
            - turns_kept,
            "writes committed twice": twice,
            "orphaned staged rows after the sweep": await conn.fetchval(
                "SELECT count(*) FROM agent_memories WHERE pending_execution IS NOT NULL"
            ),
            "executions left RUNNING": await conn.fetchval(
                "SELECT count(*) FROM executions WHERE status = 'RUNNING'"
            ),
            "requests sent (retries included)": figures.sent,
            "plain-text 5xx answers": figures.plain_5xx,
            "JSON 5xx answers": dict(figures.json_5xx),
            "GraphQL errors by code": dict(figures.errors),
            "transport errors (service down)": figures.transport_errors,
            "writes never answered": figures.unanswered,
            "plain-text 5xx samples": figures.plain_samples,
        }
    finally:
        await conn.close()


async def kill_backend(db_url: str, database: str) -> int:
    """SIGKILL of one backend serving the service (a busy one if any): PostgreSQL then ends
    every backend and recovers, as after a crash."""
    conn = await asyncpg.connect(db_url)
    try:
        pid = await conn.fetchval(
            """
            SELECT pid FROM pg_stat_activity
            WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()
            ORDER BY state = 'active' DESC, state_change DESC LIMIT 1
            """,
            database,
        )
    finally:
        await conn.close()
    os.kill(pid, signal.SIGKILL)
    return pid


async def phase(
    name: str, args: argparse.Namespace, load: Load, service: Service, db_url: str, db: str
) -> dict[str, Any]:
    stop = asyncio.Event()
    running = asyncio.create_task(load.run(stop))
    await asyncio.sleep(args.burst)
    if name == "service":
        service.kill()
        print(f"  kill -9 of engram serve after {args.burst:g} s; restarting", flush=True)
        restarted = await asyncio.to_thread(service.start)
    else:
        pid = await kill_backend(db_url, db)
        print(f"  kill -9 of PostgreSQL backend {pid} after {args.burst:g} s", flush=True)
        restarted = time.monotonic()
    await asyncio.sleep(args.after)
    stop.set()
    await running
    await asyncio.sleep(max(0.0, restarted + args.settle - time.monotonic()))
    return await check(db_url, load.figures)


def report(name: str, figures: dict[str, Any]) -> None:
    print(f"\n{name}")
    for label, value in figures.items():
        print(f"  {label:48} {value}")


async def setup(url: str, token: str) -> str:
    harness = {
        "memory": {
            "enabled": True,
            "tools": ["add_memory"],
            "scope": {"read": ["agent"], "write": ["agent"]},
        }
    }
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            url,
            json={
                "query": CREATE,
                "variables": {"input": {"name": "crash", "instructions": "x", "harness": harness}},
            },
            headers={"Authorization": f"Bearer {token}"},
        )
    return r.json()["data"]["createAction"]["actionId"]


async def main_async(args: argparse.Namespace, data: Path) -> None:
    pg = EmbeddedPostgres(data / "pgdata")
    admin_url = pg.uri()
    conn = await asyncpg.connect(admin_url)
    await conn.execute("CREATE DATABASE engram_crash")
    await conn.close()
    db_url = pg.uri("engram_crash")
    model = TurnModel()
    TurnModel.delay = args.model_delay
    model.start()
    port = free_port()
    token = secrets.token_urlsafe(32)
    env = {
        **os.environ,
        "ENGRAM_DATABASE_URL": db_url,
        "ENGRAM_BOOTSTRAP_TOKEN": token,
        "ENGRAM_MODEL_BASE_URL": model.url,
        "ENGRAM_MODEL_MAX_RETRIES": "0",
        "ENGRAM_POOL_MAX_SIZE": str(args.workers),
        "ENGRAM_SEARCH_MAINTENANCE_SECONDS": "0",
        "ENGRAM_TURN_HEARTBEAT_SECONDS": "1",
        "ENGRAM_TURN_LEASE_SECONDS": "5",
    }
    service = Service(env, port, data / "service.log")
    try:
        await asyncio.to_thread(service.start)
        url = f"http://127.0.0.1:{port}/graphql"
        action_id = await setup(url, token)
        for name, title in [
            ("service", "kill -9 of the service mid-burst, restart"),
            ("backend", "kill -9 of a PostgreSQL backend mid-burst (recovery)"),
        ]:
            args.run = name
            print(f"phase: {title}", flush=True)
            figures = await phase(
                name, args, Load(url, token, action_id, args), service, db_url, "engram_crash"
            )
            report(f"{title}, {args.settle:g} s after:", figures)
    finally:
        service.stop()
        model.stop()
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=20, help="concurrent connections")
    parser.add_argument("--burst", type=float, default=15, help="seconds of load before a kill")
    parser.add_argument("--after", type=float, default=10, help="seconds of load after it")
    parser.add_argument("--settle", type=float, default=60, help="check this long after")
    parser.add_argument("--turn-share", type=float, default=0.2, help="share of turns")
    parser.add_argument("--model-delay", type=float, default=0.3, help="seconds a model call")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()
    print("python bench/crash.py " + shlex.join(sys.argv[1:]), flush=True)
    data = Path(tempfile.mkdtemp(prefix="engram-crash-"))
    started = time.monotonic()
    try:
        asyncio.run(main_async(args, data))
    finally:
        took = f"\n{time.monotonic() - started:.0f} s"
        if args.keep:
            print(f"{took}; service log: {data / 'service.log'}")
        else:
            print(f"{took}; the service log was removed with the data (--keep keeps them)")
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
