"""Strangers flood, a tenant is served: requests with random bearer tokens against one account.

Starts `engram serve` as bench/fairness.py does (a subprocess on loopback, the static
embedder, its own embedded PostgreSQL in a /tmp/engram-strangers-* directory), makes account B
with a client and an agent of --records records, then for --seconds seconds after two seconds
of warm-up measures, one client each, every 50 ms:

- B's small request (`action(actionId) { name }`),
- B's search (a hybrid `searchMemories(first: 10)` of three words), and
- GET /healthz,

in each phase of each of --rounds rounds: quiet; while another process floods with no
Authorization header (refused before the database); while it floods with a random bearer
token each request (`eng_` and 43 random characters, as a real token: each one looked up).
The flooding process (this script again, `--flood`) keeps --clients connections busy back to
back, half of them POSTing a small query to /graphql, half a `tools/list` to /mcp/<B's agent>.
It prints p50/p95/worst of each probe in each phase, what the flood was answered, and the
load average.

    python bench/strangers.py                      # 128 flooding connections, 20 s a phase
    python bench/strangers.py --clients 200 --seconds 15 --rounds 2
    python bench/strangers.py --root /tmp/engram-before
"""

import argparse
import asyncio
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from fairness import (  # noqa: E402
    SMALL,
    Latencies,
    agent,
    healthz_bytes,
    request_bytes,
    tenant,
    warned_service,
)
from http_load import Words, vocabulary  # noqa: E402

SEARCH = """query($a: UUID!, $q: String!) {
  action(actionId: $a) { searchMemories(query: $q, mode: HYBRID, first: 10) {
    edges { score node { memoryId summary } } } }
}"""
KINDS = ("no header", "random tokens")
LIST_TOOLS = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
QUERY = json.dumps({"query": "{ viewer { principal } }"}).encode()


def stranger_request(host: str, port: int, path: str, body: bytes, token: bool) -> bytes:
    auth = f"Authorization: Bearer eng_{secrets.token_urlsafe(32)}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """An HTTP answer's head and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


async def stranger(
    host: str, port: int, path: str, body: bytes, token: bool, until: float, got: Counter[str]
) -> None:
    """One flooding connection: a request back to back, a new token each (a new connection if
    the service closes it, counted)."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as e:
            got[type(e).__name__] += 1
            await asyncio.sleep(0.01)
            continue
        try:
            while time.monotonic() < until:
                writer.write(stranger_request(host, port, path, body, token))
                head, _ = await answer(reader)
                got[f"HTTP {int(head[9:12])}"] += 1
                if b"connection: close" in head.lower():
                    break
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            got[type(e).__name__] += 1
        finally:
            writer.close()


def flood(args: argparse.Namespace) -> None:
    """The flooding process: --clients connections for --seconds, then its counts as JSON."""
    host, token = "127.0.0.1", args.flood == "token"
    got: Counter[str] = Counter()
    until = time.monotonic() + args.seconds

    async def run() -> None:
        targets = [("/graphql", QUERY), (f"/mcp/{args.action}", LIST_TOOLS)]
        await asyncio.gather(
            *(
                stranger(host, args.port, *targets[i % 2], token, until, got)
                for i in range(args.clients)
            )
        )

    asyncio.run(run())
    print(json.dumps(got))


class Probes:
    def __init__(self) -> None:
        self.measuring = False
        self.stop = False
        self.of: dict[str, Latencies] = {}


async def probe(host: str, port: int, request: bytes, into: Latencies, phase: Probes) -> None:
    """One request every 50 ms after the previous one's answer, its latency kept; an answer
    later than 10 s counts as a timeout."""
    while not phase.stop:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not phase.stop:
                started = time.perf_counter()
                async with asyncio.timeout(10):
                    writer.write(request)
                    head, body = await answer(reader)
                took = time.perf_counter() - started
                if phase.measuring:
                    status = int(head[9:12])
                    if status == 200 and b'"errors"' not in body:
                        into.seconds.append(took)
                    else:
                        into.failed[f"HTTP {status} {body[:80]!r}"] += 1
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError) as e:
            if phase.measuring:
                into.failed[type(e).__name__] += 1
        finally:
            writer.close()


async def measure(host: str, port: int, probes: dict[str, bytes], seconds: float) -> Probes:
    phase = Probes()
    phase.of = {name: Latencies() for name in probes}
    tasks = [
        asyncio.create_task(probe(host, port, request, phase.of[name], phase))
        for name, request in probes.items()
    ]
    await asyncio.sleep(2.0)  # the flood, if any, fills the service first
    phase.measuring = True
    await asyncio.sleep(seconds)
    phase.measuring = False
    phase.stop = True
    await asyncio.gather(*tasks)
    return phase


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--records", type=int, default=1_000)
    parser.add_argument("--clients", type=int, default=128, help="flooding connections")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="an ENGRAM_ setting"
    )
    parser.add_argument("--flood", choices=("none", "token"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--action", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood:
        flood(args)
        return
    logging.getLogger("httpx").setLevel(logging.WARNING)

    with warned_service(args.root, args.set, "engram-strangers-") as (service, port):
        words = Words(vocabulary(), seed=11)
        with httpx.Client(base_url=service.base, timeout=600) as http:
            _, b_token = tenant(http, "b")
            b_agent = agent(http, b_token, args.records, words)
        host = "127.0.0.1"
        probes = {
            "B small ": request_bytes(host, port, b_token, SMALL, a=b_agent),
            "B search": request_bytes(host, port, b_token, SEARCH, a=b_agent, q=words.some(3, 3)),
            "/healthz": healthz_bytes(host, port),
        }
        print(
            f"serving {args.root}; settings {args.set or 'as shipped'}; B: {args.records:,} "
            f"records; {args.clients} flooding connections in another process; "
            f"{args.seconds:.0f} s measured a phase"
        )
        for round_ in range(args.rounds):
            for kind, flag in (("quiet", None), *zip(KINDS, ("none", "token"), strict=True)):
                flooder = None
                if flag is not None:
                    command = [sys.executable, __file__, "--flood", flag, "--port", str(port)]
                    command += ["--action", b_agent, "--clients", str(args.clients)]
                    command += ["--seconds", str(args.seconds + 3)]
                    flooder = subprocess.Popen(
                        command, stdout=subprocess.PIPE, text=True, env=os.environ
                    )
                phase = asyncio.run(measure(host, port, probes, args.seconds))
                loaded = load_average()
                flooded: dict[str, Any] = {}
                if flooder is not None:
                    out, _ = flooder.communicate(timeout=120)
                    flooded = json.loads(out)
                for name, latencies in phase.of.items():
                    print(f"round {round_ + 1} {kind:13} {name} {latencies.line()}")
                total = sum(flooded.values())
                rate = {k: f"{v / (args.seconds + 3):.0f}/s" for k, v in sorted(flooded.items())}
                print(
                    f"round {round_ + 1} {kind:13} flood answered {rate or '-'} ({total:,}); "
                    f"load average {loaded}"
                )


if __name__ == "__main__":
    main()
