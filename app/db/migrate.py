"""Runs the alembic migrations (raw SQL) against a database URL.

alembic (with SQLAlchemy) is imported only where a migration runs or its scripts are read: a
third of a second or more, which every `engram` command and start paid to learn that its
database is at the newest migration already (`upgrade`'s first look, by the files' numbers).
"""

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from app.db.errors import MigrationFailed
from app.errors import Conflict

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy.exc import DBAPIError

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"

log = logging.getLogger(__name__)
# How often a process waiting for another's migration tries the lock again.
_LOCK_RETRY_SECONDS = 0.2
# "permission denied ...": the role does not own the database, or may not create an extension.
_INSUFFICIENT_PRIVILEGE = "42501"


def alembic_config(url: str) -> "Config":
    """The migrations' alembic config; env.py connects with `url` as libpq reads it, as every
    other connection does (SQLAlchemy's own parsing took a socket directory written as the
    host, `%2Fvar%2Frun%2Fpostgresql`, for a host name)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = url
    return cfg


class MigrationStopped(Exception):
    """The process stopped (SIGTERM while starting) while waiting for another's migration."""


class DatabaseTooNew(Conflict):
    """The database was migrated by a newer release: this one knows none of its revisions."""


def _too_new(current: str, latest: str) -> DatabaseTooNew:
    return DatabaseTooNew(
        f"the database is at revision {current}, newer than this release's latest ({latest}): "
        "run the newer engram, or restore a backup"
    )


def latest_revision() -> str:
    """The newest migration this release brings."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None  # the release's migrations are one line of revisions
    return head


def _files() -> set[str]:
    """The revisions of this release's migrations, read from their files' names (`newest_file`)."""
    return {p.name[:4] for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")}


def newest_file() -> str:
    """The newest migration this release brings, read from its files' names: each migration's
    revision is its file's number (0033_kind_index.py, revision "0033"; docs/architecture.md's
    recipe, and tests/test_migrate_refusals.py checks it against alembic's head), so that a database
    already at it is known to be without importing alembic."""
    return max(_files())


def _connect_timeout(url: str) -> dict[str, Any]:
    """A server that never answers (a firewall dropping packets) would hold the command for the
    system's TCP timeout: 10 s, unless the URL sets its own connect_timeout."""
    return {} if "connect_timeout" in conninfo_to_dict(url) else {"connect_timeout": 10}


def behind(url: str) -> tuple[str | None, str] | None:
    """Where the database stands against this release's newest migration, for a command that
    only reads and so migrates nothing: None at the newest, else the revision it is at (None: no
    migration yet, an empty database) and the newest. Changes nothing, and imports no alembic
    (the files' numbers, as `upgrade`'s first look). A revision this release does not know (a
    newer release migrated it) is refused as `upgrade` refuses it."""
    with psycopg.connect(url, autocommit=True, **_connect_timeout(url)) as conn:
        current = current_revision(conn)
    files = _files()
    newest = max(files)
    if current == newest:
        return None
    if current is not None and current not in files:
        raise _too_new(current, newest)
    return current, newest


def current_revision(lock: psycopg.Connection) -> str | None:
    """The migration the database is at (None: none yet, an empty database)."""
    if lock.execute("SELECT to_regclass('alembic_version')").fetchone() == (None,):
        return None
    row = lock.execute("SELECT version_num FROM alembic_version").fetchone()
    return None if row is None else row[0]


def _refuse_unknown_revisions(lock: psycopg.Connection, script: "ScriptDirectory") -> None:
    if lock.execute("SELECT to_regclass('alembic_version')").fetchone() == (None,):
        return
    known = {s.revision for s in script.walk_revisions()}
    for (current,) in lock.execute("SELECT version_num FROM alembic_version").fetchall():
        if current not in known:
            raise _too_new(current, ", ".join(script.get_heads()))


def upgrade(url: str, revision: str = "head", stop: threading.Event | None = None) -> str | None:
    """Migrates, one process at a time: several `engram serve` starting together against one
    database would otherwise run the same migration twice (a session advisory lock, held on
    a connection of its own while alembic works on another). Returns the revision the
    database is at. Logs a line before a migration runs and one when it is done (a migration
    of a large database may take minutes, during which a start says nothing else), and one
    when it waits for another process's; nothing when there is nothing to do. That wait ends
    when `stop` is set (MigrationStopped)."""
    with psycopg.connect(url, autocommit=True, **_connect_timeout(url)) as lock:
        # Tried again and again rather than waited for in the server: a thread blocked there
        # could not be stopped, and held its process's exit until the other migration ended.
        stop = stop or threading.Event()
        said = False
        while lock.execute(
            "SELECT pg_try_advisory_lock(hashtext('engram.migrate'))"
        ).fetchone() != (True,):
            if not said:
                log.info("another process is migrating the database: waiting for it to finish")
                said = True
            if stop.wait(_LOCK_RETRY_SECONDS):
                raise MigrationStopped("stopped while waiting for another process's migration")
        try:
            before = current_revision(lock)
            if revision == "head" and before == newest_file():
                return before  # nothing to do: no alembic to import
            from alembic import command
            from alembic.script import ScriptDirectory
            from sqlalchemy.exc import DBAPIError

            cfg = alembic_config(url)
            script = ScriptDirectory.from_config(cfg)  # the migrations' files, read once
            _refuse_unknown_revisions(lock, script)
            target = script.get_current_head() if revision == "head" else revision
            if before == target:
                return before
            log.info(
                "migrating %s to migration %s",
                f"the database from migration {before}" if before else "an empty database",
                target,
            )
            started = time.monotonic()
            try:
                command.upgrade(cfg, revision)
            except DBAPIError as e:
                raise _failed(lock, script, e) from e
            after = current_revision(lock)
            log.info("migrated the database to %s in %.1f s", after, time.monotonic() - started)
            return after
        finally:
            lock.execute("SELECT pg_advisory_unlock(hashtext('engram.migrate'))")


def _failed(lock: psycopg.Connection, script: "ScriptDirectory", error: "DBAPIError") -> Exception:
    """What a failed migration says, in one line: which migration, PostgreSQL's reason, where
    the database stays (each migration is its own transaction), and what to do."""
    # PostgreSQL's message without its DETAIL and HINT lines (which speak of its SQL).
    diag = getattr(error.orig, "diag", None)
    why = " ".join(str(getattr(diag, "message_primary", None) or error.orig).split())
    try:
        at = current_revision(lock)
    except psycopg.Error:
        return MigrationFailed(
            f"a migration failed ({why}), and the database cannot be asked which it is at: "
            "once it answers, run `engram migrate` again"
        )
    failed = next((s.revision for s in script.walk_revisions() if s.down_revision == at), "?")
    if getattr(diag, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE:
        remedy = (
            "the database's role needs to own it, and pgvector's `vector` extension to be "
            "created by a superuser beforehand (docs/operations.md, ENGRAM_DATABASE_URL); then "
            "run `engram migrate` again"
        )
    else:
        remedy = (
            "fix the cause and run `engram migrate` again (docs/operations.md, Upgrades, says "
            "what each migration needs)"
        )
    return MigrationFailed(
        f"migration {failed} failed ({why}); the database stays at "
        f"{f'migration {at}' if at else 'no migration'}: {remedy}"
    )


async def upgrade_in_thread(url: str) -> str | None:
    """`upgrade` in a thread, for the event loop: cancelled (SIGTERM while starting), its wait
    for another process's migration ends at once (a migration already running is not cut)."""
    stop = threading.Event()
    try:
        return await asyncio.to_thread(upgrade, url, stop=stop)
    finally:
        stop.set()
