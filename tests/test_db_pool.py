"""The pool returns a connection without resetting its session unless the session changed
(app/db/pool.py `PooledConnection`), and every statement in the app that changes a session
past its transaction says so first."""

import ast
import asyncio
import re
from pathlib import Path

import pytest

from app.db.pool import Share, create_pool, drawing_on, session_changed
from app.embeddings import store as embedding_store

APP = Path(__file__).resolve().parents[1] / "app"

EF_SEARCH = "SELECT current_setting('hnsw.ef_search')"
LOCKS = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"


@pytest.mark.filterwarnings("ignore:.*active notification listener")
async def test_a_connection_is_reset_only_after_its_session_changed(db_url: str) -> None:
    pool = await create_pool(db_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            # Unannounced, a session setting outlives the release: no reset statement was sent.
            await conn.execute("SELECT set_config('hnsw.ef_search', '33', false)")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend
            assert await conn.fetchval(EF_SEARCH) == "33"
            session_changed(conn)
        async with pool.acquire() as conn:
            assert await conn.fetchval(EF_SEARCH) == "80"  # RESET ALL: the pool's default
            # A session lock taken the app's way is released with the connection.
            assert await embedding_store.try_lock_model(conn)
            assert await conn.fetchval(LOCKS) == 1
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend
            assert await conn.fetchval(LOCKS) == 0
            # Once reset, the next release sends nothing again.
            await conn.execute("SELECT set_config('hnsw.ef_search', '34', false)")
        async with pool.acquire() as conn:
            assert await conn.fetchval(EF_SEARCH) == "34"
            session_changed(conn)
        async with pool.acquire() as conn:
            # An open transaction is rolled back whatever the session: asyncpg's own reset.
            await conn.execute("BEGIN")
            await conn.execute("CREATE TEMP TABLE left_open (x int)")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT to_regclass('pg_temp.left_open')") is None
            assert await conn.fetchval("SELECT pg_current_xact_id_if_assigned()") is None
            # LISTEN marks the session by itself.
            await conn.add_listener("engram_test", lambda *_: None)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0
    finally:
        await pool.close()


# Statements whose effect outlives their transaction: a setting set for the session, a session
# advisory lock, LISTEN, a prepared statement or held cursor in SQL, a temporary table that is
# not dropped on commit. SQL keywords as the app writes them, upper case ("listen" in a help
# text is not one); SET and RESET where a statement starts (an UPDATE's SET line is not).
SESSION_STATEMENTS = re.compile(
    r"set_config\((?:[^()]|\([^()]*\))*,\s*(?i:false)\s*\)"
    r"|pg_(try_)?advisory_lock(_shared)?\("
    r"|(?:\A|;)\s*(?i:SET|RESET)\s+(?!(?i:LOCAL)\b)"
    r"|\bLISTEN\b|\bPREPARE\b|\bWITH\s+HOLD\b|\bINTO\s+TEMP(ORARY)?\b"
    r"|\bCREATE\s+TEMP(ORARY)?\s+TABLE\b(?![^;]*\bON\s+COMMIT\s+DROP\b)",
    re.DOTALL,
)
# A connection of its own (psycopg, not the pool), closed after the migration.
OWN_CONNECTIONS = {"db/migrate.py"}


def _texts(node: ast.AST) -> str:
    """A string literal's text, or an f-string's constant parts joined."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_texts(v) for v in node.values)
    return ""


def _strings(nodes: list[ast.AST]) -> list[str]:
    """The texts of the string literals among `nodes` (an f-string's parts as one), leaving
    out docstrings (a string standing alone as a statement)."""
    parts = {id(v) for n in nodes if isinstance(n, ast.JoinedStr) for v in n.values}
    parts |= {id(n.value) for n in nodes if isinstance(n, ast.Expr)}
    return [t for n in nodes if id(n) not in parts and (t := _texts(n))]


def test_the_scan_sees_session_statements() -> None:
    for sql in (
        "SELECT set_config('hnsw.ef_search', $1, false)",
        "SELECT set_config('x', format('%s', $1), FALSE)",
        "SELECT 1; SET work_mem = '1GB'",
        "set search_path = x",
        "SELECT pg_try_advisory_lock(1)",
        "CREATE TEMP TABLE t (x int)",
        "SELECT * INTO TEMP t FROM x",
    ):
        assert SESSION_STATEMENTS.search(sql), sql
    for sql in (
        "SELECT set_config('x', $1, true)",
        "UPDATE t\n SET x = 1",
        "SET LOCAL synchronous_commit = off",
        "SELECT pg_advisory_xact_lock(1)",
        "CREATE TEMP TABLE t ON COMMIT DROP AS SELECT 1",
        "address to listen on",
    ):
        assert not SESSION_STATEMENTS.search(sql), sql


def test_statements_that_change_a_session_mark_their_connection() -> None:
    found, unmarked = [], []
    for path in sorted(APP.rglob("*.py")):
        name = str(path.relative_to(APP))
        tree = ast.parse(path.read_text())
        functions = [
            f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        inside = {id(n) for f in functions for n in ast.walk(f)}
        # SQL outside any function (a module's or class's constant) has no connection to mark
        # where it is written: none may change a session.
        outside = [n for n in ast.walk(tree) if id(n) not in inside]
        if any(SESSION_STATEMENTS.search(t) for t in _strings(outside)):
            unmarked.append(f"{name}: a constant")
        for function in functions:
            nodes = list(ast.walk(function))
            if not any(SESSION_STATEMENTS.search(t) for t in _strings(nodes)):
                continue
            found.append(f"{name}:{function.name}")
            marks = any(
                isinstance(n, ast.Call) and getattr(n.func, "id", None) == "session_changed"
                for n in nodes
            )
            if not marks and name not in OWN_CONNECTIONS:
                unmarked.append(f"{name}:{function.name}")
    # The scan sees the statements it is meant to see (a pattern that matched nothing would
    # pass silently).
    assert {
        "memory/maintenance.py:run_round",
        "memory/maintenance.py:_build",
        "embeddings/store.py:try_lock_model",
        "db/migrate.py:upgrade",
    } <= set(found), found
    assert unmarked == [], f"call app.db.pool.session_changed(conn) first in {unmarked}"


def test_the_migrations_functions_leave_sessions_alone() -> None:
    """SQL functions the app calls run on its pooled connections: none may change a session
    (a function's own SET clause, such as word_tiers' plan_cache_mode, ends with the call and
    does not start a statement)."""
    texts = [
        text
        for path in sorted((APP.parent / "migrations" / "versions").glob("*.py"))
        for text in _strings(list(ast.walk(ast.parse(path.read_text()))))
    ]
    assert any("FUNCTION word_tiers" in t for t in texts)  # the scan reads their SQL
    changing = [m.group(0) for t in texts for m in SESSION_STATEMENTS.finditer(t)]
    assert changing == [], (
        "a migration's SQL changes the session of the connection that calls it: use SET LOCAL, "
        "a transaction-level lock or ON COMMIT DROP, or the function's own SET clause"
    )


async def test_work_draws_its_connections_on_its_share(db_url: str) -> None:
    """app/fairness.py: one account's work holds at most its share of the pool; a task that
    holds one of its connections takes another without waiting for itself."""
    pool = await create_pool(db_url, min_size=0, max_size=4)
    share = Share("a", 1)
    most = 0
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        nonlocal most
        async with pool.acquire() as conn:
            most = max(most, pool.connections.held("a"))
            holding.set()
            # A second connection while it holds the share's only one: no deadlock.
            async with pool.acquire() as other:
                assert await other.fetchval("SELECT 1") == 1
            await release.wait()
            await conn.fetchval("SELECT 1")

    async def one_more() -> int:
        async with pool.acquire() as conn:
            return await conn.fetchval("SELECT 2")

    tasks: list[asyncio.Task[object]] = []
    try:
        with drawing_on(share):
            tasks.append(holder := asyncio.create_task(hold()))
            await holding.wait()
            tasks.append(waiting := asyncio.create_task(one_more()))
        # Outside the share: the pool's alone.
        tasks.append(elsewhere := asyncio.create_task(one_more()))
        assert await asyncio.wait_for(elsewhere, 10) == 2
        await asyncio.sleep(0.2)
        assert not waiting.done() and pool.connections.held("a") == 1
        release.set()
        await asyncio.wait_for(holder, 10)
        assert await asyncio.wait_for(waiting, 10) == 2
        assert pool.connections.held("a") == 0 and most == 1
        assert pool.connections.in_use == 0
    finally:
        release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.close()
