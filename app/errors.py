"""Domain errors raised by the layers; the GraphQL edge maps each to `extensions.code`."""


class DomainError(Exception):
    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadInput(DomainError):
    code = "BAD_REQUEST"


class NotFound(DomainError):
    code = "NOT_FOUND"


class AccessDenied(DomainError):
    code = "ACCESS_DENIED"


class Conflict(DomainError):
    code = "CONFLICT"


class Unauthenticated(DomainError):
    code = "UNAUTHENTICATED"


class TooManyRequests(DomainError):
    """One account has as much work in progress in this process as it may (app/fairness.py);
    answered 429 with Retry-After."""

    code = "TOO_MANY_REQUESTS"
