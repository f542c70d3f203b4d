"""Connection-loss probe: every kind of request while PostgreSQL ends the service's
connections at random moments (pg_terminate_backend), over real HTTP.

The app runs in-process on loopback (the tests' `base_url`), on its own copy of the tests'
database on the embedded PostgreSQL, with a scripted OpenAI-compatible model on loopback that
answers each call after a random pause (up to --model-delay, ENGRAM_LOSS_MODEL_DELAY), so that
terminations land while a request holds a connection between two statements, waits for the
model, or runs a statement. ENGRAM_LOSS_WORKERS workers (default 12) send, for
ENGRAM_LOSS_SECONDS (default 30), a mix of:

- agent turns (executeAction, some preview, with idempotency keys) whose model calls
  add_memory (some pinned), search_memory and search_history, with recall before the first
  call and the end-of-turn memory review (candidate and decide calls) after the reply;
- rememberConversation; addAgentMemory (some pinned, some replacing), addAgentMemories,
  deleteAgentMemory; reads: memories, searchMemories, a session's history and
  searchHistory, node(id), executions; createAction/updateAction; createClient,
  createClientToken, deleteClient;
- MCP tool calls (search_memory, add_memory) with the official SDK's client.

Meanwhile a killer connection ends, every ENGRAM_LOSS_KILL_EVERY seconds on average (default
0.3), one or more of the service's backends (pg_stat_activity of its database). A request
answered UNAVAILABLE or CONFLICT is not retried. Every answer is counted by HTTP status and
code; the test fails on a 500 that is not UNAVAILABLE (with Retry-After), on INTERNAL, and on
a request that took longer than ENGRAM_LOSS_BOUND seconds (default 60). ENGRAM_LOSS_RESTART=1
adds, halfway, a fast restart of the whole embedded server (pg_ctl restart -m fast).

Once the load ends and the liveness sweep has run (heartbeat 1 s, lease 5 s here), it checks
in the database: no execution left RUNNING; no memory row staged (pending_execution) left; every
turn or ingest that SUCCEEDED has its memory committed, and a FAILED one none (M17); the agent's
pinned lists' kept lengths match a recount; the service still answers.

    PYTHONPATH=.:tests pytest bench/conn_loss.py -p conftest -q -s -p no:cacheprovider
    ENGRAM_LOSS_SECONDS=120 ENGRAM_LOSS_RESTART=1 PYTHONPATH=.:tests pytest bench/conn_loss.py \\
        -p conftest -q -s -p no:cacheprovider
"""

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import signal
import time
from collections import Counter
from typing import Any

import asyncpg
import httpx
import pytest
from factories import allow, assert_pinned_lists_kept, full_memory, make_agent, token_for
from mcp_support import mcp_session, mcp_url
from openai_server import PURPOSE_HEADER, OpenAIServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.db.embedded import EmbeddedPostgres, _postmaster_pid
from app.db.errors import database_refusal
from app.db.pool import create_pool
from app.memory.maintenance import run_round

SECONDS = float(os.environ.get("ENGRAM_LOSS_SECONDS", "30"))
WORKERS = int(os.environ.get("ENGRAM_LOSS_WORKERS", "12"))
KILL_EVERY = float(os.environ.get("ENGRAM_LOSS_KILL_EVERY", "0.3"))
MODEL_DELAY = float(os.environ.get("ENGRAM_LOSS_MODEL_DELAY", "0.2"))
BOUND = float(os.environ.get("ENGRAM_LOSS_BOUND", "60"))
RESTART = os.environ.get("ENGRAM_LOSS_RESTART") == "1"
SEED = int(os.environ.get("ENGRAM_LOSS_SEED", "1"))
HARNESS = full_memory(pinned={"max_tokens": 100_000}) | {"history": {"index": "messages"}}
EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")

EXECUTE = """mutation($input: ExecuteActionInput!) { executeAction(input: $input) {
    executionId status error } }"""
REMEMBER = """mutation($input: RememberConversationInput!) {
    rememberConversation(input: $input) { executionId status error } }"""
ADD = """mutation($a: UUID!, $i: AgentMemoryInput!, $k: String) {
    addAgentMemory(actionId: $a, input: $i, idempotencyKey: $k) { memoryId id } }"""
ADDS = """mutation($a: UUID!, $i: [AgentMemoryInput!]!) {
    addAgentMemories(actionId: $a, inputs: $i) { memoryIds } }"""
