"""GraphQL types and operations for agent memory records."""

from enum import Enum
from typing import TYPE_CHECKING, Annotated
from uuid import UUID

import strawberry

from app.errors import BadInput, NotFound
from app.graphql.context import Info
from app.graphql.node import node_type
from app.graphql.relay import (
    INT4_MAX,
    Connection,
    Node,
    PageInfo,
    SortOrder,
    check_first,
    connection,
    decode_cursor,
    decode_keyset,
    encode_cursor,
    global_id,
    parse_uuid,
)
from app.graphql.scalars import Timestamp, Value
from app.memory import operator
from app.memory import search as memory_search
from app.memory.operator import LabelValue, MemoryView, OperatorMemory

if TYPE_CHECKING:
    from app.graphql.actions import Action
    from app.graphql.executions import ActionExecution, ActionSession


@strawberry.enum
class ActionAgentMemoryStatus(Enum):
    ACTIVE = "ACTIVE"
    DELETED = "DELETED"
    SUPERSEDED = "SUPERSEDED"


@strawberry.enum
class ActionAgentMemoryScope(Enum):
    SESSION = "SESSION"
    AGENT = "AGENT"


@strawberry.enum
class ActionAgentMemorySource(Enum):
    EXTRACTION = "EXTRACTION"
    TOOL = "TOOL"
    OPERATOR = "OPERATOR"


@strawberry.type(description="A label value of a record: the label's fixed number, and its name.")
class ActionAgentMemoryLabel:
    number: int
    value: str
    name: str | None


@strawberry.input(description="A label value, by the label's declared name or number.")
class AgentMemoryLabelInput:
    name: str | None = None
    number: int | None = None
    value: str


@strawberry.input
class AgentMemoryInput:
    summary: str
    content: str = ""
    kind: str
    labels: list[AgentMemoryLabelInput] | None = None
    scope: ActionAgentMemoryScope | None = None
    session_id: str | None = None
    pinned: bool = False
    replaces: UUID | None = None
    metadata: Value | None = None


@strawberry.type(description="A memory record of an agent, at its current or an exact version.")
class ActionAgentMemory(Node):
    view: strawberry.Private[MemoryView]
    memory_id: UUID
    created: Timestamp
    modified: Timestamp
    version: int
    action_id: UUID
    summary: str
    content: str
    metadata: Value
    status: ActionAgentMemoryStatus
    scope: ActionAgentMemoryScope
    kind: str
    source: ActionAgentMemorySource
    pinned: bool
    labels: list[ActionAgentMemoryLabel]
    replaces: UUID | None
    replaced_by: UUID | None
    preview: bool
    execution_id: UUID
    invocation_number: int
    action_version: int
    session_id: str | None
    modified_by: str

    @classmethod
    def of(cls, view: MemoryView, *, exact_version: bool = False) -> "ActionAgentMemory":
        """`exact_version`: one version of the record (history), with an ID of its own."""
        r = view.record
        key = (r.action_id, r.memory_id, r.version) if exact_version else (r.action_id, r.memory_id)
        return cls(
            id=global_id("ActionAgentMemory", *key),
            view=view,
            memory_id=r.memory_id,
            created=Timestamp(r.created),
            modified=Timestamp(r.modified),
            version=r.version,
            action_id=r.action_id,
            summary=r.summary,
            content=r.content,
            metadata=Value(r.metadata),
            status=ActionAgentMemoryStatus(r.status),
            scope=ActionAgentMemoryScope(r.scope),
            kind=r.kind,
            source=ActionAgentMemorySource(r.source),
            pinned=r.pinned,
            labels=[
                ActionAgentMemoryLabel(number=n, value=r.labels[n], name=view.label_names.get(n))
                for n in sorted(r.labels)
            ],
            replaces=r.replaces,
            replaced_by=r.replaced_by,
            preview=r.preview,
            execution_id=r.execution_id,
            invocation_number=r.invocation_number,
            action_version=r.action_version,
            session_id=r.session_id,
            modified_by=r.modified_by,
        )

    @strawberry.field(description="The agent at `actionVersion`, the version that wrote it.")
    async def action(
        self, info: Info
    ) -> Annotated["Action", strawberry.lazy("app.graphql.actions")]:
        from app.graphql.actions import Action, load_action_version

        found = await load_action_version(info, self.action_id, self.action_version)
        if found is None:
            raise NotFound(f"action {self.action_id} version {self.action_version} not found")
        return Action.of(found)

    @strawberry.field(description="The session whose turn wrote it; null without a session.")
    async def session(
        self, info: Info
    ) -> Annotated["ActionSession", strawberry.lazy("app.graphql.executions")] | None:
        from app.graphql.executions import load_session

        if self.session_id is None:
            return None
        return await load_session(info, self.action_id, self.session_id)

    @strawberry.field(description="The execution whose turn (or operator call) wrote it.")
    async def execution(
        self, info: Info
    ) -> Annotated["ActionExecution", strawberry.lazy("app.graphql.executions")] | None:
        from app.graphql.executions import load_execution

        return await load_execution(info, self.action_id, self.execution_id)

    @strawberry.field(description="Every version of the record, deleted or not, newest first.")
    async def history(
        self, info: Info, first: int, after: str | None = None
    ) -> Connection["ActionAgentMemory"]:
        check_first(first)
        cursor = decode_cursor(after, 1)
        if cursor is not None and not isinstance(cursor[0], int):
            raise BadInput("`after` is not a cursor this connection issued")
        views = await operator.memory_history(
            info.context.pool,
            info.context.caller,
            self.action_id,
            self.memory_id,
            limit=first + 1,
            before_version=cursor[0] if cursor else None,
        )
        return connection(
            views,
            first,
            lambda v: encode_cursor(v.record.version),
            lambda v: ActionAgentMemory.of(v, exact_version=True),
            has_previous=after is not None,
        )


