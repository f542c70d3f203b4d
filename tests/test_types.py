"""app/ type-checks as mypy (pinned in the `test` extra, configured in pyproject.toml) says, the
README's type check command: a change that does not fails here, in CI, not only on the machine
of whoever ran mypy."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"mypy found:\n{done.stdout}{done.stderr}\n"
        "run `mypy` and fix each error with the right types; a `# type: ignore[code]` only where "
        "a library's types are wrong or missing, with a comment saying why"
    )
