"""The documentation works from a fresh clone (issue 16): every relative link in README.md,
bench/README.md and docs/*.md resolves to a file in the repository (and its #anchor to a
heading), nothing points outside it (`../shared`, `/work/`), every ```graphql example (and
every curl example's query) parses and validates against the service's schema, and what the docs
say of the code is the code's: each setting's default, bounds and choices (app/config.py), each
`engram` command and flag they show, each harness and model example, each operation's arguments
as the prose writes them, each error code, and each file and function they name. Running the
examples against a served app is tests/test_docs_examples.py's."""

import argparse
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from graphql import parse, validate

from app.graphql.schema import build_schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ACCESS = ROOT / "docs" / "access.md"
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
    assert broken == [], (
        "links to no committed file or no heading of it (a changed heading changes its "
        "#anchor): point them at what is there now, or `git add` the file"
    )


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
    assert [e.message for e in errors] == [], f"{where} does not validate: fix the example"


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


def test_the_guide_states_the_page_bounds_the_service_enforces():
    """Connections take `first` from 1 to MAX_PAGE; a history search, a plain list, fewer."""
    from app.graphql.relay import MAX_PAGE
    from app.history.search import MAX_LIMIT

    guide = " ".join((ROOT / "docs" / "graphql.md").read_text().split())
    assert f"ask for `first` (1 to {MAX_PAGE:,})" in guide
    assert f"its best `first` parts (1 to {MAX_LIMIT}, by default 10)" in guide


def test_every_setting_is_documented_as_parsed():
    from app.config import Settings

    operations = (ROOT / "docs" / "operations.md").read_text()
    missing = [
        f"ENGRAM_{name.upper()}"
        for name in Settings.model_fields
        if f"`ENGRAM_{name.upper()}`" not in operations
    ]
    assert missing == [], (
        "settings of app/config.py that docs/operations.md does not name: give each a row in "
        "its table of settings (| `ENGRAM_NAME` | `default` (its bounds) | what it does |)"
    )


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
    unnamed = [r for r in sorted(KNOWN) if f"`{r}`" not in access]
    assert unnamed == [], "name each resource of app/auth/resources.KNOWN in docs/access.md"
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
    assert missing == [], (
        "give each option of app/cli.py a help= text, and name each command (`engram name`) and "
        "option in docs/access.md's table of commands"
    )


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
    assert missing == [], "end these options' help= (app/cli.py) with `(default: VALUE)`"


def test_a_flag_whose_default_is_a_setting_names_it_in_its_help():
    """access.md gives some flags a setting as their default (`--port PORT` (... default
    `ENGRAM_PORT`, 8000)); the flag's --help says the same, with the setting's default."""
    from app.config import Settings

    flags = {
        (command, option): action
        for command, p in cli_commands()
        for action in p._actions
        for option in action.option_strings
    }
    wrong = []
    for row in re.findall(r"^\| `engram ([a-z -]+)` \| (.*)$", ACCESS.read_text(), re.M):
        command, cell = row
        for flag, setting in re.findall(
            r"`(--[a-z-]+)[^`]*` \([^)]*?default `(ENGRAM_[A-Z_]+)`", cell
        ):
            help = flags[(command.strip(), flag)].help or ""
            default = Settings.model_fields[setting.removeprefix("ENGRAM_").lower()].default
            if setting not in help or str(default) not in help:
                wrong.append(f"engram {command.strip()} {flag}: {help!r}")
    assert wrong == [], (
        "docs/access.md gives these options a setting as default: their help= (app/cli.py) "
        "says the same, `(default: ENGRAM_NAME, its default)`"
    )


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
    assert wrong == [], "the docs give these settings another default than app/config.py's"


# --- settings: bounds and choices as documented ---------------------------------------------

_OPERATIONS = ROOT / "docs" / "operations.md"
# A bound as the docs write it; numbers inside `code` are examples, and "30 s" or "20 ms" a
# duration of something else, not a bound.
_BOUND = re.compile(
    r"\b(?:from (-?\d[\d,.]*) to (\d[\d,.]*)|at least (\d[\d,.]*)|at most (\d[\d,.]*))\b(?! ?m?s\b)"
)
_WORDS = {86_400: ("86400", "a day"), 604_800: ("604800", "a week")}


