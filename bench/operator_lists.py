"""Operator listings at scale: nested connections (statements per page of parents), a bulk
memory write, a long agent listing, and a client's token listing.

Builds (once, then reuses) a dedicated embedded PostgreSQL under --data-dir holding one agent
with --sessions sessions of --executions executions each and --records memory records (every
third one corrected once, so it has two versions), --agents more agents (the 50 newest with
--agent-records records each, every third labelled), and one client with
--tokens tokens (rows written with SQL: none of the reads looks at their text). Then, in
process through the whole GraphQL layer (`schema.execute` with a `Context`, as the service
runs it), as the default account's admin:

- `nested`: each nested shape (a page of parents, each asking a page of children), its p50 /
  p95 ms and the statements it sends to PostgreSQL (pool resets excluded);
- `bulk`: `addAgentMemories` of 1,000 records into a fresh agent, p50 over --runs / 10 runs,
  and where the time goes: the SQL as the driver times it, the process's CPU, the static
  embedder alone, cProfile of one run (--profile);
- `actions`: `actions(first: 1000)` p50 against the actions layer alone, cProfile (--profile);
- `tokens`: a page of the client with --tokens tokens, and the plans of the token page
  statement for its first page and a page from the middle.

    python bench/operator_lists.py                  # every part
    python bench/operator_lists.py --part nested --part tokens
    python bench/operator_lists.py --part bulk --runs 100 --profile
"""

import argparse
import asyncio
import cProfile
import io
import pstats
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import percentiles, tuned_server  # noqa: E402

from app.actions import service as actions  # noqa: E402
from app.auth import service as auth_service  # noqa: E402
from app.auth.caller import Caller  # noqa: E402
from app.auth.policies import ADMIN_POLICIES  # noqa: E402
from app.auth.service import ensure_default_account  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import migrate  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.setup import ensure_model  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.graphql.context import Context  # noqa: E402
from app.graphql.schema import schema  # noqa: E402
from app.memory.vectors import VECTOR_COLUMNS  # noqa: E402
from app.state import AppState  # noqa: E402

SERVER_SETTINGS = {
    "shared_buffers": "512MB",
    "work_mem": "16MB",
    "random_page_cost": "1.1",
    "synchronous_commit": "off",
}
HARNESS = {
    "memory": {
        "enabled": True,
        "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        "labels": {"customer_id": {"number": 5, "description": "The customer."}},
    }
}
LISTED = 50  # the agents `actions(first: 50)` lists: the newest, each with --agent-records
PAGE_INFO = "pageInfo { hasNextPage endCursor }"
EXECUTION = "executionId status kind turn created"
NESTED = {
    "sessions(50) { executions(5) }": f"""query($a: UUID!) {{ action(actionId: $a) {{
      sessions(first: 50) {{ nodes {{ sessionId
        executions(first: 5) {{ nodes {{ {EXECUTION} }} {PAGE_INFO} }} }} }} }} }}""",
    "sessions(50) { history(5) }": f"""query($a: UUID!) {{ action(actionId: $a) {{
      sessions(first: 50) {{ nodes {{ sessionId
        history(first: 5) {{ nodes {{ eventId text }} {PAGE_INFO} }} }} }} }} }}""",
    "memories(100) { history(3) }": f"""query($a: UUID!) {{ action(actionId: $a) {{
      memories(first: 100) {{ nodes {{ memoryId
        history(first: 3) {{ nodes {{ version status }} {PAGE_INFO} }} }} }} }} }}""",
    "executions(50) { action session }": """query($a: UUID!) { action(actionId: $a) {
      executions(first: 50) { nodes { executionId action { name } session { turns } } } } }""",
    "actions(50) { sessions(5) }": f"""query {{ actions(first: 50) {{ nodes {{ actionId
      sessions(first: 5) {{ nodes {{ sessionId }} {PAGE_INFO} }} }} }} }}""",
    "actions(50) { executions(5) }": f"""query {{ actions(first: 50) {{ nodes {{ actionId
      executions(first: 5) {{ nodes {{ executionId }} {PAGE_INFO} }} }} }} }}""",
    "actions(50) { memories(5) }": f"""query {{ actions(first: 50) {{ nodes {{ actionId
      memories(first: 5) {{ nodes {{ memoryId }} {PAGE_INFO} }} }} }} }}""",
    'actions(50) { memories(5, kind: "fact") }': f"""query {{ actions(first: 50) {{ nodes {{
      actionId memories(first: 5, kind: "fact") {{ nodes {{ memoryId }} {PAGE_INFO} }} }} }} }}""",
    "actions(50) { memories(5, labels: c1) }": f"""query {{ actions(first: 50) {{ nodes {{
      actionId memories(first: 5, labels: [{{name: "customer_id", value: "c1"}}]) {{
        nodes {{ memoryId }} {PAGE_INFO} }} }} }} }}""",
    "clients(100) { tokens(5) }": f"""query {{ clients(first: 100) {{ nodes {{ principal
      tokens(first: 5) {{ nodes {{ tokenId }} {PAGE_INFO} }} }} }} }}""",
}
ACTIONS = """query { actions(first: 1000) { edges { cursor node { id actionId version
  currentVersion name instructions model harness created modified createdBy } }
  pageInfo { hasNextPage endCursor } } }"""
