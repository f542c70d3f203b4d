"""The app factory: FastAPI with the GraphQL router, the pool and the embedded server."""

import asyncio
import html
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from cross_web import HTTPException
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from strawberry.fastapi import GraphQLRouter
from strawberry.types.unset import UNSET

from app.auth.service import authenticate, bootstrap_admin
from app.config import Settings
from app.db import migrate
from app.db.embedded import EmbeddedPostgres, embedded_uri
from app.db.errors import RETRY_AFTER_SECONDS, is_unavailable
from app.db.pool import create_pool
from app.embeddings.base import Embedder
from app.errors import DomainError
from app.graphql.context import Context
from app.graphql.errors import INTERNAL_MESSAGE, UNAVAILABLE_MESSAGE
from app.graphql.inputs import check_body
from app.graphql.schema import INTROSPECTION_OFF, build_schema
from app.mcp.endpoint import McpEndpoint
from app.services import start_services, stop_services
from app.state import AppState

log = logging.getLogger(__name__)


def _error(status: int, code: str, message: str) -> JSONResponse:
    body = {"data": None, "errors": [{"message": message, "extensions": {"code": code}}]}
    return JSONResponse(body, status_code=status)


def _unavailable(body: object = None) -> JSONResponse:
    body = body or {
        "data": None,
        "errors": [{"message": UNAVAILABLE_MESSAGE, "extensions": {"code": "UNAVAILABLE"}}],
    }
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _has_code(data: object, code: str) -> bool:
    errors = data.get("errors") if isinstance(data, dict) else None
    return any(e.get("extensions", {}).get("code") == code for e in errors or ())


async def _read_limited(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it grows past `limit` (chunked bodies have no length)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


class _Router(GraphQLRouter[Context, None]):
    """Answers requests strawberry refuses (no query, batches, ...) in the GraphQL error shape."""

    introspection = True

    async def render_graphql_ide(self, request: Request) -> HTMLResponse:
        if self.introspection:
            return HTMLResponse(self.graphql_ide_html)
        # GraphiQL loads the schema by introspection: say why it cannot, rather than spin.
        notice = (
            '<body>\n    <p role="alert" style="margin:0;padding:8px 12px;background:#fff3cd;'
            'font-family:sans-serif">Engram: ' + html.escape(INTROSPECTION_OFF) + ". Queries "
            "still run: add an <code>Authorization: Bearer</code> header.</p>"
        )
        return HTMLResponse(self.graphql_ide_html.replace("<body>", notice, 1))

    async def run(  # type: ignore[override]
        self, request: Request, context: Context = UNSET, root_value: None = UNSET
    ) -> Response:
        try:
            return await super().run(request, context, root_value)
        except HTTPException as e:
            return _error(e.status_code, "BAD_REQUEST", e.reason)

    def create_response(  # type: ignore[override]
        self, response_data: dict[str, object], sub_response: Response
    ) -> Response:
        # A request that could not reach the database: 503, and when to come back.
        if _has_code(response_data, "UNAVAILABLE"):
            return _unavailable(response_data)
        return super().create_response(response_data, sub_response)


async def start_state(
    settings: Settings, embedder: Embedder | None = None
) -> tuple[AppState, EmbeddedPostgres | None]:
    """Starts the database (embedded when no URL is set), migrates it, and opens the pool."""
    server: EmbeddedPostgres | None = None
    configured = settings.database_url_value()
    if configured is None:
        server, url = await asyncio.to_thread(embedded_uri, settings.data_dir)
    else:
        url = configured
    await asyncio.to_thread(migrate.upgrade, url)
    pool = await create_pool(url, min_size=settings.pool_min_size, max_size=settings.pool_max_size)
    state = AppState(settings=settings, pool=pool, embedder=embedder)
    await start_services(state)
    return state, server


def create_app(settings: Settings | None = None, embedder: Embedder | None = None) -> FastAPI:
    settings = settings or Settings()
    schema = build_schema(
        max_depth=settings.max_query_depth,
        max_tokens=settings.max_query_tokens,
        introspection=settings.introspection,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state, server = await start_state(settings, embedder)
        token = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
        created = await bootstrap_admin(state.pool, token)
        if created is not None:
            print(f"Engram admin token (shown once, keep it safe): {created}", flush=True)
        app.state.engram = state
        try:
            async with mcp.manager.run():
                yield
        finally:
            await stop_services(state)
            await state.pool.close()
            if server is not None:
                await asyncio.to_thread(server.stop)

    async def context_getter(request: Request) -> Context | None:
        # `guard` authenticates every POST; a GET only renders GraphiQL and executes nothing.
        return getattr(request.state, "context", None)

    app = FastAPI(
        title="Engram", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    # The agent's tools over MCP (streamable HTTP); it checks its own requests.
    mcp = McpEndpoint(settings.max_body_bytes)
    app.add_route("/mcp/{action_id}", mcp)

    @app.middleware("http")
    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path != "/graphql" or request.method != "POST":
            return await call_next(request)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return _error(
                413, "BAD_REQUEST", f"request bodies are limited to {settings.max_body_bytes} bytes"
            )
        body = await _read_limited(request, settings.max_body_bytes)
        if body is None:
            return _error(
                413, "BAD_REQUEST", f"request bodies are limited to {settings.max_body_bytes} bytes"
            )
        # Starlette replays a cached body to the app behind this middleware.
        request._body = body
        try:
            payload = json.loads(body)
        except ValueError:
            return _error(400, "BAD_REQUEST", "the request body is not valid JSON")
        except RecursionError:
            return _error(
                400,
                "BAD_REQUEST",
                f"the request body nests deeper than {settings.max_json_depth} levels",
            )
        if not isinstance(payload, dict) or not isinstance(payload.get("query"), str):
            return _error(
                400,
                "BAD_REQUEST",
                'send a JSON object such as {"query": "{ viewer { principal } }"}',
            )
        try:
            check_body(payload, settings.max_json_depth)
        except DomainError as e:
            return _error(400, e.code, e.message)
        state: AppState = request.app.state.engram
        try:
            caller = await authenticate(state.pool, request.headers.get("authorization"))
        except DomainError as e:
            return _error(401, e.code, e.message)
        except Exception as e:
            if is_unavailable(e):
                log.warning("database unavailable: %r", e)
                return _unavailable()
            raise
        request.state.context = Context(state, caller)
        return await call_next(request)

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        state: AppState | None = getattr(request.app.state, "engram", None)
        if state is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            async with state.pool.acquire() as conn:
                await conn.fetchval("SELECT 1")
        except Exception:  # the database did not answer
            return JSONResponse({"status": "database unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def unexpected(request: Request, error: Exception) -> Response:
        # Whatever escaped the GraphQL layer still answers in its shape, never as plain text.
        if is_unavailable(error):
            log.warning("database unavailable: %r", error)
            return _unavailable()
        log.error("unhandled error on %s", request.url.path, exc_info=error)
        return _error(500, "INTERNAL", INTERNAL_MESSAGE)

    app.add_exception_handler(Exception, unexpected)
    router = _Router(schema, context_getter=context_getter, allow_queries_via_get=False)
    router.introspection = settings.introspection
    app.include_router(router, prefix="/graphql")
    return app
