"""Alembic environment: raw SQL migrations over psycopg (multi-statement SQL needs no prepare)."""

from alembic import context
from sqlalchemy import engine_from_config, pool

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from app.config import Settings
    from app.db.migrate import sqlalchemy_url

    raw = Settings().database_url_value()
    if raw is None:
        raise RuntimeError(
            "set ENGRAM_DATABASE_URL, or run `engram migrate` for the embedded server"
        )
    return sqlalchemy_url(raw)


if context.is_offline_mode():
    context.configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = engine_from_config(
        {"sqlalchemy.url": _url()}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=None, transaction_per_migration=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
