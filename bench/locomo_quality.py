"""Retrieval quality on the LoCoMo dev half, through the real memory search.

Each conversation becomes one agent; each turn one record (summary = "<speaker>: <text>",
plus " [shares <caption>]" when the turn carries an image caption), created at its session's
date so newer turns win ties. Every non-adversarial question (category != 5) that has evidence
is asked through `app.memory.search.search` in each mode, and recall@k is the fraction of the
question's evidence turns among the top k, averaged over questions.

    python bench/locomo_quality.py --locomo PATH          # static, and minilm when installed
    python bench/locomo_quality.py --locomo PATH --sweep  # also the fusion weight sweep and RRF
    python bench/locomo_quality.py --locomo PATH --reader session --listed

`--reader session` writes each conversation to one session's scope and asks as a turn of that
session reading session scope alone (the harness's defaults), instead of as an operator over
agent-scope records; `--reader turn` the same, the turn reading agent scope too. `--listed`
first gives every conversation's agent its own indexes and word counts, as the search upkeep
does for an agent of `ENGRAM_AGENT_INDEX_MIN_RECORDS` or more.

PATH is LoCoMo's data/locomo10.json (https://github.com/snap-research/locomo, CC BY-NC 4.0),
or a file of its dev half; see bench/README.md.

`--sweep` reruns hybrid through the real SQL for fusion weights 0..1 and computes weighted
reciprocal-rank fusion from the real lexical and vector rankings, which is how the fusion in
app/memory/search.py was chosen (bench/README.md).
"""

import argparse
import asyncio
import atexit
import re
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import NEW_AGENT, add_locomo_argument, bench_record, fresh_database, load_locomo  # noqa: E402

from app.actions.harness import SearchConfig  # noqa: E402
from app.db.embedded import EmbeddedPostgres  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.base import Embedder  # noqa: E402
from app.memory import maintenance  # noqa: E402
from app.memory import search as search_module  # noqa: E402
from app.memory.search import search  # noqa: E402
from app.memory.search_store import Filters  # noqa: E402
from app.memory.store import copy_committed  # noqa: E402
from app.memory.vectors import memory_text  # noqa: E402
from app.memory.visibility import AgentReader, OperatorReader, Reader  # noqa: E402
from app.scope import Scope  # noqa: E402

SAMPLES: list[dict[str, Any]] = []  # LoCoMo's dev half, read from --locomo in main()
KS = (1, 5, 10, 20)
MODES = ("lexical", "vector", "hybrid")
DIA = re.compile(r"D(\d+):(\d+)")


def evidence_ids(evidence: list[str]) -> set[str]:
    """Evidence turn ids; tolerates the set's few malformed ones ("D8:6; D9:17", "D:11:26")."""
    found: set[str] = set()
    for item in evidence:
        for match in DIA.finditer(str(item).replace("D:", "D")):
            found.add(f"D{match.group(1)}:{match.group(2)}")
    return found


def session_time(value: str) -> datetime:
    return datetime.strptime(value, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def conversations() -> list[dict[str, Any]]:
    result = []
    for sample in SAMPLES:
        conv = sample["conversation"]
        turns = []
        for key, session in conv.items():
            if not (key.startswith("session_") and isinstance(session, list)):
                continue
            start = session_time(conv[f"{key}_date_time"])
            for n, turn in enumerate(session):
                summary = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    summary += f" [shares {turn['blip_caption']}]"
                turns.append((turn["dia_id"], summary, start + timedelta(seconds=n)))
        questions = [
            (qa["question"], evidence_ids(qa.get("evidence", [])))
            for qa in sample["qa"]
            if qa.get("category") != 5
        ]
        result.append(
            {"id": sample["sample_id"], "turns": turns, "questions": [q for q in questions if q[1]]}
        )
    return result


def make_embedder(name: str) -> Embedder | None:
    if name == "static":
        from app.embeddings.static import StaticEmbedder

        return StaticEmbedder()
    try:
        from app.embeddings.minilm import MiniLMEmbedder

        return MiniLMEmbedder()
    except Exception as e:  # not installed: report and go on with the others
        print(f"# {name}: not available ({e})")
        return None


async def load(
    pool: asyncpg.Pool, embedder: Embedder, conv: dict[str, Any], reader: str
) -> tuple[Reader, dict[UUID, str]]:
    """The conversation as one agent's records, and who asks: an operator (agent scope) or a
    turn of the conversation's session (session scope, alone or with agent scope)."""
    account, action = uuid.uuid4(), uuid.uuid4()
    texts = [summary for _, summary, _ in conv["turns"]]
    vectors = (await embedder.embed([memory_text(t, "") for t in texts])).vectors
    ids = {uuid.uuid4(): dia for dia, _, _ in conv["turns"]}
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO accounts (account_id, name) VALUES ($1, $2)", account, conv["id"]
        )
        await conn.execute(NEW_AGENT, account, action)
        scope = {"scope": "SESSION", "session_id": conv["id"]} if reader != "operator" else {}
        records = [
            bench_record(account, action, summary, memory_id=memory_id, created=created, **scope)
            for memory_id, (_, summary, created) in zip(ids, conv["turns"], strict=True)
        ]
        await copy_committed(conn, records, vectors)
    if reader != "operator":
        scopes = (Scope.SESSION,) if reader == "session" else (Scope.AGENT, Scope.SESSION)
        return AgentReader(account, action, conv["id"], scopes, False), ids
    return OperatorReader(account, action), ids


