"""Who is asking: the authenticated client behind a request."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from app.auth.policies import Policy, covers, require, require_covers
from app.auth.resources import Grant
from app.errors import NotFound

# What an agent's principal starts with (`action:<actionId>`, what its own writes' `modifiedBy`
# and its executions' `principal` say): no client is given one, or it would pass for an agent.
AGENT_PREFIX = "action:"


@dataclass(frozen=True)
class Caller:
    account_id: UUID
    principal: str
    policies: tuple[Policy, ...]
    # Clients of the default (operator) account may manage other accounts' clients.
    in_default_account: bool = False
    # The token the request authenticated with (None: a caller made in process, such as the
    # `engram` command's).
    token_id: UUID | None = field(default=None, compare=False)
    # The client's `created`, as that token's lookup read it: a write the request makes keeps
    # its idempotency key only while that client exists (app/idempotency/keys.py).
    client_created: datetime | None = field(default=None, compare=False)
    # The client's policies as that lookup read them, as stored (JSON): a turn's commit in one
    # statement writes only while the client still holds these (executions/store.py
    # `commit_turn`).
    stored_policies: Any = field(default=None, compare=False)

    def require(self, *grants: Grant) -> None:
        require(self.policies, *grants)

    def covers(self, policies: tuple[Policy, ...]) -> bool:
        """Whether this client holds every grant `policies` allow (policies.py)."""
        return covers(self.policies, policies)

    def require_covers(self, policies: tuple[Policy, ...], what: str) -> None:
        """Refuses unless this client holds every grant `policies` allow (policies.py)."""
        require_covers(self.policies, policies, what)

    def reach_account(self, account_id: UUID | None) -> UUID:
        """The account an operation on `account_id` acts in; another tenant's is not found."""
        if account_id is None or account_id == self.account_id:
            return self.account_id
        if not self.in_default_account:
            raise NotFound(f"account {account_id} not found")
        return account_id
