"""Token commits: what the token check in every turn's commit costs when many turns of one
client commit at once.

A turn's commit locks its client's row FOR SHARE and its token's FOR KEY SHARE (auth/store.py
`share_token`, and the `held` part of executions/store.py `commit_turn`), so that a revocation
or a change of grants either committed first or waits for it. Commits that overlap share-lock
the same client row, which PostgreSQL records as a MultiXact (a new one each time the lockers
change), writing the row's page and WAL. This measures it over real HTTP.

Starts `engram serve` (`python -m app.cli serve`, the static embedder) of this code and, with
--baseline, of other code (e.g. a worktree of the commit before the check), each on its own
embedded PostgreSQL in a /tmp/engram-token-commits-* directory, with a pool of 72 connections
and no account bound below 64 turns in flight (so no turn is refused or waits for a place),
against the tests' scripted model server (bench/turn_overhead.py's `InstantModel`, answering
at once, in a process of its own). In each it creates two agents and 8 clients (each holding
every grant, each one token):

- off: memory off, one model call; the commit is one statement (`commit_turn`).
- on:  memory on (agent scope read and written) with the add_memory tool: the model calls it
       once, then answers; the memory review finds nothing. The commit is a transaction
       (the check first, then the staged record, the transcript, the turn).

Then, for each round, agent, layout (`one`: every turn sends the token of one client; `eight`:
turn i of a level sends client i % 8's) and concurrency (1, 8, 32, 64 turns in flight), it
runs --turns turns (executeAction, each in a new session) against each service in turn,
alternating which goes first, and prints turns/s, p50/p95 latency, and what the service's
PostgreSQL did per 1,000 turns: MultiXacts created (`mxid_age` of the first one, read before
and after), their members (`pg_get_multixact_members`), and WAL bytes (the server's WAL insert
position, read before and after: every writer's, autovacuum's too). The machine's load
(`uptime`) is printed before and after.

With --lock-only, it measures PostgreSQL alone instead, on its own embedded server with two
tables shaped as `clients` and `client_tokens` and one client and token: N connections each
commit, as fast as they can for --seconds, a transaction inserting one 200-byte row, with
(`share`) or without (`none`) `share_token`'s statement first, alternating, and prints
transactions/s, p50/p95 and MultiXacts and their members per transaction.

    python bench/token_commits.py --baseline /tmp/engram-before   # a checkout of other code
    python bench/token_commits.py --lock-only --rounds 3
    python bench/token_commits.py --turns 200 --rounds 3 --levels 1,8,32,64
"""

import argparse
import asyncio
import atexit
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from http_load import TOKEN, Service, free_port  # noqa: E402
from turn_overhead import serve_model  # noqa: E402

from app.db.embedded import EmbeddedPostgres  # noqa: E402

CREATE = "mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"
CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { principal } }"
ISSUE = "mutation($p: String!) { createClientToken(principal: $p) { token } }"
EXECUTE = """mutation($input: ExecuteActionInput!) { executeAction(input: $input) {
  status error } }"""
EVERYTHING = {
    "effect": "ALLOW",
    "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"],
    "resources": ["financial.*"],
}
AGENTS = {
    "off": {},
    "on": {
        "memory": {
            "enabled": True,
            "scope": {"read": ["agent"], "write": ["agent"]},
            "tools": ["add_memory"],
        }
    },
}
CLIENTS = 8
COUNTED = """SELECT mxid_age('1'::xid)::bigint,
    pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"""


@dataclass
class Target:
    label: str
    root: Path
    data_dir: Path
    pg: EmbeddedPostgres | None = None
    service: Service | None = None
    agents: dict[str, str] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)


