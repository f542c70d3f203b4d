"""The request paths whose database work grows with what a user has stored, at growing sizes:
the longest single statement of each (what ENGRAM_STATEMENT_TIMEOUT_SECONDS, 60 s by default,
cuts off: the request is answered 503 UNAVAILABLE and rolled back) and the whole request.

erase    `eraseSession` (app/runtime/erase.py) of one session of TURNS turns, each turn an
         execution (its input about 200 characters, its output 600) with the 6 transcript
         events of a turn with a recall (its results 3,000 characters of random words) and
         TOOL_CALLS more (a tool call's result, about 250 characters, each), 2
         history events (the user's message and the agent's reply, one part each, with a
         256-dimension vector) and the session's running summary. The history parts' HNSW
         and GIN indexes are dropped before loading (loading into them takes many minutes at
         these sizes, and a delete does not touch them: their entries go at VACUUM).
client   `deleteClient` (app/auth/service.py) of a client holding TOKENS tokens and KEYS
         idempotency keys (kept a day: a client writing 10 times a second with keys holds
         864,000), each key's stored result about 300 characters.
sweep    The heartbeat's liveness sweep (app/runtime/liveness.py `TurnLiveness.sweep`, as it
         runs after the start, under the bounds) when a process died with DEAD running turns
         holding 20 staged memory rows each, beside 100,000 committed records.

Each size is loaded into a fresh database of the bench's own server, with no statement bound,
and each statement the request sends is timed at the client (asyncpg's calls, wall time: the
server's time plus a loopback round trip). Prints, per size, the request's statements, its
longest statement, the whole request, and the size at which that statement would pass 60 s if
it grew in proportion to the largest size measured.

    python bench/bounds.py                        # a few minutes
    python bench/bounds.py --large                # erase 100,000 and 300,000 turns, ...
    python bench/bounds.py --paths erase --turns 20000 50000
    python bench/bounds.py --paths erase --turns 1000 --tool-calls 1000
"""

import argparse
import asyncio
import atexit
import logging
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import fresh_database  # noqa: E402

from app.actions.service import create_action  # noqa: E402
from app.auth.caller import Caller  # noqa: E402
from app.auth.policies import ADMIN_POLICIES  # noqa: E402
from app.auth.service import create_client, delete_client, ensure_default_account  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.runtime.erase import erase_session  # noqa: E402
from app.runtime.liveness import TurnLiveness  # noqa: E402

BOUND_SECONDS = 60.0
TIMED = ("execute", "executemany", "fetch", "fetchrow", "fetchval")


