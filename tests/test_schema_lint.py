"""schema.graphql documents itself and follows Relay (issue 16, item 5): `graphql-schema-linter`
(npm) with the rules of `.graphql-schema-linterrc` (every type, field, argument, input field and
enum value described; connections, their arguments and PageInfo as Relay specifies) finds
nothing. A failure lists each finding with its line, e.g. "The field `Query.x` is missing a
description": add `description=` where the code defines it (app/graphql/*.py), then
`engram schema -o schema.graphql`.

The linter runs on Node: it is installed once with npm into ENGRAM_NODE_CACHE (by default
~/.cache/engram/node). Under CI (CI=true) a missing node or npm fails the run; elsewhere the test
is skipped, saying how to get them: `apt-get install nodejs npm` (Debian)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINTER = "graphql-schema-linter@3.0.1"
GRAPHQL = "graphql@16.15.0"  # its peer dependency
HOW = "install Node.js and npm (apt-get install nodejs npm on Debian), then run the tests again"


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI lints the schema, but {reason}: {HOW}")
    pytest.skip(f"graphql-schema-linter not run: {reason}; {HOW}")


def linter() -> Path:
    """The linter's executable, installed with npm on first use."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable("node or npm is not on PATH")
    cache = Path(os.environ.get("ENGRAM_NODE_CACHE", Path.home() / ".cache/engram/node"))
    prefix = cache / LINTER.replace("@", "-")
    binary = prefix / "node_modules/.bin/graphql-schema-linter"
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        installed = subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-save", "--no-audit", "--no-fund"]
            + ["--no-package-lock", LINTER, GRAPHQL],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if installed.returncode != 0 or not binary.exists():
            unavailable(f"`npm install {LINTER}` failed:\n{installed.stderr[-2000:]}")
    return binary


def test_schema_graphql_passes_graphql_schema_linter():
    binary = linter()
    # The rules and the schema's path come from .graphql-schema-linterrc in the repository.
    ran = subprocess.run(
        [str(binary), "--format", "json", "--config-directory", str(ROOT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        errors = json.loads(ran.stdout)["errors"]
    except (ValueError, KeyError):
        pytest.fail(f"graphql-schema-linter did not report (exit {ran.returncode}):\n{ran.stderr}")
    findings = [
        f"schema.graphql:{e['location']['line']}: {e['message']} ({e['rule']})" for e in errors
    ]
    assert not findings, (
        f"{len(findings)} findings; describe each in app/graphql/*.py (`description=`) and run "
        "`engram schema -o schema.graphql`:\n" + "\n".join(findings)
    )
    assert ran.returncode == 0, ran.stderr
