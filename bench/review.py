"""The memory review: does it show the record a candidate restates, what does it cost, and
do restated facts pile up?

1. Neighbour recall@5 on the LoCoMo dev half (`locomo-dev.json`, path as an argument): each
   conversation is one agent holding its `observation` facts as records (created at their
   session's date); each dialog turn a fact cites as evidence is a candidate (its text as
   `"<speaker>: <text>"`, plus the shared image's caption); recall@5 is the share of the
   facts citing it among the neighbours the review shows (app/memory/review.neighbours, the
   code the review runs), averaged over candidates. Also: how many candidates have a
   neighbour at or above similarity floors, for their own agent (they restate a record) and
   for another conversation's agent (they restate nothing there), which is how the default
   floor (ENGRAM_MEMORY_REVIEW_FLOOR) was chosen. And how alike one review's candidates are
   (each session's facts as one review's), against paraphrased pairs: how the floor from which
   a candidate is shown an earlier one it may restate (RESTATES_FLOOR) was chosen.
2. The review's own cost at the end of a turn, with an agent of --records records: real turns
   (app.runtime.turns.execute_turn) against a scripted model in a process of its own that
   answers at once; the review's overhead is the turn's wall time minus its model calls'
   time, minus the same for a turn of an agent whose review is not due. Also model calls and
   prompt tokens per review (as the scripted model counts them, about one per word).
3. Pile-up: 100 turns restating 10 facts in varied wording; the scripted decider skips a
   candidate only when the record it restates was among the neighbours shown, and adds it
   otherwise. Ratio = records kept / distinct facts (1.0: nothing piled up).

    python bench/review.py /path/to/locomo-dev.json
    python bench/review.py /path/to/locomo-dev.json --turns 50 --records 1000
"""

import argparse
import asyncio
import atexit
import json
import multiprocessing
import random
import shlex
import shutil
import statistics
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

from common import NEW_AGENT, bench_record, fresh_database, percentiles  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))  # the scripted model server of the tests

from openai_server import OpenAIServer  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402

from app.actions.harness import SearchConfig  # noqa: E402
from app.actions.service import agent_principal, create_action, load_action  # noqa: E402
from app.auth.caller import Caller  # noqa: E402
from app.auth.policies import ADMIN_POLICIES  # noqa: E402
from app.auth.service import ensure_default_account  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import migrate  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.base import Embedder  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.executions import store as executions_store  # noqa: E402
from app.memory import review as memory_review  # noqa: E402
from app.memory.service import MemoryWork, NewMemory, Writer  # noqa: E402
from app.memory.store import copy_committed  # noqa: E402
from app.memory.vectors import memory_text  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402
from app.runtime.model import MODEL, ModelClient  # noqa: E402
from app.runtime.turns import TurnRequest, execute_turn  # noqa: E402
from app.services import start_services, stop_services  # noqa: E402
from app.state import AppState  # noqa: E402

FLOORS = (0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7)


def evidence_ids(evidence: Any) -> set[str]:
    import re

    items = evidence if isinstance(evidence, list) else [evidence]
    found = set()
    for item in items:
        for match in re.finditer(r"D(\d+):(\d+)", str(item).replace("D:", "D")):
            found.add(f"D{match.group(1)}:{match.group(2)}")
    return found


