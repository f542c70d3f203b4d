"""bench/search_compare.py reads search_scale.py's printed output (the starting commit's has no
--json) and the JSON runs write, and puts issue 18's targets in one table."""

import json

from bench.search_compare import main, parse_text, read, table

# The starting commit's search_scale.py output, cut short: the chosen plan's lines are the
# figures; the forced plans' lines below them must not be taken.
BEFORE = """\
# python bench/search_scale.py --locomo L --scale 0.1 --queries 150 --recall-samples 30
# 120,000 records: 100 agents x 1,000, mid agents [], one agent of 20,000; rows scattered
loading ...
  online: 717 records/s embedded and COPYed into the fully indexed table (2,000 records)

1,000-record agents (100 of them)
  chosen plan (exact):
    hybrid   top-10  p50    1.99  p95    3.61  p99    4.79  mean    2.24 ms  (n=145)
    lexical  top-10  p50    1.67  p95    3.12  p99    4.45  mean    1.99 ms  (n=145)
    vector   top-10  p50    1.61  p95    3.10  p99    3.87  mean    1.78 ms  (n=145)
    vector top-10 overlap with the exact plan's (brute force): 1.000 (n=150)
    hybrid top-10 overlap with the exact plan's (brute force): 1.000 (n=150)
  index plan forced (index):
    hybrid   top-10  p50    4.60  p95    6.07  p99    6.35  mean    4.58 ms  (n=32)
    lexical  top-10  p50    2.30  p95    2.82  p99    2.83  mean    2.27 ms  (n=32)
    vector   top-10  p50    3.12  p95    4.30  p99    4.83  mean    3.19 ms  (n=32)
    vector top-10 overlap with the exact plan's (brute force): 1.000 (n=37)
    hybrid top-10 overlap with the exact plan's (brute force): 0.881 (n=37)
  hybrid after the turn's recall (search_memory): p50 2.43 p95 3.14 p99 3.58 mean 2.49 ms (n=145)

20,000-record agent
  chosen plan (index):
    hybrid   top-10  p50    2.60  p95    4.25  p99    4.78  mean    2.74 ms  (n=145)
    lexical  top-10  p50    1.44  p95    2.57  p99    3.21  mean    1.53 ms  (n=145)
    vector   top-10  p50    1.44  p95    2.43  p99    3.30  mean    1.56 ms  (n=145)
    vector top-10 overlap with the exact plan's (brute force): 0.993 (n=30)
    hybrid top-10 overlap with the exact plan's (brute force): 0.830 (n=30)
  exact plan forced (exact):
    hybrid   top-10  p50   45.02  p95   56.50  p99   56.51  mean   46.28 ms  (n=32)

reproduce: python bench/search_scale.py --locomo L --scale 0.1 --queries 150 --recall-samples 30
"""

# This tree's output with --cold: the cold lines come first.
AFTER = """\
# python bench/search_scale.py --locomo L --scale 0.1 --cold
# 120,000 records: 100 agents x 1,000, mid agents [], one agent of 20,000; rows scattered

cold: the first search of an agent (server restarted, OS page cache dropped; no prewarm)
  1,000-record agents (100 of them), 5 distinct agents per mode:
    cold hybrid   first search  p50   56.13  p95   71.44  p99   71.44  mean   56.88 ms  (n=5)
    cold lexical  first search  p50   46.40  p95   50.43  p99   50.43  mean   45.71 ms  (n=5)
    cold vector   first search  p50   12.42  p95   35.23  p99   35.23  mean   16.41 ms  (n=5)
  20,000-record agent: cold first search (hybrid) 54.94 ms
    cold next 9 (modes in turn): p50    4.91  p95    9.41  p99    9.41  mean    4.79 ms  (n=9)
  prewarmed in 0 s
  online: 5,452 records/s embedded and COPYed into the fully indexed table (2,000 records)

1,000-record agents (100 of them)
  chosen plan (exact):
    hybrid   top-10  p50    2.52  p95    4.03  p99    4.84  mean    2.76 ms  (n=35)
    lexical  top-10  p50    2.15  p95    3.23  p99    3.66  mean    2.32 ms  (n=35)
    vector   top-10  p50    1.78  p95    3.26  p99    3.49  mean    2.11 ms  (n=35)
    vector top-10 overlap with the exact plan's (brute force): 1.000 (n=40)
    hybrid top-10 overlap with the exact plan's (brute force): 1.000 (n=40)

20,000-record agent
  chosen plan (index):
    hybrid   top-10  p50    2.67  p95    6.28  p99    6.28  mean    2.95 ms  (n=35)
    lexical  top-10  p50    1.55  p95    3.92  p99    5.74  mean    1.78 ms  (n=35)
    vector   top-10  p50    1.54  p95    2.15  p99    2.44  mean    1.57 ms  (n=35)
    vector top-10 overlap with the exact plan's (brute force): 0.990 (n=5)
    hybrid top-10 overlap with the exact plan's (brute force): 0.960 (n=30)
"""


