"""GraphiQL on `GET /graphql`, with its assets served by Engram (app/web/static), offline."""

import base64
import hashlib
import html
import re
from functools import cache
from pathlib import Path

from app.web.files import Files

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


_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


@cache  # one of the page's two forms: hashed once
def headers(text: str) -> dict[str, str]:
    """The page's security headers: it runs only its own scripts (its inline one by hash),
    talks only to this server, and no other site may frame it (a token is pasted into it).
    Styles may be inline: GraphiQL's editor sets them on its elements."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.encode()).digest()).decode() + "'"
        for m in _INLINE_SCRIPT.findall(text)
    )
    return {
        "Content-Security-Policy": (
            f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; "
            "form-action 'none'; frame-ancestors 'none'"
        ),
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


def static_files() -> Files:
    return Files(directory=STATIC)