def session_time(value: str) -> Any:
    from datetime import UTC, datetime

    return datetime.strptime(value, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


@dataclass
class Conversation:
    id: str
    facts: list[tuple[str, Any]]  # text, created
    candidates: dict[str, tuple[str, set[int]]]  # dia_id -> (text, the facts citing it)


def conversations(path: Path) -> list[Conversation]:
    result = []
    for sample in json.loads(path.read_text()):
        conv = sample["conversation"]
        turns = {}
        for key, session in conv.items():
            if key.startswith("session_") and isinstance(session, list):
                for turn in session:
                    text = f"{turn['speaker']}: {turn['text']}"
                    if turn.get("blip_caption"):
                        text += f" [shares {turn['blip_caption']}]"
                    turns[turn["dia_id"]] = text
        facts: list[tuple[str, Any]] = []
        citing: dict[str, set[int]] = {}
        for key, by_speaker in sample["observation"].items():
            number = key.split("_")[1]
            created = session_time(conv[f"session_{number}_date_time"])
            for observations in by_speaker.values():
                for text, evidence in observations:
                    for dia in evidence_ids(evidence):
                        if dia in turns:
                            citing.setdefault(dia, set()).add(len(facts))
                    facts.append((text, created))
        candidates = {dia: (turns[dia], facts_) for dia, facts_ in citing.items()}
        result.append(Conversation(sample["sample_id"], facts, candidates))
    return result


async def load_facts(
    pool: asyncpg.Pool, embedder: Embedder, conv: Conversation
) -> tuple[OperatorReader, dict[uuid.UUID, int]]:
    account, action = uuid.uuid4(), uuid.uuid4()
    vectors = (await embedder.embed([memory_text(t, "") for t, _ in conv.facts])).vectors
    ids = [uuid.uuid4() for _ in conv.facts]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO accounts (account_id, name) VALUES ($1, $2)", account, conv.id
        )
        await conn.execute(NEW_AGENT, account, action)
        records = [
            bench_record(account, action, text, memory_id=memory_id, created=created, kind="fact")
            for memory_id, (text, created) in zip(ids, conv.facts, strict=True)
        ]
        await copy_committed(conn, records, vectors)
    return OperatorReader(account, action), {m: i for i, m in enumerate(ids)}


async def neighbour_recall(pg: EmbeddedPostgres, data: Path, limit: int) -> None:
    embedder = StaticEmbedder()
    url = await fresh_database(pg, "review_recall", embedder)
    pool = await create_pool(url, min_size=1, max_size=2)
    config = SearchConfig()
    try:
        convs = conversations(data)
        loaded = [await load_facts(pool, embedder, c) for c in convs]
        await pool.execute("ANALYZE agent_memories")
        total, count = 0.0, 0
        own = dict.fromkeys(FLOORS, 0)
        other = dict.fromkeys(FLOORS, 0)
        for n, (conv, (reader, ids)) in enumerate(zip(convs, loaded, strict=True)):
            stranger = loaded[(n + 1) % len(loaded)][0]
            for text, citing in conv.candidates.values():
                found = await memory_review.neighbours(pool, embedder, reader, config, text, limit)
                shown = {ids[r.memory_id] for r in found.records}
                total += len(shown & citing) / len(citing)
                count += 1
                best = max(found.similarity.values(), default=0.0)
                unrelated = await memory_review.neighbours(
                    pool, embedder, stranger, config, text, limit
                )
                best_other = max(unrelated.similarity.values(), default=0.0)
                for floor in FLOORS:
                    own[floor] += best >= floor
                    other[floor] += best_other >= floor
    finally:
        await pool.close()
    facts = sum(len(c.facts) for c in convs)
    print(f"neighbour recall@{limit}: {total / count:.3f}  ({count} candidates, {facts} facts)")
    print("candidates with a neighbour at or above the similarity floor (static embedder):")
    print("  floor             " + "  ".join(f"{f:5.2f}" for f in FLOORS))
    print("  own agent         " + "  ".join(f"{own[f] / count:5.3f}" for f in FLOORS))
    print("  another agent     " + "  ".join(f"{other[f] / count:5.3f}" for f in FLOORS))
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        await restated_candidates(pool, embedder, data)
    finally:
        await pool.close()


# Paraphrased pairs: what the review should show as one candidate restating another.
PARAPHRASES = [
    ("Ada lives in Berlin", "Ada's home is in Berlin"),
    ("Caroline is researching adoption agencies", "Caroline is looking into adoption agencies"),
    (
        "Melanie painted a lake sunrise last year",
        "Last year Melanie made a painting of a sunrise over a lake",
    ),
    ("John's daughter starts school in September", "In September, John's daughter begins school"),
    (
        "The user prefers email over phone calls",
        "The user would rather be contacted by email than by phone",
    ),
    ("Ada's refund for order 5521 was approved", "Order 5521's refund was approved for Ada"),
    ("Bob is allergic to peanuts", "Bob has a peanut allergy"),
    ("The customer's plan renews on March 3", "The customer's subscription renews on 3 March"),
    ("Maria works as a nurse at St. Mary's hospital", "Maria is a nurse; she works at St. Mary's"),
    ("Tom wants to run a marathon next year", "Tom's goal for next year is to run a marathon"),
    ("The user's dog is called Rex", "The user has a dog named Rex"),
    ("Jon lost his job as a banker", "Jon was let go from his banking job"),
]
RESTATES_FLOORS = (0.4, 0.6, 0.7, 0.8)


