"""The documentation works from a fresh clone (issue 16): every relative link in README.md,
bench/README.md and docs/*.md resolves to a file in the repository (and its #anchor to a
heading), nothing points outside it (`../shared`, `/work/`), every ```graphql example
parses and validates against the service's schema, and every setting's documented default is
the one app/config.py takes."""

import argparse
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from graphql import parse, validate

from app.graphql.schema import build_schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```graphql\n(.*?)^```", re.S | re.M)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _tracked() -> set[Path] | None:
    """The files a fresh clone has (None outside a git checkout)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return None
    files = {(ROOT / name).resolve() for name in listed.split("\0") if name}
    return files | {parent for f in files for parent in f.parents}


TRACKED = _tracked()


def _ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_docs_exist():
    names = {p.name for p in DOCS}
    for page in ("behaviour.md", "harness.md", "graphql.md", "operations.md", "scaling.md"):
        assert page in names


def _resolves(file: Path, anchor: str) -> bool:
    if not file.is_relative_to(ROOT) or not file.exists():
        return False
    if TRACKED is not None and file not in TRACKED:
        return False  # not committed: a fresh clone would not have it
    return not anchor or file.suffix != ".md" or anchor in _anchors(file)


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_every_link_resolves_inside_the_repository(doc: Path):
    text = doc.read_text()
    assert "../shared" not in text and "/work/" not in text, "points outside the repository"
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not _resolves(file, anchor):
            broken.append(target)
    assert broken == []


def _examples() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for i, block in enumerate(_FENCE.findall(doc.read_text())):
            found.append((f"{_ids(doc)}#{i + 1}", block))
    return found


@pytest.mark.parametrize(("where", "query"), _examples(), ids=[w for w, _ in _examples()])
def test_every_graphql_example_validates_against_the_schema(where: str, query: str):
    schema = build_schema()._schema
    errors = validate(schema, parse(query))
    assert [e.message for e in errors] == []


def test_the_guide_covers_each_client():
    guide = (ROOT / "docs" / "graphql.md").read_text()
    examples = "\n".join(block for _, block in _examples())
    for operation in (
        "createClient",
        "createClientToken",
        "executeAction",
        "searchMemories",
        "deleteAgentMemory",
        "node(id",
    ):
        assert operation in examples, operation
    assert "## Admin consoles" in guide and "## Operators" in guide and "## `node(id)`" in guide


def test_every_setting_is_documented_as_parsed():
    from app.config import Settings

    operations = (ROOT / "docs" / "operations.md").read_text()
    missing = [
        f"ENGRAM_{name.upper()}"
        for name in Settings.model_fields
        if f"`ENGRAM_{name.upper()}`" not in operations
    ]
    assert missing == []


def cli_commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """`engram` and every command under it: its words after `engram`, and its parser."""
    from app.cli import parser

    pending: list[tuple[list[str], argparse.ArgumentParser]] = [([], parser())]
    while pending:
        words, p = pending.pop()
        yield " ".join(words), p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += [([*words, name], sub) for name, sub in action.choices.items()]


def test_every_policy_resource_and_cli_flag_is_documented():
    from app.auth.resources import KNOWN

    access = (ROOT / "docs" / "access.md").read_text()
    assert [r for r in sorted(KNOWN) if f"`{r}`" not in access] == []
    missing = []
    for command, p in cli_commands():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                if action.help is None:
                    missing.append(f"{command} {action.option_strings[0]}: no --help text")
                if not any(option in access for option in action.option_strings):
                    missing.append(f"{command} {action.option_strings[-1]}")
        if command and not p._subparsers and f"`engram {command}" not in access:
            missing.append(f"engram {command}")
    assert missing == []


def test_every_cli_default_is_in_its_help():
    """access.md says `engram <command> --help` prints what its table does, defaults included."""
    missing = [
        f"{command} {action.option_strings[-1]}"
        for command, p in cli_commands()
        for action in p._actions
        if action.option_strings
        and action.default not in (None, False, argparse.SUPPRESS)
        and f"default: {action.default}" not in (action.help or "")
    ]
    assert missing == []


# A setting named with the value it takes when unset, in prose ("`ENGRAM_PORT` (8000") or in a
# row of operations.md's table ("| `ENGRAM_PORT` | `8000` |"); "twice `ENGRAM_POOL_MAX_SIZE`
# (`20`)" and the like give a value derived from the setting, not its default.
_PROSE_DEFAULT = re.compile(
    r"(?<!twice )(?<!half of )`(ENGRAM_[A-Z_]+)` \(`?(\d[\d,]*(?:\.\d+)?)( MiB| MB)?[`,;:) ]"
)
_ROW_DEFAULT = re.compile(r"^\| `(ENGRAM_[A-Z_]+)`(?: / `(ENGRAM_[A-Z_]+)`)? \| ([^|]*) \|", re.M)
_UNITS = {None: 1, " MiB": 2**20, " MB": 10**6}


def _as_documented(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_documented_default_is_the_one_parsed():
    """A default the docs give a setting is what app/config.py takes when it is unset."""
    from app.config import Settings

    def default(name: str) -> object:
        field = Settings.model_fields[name.removeprefix("ENGRAM_").lower()]
        return field.get_default(call_default_factory=True)

    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for name, number, unit in _PROSE_DEFAULT.findall(text):
            if name.removeprefix("ENGRAM_").lower() not in Settings.model_fields:
                continue  # a test's variable (ENGRAM_CHROMIUM, ...)
            given = float(number.replace(",", "")) * _UNITS[unit or None]
            if given != default(name):
                wrong.append(f"{_ids(doc)}: {name} ({number}{unit}) is {default(name)!r}")
    table = (ROOT / "docs" / "operations.md").read_text()
    for *names, cell in _ROW_DEFAULT.findall(table):
        names = [n for n in names if n]
        values = re.findall(r"`([^`]*)`", cell)
        if not values or values[0].startswith("ENGRAM_") or names == ["ENGRAM_DATA_DIR"]:
            continue  # derived from another setting, or the platform's directory
        for name, value in zip(names, values if len(names) > 1 else values[:1], strict=True):
            if value != _as_documented(default(name)):
                wrong.append(f"docs/operations.md: {name} `{value}` is {default(name)!r}")
    assert wrong == []
