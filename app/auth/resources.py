"""Resource names checked by policies, and the grants each operation needs."""

ACCOUNT = "financial.Account.document"
# Who changed the account's clients and tokens, or the account, and when (adminEvents).
ACCOUNT_EVENTS = "financial.Account.events"
CLIENT = "financial.Client.document"
CLIENT_TOKEN = "financial.Client.token"
ACTION = "financial.Action.document"
ACTION_INDEX = "financial.Action.indexes.created"
MEMORY_DOCUMENT = "financial.AgentMemory.document"
MEMORY_INDEX = "financial.AgentMemory.indexes.created"
MEMORY_SEARCH_INDEX = "financial.AgentMemory.indexes.search"
EXECUTION_DOCUMENT = "financial.ActionExecution.document"
EXECUTION_TRANSCRIPT = "financial.ActionExecution.transcript"
SESSION_INDEX = "financial.ActionExecution.indexes.sessions"
EXECUTION_INDEX = "financial.ActionExecution.indexes.created"

Grant = tuple[str, str]

# Spec: listing and reading memories needs SELECT on financial.AgentMemory.indexes.* and on
# financial.AgentMemory.document; deleting needs SELECT and UPDATE.
READ_MEMORY: tuple[Grant, ...] = (("SELECT", MEMORY_INDEX), ("SELECT", MEMORY_DOCUMENT))
SEARCH_MEMORY: tuple[Grant, ...] = (("SELECT", MEMORY_SEARCH_INDEX), ("SELECT", MEMORY_DOCUMENT))
DELETE_MEMORY: tuple[Grant, ...] = READ_MEMORY + (("UPDATE", MEMORY_DOCUMENT),)
ADD_MEMORY: tuple[Grant, ...] = (("INSERT", MEMORY_DOCUMENT),)
# A pinned record is listed in every turn's instructions: pinning one changes the agent.
PIN_MEMORY: tuple[Grant, ...] = (("UPDATE", ACTION),)

# The deployment's own metrics (GET /metrics): counts across every account, so only clients of
# the default (operator) account are served them.
DEPLOYMENT_METRICS = "financial.Deployment.metrics"

# Every resource a grant check names: policies resolve their patterns against these.
KNOWN: frozenset[str] = frozenset(
    value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, str) and value.startswith("financial.")
)
