"""Maps every error to an `extensions.code`, and masks what is not a domain error."""

import logging
import re
from collections.abc import Iterator

import strawberry
from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.types import ExecutionContext
from strawberry.types.graphql import OperationType

from app.db.errors import RETRY_AFTER_SECONDS, database_refusal, described
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
EMBEDDER_MESSAGE = (
    "The embedding model could not embed the text (its provider failed; the service's log says "
    f"why); retry in {RETRY_AFTER_SECONDS} seconds."
)

# A refusal no retry mends (EmbeddingFailed.transient): answered without Retry-After.
EMBEDDER_REFUSED_MESSAGE = (
    "The embedding model refused the text: the service's embedding provider is misconfigured "
    "(its log says why), and retrying will not help until an operator fixes it."
)


# graphql-core's refusal of a document past ENGRAM_MAX_QUERY_TOKENS (strawberry's
# MaxTokensLimiter), which names neither the setting nor what to do.
_TOO_MANY_TOKENS = re.compile(
    r"Syntax Error: Document contains more than (\d+) tokens\. Parsing aborted\."
)


def _too_many_tokens(limit: int) -> str:
    return (
        f"the request's query holds more than {limit:,} tokens (names, punctuation and values); "
        f"a query may hold at most {limit:,} (ENGRAM_MAX_QUERY_TOKENS): nothing ran; pass long "
        "values and lists as variables, which do not count, or split the request"
    )


# graphql-core's refusal of a variable declared with another type than its place takes (a
# turn's `input` declared `String!` where the schema's `Value` goes), which says what is wrong
# but not the declaration that is right.
_VARIABLE_TYPE = re.compile(
    r"Variable '\$(\w+)' of type '[^']+' used in position expecting type '([^']+)'\."
)


def _variable_type(message: str) -> str:
    if found := _VARIABLE_TYPE.fullmatch(message):
        return f"{message[:-1]}: declare it as `${found[1]}: {found[2]}`"
    return message


def classify(error: GraphQLError) -> tuple[str, str]:
    """The code and the message a client sees for `error`."""
    original = error.original_error
    if isinstance(original, DomainError):
        return original.code, original.message
    if isinstance(original, GraphQLError) and error.path is not None and not original.nodes:
        # A value the service answered that its field's type cannot carry (NaN for a Float, an
        # Int past 32 bits, a list that is none): graphql-core raises it bare, naming no node
        # of the request, as it completes the answer. A fault of ours, not the request's.
        return "INTERNAL", INTERNAL_MESSAGE
    if original is None or isinstance(original, GraphQLError):
        # Syntax, validation and variable coercion errors: the request itself is wrong.
        if too_many := _TOO_MANY_TOKENS.fullmatch(error.message):
            return "BAD_REQUEST", _too_many_tokens(int(too_many[1]))
        return "BAD_REQUEST", _variable_type(error.message)
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


# Said of an error in a mutation's answer below the mutation itself (a list's `after` or filter
# its list refuses as it completes): the change is made, and its answer is lost with data: null.
MADE = (
    " (the mutation ran and its change was made before this part of its answer failed: read it "
    "back rather than sending the mutation again)"
)


def coded(error: GraphQLError, mutation: bool = False) -> GraphQLError:
    """`error` with its code and the message a client sees; `mutation`: the request's operation
    is one (an error below its root field says that the change was made)."""
    code, message = classify(error)
    if mutation and error.path is not None and len(error.path) > 1:
        message += MADE
    return GraphQLError(
        message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=error.original_error if code not in ("INTERNAL", "UNAVAILABLE") else None,
        extensions={**(error.extensions or {}), "code": code},
    )


def _logged(error: Exception | None) -> str:
    """What the log says of an UNAVAILABLE request's error: of the embedding provider's, its
    address and HTTP status without its words, which may quote the texts sent (a query, a
    record's); of the database's, its kind without its words, which may quote a row's."""
    if isinstance(error, EmbeddingFailed):
        return f"the embedding model failed: {error.logged}"
    if database_refusal(error) is not None:
        return described(error)
    return repr(error)


class Schema(strawberry.Schema):
    """Logs only internal errors, with their stack: a refused request is not a fault of ours."""

    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        for error in errors:
            code = classify(error)[0]
            if code == "UNAVAILABLE":
                log.warning("unavailable at %s: %s", error.path, _logged(error.original_error))
            elif code == "CONFLICT" and database_refusal(error.original_error) is not None:
                log.warning("rolled back at %s: %s", error.path, described(error.original_error))
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
            mutation = _is_mutation(self.execution_context)
            result.errors = [coded(e, mutation) for e in result.errors]
            # Spec: a failed request returns data: null.
            result.data = None


def _is_mutation(context: ExecutionContext) -> bool:
    try:
        return context.operation_type is OperationType.MUTATION
    except RuntimeError:  # no document, or no such operation: nothing ran
        return False
