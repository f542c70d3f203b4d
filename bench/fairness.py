"""One account floods, another is served: fairness between accounts under load.

Starts `engram serve` (as bench/http_load.py does: a subprocess on loopback, the static
embedder, its own embedded PostgreSQL in a /tmp/engram-fair-* directory), makes two accounts,
A and B, each with a client and an agent; A's agent gets --records records (with
--flooding-accounts 2, a third account C floods alongside A, its agent as big, its clients as
many: two accounts at their share of connections fill the pool). Then, for --seconds seconds
after a second of warm-up, it measures:

- B's small request (`action(actionId) { name }`, one client, every 50 ms), and
- GET /healthz (one client, every 50 ms),

first with nothing else running (quiet), then while A floods: --clients connections, each
sending A's heavy search back to back: a hybrid `searchMemories(first: 100)` of a
4,096-character query, `after` a forged cursor 9,000 records deep (the deepest a ranked
search pages is 10,000). A flooding client that is answered 429 sends again at once
(--honour-retry-after: after the Retry-After it was given). It prints p50/p95/worst of B's
requests and /healthz in both phases, and what A got: searches answered, 429s, other errors.

    python bench/fairness.py                             # this checkout, bounds as shipped
    python bench/fairness.py --flooding-accounts 2       # A and C flood together
    python bench/fairness.py --root /tmp/engram-before   # a checkout before the bounds
    python bench/fairness.py --clients 40 --seconds 20 --records 20000
"""

import argparse
import asyncio
import atexit
import json
import logging
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from http_load import TOKEN, Service, Words, free_port, one_request, vocabulary  # noqa: E402

from app.memory.search import RANKED, _search_key  # noqa: E402
from app.memory.search_store import Filters  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402

HARNESS = {"memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}}
EVERYTHING = [
    {"effect": "ALLOW", "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"], "resources": ["*"]}
]
ACCOUNT = "mutation($n: String!) { createAccount(input: {name: $n}) { accountId } }"
CLIENT = """mutation($a: UUID!, $p: String!, $policies: [PolicyInput!]!) {
  createClient(input: {accountId: $a, principal: $p, name: $p, policies: $policies}) { principal }
}"""
TOKEN_FOR = """mutation($a: UUID!, $p: String!) {
  createClientToken(accountId: $a, principal: $p) { token }
}"""
CREATE = "mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"
BULK = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { memoryIds }
}"""
HEAVY = """query($a: UUID!, $q: String!, $after: String!) {
  action(actionId: $a) { searchMemories(query: $q, mode: HYBRID, first: 100, after: $after) {
    edges { score node { memoryId summary } } } }
}"""
SMALL = "query($a: UUID!) { action(actionId: $a) { name } }"
_RETRY = re.compile(rb"\r\nretry-after: *(\d+)", re.IGNORECASE)
_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


def deep_cursor(account: str, action: str, query: str) -> str:
    """A cursor 9,000 records deep into the agent's hybrid search for `query` (operator's)."""
    key = _search_key(OperatorReader(UUID(account), UUID(action)), "hybrid", query, Filters())
    # No word weights or best score: each page weighs the query's words afresh.
    return RANKED.encode(key, 1.0, datetime.now(UTC), uuid4(), 9_000, None, None)


def gql(http: httpx.Client, token: str, query: str, **variables: Any) -> dict[str, Any]:
    body = http.post(
        "/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    if body.get("errors"):
        raise SystemExit(f"set-up failed: {str(body['errors'])[:500]}")
    return body["data"]


def tenant(http: httpx.Client, name: str) -> tuple[str, str]:
    """A new account with a client that may do anything in it: the account's ID and that
    client's token."""
    account = gql(http, TOKEN, ACCOUNT, n=name)["createAccount"]["accountId"]
    gql(http, TOKEN, CLIENT, a=account, p=f"{name}-client", policies=EVERYTHING)
    made = gql(http, TOKEN, TOKEN_FOR, a=account, p=f"{name}-client")
    return account, made["createClientToken"]["token"]


def agent(http: httpx.Client, token: str, records: int, words: Words) -> str:
    action = gql(http, token, CREATE, input={"name": "agent", "harness": HARNESS})
    action_id = action["createAction"]["actionId"]
    for start in range(0, records, 500):
        inputs = [
            {"summary": words.some(6, 12), "content": words.some(20, 60), "kind": "fact"}
            for _ in range(min(500, records - start))
        ]
        gql(http, token, BULK, a=action_id, inputs=inputs)
    return action_id


