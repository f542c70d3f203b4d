"""Commands that must not touch a database they would break refuse in one line (exit 2): a
database migrated by a newer release, and `engram reembed` while the service serves."""

import asyncio
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import psycopg
import pytest
from alembic.script import ScriptDirectory
from helpers import database_copy
from servers import clean_env, run

from app import cli
from app.db import migrate
from app.db.embedded import EmbeddedPostgres
from app.db.pool import create_pool
from app.embeddings import store
from app.embeddings.reembed import ServiceRunning, reembed
from app.embeddings.static import StaticEmbedder
from app.memory.vectors import VECTOR_COLUMNS
from app.state import AppState


async def _execute(db_url: str, sql: str, *args: object) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_database_of_a_newer_release_is_refused(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_execute(db_url, "UPDATE alembic_version SET version_num = '0099_future'"))
    head = ScriptDirectory.from_config(migrate.alembic_config(db_url)).get_current_head()
    with pytest.raises(migrate.DatabaseTooNew) as refused:
        migrate.upgrade(db_url)
    assert str(refused.value) == (
        f"the database is at revision 0099_future, newer than this release's latest ({head}): "
        "run the newer engram, or restore a backup"
    )

    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    assert cli.main(["migrate"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "revision 0099_future, newer than" in err
    # A command that only reads, which migrates nothing, refuses it the same way.
    assert cli.main(["export", "--action", str(uuid.uuid4())]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"error (CONFLICT): {refused.value}\n"


def test_each_migrations_revision_is_its_files_number() -> None:
    """`migrate.upgrade` knows a database is at the newest migration from the files' names,
    without importing alembic: that holds only while each revision is its file's number and
    the newest file is alembic's head."""
    script = ScriptDirectory.from_config(migrate.alembic_config(""))
    for revision in script.walk_revisions():
        assert Path(revision.path).name.startswith(f"{revision.revision}_"), revision.path
    assert migrate.newest_file() == script.get_current_head()


async def test_a_database_at_the_newest_migration_is_known_without_alembic(
    db_url: str, pg_server: EmbeddedPostgres
) -> None:
    """Every command and start checks its database's migration first: on a database at the
    newest (the usual case) it imports no alembic or SQLAlchemy (a third of a second or more
    a command); an empty one is migrated as ever."""
    check = (
        "import sys; from app.db import migrate; print(migrate.upgrade(sys.argv[1]), "
        "'alembic' in sys.modules, 'sqlalchemy' in sys.modules)"
    )

    def upgraded(url: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", check, url], env=clean_env(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    newest = migrate.newest_file()
    assert await asyncio.to_thread(upgraded, db_url) == [newest, "False", "False"]
    name = f"engram_unmigrated_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as empty:
        assert await asyncio.to_thread(upgraded, empty) == [newest, "True", "True"]
        assert await asyncio.to_thread(upgraded, empty) == [newest, "False", "False"]


async def test_reembed_refuses_while_a_service_beats(state: AppState) -> None:
    """`state` started the services, whose liveness beats into service_processes."""
    embedder = StaticEmbedder()
    with pytest.raises(ServiceRunning) as refused:
        await reembed(state.pool, embedder, VECTOR_COLUMNS, lease_seconds=60)
    message = str(refused.value)
    assert "\n" not in message and "stop the service first" in message
    async with state.pool.acquire() as conn:
        assert await store.reembed_target(conn) is None  # nothing was touched


async def test_reembed_runs_once_no_service_beats(db_url: str, embedder: StaticEmbedder) -> None:
    """A row left by a service killed on this host, and one whose heartbeat is past the lease,
    are not a serving process."""
    for host, pid, age in [
        (socket.gethostname(), _dead_pid(), 0),
        ("elsewhere", 4242, 120),
    ]:
        await _execute(
            db_url,
            "INSERT INTO service_processes (boot_id, host, pid, heartbeat) "
            "VALUES ($1, $2, $3, now() - make_interval(secs => $4))",
            uuid.uuid4(),
            host,
            pid,
            float(age),
        )
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        result = await reembed(pool, embedder, VECTOR_COLUMNS, lease_seconds=60)
    finally:
        await pool.close()
    assert result.model == embedder.name


async def test_reembed_judges_a_service_by_the_lease_it_recorded(
    db_url: str, embedder: StaticEmbedder
) -> None:
    """A service running with a ten-minute lease, silent for two minutes, still serves: reembed
    (run with a 60 s lease of its own) refuses."""
    await _execute(
        db_url,
        "INSERT INTO service_processes (boot_id, host, pid, heartbeat, lease_seconds) "
        "VALUES ($1, 'elsewhere', 4242, now() - interval '120 seconds', 600)",
        uuid.uuid4(),
    )
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        with pytest.raises(ServiceRunning, match="process 4242 on elsewhere"):
            await reembed(pool, embedder, VECTOR_COLUMNS, lease_seconds=60)
    finally:
        await pool.close()


def test_engram_reembed_refuses_while_a_service_on_another_host_beats(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(
        _execute(
            db_url,
            "INSERT INTO service_processes (boot_id, host, pid) VALUES ($1, 'elsewhere', 4242)",
            uuid.uuid4(),
        )
    )
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.setenv("ENGRAM_EMBEDDER", "static")
    assert cli.main(["reembed"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "process 4242 on elsewhere" in err and "stop the service first" in err


async def test_a_migration_that_fails_is_said_in_one_line_with_where_the_database_stays(
    pg_server, tmp_path
):
    """A migration the database refuses (here a name taken; out of disk, say, in production)
    stopped `engram migrate` and `engram serve` with an 80-line traceback, exit 1, saying
    neither which migration failed nor where the database was left."""
    name = f"engram_failing_0032_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url, "0031")
        await _execute(url, "CREATE TABLE agent_memories_session_next ()")  # the name taken
        env = clean_env(database_url=url, data_dir=str(tmp_path / "unused"), port="1")
        for command in ("migrate", "serve"):
            done = await asyncio.to_thread(run, env, command)
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr, done.stderr
            assert done.stderr.splitlines()[-1] == (
                'engram: migration 0032 failed (relation "agent_memories_session_next" already '
                "exists); the database stays at migration 0031: fix the cause and run `engram "
                "migrate` again (docs/operations.md, Upgrades, says what each migration needs)"
            ), done.stderr
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == "0031"
            await conn.execute("DROP TABLE agent_memories_session_next")
        finally:
            await conn.close()
        done = await asyncio.to_thread(run, env, "migrate")
        assert done.returncode == 0, done.stderr
        head = ScriptDirectory.from_config(migrate.alembic_config(url)).get_current_head()
        assert done.stdout == f"database is at the latest migration ({head})\n"


async def test_a_migration_refused_for_want_of_a_privilege_says_what_the_role_needs(
    pg_server, tmp_path
):
    """A role that does not own its database (or may not create pgvector's extension) fails a
    migration with PostgreSQL's "permission denied ...", and the line sent the operator to the
    Upgrades section, which says nothing of privileges; it names what the role needs and where
    operations.md says so."""
    name = f"engram_not_owned_{uuid.uuid4().hex[:8]}"
    role = f"engram_tenant_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        await _execute(url, "CREATE EXTENSION vector")
        await _execute(url, f"CREATE ROLE {role} LOGIN")
        await _execute(url, f"GRANT CREATE ON SCHEMA public TO {role}")
        try:
            socket_dir = psycopg.conninfo.conninfo_to_dict(url)["host"]
            as_role = f"postgresql://{role}@/{name}?host={socket_dir}"
            env = clean_env(database_url=as_role, data_dir=str(tmp_path / "unused"))
            done = await asyncio.to_thread(run, env, "migrate")
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr, done.stderr
            line = done.stderr.splitlines()[-1]
            assert line.startswith(
                'engram: migration 0005 failed (permission denied to create extension "btree_gin")'
                "; the database stays at migration 0004: "
            ), line
            assert line.endswith(
                "the database's role needs to own it, and pgvector's `vector` extension to be "
                "created by a superuser beforehand (docs/operations.md, ENGRAM_DATABASE_URL); "
                "then run `engram migrate` again"
            ), line
        finally:
            await _execute(url, f"DROP OWNED BY {role}")
            await _execute(url, f"DROP ROLE {role}")


async def test_commands_that_only_read_refuse_an_older_database_and_leave_it_as_it_is(
    pg_server, tmp_path
):
    """`engram export` and `engram client tokens` only read: on a database an older release
    migrated (the backup an operator takes before upgrading) they migrated it in place first,
    for good. Each is refused in one line saying where it stands and what to do, and leaves it
    at its revision; a command that writes migrates it as ever."""
    newest = migrate.newest_file()
    name = f"engram_older_reads_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        migrate.upgrade(url, "0031")
        env = clean_env(database_url=url, data_dir=str(tmp_path / "unused"))
        action = str(uuid.uuid4())
        for args, command in [
            (["export", "--action", action], "export"),
            (["export", "--action", action, "--account", action], "export"),
            (["client", "tokens", "admin"], "client tokens"),
            (["client", "tokens", "admin", "--account", action], "client tokens"),
        ]:
            done = await asyncio.to_thread(run, env, *args)
            assert (done.returncode, done.stdout) == (2, ""), done.stderr
            assert done.stderr.splitlines() == [
                f"error (CONFLICT): the database is at revision 0031, this engram needs "
                f"{newest}: `engram {command}` only reads, and migrates nothing: back up the "
                "database (docs/operations.md, Backup and restore) and run `engram migrate` "
                f"(or run `engram {command}` with the release that wrote it)"
            ], args
            conn = await asyncpg.connect(url)
            try:
                assert await conn.fetchval("SELECT version_num FROM alembic_version") == "0031"
                assert await conn.fetchval("SELECT count(*) FROM accounts") == 0
            finally:
                await conn.close()
        done = await asyncio.to_thread(run, env, "client", "create", "ops")
        assert done.returncode == 0, done.stderr
        done = await asyncio.to_thread(run, env, "client", "tokens", "ops")
        assert done.returncode == 0, done.stderr
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == newest
        finally:
            await conn.close()


async def test_commands_that_only_read_refuse_a_database_no_migration_has_run_on(pg_server):
    """An empty database (ENGRAM_DATABASE_URL naming one just created): migrated by a command
    that only reads, to read nothing from it; now refused, left empty."""
    name = f"engram_empty_reads_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        env = clean_env(database_url=url)
        for args, command in [
            (["export", "--action", str(uuid.uuid4())], "export"),
            (["client", "tokens", "admin"], "client tokens"),
        ]:
            done = await asyncio.to_thread(run, env, *args)
            assert (done.returncode, done.stdout) == (2, ""), done.stderr
            assert done.stderr.splitlines() == [
                "error (NOT_FOUND): the database holds no Engram tables yet (no migration has "
                f"run on it): `engram {command}` only reads, and migrates nothing: point "
                "ENGRAM_DATABASE_URL (or ENGRAM_DATA_DIR) at the service's database, or start "
                "the service first (`engram serve`)"
            ], args
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT to_regclass('alembic_version')") is None
        finally:
            await conn.close()


def test_an_export_of_an_older_embedded_database_says_to_back_up_its_data_directory(
    data_root: Path,
) -> None:
    """The embedded database of a release before (ENGRAM_DATA_DIR), as an operator exports it
    before upgrading: refused, naming the data directory to back up; left at its revision."""
    from app.db.embedded import embedded_uri

    data_dir = data_root / "data"
    server, url = embedded_uri(data_dir)
    try:
        migrate.upgrade(url, "0031")
    finally:
        server.stop()
    done = run(clean_env(data_dir=str(data_dir)), "export", "--action", str(uuid.uuid4()))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # (After the embedded server's log line.)
    assert done.stderr.splitlines()[-1] == (
        f"error (CONFLICT): the database is at revision 0031, this engram needs "
        f"{migrate.newest_file()}: `engram export` only reads, and migrates nothing: back up the "
        f"data directory ({data_dir}) and run `engram migrate` (or run `engram export` with the "
        "release that wrote it)"
    ), done.stderr
    server, url = embedded_uri(data_dir)
    try:
        with psycopg.connect(url) as conn:
            assert migrate.current_revision(conn) == "0031"
    finally:
        server.stop()