@dataclass
class Window:
    seconds: float
    latencies: list[float]  # ms
    errors: int
    multixacts: int
    members: int
    wal: int

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def at(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def set_up(t: Target, model_url: str) -> None:
    assert t.pg is not None
    t.pg_uri = t.pg.uri()  # type: ignore[attr-defined]
    settings = {
        "ENGRAM_DATABASE_URL": t.pg.uri(),
        "ENGRAM_MODEL_BASE_URL": model_url,
        "ENGRAM_MODEL_MAX_RETRIES": "0",
        # Every turn in flight holds a connection when it commits, none waits for a place.
        "ENGRAM_POOL_MAX_SIZE": "72",
        "ENGRAM_MAX_CONNECTIONS_PER_ACCOUNT": "72",
        "ENGRAM_MAX_TURNS_PER_ACCOUNT": "64",
        "ENGRAM_MAX_REQUESTS_PER_ACCOUNT": "256",
        "ENGRAM_ACCOUNT_QUEUE_SECONDS": "60",
    }
    t.service = Service(t.root, t.data_dir, free_port(), settings=settings)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=t.service.base, headers=headers, timeout=60) as client:

        def gql(query: str, **variables: Any) -> dict[str, Any]:
            body = client.post("/graphql", json={"query": query, "variables": variables}).json()
            if body.get("errors"):
                raise RuntimeError(str(body["errors"])[:500])
            return body["data"]

        for name, harness in AGENTS.items():
            created = gql(CREATE, input={"name": name, "instructions": "", "harness": harness})
            t.agents[name] = created["createAction"]["actionId"]
        for i in range(CLIENTS):
            principal = f"bench-{i}"
            gql(CLIENT, input={"principal": principal, "name": principal, "policies": [EVERYTHING]})
            t.tokens.append(gql(ISSUE, p=principal)["createClientToken"]["token"])


# The members of the MultiXacts numbered $1 to $2 (each lists every transaction then locking
# the row, so k commits overlapping on one row write about k members each).
MEMBERS = """SELECT count(*) FROM generate_series($1::bigint, $2::bigint) m,
    pg_get_multixact_members(m::text::xid)"""


async def counted(uri: str) -> tuple[int, int]:
    """The last MultiXact's number (none wrapped around yet) and the WAL insert position."""
    conn = await asyncpg.connect(uri)
    try:
        row = await conn.fetchrow(COUNTED)
        return row[0], row[1]
    finally:
        await conn.close()


async def members(uri: str, first: int, last: int) -> int:
    conn = await asyncpg.connect(uri)
    try:
        return await conn.fetchval(MEMBERS, first, last) if last >= first else 0
    finally:
        await conn.close()


async def run(t: Target, agent: str, layout: str, level: int, turns: int) -> Window:
    assert t.service is not None
    latencies: list[float] = []
    errors = 0
    queue = iter(range(turns))
    action_id = t.agents[agent]

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal errors
        for i in queue:
            token = t.tokens[0 if layout == "one" else i % CLIENTS]
            turn = {"actionId": action_id, "sessionId": uuid.uuid4().hex, "input": f"note {i}"}
            started = time.perf_counter()
            try:
                response = await http.post(
                    "/graphql",
                    json={"query": EXECUTE, "variables": {"input": turn}},
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.TransportError as e:  # e.g. a keep-alive connection the server closed
                said = f"{type(e).__name__}"
            else:
                body = response.json() if response.status_code == 200 else {}
                done = (body.get("data") or {}).get("executeAction") or {}
                if done.get("status") == "SUCCEEDED":
                    latencies.append(1000 * (time.perf_counter() - started))
                    continue
                said = f"{response.status_code} {str(body)[:300]}"
            errors += 1
            if errors == 1:
                print(f"  error: {said}", flush=True)

    uri = t.pg_uri  # type: ignore[attr-defined]
    limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
    async with httpx.AsyncClient(base_url=t.service.base, timeout=120, limits=limits) as http:
        # One turn first, untimed, so that each connection of the level is open.
        await http.post("/graphql", json={"query": "{ __typename }"})
        mx0, wal0 = await counted(uri)
        started = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(level)))
        seconds = time.perf_counter() - started
        mx1, wal1 = await counted(uri)
        held = await members(uri, mx0 + 1, mx1)
    return Window(seconds, latencies, errors, mx1 - mx0, held, wal1 - wal0)


