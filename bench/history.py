"""Session history: retrieval quality on LoCoMo dev, search latency at scale, and what keeping
history adds to a turn's commit.

quality  Each LoCoMo dev conversation is one session of one agent (`harness.history.index:
         messages`); each dialog turn is one Engram turn (`execute_turn`, the real start and
         commit path), its message "<speaker>: <text>" (plus " [shares <caption>]"), kept by
         the commit. The scripted model answers with no text, so only the messages are kept:
         the same texts memory search ranks in bench/locomo_quality.py. Each non-adversarial
         question with evidence is then asked from a later turn of the same session, whose
         model calls `search_history(query, limit 10)`; the model's next call fails on purpose,
         so the question turn keeps nothing and every question sees the same history (H5).
         recall@k = share of the question's evidence turns among the results' events in the
         top k. Memory search (hybrid, the same fusion) over the same turns as records, one
         agent per conversation, is measured beside it. `--embedder minilm` embeds both
         (and the questions) with MiniLM (the `minilm` extra) instead of the static embedder;
         `--plan index` has search_history take the plan of a session over EXACT_MAX_PARTS
         parts (shared HNSW under the session filter, the words of its newest WORD_WALK parts).
scale    `history_parts` loaded by COPY (bulk, indexes built after): one session of
         --big events, then --sessions sessions of --per-session events. Texts are pairs of
         LoCoMo turns, vectors the normalized sum of the pair's (unique, realistic
         neighbourhoods). Search timed as the service runs it (`app.history.search.search`:
         the plan's count and the ranking SQL, taking and giving back a pooled connection),
         without the query's embedding (precomputed; static embeds a question in well under
         1 ms). Questions are LoCoMo's. 1,000-event sessions are timed twice: each session's
         first search, then the same sessions again (their plan remembered). With --data-dir
         and --reuse, a later run searches the tables an earlier one loaded (building what a
         newer migration or this script adds); --session-index gives the big session its own
         HNSW index as the search maintenance round would (without it, a reused table loses
         such indexes).
commit   The same turn with and without history on, interleaved: wall time of
         `execute_turn` (the model answers at once, in its own process).
inserts  A session of --big parts (loaded as `scale` does, among --sessions others) with its
         own HNSW index, built as the search maintenance round builds it. Speed: --rounds
         rounds of --insert-turns turns of --turn-parts parts each, written as a commit writes
         them (`history_store.insert`, one transaction rolled back, then VACUUM), with the
         index's ef_construction at 256, at 128, and without the index, each first, second
         and third in turn. Recall: top-10 and top-40 overlap with brute force over the
         session's parts of its HNSW search (the pool's ef_search and iterative scan, as the
         index plan's vector list), LoCoMo's questions, for its index built at 256; for a
         session of its first half, its index built at 256 and the second half then inserted
         at 128 (and at 256); and for its index built at 128.

    python bench/history.py DATA/locomo-dev.json                    # quality and commit
    python bench/history.py DATA/locomo-dev.json --commit-turns 0 --embedder minilm
    python bench/history.py DATA/locomo-dev.json --scale --big 100000 --sessions 0
    python bench/history.py DATA/locomo-dev.json --scale --big 100000 --sessions 1000 \
        --data-dir /tmp/history-1m --reuse [--session-index]
    python bench/history.py DATA/locomo-dev.json --inserts --big 40000 --sessions 20
"""

import argparse
import asyncio
import atexit
import io
import json
import multiprocessing
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the scripted model server of the tests

from openai_server import OpenAIServer  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402

from app.actions.harness import SearchConfig  # noqa: E402
from app.actions.service import create_action  # noqa: E402
from app.auth.caller import Caller  # noqa: E402
from app.auth.policies import ADMIN_POLICIES  # noqa: E402
from app.auth.service import ensure_default_account  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import migrate  # noqa: E402
from app.db.pool import create_pool, session_changed  # noqa: E402
from app.embeddings.base import Embeddings  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.executions import store as executions_store  # noqa: E402
from app.history import indexes as history_indexes  # noqa: E402
from app.history import search as history_search  # noqa: E402
from app.history import store as history_store  # noqa: E402
from app.history.keeping import KeptEvent  # noqa: E402
from app.history.search import CANDIDATES  # noqa: E402
from app.history.store import HistoryScope, text_literal  # noqa: E402
from app.memory.search import search as memory_search  # noqa: E402
from app.memory.store import copy_committed  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402
from app.runtime.model import MODEL, ModelClient  # noqa: E402
from app.runtime.tools import NATIVE_TOOLS  # noqa: E402
from app.runtime.turns import TurnRequest, execute_turn  # noqa: E402
from app.services import start_services, stop_services  # noqa: E402
from app.state import AppState  # noqa: E402
from bench.common import bench_record, fresh_database, percentiles, tuned_server  # noqa: E402

KS = (1, 5, 10)
DIA = re.compile(r"D(\d+):(\d+)")
QUESTION = "QUESTION: "


def evidence_ids(evidence: list[str]) -> set[str]:
    found: set[str] = set()
    for item in evidence:
        for match in DIA.finditer(str(item).replace("D:", "D")):
            found.add(f"D{match.group(1)}:{match.group(2)}")
    return found


def conversations(path: Path) -> list[dict[str, Any]]:
    result = []
    for sample in json.loads(path.read_text()):
        conv = sample["conversation"]
        turns = []
        for key in sorted(
            (k for k in conv if k.startswith("session_") and isinstance(conv[k], list)),
            key=lambda k: int(k.split("_")[1]),
        ):
            for turn in conv[key]:
                text = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    text += f" [shares {turn['blip_caption']}]"
                turns.append((turn["dia_id"], text))
        questions = [
            (qa["question"], evidence_ids(qa.get("evidence", [])))
            for qa in sample["qa"]
            if qa.get("category") != 5
        ]
        result.append(
            {"id": sample["sample_id"], "turns": turns, "questions": [q for q in questions if q[1]]}
        )
    return result


class QuestionModel(OpenAIServer):
    """Answers at once. A user message starting "QUESTION: " gets a search_history call for
    the rest of it, and the call after that fails (HTTP 500), so the turn keeps nothing; any
    other message gets an empty answer (nothing of the agent's is kept); a summary request
    (purpose `context`, once a session outgrows the context budget) a one-line summary."""

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        messages = body["messages"]
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if body.get("metadata", {}).get("purpose") == "context":  # the running summary (H16)
            message["content"] = "Earlier turns: a conversation."
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return JSONResponse({"model": body["model"], "choices": [choice], "usage": usage})
        asked = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        if asked.startswith(QUESTION):
            if any(m["role"] == "tool" for m in messages):
                return JSONResponse({"error": {"message": "done"}}, status_code=500)
            arguments = {"query": asked[len(QUESTION) :], "limit": 10}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search_history", "arguments": json.dumps(arguments)},
                    }
                ],
            }
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse({"model": body["model"], "choices": [choice], "usage": usage})


def serve_model(ports: Any, stop: Any) -> None:
    server = QuestionModel().start()
    ports.put(server.port)
    stop.wait()
    server.stop()


async def open_state(url: str, model_url: str, embedder: Any) -> tuple[AppState, Caller]:
    pool = await create_pool(url, min_size=2, max_size=8)
    settings = Settings(
        database_url=url,
        model_base_url=model_url,
        model_name="scripted",
        model_max_retries=0,
        search_maintenance_seconds=0,
    )
    state = AppState(settings=settings, pool=pool, embedder=embedder)
    await start_services(state)
    state.services[MODEL] = ModelClient(settings)
    async with pool.acquire() as conn:
        account_id = await ensure_default_account(conn)
    return state, Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)


async def close_state(state: AppState) -> None:
    await stop_services(state)
    await state.pool.close()


def recall(found: list[str], evidence: set[str], k: int) -> float:
    return len(set(found[:k]) & evidence) / len(evidence)


def quality_embedder(name: str) -> Any:
    """The quality part's embedder: history's parts, memory's records and both queries."""
    if name == "minilm":
        from app.embeddings.minilm import MiniLMEmbedder  # the `minilm` extra

        return MiniLMEmbedder()
    return StaticEmbedder()


async def quality(state: AppState, caller: Caller, convs: list[dict[str, Any]]) -> None:
    agent = await create_action(
        state.pool,
        caller,
        name="history",
        instructions="You talk.",
        model=None,
        harness={"history": {"index": "messages"}},
    )
    totals = {"history": dict.fromkeys(KS, 0.0), "memory": dict.fromkeys(KS, 0.0)}
    count = 0
    started = time.perf_counter()
    kept_turns = 0
    for conv in convs:
        session = conv["id"]
        dia_of: dict[uuid.UUID, str] = {}
        for dia, text in conv["turns"]:
            done = await execute_turn(state, caller, TurnRequest(agent.action_id, session, text))
            assert done.status == "SUCCEEDED", done.error
            dia_of[done.execution_id] = dia
            kept_turns += 1
        async with state.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT event_id, execution_id FROM history_events"
                " WHERE account_id = $1 AND action_id = $2 AND session_id = $3",
                caller.account_id,
                agent.action_id,
                session,
            )
        event_dia = {r["event_id"]: dia_of[r["execution_id"]] for r in rows}
        memory_reader, memory_ids = await load_memory(state, caller, conv)
        for question, evidence in conv["questions"]:
            count += 1
            done = await execute_turn(
                state, caller, TurnRequest(agent.action_id, session, QUESTION + question)
            )
            assert done.status == "FAILED"
            async with state.pool.acquire() as conn:
                (events,) = await executions_store.list_event_pages(
                    conn, caller.account_id, [(agent.action_id, done.execution_id, None, 100)]
                )
            (searched,) = [
                e["data"]
                for e in events
                if e["type"] == "tool.execution" and e["data"]["name"] == "search_history"
            ]
            found = [event_dia[uuid.UUID(e["id"])] for e in searched["output"]["events"]]
            result = await memory_search(
                state.pool,
                state.embedder,  # type: ignore[arg-type]
                memory_reader,
                SearchConfig(),
                query=question,
                limit=10,
                mode="hybrid",
            )
            by_memory = [memory_ids[r.memory_id] for r in result.records]
            for k in KS:
                totals["history"][k] += recall(found, evidence, k)
                totals["memory"][k] += recall(by_memory, evidence, k)
    elapsed = time.perf_counter() - started
    print(
        f"quality: {len(convs)} sessions, {kept_turns} dialog turns kept through execute_turn, "
        f"{count} questions asked through search_history ({elapsed:.0f} s, "
        f"{state.embedder.name if state.embedder else None})"
    )
    plans = sorted({plan for _, plan, _ in history_search._PLANS.values()})
    print(f"  search_history's plans: {', '.join(plans)}")
    for name, label in (("history", "search_history"), ("memory", "memory search (hybrid)")):
        cells = "  ".join(f"R@{k} {totals[name][k] / count:.3f}" for k in KS)
        print(f"  {label:<24} {cells}")


async def load_memory(
    state: AppState, caller: Caller, conv: dict[str, Any]
) -> tuple[OperatorReader, dict[uuid.UUID, str]]:
    """The conversation's turns as one agent's memory records (as bench/locomo_quality.py)."""
    agent = await create_action(
        state.pool, caller, name=f"memory {conv['id']}", instructions="", model=None, harness=None
    )
    texts = [text for _, text in conv["turns"]]
    assert state.embedder is not None
    vectors = (await state.embedder.embed(texts)).vectors
    ids = {uuid.uuid4(): dia for dia, _ in conv["turns"]}
    start = datetime.now(UTC)
    records = [
        bench_record(
            caller.account_id,
            agent.action_id,
            text,
            memory_id=memory_id,
            created=start + timedelta(seconds=n),
        )
        for n, (memory_id, text) in enumerate(zip(ids, texts, strict=True))
    ]
    async with state.pool.acquire() as conn:
        await copy_committed(conn, records, vectors)
    return OperatorReader(caller.account_id, agent.action_id), ids


async def commit_cost(state: AppState, caller: Caller, turns: int) -> None:
    """The same turns with and without history, interleaved."""
    plain = await create_action(
        state.pool, caller, name="plain", instructions="You talk.", model=None, harness=None
    )
    keeping = await create_action(
        state.pool,
        caller,
        name="keeping",
        instructions="You talk.",
        model=None,
        harness={"history": {"index": "messages"}},
    )
    walls: dict[str, list[float]] = {"without history": [], "with history": []}
    text = (
        "Caroline: I went to the LGBTQ support group yesterday and it was so powerful. "
        "The transgender stories were inspiring and I felt accepted."
    )
    for i in range(turns + 10):
        for name, agent in (("without history", plain), ("with history", keeping)):
            started = time.perf_counter()
            done = await execute_turn(
                state, caller, TurnRequest(agent.action_id, f"c{i // 50}", f"{text} ({i})")
            )
            elapsed = (time.perf_counter() - started) * 1000
            assert done.status == "SUCCEEDED", done.error
            if i >= 10:
                walls[name].append(elapsed)
    assert state.embedder is not None
    print(f"commit: {turns} turns each, one model call, the message kept ({state.embedder.name})")
    for name, samples in walls.items():
        print(f"  {name:<16} turn wall  {percentiles(samples)}")
    added = statistics.median(walls["with history"]) - statistics.median(walls["without history"])
    print(f"  keeping history adds {added:.2f} ms to the median turn")


# Scale


class Precomputed:
    """An embedder whose answers are known: the timed search does not embed."""

    name = "precomputed"

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors

    async def embed(self, texts: list[str]) -> Embeddings:
        return Embeddings(np.stack([self.vectors[t] for t in texts]), 1)


def _vector_text(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


async def copy_sessions(
    conn: asyncpg.Connection,
    account_id: uuid.UUID,
    action_id: uuid.UUID,
    sessions: list[tuple[str, int]],
    texts: list[str],
    vectors: np.ndarray,
    rng: np.random.Generator,
    round_size: int,
) -> None:
    """One-part user events (one turn each), by COPY, in rounds of `round_size` events a
    session, so that the sessions' rows interleave in the table as they would in service."""
    await conn.executemany(
        "INSERT INTO sessions (account_id, action_id, session_id, turns) VALUES ($1, $2, $3, $4)",
        [(account_id, action_id, name, count) for name, count in sessions],
    )
    clean = [
        t.replace("\t", " ").replace("\\", " ").replace("\n", " ").replace("\r", " ") for t in texts
    ]
    longest = max(count for _, count in sessions)
    for start in range(0, longest, round_size):
        events, part_rows = io.StringIO(), io.StringIO()
        for name, count in sessions:
            n = min(round_size, count - start)
            if n <= 0:
                continue
            a = rng.integers(0, len(texts), n)
            b = rng.integers(0, len(texts), n)
            summed = vectors[a] + vectors[b]
            summed /= np.linalg.norm(summed, axis=1, keepdims=True)
            execution = uuid.uuid4()
            for i in range(n):
                event_id = uuid.uuid4()
                text = f"{clean[a[i]]} {clean[b[i]]}"
                turn = start + i + 1
                events.write(
                    f"{account_id}\t{action_id}\t{name}\t{event_id}\t{turn}\t{execution}"
                    f"\t1\t1\tuser\t\\N\t\\N\t{{}}\t{text}\t1\tf\n"
                )
                part_rows.write(
                    f"{account_id}\t{action_id}\t{name}\t{event_id}\t1\t{turn}\tf\t{text}"
                    f"\t{_vector_text(summed[i])}\n"
                )
        await conn.copy_to_table(
            "history_events",
            source=io.BytesIO(events.getvalue().encode()),
            columns=[
                "account_id",
                "action_id",
                "session_id",
                "event_id",
                "turn",
                "execution_id",
                "invocation_number",
                "sequence",
                "who",
                "call_id",
                "tool",
                "data",
                "text",
                "parts",
                "preview",
            ],  # fmt: skip
        )
        await conn.copy_to_table(
            "history_parts",
            source=io.BytesIO(part_rows.getvalue().encode()),
            columns=[
                "account_id",
                "action_id",
                "session_id",
                "event_id",
                "part",
                "turn",
                "preview",
                "text",
                "embedding",
            ],  # fmt: skip
        )


SECONDARY = {
    "history_parts_session": "CREATE INDEX history_parts_session ON history_parts"
    " (account_id, action_id, session_id, turn DESC) INCLUDE (preview, event_id, part, tsv, tools)",
    "history_parts_words": "CREATE INDEX history_parts_words ON history_parts USING gin"
    " (account_id, action_id, session_id, tsv) WITH (fastupdate = off)",
    "history_parts_embedding": "CREATE INDEX history_parts_embedding ON history_parts"
    " USING hnsw (embedding vector_cosine_ops)",
    "history_events_order": "CREATE UNIQUE INDEX history_events_order ON history_events"
    " (account_id, action_id, session_id, turn, sequence)",
}


async def timed(
    pool: asyncpg.Pool,
    scopes: list[HistoryScope],
    questions: list[str],
    embedder: Precomputed,
    repeat: int,
    hidden: bool = False,
) -> tuple[list[float], dict[str, int], list[float]]:
    """Samples of `repeat` searches (after 10 untimed), their plans; with `hidden`, each
    search is run a second time, alternating which goes first, by a reader whose search leaves
    the memory tools' events out (HistoryScope.hidden_tools), and those samples are the third
    list."""
    samples: list[float] = []
    plans: dict[str, int] = {}
    hiding: list[float] = []
    for i in range(repeat + 10):
        scope = scopes[i % len(scopes)]
        question = questions[i % len(questions)]
        variants = [(scope, samples)]
        if hidden:
            variants.append((replace(scope, hidden_tools=NATIVE_TOOLS), hiding))
            variants = variants[:: 1 if i % 2 else -1]
        for variant, into in variants:
            started = time.perf_counter()
            found = await history_search.search(pool, embedder, variant, query=question, limit=10)
            elapsed = (time.perf_counter() - started) * 1000
            if i >= 10:
                into.append(elapsed)
                if into is samples:
                    plans[found.plan or "?"] = plans.get(found.plan or "?", 0) + 1
    return samples, plans, hiding


async def _loaded(pg: Any) -> str | None:
    """The URL of a scale database loaded by an earlier run on this data dir, if any."""
    conn = await asyncpg.connect(pg.uri())
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = 'history_scale'")
    finally:
        await conn.close()
    if not exists:
        return None
    url = pg.uri("history_scale")
    conn = await asyncpg.connect(url)
    try:
        loaded = await conn.fetchval("SELECT EXISTS (SELECT FROM history_parts)")
    finally:
        await conn.close()
    return url if loaded else None


async def scale(args: argparse.Namespace, pg: Any, convs: list[dict[str, Any]]) -> None:
    embedder = StaticEmbedder()
    url = await _loaded(pg) if args.reuse else None
    reused = url is not None
    if url is None:
        url = await fresh_database(pg, "history_scale", embedder)
    else:  # a later migration's indexes are built on the loaded table
        await asyncio.to_thread(migrate.upgrade, url)
    texts = [text for conv in convs for _, text in conv["turns"]]
    questions = [q for conv in convs for q, _ in conv["questions"]]
    started = time.perf_counter()
    vectors = (await embedder.embed(texts)).vectors
    qvectors = (await embedder.embed(questions)).vectors
    precomputed = Precomputed({q.strip(): v for q, v in zip(questions, qvectors, strict=True)})
    rng = np.random.default_rng(7)
    pool = await create_pool(url, min_size=2, max_size=4)
    try:
        async with pool.acquire() as conn:
            if reused:
                account_id, action_id = await conn.fetchrow(
                    "SELECT account_id, action_id FROM history_parts LIMIT 1"
                )
                total = await conn.fetchval("SELECT count(*) FROM history_parts")
                print(f"scale: {total:,} parts loaded by an earlier run (--reuse)")
            else:
                account_id, action_id = uuid.uuid4(), uuid.uuid4()
                await load(conn, args, account_id, action_id, texts, vectors, rng)
                print(f"scale: loaded by COPY in {time.perf_counter() - started:.0f} s")
            session_changed(conn)
            await conn.execute("SET maintenance_work_mem = '2GB'")
            for name, sql in SECONDARY.items():
                began = time.perf_counter()
                built = await conn.fetchval("SELECT to_regclass($1) IS NULL", name)
                if built:
                    await conn.execute(sql)
                    print(f"  {name} built in {time.perf_counter() - began:.0f} s")
            await conn.execute("VACUUM ANALYZE history_parts")
            await conn.execute("VACUUM ANALYZE history_events")
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            await conn.execute(
                "SELECT pg_prewarm(c.oid) FROM pg_class c"
                " WHERE c.relname LIKE 'history_%' AND c.relkind IN ('r', 'i')"
            )
        if not args.session_index:  # a reused table: as a service without them
            async with pool.acquire() as conn, conn.transaction():
                await history_indexes.drop_session_indexes(conn)
        if args.big and args.session_index:
            async with pool.acquire() as conn:
                began = time.perf_counter()
                session_changed(conn)
                await conn.execute("SET maintenance_work_mem = '2GB'")
                # As the search maintenance round does (app/history/indexes.py): here only the
                # big session is large enough.
                built, _, _ = await history_indexes.index_sessions(conn, args.big, None)
                await conn.execute("ANALYZE history_parts")
                took = time.perf_counter() - began
                print(f"  own HNSW indexes of large sessions: {len(built)} built in {took:.0f} s")
        if args.big:
            big = [HistoryScope(account_id, action_id, "big", args.big + 1, False)]
            samples, plans, hiding = await timed(
                pool, big, questions, precomputed, args.queries, args.hidden_tools
            )
            print(f"  one session of {args.big:,} events, plans {plans}:")
            print(f"    search_history   {percentiles(samples)}")
            if hiding:
                print(f"    memory tools hidden {percentiles(hiding)}")
        if args.sessions:
            small = [
                HistoryScope(account_id, action_id, f"s{s}", args.per_session + 1, False)
                for s in np.random.default_rng(8).permutation(args.sessions)[: args.queries + 10]
            ]
            print(f"  {args.sessions:,} sessions of {args.per_session:,} events:")
            # First a different session each search (the plan's count runs), then the same
            # sessions again (remembered as small: the ranking statement alone).
            for label in ("first search of a session", "the same sessions again"):
                samples, plans, hiding = await timed(
                    pool, small, questions, precomputed, args.queries, args.hidden_tools
                )
                print(f"    {label}, plans {plans}:")
                print(f"      search_history   {percentiles(samples)}")
                if hiding:
                    print(f"      memory tools hidden {percentiles(hiding)}")
    finally:
        await pool.close()


async def load(
    conn: asyncpg.Connection,
    args: argparse.Namespace,
    account_id: uuid.UUID,
    action_id: uuid.UUID,
    texts: list[str],
    vectors: np.ndarray,
    rng: np.random.Generator,
) -> None:
    """The sessions by COPY, with the secondary indexes dropped (built after, by the caller)."""
    await conn.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'bench')", account_id)
    await conn.execute(
        "INSERT INTO actions (account_id, action_id, current_version) VALUES ($1, $2, 1)",
        account_id,
        action_id,
    )
    for name in SECONDARY:
        await conn.execute(f"DROP INDEX IF EXISTS {name}")
    sessions = [(f"s{s}", args.per_session) for s in range(args.sessions)]
    # Rounds of a tenth of the big session and of each other one: every session's rows are
    # spread through the table.
    if args.sessions:
        await copy_sessions(
            conn, account_id, action_id, sessions, texts, vectors, rng,
            max(1, args.per_session // 10),
        )  # fmt: skip
    if args.big:
        await copy_sessions(
            conn, account_id, action_id, [("big", args.big)], texts, vectors, rng,
            max(1, args.big // 10),
        )  # fmt: skip


# ef_construction: what a turn's write costs into a session with its own index, and recall


@dataclass(frozen=True)
class _Keeper:
    """The execution a bench turn keeps its events for (history_store.Keeper)."""

    account_id: uuid.UUID
    action_id: uuid.UUID
    session_id: str
    execution_id: uuid.UUID
    invocation_number: int = 1
    preview: bool = False


def _predicate(account_id: uuid.UUID, action_id: uuid.UUID, session: str) -> str:
    """The session key as constants, as history_indexes' partial indexes and the index plan
    write it (so that the planner uses the session's own index)."""
    return (
        f"account_id = '{account_id}'::uuid AND action_id = '{action_id}'::uuid"
        f" AND session_id = {text_literal(session)}"
    )


def _turn_events(
    texts: list[str], vectors: np.ndarray, rng: np.random.Generator, parts: int
) -> tuple[list[KeptEvent], np.ndarray]:
    """A turn of a user message (one part) and an agent message of `parts` - 1 parts: texts
    and vectors as copy_sessions makes them (pairs of LoCoMo turns)."""
    a = rng.integers(0, len(texts), parts)
    b = rng.integers(0, len(texts), parts)
    summed = vectors[a] + vectors[b]
    summed /= np.linalg.norm(summed, axis=1, keepdims=True)
    said = [f"{texts[i]} {texts[j]}" for i, j in zip(a, b, strict=True)]
    user = KeptEvent(uuid.uuid4(), 1, "user", {"message": said[0]}, said[0], said[:1], [[]])
    agent = KeptEvent(
        uuid.uuid4(),
        2,
        "agent",
        {"content": "\n".join(said[1:])},
        "\n".join(said[1:]),
        said[1:],
        [[] for _ in said[1:]],
    )
    return [user, agent], summed


async def _insert_rate(
    conn: asyncpg.Connection,
    keeper: _Keeper,
    first_turn: int,
    turns: int,
    parts: int,
    texts: list[str],
    vectors: np.ndarray,
    rng: np.random.Generator,
    without: str | None = None,
) -> float:
    """Parts a second: `turns` turns' history written as a commit writes it
    (history_store.insert), in one transaction rolled back (the graph is the same each round);
    with `without`, that index dropped in it first."""
    batches = [_turn_events(texts, vectors, rng, parts) for i in range(turns)]
    tx = conn.transaction()
    await tx.start()
    try:
        if without is not None:
            await conn.execute(f"DROP INDEX {without}")
        started = time.perf_counter()
        for i, (events, summed) in enumerate(batches):
            await history_store.insert(conn, keeper, first_turn + i, events, summed)
        took = time.perf_counter() - started
    finally:
        await tx.rollback()
    return turns * parts / took


async def _overlaps(
    conn: asyncpg.Connection,
    where: str,
    name: str,
    qvectors: np.ndarray,
    ks: tuple[int, ...],
) -> dict[int, float]:
    """Top-k overlap of the session's HNSW search (its own index `name`, the pool's ef_search
    and iterative scan, as the index plan's vector list) with brute force over its parts."""
    rows = await conn.fetch(f"SELECT event_id, part, embedding FROM history_parts WHERE {where}")
    ids = [(r["event_id"], r["part"]) for r in rows]
    matrix = np.stack([np.asarray(r["embedding"].to_numpy(), dtype=np.float32) for r in rows])
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    sql = (
        f"SELECT event_id, part FROM history_parts WHERE {where}"
        f" ORDER BY embedding <=> $1 LIMIT {max(ks)}"
    )
    found = {k: 0 for k in ks}
    # Without the shared HNSW index (rolled back): the planner weighs the two, and a small
    # bench table can make it take the shared one, which the service's large tables do not.
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("DROP INDEX history_parts_embedding")
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {sql}", qvectors[0]))
        assert name in plan, plan  # the session's own index
        for q in qvectors:
            exact = np.argsort(-(matrix @ (q / np.linalg.norm(q))))[: max(ks)]
            got = [(r["event_id"], r["part"]) for r in await conn.fetch(sql, q)]
            for k in ks:
                found[k] += len({ids[i] for i in exact[:k]} & set(got[:k]))
    finally:
        await tx.rollback()
    return {k: found[k] / (k * len(qvectors)) for k in ks}


async def inserts(args: argparse.Namespace, pg: Any, convs: list[dict[str, Any]]) -> None:
    """A session of --big parts with its own HNSW index (among --sessions others): turns
    written into it with the index's ef_construction at 256 and 128 in turn, and the top-k
    overlap with exact of its HNSW search for graphs built or filled at either."""
    embedder = StaticEmbedder()
    url = await fresh_database(pg, "history_inserts", embedder)
    texts = [text for conv in convs for _, text in conv["turns"]]
    questions = [q for conv in convs for q, _ in conv["questions"]][: args.queries]
    vectors = (await embedder.embed(texts)).vectors
    qvectors = (await embedder.embed(questions)).vectors
    rng = np.random.default_rng(7)
    pool = await create_pool(url, min_size=1, max_size=2)
    ks = (10, CANDIDATES)
    try:
        async with pool.acquire() as conn:
            session_changed(conn)
            account_id, action_id = uuid.uuid4(), uuid.uuid4()
            started = time.perf_counter()
            await load(conn, args, account_id, action_id, texts, vectors, rng)
            print(f"inserts: loaded by COPY in {time.perf_counter() - started:.0f} s")
            await conn.execute("SET maintenance_work_mem = '2GB'")
            for sql in SECONDARY.values():
                await conn.execute(sql)
            await conn.execute("VACUUM ANALYZE history_parts")
            await conn.execute("VACUUM ANALYZE history_events")
            big = history_indexes.index_name((account_id, action_id, "big"))
            began = time.perf_counter()
            await history_indexes.index_sessions(conn, args.big, None)
            print(f"  the session's own index ({big}) built in {time.perf_counter() - began:.0f} s")
            await conn.execute("ANALYZE history_parts")
            options = await conn.fetchval("SELECT reloptions FROM pg_class WHERE relname = $1", big)
            print(f"  its options: {options}")

            # Speed: the same turns' writes at each value in turn, alternating which goes first.
            keeper = _Keeper(account_id, action_id, "big", uuid.uuid4())
            rates: dict[str, list[float]] = {"256": [], "128": [], "no own index": []}
            values = list(rates)
            for n in range(args.rounds):
                # Each value first, second and third in turn; each its own turns (the same
                # vectors again would find their rolled-back twins in the graph at once).
                for i, value in enumerate(values[n % 3 :] + values[: n % 3]):
                    if value in ("256", "128"):
                        await conn.execute(f"ALTER INDEX {big} SET (ef_construction = {value})")
                    rate = await _insert_rate(
                        conn, keeper, args.big + 1, args.insert_turns, args.turn_parts,
                        texts, vectors, np.random.default_rng([n, i]),
                        big if value == "no own index" else None,
                    )  # fmt: skip
                    rates[value].append(rate)
                # The rolled-back rows' graph elements go (untimed, repaired at 256), so that
                # later rounds walk the same graph.
                await conn.execute(f"ALTER INDEX {big} SET (ef_construction = 256)")
                await conn.execute("VACUUM history_parts")
                said = ", ".join(f"{value} {got[-1]:.0f}" for value, got in rates.items())
                print(f"  round {n + 1}, parts/s: {said}")
            for value, got in rates.items():
                print(
                    f"  {value}: {args.insert_turns} turns of {args.turn_parts} parts,"
                    f" parts/s median {statistics.median(got):.0f}"
                    f" ({', '.join(f'{r:.0f}' for r in got)}),"
                    f" ms a turn {1000 * args.turn_parts / statistics.median(got):.2f}"
                )
            ratio = [b / a for a, b in zip(rates["256"], rates["128"], strict=True)]
            print(f"  128 / 256 per round: {', '.join(f'{r:.2f}' for r in ratio)}")
            await conn.execute(f"ALTER INDEX {big} SET (ef_construction = 256)")

            # Recall: the graph as built at 256 (the session's index as the round builds it).
            where = _predicate(account_id, action_id, "big")
            print(f"  recall, {len(qvectors)} LoCoMo questions, ef_search of the pool's settings:")
            got = await _overlaps(conn, where, big, qvectors, ks)
            print(f"    built wholly at 256: {_said(got)}")
            # Built over half the parts at 256, the other half inserted at 128 (or at 256).
            half = args.big // 2
            for value in ("128", "256"):
                session = f"half{value}"
                await _copy_session(conn, account_id, action_id, "big", session, 0, half)
                name = history_indexes.index_name((account_id, action_id, session))
                target = _predicate(account_id, action_id, session)
                await _create(conn, name, target, "256")
                await conn.execute(f"ALTER INDEX {name} SET (ef_construction = {value})")
                began = time.perf_counter()
                for start in range(half, args.big, 1000):
                    await _copy_session(
                        conn, account_id, action_id, "big", session, start,
                        min(start + 1000, args.big),
                    )  # fmt: skip
                took = time.perf_counter() - began
                await conn.execute("ANALYZE history_parts")
                got = await _overlaps(conn, target, name, qvectors, ks)
                print(
                    f"    {half:,} built at 256, {args.big - half:,} inserted at {value}"
                    f" ({(args.big - half) / took:.0f} parts/s): {_said(got)}"
                )
                await conn.execute(f"DROP INDEX {name}")
            # Built wholly at 128 (what inserts at 128 alone make).
            await conn.execute(f"DROP INDEX {big}")
            began = time.perf_counter()
            await _create(conn, big, where, "128")
            print(f"    (built at 128 in {time.perf_counter() - began:.0f} s)")
            await conn.execute("ANALYZE history_parts")
            got = await _overlaps(conn, where, big, qvectors, ks)
            print(f"    built wholly at 128: {_said(got)}")
    finally:
        await pool.close()


async def _create(conn: asyncpg.Connection, name: str, where: str, ef_construction: str) -> None:
    """A session's own HNSW index as history_indexes builds it, at `ef_construction`."""
    await conn.execute(
        f"CREATE INDEX {name} ON history_parts USING hnsw (embedding vector_cosine_ops)"
        f" WITH (m = {history_indexes.OPTIONS['m']}, ef_construction = {ef_construction})"
        f" WHERE {where}"
    )


def _said(overlaps: dict[int, float]) -> str:
    return ", ".join(f"top-{k} overlap with exact {v:.4f}" for k, v in overlaps.items())


async def _copy_session(
    conn: asyncpg.Connection,
    account_id: uuid.UUID,
    action_id: uuid.UUID,
    source: str,
    target: str,
    first: int,
    last: int,
) -> None:
    """The source session's turns first+1..last, into the target session (created with the
    first), committed: a row at a time into each index, as writes do."""
    if not first:
        await conn.execute(
            "INSERT INTO sessions (account_id, action_id, session_id, turns)"
            " VALUES ($1, $2, $3, 0)",
            account_id,
            action_id,
            target,
        )
    for table in ("history_events", "history_parts"):
        columns = [
            r["attname"]
            for r in await conn.fetch(
                "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0"
                " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                table,
            )
        ]
        chosen = ", ".join(columns)
        picked = ", ".join("$3" if c == "session_id" else c for c in columns)
        await conn.execute(
            f"INSERT INTO {table} ({chosen}) SELECT {picked} FROM {table}"
            f" WHERE account_id = $1 AND action_id = $2 AND session_id = $4"
            f" AND turn > $5 AND turn <= $6",
            account_id,
            action_id,
            target,
            source,
            first,
            last,
        )


def quoting(convs: list[dict[str, Any]]) -> None:
    """How long `quoted_headers` (H7) takes an event: LoCoMo's messages, 64 events of 64 KiB of
    them joined, and 64 KiB events of lines crafted against the header pattern."""
    said = [text for conv in convs for _, text in conv["turns"]]
    joined = "\n".join(said)
    crafted_lines = {
        "`turn aaa...` (64 letters)": "turn " + "a" * 64,
        "`turn a a a ...`": "turn" + " a" * 40,
        "`1. ! ! ! ...`": "1. " + "! " * 40,
        "`turn 1, user` (headers)": "turn 1, user",
    }
    rows = [("LoCoMo messages, one event each", said[:2000])]
    rows.append(
        (
            "LoCoMo text, 64 KiB events",
            [joined[i : i + 65536] for i in range(0, len(joined) - 65535, 65536)],
        )
    )
    for name, line in crafted_lines.items():
        rows.append((f"{name}, 64 KiB events", ["\n".join([line] * (65536 // len(line)))] * 16))
    print("  quoted_headers per event:")
    for name, texts in rows:
        times = []
        for text in texts:
            started = time.perf_counter()
            history_search.quoted_headers(text)
            times.append((time.perf_counter() - started) * 1000)
        print(f"    {name}: {percentiles(times)}  max {max(times):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("locomo", type=Path, help="path to locomo-dev.json")
    parser.add_argument("--scale", action="store_true", help="the latency part only")
    parser.add_argument("--big", type=int, default=100_000, help="events in the one big session")
    parser.add_argument("--sessions", type=int, default=1000, help="sessions of --per-session")
    parser.add_argument("--per-session", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300, help="timed searches per size")
    parser.add_argument(
        "--session-index",
        action="store_true",
        help="give the big session its own HNSW index, as the search maintenance round does",
    )
    parser.add_argument(
        "--hidden-tools",
        action="store_true",
        help="with --scale: time each search also as a reader without the memory read grants "
        "(memory tools' events left out of the ranking), alternated with the plain search",
    )
    parser.add_argument(
        "--quoting",
        action="store_true",
        help="only time the quoting of header lines in events (H7), LoCoMo's and crafted ones",
    )
    parser.add_argument(
        "--inserts",
        action="store_true",
        help="only: turns written into a session of --big parts with its own HNSW index at "
        "ef_construction 256 and 128 in turn, and its search's overlap with exact for graphs "
        "built or filled at either",
    )
    parser.add_argument("--insert-turns", type=int, default=300, help="with --inserts: a round")
    parser.add_argument("--turn-parts", type=int, default=3, help="with --inserts: parts a turn")
    parser.add_argument("--rounds", type=int, default=5, help="with --inserts")
    parser.add_argument("--commit-turns", type=int, default=200)
    parser.add_argument(
        "--embedder",
        choices=("static", "minilm"),
        default="static",
        help="the quality part's embedder (minilm: the `minilm` extra); commit cost is "
        "measured with it too",
    )
    parser.add_argument(
        "--plan",
        choices=("auto", "index"),
        default="auto",
        help="index: search_history takes a large session's plan (memory search keeps its own)",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="server data dir (temp)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --data-dir: search the tables an earlier --scale run loaded there (same sizes)",
    )
    args = parser.parse_args()
    if args.plan == "index":
        history_search.EXACT_MAX_PARTS = 0  # every session counts as large
    command = "python bench/history.py " + shlex.join(sys.argv[1:])
    print(f"# {command}")
    convs = conversations(args.locomo)
    if args.quoting:
        quoting(convs)
        return
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="engram-bench-history-"))
    if args.data_dir is None:  # however the run ends, Ctrl-C as the server starts too
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    settings = {
        "shared_buffers": "4GB",
        "work_mem": "16MB",
        "random_page_cost": "1.1",
        "max_parallel_maintenance_workers": "1",
    }
    pg = tuned_server(root, settings) if args.scale or args.inserts else None
    try:
        if args.inserts:
            asyncio.run(inserts(args, pg, convs))
            return
        if args.scale:
            asyncio.run(scale(args, pg, convs))
            return
        context = multiprocessing.get_context("spawn")
        ports, stop = context.Queue(), context.Event()
        model = context.Process(target=serve_model, args=(ports, stop), daemon=True)
        model.start()
        try:
            model_url = f"http://127.0.0.1:{ports.get(timeout=60)}/v1"
            asyncio.run(_quality_and_commit(root, model_url, convs, args))
        finally:
            stop.set()
            model.join(timeout=10)
    finally:
        if pg is not None:
            pg.stop()
    print(f"reproduce: {command}")


async def _quality_and_commit(
    root: Path, model_url: str, convs: list[dict[str, Any]], args: argparse.Namespace
) -> None:
    from app.db.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(root / "pgdata")
    try:
        embedder = quality_embedder(args.embedder)
        url = await fresh_database(pg, "history_quality", embedder)
        state, caller = await open_state(url, model_url, embedder)
        try:
            await quality(state, caller, convs)
            if args.commit_turns:
                await commit_cost(state, caller, args.commit_turns)
        finally:
            await close_state(state)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
