"""What a test sets up: accounts, callers and their policies, agents, clients with tokens, and
memory records (written by a turn's unit of work, or with plain SQL for the search tests)."""

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from app.actions import service as actions
from app.actions.harness import SearchConfig
from app.actions.service import ActionVersion
from app.auth import service as auth_service
from app.auth import store as auth_store
from app.auth.caller import Caller
from app.auth.policies import parse_policies
from app.executions import store as executions_store
from app.memory import maintenance
from app.memory import store as memory_store
from app.memory.records import MemoryRecord
from app.memory.search import search
from app.memory.service import MemoryWork, NewMemory, Writer
from app.memory.vectors import memory_text
from app.memory.visibility import AgentReader, OperatorReader, Reader
from app.scope import Scope
from app.state import AppState
from app.transfer.service import import_file

# Accounts, callers, policies


async def make_account(
    state: AppState, name: str = "tenant", account_id: UUID | None = None
) -> UUID:
    """A new account; `account_id` to name it beforehand (in a test's settings)."""
    async with state.pool.acquire() as conn:
        row = await auth_store.insert_account(conn, account_id or uuid.uuid4(), name)
    return row["account_id"]


def caller(account_id: UUID, *policies: dict[str, Any], principal: str = "someone") -> Caller:
    """A client of `account_id` holding exactly `policies`."""
    return Caller(account_id, principal, parse_policies(policies))


def allow(actions: list[str], *resources: str) -> dict[str, Any]:
    return {"effect": "ALLOW", "actions": actions, "resources": list(resources)}


def deny(actions: list[str], *resources: str) -> dict[str, Any]:
    return {"effect": "DENY", "actions": actions, "resources": list(resources)}


async def token_for(
    state: AppState,
    admin: Caller,
    principal: str,
    *policies: dict[str, Any],
    account_id: UUID | None = None,
) -> str:
    """A new client of the account (the admin's by default) holding `policies`, and its token."""
    await auth_service.create_client(
        state.pool,
        admin,
        account_id=account_id,
        principal=principal,
        name=principal,
        policies=list(policies),
    )
    issued = await auth_service.issue_client_token(
        state.pool, admin, account_id=account_id, principal=principal
    )
    return issued.token


# Agents

LABELS = {
    "customer_id": {"number": 5, "description": "The customer the memory is about."},
    "ticket": {"number": 7, "description": "The support ticket."},
}
BOTH = ["session", "agent"]


def memory_harness(**memory: Any) -> dict[str, Any]:
    """A harness with memory on; what `memory` leaves out takes the harness defaults."""
    return {"memory": {"enabled": True, **memory}}


def full_memory(**memory: Any) -> dict[str, Any]:
    """A harness with memory on, both scopes read and written, two labels and the three memory
    tools, unless overridden."""
    return memory_harness(
        **{
            "scope": {"read": BOTH, "write": BOTH},
            "labels": LABELS,
            "tools": ["add_memory", "read_memory", "delete_memory"],
            **memory,
        }
    )


FULL_MEMORY = full_memory()


async def make_agent(
    state: AppState,
    owner: Caller,
    *,
    name: str = "support",
    instructions: str = "You are a support agent.",
    harness: dict[str, Any] | None = FULL_MEMORY,
    model: dict[str, Any] | None = None,
) -> ActionVersion:
    """A new action of `owner`'s account, as the API creates one; by default a support agent
    with FULL_MEMORY (`harness=None`: no harness at all)."""
    return await actions.create_action(
        state.pool,
        owner,
        name=name,
        instructions=instructions,
        model=model,
        harness=harness,
        settings=state.settings,
    )


async def make_agent_id(state: AppState, owner: Caller, **agent: Any) -> str:
    """`make_agent`'s action ID, as the GraphQL API writes it."""
    return str((await make_agent(state, owner, **agent)).action_id)


# Memory written by turns


def writer(
    agent: ActionVersion,
    *,
    session: str | None = "s1",
    preview: bool = False,
    source: str = "TOOL",
    execution_id: UUID | None = None,
    invocation: int = 1,
    principal: str | None = None,
) -> Writer:
    return Writer(
        account_id=agent.account_id,
        action=agent,
        execution_id=execution_id or uuid.uuid4(),
        invocation_number=invocation,
        session_id=session,
        principal=principal or actions.agent_principal(agent.action_id),
        source=source,  # type: ignore[arg-type]
        preview=preview,
    )


def work(state: AppState, w: Writer) -> MemoryWork:
    assert state.embedder is not None
    return MemoryWork(state.pool, state.embedder, w)


async def commit(state: AppState, unit: MemoryWork) -> list[MemoryRecord]:
    """Commits a unit of work in a transaction of its own, as a turn's end does."""
    async with state.pool.acquire() as conn, conn.transaction():
        return await unit.commit(conn)