async def restated_candidates(pool: asyncpg.Pool, embedder: Embedder, data: Path) -> None:
    """How alike one review's candidates are (memory_review.restated, which shows a candidate
    the earlier ones it may restate): each LoCoMo session's observation facts (both speakers',
    distinct facts) as one review's candidates, against paraphrased pairs."""
    facts, reviews = 0, 0
    alike = dict.fromkeys(RESTATES_FLOORS, 0)
    flagged = dict.fromkeys(RESTATES_FLOORS, 0)
    for sample in json.loads(data.read_text()):
        for by_speaker in sample["observation"].values():
            texts = [text for observations in by_speaker.values() for text, _ in observations]
            if len(texts) < 2:
                continue
            vectors = list((await embedder.embed(texts)).vectors)
            near = await memory_review.restated(pool, texts, vectors)
            facts, reviews = facts + len(texts), reviews + 1
            for floor in RESTATES_FLOORS:
                found = sum(any(s >= floor for s in n.values()) for n in near)
                alike[floor] += found
                flagged[floor] += found > 0
    pairs = []
    for a, b in PARAPHRASES:
        vectors = list((await embedder.embed([a, b])).vectors)
        pairs.append((await memory_review.restated(pool, [a, b], vectors))[1][0])
    print(f"one review's candidates alike (LoCoMo sessions: {reviews}, {facts} distinct facts):")
    print("  floor                          " + "  ".join(f"{f:5.2f}" for f in RESTATES_FLOORS))
    print(
        "  candidates with an earlier one "
        + "  ".join(f"{alike[f] / facts:5.3f}" for f in RESTATES_FLOORS)
    )
    print(
        "  reviews with one               "
        + "  ".join(f"{flagged[f] / reviews:5.3f}" for f in RESTATES_FLOORS)
    )
    print(f"  {len(pairs)} paraphrased pairs: " + ", ".join(f"{s:.3f}" for s in sorted(pairs)))


# 2 and 3: real turns against a scripted model in a process of its own.

FACTS = [
    ("Ada's favourite colour is green", ["Ada likes green best", "green is the colour Ada loves"]),
    ("Ada lives in Lisbon", ["Ada's home is in Lisbon", "Ada is based in Lisbon, Portugal"]),
    ("Ada works as a pilot", ["Ada flies planes for a living", "Ada's job is pilot"]),
    ("Ada is allergic to peanuts", ["peanuts give Ada an allergy", "Ada cannot eat peanuts"]),
    ("Ada's daughter is named Mia", ["Mia is Ada's daughter", "Ada has a daughter called Mia"]),
    ("Ada prefers email over calls", ["Ada wants email, not phone calls", "email suits Ada"]),
    ("Ada drives a red Volvo", ["Ada's car is a red Volvo", "Ada owns a Volvo, red"]),
    ("Ada's birthday is 3 March", ["Ada was born on March 3", "3 March is Ada's birthday"]),
    ("Ada plays the cello", ["Ada is a cellist", "the cello is Ada's instrument"]),
    ("Ada is vegetarian", ["Ada eats no meat", "Ada follows a vegetarian diet"]),
]


def filler(i: int) -> str:
    subjects = ["invoice", "refund", "shipping", "password", "plan", "address", "email", "card"]
    people = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken"]
    return (
        f"{people[i % 8]}'s {subjects[(i // 8) % 8]} detail number {i} was confirmed on call "
        f"{i * 7 % 997}"
    )


