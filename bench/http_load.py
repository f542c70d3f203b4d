"""HTTP load: hybrid `searchMemories(first: 10)` over real HTTP against one `engram serve`.

Starts `engram serve` (`python -m app.cli serve`, a subprocess on loopback, the static
embedder) on its own embedded PostgreSQL in a /tmp/engram-http-* data directory, creates an
agent of --records records (addAgentMemories), then for each concurrency (1, 8, 32 clients by
default) and each of --rounds rounds sends hybrid searches for --seconds seconds, each
request a different query of 2 to 5 words, and prints:

- requests/s, p50/p95 latency and errors (HTTP status other than 200, or a body with
  `errors`);
- the service process's CPU per request: utime + stime of `engram serve` itself from
  /proc/<pid>/stat over the measured window, divided by the requests answered in it
  (PostgreSQL runs in its own processes and is excluded; the load generator too).

The load generator is a few lines of asyncio streams (one keep-alive HTTP/1.1 connection per
client, the request bytes built once per query), so that it takes little of the CPU.

With --profile N (default 2,000), the service is then started again on the same data under a
profiler, and N requests from one client show where one request's CPU goes: cProfile with a
thread-CPU clock in the event loop's thread (enabled only while the requests run), plus wall
timers around asyncpg's query methods (waiting on SQL) and a CPU timer around the embedder's
worker-thread call. The figures are cProfile's cumulative times of the entry points of each
stage, divided by N; cProfile slows Python code, so read them as shares.

    python bench/http_load.py                          # 1, 8, 32 clients, 3 rounds of 10 s
    python bench/http_load.py --seconds 4 --rounds 1   # quick
    python bench/http_load.py --baseline /tmp/engram-http-base   # against `git archive` of a commit
    python bench/http_load.py --query agent --gap 5  # a lighter request, 5 ms idle between

`--query` sends another request in place of the search, to split a request's cost: `one` (a
search answering one record, its score and ID), `agent` (the agent's name: its read alone) or
`typename` (`{ __typename }`: HTTP, middleware, token check, GraphQL). `--gap MS` makes each
client wait that long between its requests, leaving the machine idle meanwhile.
"""

import argparse
import asyncio
import atexit
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-http-load-admin-token-0123456789abcdef"
CREATE = """mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"""
BULK = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { memoryIds }
}"""
SEARCH = """query($a: UUID!, $q: String!) {
  action(actionId: $a) {
    searchMemories(query: $q, mode: HYBRID, first: 10) {
      edges { cursor score node { id memoryId summary content kind created labels { name value } } }
      pageInfo { hasNextPage endCursor }
    }
  }
}"""
QUERIES = {
    "search": SEARCH,
    "one": """query($a: UUID!, $q: String!) {
  action(actionId: $a) { searchMemories(query: $q, mode: HYBRID, first: 1) {
    edges { score node { memoryId } } } }
}""",
    "agent": "query($a: UUID!) { action(actionId: $a) { name } }",
    "typename": "query { __typename }",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads, none of its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the data ---------------------------------------------------------------------------------


def vocabulary() -> list[str]:
    """Whole words of the static model's vocabulary (records and queries draw from it)."""
    from app.embeddings.static import StaticEmbedder

    vocab = StaticEmbedder()._tokenizer.get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) >= 3)