BULK = """mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { executionId memoryIds } }"""
TEXT = """customer account invoice refund shipping order delayed prefers phone email escalate
manager contract renewal discount address changed payment failed card expired support ticket
priority warehouse Oslo Berlin Lisbon weekly report meeting Monday deadline password reset login
error billing cycle annual plan upgrade downgrade trial"""
WORDS = TEXT.split()


def server(data_dir: Path):  # type: ignore[no-untyped-def]
    return tuned_server(data_dir, SERVER_SETTINGS)


def text(i: int, words: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 13) % len(WORDS)] for k in range(words))


async def load(state: AppState, admin: Caller, args: argparse.Namespace) -> None:
    pool = state.pool
    main = await actions.create_action(
        pool, admin, name="main", instructions="", model=None, harness=HARNESS
    )
    others = [
        await actions.create_action(
            pool, admin, name=f"agent {i}", instructions="", model=None, harness=HARNESS
        )
        for i in range(args.agents)
    ]
    account, agent = admin.account_id, main.action_id
    async with pool.acquire() as conn:
        # Sessions a minute apart, their executions a second apart, newest last.
        await conn.execute(
            """
            INSERT INTO sessions (account_id, action_id, session_id, turns, created, modified)
            SELECT $1, $2, 'session-' || s, $4, now() - make_interval(mins => $3 - s), now()
            FROM generate_series(1, $3) s
            """,
            account,
            agent,
            args.sessions,
            args.executions,
        )
        await conn.execute(
            """
            INSERT INTO executions (account_id, action_id, execution_id, action_version,
                session_id, turn, invocation_number, kind, status, preview, principal, input,
                output, created, modified)
            SELECT $1, $2, gen_random_uuid(), 1, 'session-' || s, t, 1, 'TURN', 'SUCCEEDED',
                false, 'admin', to_jsonb('hello ' || t), to_jsonb('hi'::text),
                now() - make_interval(mins => $3 - s, secs => $4 - t), now()
            FROM generate_series(1, $3) s, generate_series(1, $4) t
            """,
            account,
            agent,
            args.sessions,
            args.executions,
        )
        # Every other agent: a session with one execution.
        await conn.execute(
            """
            INSERT INTO sessions (account_id, action_id, session_id, turns)
            SELECT account_id, action_id, 'only', 1 FROM actions
            WHERE account_id = $1 AND action_id <> $2
            """,
            account,
            agent,
        )
        await conn.execute(
            """
            INSERT INTO executions (account_id, action_id, execution_id, action_version,
                session_id, turn, invocation_number, kind, status, preview, principal, input)
            SELECT account_id, action_id, gen_random_uuid(), 1, 'only', 1, 1, 'TURN',
                'SUCCEEDED', false, 'admin', '"hello"'::jsonb
            FROM actions WHERE account_id = $1 AND action_id <> $2
            """,
            account,
            agent,
        )
        await auth_service.create_client(
            pool, admin, account_id=None, principal="busy", name="busy", policies=[]
        )
        for i in range(99):
            await auth_service.create_client(
                pool, admin, account_id=None, principal=f"client-{i}", name="c", policies=[]
            )
            await auth_service.issue_client_token(
                pool, admin, account_id=None, principal=f"client-{i}"
            )
        await conn.execute(
            """
            INSERT INTO client_tokens (token_hash, account_id, principal, created, prefix)
            SELECT sha256(convert_to('busy ' || n, 'UTF8')), $1, 'busy',
                now() - make_interval(secs => n), 'eng_busy'
            FROM generate_series(1, $2) n
            """,
            account,
            args.tokens,
        )
    # Records through the API: every third one corrected once (replaces), so two versions.
    gql = runner(state, admin)
    made = 0
    while made < args.records:
        n = min(500, args.records - made)
        inputs = [{"summary": text(made + i, 10), "kind": "fact"} for i in range(n)]
        ids = (await gql(BULK, a=str(agent), inputs=inputs))["addAgentMemories"]["memoryIds"]
        fixes = [
            {"summary": text(made + i, 11), "kind": "fact", "replaces": m}
            for i, m in enumerate(ids)
            if i % 3 == 0
        ]
        await gql(BULK, a=str(agent), inputs=fixes)
        made += n
    # The agents a page of 50 lists: records of two kinds, every third with a customer label.
    for agent_version in others[-LISTED:]:
        inputs = [
            {"summary": text(i, 8), "kind": ("fact", "event")[i % 2]}
            | ({"labels": [{"name": "customer_id", "value": f"c{i % 2}"}]} if i % 3 == 0 else {})
            for i in range(args.agent_records)
        ]
        if inputs:
            await gql(BULK, a=str(agent_version.action_id), inputs=inputs)
    async with pool.acquire() as conn:
        for table in ("sessions", "executions", "client_tokens", "agent_memories", "actions"):
            await conn.execute(f"VACUUM ANALYZE {table}")