def setting_texts() -> dict[str, str]:
    """What operations.md says of each setting: its row of the table (shared with the other
    setting of a `A` / `B` row), or, for one the prose describes, the text from its name to the
    next setting's name or the paragraph's end."""
    text = _OPERATIONS.read_text()
    found: dict[str, str] = {}
    for row in re.findall(r"^\| `ENGRAM_.*$", text, re.M):
        head = row.split("|")[1]
        for name in re.findall(r"`(ENGRAM_[A-Z_]+)`", head):
            found[name] = row
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.startswith("|"):
            continue
        for match in re.finditer(r"`(ENGRAM_[A-Z_]+)` \(", paragraph):
            rest = paragraph[match.end() :]
            following = re.search(r"`ENGRAM_[A-Z_]+` \(", rest)
            found.setdefault(match[1], rest[: following.start() if following else None])
    return found


def _bounds(name: str) -> dict[str, float]:
    from app.config import Settings

    field = Settings.model_fields[name.removeprefix("ENGRAM_").lower()]
    return {
        kind: float(getattr(item, kind))
        for item in field.metadata
        for kind in ("ge", "gt", "le", "lt")
        if hasattr(item, kind)
    }


def _written(value: float) -> tuple[str, ...]:
    number = int(value) if value.is_integer() else value
    if isinstance(number, int):
        return (*_WORDS.get(number, ()), str(number), f"{number:,}")
    return (str(number),)


def test_every_bound_a_setting_has_is_documented_and_no_other():
    """operations.md: "where the table gives no upper bound there is none". Each bound of a
    setting (app/config.py) is written where operations.md describes it, and each bound the
    text gives ("from 1 to 20", "at least 256", "at most 604800") is one the setting has."""
    from app.config import Settings

    texts = setting_texts()
    wrong = []
    for field in Settings.model_fields:
        name = f"ENGRAM_{field.upper()}"
        text = re.sub(r"`[^`]*`", "", texts.get(name, ""))
        bounds = _bounds(name)
        for kind, value in bounds.items():
            if kind == "gt" and value == 0:
                said = re.search(r"above 0|more than 0|at least twice", text)
            else:
                said = any(
                    re.search(rf"(?<![\d,.]){re.escape(w)}(?![\d]|[,.]\d)", text)
                    for w in _written(value)
                )
            if not said:
                wrong.append(f"{name}: its bound {kind} {value:g} is not documented")
    for name, row in texts.items():
        if name.removeprefix("ENGRAM_").lower() not in Settings.model_fields:
            continue
        names = re.findall(r"`(ENGRAM_[A-Z_]+)`", row.split("|")[1]) if row.startswith("|") else []
        allowed = {v for n in (names or [name]) for v in _bounds(n).values()}
        for numbers in _BOUND.findall(re.sub(r"`[^`]*`", "", row)):
            for number in filter(None, numbers):
                if float(number.replace(",", "")) not in allowed:
                    wrong.append(f"{name}: the docs give a bound of {number}, which it has not")
    assert wrong == [], (
        "where docs/operations.md describes a setting, write each bound app/config.py gives it "
        "(ge/gt/le, Field(...)) as `from 1 to 100`, `at least 1`, `at most 100` or `above 0`, "
        "and no other"
    )


def test_every_choice_a_setting_takes_is_documented():
    """A setting that takes one of a few words (`ENGRAM_EMBEDDER`, `ENGRAM_LOG_LEVEL`, ...) has
    each of them named where operations.md describes it."""
    import typing

    from app.config import Settings

    texts = setting_texts()
    missing = [
        f"ENGRAM_{field.upper()}: {choice}"
        for field, info in Settings.model_fields.items()
        if typing.get_origin(info.annotation) is typing.Literal
        for choice in typing.get_args(info.annotation)
        if f"`{choice}`" not in texts.get(f"ENGRAM_{field.upper()}", "")
    ]
    assert missing == [], "name each value (`value`) where docs/operations.md describes the setting"


# --- the `engram` command as the docs show it -----------------------------------------------

_ENGRAM = re.compile(r"`(engram [^`<]*)`")