LOCK_TABLES = """
CREATE TABLE clients (account_id uuid, principal text, policies jsonb,
    PRIMARY KEY (account_id, principal));
CREATE TABLE client_tokens (token_id uuid PRIMARY KEY, account_id uuid, principal text,
    last_used timestamptz,
    FOREIGN KEY (account_id, principal) REFERENCES clients ON DELETE CASCADE);
CREATE TABLE work (id bigserial PRIMARY KEY, data text);
"""
SHARE = """SELECT c.policies FROM clients c
JOIN client_tokens t ON t.account_id = c.account_id AND t.principal = c.principal
WHERE c.account_id = $1 AND c.principal = $2 AND t.token_id = $3
FOR SHARE OF c FOR KEY SHARE OF t"""


async def lock_window(
    uri: str, share: bool, n: int, seconds: float, key: tuple[Any, ...]
) -> list[float]:
    """One level: [transactions/s, p50 ms, p95 ms, MultiXacts and members per transaction]."""
    pool = await asyncpg.create_pool(uri, min_size=n, max_size=n)
    latencies: list[float] = []
    until = time.perf_counter() + seconds

    async def worker() -> None:
        async with pool.acquire() as conn:
            while time.perf_counter() < until:
                started = time.perf_counter()
                async with conn.transaction():
                    if share:
                        await conn.fetchrow(SHARE, *key)
                    await conn.execute("INSERT INTO work (data) VALUES ($1)", "x" * 200)
                latencies.append(1000 * (time.perf_counter() - started))

    try:
        mx0, _ = await counted(uri)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(n)))
        elapsed = time.perf_counter() - started
        mx1, _ = await counted(uri)
        held = await members(uri, mx0 + 1, mx1)
    finally:
        await pool.close()
    latencies.sort()
    done = len(latencies)
    at = [latencies[min(done - 1, int(q * done))] for q in (0.5, 0.95)]
    return [done / elapsed, *at, (mx1 - mx0) / done, held / done]


