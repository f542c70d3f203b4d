"""One tenant's request against everyone's service: what a hostile request costs the others.

Starts `engram serve` (as bench/http_load.py does: a subprocess on loopback, the static
embedder, its own embedded PostgreSQL in a /tmp/engram-limits-* directory), gives one agent
--records records of about --content characters each (addAgentMemories), then sends each
attack below once, as that tenant, while another thread asks GET /healthz every 50 ms (it
needs the event loop and a pooled connection, as every tenant's request does). For each it
prints how long the attack took, its answer's size and error code, and /healthz's p50 and
worst latency meanwhile:

- `loop`: `memories(first: N) { nodes { action { memories(first: N) { nodes { summary
  content } } } } }`, a record's agent listing its records (N = --page);
- `searches`: --searches aliased lexical `searchMemories` of a 4,096-character query;
- `fragments`: fragment i spreading fragment i - 1 twice, --fragments levels;
- `answer`: --aliases aliases of `actions(first: 1000) { nodes { instructions } }`, over
  --agents agents of --instructions characters each (createAction): few objects, much text
  (9,009 objects, about 590 MB, under ENGRAM_MAX_QUERY_NODES; ENGRAM_MAX_ANSWER_BYTES bounds it).

Each line also gives the service process's peak resident memory during the attack (sampled
every 50 ms from /proc, and its high-water mark, reset before each attack) and before it.

With --no-limits, ENGRAM_MAX_QUERY_NODES and ENGRAM_MAX_QUERY_SEARCHES are raised out of
reach (the fragment check is no setting: compare with --root of a checkout before it).

    python bench/request_limits.py                      # the limits as shipped
    python bench/request_limits.py --no-limits          # the answer and search attacks run
    python bench/request_limits.py --root /tmp/engram-main --no-limits --fragments 20
    python bench/request_limits.py --only answer --records 0 --root /tmp/engram-main   # before
    python bench/request_limits.py --only answer --records 0                          # after
"""

import argparse
import atexit
import contextlib
import logging
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from http_load import TOKEN, Service, Words, free_port, vocabulary  # noqa: E402

CREATE = """mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"""
BULK = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { executionId }
}"""
HARNESS = {"memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}}
LOOP = """query($a: UUID!, $n: Int!) { action(actionId: $a) { memories(first: $n) {
  nodes { action { memories(first: $n) { nodes { summary content } } } } } } }"""


def memory(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status (VmRSS, VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


class Rss:
    """The process's resident memory every 50 ms in a thread, the most kept."""

    def __init__(self, pid: int) -> None:
        self.pid, self.done = pid, False
        with contextlib.suppress(OSError):  # resets VmHWM to the current RSS (Linux 4.0 on)
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        self.before = self.most = memory(pid, "VmRSS")
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done:
            self.most = max(self.most, memory(self.pid, "VmRSS"))
            time.sleep(0.05)

    def stop(self) -> str:
        self.done = True
        self.thread.join()
        most = max(self.most, memory(self.pid, "VmHWM"))
        return f"RSS {self.before / 2**20:.0f} MB before, peak {most / 2**20:.0f} MB"


class Healthz:
    """GET /healthz every 50 ms in a thread, each answer's latency kept."""

    def __init__(self, base: str) -> None:
        self.base, self.latencies, self.done = base, [], False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        with httpx.Client(timeout=600) as client:
            while not self.done:
                started = time.perf_counter()
                client.get(f"{self.base}/healthz")
                self.latencies.append(time.perf_counter() - started)
                time.sleep(0.05)

    def stop(self) -> str:
        self.done = True
        self.thread.join()
        lat = sorted(self.latencies)
        return f"/healthz p50 {median(lat) * 1000:.1f} ms, worst {lat[-1] * 1000:.0f} ms"


def attack(service: Service, name: str, query: str, variables: dict) -> None:
    base = service.base
    rss = Rss(service.process.pid)
    watch = Healthz(base)
    time.sleep(0.5)
    started = time.perf_counter()
    answer = httpx.post(
        f"{base}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=3600,
    )
    took = time.perf_counter() - started
    time.sleep(0.3)
    body = answer.json()
    code = (body.get("errors") or [{}])[0].get("extensions", {}).get("code", "OK")
    print(
        f"{name:<10} {took:8.2f} s  {len(answer.content) / 1e6:9.2f} MB  {code:<12} "
        f"{watch.stop()}; {rss.stop()}"
    )


