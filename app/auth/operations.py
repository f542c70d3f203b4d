"""Which grants each named GraphQL operation needs, so a client can ask before it calls.

`viewer.allowed(operations: [...])` answers from this table; the services still check their
own grants on every call (this table only mirrors them, and a test keeps the two in step).
"""

from collections.abc import Mapping
from dataclasses import dataclass

from app.auth import resources as r
from app.auth.caller import Caller
from app.auth.policies import is_allowed
from app.auth.resources import Grant
from app.errors import BadInput

MAX_OPERATIONS = 100
EXECUTION_READ: tuple[Grant, ...] = (("SELECT", r.EXECUTION_DOCUMENT),)

OPERATIONS: Mapping[str, tuple[Grant, ...]] = {
    "createAccount": (("INSERT", r.ACCOUNT),),
    "updateAccount": (("UPDATE", r.ACCOUNT),),
    "deleteAccount": (("DELETE", r.ACCOUNT),),
    "accounts": (("SELECT", r.ACCOUNT),),
    "clients": (("SELECT", r.CLIENT),),
    "client": (("SELECT", r.CLIENT),),
    "createClient": (("INSERT", r.CLIENT),),
    "updateClient": (("UPDATE", r.CLIENT),),
    "deleteClient": (("DELETE", r.CLIENT),),
    "Client.tokens": (("SELECT", r.CLIENT_TOKEN),),
    "createClientToken": (("INSERT", r.CLIENT_TOKEN),),
    "revokeClientToken": (("DELETE", r.CLIENT_TOKEN),),
    "revokeTokensIssuedBy": (("DELETE", r.CLIENT_TOKEN),),
    "tokensIssuedBy": (("SELECT", r.CLIENT_TOKEN),),
    "adminEvents": (("SELECT", r.ACCOUNT_EVENTS),),
    "actions": (("SELECT", r.ACTION_INDEX), ("SELECT", r.ACTION)),
    "action": (("SELECT", r.ACTION),),
    "createAction": (("INSERT", r.ACTION),),
    "updateAction": (("UPDATE", r.ACTION),),
    "Action.memories": r.READ_MEMORY,
    "Action.memory": r.READ_MEMORY,
    "agentMemory": r.READ_MEMORY,
    "ActionAgentMemory.history": r.READ_MEMORY,
    "Action.searchMemories": r.SEARCH_MEMORY,
    "deleteAgentMemory": r.DELETE_MEMORY,
    "addAgentMemory": r.ADD_MEMORY + r.READ_MEMORY,
    "addAgentMemories": r.ADD_MEMORY + r.READ_MEMORY,
    "executeAction": (("INSERT", r.EXECUTION_DOCUMENT),),
    "execution": EXECUTION_READ,
    "Action.sessions": (("SELECT", r.SESSION_INDEX),),
    "Action.executions": (("SELECT", r.EXECUTION_INDEX),) + EXECUTION_READ,
    "ActionSession.executions": (("SELECT", r.SESSION_INDEX),) + EXECUTION_READ,
    "executions": (("SELECT", r.EXECUTION_INDEX),) + EXECUTION_READ,
    "ActionExecution.transcript": (("SELECT", r.EXECUTION_TRANSCRIPT),),
    # Session history (issue 13).
    "ActionSession.history": (("SELECT", r.EXECUTION_TRANSCRIPT),),
    "ActionSession.searchHistory": (("SELECT", r.EXECUTION_TRANSCRIPT),),
    "eraseSession": (("DELETE", r.EXECUTION_DOCUMENT),),
    "rememberConversation": (("INSERT", r.EXECUTION_DOCUMENT),),
}


@dataclass(frozen=True)
class Permission:
    operation: str
    allowed: bool
    reason: str | None  # why not, as a sentence; None when allowed


def _refusal(caller: Caller, operation: str) -> str | None:
    for verb, resource in OPERATIONS[operation]:
        if not is_allowed(caller.policies, verb, resource):
            return f"this client is not allowed to {verb} {resource}"
    if operation == "createAccount" and not caller.in_default_account:
        return "accounts can be created only by clients of the default account"
    if operation == "deleteAccount" and not caller.in_default_account:
        return "accounts can be deleted only by clients of the default account"
    return None


def permissions(caller: Caller, operations: list[str]) -> list[Permission]:
    """Whether the caller's grants permit each named operation, in the order asked."""
    if len(operations) > MAX_OPERATIONS:
        raise BadInput(f"ask about at most {MAX_OPERATIONS} operations at once")
    unknown = [o for o in operations if o not in OPERATIONS]
    if unknown:
        raise BadInput(
            f"unknown operation {unknown[0]!r}; the operations are: {', '.join(OPERATIONS)}"
        )
    found = []
    for operation in operations:
        reason = _refusal(caller, operation)
        found.append(Permission(operation, reason is None, reason))
    return found