@contextmanager
def statements() -> Iterator[list[tuple[float, str]]]:
    """Every statement sent through asyncpg while the block runs: (seconds, its first words)."""
    seen: list[tuple[float, str]] = []
    originals = {name: getattr(asyncpg.Connection, name) for name in TIMED}

    def timing(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(self, query, *args, **kw)
            finally:
                seen.append((time.perf_counter() - started, " ".join(query.split())[:70]))

        return timed

    for name, original in originals.items():
        setattr(asyncpg.Connection, name, timing(original))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(asyncpg.Connection, name, original)


async def run_timed(request: Callable[[], Awaitable[Any]]) -> tuple[float, float, str, int]:
    """The request's whole seconds, its longest statement's seconds and words, its statements."""
    with statements() as seen:
        started = time.perf_counter()
        await request()
        whole = time.perf_counter() - started
    longest, words = max(seen)
    return whole, longest, words, len(seen)


# --- eraseSession --------------------------------------------------------------------------

LOAD_SESSION = [
    "INSERT INTO sessions (account_id, action_id, session_id, turns) VALUES ($1, $2, $3, $4)",
    """
    INSERT INTO executions (account_id, action_id, execution_id, action_version, session_id,
                            turn, kind, status, principal, input, output, created, modified)
    SELECT $1, $2, gen_random_uuid(), 1, $3, t, 'TURN', 'SUCCEEDED', 'bench',
           jsonb_build_object('message', 'the user asked at turn ' || t || repeat(' word', 35)),
           jsonb_build_object('output', 'the agent answered turn ' || t || repeat(' word', 110)),
           now() - make_interval(secs => $4 - t), now() - make_interval(secs => $4 - t)
    FROM generate_series(1, $4::int) t
    """,
    # A turn's transcript as a turn with a recall writes it: its input, the recall's embedding,
    # search and records used, one model call and the output; the recall's results (about
    # 3,000 characters) are random words, which do not compress.
    """
    INSERT INTO transcript_events (account_id, action_id, execution_id, sequence,
                                   invocation_number, type, data)
    SELECT x.account_id, x.action_id, x.execution_id, s, 1,
           (ARRAY['turn.input', 'embedding', 'tool.execution', 'output.use', 'model.call',
                  'turn.output'])[s],
           CASE s
           WHEN 2 THEN jsonb_build_object('purpose', 'embed', 'model', 'm', 'tokens', 12)
           WHEN 3 THEN jsonb_build_object('name', 'search_memory', 'output', (
               SELECT string_agg(md5(random()::text), ' ') FROM generate_series(1, 90)
               WHERE x.turn > 0))
           WHEN 5 THEN jsonb_build_object('purpose', 'turn', 'model', 'm', 'usage',
               jsonb_build_object('prompt_tokens', 900, 'completion_tokens', 150),
               'content', 'the agent answered turn ' || x.turn || repeat(' word', 110))
           ELSE jsonb_build_object('text', 'words of turn ' || x.turn || repeat(' word', 35))
           END
    FROM executions x, generate_series(1, 6) s
    WHERE x.account_id = $1 AND x.action_id = $2 AND x.session_id = $3
    """,
    # And TOOL_CALLS tool calls' results (a few hundred characters each), as a turn of many
    # tool calls writes them (up to 16 model calls of 64 tool calls each, by default): a turn's
    # together, as it commits them. ($4 is named only because each statement takes the first n
    # arguments.)
    """
    INSERT INTO transcript_events (account_id, action_id, execution_id, sequence,
                                   invocation_number, type, data)
    SELECT x.account_id, x.action_id, x.execution_id, 6 + s, 1, 'tool.execution',
           jsonb_build_object('name', 'lookup', 'arguments', jsonb_build_object('q', x.turn),
               'output', 'result ' || s || ' of turn ' || x.turn || repeat(' word', 40))
    FROM executions x, generate_series(1, $5::int) s
    WHERE x.account_id = $1 AND x.action_id = $2 AND x.session_id = $3 AND $4::int > 0
    ORDER BY x.turn, s
    """,
    """
    INSERT INTO history_events (account_id, action_id, session_id, event_id, turn, execution_id,
                                invocation_number, sequence, who, data, text, parts, preview)
    SELECT x.account_id, x.action_id, x.session_id, gen_random_uuid(), x.turn, x.execution_id,
           1, s, (ARRAY['user', 'agent'])[s], '{}'::jsonb,
           'what was said at turn ' || x.turn || repeat(' word', 35 + 75 * (s - 1)), 1, false
    FROM executions x, generate_series(1, 2) s
    WHERE x.account_id = $1 AND x.action_id = $2 AND x.session_id = $3
    """,
    """
    INSERT INTO history_parts (account_id, action_id, session_id, event_id, part, turn, preview,
                               text, embedding, tools)
    SELECT e.account_id, e.action_id, e.session_id, e.event_id, 1, e.turn, false, e.text,
           v.embedding, '{}'
    FROM history_events e JOIN bench_vectors v ON v.i = (e.turn * 2 + e.sequence) % 1000
    WHERE e.account_id = $1 AND e.action_id = $2 AND e.session_id = $3
    """,
    """
    INSERT INTO session_summaries (account_id, action_id, session_id, preview, summary,
                                   through_turn, through_message, tokens, execution_id)
    SELECT $1, $2, $3, false, repeat('summary ', 200), $4, 1, 400, gen_random_uuid()
    """,
]


async def erase(
    pool: asyncpg.Pool, caller: Caller, turns: int, tool_calls: int
) -> tuple[float, float, str, int]:
    agent = await create_action(
        pool, caller, name=f"erase {turns}", instructions="", model=None, harness={}
    )
    args = (agent.account_id, agent.action_id, "big", turns, tool_calls)
    async with pool.acquire() as conn, conn.transaction():
        # A delete touches neither (their entries go at VACUUM); loading into them takes long.
        await conn.execute("DROP INDEX IF EXISTS history_parts_embedding, history_parts_words")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_vectors AS SELECT i, (SELECT"
            " array_agg(random() - 0.5) FROM generate_series(1, 256) WHERE i >= 0)::vector(256)"
            " AS embedding"
            " FROM generate_series(0, 999) i"
        )
        for sql in LOAD_SESSION:
            await conn.execute(sql, *args[: max_parameter(sql)])
            await conn.execute("ANALYZE")
    await pool.execute("VACUUM ANALYZE")
    return await run_timed(lambda: erase_session(pool, caller, agent.action_id, "big"))


def max_parameter(sql: str) -> int:
    """The highest $n a statement takes (each loading statement takes the first n of them)."""
    return max(int(sql[i + 1]) for i, c in enumerate(sql) if c == "$")


# --- deleteClient --------------------------------------------------------------------------


async def client(
    pool: asyncpg.Pool, caller: Caller, keys: int, tokens: int
) -> tuple[float, float, str, int]:
    principal = f"busy-{uuid.uuid4().hex[:8]}@example.com"
    await create_client(
        pool, caller, account_id=None, principal=principal, name="busy", policies=[]
    )
    account = caller.account_id
    async with pool.acquire() as conn, conn.transaction():
        hashes = [uuid.uuid4().bytes + uuid.uuid4().bytes for _ in range(tokens)]
        await conn.execute(
            "INSERT INTO token_accounts (token_hash, account_id)"
            " SELECT h, $2 FROM unnest($1::bytea[]) h",
            hashes,
            account,
        )
        await conn.execute(
            "INSERT INTO client_tokens (token_hash, account_id, principal, prefix)"
            " SELECT h, $2, $3, 'eng_' FROM unnest($1::bytea[]) h",
            hashes,
            account,
            principal,
        )
        await conn.execute(
            """
            INSERT INTO idempotency_keys (account_id, principal, operation, key, request, result)
            SELECT $1, $2, 'addAgentMemory', 'key-' || k, md5(k::text),
                   jsonb_build_object('addAgentMemory', jsonb_build_object(
                       'memoryId', gen_random_uuid(), 'version', 1,
                       'summary', 'a record written with a key' || repeat(' word', 40)))
            FROM generate_series(1, $3::int) k
            """,
            account,
            principal,
            keys,
        )
    await pool.execute("VACUUM ANALYZE")
    return await run_timed(
        lambda: delete_client(pool, caller, account_id=None, principal=principal)
    )


# --- the liveness sweep --------------------------------------------------------------------


async def sweep(pool: asyncpg.Pool, caller: Caller, dead: int) -> tuple[float, float, str, int]:
    agent = await create_action(
        pool, caller, name=f"sweep {dead}", instructions="", model=None, harness={}
    )
    gone = uuid.uuid4()
    a, b = agent.account_id, agent.action_id
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO service_processes (boot_id, host, pid, heartbeat, lease_seconds)"
            " VALUES ($1, 'gone', 1, now() - interval '1 hour', 30)",
            gone,
        )
        await conn.execute(
            """
            INSERT INTO executions (account_id, action_id, execution_id, action_version,
                                    session_id, turn, kind, status, principal, boot_id, modified)
            SELECT $1, $2, gen_random_uuid(), 1, NULL, NULL, 'TURN', 'RUNNING', 'bench', $3,
                   now() - interval '1 hour'
            FROM generate_series(1, $4::int)
            """,
            a,
            b,
            gone,
            dead,
        )
        await conn.execute(
            """
            INSERT INTO agent_memories (account_id, action_id, memory_id, version, summary,
                content, kind, scope, source, status, execution_id, invocation_number,
                action_version, modified_by, pending_execution, pending_invocation, created,
                modified)
            SELECT $1, $2, gen_random_uuid(), 1, 'a record ' || n, '', 'fact', 'AGENT',
                   'OPERATOR', 'ACTIVE', x.execution_id, 1, 1, 'bench',
                   CASE WHEN n <= 20 THEN x.execution_id END, CASE WHEN n <= 20 THEN 1 END,
                   now() - interval '1 hour', now() - interval '1 hour'
            FROM (SELECT execution_id, row_number() OVER () AS r FROM executions
                  WHERE account_id = $1 AND action_id = $2) x,
                 generate_series(1, 20 + ceil(100000.0 / $3)::int) n
            """,
            a,
            b,
            dead,
        )
    await pool.execute("VACUUM ANALYZE")
    liveness = TurnLiveness(pool, Settings())
    return await run_timed(liveness.sweep)


