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


def action_not_found(action_id: object) -> NotFound:
    """An agent the caller's account does not hold, missing or another account's alike (an
    agent made with one account's token, run with another's, is the usual slip)."""
    return NotFound(
        f"action {action_id} not found in this client's account (an agent belongs to the "
        "account of the client that created it)"
    )


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
