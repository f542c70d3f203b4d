"""The admin console at /console: static HTML, CSS and ES modules shipped in the package.

It talks to the public GraphQL API only (`/graphql`, with the token the person signs in with),
so it can do nothing a client holding the same token could not.
"""

import stat
from pathlib import Path

import anyio
from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC = Path(__file__).parent / "static"

# Everything the page loads comes from this server; nothing may frame it (frame-ancestors, and
# X-Frame-Options for browsers that predate it, as GraphiQL's page).
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class _ConsoleFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        if scope["path"].endswith("/") and await self._is_file(path):
            # A file named as a folder (/console/index.html/): StaticFiles drops the slash and
            # serves it, and the page then asks for its scripts and styles under that "folder".
            raise HTTPException(status_code=404)
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response

    async def _is_file(self, path: str) -> bool:
        try:
            _, found = await anyio.to_thread.run_sync(self.lookup_path, path)
        except (OSError, ValueError):
            return False  # a name no file has (too long, a NUL): StaticFiles refuses it itself
        return found is not None and stat.S_ISREG(found.st_mode)


def mount_console(app: FastAPI) -> None:
    @app.get("/console", include_in_schema=False)
    async def console_root() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=308)

    app.mount("/console", _ConsoleFiles(directory=STATIC, html=True), name="console")