def lock_only(data_dir: Path, levels: list[int], rounds: int, seconds: float) -> None:
    pg = EmbeddedPostgres(data_dir / "pgdata")
    key = (uuid.uuid4(), "bench-0", uuid.uuid4())

    async def set_up() -> None:
        conn = await asyncpg.connect(pg.uri())
        try:
            await conn.execute(LOCK_TABLES)
            await conn.execute("INSERT INTO clients VALUES ($1, $2, '[]')", *key[:2])
            await conn.execute("INSERT INTO client_tokens VALUES ($3, $1, $2, now())", *key)
        finally:
            await conn.close()

    figures: dict[tuple[str, int], list[list[float]]] = {}
    try:
        asyncio.run(set_up())
        print(f"lock only, {seconds:g} s a level, {rounds} rounds; load before: {uptime()}")
        for round_ in range(rounds):
            for n in levels:
                order = ["none", "share"] if (round_ + n) % 2 == 0 else ["share", "none"]
                for variant in order:
                    f = asyncio.run(lock_window(pg.uri(), variant == "share", n, seconds, key))
                    figures.setdefault((variant, n), []).append(f)
                    print(
                        f"  round {round_ + 1} {variant:5} x{n:<2}: {f[0]:6.0f} transactions/s, "
                        f"p50 {f[1]:.2f} ms, p95 {f[2]:.2f} ms, {f[3]:.2f} multixacts "
                        f"({f[4]:.1f} members) a transaction",
                        flush=True,
                    )
        print(f"load after: {uptime()}")
        print("\nmedians (transactions/s, p50 ms, p95 ms, multixacts and members a transaction):")
        for n in levels:
            cells = []
            for variant in ("none", "share"):
                fs = figures[(variant, n)]
                m = [median(f[i] for f in fs) for i in range(5)]
                cells.append(
                    f"{variant} {m[0]:6.0f} {m[1]:6.2f} {m[2]:6.2f} {m[3]:5.2f} {m[4]:5.1f}"
                )
            print(f"  x{n:<2}  " + "  |  ".join(cells))
    finally:
        pg.stop()


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of other code to compare")
    parser.add_argument("--turns", type=int, default=200, help="turns per window (200)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (2)")
    parser.add_argument("--levels", default="1,8,32,64", help="turns in flight (1,8,32,64)")
    parser.add_argument("--agents", default="off,on", help="which agents (off,on)")
    parser.add_argument("--layouts", default="one,eight", help="which layouts (one,eight)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("--lock-only", action="store_true", help="PostgreSQL alone (see above)")
    parser.add_argument("--seconds", type=float, default=3.0, help="--lock-only: a level's (3)")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    agents = args.agents.split(",")
    layouts = args.layouts.split(",")

    data_dir = Path(tempfile.mkdtemp(prefix="engram-token-commits-"))
    if not args.keep:
        atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    if args.lock_only:
        lock_only(data_dir, levels, args.rounds, args.seconds)
        return 0
    targets = [Target("this", ROOT, data_dir / "this")]
    if args.baseline:
        targets.append(Target("baseline", args.baseline.resolve(), data_dir / "baseline"))

    ports: Any = multiprocessing.Queue()
    stop = multiprocessing.Event()
    model = multiprocessing.Process(target=serve_model, args=(ports, stop), daemon=True)
    model.start()
    model_url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    windows: dict[tuple[str, str, str, int], list[Window]] = {}
    try:
        for t in targets:
            t.data_dir.mkdir(parents=True)
            t.pg = EmbeddedPostgres(t.data_dir / "pgdata")
            set_up(t, model_url)
            print(f"token_commits [{t.label}: {t.root}]: engram serve pid {t.service.pid}")  # type: ignore[union-attr]
        print(f"{args.turns} turns a window, {args.rounds} rounds; load before: {uptime()}")
        for round_ in range(args.rounds):
            for agent in agents:
                for layout in layouts:
                    for level in levels:
                        order = targets if (round_ + level) % 2 == 0 else targets[::-1]
                        for t in order:
                            w = asyncio.run(run(t, agent, layout, level, args.turns))
                            windows.setdefault((t.label, agent, layout, level), []).append(w)
                            print(
                                f"  round {round_ + 1} {t.label:8} memory {agent:3} "
                                f"{layout:5} x{level:<2}: {w.rate:6.1f} turns/s, "
                                f"p50 {w.at(0.5):6.1f} ms, p95 {w.at(0.95):6.1f} ms, "
                                f"{w.errors} errors, "
                                f"{1000 * w.multixacts / args.turns:6.0f} multixacts "
                                f"({1000 * w.members / args.turns:6.0f} members) and "
                                f"{w.wal / args.turns:6.0f} kB WAL / 1,000 turns",
                                flush=True,
                            )
        print(f"load after: {uptime()}")
        print(
            "\nmedians over rounds (turns/s, p50 ms, p95 ms; multixacts, their members and"
            " WAL MB per 1,000 turns):"
        )
        for agent in agents:
            for layout in layouts:
                for level in levels:
                    cells = []
                    for t in targets:
                        ws = windows[(t.label, agent, layout, level)]
                        cells.append(
                            f"{t.label} {median(w.rate for w in ws):6.1f} "
                            f"{median(w.at(0.5) for w in ws):6.1f} "
                            f"{median(w.at(0.95) for w in ws):6.1f} "
                            f"{median(1000 * w.multixacts / args.turns for w in ws):6.0f} "
                            f"{median(1000 * w.members / args.turns for w in ws):6.0f} "
                            f"{median(w.wal / args.turns / 1000 for w in ws):5.2f}"
                        )
                    print(f"  memory {agent:3} {layout:5} x{level:<2}  " + "  |  ".join(cells))
    finally:
        for t in targets:
            if t.service is not None:
                t.service.stop()
            if t.pg is not None:
                t.pg.stop()
        stop.set()
        model.join(timeout=10)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