DELETE = """mutation($a: UUID!, $m: UUID!) { deleteAgentMemory(actionId: $a, id: $m) { status } }"""
MEMORIES = """query($a: UUID!) { action(actionId: $a) {
    memories(first: 20) { nodes { id memoryId summary pinned } } } }"""
SEARCH = """query($a: UUID!, $q: String!) { action(actionId: $a) {
    searchMemories(query: $q, first: 5) { nodes { memoryId summary } } } }"""
HISTORY = """query($a: UUID!, $q: String!) { action(actionId: $a) {
    sessions(first: 3) { nodes { id turns history(first: 20) { nodes { id } }
    searchHistory(query: $q, first: 5) { text } } } } }"""
NODE = "query($id: ID!) { node(id: $id) { id } }"
EXECUTIONS = """query($a: UUID!) { action(actionId: $a) {
    executions(first: 10) { nodes { id executionId status } } } }"""
CREATE_ACTION = "mutation($i: ActionInput!) { createAction(input: $i) { actionId } }"
UPDATE_ACTION = """mutation($a: UUID!, $i: ActionInput!) {
    updateAction(actionId: $a, input: $i) { version } }"""
CREATE_CLIENT = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
CREATE_TOKEN = "mutation($p: String!) { createClientToken(principal: $p) { tokenId } }"
ERASE = """mutation($a: UUID!, $s: String!) {
    eraseSession(actionId: $a, sessionId: $s) { erasedEvents } }"""
DELETE_CLIENT = "mutation($p: String!) { deleteClient(principal: $p) { principal } }"


def _tag(text: str) -> str | None:
    """The first request tag (<t3x14>) in `text`, however its brackets were escaped."""
    found = re.search(r"t\d+x\d+", text)
    return f"<{found.group()}>" if found else None


