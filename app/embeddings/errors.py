"""Why an embedding provider could not start or could not embed."""

from app.http_retry import CallFailed


class EmbedderUnavailable(RuntimeError):
    """The configured provider cannot start here (missing extra, unreachable endpoint)."""


class EmbeddingFailed(CallFailed):
    """A provider could not embed texts, after any retries it makes. `logged`, what the log
    says of it, leaves out the provider's own words: they may quote the texts sent (a record's,
    a search's query).

    `transient`: whether a later attempt may succeed (the provider unreachable, overloaded or
    failing on its side). A refusal of the request itself (an unknown model, a bad key, a
    dimension or a shape the service cannot use) is not: it fails until an operator fixes the
    configuration, so no one is told to retry.
    """

    def __init__(self, message: str, logged: str | None = None, *, transient: bool = True) -> None:
        super().__init__(message, logged)
        self.transient = transient
