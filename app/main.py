"""The app factory: FastAPI with the GraphQL view, the pool and the embedded server."""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from cross_web import HTTPException
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from strawberry.asgi import GraphQL
from strawberry.http import GraphQLHTTPResponse
from strawberry.types.unset import UNSET

from app import tasks
from app.auth import resources
from app.auth.service import authenticate_sent, bootstrap_admin
from app.config import Settings
from app.db import migrate
from app.db.embedded import EmbeddedPostgres, embedded_uri, supervise
from app.db.errors import (
    REFUSAL_STATUS,
    RETRY_AFTER_SECONDS,
    UNAVAILABLE_MESSAGE,
    database_refusal,
    described,
)
from app.db.health import Health
from app.db.pool import bounds, create_pool
from app.embeddings.base import Embedder
from app.errors import DomainError, TooManyRequests
from app.fairness import RETRY_AFTER_SECONDS as BUSY_RETRY_AFTER_SECONDS
from app.fairness import Fairness
from app.graphql.context import Context
from app.graphql.errors import EMBEDDER_REFUSED_MESSAGE, INTERNAL_MESSAGE
from app.graphql.inputs import check_body
from app.graphql.schema import INTROSPECTION_OFF, build_schema
from app.http_body import CLOSE, read_limited, replaying, too_big, too_slow
from app.mcp.endpoint import McpEndpoint, no_agent_named
from app.memory.maintenance import SEARCH_MAINTENANCE
from app.observability import tracing
from app.observability.embedding import MeteredEmbedder
from app.observability.metrics import CONTENT_TYPE_LATEST, Metrics
from app.observability.requests import Observe
from app.services import start_services, stop_services
from app.shapes import json_text
from app.state import AppState
from app.web import graphiql
from app.web.console import mount_console

log = logging.getLogger(__name__)


def _error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = {"data": None, "errors": [{"message": message, "extensions": {"code": code}}]}
    return JSONResponse(body, status_code=status, headers=headers)


def _unavailable(body: object = None) -> JSONResponse:
    body = body or {
        "data": None,
        "errors": [{"message": UNAVAILABLE_MESSAGE, "extensions": {"code": "UNAVAILABLE"}}],
    }
    errors = body.get("errors") if isinstance(body, dict) else None
    unavailable = [e for e in errors or () if e.get("extensions", {}).get("code") == "UNAVAILABLE"]
    if all(e.get("message") == EMBEDDER_REFUSED_MESSAGE for e in unavailable):
        return JSONResponse(body, status_code=503)  # no retry mends it: no Retry-After
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _refused(error: Exception) -> JSONResponse | None:
    """The answer to a request the database refused outside GraphQL's execution (unavailable,
    its transaction rolled back, its account deleted meanwhile: app/db/errors.py
    `database_refusal`); None for others."""
    refused = database_refusal(error)
    if refused is None:
        return None
    log.warning("database refused the request: %s", described(error))
    code, message = refused
    if code == "UNAVAILABLE":
        return _unavailable(
            {"data": None, "errors": [{"message": message, "extensions": {"code": code}}]}
        )
    return _error(REFUSAL_STATUS[code], code, message)