def runner(state: AppState, who: Caller) -> Callable[..., Awaitable[dict[str, Any]]]:
    async def run(query: str, **variables: Any) -> dict[str, Any]:
        # A context per request, as the service makes: its DataLoaders cache for one request.
        result = await schema.execute(
            query, variable_values=variables, context_value=Context(state, who)
        )
        assert not result.errors, result.errors
        assert result.data is not None
        return result.data

    return run


async def statements_sent(pool: asyncpg.Pool, work: Callable[[], Awaitable[Any]]) -> int:
    """How many statements `work` sends, besides the reset of a connection coming back."""
    sent: list[Any] = []
    async with pool.acquire() as conn:
        reset = conn.get_reset_query()
    await logging_sql(pool, sent)
    try:
        await work()
    finally:
        await logging_sql(pool, None)
    return len([q for q in sent if q.query != reset])


async def timings(work: Callable[[], Awaitable[Any]], runs: int) -> list[float]:
    for _ in range(5):
        await work()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        await work()
        samples.append((time.perf_counter() - t) * 1000)
    return samples


async def profile_of(work: Callable[[], Awaitable[Any]], top: int) -> str:
    """cProfile's top functions (by own time) of one run of `work`."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        await work()
    finally:
        profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


async def logging_sql(pool: asyncpg.Pool, sink: list[Any] | None) -> None:
    """Logs every statement of the pool's connections into `sink` (None: stops)."""
    held = [await pool.acquire() for _ in range(pool.get_max_size())]
    try:
        for conn in held:
            for logger in list(conn._query_loggers):  # type: ignore[attr-defined]
                conn.remove_query_logger(logger.cb)
            if sink is not None:
                conn.add_query_logger(sink.append)
    finally:
        for conn in reversed(held):
            await pool.release(conn)


