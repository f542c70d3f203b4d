"""Layers look down only: the import rule of app/, checked from the source (docs/architecture.md).

Every module under app/ belongs to a top-level package (or is a top-level module); LAYERS
lists them from the top down. A module imports its own package, or packages of a lower layer;
packages of one layer may import each other, but no two packages import each other, directly
or around a circle. Store modules (store.py, *_store.py) hold SQL: outside their own package
they import only the bottom layer. Modules of app/graphql import each other in no circle.
Every import counts, also those inside a function or under TYPE_CHECKING: deferring an import
hides a circle from Python, not from a reader. And SQL runs in the stores (and app/db) only,
but for the exceptions docs/architecture.md names (SQL_OUTSIDE_STORES).
"""

import ast
import re
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"

# Top-level packages and modules of app/, from the top layer down. A new package gets a place
# here, where what it imports and what imports it put it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # Entry points: the servers and the command line, the APIs they serve, their wiring.
    ("cli", "main", "services", "graphql", "mcp", "web"),
    # Domain packages, each above the ones after it.
    ("transfer",),  # dumps and restores an account's agents
    ("runtime",),  # turns: model calls, tools, context, the memory review
    ("memory",),  # memory records: writes, reads, search, maintenance
    ("history",),  # sessions' kept history and its search
    ("actions", "idempotency"),  # agents and their harness; idempotency keys
    ("executions",),  # executions, sessions and transcripts as records
    ("auth",),  # callers, grants and policies
    # What every domain uses: process state, each account's share of the process (fairness),
    # embedding providers, observability.
    ("state", "fairness"),
    ("embeddings", "observability"),
    # The bottom: database access and SQL helpers, text safety, HTTP bodies and retries, record
    # scopes and session IDs, typed checks of configuration, settings, errors, stopping
    # background loops.
    ("db", "text", "http_retry", "http_body", "scope", "shapes", "config", "errors", "tasks"),
)
BOTTOM = LAYERS[-1]

# Known breaches, each to be removed by the change named beside it.
KNOWN: set[str] = set()

# Modules other than the stores (and app/db) that run SQL, as docs/architecture.md says: index
# upkeep, which is DDL and catalog reads (any statement), and single statements that lock or
# bound their transaction.
SQL_OUTSIDE_STORES: dict[str, tuple[str, ...] | None] = {
    "app/memory/maintenance.py": None,
    "app/history/indexes.py": None,
    "app/auth/service.py": ("SELECT pg_advisory_xact_lock(hashtext('engram.bootstrap'))",),
    "app/runtime/turns.py": ("SET LOCAL lock_timeout = 0",),
}
# asyncpg's calls that run a statement.
_RUNS_SQL = {
    "execute",
    "executemany",
    "fetch",
    "fetchrow",
    "fetchval",
    "cursor",
    "prepare",
    "copy_records_to_table",
    "copy_to_table",
    "copy_from_query",
}


