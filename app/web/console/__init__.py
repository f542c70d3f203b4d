"""The admin console at /console: static HTML, CSS and ES modules shipped in the package.

It talks to the public GraphQL API only (`/graphql`, with the token the person signs in with),
so it can do nothing a client holding the same token could not.
"""

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.responses import Response
from starlette.types import Scope

from app.web.files import Files

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


class _ConsoleFiles(Files):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def mount_console(app: FastAPI) -> None:
    @app.get("/console", include_in_schema=False)
    async def console_root() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=308)

    app.mount("/console", _ConsoleFiles(directory=STATIC, html=True), name="console")