async def nested(state: AppState, admin: Caller, agent: str, runs: int) -> None:
    run = runner(state, admin)
    print(f"\n{'nested shape':<40} {'statements':>10}   ms over --runs")
    for name, query in NESTED.items():
        variables = {"a": agent} if "$a" in query else {}
        # Timed first: every connection has read the driver's type information by the count.
        samples = await timings(lambda q=query, v=variables: run(q, **v), runs)
        count = await statements_sent(state.pool, lambda q=query, v=variables: run(q, **v))
        print(f"  {name:<38} {count:>10}   {percentiles(samples)}")


async def bulk(state: AppState, admin: Caller, runs: int, profile: bool) -> None:
    run = runner(state, admin)
    inputs = [
        {"summary": text(i, 12), "content": text(i + 1, 30), "kind": "fact"} for i in range(1000)
    ]

    async def fresh_agent() -> str:
        made = await actions.create_action(
            state.pool, admin, name="bulk", instructions="", model=None, harness=HARNESS
        )
        return str(made.action_id)

    samples, cpu, sql, statements = [], [], [], []
    for _ in range(runs):
        a = await fresh_agent()
        logged: list[Any] = []
        await logging_sql(state.pool, logged)
        t, c = time.perf_counter(), time.process_time()
        await run(BULK, a=a, inputs=inputs)
        samples.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
        await logging_sql(state.pool, None)
        sql.append(sum(q.elapsed for q in logged) * 1000)
        statements.append(len(logged))
    embedder = state.embedder
    assert embedder is not None
    texts = [f"{i['summary']}\n{i['content']}" for i in inputs]
    t = time.perf_counter()
    await embedder.embed(texts)
    embed_ms = (time.perf_counter() - t) * 1000
    print("\naddAgentMemories, 1,000 records (summary 12 words, content 30), fresh agent each:")
    print(f"  whole mutation      {percentiles(samples)}")
    print(f"  records/s (p50)     {1000 / statistics.median(samples) * 1000:,.0f}")
    print(f"  CPU of this process p50 {statistics.median(cpu):.1f} ms (embedding included)")
    print(
        f"  SQL (as the driver times it) p50 {statistics.median(sql):.1f} ms, "
        f"{statistics.median(statements):.0f} statements"
    )
    print(f"  embedding alone     {embed_ms:.1f} ms (the static embedder, 1,000 texts)")
    if profile:
        a = await fresh_agent()
        print(await profile_of(lambda: run(BULK, a=a, inputs=inputs), 45))


async def listing(state: AppState, admin: Caller, runs: int, profile: bool) -> None:
    run = runner(state, admin)
    samples = await timings(lambda: run(ACTIONS), runs)
    async with state.pool.acquire() as conn:
        sql = await timings(
            lambda: actions.list_actions(state.pool, admin, limit=1001, after=None), runs
        )
        count = await conn.fetchval("SELECT count(*) FROM actions")
    print(f"\nactions(first: 1000) of {count:,} agents (every document field):")
    print(f"  GraphQL             {percentiles(samples)}")
    print(f"  actions layer alone {percentiles(sql)}")
    if profile:
        print(await profile_of(lambda: run(ACTIONS), 35))


