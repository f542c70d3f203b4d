"""The benchmarks in bench/ still start on today's code, as bench/README.md runs them: each
script's --help exits 0 and offers every option the README's commands pass it (a script can
stop importing, or lose an option, long before anyone runs it again), and fairness.py's forged
cursor is one a search accepts (it stopped with a traceback once cursors carried more)."""

import re
import runpy
import sys
from pathlib import Path
from uuid import uuid4

import pytest

from app.memory import search
from app.memory.search_store import Filters
from app.memory.visibility import OperatorReader

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import fairness  # noqa: E402

# Run by pytest with the tests' fixtures, not as scripts.
PYTEST_MODULES = {"conn_loss", "races"}
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in {"common", *PYTEST_MODULES})


def help_text(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [f"bench/{name}.py", "--help"])
        with pytest.raises(SystemExit) as stopped:
            runpy.run_path(str(BENCH / f"{name}.py"), run_name="__main__")
    assert stopped.value.code == 0, (name, capsys.readouterr().err)
    return capsys.readouterr().out


def readme_commands() -> dict[str, set[str]]:
    """The options each `python bench/NAME.py ...` command of bench/README.md passes."""
    text = (BENCH / "README.md").read_text().replace("\\\n", " ")
    commands: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("    "):
            continue
        line = re.sub(r"\$\([^)]*\)", "", line)  # a shell substitution's own options
        for name, rest in re.findall(r"python\s+\S*?bench/(\w+)\.py([^#;&|)]*)", line):
            commands.setdefault(name, set()).update(re.findall(r"(?<![\w-])--[\w-]+", rest))
    return commands


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmarks_help_offers_what_the_readme_passes_it(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    usage = help_text(name, capsys).split("\n\n")[0]
    offered = set(re.findall(r"--[\w-]+", usage))
    assert readme_commands().get(name, set()) <= offered, f"bench/{name}.py --help: {usage}"


def test_the_readme_runs_only_benchmarks_there_are() -> None:
    assert set(readme_commands()) <= set(SCRIPTS)
    assert all("def test_" in (BENCH / f"{name}.py").read_text() for name in PYTEST_MODULES)


def test_fairness_floods_with_a_cursor_the_search_accepts_9000_records_deep() -> None:
    account, action, query = uuid4(), uuid4(), "what did Ada say about engines"
    cursor = fairness.deep_cursor(str(account), str(action), query)
    key = search._search_key(OperatorReader(account, action), "hybrid", query, Filters())
    position = search._decode_ranked(cursor, key)
    assert position is not None and position.depth == 9_000