def test_every_engram_command_the_docs_show_exists_with_its_flags():
    """Each `engram ...` the docs show (README's table, access.md, operations.md, ...) names a
    command the CLI has, and each flag it shows is one of that command's: a renamed command or
    flag fails here, not in a user's terminal."""
    commands = {words: p for words, p in cli_commands() if words}
    engram = next(p for words, p in cli_commands() if not words)
    own = {o for a in engram._actions for o in a.option_strings}  # `engram --version`
    wrong = []
    for doc in DOCS:
        for shown in _ENGRAM.findall(re.sub(r"\s+", " ", doc.read_text())):
            words = shown.split()[1:]
            if words and "/" in words[0] + "".join(words[1:2]):  # `client update/delete`
                continue
            if words[:1] and words[0] in own:
                continue
            path = []
            while words and " ".join([*path, words[0]]) in commands:
                path.append(words.pop(0))
            if not path or commands[" ".join(path)]._subparsers:
                wrong.append(f"{_ids(doc)}: `{shown}` names no command")
                continue
            known = {
                option
                for action in commands[" ".join(path)]._actions
                for option in action.option_strings
            }
            for word in words:
                flag = word.strip("[]").split("=")[0]
                if flag.startswith("-") and flag not in known:
                    wrong.append(f"{_ids(doc)}: `{shown}`: {flag} is no flag of it")
    assert wrong == [], "the docs show commands or flags app/cli.py's parser does not have"


def test_every_benchmark_is_in_the_table_of_scripts():
    """bench/README.md's table of scripts links each benchmark of bench/ to its section."""
    text = (ROOT / "bench" / "README.md").read_text()
    table = text.split("**Scripts.**", 1)[1].split("\n\n", 2)[1]
    listed = set(re.findall(r"^\| \[`(\w+\.py)", table, re.M))
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")} - {"common.py"}
    assert sorted(scripts - listed) == [], (
        "give each a row in bench/README.md's table of scripts, linked to its section"
    )


def test_the_newest_migration_the_docs_quote_is_this_releases():
    """access.md and operations.md quote what `engram --version` and `engram migrate` print,
    with the newest migration of migrations/versions; a new migration changes what they print."""
    from app.db.migrate import latest_revision

    newest = latest_revision()
    stale = [
        f"{_ids(doc)}: {quoted}"
        for doc in DOCS
        for quoted in re.findall(
            r"migrations up to \d+|the latest migration \(\d+\)",
            re.sub(r"\s+", " ", doc.read_text()),
        )
        if not quoted.rstrip(")").endswith(newest)
    ]
    assert stale == [], f"the newest migration is {newest}: write it in these"


# --- harness and model examples -------------------------------------------------------------


def _json_examples(doc: Path) -> list[str]:
    text = doc.read_text()
    inline = re.findall(r"`(\{\"(?:memory|history|harness|model)\".*?\})`", text)
    return re.findall(r"^```json\n(.*?)^```", text, re.S | re.M) + inline


def test_every_harness_and_model_example_is_accepted():
    """Every harness the docs show (harness.md's examples, the README's `{"memory": ...}`)
    is one createAction takes, and harness.md's `model` example is accepted once its endpoint
    and key variable are allowed, as the text says, and refused before."""
    import json
    from uuid import uuid4

    from app.actions.harness import parse_harness
    from app.actions.model import check_endpoint, parse_model
    from app.config import Settings
    from app.errors import BadInput

    seen = 0
    for doc in DOCS:
        for example in _json_examples(doc):
            value = json.loads(example)
            if not {"memory", "history", "harness", "baseUrl"} & set(value):
                continue  # a policy (access.md), an MCP client's configuration (README)
            if "baseUrl" in value:  # harness.md's `model`
                config, _ = parse_model(value)
                account = uuid4()
                with pytest.raises(BadInput):
                    check_endpoint(config, Settings(), account)
                allowed = Settings(
                    model_allowed_base_urls=[value["baseUrl"]],
                    model_allowed_key_envs=[value["apiKeyEnv"]],
                )
                check_endpoint(config, allowed, account)
            else:
                value = value.get("harness", value)
                parse_harness(value)
                if "model" in value:
                    parse_model(value["model"])
            seen += 1
    assert seen >= 8


def test_every_graphql_request_a_curl_example_sends_validates():
    """The `curl ... -d '{"query": ...}'` examples (README, graphql.md) send a document that
    validates against the schema (the fenced examples are checked above)."""
    import json

    schema = build_schema()._schema
    bodies = [
        json.loads(body)
        for doc in DOCS
        for body in re.findall(r"-d '(\{\"query\".*?\})'", doc.read_text(), re.S)
    ]
    assert len(bodies) >= 2
    for body in bodies:
        assert [e.message for e in validate(schema, parse(body["query"]))] == [], body