async def record_turn(state: AppState, w: Writer) -> None:
    """The execution (and session) a writer's turn belongs to, so provenance links resolve."""
    async with state.pool.acquire() as conn, conn.transaction():
        if w.session_id is not None:
            await executions_store.ensure_session(
                conn, w.account_id, w.action.action_id, w.session_id
            )
        await executions_store.insert_execution(
            conn,
            account_id=w.account_id,
            action_id=w.action.action_id,
            execution_id=w.execution_id,
            action_version=w.action.version,
            session_id=w.session_id,
            turn=1,
            kind="TURN",
            status="SUCCEEDED",
            preview=w.preview,
            principal=w.principal,
            token_id=None,
            input={"message": "hello"},
            invocation_number=w.invocation_number,
        )


async def remember(
    state: AppState, agent: ActionVersion, summary: str, *, kind: str = "fact", **options: Any
) -> MemoryRecord:
    """One turn that adds one record and commits."""
    keys = ("session", "preview", "source", "execution_id", "invocation", "principal")
    w = writer(agent, **{k: options.pop(k) for k in keys if k in options})
    unit = work(state, w)
    added = await unit.add(NewMemory(summary=summary, kind=kind, **options))
    await commit(state, unit)
    return added[0]


async def forget(
    state: AppState, agent: ActionVersion, memory_id: UUID, **options: Any
) -> MemoryRecord:
    """One turn that deletes one record and commits."""
    unit = work(state, writer(agent, **options))
    deleted = await unit.delete(memory_id)
    await commit(state, unit)
    return deleted


async def listed(state: AppState, w: Writer) -> list[UUID]:
    """What the writer's recall and search see: its visible, live records, newest first."""
    async with state.pool.acquire() as conn:
        rows = await memory_store.list_page(
            conn, w.reader(), after=None, limit=10_000, ascending=False
        )
    return [r["memory_id"] for r in rows]


async def make_running_turn(
    state: AppState,
    owner: Caller,
    *,
    action_id: str,
    boot_id: UUID | None = None,
    idle: timedelta = timedelta(minutes=1),
    kind: str = "TURN",
) -> UUID:
    """A turn as a process leaves it when it dies mid-turn: RUNNING, with a staged record, its
    last sign of life `idle` ago. Returns its execution ID. Of another `kind` (MCP, INGEST), a
    tool call or a conversation handed in left so."""
    execution_id = uuid.uuid4()
    async with state.pool.acquire() as conn:
        action = await actions.load_action(conn, owner.account_id, UUID(action_id))
        assert action is not None
        await executions_store.ensure_session(conn, owner.account_id, action.action_id, "s1")
        await executions_store.insert_execution(
            conn,
            account_id=owner.account_id,
            action_id=action.action_id,
            execution_id=execution_id,
            action_version=1,
            session_id="s1",
            turn=1,
            kind=kind,
            status="RUNNING",
            preview=False,
            principal=owner.principal,
            token_id=None,
            input="hi",
            boot_id=boot_id,
        )
    await work(state, writer(action, execution_id=execution_id)).add(
        NewMemory("Half-written", "fact")
    )
    await state.pool.execute(
        "UPDATE executions SET modified = now() - $2::interval WHERE execution_id = $1",
        execution_id,
        idle,
    )
    return execution_id


# Memory written with plain SQL, exactly as a search test needs it

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = SearchConfig()


class SearchAgent:
    """One agent and a way to write its records exactly as a test needs them."""

    # Searched by the index plan: `find` first gives the agent its own indexes and counts its
    # words (`list_agents`). Set by a test's `plan` fixture (EXACT_MAX_ROWS 0 with it).
    index_plan = False

    def __init__(self, state: AppState, account_id: UUID, action_id: UUID) -> None:
        self.state = state
        self.account_id = account_id
        self.action_id = action_id
        self.clock = T0

    @property
    def operator(self) -> OperatorReader:
        return OperatorReader(self.account_id, self.action_id)

    def reader(
        self,
        *,
        session: str | None = "s1",
        scopes: Sequence[str] = ("session", "agent"),
        preview: bool = False,
        execution_id: UUID | None = None,
    ) -> AgentReader:
        return AgentReader(
            self.account_id,
            self.action_id,
            session,
            tuple(map(Scope.from_word, scopes)),
            preview,
            execution_id,
        )

    async def add(
        self, summary: str, content: str = "", *, created: datetime | None = None, **columns: Any
    ) -> UUID:
        self.clock += timedelta(minutes=1)
        row = {
            "memory_id": uuid.uuid4(),
            "created": created or self.clock,
            "summary": summary,
            "content": content,
            "status": "ACTIVE",
            "scope": "AGENT",
            "kind": "fact",
            "labels": {},
            "preview": False,
            "session_id": None,
            "replaces": None,
            "pending_execution": None,
            **columns,
        }
        row["labels"] = {str(k): v for k, v in row["labels"].items()}
        vector = (await self.state.embedder.embed([memory_text(summary, content)])).vectors[0]
        await self.state.pool.execute(
            """
            INSERT INTO agent_memories (
                account_id, action_id, memory_id, version, created, modified, summary, content,
                status, scope, kind, source, labels, replaces, preview, execution_id,
                invocation_number, action_version, session_id, modified_by, pending_execution,
                embedding)
            VALUES ($1, $2, $3, 1, $4, $4, $5, $6, $7, $8, $9, 'TOOL', $10, $11, $12, $13, 1, 1,
                    $14, 'agent', $15, $16)
            """,
            self.account_id,
            self.action_id,
            row["memory_id"],
            row["created"],
            summary,
            content,
            row["status"],
            row["scope"],
            row["kind"],
            row["labels"],
            row["replaces"],
            row["preview"],
            uuid.uuid4(),
            row["session_id"],
            row["pending_execution"],
            vector,
        )
        return row["memory_id"]

    async def find(
        self,
        query: str | None,
        reader: Reader | None = None,
        config: SearchConfig = CONFIG,
        **kwargs: Any,
    ) -> list[UUID]:
        if self.index_plan:
            await list_agents(self.state)
        result = await search(
            self.state.pool,
            self.state.embedder,
            reader or self.operator,
            config,
            query=query,
            **kwargs,
        )
        return [r.memory_id for r in result.records]


