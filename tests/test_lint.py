"""The code is lint-clean and formatted as ruff (pinned in the `test` extra) says, the README's
lint command: a change that is not fails here, in CI, not only on the machine of whoever ran
ruff."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command", [["check", "--quiet", "."], ["format", "--check", "--quiet", "."]]
)
def test_ruff(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (
        f"ruff {' '.join(command)} found:\n{done.stdout}{done.stderr}\n"
        "run `ruff check --fix .` and `ruff format .`, and fix what they leave"
    )
