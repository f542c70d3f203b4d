"""Runs the alembic migrations (raw SQL) against a database URL."""

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config

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


def upgrade(url: str, revision: str = "head") -> None:
    """Migrates, one process at a time: several `engram serve` starting together against one
    database would otherwise run the same migration twice (a session advisory lock, held on
    a connection of its own while alembic works on another)."""
    with psycopg.connect(url, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(hashtext('engram.migrate'))")
        try:
            command.upgrade(alembic_config(url), revision)
        finally:
            lock.execute("SELECT pg_advisory_unlock(hashtext('engram.migrate'))")
