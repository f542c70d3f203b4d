"""Recall quality of a long recall query on the LoCoMo dev half, on the exact and the index plan.

A recall searches with the turn's message and the latest reply (`app.runtime.recall
.recall_query`), which can be hundreds of words around the question that matters. The agents
are `locomo_quality.py`'s (each conversation one agent, an operator reading agent scope), every
agent listed with its own indexes and word counts so that either plan can rank it. Each
question is wrapped in text of about `--lengths` words, four ways:

- own-before: turns of the question's own conversation, then the question;
- other-before: another conversation's turns, then the question;
- other-after: the question, then another conversation's turns;
- reply: the question as the message, another conversation's turns as the latest reply.

Each is asked (hybrid unless `--mode` says, static embedder, a page of 10) as these queries, on
both plans:

- recall_query: as the service searches it (`searched_query`: `recall_query`, the message's
  first and last 500 characters when it is longer than 1,000, and the latest reply's last
  1,000; of more than 30 words, what the message asks, `asked`: its first and last questions,
  and the query's key words, `key_word_count` of them);
- whole recall_query: all of `recall_query`, as it was searched before the fifty-eighth session;
- key words: its key words alone (without what is asked);
- first 1,000: as it was built before the fifty-seventh (the message's first 1,000 characters);
- full text: the message and the latest reply, untruncated;
- first sentence, last sentence, last question: of the message; asked: its first and last
  questions (`asked`);
- key words K: the K words of the whole recall_query that the fewest of the agent's records
  hold (words none holds left out), in the query's order (`app.memory.search.key_words`).

The question alone is the upper bound. Recall@k is the share of the question's evidence turns
in the top k, averaged over questions; ms is the p50 of the query's embedding and search (the
key words' lookup is timed apart).

    python bench/recall_queries.py --locomo PATH                      # 760 questions, minutes
    python bench/recall_queries.py --locomo PATH --questions 20 --lengths 50,300   # quick
    python bench/recall_queries.py --locomo PATH --questions 300 --pad
    python bench/recall_queries.py --locomo PATH --lengths 200

`--pad` also gives each agent the turns of the three conversations its text does not come
from (2,100-2,400 records an agent instead of 370-680). PATH is LoCoMo's data/locomo10.json
(https://github.com/snap-research/locomo, CC BY-NC 4.0), or a file of its dev half; see
bench/README.md.
"""

import argparse
import random
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import add_locomo_argument, load_locomo, run_scratch  # noqa: E402
from locomo_quality import SAMPLES, conversations, load, recall  # noqa: E402

from app.actions.harness import SEARCH_MODES, SearchConfig  # noqa: E402
from app.db.pool import create_pool  # noqa: E402
from app.embeddings.static import StaticEmbedder  # noqa: E402
from app.memory import maintenance  # noqa: E402
from app.memory import search as search_module  # noqa: E402
from app.memory.search import key_words  # noqa: E402
from app.memory.search_store import Filters  # noqa: E402
from app.memory.visibility import AgentReader  # noqa: E402
from app.runtime.recall import (  # noqa: E402
    asked,
    key_word_count,
    recall_query,
    searched_query,
)
from app.runtime.recall import sentences as recall_sentences  # noqa: E402
from app.scope import Scope  # noqa: E402

CONTEXTS = ("own-before", "other-before", "other-after", "reply")
PLANS = ("exact", "index")


def sentences(text: str) -> list[str]:
    """The message's sentences as the service splits them (`recall.sentences`), or the text."""
    return recall_sentences(text) or [text]


def last_question(text: str) -> str:
    asked = [s for s in sentences(text) if s.endswith("?")]
    return (asked or sentences(text))[-1]


def query_before(message: str, latest: str) -> str:
    """The recall query before the fifty-seventh session: the message's first 1,000 characters."""
    return message[:1000] + ("\n" + latest[-1000:] if latest.strip() else "")


def turn_words(conv: dict[str, Any], start: int, need: int) -> list[str]:
    """Words of the conversation's turns from `start` on (wrapping), at least `need` of them."""
    found: list[str] = []
    turns = conv["turns"]
    while len(found) < need:
        found += turns[start % len(turns)][1].split()
        start += 1
    return found


