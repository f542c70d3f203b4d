"""Runs the alembic migrations (raw SQL) against a database URL."""

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from psycopg.conninfo import conninfo_to_dict

from app.errors import Conflict

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def sqlalchemy_url(url: str) -> str:
    """libpq URL -> SQLAlchemy URL for psycopg 3 (unix sockets kept); migrations run sync."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


class DatabaseTooNew(Conflict):
    """The database was migrated by a newer release: this one knows none of its revisions."""


def _refuse_unknown_revisions(lock: psycopg.Connection, cfg: Config) -> None:
    if lock.execute("SELECT to_regclass('alembic_version')").fetchone() == (None,):
        return
    script = ScriptDirectory.from_config(cfg)
    known = {s.revision for s in script.walk_revisions()}
    for (current,) in lock.execute("SELECT version_num FROM alembic_version").fetchall():
        if current not in known:
            raise DatabaseTooNew(
                f"the database is at revision {current}, newer than this release's latest "
                f"({', '.join(script.get_heads())}): run the newer engram, or restore a backup"
            )


def upgrade(url: str, revision: str = "head") -> None:
    """Migrates, one process at a time: several `engram serve` starting together against one
    database would otherwise run the same migration twice (a session advisory lock, held on
    a connection of its own while alembic works on another)."""
    # A server that never answers (a firewall dropping packets) would hold the start for the
    # system's TCP timeout: 10 s, unless the URL sets its own connect_timeout.
    timeout = {} if "connect_timeout" in conninfo_to_dict(url) else {"connect_timeout": 10}
    with psycopg.connect(url, autocommit=True, **timeout) as lock:
        lock.execute("SELECT pg_advisory_lock(hashtext('engram.migrate'))")
        try:
            cfg = alembic_config(url)
            _refuse_unknown_revisions(lock, cfg)
            command.upgrade(cfg, revision)
        finally:
            lock.execute("SELECT pg_advisory_unlock(hashtext('engram.migrate'))")