class ScriptedReviewer(OpenAIServer):
    """Answers at once. Turn calls: text. The candidate call: the user message's words after
    `STATE: ` as one candidate (`fact`), or none. The decide call: `skip` when a shown record
    is the fact the candidate restates (the `[fact N]` tag both carry), else `add`."""

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        purpose = request.headers.get("x-engram-purpose")
        messages = body["messages"]
        message: dict[str, Any] = {"role": "assistant", "content": "Noted."}
        if purpose == "memory":
            tool = body["tools"][0]["function"]["name"]
            text = messages[-1]["content"]
            if tool == "remember":
                said = [
                    line.split("STATE: ", 1)[1] for line in text.splitlines() if "STATE: " in line
                ]
                candidates = [{"summary": s.strip(), "kind": "fact"} for s in said[-1:]]
                arguments: dict[str, Any] = {"candidates": candidates}
            else:
                shown = json.loads(text.replace("\\u003c", "<"))
                decisions = []
                for c in shown["candidates"]:
                    tag = c["summary"].rsplit("[", 1)[-1]
                    seen = any(
                        shown["records"][h]["summary"].rsplit("[", 1)[-1] == tag
                        for h in c["neighbours"]
                    )
                    decisions.append(
                        {"candidate": c["handle"], "action": "skip" if seen else "add"}
                    )
                arguments = {"decisions": decisions}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps(arguments)},
                    }
                ],
            }
        prompt = sum(len(str(m.get("content") or "").split()) for m in messages)
        usage = {"prompt_tokens": prompt, "completion_tokens": 10, "total_tokens": prompt + 10}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse({"model": body["model"], "choices": [choice], "usage": usage})


def serve_model(ports: Any, stop: Any) -> None:
    server = ScriptedReviewer().start()
    ports.put(server.port)
    stop.wait()
    server.stop()


async def transcript(
    state: AppState, caller: Caller, action_id: uuid.UUID, execution_id: uuid.UUID
) -> list[Any]:
    async with state.pool.acquire() as conn:
        (rows,) = await executions_store.list_event_pages(
            conn, caller.account_id, [(action_id, execution_id, None, 1000)]
        )
    return rows


async def preload(state: AppState, caller: Caller, action_id: uuid.UUID, records: int) -> None:
    async with state.pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, action_id)
        assert action is not None
        await executions_store.ensure_session(conn, caller.account_id, action_id, "s0")
    assert state.embedder is not None
    for start in range(0, records, 200):
        writer = Writer(
            caller.account_id,
            action,
            uuid.uuid4(),
            1,
            "s0",
            agent_principal(action_id),
            "TOOL",
            False,
        )
        work = MemoryWork(state.pool, state.embedder, writer)
        for i in range(start, min(records, start + 200)):
            await work.add(NewMemory(summary=filler(i), kind="fact", scope="AGENT"))
        async with state.pool.acquire() as conn, conn.transaction():
            await work.commit(conn)


async def turns(
    state: AppState, caller: Caller, action_id: uuid.UUID, inputs: list[str], session: str
) -> list[tuple[float, list[Any]]]:
    """Runs the turns; returns each one's overhead (wall minus model time) and transcript."""
    out = []
    for text in inputs:
        started = time.perf_counter()
        executed = await execute_turn(state, caller, TurnRequest(action_id, session, text))
        wall = (time.perf_counter() - started) * 1000
        assert executed.status == "SUCCEEDED", executed.error
        rows = await transcript(state, caller, action_id, executed.execution_id)
        model = sum(r["data"]["durationMs"] for r in rows if r["type"] == "model.call")
        out.append((wall - model, rows))
    return out