async def list_agents(state: AppState) -> None:
    """Every agent of the test's database given its own search indexes and its words counted,
    as the search upkeep does for agents of `agent_index_min_records` or more: their searches
    take the index plan (under label or ID filters, and a turn's, too when EXACT_MAX_ROWS and
    SCOPED_MAX_ROWS are 0). An agent without own indexes is always ranked exactly."""
    await maintenance.run_round(state.pool, min_records=1)


async def list_agent(state: AppState, agent: SearchAgent) -> None:
    """The agent alone given its own search indexes and its words counted (`list_agents`)."""
    async with state.pool.acquire() as conn:
        await maintenance.index_agent(conn, (agent.account_id, agent.action_id), None)


async def make_search_agent(state: AppState, owner: Caller) -> SearchAgent:
    """An agent without a harness, named uniquely, whose records the test writes with SQL."""
    created = await make_agent(state, owner, name=f"agent {uuid.uuid4()}", harness=None)
    return SearchAgent(state, owner.account_id, created.action_id)


# Connections


class Capture:
    """A connection that records the SQL of the last fetch (to EXPLAIN it the same way)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sql: tuple[Any, ...] = ()

    async def fetchrow(self, *args: Any) -> Any:
        return await self.conn.fetchrow(*args)

    async def fetch(self, *args: Any) -> Any:
        self.sql = args
        return await self.conn.fetch(*args)


# Pinned lists kept by the writes (migration 0030)


async def pinned_lists(state: AppState, agent: ActionVersion) -> dict[str, tuple[int, int]]:
    """The lengths `pinned_lists` keeps for the agent's sessions: (live, preview) by session."""
    rows = await state.pool.fetch(
        "SELECT session_id, live_length, preview_length FROM pinned_lists "
        "WHERE account_id = $1 AND action_id = $2",
        agent.account_id,
        agent.action_id,
    )
    return {r["session_id"]: (r["live_length"], r["preview_length"]) for r in rows}


async def pinned_lists_counted(state: AppState, agent: ActionVersion) -> dict[str, tuple[int, int]]:
    """The same lengths counted now, from what each session's live and preview turns list
    (`list_pinned`, its session-scope records), in Python: each line as `pin_line` writes it,
    and its line break."""
    lengths: dict[str, list[int]] = {}
    async with state.pool.acquire() as conn:
        sessions = await conn.fetch(
            "SELECT DISTINCT session_id FROM agent_memories "
            "WHERE account_id = $1 AND action_id = $2 AND scope = 'SESSION'",
            agent.account_id,
            agent.action_id,
        )
        for s in sessions:
            for mode, preview in enumerate((False, True)):
                turn = AgentReader(
                    agent.account_id, agent.action_id, s["session_id"], (Scope.SESSION,), preview
                )
                listed = map(memory_store.record, await memory_store.list_pinned(conn, turn))
                length = sum(len(r.pinned_line()) + 1 for r in listed)
                lengths.setdefault(s["session_id"], [0, 0])[mode] = length
    return {s: (live, preview) for s, (live, preview) in lengths.items() if live or preview}


async def assert_pinned_lists_kept(state: AppState, agent: ActionVersion) -> dict[str, Any]:
    """The lengths kept are those counted now; returns them."""
    kept = await pinned_lists(state, agent)
    assert kept == await pinned_lists_counted(state, agent)
    return kept


async def import_into(state: AppState, account_id: UUID, exported: str) -> None:
    """An agent's export imported into `account_id`, as `engram import --account` does: its
    action, session, execution and record IDs kept, so two accounts may hold the same IDs."""

    async def opener() -> Any:
        return state.embedder

    await import_file(
        state.pool, account_id=account_id, lines=exported.splitlines(), open_embedder=opener
    )
