"""Maps every error to an `extensions.code`, and masks what is not a domain error."""

import logging
from collections.abc import Iterator

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

from app.errors import DomainError

log = logging.getLogger(__name__)

CODES = ("ACCESS_DENIED", "NOT_FOUND", "BAD_REQUEST", "CONFLICT", "UNAUTHENTICATED", "INTERNAL")


def coded(error: GraphQLError) -> GraphQLError:
    original = error.original_error
    if isinstance(original, DomainError):
        code, message = original.code, original.message
    elif original is None or isinstance(original, GraphQLError):
        # Syntax, validation and variable coercion errors: the request itself is wrong.
        code, message = "BAD_REQUEST", error.message
    elif isinstance(original, ValueError) and error.path is None:
        code, message = "BAD_REQUEST", error.message
    else:
        log.error("internal error", exc_info=original)
        code, message = "INTERNAL", "Internal error."
    return GraphQLError(
        message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=original if code != "INTERNAL" else None,
        extensions={**(error.extensions or {}), "code": code},
    )


class ErrorCodes(SchemaExtension):
    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if result is not None and result.errors:
            result.errors = [coded(e) for e in result.errors]
            # Spec: a failed request returns data: null.
            result.data = None