# --- error codes ----------------------------------------------------------------------------

_QUOTED_CODE = re.compile(
    r"extensions\.code:? ?`?([A-Z_]+)|\"code\": \"([A-Z_]+)\""
    r"|error \(([A-Z_]+)\)|data\.code: ([A-Z_]+)"
)


def test_every_error_code_is_explained_and_every_quoted_one_exists():
    """graphql.md's list of `extensions.code` values explains each code the service can answer
    (app/graphql/errors.py CODES, which every domain error's code is one of), and every code
    the docs quote (`extensions.code: UNAVAILABLE`, `"code": "ACCESS_DENIED"`, `error
    (CONFLICT)`) is one of them."""
    from app import errors
    from app.graphql.errors import CODES

    domain = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.DomainError)
    }
    assert domain <= set(CODES)
    guide = (ROOT / "docs" / "graphql.md").read_text()
    listed = guide[guide.index("Errors come back in") :].split("\n\n")[0]
    unexplained = [code for code in CODES if f"`{code}` (" not in listed]
    assert unexplained == [], (
        "explain each in docs/graphql.md's list that starts `Errors come back in`, as "
        "`CODE` (what it means)"
    )
    quoted = {
        code
        for doc in DOCS
        for match in _QUOTED_CODE.findall(re.sub(r"\s+", " ", doc.read_text()))
        for code in match
        if code and code != "CODE"
    }
    assert quoted and quoted <= set(CODES), quoted - set(CODES)


# The packages of app/, which architecture.md and others name without `app/` (`runtime/review.py`,
# `memory/maintenance.IndexBuilds`).
_PACKAGES = sorted(p.name for p in (ROOT / "app").iterdir() if (p / "__init__.py").exists())
_NAMED_PATH = re.compile(rf"`((?:app|bench|tests|migrations|{'|'.join(_PACKAGES)})/[\w./-]+)`")


def _names_something(named: str) -> bool:
    """`named` is a file or folder of the repository (or of app/), or `module.name` a function
    or class of that module."""
    for base in (ROOT, ROOT / "app"):
        if (base / named.rstrip("/")).exists():
            return True
        module, _, name = named.rpartition(".")
        source = base / f"{module}.py"
        if source.exists() and re.search(
            rf"^(async def|def|class) {re.escape(name)}\b", source.read_text(), re.M
        ):
            return True
    return False


def test_every_file_and_function_the_docs_name_exists():
    """A path the docs name in code (`app/runtime/review.py`, `bench/history.py`, or under app/
    by its package, `runtime/deadline.py`) is a file or folder of the repository, and
    `app/memory/review.rerank` (`memory/maintenance.IndexBuilds`) a function (class) of that
    module."""
    missing = [
        f"{_ids(doc)}: {named}"
        for doc in DOCS
        for named in sorted(set(_NAMED_PATH.findall(doc.read_text())))
        if not _names_something(named)
    ]
    assert missing == [], (
        "the docs name files, functions or classes that are not there (moved or renamed?): "
        "write where they are now"
    )


# An operation as the prose writes it: `deleteClient(principal, accountId, expectedModified)`,
# `Action.searchMemories(query, first)`,
# `executeAction(input: {actionId, replayOf: <executionId>})`.
_SIGNATURE = re.compile(r"`(?:(\w+)\.)?(\w+)\((\w+: \{[^}`]*\}|[\w, ]*)\)")


