"""Why an embedding provider could not start or could not embed."""


class EmbedderUnavailable(RuntimeError):
    """The configured provider cannot start here (missing extra, unreachable endpoint)."""


class EmbeddingFailed(RuntimeError):
    """A provider could not embed texts, after any retries it makes.

    `transient`: whether a later attempt may succeed (the provider unreachable, overloaded or
    failing on its side). A refusal of the request itself (an unknown model, a bad key, a
    dimension or a shape the service cannot use) is not: it fails until an operator fixes the
    configuration, so no one is told to retry.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient
