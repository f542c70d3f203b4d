"""Issue 18's targets, before and after, in one markdown table.

Reads the figures of search runs: the JSON that `bench/search_scale.py --json` and
`bench/search_http.py --json` write, or the text that `bench/search_scale.py` prints (also
that of earlier commits, which had no --json); each side may be several files, merged. Prints
one table: per agent size, SQL p95 of hybrid, lexical and vector search (target 5 ms),
searchMemories over HTTP p95 (target 10 ms), vector top-10 overlap with brute force (0.98),
hybrid top-10 overlap with the exact hybrid ranking (0.95), online writes (1,000 records/s),
and the cold first searches beside them (no target); then the commands that produced them.

    python bench/search_compare.py --before before-scale.txt before-http.json \\
        --after after-scale.json after-http.json > table.md
"""

import argparse
import json
import re
from pathlib import Path
from typing import Any

SQL_MS = 5.0
HTTP_MS = 10.0
VECTOR_OVERLAP = 0.98
HYBRID_OVERLAP = 0.95
ONLINE_WRITES = 1000.0
MODES = ("hybrid", "lexical", "vector")

_NUMBER = r"([\d.]+)"
_STATS = re.compile(
    rf"p50\s+{_NUMBER}\s+p95\s+{_NUMBER}\s+p99\s+{_NUMBER}\s+mean\s+{_NUMBER} ms\s+\(n=(\d+)\)"
)
_GROUP = re.compile(r"^(\d[\d,]*)-record agents?\b")
_COLD_GROUP = re.compile(r"^  (\d[\d,]*)-record agents?\b")
_TIMING = re.compile(r"^\s+(hybrid|lexical|vector)\s+top-10\s+")
_OVERLAP = re.compile(r"^\s+(vector|hybrid) top-10 overlap with the exact plan's .*: ([\d.]+)")
_COLD_MODE = re.compile(r"^\s+cold (hybrid|lexical|vector)\s+first search")
_COLD_FIRST = re.compile(r"cold first search(?:Memories)? \(hybrid\) ([\d.]+) ms")
_HTTP = re.compile(r"^  searchMemories (hybrid|lexical|vector)\s+first: 10\s+")
_ONLINE = re.compile(r"online: ([\d,]+) records/s")
_RECORDS = re.compile(r"^# ([\d,]+) records")


def stats(match: re.Match[str]) -> dict[str, float]:
    p50, p95, p99, mean, n = match.groups()
    return {
        "p50": float(p50),
        "p95": float(p95),
        "p99": float(p99),
        "mean": float(mean),
        "n": int(n),
    }


def parse_text(text: str) -> dict[str, Any]:
    """The figures of search_scale.py's printed output (this commit's or an earlier one's):
    the chosen plan's latency and overlap per size, online writes, the cold searches; and
    searchMemories' (search_http.py's output, or search_scale.py's after --http)."""
    figures: dict[str, Any] = {"sql": {}, "sql_cold": {}, "http": {}, "http_cold": {}}
    side = "sql"  # whose lines: search_scale's SQL, or searchMemories over HTTP
    size: str | None = None
    section = ""  # "chosen", "cold", "http", or "" (lines not read)
    for line in text.splitlines():
        if line.startswith("# python ") and "command" not in figures:
            figures["command"] = line[2:]
            side = "http" if "search_http.py" in line else side
        elif line.startswith("searchMemories over HTTP"):
            side, section = "http", ""
        elif m := _RECORDS.match(line):
            figures["records"] = int(m.group(1).replace(",", ""))
        elif m := _ONLINE.search(line):
            figures["online_writes_per_s"] = float(m.group(1).replace(",", ""))
        elif line.startswith("cold:"):
            section = "cold"
            figures["cold_note"] = line[line.find("(") + 1 : line.rfind(";")]
        elif section == "cold" and (m := _COLD_GROUP.match(line)):
            size = m.group(1).replace(",", "")
            cold = figures[f"{side}_cold"].setdefault(size, {})
            if first := _COLD_FIRST.search(line):
                ms = float(first.group(1))
                cold["first hybrid"] = {"p50": ms, "p95": ms, "p99": ms, "mean": ms, "n": 1}
        elif section == "cold" and size and (m := _COLD_MODE.match(line)):
            if s := _STATS.search(line):
                figures[f"{side}_cold"][size][m.group(1)] = stats(s)
        elif section == "cold" and size and "cold next 9" in line:
            if s := _STATS.search(line):
                figures[f"{side}_cold"][size]["next 9"] = stats(s)
        elif m := _GROUP.match(line):
            size, section = m.group(1).replace(",", ""), "http" if side == "http" else ""
        elif section == "http" and size and (m := _HTTP.match(line)):
            if s := _STATS.search(line):
                figures["http"].setdefault(size, {})[m.group(1)] = stats(s)
        elif size and line.startswith("  chosen plan"):
            section = "chosen"
            figures["sql"].setdefault(size, {"overlap": {}})["plan"] = line[
                line.find("(") + 1 : line.rfind(")")
            ]
        elif section == "chosen" and size and (m := _OVERLAP.match(line)):
            figures["sql"][size]["overlap"][m.group(1)] = float(m.group(2))
        elif section == "chosen" and size and (m := _TIMING.match(line)):
            if s := _STATS.search(line):
                figures["sql"][size][m.group(1)] = stats(s)
        elif line.startswith("  ") and not line.startswith("    "):
            section = "" if section == "chosen" else section
    return figures


def read(paths: list[Path]) -> tuple[dict[str, Any], list[str]]:
    """The figures of several runs, merged; and the command of each."""
    merged: dict[str, Any] = {}
    commands: list[str] = []
    for path in paths:
        text = path.read_text()
        try:
            figures = json.loads(text)
        except json.JSONDecodeError:
            figures = parse_text(text)
        if figures.get("command"):
            commands.append(figures["command"])
        for key, value in figures.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] |= value
            elif key != "command":
                merged[key] = value
    return merged, commands


def agents(size: str) -> str:
    return f"{int(size):,}-record agent" + ("s" if int(size) == 1000 else "")


def dig(figures: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(figures, dict) or key not in figures:
            return None
        figures = figures[key]
    return figures


def latency(value: dict[str, float] | None) -> str:
    if not value:
        return "not measured"
    if value.get("n") == 1:
        return f"{value['p95']:.2f}"
    return f"{value['p95']:.2f} (p50 {value['p50']:.2f}, n={value['n']})"


def verdict(value: float | None, goal: float, at_most: bool) -> str:
    if value is None:
        return "not measured"
    return "met" if (value <= goal if at_most else value >= goal) else "missed"


def table(
    before: dict[str, Any], after: dict[str, Any], labels: tuple[str, str] = ("", "")
) -> list[str]:
    """The table's lines; `labels` name the two sides in the heading (e.g. their commits)."""
    heads = [
        f"{side} ({label})" if label else side
        for side, label in zip(("Before", "After"), labels, strict=True)
    ]
    rows = [
        f"| Target | Goal | {heads[0]} | {heads[1]} | After meets it |",
        "|---|---|---|---|---|",
    ]
    sizes = sorted(
        {s for side in (before, after) for key in ("sql", "http") for s in side.get(key, {})},
        key=int,
    )

    def timed(key: str, name: str, goal: float) -> None:
        for size in sizes:
            for mode in MODES:
                b, a = dig(before, key, size, mode), dig(after, key, size, mode)
                rows.append(
                    f"| {name} {mode} p95, {agents(size)} | <= {goal:g} ms | {latency(b)} | "
                    f"{latency(a)} | {verdict(a and a['p95'], goal, True)} |"
                )

    timed("sql", "SQL (warm)", SQL_MS)
    timed("http", "searchMemories over HTTP (warm)", HTTP_MS)
    for mode, goal in (("vector", VECTOR_OVERLAP), ("hybrid", HYBRID_OVERLAP)):
        for size in sizes:
            b, a = (
                dig(before, "sql", size, "overlap", mode),
                dig(after, "sql", size, "overlap", mode),
            )
            plans = " / ".join(
                str(dig(side, "sql", size, "plan") or "?") for side in (before, after)
            )
            rows.append(
                f"| {mode} top-10 overlap with exact, {agents(size)} (plans {plans}) "
                f"| >= {goal:g} | "
                + " | ".join("not measured" if v is None else f"{v:.3f}" for v in (b, a))
                + f" | {verdict(a, goal, False)} |"
            )
    b, a = before.get("online_writes_per_s"), after.get("online_writes_per_s")
    rows.append(
        f"| online writes into the fully indexed table | >= {ONLINE_WRITES:,.0f} records/s | "
        + " | ".join("not measured" if v is None else f"{v:,.0f} records/s" for v in (b, a))
        + f" | {verdict(a, ONLINE_WRITES, False)} |"
    )
    for key, name in (("sql_cold", "SQL"), ("http_cold", "searchMemories over HTTP")):
        cold_sizes = sorted({s for side in (before, after) for s in side.get(key, {})}, key=int)
        for size in cold_sizes:
            kinds = [
                k
                for k in (*MODES, "first hybrid", "next 9")
                if dig(before, key, size, k) or dig(after, key, size, k)
            ]
            for kind in kinds:
                what = f"{kind} first search p95" if kind in MODES else f"{kind} searches p95"
                if kind == "first hybrid":
                    what = "first search (hybrid)"
                rows.append(
                    f"| cold, {name}: {what}, {agents(size)} | reported beside | "
                    f"{latency(dig(before, key, size, kind))} | "
                    f"{latency(dig(after, key, size, kind))} | - |"
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, nargs="+", required=True, metavar="FILE")
    parser.add_argument("--after", type=Path, nargs="+", required=True, metavar="FILE")
    parser.add_argument("--before-label", default="", help="e.g. the starting commit, 0713570")
    parser.add_argument("--after-label", default="", help="e.g. the commit measured after")
    parser.add_argument(
        "--before-tree",
        type=Path,
        help="the source tree the before's search_scale.py ran in (its command is shown run there)",
    )
    args = parser.parse_args(argv)
    before, before_commands = read(args.before)
    after, after_commands = read(args.after)
    print("Times in ms: p95 (p50, samples); SQL as the service runs it, without the query")
    print("embedding; searchMemories over HTTP with it, one client. Cold: after a restart")
    print(
        f"(before: {before.get('cold_note', 'not measured')}; "
        f"after: {after.get('cold_note', 'not measured')}), no prewarm."
    )
    for label, figures in (("Before", before), ("After", after)):
        if "host" in figures:  # what the machine was set to, which moves every figure
            h = figures["host"]
            print(
                f"{label}'s host: huge pages {h['huge_pages']}, "
                f"halt polling {h['guest_halt_poll']}."
            )
    if before.get("records") != after.get("records"):
        print(
            f"\n**Different data sets**: before {before.get('records')} records, "
            f"after {after.get('records')}."
        )
    print()
    print("\n".join(table(before, after, (args.before_label, args.after_label))))
    print("\nReproduce (search_scale.py in the source tree it measures; search_http.py serves")
    print("the tree --root names, this repository by default):\n")
    for name, commands in (("before", before_commands), ("after", after_commands)):
        for command in commands:
            if name == "before" and args.before_tree and "bench/search_scale.py" in command:
                command = f"(cd {args.before_tree} && {command})"
            print(f"    # {name}\n    {command}")


if __name__ == "__main__":
    main()