# The statement of app/auth/store.py's list_token_pages, explained (one page asked).
TOKEN_PAGE = """
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT k.n, t.* FROM unnest($2::text[], $3::timestamptz[], $4::uuid[], $5::int[])
    WITH ORDINALITY AS k(principal, after_created, after_id, lim, n)
CROSS JOIN LATERAL (
    SELECT c.token_id, c.created FROM client_tokens c
    WHERE c.account_id = $1 AND c.principal = k.principal
      AND (c.created, c.token_id) < (
          coalesce(k.after_created, 'infinity'),
          coalesce(k.after_id, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
      )
    ORDER BY c.created DESC, c.token_id DESC
    LIMIT k.lim
) t
ORDER BY k.n, t.created DESC, t.token_id DESC
"""


async def tokens(state: AppState, admin: Caller, runs: int) -> None:
    query = f"""query {{ client(principal: "busy") {{ tokens(first: 20) {{
      nodes {{ tokenId }} {PAGE_INFO} }} }} }}"""
    run = runner(state, admin)
    samples = await timings(lambda: run(query), runs)
    async with state.pool.acquire() as conn:
        count = await conn.fetchval("SELECT count(*) FROM client_tokens WHERE principal = 'busy'")
        middle = await conn.fetchrow(
            "SELECT created, token_id FROM client_tokens WHERE principal = 'busy' "
            "ORDER BY created DESC, token_id DESC OFFSET $1 LIMIT 1",
            count // 2,
        )
        print(f"\nclient(principal: busy) {{ tokens(first: 20) }}, {count:,} tokens:")
        print(f"  GraphQL             {percentiles(samples)}")
        for name, after in (("first page", None), ("a page from the middle", middle)):
            plan = await conn.fetch(
                TOKEN_PAGE,
                admin.account_id,
                ["busy"],
                [after["created"] if after else None],
                [after["token_id"] if after else None],
                [21],
            )
            print(f"  plan of the token page statement, {name}:")
            for row in plan:
                print("    " + row[0])


async def main_async(args: argparse.Namespace, url: str) -> None:
    pool = await create_pool(url, min_size=1, max_size=4)
    settings = Settings(database_url=url, search_maintenance_seconds=0)
    state = AppState(settings=settings, pool=pool, embedder=StaticEmbedder())
    # The embedding model recorded, as the service's start does; no background services.
    await ensure_model(pool, state.embedder, VECTOR_COLUMNS)
    try:
        async with pool.acquire() as conn:
            account_id = await ensure_default_account(conn)
            loaded = await conn.fetchval("SELECT count(*) FROM actions")
        admin = Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)
        if not loaded:
            print("loading ...", flush=True)
            await load(state, admin, args)
        agent = str(
            await pool.fetchval("SELECT action_id FROM action_versions WHERE name = 'main'")
        )
        parts = args.part or ["nested", "bulk", "actions", "tokens"]
        if "nested" in parts:
            await nested(state, admin, agent, args.runs)
        if "actions" in parts:
            await listing(state, admin, args.runs, args.profile)
        if "tokens" in parts:
            await tokens(state, admin, args.runs)
        if "bulk" in parts:
            await bulk(state, admin, max(3, args.runs // 10), args.profile)
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", choices=["nested", "bulk", "actions", "tokens"])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--executions", type=int, default=10)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=1200)
    parser.add_argument(
        "--agent-records", type=int, default=6, help=f"records of each of the {LISTED} newest"
    )
    parser.add_argument("--tokens", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "engram-bench-operator"
    )
    args = parser.parse_args()
    pg = server(args.data_dir)
    name = (
        f"engram_operator_{args.sessions}_{args.executions}_{args.records}_{args.agents}_"
        f"{args.tokens}_{args.agent_records}"
    )

    async def create_database() -> None:
        conn = await asyncpg.connect(pg.uri())
        try:
            if not await conn.fetchval("SELECT true FROM pg_database WHERE datname = $1", name):
                await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    try:
        asyncio.run(create_database())
        migrate.upgrade(pg.uri(name))
        asyncio.run(main_async(args, pg.uri(name)))
    finally:
        pg.stop()
    print(f"\nreproduce: python bench/operator_lists.py {shlex.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
