"""Ingest: bulk import throughput (`--bulk`, on by default) and one MCP tool call's overhead
over the same call done natively (`--mcp`, bench/ingest_mcp.py).

Bulk (`bulk_throughput`): with the static embedder, on a fresh database of its own embedded
PostgreSQL under --data-dir, it measures in one run

- the embedder alone: texts/s over the same texts, in batches of 1,000;
- `addAgentMemories` end to end over real HTTP (the app under uvicorn on loopback, a client
  with a bearer token, calls of --batch records selecting `executionId memoryIds`): records/s;
- `engram export` of that agent (in process) and `engram import` of the file into a second
  database: in process (records/s of the import alone), and as the command a person runs
  (`python -m app.cli import FILE`, process start and migration check included, with its
  largest resident size), which waits for the builds of the agent's own search indexes once
  it holds `ENGRAM_AGENT_INDEX_MIN_RECORDS`, and again with that setting past the agent (no
  build);
- with `--memory`, what the import's check pass holds at most (tracemalloc, above what was
  allocated when it began): it grows with the rows, the rest of an import is a batch at a time.

    python bench/ingest.py                      # 20,000 records
    python bench/ingest.py --records 5000       # quick
    python bench/ingest.py --records 10000 --memory  # the check pass's memory (slower import)
    python bench/ingest.py --no-bulk --mcp      # the MCP overhead alone
"""

import argparse
import asyncio
import contextlib
import io
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' loopback socket for uvicorn

from openai_server import loopback_socket  # noqa: E402

from app.auth.service import ensure_default_account  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import migrate  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.setup import ensure_model  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.main import create_app  # noqa: E402
from app.memory.store import EMBEDDING, RECORD_COLUMNS  # noqa: E402
from app.memory.vectors import VECTOR_COLUMNS, memory_text  # noqa: E402
from app.transfer import service as transfer_service  # noqa: E402
from app.transfer.service import export_action, import_file  # noqa: E402

TOKEN = "bench-ingest-admin-token"
CREATE = """
mutation($input: ActionInput!) { createAction(input: $input) { actionId } }"""
BULK = """
mutation($a: UUID!, $inputs: [AgentMemoryInput!]!) {
  addAgentMemories(actionId: $a, inputs: $inputs) { executionId memoryIds }
}"""


# Runs a command and prints its largest resident size (KiB) after its output, from a process of
# its own: a child of this one (which holds the export, the embedder) counts this process's
# pages as its own until the command starts (it read 1.6 GB for an import of 100,000 records
# whose own peak is 235 MiB).
MAX_RSS = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def _vocabulary(embedder: StaticEmbedder) -> list[str]:
    """Whole words of the static model's own vocabulary, in a stable order."""
    vocab = embedder._tokenizer.get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) >= 3)


def texts(n: int, words: list[str], seed: int = 7) -> list[dict[str, str]]:
    """Records of words drawn as in language (the k-th most used about 1/k as often): varied
    enough that their vectors spread as real records' do (43 words repeated made near-duplicate
    vectors, on which an HNSW insert costs several times more)."""
    rng = random.Random(seed)
    order = words[:]
    rng.shuffle(order)
    weights = [1 / (k + 1) for k in range(len(order))]
    pick = rng.choices
    return [
        {
            "summary": " ".join(pick(order, weights, k=rng.randint(8, 14))) + f" #{i}",
            "content": " ".join(pick(order, weights, k=rng.randint(20, 40))),
            "kind": "fact",
        }
        for i in range(n)
    ]


async def _create_database(pg: EmbeddedPostgres, name: str) -> str:
    conn = await asyncpg.connect(pg.uri())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return pg.uri(name)


async def _record_model(url: str, embedder: StaticEmbedder) -> None:
    """What a deployment's first start does: fix the vector column to the embedding model."""
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        await ensure_model(pool, embedder, VECTOR_COLUMNS)
    finally:
        await pool.close()