def request_bytes(host: str, port: int, token: str, query: str, **variables: Any) -> bytes:
    body = json.dumps({"query": query, "variables": variables}).encode()
    head = (
        f"POST /graphql HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def healthz_bytes(host: str, port: int) -> bytes:
    return f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


@dataclass
class Latencies:
    seconds: list[float] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        ordered = sorted(self.seconds) or [float("nan")]

        def at(q: float) -> float:
            return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        failed = f", failed {dict(self.failed)}" if self.failed else ""
        return (
            f"p50 {at(0.5):7.1f} ms  p95 {at(0.95):7.1f} ms  worst {1000 * ordered[-1]:7.0f} ms"
            f"  ({len(self.seconds)} answered{failed})"
        )


class Phase:
    def __init__(self) -> None:
        self.measuring = False
        self.stop = False
        self.small = Latencies()
        self.healthz = Latencies()
        self.flood: Counter[tuple[str, str]] = Counter()  # (account, outcome)


async def probe(host: str, port: int, request: bytes, into: Latencies, phase: Phase) -> None:
    """One request every 50 ms (after the previous one's answer), its latency kept."""
    while not phase.stop:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not phase.stop:
                started = time.perf_counter()
                status, body = await one_request(reader, writer, request)
                took = time.perf_counter() - started
                if phase.measuring:
                    if status == 200 and b'"errors"' not in body:
                        into.seconds.append(took)
                    else:
                        into.failed[f"HTTP {status}"] += 1
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            if phase.measuring:
                into.failed[type(e).__name__] += 1
        finally:
            writer.close()


async def flooder(
    host: str, port: int, account: str, request: bytes, phase: Phase, honour: bool
) -> None:
    """A flooding account's client: the heavy search back to back, on one connection (a new
    one if the service drops it, counted)."""
    while not phase.stop:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not phase.stop:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = _LENGTH.search(head)
                assert length is not None, head
                body = await reader.readexactly(int(length.group(1)))
                if phase.measuring:
                    ok = status == 200 and b'"errors"' not in body
                    phase.flood[account, "answered" if ok else f"HTTP {status}"] += 1
                retry = _RETRY.search(head)
                if honour and status == 429 and retry:
                    await asyncio.sleep(int(retry.group(1)))
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            if phase.measuring:
                phase.flood[account, type(e).__name__] += 1
        finally:
            writer.close()


async def measure(
    host: str, port: int, small: bytes, heavy: dict[str, bytes], args: argparse.Namespace
) -> Phase:
    phase = Phase()
    tasks = [
        asyncio.create_task(probe(host, port, small, phase.small, phase)),
        asyncio.create_task(probe(host, port, healthz_bytes(host, port), phase.healthz, phase)),
    ]
    tasks += [
        asyncio.create_task(flooder(host, port, name, request, phase, args.honour_retry_after))
        for name, request in heavy.items()
        for _ in range(args.clients)
    ]
    await asyncio.sleep(2.0)  # the flood fills the service first
    phase.measuring = True
    await asyncio.sleep(args.seconds)
    phase.measuring = False
    phase.stop = True
    await asyncio.gather(*tasks)
    return phase


@contextmanager
def warned_service(
    root: Path, assignments: list[str], prefix: str
) -> Iterator[tuple[Service, int]]:
    """`engram serve` of `root` logging at WARNING, with the `--set NAME=VALUE` settings, on a
    free port and a scratch data dir (removed at exit however the run ends): the service and its
    port. Once the block is done, what the service logged; if it fails, the end of its log."""
    data = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, data, ignore_errors=True)
    port = free_port()
    settings = {"ENGRAM_LOG_LEVEL": "WARNING"}
    settings |= {f"ENGRAM_{k.upper()}": v for k, v in (s.split("=", 1) for s in assignments)}
    service = Service(root, data, port, settings=settings)
    try:
        yield service, port
        logged = service.log.read_text().splitlines()
        if logged:
            print(f"the service logged {len(logged)} lines at WARNING or above; the last:")
            print("\n".join(logged[-15:]))
    except BaseException:
        print(f"the service's log ends:\n{service.log.read_text()[-3000:]}", file=sys.stderr)
        raise
    finally:
        service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument(
        "--clients", type=int, default=40, help="each flooding account's concurrent connections"
    )
    parser.add_argument(
        "--flooding-accounts", type=int, choices=(1, 2), default=1, help="A alone, or A and C"
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--honour-retry-after", action="store_true")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="an ENGRAM_ setting"
    )
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)

    with warned_service(args.root, args.set, "engram-fair-") as (service, port):
        words = Words(vocabulary(), seed=11)
        with httpx.Client(base_url=service.base, timeout=600) as http:
            flooding = {name: tenant(http, name) for name in "ac"[: args.flooding_accounts]}
            flooding_agents = {
                name: agent(http, token, args.records, words)
                for name, (_, token) in flooding.items()
            }
            _, b_token = tenant(http, "b")
            b_agent = agent(http, b_token, 50, words)
        query = words.some(2000, 2000)[:4096].strip()

        host = "127.0.0.1"
        heavy = {
            name.upper(): request_bytes(
                host,
                port,
                token,
                HEAVY,
                a=flooding_agents[name],
                q=query,
                after=deep_cursor(account, flooding_agents[name], query),
            )
            for name, (account, token) in flooding.items()
        }
        small = request_bytes(host, port, b_token, SMALL, a=b_agent)

        async def one_heavy() -> float:
            reader, writer = await asyncio.open_connection(host, port)
            started = time.perf_counter()
            status, body = await one_request(reader, writer, heavy["A"])
            writer.close()
            if status != 200 or b'"errors"' in body:
                raise SystemExit(f"A's search failed: {status} {body[:300]!r}")
            return time.perf_counter() - started

        alone = asyncio.run(one_heavy())
        honour = "honouring Retry-After" if args.honour_retry_after else "sending again at once"
        print(
            f"serving {args.root}; settings {args.set or 'as shipped'}; A: {args.records:,} "
            f"records, one heavy search alone {alone * 1000:.0f} ms; {args.clients} clients "
            f"of each of {', '.join(heavy)} {honour}; {args.seconds:.0f} s measured"
        )
        quiet = asyncio.run(measure(host, port, small, {}, args))
        flooded = asyncio.run(measure(host, port, small, heavy, args))
        print(f"quiet    B small   {quiet.small.line()}")
        print(f"quiet    /healthz  {quiet.healthz.line()}")
        print(f"flooded  B small   {flooded.small.line()}")
        print(f"flooded  /healthz  {flooded.healthz.line()}")
        for name in heavy:
            got = {k: v for (account, k), v in flooded.flood.items() if account == name}
            rate = {k: f"{v / args.seconds:.1f}/s" for k, v in sorted(got.items())}
            print(f"flooded  {name} heavy   {rate}")


if __name__ == "__main__":
    main()
