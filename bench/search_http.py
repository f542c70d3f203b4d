"""searchMemories over HTTP at every agent size of bench/search_scale.py's data set.

Serves the data set that `bench/search_scale.py` loaded under --data-dir (same --scale) with
`engram serve` of the source tree at --root (this repository by default; a `git archive` of
an earlier commit measures that commit), ENGRAM_DATABASE_URL pointing at the bench's server
and the static embedder the data was loaded with. Then, one client on one keep-alive
connection, it times `searchMemories(query, mode, first: 10)` end to end, the query's
embedding included: hybrid, lexical and vector, per agent size, on the agents and questions
that search_scale.py's warm run searches (so most searches of a 1,000-record agent are its
first in the process), after a warm-up on other agents.

To reach the bench's agents over the API it adds, once, what the bench's bulk load leaves out:
an `action_versions` row for each agent (a copy of one made with createAction) and a client
`bench-search` allowed SELECT on everything in each bench account, with a token
(createClient, createClientToken as the bootstrap admin); search_scale.py reads neither.

    python bench/search_http.py --locomo PATH --data-dir DIR                 # full size
    python bench/search_http.py --locomo PATH --data-dir DIR --scale 0.05 --queries 40
    python bench/search_http.py --locomo PATH --data-dir DIR --root /tmp/base --json before.json
    python bench/search_http.py --locomo PATH --data-dir DIR --cold          # and cold first

With --cold it first restarts the server with the OS page cache dropped (when this process
may: root) and starts the service without prewarm, and times the first search of agents the
warm run leaves alone. The server keeps search_scale.py's settings (shared_buffers 8GB ...).
"""

import argparse
import asyncio
import http.client
import json
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import search_scale  # noqa: E402
from common import (  # noqa: E402
    add_locomo_argument,
    load_locomo,
    percentiles,
    restart_cold,
    summary,
    write_json,
)
from http_load import TOKEN, Service, free_port  # noqa: E402
from search_scale import (  # noqa: E402
    SERVER_SETTINGS,
    Agent,
    Group,
    Pick,
    Plan,
    cold_agents,
    groups_of,
    locomo_questions,
    prewarm,
    warm_picks,
)

from app.db.embedded import EmbeddedPostgres  # noqa: E402