class Served:
    """The app under uvicorn in a thread, on a loopback port."""

    def __init__(self, settings: Settings, embedder: StaticEmbedder) -> None:
        self.sock = loopback_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/graphql"
        config = uvicorn.Config(
            create_app(settings, embedder=embedder), log_level="warning", log_config=None
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        return self.url

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


async def _index_cost(url: str, rows: int = 1000) -> float:
    """Seconds to insert `rows` records (copies of stored ones, new IDs, their vectors) with
    every index; rolled back. (There is no HNSW index shared by every agent, migration 0015.)"""
    # New records, not successors: the chain columns stay empty.
    columns = tuple(c for c in (*RECORD_COLUMNS, EMBEDDING) if c not in ("replaces", "replaced_by"))
    copied = ", ".join("gen_random_uuid()" if c == "memory_id" else c for c in columns)
    copy = (
        f"INSERT INTO agent_memories ({', '.join(columns)}) SELECT {copied} FROM agent_memories "
        f"WHERE {EMBEDDING} IS NOT NULL ORDER BY random() LIMIT $1"
    )
    conn = await asyncpg.connect(url)
    try:
        tr = conn.transaction()
        await tr.start()
        t = time.perf_counter()
        await conn.execute(copy, rows)
        seconds = time.perf_counter() - t
        await tr.rollback()
    finally:
        await conn.close()
    return seconds


def _server_cpu(pg: EmbeddedPostgres) -> float:
    """CPU seconds the server's processes (the postmaster and its children: backends, WAL
    writer, I/O workers) have used so far; of a backend that ended, not counted. Unlike a wall
    time, barely moved by other work on the machine."""
    pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    used = 0.0
    for process in (postmaster, *postmaster.children()):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            used += times.user + times.system
    return used


def _gql(client: httpx.Client, url: str, query: str, **variables: Any) -> dict[str, Any]:
    response = client.post(url, json={"query": query, "variables": variables})
    body = response.json()
    if body.get("errors"):
        raise RuntimeError(body["errors"])
    return body["data"]


def bulk_throughput(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    pg = EmbeddedPostgres(data_dir / "pgdata")
    try:
        _bulk(args, pg, data_dir)
    finally:
        pg.stop()


def _bulk(args: argparse.Namespace, pg: EmbeddedPostgres, data_dir: Path) -> None:
    n, batch = args.records, args.batch
    embedder = StaticEmbedder()
    words = _vocabulary(embedder)
    records = texts(n, words)

    # The embedder alone, on the very texts, as addAgentMemories hands them over.
    whole = [memory_text(r["summary"], r["content"]) for r in records]
    asyncio.run(embedder.embed(whole[:batch]))  # warm
    started = time.perf_counter()
    for i in range(0, n, batch):
        asyncio.run(embedder.embed(whole[i : i + batch]))
    embed_rate = n / (time.perf_counter() - started)

    source_url = asyncio.run(_create_database(pg, "ingest_source"))
    target_url = asyncio.run(_create_database(pg, "ingest_target"))
    for url in (source_url, target_url):
        migrate.upgrade(url)
        asyncio.run(_record_model(url, embedder))
    settings = Settings(
        database_url=source_url,
        bootstrap_token=TOKEN,
        search_maintenance_seconds=0,
    )
    with Served(settings, embedder) as url:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(headers=headers, timeout=120) as client:
            harness = {
                "memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}
            }
            action_id = _gql(
                client, url, CREATE, input={"name": "bulk", "instructions": "", "harness": harness}
            )["createAction"]["actionId"]
            # Warm the path (first call loads and plans), then time the rest.
            _gql(client, url, BULK, a=action_id, inputs=texts(10, words, seed=1))
            calls: list[float] = []
            chunks = [records[i : i + batch] for i in range(0, n, batch)]

            def send(mine: list[list[dict[str, str]]]) -> None:
                with httpx.Client(headers=headers, timeout=120) as own:
                    for chunk in mine:
                        t = time.perf_counter()
                        added = _gql(own, url, BULK, a=action_id, inputs=chunk)
                        calls.append(time.perf_counter() - t)
                        assert len(added["addAgentMemories"]["memoryIds"]) == len(chunk)

            clients = [
                threading.Thread(target=send, args=(chunks[k :: args.clients],))
                for k in range(args.clients)
            ]
            started = time.perf_counter()
            for c in clients:
                c.start()
            for c in clients:
                c.join()
            http_seconds = time.perf_counter() - started
            assert len(calls) == len(chunks), "a client failed"
    http_rate = n / http_seconds
    calls.sort()

    checking: list[float] = []
    check_peak: list[int] = []
    # CPU seconds of the import in process: this process's, the server's; the check pass's.
    cpu: dict[str, float] = {}

    async def export_import() -> tuple[float, float, int, Any]:
        pool = await create_pool(source_url, min_size=1, max_size=2)
        try:
            async with pool.acquire() as conn:
                account = await ensure_default_account(conn)
            out = io.StringIO()
            t = time.perf_counter()
            await export_action(pool, account_id=account, action_id=uuid.UUID(action_id), out=out)
            exported = time.perf_counter() - t
        finally:
            await pool.close()
        path.write_text(out.getvalue())
        target = await create_pool(target_url, min_size=1, max_size=2)
        try:
            async with target.acquire() as conn:
                account = await ensure_default_account(conn)

            async def opener() -> StaticEmbedder:
                return embedder

            # The import's first pass, timed: every row checked (and tried in a rolled-back
            # copy of its table) before any is written.
            check_file = transfer_service._check_file

            async def timed_check(*args: Any, **kwargs: Any) -> Any:
                began = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                t, own, server = time.perf_counter(), time.process_time(), _server_cpu(pg)
                try:
                    return await check_file(*args, **kwargs)
                finally:
                    checking.append(time.perf_counter() - t)
                    cpu["check python"] = time.process_time() - own
                    cpu["check postgres"] = _server_cpu(pg) - server
                    check_peak.append(tracemalloc.get_traced_memory()[1] - began)

            transfer_service._check_file = timed_check
            if args.memory:
                tracemalloc.start()
            t, own, server = time.perf_counter(), time.process_time(), _server_cpu(pg)
            result = await import_file(
                target,
                account_id=account,
                lines=out.getvalue().splitlines(),
                open_embedder=opener,
            )
            imported = time.perf_counter() - t
            cpu["python"] = time.process_time() - own
            cpu["postgres"] = _server_cpu(pg) - server
        finally:
            tracemalloc.stop()
            transfer_service._check_file = check_file
            await target.close()
        return exported, imported, len(out.getvalue().splitlines()) - 1, result

    path = data_dir / "export.jsonl"
    exported, imported, rows, result = asyncio.run(export_import())
    with_index = asyncio.run(_index_cost(target_url))

    # The command a person runs, into a third database: process start and checks included;
    # then again into a fourth with no index build: the command waits for the builds of the
    # agents it took past ENGRAM_AGENT_INDEX_MIN_RECORDS (the agent's HNSW and GIN indexes).
    def command(database: str, **settings: str) -> tuple[float, list[str], str]:
        url = asyncio.run(_create_database(pg, database))
        migrate.upgrade(url)
        asyncio.run(_record_model(url, embedder))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        env.update(ENGRAM_DATABASE_URL=url, PYTHONPATH=str(ROOT), **settings)
        t = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", MAX_RSS, sys.executable, "-m", "app.cli", "import", str(path)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - t
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        *said, kib = done.stdout.strip().splitlines()
        return seconds, said, kib

    cli_seconds, said, cli_kib = command("ingest_cli")
    unbuilt_seconds, _, _ = command("ingest_cli_unbuilt", ENGRAM_AGENT_INDEX_MIN_RECORDS=str(10**9))

    print(f"command: python bench/ingest.py {shlex.join(sys.argv[1:])}")
    print(
        f"records: {n:,} (summary ~80 chars, content ~250), calls of {batch:,} from "
        f"{args.clients} concurrent clients"
    )
    print(f"embedder alone (static): {embed_rate:,.0f} texts/s")
    print(
        f"addAgentMemories over HTTP: {http_rate:,.0f} records/s end to end "
        f"({http_seconds:.2f} s; per call of {batch:,}: median {calls[len(calls) // 2] * 1000:.0f} "
        f"ms, max {calls[-1] * 1000:.0f} ms); {http_rate / embed_rate:.2f} of the embedder's rate"
    )
    print(f"export: {rows:,} rows in {exported:.2f} s ({rows / exported:,.0f} rows/s)")
    print(
        f"import (in process, vectors {result.vectors}): {rows:,} rows in {imported:.2f} s "
        f"({rows / imported:,.0f} rows/s; {n / imported:,.0f} records/s), of which checking "
        f"every row before writing any {sum(checking):.2f} s"
        + (" (allocations traced: slower)" if args.memory else "")
    )
    print(
        f"the import's CPU: Python {cpu['python']:.2f} s, PostgreSQL {cpu['postgres']:.2f} s; "
        f"of them the check pass's {cpu['check python']:.2f} s and {cpu['check postgres']:.2f} s"
    )
    if args.memory:
        print(
            f"the check pass held at most {check_peak[0] / 2**20:,.1f} MiB (tracemalloc, above "
            f"its start; {check_peak[0] / rows:,.0f} bytes a row)"
        )
    print(
        f"the SQL ceiling: inserting 1,000 records into agent_memories (SQL alone, {n:,} there) "
        f"takes {with_index * 1000:.0f} ms with every index ({1000 / with_index:,.0f} records/s)"
    )
    print(
        f"engram import (the command, process start included): {cli_seconds:.2f} s "
        f"({n / cli_seconds:,.0f} records/s), max RSS {int(cli_kib) / 1024:,.0f} MiB; "
        f"{' '.join(said)}; without the index builds it waits for "
        f"(ENGRAM_AGENT_INDEX_MIN_RECORDS past the agent): {unbuilt_seconds:.2f} s "
        f"({n / unbuilt_seconds:,.0f} records/s)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "engram-bench-ingest"))
    p.add_argument(
        "--bulk",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure bulk import throughput (default: on)",
    )
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=1000, help="records per addAgentMemories call")
    p.add_argument("--clients", type=int, default=2, help="concurrent HTTP clients")
    p.add_argument(
        "--memory", action="store_true", help="trace the import's check pass's allocations"
    )
    p.add_argument("--mcp", action="store_true", help="measure one MCP tool call's overhead")
    p.add_argument("--calls", type=int, default=200, help="--mcp: timed calls a tool and mode")
    p.add_argument("--mcp-records", type=int, default=1000, help="--mcp: records the agent holds")
    args = p.parse_args()
    if args.bulk:
        bulk_throughput(args)
    if args.mcp:
        from ingest_mcp import report

        report(args.calls, args.mcp_records)


if __name__ == "__main__":
    main()
