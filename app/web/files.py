"""Files served as they are (GraphiQL's assets, the console): Starlette's StaticFiles, which
serves a file named as a folder (/static/README.md/) as the file, and reads a path's dot
segments (/console/index.html/., /console/app.js/x/..) as folders do; here those are 404, as
any name that is no folder (a browser resolves dot segments before it asks)."""

import stat

import anyio
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope


class Files(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        if {".", ".."} & set(scope["path"].split("/")):
            raise HTTPException(status_code=404)
        if scope["path"].endswith("/") and await self._is_file(path):
            # A page served so asks for its scripts and styles under that "folder".
            raise HTTPException(status_code=404)
        return await super().get_response(path, scope)

    async def _is_file(self, path: str) -> bool:
        try:
            _, found = await anyio.to_thread.run_sync(self.lookup_path, path)
        except (OSError, ValueError):
            return False  # a name no file has (too long, a NUL): StaticFiles refuses it itself
        return found is not None and stat.S_ISREG(found.st_mode)