def agents(http: httpx.Client, count: int, characters: int) -> None:
    """`count` more agents of `characters` characters of instructions each (createAction)."""
    started = time.perf_counter()
    for i in range(count):
        text = (f"agent {i}: " + "answer in full sentences. " * (characters // 26 + 1))[:characters]
        body = {"name": f"agent {i}", "instructions": text, "harness": HARNESS}
        created = http.post("/graphql", json={"query": CREATE, "variables": {"input": body}})
        assert not created.json().get("errors"), created.json()
    took = time.perf_counter() - started
    print(f"{count:,} agents of {characters:,} characters of instructions in {took:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--content", type=int, default=400, help="characters a record")
    parser.add_argument("--page", type=int, default=1000)
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--fragments", type=int, default=30)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--instructions", type=int, default=65_000, help="characters an agent")
    parser.add_argument("--aliases", type=int, default=9)
    parser.add_argument(
        "--only", choices=["loop", "searches", "fragments", "answer"], action="append"
    )
    parser.add_argument("--no-limits", action="store_true")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line a /healthz otherwise

    data = Path(tempfile.mkdtemp(prefix="engram-limits-"))
    atexit.register(shutil.rmtree, data, ignore_errors=True)  # however the run ends
    settings = {"ENGRAM_LOG_LEVEL": "WARNING"}
    if args.no_limits:
        settings |= {"ENGRAM_MAX_QUERY_NODES": str(10**15), "ENGRAM_MAX_QUERY_SEARCHES": "1000"}
    service = Service(args.root, data, free_port(), settings=settings)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=service.base, headers=headers, timeout=600) as http:
            created = http.post(
                "/graphql",
                json={
                    "query": CREATE,
                    "variables": {"input": {"name": "tenant", "harness": HARNESS}},
                },
            ).json()
            action = created["data"]["createAction"]["actionId"]
            words = Words(vocabulary(), seed=7)
            batch = max(1, min(1000, 900_000 // (args.content + 200)))
            for start in range(0, args.records, batch):
                inputs = [
                    {
                        "summary": words.some(4, 8),
                        "content": words.some(1, 1000)[: args.content],
                        "kind": "fact",
                        "scope": "AGENT",
                    }  # fmt: skip
                    for _ in range(min(batch, args.records - start))
                ]
                loaded = http.post(
                    "/graphql", json={"query": BULK, "variables": {"a": action, "inputs": inputs}}
                ).json()
                assert not loaded.get("errors"), loaded
            only = set(args.only or ["loop", "searches", "fragments", "answer"])
            if "answer" in only:
                agents(http, args.agents, args.instructions)
        print(
            f"{args.records:,} records of about {args.content} characters; "
            f"limits {'raised' if args.no_limits else 'as shipped'}; serving {args.root}"
        )
        if "loop" in only:
            attack(service, "loop", LOOP, {"a": action, "n": args.page})
        if "searches" in only:
            query = words.some(2000, 2000)[:4096]
            fields = " ".join(
                f"s{i}: searchMemories(query: $q, mode: LEXICAL, first: 100) "
                "{ nodes { memoryId } }"
                for i in range(args.searches)
            )
            searches = f"query($a: UUID!, $q: String!) {{ action(actionId: $a) {{ {fields} }} }}"
            attack(service, "searches", searches, {"a": action, "q": query})
        if "fragments" in only:
            k = args.fragments
            doubling = ["fragment F0 on Query { viewer { principal } }"] + [
                f"fragment F{i} on Query {{ ...F{i - 1} ...F{i - 1} }}" for i in range(1, k + 1)
            ]
            attack(service, "fragments", f"query {{ ...F{k} }} " + " ".join(doubling), {})
        if "answer" in only:
            pages = " ".join(
                f"a{i}: actions(first: 1000) {{ nodes {{ instructions }} }}"
                for i in range(args.aliases)
            )
            attack(service, "answer", f"{{ {pages} }}", {})
    finally:
        service.stop()


if __name__ == "__main__":
    main()