async def _read(
    info: Info, action_id: UUID, memory_id: UUID, version: int | None
) -> ActionAgentMemory | None:
    found = await operator.get_memory(
        info.context.pool, info.context.caller, action_id, memory_id, version
    )
    if found is None:
        return None
    return ActionAgentMemory.of(found, exact_version=version is not None)


@strawberry.enum
class ActionAgentMemorySearchMode(Enum):
    HYBRID = "hybrid"
    LEXICAL = "lexical"
    VECTOR = "vector"


@strawberry.type(
    description="A record a search found, with its score: the fused score in "
    "hybrid mode, the cosine similarity in vector mode, the text rank in lexical."
)
class ActionAgentMemorySearchEdge:
    cursor: str
    node: ActionAgentMemory
    score: float


@strawberry.type
class ActionAgentMemorySearchConnection:
    edges: list[ActionAgentMemorySearchEdge]
    nodes: list[ActionAgentMemory]
    page_info: PageInfo


@strawberry.type
class ActionMemoryFields:
    """The memory fields of `Action`, which inherits them (app/graphql/actions.py)."""

    if TYPE_CHECKING:
        action_id: UUID

    @strawberry.field(
        description="The agent's memory records by creation time, newest first unless "
        "`sort: ASC`; deleted and superseded records are omitted, except preview deletions."
    )
    async def memories(
        self,
        info: Info,
        *,
        sort: SortOrder | None = SortOrder.DESC,
        first: int,
        after: str | None = None,
    ) -> Connection[ActionAgentMemory]:
        check_first(first)
        views = await operator.list_memories(
            info.context.pool,
            info.context.caller,
            self.action_id,
            limit=first + 1,
            after=decode_keyset(after, UUID),
            ascending=sort == SortOrder.ASC,
        )
        return connection(
            views,
            first,
            lambda v: encode_cursor(v.record.created, v.record.memory_id),
            ActionAgentMemory.of,
            has_previous=after is not None,
        )

    @strawberry.field(
        description="One of the agent's records, whatever its status, or an exact version; "
        "null if none exists."
    )
    async def memory(
        self, info: Info, id: UUID, version: int | None = None
    ) -> ActionAgentMemory | None:
        return await _read(info, self.action_id, id, version)

    @strawberry.field(
        description="The agent's records that best match `query` (by meaning and words, newer "
        "first on ties; `mode` defaults to the agent's harness.memory.search.mode), or without "
        "a query its newest records; filtered by kind, exact label values and IDs."
    )
    async def search_memories(
        self,
        info: Info,
        *,
        query: str | None = None,
        mode: ActionAgentMemorySearchMode | None = None,
        kind: str | None = None,
        labels: list[AgentMemoryLabelInput] | None = None,
        ids: list[UUID] | None = None,
        first: int,
        after: str | None = None,
    ) -> ActionAgentMemorySearchConnection:
        check_first(first, memory_search.MAX_PAGE)
        embedder = info.context.state.embedder
        assert embedder is not None, "the embedding service starts with the app"
        views, cursors = await memory_search.search_as_operator(
            info.context.pool,
            embedder,
            info.context.caller,
            self.action_id,
            query=query,
            mode=mode.value if mode else None,
            kind=kind,
            labels=[LabelValue(v.value, v.name, v.number) for v in labels or []],
            ids=ids,
            limit=first + 1,
            after=after,
            max_query_chars=info.context.state.settings.max_search_query_chars,
        )
        edges = [
            ActionAgentMemorySearchEdge(
                cursor=cursor,
                node=ActionAgentMemory.of(v),
                score=v.record.score if v.record.score is not None else 0.0,
            )
            for v, cursor in zip(views[:first], cursors, strict=False)
        ]
        return ActionAgentMemorySearchConnection(
            edges=edges,
            nodes=[e.node for e in edges],
            page_info=PageInfo(
                has_next_page=len(views) > first,
                has_previous_page=after is not None,
                start_cursor=edges[0].cursor if edges else None,
                end_cursor=edges[-1].cursor if edges else None,
            ),
        )