class LossModel(OpenAIServer):
    """Turn calls: the first of a turn calls add_memory (pinned one time in four),
    search_memory and search_history; the next replies. Review calls: one candidate naming the
    turn's tag; a decide call adds it. Each answer after a random pause."""

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        await asyncio.sleep(random.random() * MODEL_DELAY)
        purpose = request.headers.get(PURPOSE_HEADER)
        text = json.dumps(body)
        # The turn's own tag (its input, the last user message), not one recall found.
        said = [m for m in body["messages"] if m["role"] == "user"]
        tag = _tag(json.dumps(said[-1:])) or _tag(text) or "<t?>"
        message: dict[str, Any] = {"role": "assistant", "content": None}
        calls: list[tuple[str, Any]] = []
        if purpose == "memory":
            if '"name": "decide"' in text:
                calls = [("decide", {"decisions": [{"candidate": "c1", "action": "add"}]})]
            else:
                candidate = {"summary": f"reviewed {tag}", "kind": "fact"}
                calls = [("remember", {"candidates": [candidate]})]
        elif purpose == "turn" and body["messages"][-1]["role"] != "tool":
            fact = {"summary": f"tool said {tag}", "kind": "fact"}
            if random.random() < 0.25:
                fact["pinned"] = True
            calls = [
                ("add_memory", fact),
                ("search_memory", {"query": "said"}),
                ("search_history", {"query": "hello"}),
            ]
        else:
            message["content"] = f"ok {tag}"
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for i, (name, arguments) in enumerate(calls)
            ]
        return JSONResponse(
            {
                "id": "chatcmpl-loss",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if calls else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


@pytest.fixture
def model_server():  # noqa: ANN201 (the conftest's fixture, with this model)
    with LossModel() as server:
        yield server


class Collect(logging.Handler):
    """Counts the errors the service logs, by logger, message and exception."""

    def __init__(self, counts: Counter[str]) -> None:
        super().__init__(logging.ERROR)
        self.counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        what = f"{type(error).__name__}: {str(error)[:80]}" if error else ""
        self.counts[f"{record.name}: {record.getMessage()[:80]} {what}"] += 1


class Probe:
    def __init__(self, http: httpx.AsyncClient, token: str, action_id: str) -> None:
        self.http, self.token, self.a = http, token, action_id
        self.answers: Counter[str] = Counter()
        self.bad: list[str] = []
        self.slowest = 0.0
        self.samples: dict[str, str] = {}  # code -> the first such answer
        self.failures: Counter[str] = Counter()  # a FAILED execution's error
        self.operations = 0
        self.executions: dict[str, str] = {}  # execution ID -> status answered
        self.memory_ids: list[str] = []
        self.node_ids: list[str] = []

    async def post(self, name: str, query: str, **variables: Any) -> dict[str, Any] | None:
        self.operations += 1
        started = time.monotonic()
        try:
            r = await self.http.post(
                "/graphql",
                json={"query": query, "variables": variables},
                headers={"Authorization": f"Bearer {self.token}"},
            )
        except httpx.TransportError as e:
            self.answers[f"{name} transport {type(e).__name__}"] += 1
            self.bad.append(f"{name}: {type(e).__name__} after {time.monotonic() - started:.1f} s")
            return None
        took = time.monotonic() - started
        self.slowest = max(self.slowest, took)
        if took > BOUND:
            self.bad.append(f"{name}: answered after {took:.1f} s")
        try:
            payload = r.json()
        except ValueError:
            self.answers[f"{r.status_code} plain"] += 1
            self.bad.append(f"{name}: {r.status_code} {r.text[:200]!r}")
            return None
        errors = payload.get("errors") or []
        code = errors[0].get("extensions", {}).get("code", "?") if errors else "OK"
        self.answers[f"{r.status_code} {code}"] += 1
        if errors and code not in self.samples:
            self.samples[code] = f"{name}: {errors[0].get('message', '')[:160]}"
        if r.status_code >= 500 and (code != "UNAVAILABLE" or "retry-after" not in r.headers):
            self.bad.append(f"{name}: {r.status_code} {code} {errors[:1]}")
        elif code in ("INTERNAL", "?"):
            self.bad.append(f"{name}: {code} {errors[:1]}")
        return None if errors else payload.get("data")

    async def worker(self, i: int, stop: asyncio.Event, base_url: str, mcp_token: str) -> None:
        rng = random.Random(SEED * 1000 + i)
        n = 0
        while not stop.is_set():
            n += 1
            tag = f"<t{i}x{n}>"
            session = f"s{rng.randint(1, 4)}"
            roll = rng.random()
            if roll < 0.30:
                turn = {
                    "actionId": self.a,
                    "sessionId": session,
                    "input": f"hello {tag}",
                    "preview": rng.random() < 0.2,
                    "idempotencyKey": f"turn-{tag}",
                }
                data = await self.post("executeAction", EXECUTE, input=turn)
                if data:
                    e = data["executeAction"]
                    self.executions[e["executionId"]] = e["status"]
                    if e["error"]:
                        self.failures[e["error"][:120]] += 1
                        if "internal error" in e["error"]:
                            self.bad.append(f"execution {e['executionId']}: {e['error']}")
            elif roll < 0.38:
                conversation = {
                    "actionId": self.a,
                    "sessionId": session,
                    "messages": [
                        {"role": "user", "content": f"remember {tag}"},
                        {"role": "assistant", "content": "sure"},
                    ],
                }
                data = await self.post("rememberConversation", REMEMBER, input=conversation)
                if data:
                    e = data["rememberConversation"]
                    self.executions[e["executionId"]] = e["status"]
                    if e["error"]:
                        self.failures[e["error"][:120]] += 1
                        if "internal error" in e["error"]:
                            self.bad.append(f"execution {e['executionId']}: {e['error']}")
            elif roll < 0.48:
                record: dict[str, Any] = {"summary": f"operator {tag}", "kind": "fact"}
                if rng.random() < 0.3:
                    record |= {"pinned": True, "sessionId": session}
                if self.memory_ids and rng.random() < 0.3:
                    record["replaces"] = rng.choice(self.memory_ids)
                data = await self.post("addAgentMemory", ADD, a=self.a, i=record, k=f"add-{tag}")
                if data:
                    self.memory_ids.append(data["addAgentMemory"]["memoryId"])
                    self.node_ids.append(data["addAgentMemory"]["id"])
            elif roll < 0.52:
                batch = [{"summary": f"batch {tag} {k}", "kind": "fact"} for k in range(5)]
                await self.post("addAgentMemories", ADDS, a=self.a, i=batch)
            elif roll < 0.55 and self.memory_ids:
                await self.post(
                    "deleteAgentMemory", DELETE, a=self.a, m=rng.choice(self.memory_ids)
                )
            elif roll < 0.62:
                await self.post("memories", MEMORIES, a=self.a)
            elif roll < 0.69:
                await self.post("searchMemories", SEARCH, a=self.a, q=f"said {tag}")
            elif roll < 0.76:
                data = await self.post("history", HISTORY, a=self.a, q="hello")
                if data:
                    self.node_ids += [s["id"] for s in data["action"]["sessions"]["nodes"]]
            elif roll < 0.80 and self.node_ids:
                await self.post("node", NODE, id=rng.choice(self.node_ids))
            elif roll < 0.82:
                await self.post("executions", EXECUTIONS, a=self.a)
            elif roll < 0.83:
                await self.post("eraseSession", ERASE, a=self.a, s="s4")
            elif roll < 0.86:
                agent = {"name": f"a{tag}", "instructions": "x", "harness": HARNESS}
                if rng.random() < 0.5:
                    await self.post("createAction", CREATE_ACTION, i=agent)
                else:
                    agent["name"] = "probe"
                    await self.post("updateAction", UPDATE_ACTION, a=self.a, i=agent)
            elif roll < 0.90:
                principal = f"c{i}x{n}"
                policies = [EVERYTHING]
                made = await self.post(
                    "createClient",
                    CREATE_CLIENT,
                    i={"principal": principal, "name": principal, "policies": policies},
                )
                if made:
                    await self.post("createClientToken", CREATE_TOKEN, p=principal)
                    await self.post("deleteClient", DELETE_CLIENT, p=principal)
            else:
                await self.mcp(base_url, mcp_token, session, tag, rng)

    async def mcp(
        self, base_url: str, token: str, session: str, tag: str, rng: random.Random
    ) -> None:
        self.operations += 1
        started = time.monotonic()
        name = rng.choice(["add_memory", "search_memory", "remember_conversation"])
        arguments: dict[str, Any] = {"query": "said"}
        if name == "add_memory":
            arguments = {"summary": f"mcp {tag}", "kind": "fact"}
        elif name == "remember_conversation":
            arguments = {"messages": [{"role": "user", "content": f"mcp remember {tag}"}]}
        try:
            async with mcp_session(mcp_url(base_url, self.a, session), token) as mcp:
                result = await mcp.call_tool(name, arguments)
        except Exception as e:  # the SDK raises on an HTTP error (a 503 at initialize)
            while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
                e = e.exceptions[0]
            text = str(e)
            self.answers[f"mcp {type(e).__name__}"] += 1
            self.samples.setdefault(f"mcp {type(e).__name__}", text[:160])
            if "503" not in text and "navailable" not in text:
                self.bad.append(f"mcp {name}: {type(e).__name__}: {text[:300]}")
            return
        finally:
            self.slowest = max(self.slowest, time.monotonic() - started)
        if result.is_error:
            body = json.loads(result.content[0].text)
            # A refusal has a code; a call that ran and failed (an execution FAILED) its error.
            code = body.get("code") or "FAILED"
            self.answers[f"mcp {code}"] += 1
            self.samples.setdefault(f"mcp {code}", str(body)[:160])
            allowed = ("UNAVAILABLE", "CONFLICT", "FAILED", "TOO_MANY_REQUESTS")
            if code not in allowed or "internal" in body["error"]:
                self.bad.append(f"mcp {name}: {body}")
        else:
            self.answers["mcp OK"] += 1


async def maintenance(db_url: str, stop: asyncio.Event, figures: Counter[str]) -> None:
    """Search maintenance rounds back to back on a pool of their own (the served app's
    interval is 0 in the tests' settings), as `engram serve`'s loop runs them."""
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        while not stop.is_set():
            try:
                await run_round(pool, min_records=20, min_parts=20)
                figures["maintenance rounds"] += 1
            except Exception as e:
                refused = database_refusal(e)
                figures[f"maintenance rounds failed ({refused and refused[0]})"] += 1
                if refused is None:
                    figures[f"  {type(e).__name__}: {e}"[:120]] += 1
            await asyncio.sleep(0.5)
    finally:
        await pool.close()


async def killer(db_url: str, database: str, stop: asyncio.Event, figures: Counter[str]) -> None:
    """Ends some of the service's backends at random moments; reconnects after a restart."""
    rng = random.Random(SEED)
    conn: asyncpg.Connection | None = None
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.expovariate(1 / KILL_EVERY))
            if stop.is_set():
                break
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(db_url)
                pids = await conn.fetch(
                    "SELECT pid, state FROM pg_stat_activity WHERE datname = $1 "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                    database,
                )
                chosen = rng.sample(pids, k=min(len(pids), rng.choice([1, 1, 1, 2, 3])))
                for row in chosen:
                    if await conn.fetchval("SELECT pg_terminate_backend($1)", row["pid"]):
                        figures[f"terminated ({row['state']})"] += 1
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn = None  # the server restarting: the next round connects again
    finally:
        if conn is not None:
            await conn.close()


def restart(pg_server: EmbeddedPostgres) -> None:
    """A fast shutdown of the whole server (every connection ended), then a start."""
    pid = _postmaster_pid(pg_server.pgdata)
    assert pid is not None
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while pg_server.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    pg_server.restart()


@pytest.mark.settings(
    turn_heartbeat_seconds=1,
    turn_lease_seconds=5,
    max_requests_per_account=64,
)
async def test_connection_loss(state, admin, base_url, model_server, db_url, pg_server):
    agent = await make_agent(state, admin, name="probe", harness=HARNESS)
    a = str(agent.action_id)
    token = await token_for(state, admin, "probe", EVERYTHING)
    database = db_url.split("?")[0].rsplit("/", 1)[1]
    terminations: Counter[str] = Counter()
    logged: Counter[str] = Counter()
    handler = Collect(logged)
    logging.getLogger().addHandler(handler)
    stop, stop_killer = asyncio.Event(), asyncio.Event()
    started = time.monotonic()
    limits = httpx.Limits(max_connections=WORKERS + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=BOUND + 30, limits=limits) as http:
        probe = Probe(http, token, a)
        kill = asyncio.create_task(killer(db_url, database, stop_killer, terminations))
        rounds: Counter[str] = Counter()
        upkeep = asyncio.create_task(maintenance(db_url, stop_killer, rounds))
        load = [asyncio.create_task(probe.worker(i, stop, base_url, token)) for i in range(WORKERS)]
        if RESTART:
            await asyncio.sleep(SECONDS / 2)
            await asyncio.to_thread(restart, pg_server)
            terminations["restarts of the server"] += 1
            await asyncio.sleep(SECONDS / 2)
        else:
            await asyncio.sleep(SECONDS)
        stop_killer.set()
        await kill
        await upkeep
        stop.set()
        await asyncio.gather(*load)
        elapsed = time.monotonic() - started
        await asyncio.sleep(8)  # past the lease: the sweep ends what a lost connection left
        after = await probe.post("memories after", MEMORIES, a=a)
        # Nothing held for good by what the storm cut short (the pool's connections, an
        # account's places): as many turns at once as the pool has connections all succeed.
        calm = Probe(http, token, a)
        turns = [
            {"actionId": a, "sessionId": f"calm{i}", "input": f"hello <calm{i}>"}
            for i in range(state.settings.pool_max_size)
        ]
        calmed = await asyncio.wait_for(
            asyncio.gather(*(calm.post("calm turn", EXECUTE, input=t) for t in turns)), BOUND
        )
        calm_status = Counter(d["executeAction"]["status"] if d else None for d in calmed)

    logging.getLogger().removeHandler(handler)
    conn = await asyncpg.connect(db_url)
    try:
        running = await conn.fetch(
            "SELECT execution_id, kind, modified FROM executions WHERE status = 'RUNNING'"
        )
        staged = await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE pending_execution IS NOT NULL"
        )
        # Memory written by executions, by their status: a FAILED one keeps none (M17), a
        # SUCCEEDED turn keeps its tool call's record and its review's.
        by_status = await conn.fetch(
            "SELECT e.kind, e.status, count(DISTINCT e.execution_id) AS executions, "
            "count(m.memory_id) AS records FROM executions e LEFT JOIN agent_memories m "
            "ON m.execution_id = e.execution_id AND m.invocation_number = e.invocation_number "
            "AND m.pending_execution IS NULL "
            "WHERE e.action_id = $1 AND e.kind IN ('TURN', 'INGEST') GROUP BY 1, 2 ORDER BY 1, 2",
            agent.action_id,
        )
        failed_kept = await conn.fetchval(
            "SELECT count(*) FROM executions e JOIN agent_memories m "
            "ON m.execution_id = e.execution_id AND m.invocation_number = e.invocation_number "
            "WHERE e.status = 'FAILED' AND m.pending_execution IS NULL",
        )
        turns_without = await conn.fetchval(
            "SELECT count(*) FROM executions e WHERE e.status = 'SUCCEEDED' "
            "AND e.kind IN ('TURN', 'INGEST') "
            "AND e.action_id = $1 AND NOT EXISTS (SELECT 1 FROM agent_memories m "
            "WHERE m.execution_id = e.execution_id AND m.invocation_number = e.invocation_number)",
            agent.action_id,
        )
        # History (H8): events kept only of committed attempts, never twice, parts whole; each
        # session's turn numbers 1..its count.
        history_wrong = await conn.fetchval(
            "SELECT count(*) FROM history_events e LEFT JOIN executions x "
            "ON x.account_id = e.account_id AND x.action_id = e.action_id "
            "AND x.execution_id = e.execution_id WHERE e.action_id = $1 "
            "AND (x.status IS DISTINCT FROM 'SUCCEEDED' "
            "OR x.invocation_number <> e.invocation_number OR x.turn IS DISTINCT FROM e.turn)",
            agent.action_id,
        )
        history_twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT execution_id, sequence FROM history_events "
            "WHERE action_id = $1 GROUP BY 1, 2 HAVING count(*) > 1) t",
            agent.action_id,
        )
        torn = await conn.fetchval(
            "SELECT count(*) FROM (SELECT e.event_id FROM history_events e "
            "LEFT JOIN history_parts p ON p.account_id = e.account_id "
            "AND p.action_id = e.action_id AND p.session_id = e.session_id "
            "AND p.event_id = e.event_id AND p.turn = e.turn AND p.preview = e.preview "
            "WHERE e.action_id = $1 GROUP BY e.event_id, e.parts "
            "HAVING array_agg(p.part ORDER BY p.part) "
            "<> array(SELECT generate_series(1, e.parts))) t",
            agent.action_id,
        )
        numbering = []
        for session in await conn.fetch(
            "SELECT session_id, turns FROM sessions WHERE action_id = $1", agent.action_id
        ):
            numbers = [
                r["turn"]
                for r in await conn.fetch(
                    "SELECT turn FROM executions WHERE action_id = $1 AND session_id = $2 "
                    "AND status = 'SUCCEEDED' AND replay_of IS NULL "
                    "AND kind IN ('TURN', 'INGEST') ORDER BY turn",
                    agent.action_id,
                    session["session_id"],
                )
            ]
            if numbers != list(range(1, session["turns"] + 1)):
                numbering.append((session["session_id"], session["turns"], numbers[-5:]))
    finally:
        await conn.close()
    pinned = await assert_pinned_lists_kept(state, agent)

    print(f"\nconnection loss: {SECONDS:g} s of load ({elapsed:.0f} s), {WORKERS} workers")
    print(f"  operations: {probe.operations}")
    print(f"  terminations: {dict(terminations)} ({sum(terminations.values())})")
    print(f"  answers: {dict(sorted(probe.answers.items()))}")
    print(f"  executions answered: {dict(Counter(probe.executions.values()))}")
    print(f"  maintenance: {dict(rounds)}")
    print(f"  slowest answer: {probe.slowest:.1f} s")
    print(f"  left RUNNING: {len(running)}; staged rows left: {staged}")
    print(f"  memory by execution status: {[dict(r) for r in by_status]}")
    print(f"  FAILED executions with committed memory: {failed_kept}")
    print(f"  SUCCEEDED turns and ingests without memory: {turns_without}")
    print(
        f"  history: events of no committed attempt {history_wrong}, kept twice "
        f"{history_twice}, parts not whole {torn}, sessions misnumbered {numbering}"
    )
    print(f"  pinned lists kept: {pinned}")
    for code, sample in probe.samples.items():
        print(f"  first {code}: {sample}")
    print(f"  FAILED executions' errors: {dict(probe.failures)}")
    print(f"  errors logged: {dict(logged)}")
    print(f"  after the storm: {dict(calm.answers)}, {dict(calm_status)}")
    print(f"  bad answers: {len(probe.bad)}")
    for line in probe.bad[:40]:
        print("   ", line)
    assert after is not None, "the service did not answer after the storm"
    assert not probe.bad
    assert calm_status == {"SUCCEEDED": len(turns)}, (calm.answers, calm_status)
    assert not running and staged == 0 and failed_kept == 0 and turns_without == 0
    assert history_wrong == history_twice == torn == 0 and not numbering
