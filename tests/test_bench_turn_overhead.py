"""bench/turn_overhead.py runs to its end on a tiny agent, with the figures DESIGN.md's turn
target is read from: each scenario's overheads, its thread CPU a turn, and the statements a
turn sends (counted on every pooled connection, so a turn with a recall and a review sends
more than one without memory)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import turn_overhead  # noqa: E402


async def test_the_turn_overhead_bench_measures_each_scenarios_cpu_and_statements() -> None:
    args = argparse.Namespace(turns=2, records=10, recalls=2)
    with turn_overhead.InstantModel() as model:
        results = await turn_overhead.bench(args, model.url)
    for name in ("plain", "recall", "tools", "session", "compact"):
        run = results[name]
        assert len(run.walls) == len(run.overheads) == len(run.cpus) == args.turns
        assert all(0 < o <= w for o, w in zip(run.overheads, run.walls, strict=True))
        assert all(c > 0 for c in run.cpus)
        # At least a turn's start, its sign of life after the model call, and its commit.
        assert run.statements >= 3, (name, run.statements)
    # The recall's search and the review's read of the turns awaiting it come on top.
    assert results["recall"].statements >= results["plain"].statements + 2
    assert len(results["recall alone"]) == args.recalls