def _modules(app: Path) -> dict[str, Path]:
    """Module name (app.x.y) -> file, packages named by their __init__.py."""
    modules = {}
    for path in sorted(app.rglob("*.py")):
        parts = ("app", *path.relative_to(app).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of app/ that `module` imports, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from app.x import y` imports module app.x.y when there is one, else app.x.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        found.update(n for n in names if n == "app" or n.startswith("app."))
    return found


def _top(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def breaches(app: Path) -> list[str]:
    """Every breach of the rule in the tree at `app`, one line each."""
    layer = {name: depth for depth, names in enumerate(LAYERS) for name in names}
    modules = _modules(app)
    found = []
    packages: dict[str, set[str]] = {}
    graphql: dict[str, set[str]] = {}
    for module, path in modules.items():
        if module == "app":
            continue
        own = _top(module)
        if own not in layer:
            found.append(f"app.{own} has no place in LAYERS (tests/test_layering.py)")
            continue
        is_store = path.stem == "store" or path.stem.endswith("_store")
        for target in sorted(_imports(module, path, modules)):
            other = _top(target)
            if own == other == "graphql" and target != "app.graphql":
                graphql.setdefault(module, set()).add(target)
            if other == own or other not in layer:
                continue
            packages.setdefault(own, set()).add(other)
            if layer[other] < layer[own]:
                found.append(f"{module} imports {target}: app.{other} is above app.{own}")
            elif is_store and other not in BOTTOM:
                found.append(f"{module} imports {target}: a store imports only {BOTTOM}")
    for group in _circles(packages):
        found.append("packages import each other: " + ", ".join(f"app.{p}" for p in group))
    for group in _circles(graphql):
        found.append("modules in a circle: " + ", ".join(group))
    return list(dict.fromkeys(found))  # once each


def sql_outside_stores(app: Path) -> list[str]:
    """Each call that runs SQL in a module that is no store, one line each."""
    found = []
    for path in sorted(app.rglob("*.py")):
        name = path.relative_to(app.parent).as_posix()
        if path.stem == "store" or path.stem.endswith("_store") or name.startswith("app/db/"):
            continue
        allowed = SQL_OUTSIDE_STORES.get(name, ())
        if allowed is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _RUNS_SQL
            ):
                continue
            first = node.args[0] if node.args else None
            if not (isinstance(first, ast.Constant) and first.value in allowed):
                found.append(f"{name}:{node.lineno} runs SQL ({node.func.attr})")
    return found


def test_sql_runs_in_the_stores() -> None:
    found = sql_outside_stores(APP)
    assert found == [], (
        "move the statement into its package's store.py (a function taking the connection), or, "
        "if it is index upkeep or a lock, name it in SQL_OUTSIDE_STORES and in "
        "docs/architecture.md:\n" + "\n".join(found)
    )


def test_layers_look_down_only() -> None:
    found = breaches(APP)
    assert [b for b in found if b not in KNOWN] == [], "\n".join(found)


def test_known_breaches_still_exist() -> None:
    """A known breach that is gone leaves KNOWN, so it cannot come back unnoticed."""
    assert set(breaches(APP)) >= KNOWN


def test_the_architecture_page_names_every_package_in_its_layer() -> None:
    """docs/architecture.md's table of layers lists each package of LAYERS in the row of its
    layer, so that a package given a place here is given one there (fairness was not)."""
    page = (APP.parent / "docs" / "architecture.md").read_text()
    table = page.split("## Layers", 1)[1].split("\n\n| layer |", 1)[1].split("\n\n", 1)[0]
    rows = [row.split("|")[2] for row in table.splitlines()[2:]]
    listed = [tuple(re.findall(r"`(\w+)`", packages)) for packages in rows]
    assert listed == list(LAYERS), (
        "write each package of LAYERS, in its order, in its layer's row of the table in "
        "docs/architecture.md (`name`, a row a tuple of LAYERS)"
    )


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / "app" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "app"


def test_sql_outside_a_store_is_reported(tmp_path: Path) -> None:
    app = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "memory/__init__.py": "",
            "memory/service.py": "async def f(conn):\n    return await conn.fetchval('SELECT 1')\n",
            "memory/store.py": "async def f(conn):\n    return await conn.fetchval('SELECT 1')\n",
            "memory/search_store.py": "async def f(c):\n    return await c.fetch('SELECT 1')\n",
            "db/pool.py": "async def f(conn):\n    await conn.execute('RESET ALL')\n",
            "auth/service.py": (
                "async def f(conn):\n"
                f"    await conn.execute({SQL_OUTSIDE_STORES['app/auth/service.py'][0]!r})\n"
                "    await conn.execute('DELETE FROM clients')\n"
            ),
        },
    )
    assert sql_outside_stores(app) == [
        "app/auth/service.py:3 runs SQL (execute)",
        "app/memory/service.py:2 runs SQL (fetchval)",
    ]


def test_a_lower_layer_importing_a_higher_one_is_reported(tmp_path: Path) -> None:
    app = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "memory/__init__.py": "",
            "memory/operator.py": "from app.runtime import store\n",
            "runtime/__init__.py": "",
            "runtime/store.py": "from app.memory.visibility import Params\n",
            "memory/visibility.py": "",
            "auth/__init__.py": "",
            "auth/caller.py": "def f():\n    from app.actions import service\n",
            "actions/__init__.py": "",
            "actions/service.py": "",
            "actions/store.py": "from app.auth.caller import Caller\n",
            "graphql/__init__.py": "",
            "graphql/a.py": "from app.graphql.b import B\n",
            "graphql/b.py": "from . import a\n",
            "search/__init__.py": "",
        },
    )
    assert sorted(breaches(app)) == sorted(
        [
            "app.memory.operator imports app.runtime.store: app.runtime is above app.memory",
            "app.auth.caller imports app.actions.service: app.actions is above app.auth",
            f"app.actions.store imports app.auth.caller: a store imports only {BOTTOM}",
            f"app.runtime.store imports app.memory.visibility: a store imports only {BOTTOM}",
            "packages import each other: app.memory, app.runtime",
            "packages import each other: app.actions, app.auth",
            "modules in a circle: app.graphql.a, app.graphql.b",
            "app.search has no place in LAYERS (tests/test_layering.py)",
        ]
    )