def test_every_operation_signature_in_the_prose_matches_the_schema():
    """The operations the prose calls (`deleteClient(...)`, `Action.searchMemories(...)`) are
    the schema's, with the arguments (and input fields) the schema gives them."""
    from graphql import get_named_type

    schema = build_schema()._schema
    fields: dict[str, list[tuple[str, Any]]] = {}
    for type_name, kind in schema.type_map.items():
        for name, field in (
            getattr(kind, "fields", {}).items() if not type_name.startswith("__") else ()
        ):
            if hasattr(field, "args"):
                fields.setdefault(name, []).append((type_name.lower(), field))
    types = {name.lower() for name in schema.type_map if not name.startswith("__")}
    wrong = []
    for doc in DOCS:
        for owner, name, args in _SIGNATURE.findall(re.sub(r"\s+", " ", doc.read_text())):
            candidates = [f for t, f in fields.get(name, ()) if not owner or t == owner.lower()]
            if not candidates:
                # A tool or a Python function (`search_history(...)`, `gc.freeze()`) is
                # snake_case; a camelCase name, or a field of a type, is the schema's.
                if re.search(r"[a-z][A-Z]", name) or owner.lower() in types:
                    wrong.append(f"{_ids(doc)}: {owner + '.' if owner else ''}{name} is no field")
                continue
            nested = re.fullmatch(r"(\w+): \{(.*)\}", args)
            words = [a.split(":")[0].strip() for a in (nested[2] if nested else args).split(",")]
            words = [w for w in words if w and w != "..."]
            fits = False
            for field in candidates:
                if nested:
                    arg = field.args.get(nested[1])
                    known = set(get_named_type(arg.type).fields) if arg else set()
                else:
                    known = set(field.args)
                fits = fits or set(words) <= known
            if not fits:
                wrong.append(f"{_ids(doc)}: {owner + '.' if owner else ''}{name}({args})")
    assert wrong == [], "the prose gives operations arguments the schema does not (schema.graphql)"


def test_every_type_field_the_prose_names_is_the_schemas():
    """A field the prose names by its type without arguments (`ActionExecution.kind`,
    `Client.coveredByViewer`, `ActionHistoryWho.TOOL`) is a field (or enum value) of that
    type of the schema."""
    schema = build_schema()._schema
    wrong = []
    for doc in DOCS:
        for owner, name in re.findall(r"`([A-Z]\w+)\.(\w+)", doc.read_text()):
            kind = schema.type_map.get(owner)
            if kind is None:
                continue  # not a schema type (a Python name such as `Settings.x`)
            if name not in (getattr(kind, "fields", None) or getattr(kind, "values", None) or {}):
                wrong.append(f"{_ids(doc)}: {owner}.{name}")
    assert wrong == [], "the prose names fields or enum values the schema does not have"


def test_every_field_of_a_request_log_line_is_documented():
    """operations.md names the fields a request's JSON log line carries: each key the access
    log passes (app/observability/requests.py, `extra=`), and the request ID."""
    import ast

    source = (ROOT / "app" / "observability" / "requests.py").read_text()
    fields = {"request_id", "time", "level", "logger", "message"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == "extra":
            assert isinstance(node.value, ast.Dict)
            fields |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    assert "duration_ms" in fields  # the scan found the access log's fields
    operations = (ROOT / "docs" / "operations.md").read_text()
    unnamed = sorted(f for f in fields if f"`{f}`" not in operations)
    assert unnamed == [], "name each field of the request log line (`field`) in docs/operations.md"


def test_the_readme_names_every_filter_of_action_memories():
    """The README's sentence on `Action.memories` lists its optional filters: each argument of
    the schema's field but the paging and the order (it left `sessionId` out)."""
    schema = build_schema()._schema
    arguments = set(schema.type_map["Action"].fields["memories"].args) - {"first", "after", "sort"}
    readme = " ".join((ROOT / "README.md").read_text().split())
    sentence = re.search(
        r"`Action\.memories` lists newest first .*? filters: (.*?) Retrying", readme
    )
    assert sentence, "the README's sentence on Action.memories' filters is gone"
    unnamed = sorted(a for a in arguments if f"`{a}`" not in sentence[1])
    assert unnamed == [], f"the README's list of Action.memories' filters leaves out {unnamed}"


def test_the_migration_recipe_names_the_next_number():
    """architecture.md's recipe for a migration names "the next number" in its file name, its
    `revision` and the command that writes it: run as written after a new migration, it would
    make a second file of that number (it named 0033 once 0033 existed)."""
    from app.db.migrate import latest_revision

    following = f"{int(latest_revision()) + 1:04d}"
    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    recipe = text[text.index("**A migration**") : text.index("**A setting**")]
    quoted = re.findall(r"(\d{4})_session_labels|revision = \"(\d{4})\"|rev_id='(\d{4})'", recipe)
    numbers = [n for found in quoted for n in found if n]
    assert len(numbers) == 3, recipe
    assert set(numbers) == {following}, (
        f"the next migration is {following}: write it in docs/architecture.md's recipe for a "
        f"migration, in its example's file name ({following}_session_labels.py), `revision` and "
        "`rev_id`"
    )
