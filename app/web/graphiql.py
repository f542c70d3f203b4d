"""GraphiQL on `GET /graphql`, with its assets served by Engram (app/web/static), offline."""

import html
from functools import cache
from pathlib import Path

from fastapi.staticfiles import StaticFiles

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
STATIC_PATH = "/static"


@cache
def _template() -> str:
    return (HERE / "graphiql.html").read_text()


def page(introspection: bool, introspection_off: str) -> str:
    """The page; without introspection it says why GraphiQL has no schema, and loads none."""
    text = _template()
    if introspection:
        return text
    notice = (
        '<p id="engram-notice" role="alert">Engram: '
        + html.escape(introspection_off)
        + ". Queries still run with the token above.</p>"
    )
    text = text.replace("<!--NOTICE-->", notice, 1)
    return text.replace("/*INTROSPECTION*/true", "/*INTROSPECTION*/false", 1)


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC)
