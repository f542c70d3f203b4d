"""Why an embedding provider could not start or could not embed."""


class EmbedderUnavailable(RuntimeError):
    """The configured provider cannot start here (missing extra, unreachable endpoint)."""


class EmbeddingFailed(RuntimeError):
    """A provider could not embed texts, after any retries it makes."""
