"""Turn overhead: what the runtime itself costs per turn and per recall, model time excluded.

Runs real turns (`app.runtime.turns.execute_turn`) on a fresh embedded PostgreSQL with the
`static` embedder, against the scripted OpenAI-compatible server of the tests, which answers
at once, in a process of its own (so it takes no CPU or GIL from the runtime). A turn's
overhead is its wall time minus the time its model calls took as the client measured them
(HTTP on loopback included, so the figure is the runtime's own work: the start and commit
transactions, recall, pins, tools, transcript). Scenarios:

- plain:  memory off, one model call.
- recall: memory on, the agent holds --records records; one model call, so one recall.
- tools:  as recall, and the model calls add_memory once before answering: two calls, two
          recalls, one staged record, committed with the turn.

- session: memory off, every turn in one session, so a turn reads up to --turns + 10 earlier
          turns (rebuilt from their transcripts) and checks them against the default context
          budget (32,000 tokens: nothing is cleared or summarized).
- compact: as session, with model.contextTokens 600: earlier turns are summarized every few
          turns (the summary calls are model time, so excluded; their bookkeeping is not).

Each scenario also prints the event loop thread's CPU time a turn (the model client's
included: it cannot be told apart here) and the statements a turn sends to PostgreSQL (counted
over later, untimed turns of its own sessions with asyncpg's query logger on every pooled
connection). On a machine whose idle cores halt, each statement also costs the waking of a
backend and of this process, whatever its SQL: the wall time a turn spends beyond its CPU.

The memory agents review each turn at its end (app/runtime/review.py); the model finds nothing
worth keeping there, so the review is one more model call (its time excluded like the others')
and its own work: counting the session's unreviewed messages and recording the call.

Then one recall alone (embedding the query, hybrid search, building the memory block and the
transcript events), timed directly over the same records; and the budget check alone
(`ContextWindow.prompt` over 200 earlier turns that fit, with the memory tools' definitions).

    python bench/turn_overhead.py                        # 200 turns a scenario, 1,000 records
    python bench/turn_overhead.py --turns 50 --records 200
"""

import argparse
import asyncio
import atexit
import itertools
import json
import multiprocessing
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import percentiles, statements_sent  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))  # the scripted model server of the tests

from openai_server import OpenAIServer  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402

from app.actions.harness import parse_harness  # noqa: E402
from app.actions.model import ModelConfig  # noqa: E402
from app.actions.service import agent_principal, create_action  # noqa: E402
from app.auth.caller import Caller  # noqa: E402
from app.auth.policies import ADMIN_POLICIES  # noqa: E402
from app.auth.service import ensure_default_account  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import migrate  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.executions import store as executions_store  # noqa: E402
from app.history.store import HistoryScope  # noqa: E402
from app.memory.service import MemoryWork, NewMemory, Writer  # noqa: E402
from app.runtime.context import ContextWindow, open_window  # noqa: E402
from app.runtime.model import MODEL, ModelClient  # noqa: E402
from app.runtime.recall import Recall  # noqa: E402
from app.runtime.tools import NativeTools, tool_schemas  # noqa: E402
from app.runtime.transcript import Transcript  # noqa: E402
from app.runtime.turns import TurnRequest, execute_turn  # noqa: E402
from app.services import start_services, stop_services  # noqa: E402
from app.state import AppState  # noqa: E402

SUBJECTS = ["invoice", "refund", "shipping", "password", "plan", "address", "email", "card"]
PEOPLE = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken"]


def fact(i: int) -> str:
    person, subject = PEOPLE[i % len(PEOPLE)], SUBJECTS[(i // len(PEOPLE)) % len(SUBJECTS)]
    return f"{person}'s {subject} detail number {i} was confirmed on call {i * 7 % 997}"


def question(i: int) -> str:
    person, subject = PEOPLE[i % len(PEOPLE)], SUBJECTS[(i * 3) % len(SUBJECTS)]
    return f"What do we know about {person}'s {subject}?"


class InstantModel(OpenAIServer):
    """Answers every chat at once: with add_memory offered and no tool result yet it calls it
    (saving the user's message), otherwise it answers in text."""

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        messages = body["messages"]
        offered = [t["function"]["name"] for t in body.get("tools", [])]
        message: dict[str, Any] = {"role": "assistant", "content": "Done."}
        if request.headers.get("x-engram-purpose") == "memory":
            # The end-of-turn memory review: nothing worth keeping.
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": offered[0], "arguments": '{"candidates": []}'},
                    }
                ],
            }
        elif "add_memory" in offered and not any(m["role"] == "tool" for m in messages):
            arguments = {"summary": messages[-1]["content"][:200], "kind": "fact"}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add_memory", "arguments": json.dumps(arguments)},
                    }
                ],
            }
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse({"model": body["model"], "choices": [choice], "usage": usage})


def serve_model(ports: Any, stop: Any) -> None:
    server = InstantModel().start()
    ports.put(server.port)
    stop.wait()
    server.stop()


async def model_ms(
    state: AppState, caller: Caller, action_id: uuid.UUID, execution_id: uuid.UUID
) -> float:
    async with state.pool.acquire() as conn:
        (rows,) = await executions_store.list_event_pages(
            conn, caller.account_id, [(action_id, execution_id, None, 1000)]
        )
    return sum(r["data"]["durationMs"] for r in rows if r["type"] == "model.call")


async def preload(state: AppState, caller: Caller, action_id: uuid.UUID, records: int) -> None:
    from app.actions.service import load_action

    async with state.pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, action_id)
        assert action is not None
        await executions_store.ensure_session(conn, caller.account_id, action_id, "s0")
    assert state.embedder is not None
    for start in range(0, records, 200):
        execution_id = uuid.uuid4()
        writer = Writer(
            caller.account_id,
            action,
            execution_id,
            1,
            "s0",
            agent_principal(action_id),
            "TOOL",
            False,
        )
        work = MemoryWork(state.pool, state.embedder, writer)
        for i in range(start, min(records, start + 200)):
            await work.add(NewMemory(summary=fact(i), kind="fact", scope="AGENT"))
        async with state.pool.acquire() as conn, conn.transaction():
            await work.commit(conn)


@dataclass
class Scenario:
    walls: list[float]  # each turn's wall time, ms
    overheads: list[float]  # less its model calls' time
    cpus: list[float]  # the event loop thread's CPU time in the turn, model client included
    statements: float  # statements sent a turn (a later, untimed pass of turns)


async def scenario(
    state: AppState, caller: Caller, action_id: uuid.UUID, turns: int, per_session: int = 10
) -> Scenario:
    def request(i: int, prefix: str = "s") -> TurnRequest:
        return TurnRequest(
            action_id, f"{prefix}{i // per_session + 1}", f"{question(i)} (turn {i})"
        )

    timed = Scenario([], [], [], 0.0)
    for i in range(turns + 10):  # the first 10 warm up
        started, cpu = time.perf_counter(), time.thread_time()
        executed = await execute_turn(state, caller, request(i))
        wall = (time.perf_counter() - started) * 1000
        cpu = (time.thread_time() - cpu) * 1000
        assert executed.status == "SUCCEEDED", executed.error
        if i >= 10:
            timed.walls.append(wall)
            timed.cpus.append(cpu)
            timed.overheads.append(
                wall - await model_ms(state, caller, action_id, executed.execution_id)
            )
    # Counted apart, in sessions of their own (a later scenario reads the timed ones), so
    # that the query logger costs the timed turns nothing; the timed turns warmed the pool.
    counted, prefix = itertools.count(), f"counted-{uuid.uuid4().hex[:8]}-"

    async def ten_turns() -> None:
        for _ in range(10):
            await execute_turn(state, caller, request(next(counted), prefix))

    timed.statements = await statements_sent(state.pool, ten_turns, warm=1) / 10
    return timed


async def recall_alone(
    state: AppState, caller: Caller, action_id: uuid.UUID, count: int
) -> list[float]:
    from app.actions.service import load_action

    async with state.pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, action_id)
    assert action is not None and state.embedder is not None
    writer = Writer(
        caller.account_id, action, uuid.uuid4(), 1, "s0", agent_principal(action_id), "TOOL", False
    )
    work = MemoryWork(state.pool, state.embedder, writer)
    samples: list[float] = []
    for i in range(count + 10):
        transcript = Transcript(1)
        tools = NativeTools(work, action.harness.memory, transcript, state.embedder.name)
        recall = Recall(tools, transcript, question(i))
        started = time.perf_counter()
        block = await recall.before_call("")
        elapsed = (time.perf_counter() - started) * 1000
        assert block is not None
        if i >= 10:
            samples.append(elapsed)
    return samples


async def window_alone(
    state: AppState, caller: Caller, action_id: uuid.UUID, count: int
) -> tuple[int, list[float]]:
    """Opening a turn's context window over the session the `session` scenario left: its
    earlier turns read from their transcripts and rebuilt as messages."""
    samples: list[float] = []
    size = 0
    for i in range(count + 10):
        started = time.perf_counter()
        window = await open_window(
            state.pool,
            HistoryScope(caller.account_id, action_id, "s1", None, False),
            budget=32_000,
            reserve=0,
            history=None,
            client=None,  # type: ignore[arg-type]
            config=ModelConfig(),
            account_id=caller.account_id,
            transcript=Transcript(1),
            after_call=None,  # type: ignore[arg-type]
        )
        if i >= 10:
            samples.append((time.perf_counter() - started) * 1000)
        size = len(window.entries)
    return size, samples