def recall(found: list[str], evidence: set[str], k: int) -> float:
    return len(set(found[:k]) & evidence) / len(evidence)


async def evaluate(
    url: str, embedder: Embedder, sweep: bool, reader: str = "operator", listed: bool = False
) -> dict[str, dict[int, float]]:
    pool = await create_pool(url, min_size=1, max_size=2)
    config = SearchConfig()
    totals: dict[str, dict[int, float]] = {m: dict.fromkeys(KS, 0.0) for m in MODES}
    weights = [round(w * 0.1, 1) for w in range(11)]
    swept: dict[float, float] = dict.fromkeys(weights, 0.0)
    rrf_grid = [(w, k) for w in (0.3, 0.4, 0.5, 0.6) for k in (5, 10, 20, 60)]
    rrf: dict[tuple[float, int], float] = dict.fromkeys(rrf_grid, 0.0)
    count = 0
    try:
        loaded = [(conv, *await load(pool, embedder, conv, reader)) for conv in conversations()]
        await pool.execute("ANALYZE agent_memories")
        if listed:
            done = await maintenance.run_round(pool, min_records=1)
            print(f"  {done.counted} agents listed with their own indexes and word counts")
        for conv, reader, ids in loaded:
            for question, evidence in conv["questions"]:
                count += 1
                for mode in MODES:
                    result = await search(
                        pool, embedder, reader, config, query=question, mode=mode, limit=max(KS)
                    )
                    found = [ids[r.memory_id] for r in result.records]
                    for k in KS:
                        totals[mode][k] += recall(found, evidence, k)
                if not sweep:
                    continue
                vector = (await embedder.embed([question])).vectors[0]
                for w in weights:
                    ranking = search_module.make_ranking("hybrid", question, vector, None, 10, w)
                    records, _ = await search_module.ranked(pool, reader, Filters(), ranking)
                    swept[w] += recall([ids[r.memory_id] for r in records], evidence, 10)
                full = {}
                for mode in ("lexical", "vector"):
                    result = await search(
                        pool, embedder, reader, config, query=question, mode=mode, limit=1000
                    )
                    full[mode] = {
                        ids[r.memory_id]: rank for rank, r in enumerate(result.records, 1)
                    }
                for w, k in rrf_grid:
                    fused = sorted(
                        ids.values(),
                        key=lambda d: (
                            -(
                                w / (k + full["vector"].get(d, 10**9))
                                + (1 - w) / (k + full["lexical"].get(d, 10**9))
                            )
                        ),
                    )
                    rrf[(w, k)] += recall(fused, evidence, 10)
    finally:
        await pool.close()
    print(f"  {count} questions (non-adversarial, with evidence)")
    for mode in MODES:
        cells = "  ".join(f"R@{k} {totals[mode][k] / count:.3f}" for k in KS)
        print(f"  {mode:8s} {cells}")
    if sweep:
        print("  hybrid recall@10 by fusion weight of the cosine (real SQL):")
        print("   " + "  ".join(f"{w:.1f}: {v / count:.3f}" for w, v in swept.items()))
        best = sorted(rrf.items(), key=lambda kv: -kv[1])[:4]
        print("  weighted RRF recall@10, best four (w = vector weight, k):")
        print("   " + "  ".join(f"w={w} k={k}: {v / count:.3f}" for (w, k), v in best))
    return {m: {k: v / count for k, v in totals[m].items()} for m in MODES}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_locomo_argument(parser)
    parser.add_argument("--embedders", default="static,minilm")
    parser.add_argument("--sweep", action="store_true", help="also sweep the fusion weight and RRF")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="server data dir (default: a temp dir)"
    )
    parser.add_argument(
        "--plan",
        choices=("auto", "index"),
        default="auto",
        help="index: force the plan used for large agents (HNSW and GIN word tiers; implies "
        "--listed: an agent without its own indexes is ranked exactly)",
    )
    parser.add_argument(
        "--reader",
        choices=("operator", "session", "turn"),
        default="operator",
        help="session: records in one session's scope, asked by a turn reading it alone; turn: "
        "by a turn reading agent scope too",
    )
    parser.add_argument(
        "--listed", action="store_true", help="give every agent its own indexes and word counts"
    )
    args = parser.parse_args()
    SAMPLES[:] = load_locomo(args.locomo)
    if args.plan == "index":
        search_module.EXACT_MAX_ROWS = 0
        search_module.SCOPED_MAX_ROWS = 0
        args.listed = True
    command = "python bench/locomo_quality.py " + shlex.join(sys.argv[1:])
    print(f"# {command}")
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="engram-locomo-"))
    if args.data_dir is None:  # however the run ends, Ctrl-C as the server starts too
        atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    pg = EmbeddedPostgres(data_dir / "pgdata")
    try:
        for name in args.embedders.split(","):
            embedder = make_embedder(name)
            if embedder is None:
                continue
            print(f"\n{name} ({embedder.name}, {embedder.dimensions}-d):")
            started = time.perf_counter()
            url = asyncio.run(fresh_database(pg, f"locomo_{name}", embedder))
            asyncio.run(evaluate(url, embedder, args.sweep, args.reader, args.listed))
            print(f"  ({time.perf_counter() - started:.0f} s)")
    finally:
        pg.stop()
    print(f"\nreproduce: {command}")


if __name__ == "__main__":
    main()