def stats(p50: float, p95: float) -> dict[str, float]:
    return {"p50": p50, "p95": p95, "p99": p95, "mean": p50, "n": 40}


def test_the_chosen_plans_figures_are_read_not_the_forced_ones() -> None:
    before = parse_text(BEFORE)
    assert before["records"] == 120_000
    assert before["online_writes_per_s"] == 717
    assert before["sql"]["1000"]["hybrid"]["p95"] == 3.61
    assert before["sql"]["1000"]["overlap"] == {"vector": 1.0, "hybrid": 1.0}
    assert before["sql"]["20000"]["plan"] == "index"
    assert before["sql"]["20000"]["hybrid"] == {
        "p50": 2.60,
        "p95": 4.25,
        "p99": 4.78,
        "mean": 2.74,
        "n": 145,
    }
    assert before["sql"]["20000"]["overlap"]["hybrid"] == 0.830
    assert before["sql_cold"] == {}
    assert before["command"].startswith("python bench/search_scale.py --locomo L --scale 0.1")


def test_the_cold_lines_are_read_apart_from_the_warm_ones() -> None:
    after = parse_text(AFTER)
    assert after["cold_note"] == "server restarted, OS page cache dropped"
    assert after["sql_cold"]["1000"]["lexical"]["p95"] == 50.43
    assert after["sql_cold"]["20000"]["first hybrid"]["p95"] == 54.94
    assert after["sql_cold"]["20000"]["next 9"]["n"] == 9
    assert after["sql"]["1000"]["hybrid"]["p95"] == 4.03
    assert after["online_writes_per_s"] == 5452


