"""Maps every error to an `extensions.code`, and masks what is not a domain error."""

import logging
from collections.abc import Iterator

import strawberry
from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.types import ExecutionContext

from app.db.errors import (
    RETRY_AFTER_SECONDS,
    is_conflict,
    is_lock_timeout,
    is_statement_timeout,
    is_unavailable,
)
from app.embeddings.errors import EmbedderUnavailable, EmbeddingFailed
from app.errors import DomainError

log = logging.getLogger(__name__)

CODES = (
    "ACCESS_DENIED",
    "NOT_FOUND",
    "BAD_REQUEST",
    "CONFLICT",
    "UNAUTHENTICATED",
    "UNAVAILABLE",
    "TOO_MANY_REQUESTS",
    "INTERNAL",
)
INTERNAL_MESSAGE = "Internal error."
UNAVAILABLE_MESSAGE = (
    "The database is unavailable (restarting, in recovery or out of connections); "
    f"retry in {RETRY_AFTER_SECONDS} seconds."
)
CONFLICT_MESSAGE = (
    "This request ran into another change made at the same moment, and the database rolled "
    "its transaction back; retry it."
)
# The pool's bounds (app/db/pool.py `bounds`): a lock wait past its bound met another change
# holding the rows, as a deadlock does (CONFLICT: retry); a statement past its bound met a
# database too busy to finish it in time (UNAVAILABLE, 503 with Retry-After).
LOCK_TIMEOUT_MESSAGE = (
    "This request waited longer than the service allows (ENGRAM_LOCK_TIMEOUT_SECONDS) for data "
    "another change was holding, and the database rolled its transaction back; retry it."
)
STATEMENT_TIMEOUT_MESSAGE = (
    "The database did not finish this request's work within the time the service allows "
    "(ENGRAM_STATEMENT_TIMEOUT_SECONDS), and rolled its transaction back; "
    f"retry in {RETRY_AFTER_SECONDS} seconds."
)
EMBEDDER_MESSAGE = (
    "The embedding model could not embed the text (its provider failed; the service's log says "
    f"why); retry in {RETRY_AFTER_SECONDS} seconds."
)

# A refusal no retry mends (EmbeddingFailed.transient): answered without Retry-After.
EMBEDDER_REFUSED_MESSAGE = (
    "The embedding model refused the text: the service's embedding provider is misconfigured "
    "(its log says why), and retrying will not help until an operator fixes it."
)


def database_refusal(error: BaseException | None) -> tuple[str, str] | None:
    """The code and the message for a failure of the database that is no fault of ours (it is
    unavailable, or rolled the work back: a conflict, a bound reached); None for others."""
    if is_unavailable(error):
        return "UNAVAILABLE", UNAVAILABLE_MESSAGE
    if is_conflict(error):
        return "CONFLICT", CONFLICT_MESSAGE
    if is_lock_timeout(error):
        return "CONFLICT", LOCK_TIMEOUT_MESSAGE
    if is_statement_timeout(error):
        return "UNAVAILABLE", STATEMENT_TIMEOUT_MESSAGE
    return None


def classify(error: GraphQLError) -> tuple[str, str]:
    """The code and the message a client sees for `error`."""
    original = error.original_error
    if isinstance(original, DomainError):
        return original.code, original.message
    if original is None or isinstance(original, GraphQLError):
        # Syntax, validation and variable coercion errors: the request itself is wrong.
        return "BAD_REQUEST", error.message
    if isinstance(original, ValueError) and error.path is None:
        # A scalar refused a variable or literal before anything ran.
        return "BAD_REQUEST", error.message
    refused = database_refusal(original)
    if refused is not None:
        return refused
    if isinstance(original, EmbeddingFailed) and not original.transient:
        return "UNAVAILABLE", EMBEDDER_REFUSED_MESSAGE
    if isinstance(original, EmbedderUnavailable | EmbeddingFailed):
        # The provider's own words name its endpoint: they go to the log only.
        return "UNAVAILABLE", EMBEDDER_MESSAGE
    return "INTERNAL", INTERNAL_MESSAGE


def coded(error: GraphQLError) -> GraphQLError:
    code, message = classify(error)
    return GraphQLError(
        message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=error.original_error if code not in ("INTERNAL", "UNAVAILABLE") else None,
        extensions={**(error.extensions or {}), "code": code},
    )


class Schema(strawberry.Schema):
    """Logs only internal errors, with their stack: a refused request is not a fault of ours."""

    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        for error in errors:
            code = classify(error)[0]
            if code == "UNAVAILABLE":
                log.warning("unavailable at %s: %r", error.path, error.original_error)
            elif code == "CONFLICT" and database_refusal(error.original_error) is not None:
                log.warning("rolled back at %s: %r", error.path, error.original_error)
            elif code == "INTERNAL":
                log.error(
                    "internal error at %s: %s",
                    error.path,
                    error.message,
                    exc_info=error.original_error,
                )


class ErrorCodes(SchemaExtension):
    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if result is not None and result.errors:
            result.errors = [coded(e) for e in result.errors]
            # Spec: a failed request returns data: null.
            result.data = None
