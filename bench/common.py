"""Shared by the benchmarks: their own embedded PostgreSQL, tuned for the run."""

import asyncio
from collections.abc import Mapping
from pathlib import Path

import asyncpg

from app.db.embedded import EmbeddedPostgres


def tuned_server(data_dir: Path, settings: Mapping[str, str]) -> EmbeddedPostgres:
    """A benchmark's own server, tuned with ALTER SYSTEM (and restarted when that changed)."""
    pg = EmbeddedPostgres(data_dir / "pgdata")

    async def tune() -> bool:
        conn = await asyncpg.connect(pg.uri())
        try:
            changed = False
            for name, value in settings.items():
                current = await conn.fetchval(
                    "SELECT setting FROM pg_file_settings WHERE name = $1 AND applied IS NOT NULL "
                    "ORDER BY seqno DESC LIMIT 1",
                    name,
                )
                if current != value:
                    # ALTER SYSTEM takes no parameters; names and values are the callers' constants.
                    await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                    changed = True
            return changed
        finally:
            await conn.close()

    if asyncio.run(tune()):
        pg.stop()
        pg = EmbeddedPostgres(data_dir / "pgdata")
    return pg