class Words:
    """Words drawn as in language: the k-th most used about 1/k as often."""

    def __init__(self, words: list[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.order = words[:]
        self.rng.shuffle(self.order)
        self.weights = [1 / (k + 1) for k in range(len(self.order))]

    def some(self, low: int, high: int) -> str:
        k = self.rng.randint(low, high)
        return " ".join(self.rng.choices(self.order, self.weights, k=k))


def set_up(url: str, records: int, words: Words) -> str:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(headers=headers, timeout=120) as client:

        def gql(query: str, **variables: Any) -> dict[str, Any]:
            body = client.post(url, json={"query": query, "variables": variables}).json()
            if body.get("errors"):
                raise RuntimeError(str(body["errors"])[:500])
            return body["data"]

        harness = {"memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}}
        action_id = gql(CREATE, input={"name": "load", "instructions": "", "harness": harness})[
            "createAction"
        ]["actionId"]
        for start in range(0, records, 250):
            inputs = [
                {
                    "summary": words.some(8, 14) + f" #{i}",
                    "content": words.some(20, 40),
                    "kind": "fact",
                }
                for i in range(start, min(records, start + 250))
            ]
            gql(BULK, a=action_id, inputs=inputs)
    return action_id


# --- the service ------------------------------------------------------------------------------


class Service:
    """`engram serve` of the code at `root` as a subprocess; with `profile_out`, under this
    script's profiler."""

    def __init__(
        self,
        root: Path,
        data_dir: Path,
        port: int,
        profile_out: Path | None = None,
        path: str | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        """`settings`: more environment for the service (e.g. ENGRAM_DATABASE_URL)."""
        env = {
            **os.environ,
            "ENGRAM_DATA_DIR": str(data_dir),
            "ENGRAM_BOOTSTRAP_TOKEN": TOKEN,
            "ENGRAM_PORT": str(port),
            "ENGRAM_EMBEDDER": "static",
            "ENGRAM_SEARCH_MAINTENANCE_SECONDS": "0",
            "PYTHONPATH": os.pathsep.join([str(root)] + ([path] if path else [])),
            **(settings or {}),
        }
        if profile_out is None:
            command = [sys.executable, "-m", "app.cli", "serve"]
        else:
            command = [sys.executable, __file__, "--profiled-serve", str(profile_out)]
            command += ["--root", str(root)]
        self.log = data_dir / "serve.log"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise SystemExit(f"engram serve exited; see {self.log}")
                try:
                    if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            raise SystemExit(f"engram serve did not start in 120 s; see {self.log}")
        except BaseException:  # Ctrl-C too: a service stopped while it starts stops its server
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# --- the load ---------------------------------------------------------------------------------


@dataclass
class Window:
    """What one concurrency level measured in one round."""

    clients: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    cpu: float = 0.0

    @property
    def answered(self) -> int:
        return len(self.latencies) + sum(self.errors.values())

    @property
    def rate(self) -> float:
        return self.answered / self.seconds

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / max(1, self.answered)

    def at(self, q: float) -> float:
        ordered = sorted(self.latencies) or [float("nan")]
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Requests:
    """The bytes of requests (`--query`: the search by default), each with a query of its own."""

    def __init__(
        self, host: str, port: int, action_id: str, words: Words, count: int, query: str = SEARCH
    ) -> None:
        head = (
            f"POST /graphql HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            "Content-Length: {}\r\n\r\n"
        )
        self.items = []
        for _ in range(count):
            body = json.dumps(
                {"query": query, "variables": {"a": action_id, "q": words.some(2, 5)}}
            ).encode()
            self.items.append(head.format(len(body)).encode() + body)
        self.next = 0

    def take(self) -> bytes:
        item = self.items[self.next % len(self.items)]
        self.next += 1
        return item


_STATUS = re.compile(rb"HTTP/1\.1 (\d{3})")
_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


async def one_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = _STATUS.match(head)
    length = _LENGTH.search(head)
    if status is None or length is None:
        raise RuntimeError(f"unexpected response head: {head[:200]!r}")
    return int(status.group(1)), await reader.readexactly(int(length.group(1)))


async def load(
    host: str,
    port: int,
    requests: Requests,
    clients: int,
    seconds: float,
    pid: int,
    gap: float = 0.0,
) -> Window:
    """`clients` connections sending back to back, or `gap` seconds apart; the first second
    warms up, uncounted."""
    window = Window(clients)
    measuring = False
    stop = False

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not stop:
                if gap:
                    await asyncio.sleep(gap)
                started = time.perf_counter()
                status, body = await one_request(reader, writer, requests.take())
                if not measuring:
                    continue
                if status != 200:
                    window.errors[f"HTTP {status}"] += 1
                elif b'"errors"' in body:
                    code = re.search(rb'"code": *"(\w+)"', body)
                    window.errors[code.group(1).decode() if code else "error"] += 1
                else:
                    window.latencies.append(time.perf_counter() - started)
        finally:
            writer.close()

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(1.0)
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    measuring = True
    await asyncio.sleep(seconds)
    measuring = False
    window.cpu, window.seconds = cpu_seconds(pid) - cpu0, time.perf_counter() - t0
    stop = True
    await asyncio.gather(*tasks)
    return window


async def check_answer(host: str, port: int, requests: Requests, query: str = "search") -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        status, body = await one_request(reader, writer, requests.take())
    finally:
        writer.close()
    data = json.loads(body)
    if query in ("agent", "typename"):
        if status != 200 or data.get("errors") or not data.get("data"):
            raise SystemExit(f"the request failed: {status} {body[:500]!r}")
        return
    edges = (((data.get("data") or {}).get("action") or {}).get("searchMemories") or {}).get(
        "edges"
    )
    want = 10 if query == "search" else 1
    if status != 200 or data.get("errors") or not edges or len(edges) != want:
        raise SystemExit(f"the search did not answer {want} records: {status} {body[:500]!r}")


# --- the profile ------------------------------------------------------------------------------

# Spans: (label, module, attribute path, kind). Each wraps a function of the service with a
# timer of the event loop thread's CPU (time.thread_time); one client at a time, so what runs
# on the thread between a coroutine's start and end is that request's work.
SPANS = [
    ("ASGI app (all but HTTP server)", "app.observability.requests", "Observe.__call__", "async"),
    ("auth (token check)", "app.main", "authenticate", "async"),
    ("GraphQL in all (strawberry execute)", "strawberry.schema.schema", "Schema.execute", "async"),
    ("GraphQL parse", "strawberry.schema.schema", "parse", "sync"),
    ("GraphQL validation", "strawberry.schema.schema", "validate_document", "sync"),
    ("resolver: action (load the agent)", "app.actions.service", "get_action", "async"),
    ("resolver: search (domain call)", "app.memory.search", "search_as_operator", "async"),
    (
        "  of which the query's embedding",
        "app.observability.embedding",
        "MeteredEmbedder.embed",
        "async",
    ),
    ("  of which SQL (ranked, asyncpg side)", "app.memory.search", "ranked", "async"),
    ("response JSON (encode)", "strawberry.http.base", "BaseView.encode_json", "sync"),
    ("access log line", "app.observability.requests", "log.info", "sync"),
]


def profiled_serve(out: Path, root: Path) -> int:
    """`engram serve` in this process with SPANS timed between SIGUSR1 and SIGUSR2, plus the
    wall time of asyncpg's query methods (waiting on SQL) and the embedder's worker-thread CPU."""
    import importlib

    import asyncpg

    sys.path.insert(0, str(root))
    from app.cli import main
    from app.embeddings.static import StaticEmbedder

    totals: dict[str, float] = {"sql_wall": 0.0, "sql_calls": 0, "embed_cpu": 0.0}
    on = False

    def wrap(label: str, fn: Any, kind: str, clock: Any = time.thread_time) -> Any:
        totals[label] = 0.0
        if kind == "async":

            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                started = clock()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    if on:
                        totals[label] += clock() - started

            return timed_async

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                if on:
                    totals[label] += clock() - started

        return timed

    for label, module, path, kind in SPANS:
        try:
            owner: Any = importlib.import_module(module)
        except ImportError:
            continue
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        if hasattr(owner, name):
            setattr(owner, name, wrap(label, getattr(owner, name), kind))
    for name in ("execute", "fetch", "fetchrow", "fetchval"):
        method = getattr(asyncpg.Connection, name)
        setattr(asyncpg.Connection, name, wrap(f"sql {name}", method, "async", time.perf_counter))

    embed = StaticEmbedder._embed

    def timed_embed(self: Any, texts: list[str]) -> Any:
        started = time.thread_time()
        try:
            return embed(self, texts)
        finally:
            if on and threading.current_thread() is not threading.main_thread():
                totals["embed_cpu"] += time.thread_time() - started

    StaticEmbedder._embed = timed_embed  # type: ignore[method-assign]

    import gc

    collecting: list[float] = []

    def collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting[:] = [time.thread_time()]
        elif on and collecting:
            totals["garbage collection"] = totals.get("garbage collection", 0.0) + (
                time.thread_time() - collecting[0]
            )

    gc.callbacks.append(collection)

    def start(*_: Any) -> None:
        nonlocal on
        on = True

    def finish(*_: Any) -> None:
        nonlocal on
        on = False
        out.write_text(json.dumps(totals))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, finish)
    return main(["serve"])


def report_profile(out: Path, requests: int, cpu_ms: float, profiled_ms: float) -> None:
    totals = json.loads(out.read_text())
    ms = 1000 / requests
    print(
        f"where one request's CPU goes ({requests} requests from 1 client; thread-CPU spans; "
        f"the service's CPU in this run {profiled_ms:.3f} ms/request, unprofiled {cpu_ms:.3f}):"
    )
    for label, *_ in SPANS:
        if label in totals:
            print(f"  {label:42} {totals[label] * ms:6.3f} ms")
    print(f"  {'embedding (worker thread CPU)':42} {totals['embed_cpu'] * ms:6.3f} ms")
    gc_ms = totals.get("garbage collection", 0.0) * ms
    print(f"  {'garbage collection (anywhere)':42} {gc_ms:6.3f} ms")
    app = totals.get(SPANS[0][0], 0.0) * ms
    rest = profiled_ms - app - totals["embed_cpu"] * ms
    print(f"  {'HTTP server, event loop (the rest)':42} {rest:6.3f} ms")
    calls = {k[4:]: v * ms for k, v in totals.items() if k.startswith("sql ")}
    each = ", ".join(f"{k} {v:.2f}" for k, v in calls.items())
    print(f"  {'waiting on SQL (wall, all queries)':42} {sum(calls.values()):6.3f} ms  ({each})")


async def profile_run(host: str, port: int, requests: Requests, n: int, pid: int) -> float:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for _ in range(50):  # warm
            await one_request(reader, writer, requests.take())
        os.kill(pid, signal.SIGUSR1)
        await asyncio.sleep(0.2)
        cpu0 = cpu_seconds(pid)
        for _ in range(n):
            await one_request(reader, writer, requests.take())
        cpu = cpu_seconds(pid) - cpu0
        os.kill(pid, signal.SIGUSR2)
        await asyncio.sleep(0.5)
    finally:
        writer.close()
    return 1000 * cpu / n


# --- main -------------------------------------------------------------------------------------


@dataclass
class Target:
    """One checkout's service under test, with its own data and port."""

    label: str
    root: Path
    data_dir: Path
    port: int = field(default_factory=free_port)
    service: Service | None = None
    requests: Requests | None = None
    windows: dict[int, list[Window]] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per level")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the levels (medians)")
    p.add_argument("--profile", type=int, default=2000, help="requests profiled (0: none)")
    p.add_argument(
        "--query", choices=sorted(QUERIES), default="search", help="the request sent (above)"
    )
    p.add_argument("--gap", type=float, default=0.0, help="ms each client waits between requests")
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="a checkout of other code (e.g. `git archive` of an earlier commit) whose service "
        "is measured alternately with this one's, level by level, on the same data",
    )
    p.add_argument(
        "--baseline-path", help="more PYTHONPATH for the baseline's service (other packages)"
    )
    p.add_argument("--data-dir", type=Path, help="default: a new /tmp/engram-http-* directory")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument("--profiled-serve", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.profiled_serve:
        return profiled_serve(args.profiled_serve, args.root)

    logging.getLogger("httpx").setLevel(logging.WARNING)
    levels = [int(c) for c in args.concurrency.split(",")]
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="engram-http-"))
    if args.data_dir is None and not args.keep:
        atexit.register(shutil.rmtree, data_dir, ignore_errors=True)  # however the run ends
    targets = [Target("this", ROOT, data_dir / "this")]
    if args.baseline:
        targets.append(Target("baseline", args.baseline.resolve(), data_dir / "baseline"))
    host = "127.0.0.1"
    vocab = vocabulary()
    try:
        for t in targets:
            t.data_dir.mkdir(parents=True, exist_ok=True)
            path = args.baseline_path if t.label == "baseline" else None
            t.service = Service(t.root, t.data_dir, t.port, path=path)
            words = Words(vocab, seed=7)  # the same records and queries for every target
            started = time.perf_counter()
            action_id = set_up(f"{t.service.base}/graphql", args.records, words)
            print(
                f"http_load [{t.label}: {t.root}]: engram serve (pid {t.service.pid}), "
                f"{args.records} records in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
            t.requests = Requests(host, t.port, action_id, words, 20_000, QUERIES[args.query])
            asyncio.run(check_answer(host, t.port, t.requests, args.query))
            t.windows = {c: [] for c in levels}
        what = "hybrid searchMemories(first: 10)" if args.query == "search" else args.query
        print(
            f"{what}, {args.seconds:g} s per level, {args.rounds} rounds"
            + (f", {args.gap:g} ms between requests" if args.gap else "")
            + (", targets alternating" if len(targets) > 1 else "")
        )
        for round_ in range(args.rounds):
            for clients in levels:
                for t in targets:
                    assert t.service is not None and t.requests is not None
                    w = asyncio.run(
                        load(
                            host,
                            t.port,
                            t.requests,
                            clients,
                            args.seconds,
                            t.service.pid,
                            args.gap / 1000,
                        )
                    )
                    t.windows[clients].append(w)
                    errors = ", ".join(f"{k} {v}" for k, v in w.errors.items()) or "0"
                    print(
                        f"  round {round_ + 1} {t.label:8} clients {clients:3}: "
                        f"{w.rate:7.1f} req/s  p50 {w.at(0.5):6.2f}  p95 {w.at(0.95):6.2f} ms  "
                        f"errors {errors}  service CPU {w.cpu_ms:.3f} ms/req",
                        flush=True,
                    )
        print("medians over rounds:")
        print("  target   clients   req/s   p50 ms   p95 ms  errors  service CPU ms/req")
        for clients in levels:
            for t in targets:
                ws = t.windows[clients]
                print(
                    f"  {t.label:8} {clients:7} {median(w.rate for w in ws):7.1f} "
                    f"{median(w.at(0.5) for w in ws):8.2f} "
                    f"{median(w.at(0.95) for w in ws):8.2f} "
                    f"{sum(sum(w.errors.values()) for w in ws):7} "
                    f"{median(w.cpu_ms for w in ws):19.3f}"
                )
        if len(targets) > 1:
            ratios = [
                median(w.cpu_ms for w in targets[0].windows[c])
                / median(w.cpu_ms for w in targets[1].windows[c])
                for c in levels
            ]
            print(
                "  service CPU per request, this / baseline: "
                + ", ".join(f"{r:.2f} ({c} clients)" for r, c in zip(ratios, levels, strict=True))
            )
    finally:
        for t in targets:
            if t.service is not None:
                t.service.stop()
    for t in targets if args.profile else []:
        assert t.requests is not None
        out = t.data_dir / "spans.json"
        t.service = Service(t.root, t.data_dir, t.port, profile_out=out)
        try:
            profiled = asyncio.run(
                profile_run(host, t.port, t.requests, args.profile, t.service.pid)
            )
        finally:
            t.service.stop()
        print(f"[{t.label}] ", end="")
        report_profile(out, args.profile, median(w.cpu_ms for w in t.windows[levels[0]]), profiled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