# --- the run -------------------------------------------------------------------------------


PATHS: dict[str, tuple[str, Callable[..., Awaitable[tuple[float, float, str, int]]]]] = {
    "erase": ("turns", erase),
    "client": ("idempotency keys", client),
    "sweep": ("dead turns", sweep),
}


def passes_at(size: int, longest: float) -> str:
    return f"~{int(size * BOUND_SECONDS / longest):,}" if longest > 0 else "-"


async def measure(pg: EmbeddedPostgres, args: argparse.Namespace) -> None:
    sizes = {"erase": args.turns, "client": args.keys, "sweep": args.dead}
    for path in args.paths:
        unit, request = PATHS[path]
        print(f"\n{path}: | {unit} | statements | longest statement s | whole request s |")
        print("| --- | --- | --- | --- |")
        last = (0, 0.0)
        for size in sizes[path]:
            url = await fresh_database(pg, f"bounds_{path}", StaticEmbedder())
            pool = await create_pool(url, min_size=1, max_size=2)
            try:
                async with pool.acquire() as conn:
                    account = await ensure_default_account(conn)
                caller = Caller(account, "admin", ADMIN_POLICIES, in_default_account=True)
                extra = {"client": (args.tokens,), "erase": (args.tool_calls,)}.get(path, ())
                whole, longest, words, count = await request(pool, caller, size, *extra)
            finally:
                await pool.close()
            print(f"| {size:,} | {count} | {longest:.2f} | {whole:.2f} |  longest: {words}")
            last = (size, longest)
        print(f"longest statement passes {BOUND_SECONDS:.0f} s at {passes_at(*last)} {unit}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--turns", type=int, nargs="+", default=[5000, 20000, 50000])
    parser.add_argument(
        "--tool-calls", type=int, default=0, help="each erased turn's tool calls (default: 0)"
    )
    parser.add_argument("--keys", type=int, nargs="+", default=[100_000, 400_000])
    parser.add_argument("--tokens", type=int, default=1000, help="the deleted client's tokens")
    parser.add_argument("--dead", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--large",
        action="store_true",
        help="erase 100,000 and 300,000 turns; 864,000 and 2,000,000 keys; 5,000 dead turns",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the sweep's account of the turns it failed
    if args.large:
        args.turns, args.keys, args.dead = [100_000, 300_000], [864_000, 2_000_000], [5000]
    print("# python bench/bounds.py " + shlex.join(sys.argv[1:]))
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="engram-bounds-"))
    if args.data_dir is None:  # however the run ends, Ctrl-C as the server starts too
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    pg = EmbeddedPostgres(root / "pgdata")
    try:
        asyncio.run(measure(pg, args))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