def contexts(
    question: str, own: dict[str, Any], other: dict[str, Any], length: int, rng: random.Random
) -> list[tuple[str, str, str]]:
    """(context, message, latest reply) of `length` words in all around the question: text
    before it ends where a turn ends, text after it starts where one starts."""
    need = max(length - len(question.split()), 0)
    mine = turn_words(own, rng.randrange(len(own["turns"])), need)
    theirs = turn_words(other, rng.randrange(len(other["turns"])), need)
    before = " ".join(theirs[len(theirs) - need :])
    after = " ".join(theirs[:need])
    return [
        ("own-before", " ".join(mine[len(mine) - need :]) + "\n" + question, ""),
        ("other-before", before + "\n" + question, ""),
        ("other-after", question + "\n" + after, ""),
        ("reply", question, after),
    ]


KEY_WORDS_MS: list[float] = []  # each recall_query's key words looked up, ms


def key_word_reader(reader: Any) -> AgentReader:
    """A live turn of the agent reading agent scope alone: what the agent's records are."""
    return AgentReader(reader.account_id, reader.action_id, None, (Scope.AGENT,), False, None)


async def queries(message: str, latest: str, pool: asyncpg.Pool, reader: Any) -> dict[str, str]:
    whole = recall_query(message, latest)
    count = key_word_count(whole)
    keys = key_word_reader(reader)

    async def timed(text: str, k: int) -> str:
        started = time.perf_counter()
        found = await key_words(pool, keys, text, k)
        KEY_WORDS_MS.append((time.perf_counter() - started) * 1000)
        return found

    built: dict[str, str] = {
        "recall_query": await searched_query(message, latest, asked(message), timed),
        "whole recall_query": whole,
        "key words": await key_words(pool, keys, whole, count) if count else whole,
        "first 1,000": query_before(message, latest),
        "full text": message + ("\n" + latest if latest else ""),
        "first sentence": sentences(message)[0],
        "last sentence": sentences(message)[-1],
        "last question": last_question(message),
        "asked": " ".join(asked(message)),
    }
    for k in (6, 10, 20):
        built[f"key words {k}"] = await key_words(pool, keys, whole, k)
    return built