async def runtime_figures(args: argparse.Namespace, model_url: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="engram-bench-review-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # Ctrl-C as the server starts too
    pg = EmbeddedPostgres(root / "pgdata")
    try:
        admin_conn = await asyncpg.connect(pg.uri())
        await admin_conn.execute("CREATE DATABASE engram_bench")
        await admin_conn.close()
        url = pg.uri("engram_bench")
        await asyncio.to_thread(migrate.upgrade, url)
        pool = await create_pool(url, min_size=2, max_size=8)
        settings = Settings(
            database_url=url,
            model_base_url=model_url,
            model_name="scripted",
            search_maintenance_seconds=0,
        )
        state = AppState(settings=settings, pool=pool, embedder=StaticEmbedder())
        await start_services(state)
        state.services[MODEL] = ModelClient(settings)
        async with pool.acquire() as conn:
            account_id = await ensure_default_account(conn)
        caller = Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)
        scope = {"read": ["session", "agent"], "write": ["session", "agent"]}

        async def agent(name: str, extraction: dict[str, Any]) -> uuid.UUID:
            memory = {"enabled": True, "scope": scope, "extraction": extraction}
            created = await create_action(
                pool,
                caller,
                name=name,
                instructions="You help.",
                model=None,
                harness={"memory": memory},
            )
            return created.action_id

        reviewing = await agent("review", {"every": "turn"})
        waiting = await agent("waiting", {"every": {"messages": 10**4}})
        for action_id in (reviewing, waiting):
            await preload(state, caller, action_id, args.records)
        async with pool.acquire() as conn:
            await conn.execute("VACUUM ANALYZE agent_memories")

        # 2. Cost. A turn that states one new fact: one candidate, with neighbours at the floor,
        # so two model calls. A turn with nothing worth keeping: one model call.
        stating = [f"STATE: {filler(args.records + i)} (turn {i})" for i in range(args.turns + 10)]
        chatting = [f"How are you today? (turn {i})" for i in range(args.turns + 10)]
        print(f"\nreview cost: agent of {args.records} records, {args.turns} turns, static")
        for name, inputs in (("nothing to keep", chatting), ("one new fact", stating)):
            # The same turns without a review due (another session each): the baseline.
            quiet = (await turns(state, caller, waiting, inputs, f"w-{name}"))[10:]
            runs = (await turns(state, caller, reviewing, inputs, f"r-{name}"))[10:]
            own = statistics.fmean(o for o, _ in runs) - statistics.fmean(o for o, _ in quiet)
            calls = [[r["data"] for r in rows if r["type"] == "model.call"] for _, rows in runs]
            calls = [[c for c in turn if c["purpose"] == "memory"] for turn in calls]
            tokens = statistics.fmean(sum(c["usage"]["prompt_tokens"] for c in t) for t in calls)
            print(f"  {name}:")
            print(f"    no review due  overhead {percentiles([o for o, _ in quiet])}")
            print(f"    reviewed       overhead {percentiles([o for o, _ in runs])}")
            print(
                f"    the review's own overhead {own:.2f} ms (difference of the means); "
                f"{statistics.fmean(len(c) for c in calls):.2f} model calls and {tokens:.0f} "
                "prompt tokens per review (about one a word)"
            )

        # 3. Pile-up: 100 turns restating 10 facts in varied wording.
        piling = await agent("pile", {"every": "turn"})
        rng = random.Random(7)
        statements = []
        for i in range(args.pile_turns):
            n = i % len(FACTS) if i < len(FACTS) else rng.randrange(len(FACTS))
            summary, variants = FACTS[n]
            said = summary if i < len(FACTS) else rng.choice([summary, *variants])
            statements.append(f"STATE: {said} [fact {n}]")
        await turns(state, caller, piling, statements, "p")
        async with pool.acquire() as conn:
            kept = await conn.fetchval(
                "SELECT count(*) FROM agent_memories WHERE account_id = $1 AND action_id = $2 "
                "AND status = 'ACTIVE'",
                account_id,
                piling,
            )
        print(
            f"\npile-up after {args.pile_turns} turns restating {len(FACTS)} facts: "
            f"{kept} records kept, ratio {kept / len(FACTS):.2f}"
        )
        await stop_services(state)
        await pool.close()
    finally:
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("locomo", type=Path, help="path to locomo-dev.json")
    parser.add_argument("--limit", type=int, default=5, help="neighbours shown per candidate")
    parser.add_argument("--turns", type=int, default=100, help="timed turns for the cost")
    parser.add_argument("--records", type=int, default=1000, help="records the agent holds")
    parser.add_argument("--pile-turns", type=int, default=100)
    parser.add_argument("--skip", choices=("recall", "runtime"), default=None)
    args = parser.parse_args()
    print("$ python bench/review.py " + shlex.join(sys.argv[1:]))
    if args.skip != "recall":
        root = Path(tempfile.mkdtemp(prefix="engram-bench-review-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)  # Ctrl-C as it starts too
        pg = EmbeddedPostgres(root / "pgdata")
        try:
            asyncio.run(neighbour_recall(pg, args.locomo, args.limit))
        finally:
            pg.stop()
    if args.skip != "runtime":
        context = multiprocessing.get_context("spawn")
        ports, stop = context.Queue(), context.Event()
        model = context.Process(target=serve_model, args=(ports, stop), daemon=True)
        model.start()
        try:
            asyncio.run(runtime_figures(args, f"http://127.0.0.1:{ports.get(timeout=60)}/v1"))
        finally:
            stop.set()
            model.join(timeout=10)


if __name__ == "__main__":
    main()