SEARCH = """query($a: UUID!, $q: String!, $m: ActionAgentMemorySearchMode!) {
  action(actionId: $a) {
    searchMemories(query: $q, mode: $m, first: 10) {
      edges { cursor score node { id memoryId summary content kind created labels { name value } } }
    }
  }
}"""
MODES = ("hybrid", "lexical", "vector")
PRINCIPAL = "bench-search"
HARNESS = {"memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}}


def gql(base: str, token: str, query: str, **variables: Any) -> dict[str, Any]:
    body = httpx.post(
        f"{base}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    ).json()
    if body.get("errors"):
        raise RuntimeError(json.dumps(body["errors"])[:500])
    return body["data"]


def set_up(base: str, url: str, plan: Plan) -> dict[uuid.UUID, str]:
    """What the API needs to reach the bench's agents; a token per bench account."""

    async def versions() -> int:
        conn = await asyncpg.connect(url)
        try:
            missing = await conn.fetchval(
                "SELECT count(*) FROM actions a WHERE a.account_id = ANY($1::uuid[]) "
                "AND NOT EXISTS (SELECT 1 FROM action_versions v "
                "WHERE v.account_id = a.account_id AND v.action_id = a.action_id)",
                plan.accounts,
            )
            if not missing:
                return 0
            template = gql(
                base,
                TOKEN,
                "mutation($i: ActionInput!) { createAction(input: $i) { actionId } }",
                i={"name": "bench search template", "instructions": "", "harness": HARNESS},
            )["createAction"]["actionId"]
            columns = await conn.fetch(
                "SELECT quote_ident(column_name) AS name FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = 'action_versions' "
                "AND column_name NOT IN ('account_id', 'action_id', 'version')"
            )
            names = ", ".join(c["name"] for c in columns)
            copied = ", ".join(f"t.{c['name']}" for c in columns)
            done = await conn.execute(
                f"INSERT INTO action_versions (account_id, action_id, version, {names}) "
                f"SELECT a.account_id, a.action_id, a.current_version, {copied} "
                "FROM actions a, action_versions t "
                "WHERE t.action_id = $1 AND a.account_id = ANY($2::uuid[]) "
                "AND NOT EXISTS (SELECT 1 FROM action_versions v "
                "WHERE v.account_id = a.account_id AND v.action_id = a.action_id)",
                uuid.UUID(template),
                plan.accounts,
            )
            return int(done.split()[-1])
        finally:
            await conn.close()

    added = asyncio.run(versions())
    if added:
        print(f"  gave {added:,} bench agents an action_versions row (the API reads it)")
    tokens = {}
    for account in plan.accounts:
        try:
            gql(
                base,
                TOKEN,
                "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
                i={
                    "accountId": str(account),
                    "principal": PRINCIPAL,
                    "name": "search benchmark",
                    "policies": [{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["*"]}],
                },
            )
        except RuntimeError as e:
            if "CONFLICT" not in str(e):
                raise
        tokens[account] = gql(
            base,
            TOKEN,
            "mutation($p: String!, $a: UUID) "
            "{ createClientToken(principal: $p, accountId: $a) { token } }",
            p=PRINCIPAL,
            a=str(account),
        )["createClientToken"]["token"]
    return tokens


class Client:
    """One keep-alive HTTP/1.1 connection sending searchMemories, timed end to end."""

    def __init__(self, port: int, tokens: dict[uuid.UUID, str], questions: list[str]) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.tokens = tokens
        self.questions = questions
        self.errors = 0
        self.short = 0

    def search(self, agent: Agent, question: int, mode: str) -> float:
        """Milliseconds for one search (an error is counted, and timed all the same; a lexical
        search may find fewer than 10 records sharing a word with the question: counted too)."""
        account, action, _ = agent
        body = json.dumps(
            {
                "query": SEARCH,
                "variables": {"a": str(action), "q": self.questions[question], "m": mode.upper()},
            }
        )
        headers = {
            "Authorization": f"Bearer {self.tokens[account]}",
            "Content-Type": "application/json",
        }
        t = time.perf_counter()
        self.connection.request("POST", "/graphql", body, headers)
        response = self.connection.getresponse()
        answer = response.read()
        elapsed = (time.perf_counter() - t) * 1000
        found = json.loads(answer)
        edges = (((found.get("data") or {}).get("action") or {}).get("searchMemories") or {}).get(
            "edges"
        )
        if response.status != 200 or found.get("errors") or edges is None:
            self.errors += 1
            if self.errors <= 3:
                print(f"  unexpected answer: {response.status} {answer[:300]!r}")
        elif len(edges) < 10:
            self.short += 1
        return elapsed


def measure_cold(
    client: Client, groups: list[Group], picks: list[list[Pick]], per_mode: int, note: str
) -> dict[str, dict[str, dict[str, float]]]:
    """As search_scale.measure_cold, over HTTP: the first searchMemories of agents."""
    questions = len(client.questions)
    figures: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\ncold: the first searchMemories of an agent ({note}; no prewarm)")
    q = 0
    for (title, size, agents), warm in zip(groups, picks, strict=True):
        chosen = cold_agents(agents, warm, per_mode * 3)
        if len(chosen) < 3 and len(agents) > 1:
            print(f"  {title}: skipped, the warm run searches (nearly) every one of them")
            continue
        if len(agents) == 1:
            first = client.search(chosen[0], q % questions, "hybrid")
            rest = [
                client.search(chosen[0], (q + 1 + i) % questions, MODES[i % 3]) for i in range(9)
            ]
            q += 10
            print(f"  {title}: cold first searchMemories (hybrid) {first:.2f} ms")
            print(f"    cold next 9 (modes in turn): {percentiles(rest)}")
            figures[str(size)] = {"first hybrid": summary([first]), "next 9": summary(rest)}
            continue
        print(f"  {title}, {len(chosen) // 3} distinct agents per mode:")
        found = {}
        for i, mode in enumerate(MODES):
            samples = []
            for agent in chosen[i::3]:
                samples.append(client.search(agent, q % questions, mode))
                q += 1
            print(f"    cold {mode:8s} first searchMemories  {percentiles(samples)}")
            found[mode] = summary(samples)
        figures[str(size)] = found
    return figures


def measure(
    client: Client, groups: list[Group], picks: list[list[Pick]], per_mode: int
) -> dict[str, dict[str, dict[str, float]]]:
    """Per agent size, each mode's latency; modes rotated so that none always meets the
    agent's pages first."""
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for (title, size, agents), warm in zip(groups, picks, strict=True):
        # Warm-up: the service's code paths, on agents the measured searches leave alone.
        for i, agent in enumerate((cold_agents(agents, warm, per_mode * 3) or agents)[:10]):
            client.search(agent, i, MODES[i % 3])
        timings: dict[str, list[float]] = {mode: [] for mode in MODES}
        for i, (agent, q) in enumerate(warm):
            for mode in MODES[i % 3 :] + MODES[: i % 3]:
                timings[mode].append(client.search(agent, q, mode))
        print(f"\n{title}")
        for mode, samples in timings.items():
            print(f"  searchMemories {mode:8s} first: 10  {percentiles(samples)}")
        figures[str(size)] = {mode: summary(samples) for mode, samples in timings.items()}
    return figures


def serve_and_measure(
    pg: EmbeddedPostgres,
    data_dir: Path,
    plan: Plan,
    root: Path,
    questions: list[str],
    groups: list[Group],
    picks: list[list[Pick]],
    cold: bool,
    cold_agents: int,
) -> tuple[dict[str, Any], EmbeddedPostgres]:
    """Serves the bench's database with `engram serve` of `root` and times searchMemories
    (with `cold`, the cold first searches first); the figures, and the server (restarted
    when cold)."""
    url = pg.uri(plan.database)
    port = free_port()
    service_settings = {"ENGRAM_DATABASE_URL": url}
    service = Service(root, data_dir, port, settings=service_settings)
    figures: dict[str, Any] = {}
    try:
        tokens = set_up(service.base, url, plan)
        if cold:
            service.stop()
            pg, note = restart_cold(pg, data_dir, SERVER_SETTINGS)
            url = service_settings["ENGRAM_DATABASE_URL"] = pg.uri(plan.database)
            service = Service(root, data_dir, port, settings=service_settings)
            client = Client(port, tokens, questions)
            figures["http_cold"] = measure_cold(client, groups, picks, cold_agents, note)
            figures["cold_note"] = note
        else:
            client = Client(port, tokens, questions)
        asyncio.run(prewarm(url))
        # The prewarm can outlast the service's keep-alive (uvicorn's 5 s), which then closes
        # the idle connection: the next request connects afresh (before the warm-up).
        client.connection.close()
        figures["http"] = measure(client, groups, picks, cold_agents)
        figures["http_errors"] = client.errors
        print(
            f"\n{client.errors} errors; {client.short} searches found fewer than 10 records "
            "(a lexical search of a question sharing no word with 10 records)"
        )
    finally:
        service.stop()
    return figures, pg


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_locomo_argument(parser)
    parser.add_argument("--scale", type=float, default=1.0, help="as search_scale.py's (1.0)")
    parser.add_argument(
        "--data-dir", type=Path, required=True, help="where search_scale.py loaded the data set"
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the source tree to serve (this repository)"
    )
    parser.add_argument("--queries", type=int, default=200, help="searches per agent group")
    parser.add_argument(
        "--sizes", default="", help="only agents of these sizes, e.g. 1000,200000 (default: all)"
    )
    parser.add_argument("--cold", action="store_true", help="first, the cold first searches")
    parser.add_argument(
        "--cold-agents",
        type=int,
        default=50,
        help="with --cold: distinct agents per mode among the 1,000-record ones (50)",
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the figures here (search_compare.py)"
    )
    args = parser.parse_args()
    search_scale.SAMPLES[:] = load_locomo(args.locomo)
    command = "python bench/search_http.py " + shlex.join(sys.argv[1:])
    print(f"# {command}")
    plan = Plan(args.scale)
    root = args.root.resolve()
    print(f"# engram serve of {root}, {plan.total:,} records of database {plan.database}")

    pg = search_scale.server(args.data_dir)
    url = pg.uri(plan.database)

    async def loaded() -> bool:
        conn = await asyncpg.connect(pg.uri())
        try:
            if not await conn.fetchval(
                "SELECT 1 FROM pg_database WHERE datname = $1", plan.database
            ):
                return False
        finally:
            await conn.close()
        conn = await asyncpg.connect(url)
        try:
            return bool(await conn.fetchval("SELECT to_regclass('bench_figures') IS NOT NULL"))
        finally:
            await conn.close()

    if not asyncio.run(loaded()):
        raise SystemExit(
            f"no data set of --scale {args.scale} under {args.data_dir}: "
            "load it with bench/search_scale.py --load-only first"
        )
    sizes = {int(x) for x in args.sizes.split(",") if x}
    groups = groups_of(plan, sizes or None)
    questions = locomo_questions()
    picks = warm_picks(groups, args.queries, len(questions))
    figures, pg = serve_and_measure(
        pg, args.data_dir, plan, root, questions, groups, picks, args.cold, args.cold_agents
    )
    figures |= {"command": command, "root": str(root), "records": plan.total}
    print(f"\nreproduce: {command}")
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