def test_one_table_of_every_target_before_and_after(tmp_path, capsys) -> None:
    (tmp_path / "before.txt").write_text(BEFORE)
    (tmp_path / "after.txt").write_text(AFTER)
    http = {
        "command": "python bench/search_http.py --data-dir D",
        "records": 120_000,
        "http": {"1000": {m: stats(4.0, 12.5) for m in ("hybrid", "lexical", "vector")}},
        "http_cold": {"1000": {"hybrid": stats(60.0, 80.0)}},
    }
    (tmp_path / "after-http.json").write_text(json.dumps(http))
    # search_scale.py's own --json says what the machine was set to.
    host = {"huge_pages": "on", "guest_halt_poll": "up to 0 ns (grow_start 50000 ns, ...)"}
    scale = {"command": "python bench/search_scale.py --json S", "records": 120_000, "host": host}
    (tmp_path / "after-scale.json").write_text(json.dumps(scale))
    before, commands = read([tmp_path / "before.txt"])
    after, after_commands = read([tmp_path / "after.txt", tmp_path / "after-http.json"])
    assert after_commands[1] == "python bench/search_http.py --data-dir D"
    rows = table(before, after)
    assert (
        "| SQL (warm) hybrid p95, 1,000-record agents | <= 5 ms | 3.61 (p50 1.99, n=145) | "
        "4.03 (p50 2.52, n=35) | met |"
    ) in rows
    assert (
        "| SQL (warm) hybrid p95, 20,000-record agent | <= 5 ms | 4.25 (p50 2.60, n=145) | "
        "6.28 (p50 2.67, n=35) | missed |"
    ) in rows
    assert (
        "| searchMemories over HTTP (warm) vector p95, 1,000-record agents | <= 10 ms | "
        "not measured | 12.50 (p50 4.00, n=40) | missed |"
    ) in rows
    assert (
        "| hybrid top-10 overlap with exact, 20,000-record agent (plans index / index) "
        "| >= 0.95 | 0.830 | 0.960 | met |"
    ) in rows
    assert (
        "| online writes into the fully indexed table | >= 1,000 records/s | 717 records/s | "
        "5,452 records/s | met |"
    ) in rows
    assert (
        "| cold, searchMemories over HTTP: hybrid first search p95, 1,000-record agents "
        "| reported beside | not measured | 80.00 (p50 60.00, n=40) | - |"
    ) in rows
    assert "| cold, SQL: first search (hybrid), 20,000-record agent" in "\n".join(rows)

    main(
        ["--before", str(tmp_path / "before.txt")]
        + ["--after", str(tmp_path / "after.txt"), str(tmp_path / "after-http.json")]
        + [str(tmp_path / "after-scale.json")]
    )
    out = capsys.readouterr().out
    assert "| Target | Goal | Before | After | After meets it |" in out
    assert "    python bench/search_http.py --data-dir D" in out
    # What the machine was set to, which moves every figure, is said with them.
    assert "After's host: huge pages on, halt polling up to 0 ns (grow_start 50000 ns, ...)." in out
    assert "Before's host" not in out  # the starting commit's text output says nothing of it


# search_http.py's output: the same groups, its lines named searchMemories.
HTTP = """\
# python bench/search_http.py --locomo L --scale 0.1 --data-dir D --root /tmp/base --cold
# engram serve of /tmp/base, 120,000 records of database engram_bench_0_1

cold: the first searchMemories of an agent (server restarted, OS page cache dropped; no prewarm)
  1,000-record agents (100 of them), 3 distinct agents per mode:
    cold hybrid   first searchMemories  p50 32.27  p95 50.91  p99 50.91  mean 38.35 ms  (n=3)
  20,000-record agent: cold first searchMemories (hybrid) 43.95 ms
    cold next 9 (modes in turn): p50   22.23  p95   30.80  p99   30.80  mean   21.28 ms  (n=9)
  prewarmed in 0 s

1,000-record agents (100 of them)
  searchMemories hybrid   first: 10  p50   12.89  p95   21.31  p99   21.31  mean   13.23 ms  (n=20)
  searchMemories vector   first: 10  p50   12.36  p95   20.05  p99   20.05  mean   12.45 ms  (n=20)

20,000-record agent
  searchMemories lexical  first: 10  p50    4.63  p95   11.34  p99   11.34  mean    5.28 ms  (n=20)
"""


def test_searchmemories_lines_are_read_as_http_figures() -> None:
    http = parse_text(HTTP)
    assert http["sql"] == {} and http["sql_cold"] == {}
    assert http["http"]["1000"]["hybrid"]["p95"] == 21.31
    assert http["http"]["1000"]["vector"]["n"] == 20
    assert http["http"]["20000"]["lexical"]["p50"] == 4.63
    assert http["http_cold"]["1000"]["hybrid"]["p95"] == 50.91
    assert http["http_cold"]["20000"]["first hybrid"]["p95"] == 43.95
    # search_scale.py --http prints its SQL figures, then these after a heading.
    heading = "\nsearchMemories over HTTP (bench/search_http.py)\n"
    both = parse_text(AFTER + heading + HTTP[HTTP.index("cold:") :])
    assert both["sql"]["1000"]["hybrid"]["p95"] == 4.03
    assert both["sql_cold"]["1000"]["lexical"]["p95"] == 50.43
    assert both["http"]["1000"]["hybrid"]["p95"] == 21.31
    assert both["http_cold"]["1000"]["hybrid"]["p95"] == 50.91