def padded(convs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each conversation with the turns of the three whose text is not wrapped around its
    questions (itself and the next one, other-* contexts' source)."""
    n = len(convs)
    return [
        {
            **c,
            "turns": c["turns"]
            + [
                (f"pad-{o['id']}-{dia}", text, created)
                for j, o in enumerate(convs)
                if j not in (i, (i + 1) % n)
                for dia, text, created in o["turns"]
            ],
        }
        for i, c in enumerate(convs)
    ]


async def measure(url: str, args: argparse.Namespace) -> None:
    embedder = StaticEmbedder()
    config = SearchConfig()
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        convs = conversations()
        stored = padded(convs) if args.pad else convs
        agents = [await load(pool, embedder, s, "operator") for s in stored]
        print(f"# records an agent: {[len(s['turns']) for s in stored]}", flush=True)
        await pool.execute("ANALYZE agent_memories")
        done = await maintenance.run_round(pool, min_records=1)
        print(f"# {done.counted} agents listed with own indexes and word counts", flush=True)
        asked: dict[tuple[int, str, str], list[str]] = {}

        async def ask(agent: int, query: str, plan: str) -> tuple[list[str], float | None]:
            """The page's dia ids, and ms (None: the same query on the same plan before)."""
            if (agent, query, plan) in asked:
                return asked[(agent, query, plan)], None
            reader, ids = agents[agent]
            started = time.perf_counter()
            vector = (await embedder.embed([query])).vectors[0]
            ranking = search_module.make_ranking(args.mode, query, vector, config.min_score, 10)
            records, used = await search_module.ranked(pool, reader, Filters(), ranking, plan)
            ms = (time.perf_counter() - started) * 1000
            assert used == plan, (used, plan)
            found = asked[(agent, query, plan)] = [ids[r.memory_id] for r in records]
            return found, ms

        sample = [(i, q, ev) for i, c in enumerate(convs) for q, ev in c["questions"]]
        rng = random.Random(args.seed)
        if args.questions:
            sample = sorted(rng.sample(sample, args.questions), key=lambda s: s[0])
        scores: dict[tuple[int, str, str, str], list[tuple[float, float]]] = defaultdict(list)
        times: dict[tuple[int, str, str, str], list[float]] = defaultdict(list)
        words: dict[tuple[int, str, str], list[int]] = defaultdict(list)
        started = time.perf_counter()
        for n, (i, question, evidence) in enumerate(sample):
            cells = [(0, "question", "question", question)]
            wrap = random.Random(f"{args.seed}-{n}-{question}")
            for length in args.lengths:
                other = convs[(i + 1) % len(convs)]
                for context, message, latest in contexts(question, convs[i], other, length, wrap):
                    built = await queries(message, latest, pool, agents[i][0])
                    cells += [(length, name, context, text) for name, text in built.items()]
            for length, name, context, text in cells:
                words[(length, name, context)].append(len(text.split()))
                for plan in PLANS:
                    found, ms = await ask(i, text, plan)
                    key = (length, name, context, plan)
                    scores[key].append((recall(found, evidence, 5), recall(found, evidence, 10)))
                    if ms is not None:
                        times[key].append(ms)
            if n % 50 == 49:
                print(f"# {n + 1}/{len(sample)}, {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        await pool.close()
    report(len(sample), args.mode, scores, times, words)


def report(
    count: int,
    mode: str,
    scores: dict[tuple[int, str, str, str], list[tuple[float, float]]],
    times: dict[tuple[int, str, str, str], list[float]],
    words: dict[tuple[int, str, str], list[int]],
) -> None:
    """One line a length, query and context: words, then R@5, R@10 and p50 ms on each plan."""
    names = list(dict.fromkeys(name for _, name, _ in words))
    print(
        f"\n{count} questions; {mode}, static embedder, a page of 10; ms: the query's embedding "
        "and search, p50 (-: the same queries as another line's, timed there)"
    )
    if KEY_WORDS_MS:
        timed = sorted(KEY_WORDS_MS)
        print(
            f"recall_query's key words looked up (before the embedding): p50 "
            f"{timed[len(timed) // 2]:.2f} ms, p95 {timed[int(len(timed) * 0.95)]:.2f} ms"
        )
    plans = "   ".join(f"{plan:>5s} R@5  R@10     ms" for plan in PLANS)
    print(f"{'len':>4s} {'query':24s} {'context':12s} {'words':>5s}   {plans}")
    for length, name, context in sorted(
        words, key=lambda k: (k[0], names.index(k[1]), (*CONTEXTS, "question").index(k[2]))
    ):
        cells = []
        for plan in PLANS:
            got = scores[(length, name, context, plan)]
            r5, r10 = (sum(g[j] for g in got) / len(got) for j in (0, 1))
            timed = sorted(times[(length, name, context, plan)])
            ms = f"{timed[len(timed) // 2]:6.1f}" if timed else "     -"
            cells.append(f"{r5:.3f} {r10:.3f} {ms}")
        size = sum(words[(length, name, context)]) / len(words[(length, name, context)])
        print(f"{length:4d} {name:24s} {context:12s} {size:5.0f}   " + "   ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_locomo_argument(parser)
    parser.add_argument(
        "--lengths",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[50, 150, 300],
        help="words of text around each question, comma-separated (default 50,150,300)",
    )
    parser.add_argument("--questions", type=int, default=0, help="a seeded sample (0: all 760)")
    parser.add_argument("--seed", type=int, default=223)
    parser.add_argument(
        "--mode", choices=SEARCH_MODES, default="hybrid", help="the search mode (default hybrid)"
    )
    parser.add_argument(
        "--pad",
        action="store_true",
        help="each agent also holds the turns of the three conversations not wrapped around "
        "its questions (2,100-2,400 records an agent)",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="server data dir (default: a temp dir)"
    )
    args = parser.parse_args()
    SAMPLES[:] = load_locomo(args.locomo)
    command = "python bench/recall_queries.py " + shlex.join(sys.argv[1:])
    print(f"# {command}")
    run_scratch(
        args.data_dir, "engram-recall-queries-", lambda url: measure(url, args), StaticEmbedder()
    )
    print(f"\nreproduce: {command}")


if __name__ == "__main__":
    main()