def budget_check_alone(count: int) -> list[float]:
    """`ContextWindow.prompt` over 200 earlier turns that fit the default budget."""
    harness = parse_harness({"memory": {"enabled": True, "tools": ["add_memory"]}})
    tools = list(tool_schemas(harness.memory).values())
    window = ContextWindow(32_000, 0, None, None, ModelConfig(), None, Transcript(1), None, [])  # type: ignore[arg-type]
    for i in range(200):
        window.add_turn(
            i + 1,
            [
                {"role": "user", "content": f"{question(i)} (turn {i}) " + fact(i)},
                {"role": "assistant", "content": "Noted: " + fact(i + 1)},
            ],
        )
    system = {"role": "system", "content": "You help. " * 40}
    asked = {"role": "user", "content": question(0)}
    samples: list[float] = []

    async def run() -> None:
        for i in range(count + 10):
            started = time.perf_counter()
            await window.prompt(system, tools, None, asked, [])
            if i >= 10:
                samples.append((time.perf_counter() - started) * 1000)

    asyncio.run(run())
    return samples


async def bench(args: argparse.Namespace, model_url: str) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="engram-bench-turns-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # Ctrl-C as the server starts too
    pg = EmbeddedPostgres(root / "pgdata")
    try:
        admin_conn = await asyncpg.connect(pg.uri())
        await admin_conn.execute("CREATE DATABASE engram_bench")
        await admin_conn.close()
        url = pg.uri("engram_bench")
        await asyncio.to_thread(migrate.upgrade, url)
        pool = await create_pool(url, min_size=2, max_size=8)
        settings = Settings(database_url=url, model_base_url=model_url, model_name="scripted")
        state = AppState(settings=settings, pool=pool, embedder=StaticEmbedder())
        await start_services(state)
        state.services[MODEL] = ModelClient(settings)
        async with pool.acquire() as conn:
            account_id = await ensure_default_account(conn)
        caller = Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)

        plain = await create_action(
            pool, caller, name="plain", instructions="You help.", model=None, harness=None
        )
        memory = {
            "enabled": True,
            "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        }
        recalling = await create_action(
            pool,
            caller,
            name="recall",
            instructions="You help.",
            model=None,
            harness={"memory": memory},
        )
        tooled = await create_action(
            pool,
            caller,
            name="tools",
            instructions="You help.",
            model=None,
            harness={"memory": {**memory, "tools": ["add_memory"]}},
        )
        compact = await create_action(
            pool,
            caller,
            name="compact",
            instructions="You help.",
            model={"contextTokens": 600},
            harness=None,
        )
        for agent in (recalling, tooled):
            await preload(state, caller, agent.action_id, args.records)
        async with pool.acquire() as conn:
            # The statistics a running service would have: autovacuum has not run yet.
            await conn.execute("VACUUM ANALYZE agent_memories")

        results: dict[str, Any] = {}
        results["plain"] = await scenario(state, caller, plain.action_id, args.turns)
        results["recall"] = await scenario(state, caller, recalling.action_id, args.turns)
        results["tools"] = await scenario(state, caller, tooled.action_id, args.turns)
        one_session = args.turns + 10
        results["session"] = await scenario(
            state, caller, plain.action_id, args.turns, per_session=one_session
        )
        results["window"] = await window_alone(state, caller, plain.action_id, args.recalls)
        results["compact"] = await scenario(
            state, caller, compact.action_id, args.turns, per_session=one_session
        )
        results["recall alone"] = await recall_alone(
            state, caller, recalling.action_id, args.recalls
        )
        await stop_services(state)  # the model client and search maintenance
        await pool.close()
        return results
    finally:
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200, help="timed turns per scenario")
    parser.add_argument("--records", type=int, default=1000, help="records each memory agent holds")
    parser.add_argument("--recalls", type=int, default=300, help="timed recalls alone")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    ports, stop = context.Queue(), context.Event()
    model = context.Process(target=serve_model, args=(ports, stop), daemon=True)
    model.start()
    try:
        results = asyncio.run(bench(args, f"http://127.0.0.1:{ports.get(timeout=60)}/v1"))
    finally:
        stop.set()
        model.join(timeout=10)

    print("$ python " + " ".join(shlex.quote(a) for a in sys.argv))
    print(
        f"{args.turns} turns a scenario, {args.records} records per memory agent, static embedder"
    )
    print("turn wall time, and overhead (wall minus the model calls' time):")
    for name in ("plain", "recall", "tools", "session", "compact"):
        run: Scenario = results[name]
        print(f"  {name:<7} wall      {percentiles(run.walls)}")
        print(f"  {name:<7} overhead  {percentiles(run.overheads)}")
        print(
            f"  {name:<7} CPU       {percentiles(run.cpus)}  (the thread's, model client "
            f"included; {run.statements:.1f} statements a turn)"
        )
    print(f"one recall alone ({args.recalls} recalls):")
    print(f"  recall            {percentiles(results['recall alone'])}")
    size, samples = results["window"]
    print(f"opening a context window alone, {size} earlier messages ({args.recalls} opens):")
    print(f"  open_window       {percentiles(samples)}")
    print(f"the budget check alone, 200 earlier turns that fit ({args.recalls} checks):")
    print(f"  prompt            {percentiles(budget_check_alone(args.recalls))}")


if __name__ == "__main__":
    main()