def _node_version(part: str) -> int | None:
    """The version a node ID names; None when it names none a record can have (an int4)."""
    if part.isascii() and part.isdigit() and len(part) <= 10 and int(part) <= INT4_MAX:
        return int(part)
    return None


@node_type("ActionAgentMemory")
async def _memory_node(info: Info, parts: list[str]) -> ActionAgentMemory | None:
    version = _node_version(parts[2]) if len(parts) == 3 else None
    if len(parts) not in (2, 3) or (len(parts) == 3 and version is None):
        raise BadInput("an ActionAgentMemory ID names an agent, a record and maybe a version")
    return await _read(info, parse_uuid(parts[0]), parse_uuid(parts[1]), version)


@strawberry.type
class MemoryQuery:
    @strawberry.field(
        description="One of the agent's records, deleted or not, or an exact retained version; "
        "null if none exists."
    )
    async def agent_memory(
        self, info: Info, action_id: UUID, id: UUID, version: int | None = None
    ) -> ActionAgentMemory | None:
        return await _read(info, action_id, id, version)


IDEMPOTENCY_KEY = strawberry.argument(
    description="Sent again with the same arguments (after a lost answer), returns the first "
    "request's result instead of writing twice; the same key with other arguments is CONFLICT. "
    "Scoped to the caller and kept at least 24 hours."
)


@strawberry.type
class MemoryMutation:
    @strawberry.mutation(
        description="Deletes one of the agent's records: the agent no longer recalls it, and it "
        "stays readable with its versions. Deleting a deleted record returns it unchanged."
    )
    async def delete_agent_memory(
        self,
        info: Info,
        action_id: UUID,
        id: UUID,
        idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None,
    ) -> ActionAgentMemory:
        deleted = await operator.delete_memory(
            info.context.pool, info.context.caller, action_id, id, idempotency_key=idempotency_key
        )
        return ActionAgentMemory.of(deleted)

    @strawberry.mutation(
        description="Seeds or corrects one of the agent's records (source OPERATOR), recorded "
        "as an execution of its own. Needs INSERT on financial.AgentMemory.document and the "
        "grants that read memory; with `replaces`, also UPDATE, as deleting does; with "
        "`pinned`, also UPDATE on financial.Action.document (a pin is in every turn's "
        "instructions)."
    )
    async def add_agent_memory(
        self,
        info: Info,
        action_id: UUID,
        input: AgentMemoryInput,
        idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None,
    ) -> ActionAgentMemory:
        embedder = info.context.state.embedder
        assert embedder is not None, "the embedding service starts with the app"
        added = await operator.add_memory(
            info.context.pool,
            embedder,
            info.context.caller,
            action_id,
            OperatorMemory(
                summary=input.summary,
                kind=input.kind,
                content=input.content,
                labels=[LabelValue(v.value, v.name, v.number) for v in input.labels or []],
                scope=input.scope.value if input.scope else None,
                session_id=input.session_id,
                pinned=input.pinned,
                replaces=input.replaces,
                metadata=input.metadata,
            ),
            idempotency_key=idempotency_key,
        )
        return ActionAgentMemory.of(added)