def _too_many(body: object) -> JSONResponse:
    """An account's bound reached (app/fairness.py): 429, and when to come back."""
    headers = {"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)}
    return JSONResponse(body, status_code=429, headers=headers)


def _once_started(
    handler: Callable[[Request, AppState], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route that answers 503 until the lifespan has started the service's state."""

    async def route(request: Request) -> Response:
        state: AppState | None = getattr(request.app.state, "engram", None)
        if state is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        return await handler(request, state)

    return route


# What a 405 on /graphql says to send instead.
_GRAPHQL_METHODS = (
    '/graphql takes POST (a GraphQL request as application/json, {"query": ..., "variables":'
    " {...}}) and GET (GraphiQL, in a browser)"
)


# Where a person who opened the service's root (or mistyped an address) goes instead.
NOT_SERVED = (
    "nothing is served at this address: GraphQL is at /graphql (GraphiQL in a browser), the "
    "admin console at /console, health at /healthz, and each agent's MCP server at "
    "/mcp/<actionId>"
)


async def _not_served(request: Request, error: Exception) -> Response:
    """Starlette's refusals (an address nothing serves, a method an address does not take) in
    the error shape of the service's other refusals, not FastAPI's `{"detail": ...}`."""
    assert isinstance(error, StarletteHTTPException)  # the only class it is registered for
    if error.status_code == 404 and (request.url.path + "/").startswith("/mcp/"):
        return no_agent_named()
    if error.status_code == 404:
        return _error(404, "NOT_FOUND", NOT_SERVED)
    if error.status_code == 405:
        allow = (error.headers or {}).get("Allow", "")
        words = (
            _GRAPHQL_METHODS
            if request.url.path == "/graphql"
            else f"this address takes {allow} only"
        )
        return _error(405, "BAD_REQUEST", words, {"Allow": allow})
    code = "BAD_REQUEST" if error.status_code < 500 else "INTERNAL"
    return _error(error.status_code, code, error.detail, error.headers)


def _has_code(data: object, code: str) -> bool:
    errors = data.get("errors") if isinstance(data, dict) else None
    return any(e.get("extensions", {}).get("code") == code for e in errors or ())


class _Guard:
    """Checks every GraphQL POST before strawberry runs it: the body's size, JSON and depth,
    and the caller's token; the Context it makes is what strawberry's context_getter returns.
    A GET only renders GraphiQL and executes nothing. (Plain ASGI: Starlette's
    BaseHTTPMiddleware ran the app in a task of its own per request, a tenth of its CPU.)"""

    def __init__(self, app: ASGIApp, settings: Settings, fairness: Fairness) -> None:
        self.app = app
        self.settings = settings
        self.fairness = fairness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/graphql" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        refused, body = await self._check(scope, receive)
        if refused is not None:
            await refused(scope, receive, send)
            return
        context: Context = scope["state"]["context"]
        try:
            # Once authenticated: a stranger's requests never take an account's places.
            admission = await self.fairness.admit(context.caller.account_id)
        except TooManyRequests as e:
            error = {"message": e.message, "extensions": {"code": e.code}}
            await _too_many({"data": None, "errors": [error]})(scope, receive, send)
            return
        with admission.running():
            await self.app(scope, replaying(body, receive), send)

    async def _check(self, scope: Scope, receive: Receive) -> tuple[Response | None, bytes]:
        settings = self.settings
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return _error(413, "BAD_REQUEST", too_big(settings.max_body_bytes)), b""
        try:
            body = await read_limited(
                receive, settings.max_body_bytes, settings.body_timeout_seconds
            )
        except TimeoutError:
            slow = too_slow(settings.body_timeout_seconds)
            return _error(408, "BAD_REQUEST", slow, CLOSE), b""
        if body is None:
            return _error(413, "BAD_REQUEST", too_big(settings.max_body_bytes)), b""
        try:
            payload = json.loads(body)
        except ValueError:
            return _error(400, "BAD_REQUEST", "the request body is not valid JSON"), body
        except RecursionError:
            return _error(
                400,
                "BAD_REQUEST",
                f"the request body nests deeper than {settings.max_json_depth} levels",
            ), body
        if isinstance(payload, list):
            return _error(
                400,
                "BAD_REQUEST",
                "a batch (a JSON array of requests) is not taken: send each request alone, as a "
                'JSON object such as {"query": "{ viewer { principal } }"}',
            ), body
        if not isinstance(payload, dict) or not isinstance(payload.get("query"), str):
            return _error(
                400,
                "BAD_REQUEST",
                'send a JSON object such as {"query": "{ viewer { principal } }"}',
            ), body
        for name, kind, what in (
            ("operationName", str, "a string"),
            ("variables", dict, "an object"),
            ("extensions", dict, "an object"),
        ):
            value = payload.get(name)
            if value is not None and not isinstance(value, kind):
                said = f"{name} must be {what} or null{json_text(value) if kind is dict else ''}"
                return _error(400, "BAD_REQUEST", said), body
        try:
            check_body(payload, settings.max_json_depth)
        except DomainError as e:
            return _error(400, e.code, e.message), body
        state: AppState = scope["app"].state.engram
        try:
            caller = await authenticate_sent(
                state.pool, headers.getlist("authorization"), recent=True
            )
        except DomainError as e:
            return _error(401, e.code, e.message), body
        except Exception as e:
            if (refused := _refused(e)) is not None:
                return refused, body
            raise
        scope.setdefault("state", {})["context"] = Context(state, caller)
        return None, body


# Strawberry's refusals that do not say what to send instead.
_REASONS = {
    "Unsupported content type": (
        'Unsupported content type: POST the request as application/json, {"query": ...,'
        ' "variables": {...}}'
    ),
    **{
        f"{kind} are not allowed when using GET": (
            f"{kind} are not run over GET, which serves GraphiQL: POST the request as"
            ' application/json, {"query": ..., "variables": {...}}'
        )
        for kind in ("queries", "mutations")
    },
}


class _GraphQL(GraphQL[Context, None]):
    """Strawberry's ASGI view at /graphql (its FastAPI router resolved FastAPI dependencies
    for every request, a tenth of a small query's CPU). It answers requests strawberry refuses
    (no query, batches, ...) in the GraphQL error shape."""

    introspection = True

    async def get_context(self, request: Request, response: Response) -> Context:  # type: ignore[override]
        # `_Guard` authenticated the POST; a GET only renders GraphiQL and executes nothing.
        context = getattr(request.state, "context", None)
        return context if context is not None else {"request": request, "response": response}  # type: ignore[return-value]

    async def render_graphql_ide(self, request: Request) -> HTMLResponse:
        # Served with its assets from /static, so it works offline; a token field in its header.
        text = graphiql.page(self.introspection, INTROSPECTION_OFF)
        return HTMLResponse(text, headers=graphiql.headers(text))

    async def run(  # type: ignore[override]
        self, request: Request, context: Context = UNSET, root_value: None = UNSET
    ) -> Response:
        if request.method == "HEAD":
            # As GET, which strawberry alone takes (the ASGI server sends no body for HEAD):
            # the route's Allow names HEAD with GET, as Starlette lists it.
            request = Request({**request.scope, "method": "GET"}, request.receive)
        try:
            return await super().run(request, context, root_value)
        except HTTPException as e:
            return _error(e.status_code, "BAD_REQUEST", _REASONS.get(e.reason, e.reason))

    def create_response(
        self, response_data: GraphQLHTTPResponse | list[GraphQLHTTPResponse], sub_response: Response
    ) -> Response:
        # A request that could not reach the database: 503, and when to come back.
        if _has_code(response_data, "UNAVAILABLE"):
            return _unavailable(response_data)
        if _has_code(response_data, TooManyRequests.code):  # a turn beyond its account's bound
            return _too_many(response_data)
        return super().create_response(response_data, sub_response)


@dataclass
class Started:
    """What `start_state` started: the state (its services and pool), /healthz's own
    connection, and the embedded server with its supervisor when it started one. `stop()` stops
    them once, whoever calls it first: the lifespan's end, or `engram serve` when the lifespan
    never ran or never ended."""

    state: AppState
    health: Health
    server: EmbeddedPostgres | None = None
    supervisor: asyncio.Task[None] | None = None
    stopped: bool = False

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await tasks.stop(self.supervisor)
        await stop_services(self.state)
        await self.health.close()
        await self.state.pool.close()
        if self.server is not None:
            # The server stops unless another process still uses it (app/db/embedded.py).
            await asyncio.to_thread(self.server.stop)


def request_bounds(settings: Settings) -> dict[str, str]:
    """The bounds on the service's database work (its pool's), from the settings."""
    return bounds(
        settings.statement_timeout_seconds,
        settings.lock_timeout_seconds,
        settings.idle_in_transaction_seconds,
    )


async def start_state(settings: Settings, embedder: Embedder | None = None) -> Started:
    """Starts the database (embedded when no URL is set, then supervised: restarted if it
    dies), migrates it, and opens the pool."""
    server: EmbeddedPostgres | None = None
    configured = settings.database_url_value()
    if configured is None:
        server, url = await asyncio.to_thread(embedded_uri, settings.data_dir)
    else:
        url = configured
    try:
        await migrate.upgrade_in_thread(url)
        pool = await create_pool(
            url,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            limits=request_bounds(settings),
        )
    except BaseException:
        if server is not None:
            await asyncio.to_thread(server.stop)
        raise
    state = AppState(settings=settings, pool=pool, embedder=embedder)
    started = Started(state, Health(url), server)
    try:
        await start_services(started.state)
        # Here, not in the lifespan: a database that cannot answer (one without all of its
        # tables) ends `engram serve` with one line, not a lifespan traceback. The admin token
        # it created (ENGRAM_BOOTSTRAP_TOKEN unset, the admin made now) is shown at once, as
        # it is committed: a start that fails or is stopped later has shown it all the same.
        created = await bootstrap_admin(pool, settings.bootstrap_token_value())
        if created is not None:
            print(f"Engram admin token (shown once, keep it safe): {created}", flush=True)
    except BaseException:
        # E.g. the embedder does not match the database: leave nothing running.
        await started.stop()
        raise
    if server is not None:
        started.supervisor = asyncio.create_task(supervise(server), name="engram embedded db")
    return started


def create_app(
    settings: Settings | None = None,
    embedder: Embedder | None = None,
    started: Started | None = None,
) -> FastAPI:
    """`started`: what `start_state` returned, when the caller started it (`engram serve`
    does, so that a refusal to start is one line rather than a lifespan traceback)."""
    settings = settings or Settings()
    schema = build_schema(
        max_depth=settings.max_query_depth,
        max_tokens=settings.max_query_tokens,
        max_nodes=settings.max_query_nodes,
        max_searches=settings.max_query_searches,
        max_answer_bytes=settings.max_answer_bytes,
        introspection=settings.introspection,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        running = started or await start_state(settings, embedder)
        try:
            state = running.state
            state.embedder = MeteredEmbedder(state.embedder, metrics)
            app.state.health = running.health
            app.state.engram = state
            async with mcp.manager.run():
                yield
        finally:
            # Also when starting failed here: nothing started is left running.
            await running.stop()
            if tracer is not None:
                tracer.shutdown()  # sends the spans still batched
            log.info("Engram stopped")

    app = FastAPI(
        title="Engram", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    # Per app, not the process-wide default registry: one process may build several apps.
    metrics = Metrics()
    tracer = tracing.tracer_provider(settings.otel_endpoint) if settings.otel_endpoint else None
    # Per process: each process bounds its own share of an account's work.
    fairness = Fairness(settings)
    # The agent's tools over MCP (streamable HTTP); it checks its own requests.
    mcp = McpEndpoint(settings.max_body_bytes, settings.body_timeout_seconds, fairness)
    # An ASGI app as a route's endpoint (Starlette calls an object that is not a function as
    # one), which add_route's type, a request handler, does not admit.
    app.add_route("/mcp/{action_id}", mcp)  # type: ignore[arg-type]

    @app.get("/healthz")
    @_once_started
    async def healthz(request: Request, state: AppState) -> Response:
        # On a connection of its own, not the pool's: a pool full of work is a busy process,
        # not a dead one, and a load balancer's probe is answered within its timeout.
        health: Health = request.app.state.health
        if not await health.answers():
            return JSONResponse({"status": "database unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def unexpected(request: Request, error: Exception) -> Response:
        # Whatever escaped the GraphQL layer still answers in its shape, never as plain text.
        if (refused := _refused(error)) is not None:
            return refused
        log.error("unhandled error on %s", request.url.path, exc_info=error)
        return _error(500, "INTERNAL", INTERNAL_MESSAGE)

    app.add_exception_handler(Exception, unexpected)

    app.add_exception_handler(StarletteHTTPException, _not_served)

    @app.get("/metrics")
    @_once_started
    async def metrics_text(request: Request, state: AppState) -> Response:
        try:
            caller = await authenticate_sent(state.pool, request.headers.getlist("authorization"))
        except DomainError as e:
            return _error(401, e.code, e.message)
        try:
            caller.require(("SELECT", resources.DEPLOYMENT_METRICS))
        except DomainError as e:
            return _error(403, e.code, e.message)
        if not caller.in_default_account:
            # The counts cover every account: only the operator's own tenant reads them.
            return _error(
                403,
                "ACCESS_DENIED",
                f"{resources.DEPLOYMENT_METRICS} is served to clients of the default account only",
            )
        pool, idle = state.pool, state.pool.get_idle_size()
        metrics.pool(pool.get_size() - idle, idle, pool.get_max_size())
        rounds = state.services[SEARCH_MAINTENANCE].rounds
        metrics.search_upkeep(rounds.counts, rounds.last_done)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    view = _GraphQL(schema, allow_queries_via_get=False)
    view.introspection = settings.introspection
    # HTTP only: the schema has no subscriptions, and a WebSocket would bypass the request's
    # authentication (the context is built from an HTTP request).
    app.add_route("/graphql", view, methods=["GET", "POST"])  # type: ignore[arg-type]  # as /mcp's
    mount_console(app)
    app.mount(graphiql.STATIC_PATH, graphiql.static_files(), name="static")
    app.add_middleware(_Guard, settings=settings, fairness=fairness)
    # Outermost: every request, refused ones included, gets its ID, log line and metrics; what
    # escapes is answered there too, so that its answer has them.
    app.add_middleware(Observe, metrics=metrics, on_error=unexpected)
    if tracer is not None:
        app.add_middleware(tracing.middleware(), tracer_provider=tracer)
    return app
