"""Alembic environment: raw SQL migrations over psycopg (multi-statement SQL needs no prepare)."""

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool

config = context.config


def _url() -> str:
    url = config.attributes.get("database_url")
    if url:
        return str(url)
    from app.config import Settings

    raw = Settings().database_url_value()
    if raw is None:
        raise RuntimeError(
            "set ENGRAM_DATABASE_URL, or run `engram migrate` for the embedded server"
        )
    return raw


if context.is_offline_mode():
    context.configure(dialect_name="postgresql", literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    url = _url()
    # libpq reads the URL (a socket directory as its host, several hosts, any parameter), as it
    # does for every other connection of the service; SQLAlchemy only drives the connection.
    engine = create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(url), poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=None, transaction_per_migration=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
