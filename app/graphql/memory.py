"""GraphQL types and operations for agent memory records."""

from enum import Enum
from typing import TYPE_CHECKING, Annotated, cast
from uuid import UUID

import strawberry

from app.actions.service import ActionVersion
from app.db import cursors
from app.db.cursors import Keyset
from app.errors import BadInput, NotFound
from app.graphql.context import Info, batch_loader, batch_pages
from app.graphql.enums import by_value, graphql_enum
from app.graphql.inputs import built_directly
from app.graphql.node import node_type
from app.graphql.relay import (
    AFTER,
    CREATED_ID,
    FIRST,
    Connection,
    Node,
    PageInfo,
    SortOrder,
    check_first,
    global_id,
    keyset_connection,
    page,
    parse_int4,
    parse_uuid,
)
from app.graphql.scalars import Timestamp, Value
from app.memory import operator
from app.memory import search as memory_search
from app.memory.operator import HistoryPage, LabelValue, MemoryView, OperatorMemory
from app.scope import Scope

# The types a record points at are above this module (they list records): named lazily, and
# read through the request's DataLoaders, which their modules register (app/graphql/context.py).
# Not imported, even under TYPE_CHECKING (a circle, tests/test_layering.py): mypy cannot see the
# names that strawberry resolves.
ACTION = Annotated["Action", strawberry.lazy("app.graphql.actions")]  # type: ignore[name-defined]  # noqa: F821
EXECUTION = Annotated["ActionExecution", strawberry.lazy("app.graphql.executions")]  # type: ignore[name-defined]  # noqa: F821
SESSION = Annotated["ActionSession", strawberry.lazy("app.graphql.executions")]  # type: ignore[name-defined]  # noqa: F821
VERSIONS = Keyset(cursors.INT4)  # a record's history, by version

# Arguments several fields take, described once.
ACTION_ID = Annotated[UUID, strawberry.argument(description="The agent (action) the record is of.")]
MEMORY_ID = Annotated[UUID, strawberry.argument(description="The record's `memoryId`.")]
VERSION = Annotated[
    int | None,
    strawberry.argument(
        description="An exact retained version of the record; by default its current version."
    ),
]


@graphql_enum("A record's status: whether the agent still recalls it.")
class ActionAgentMemoryStatus(Enum):
    ACTIVE = "Recalled and searched by the agent."
    DELETED = (
        "Deleted: no longer recalled, and readable with its versions through agentMemory and its "
        "history."
    )
    SUPERSEDED = "Another record replaced it (it corrects this one): `replacedBy` names it."


@graphql_enum("Which sessions recall a record.")
class ActionAgentMemoryScope(Enum):
    SESSION = "Recalled only by the session that wrote it."
    AGENT = (
        "Recalled by every session of the agent that reads agent scope, so what the agent learns "
        "in one session informs the next."
    )


@graphql_enum("What wrote a record.")
class ActionAgentMemorySource(Enum):
    EXTRACTION = (
        "The memory review: at the end of a turn, or over a conversation handed in "
        "(rememberConversation)."
    )
    TOOL = "The agent's own add_memory tool during a turn."
    OPERATOR = "An operator, with addAgentMemory (an execution of its own)."
    MCP = "A client's tool call over MCP (/mcp/{actionId}), as the agent."


_STATUS = by_value(ActionAgentMemoryStatus)
_SCOPE = by_value(ActionAgentMemoryScope)
_SOURCE = by_value(ActionAgentMemorySource)


@strawberry.type(description="A label value of a record: the label's fixed number, and its name.")
class ActionAgentMemoryLabel:
    number: int = strawberry.field(
        description="The label's fixed number, from 5 to 18, declared in harness.memory.labels."
    )
    value: str = strawberry.field(description="The exact value, such as a customer ID.")
    name: str | None = strawberry.field(
        description="The label's name in the agent's harness.memory.labels; null if it no "
        "longer declares one with this number."
    )


@built_directly
@strawberry.input(description="A label value, by the label's declared name or number.")
class AgentMemoryLabelInput:
    name: str | None = strawberry.field(
        default=None, description="The label's name, as harness.memory.labels declares it."
    )
    number: int | None = strawberry.field(
        default=None, description="The label's fixed number, from 5 to 18."
    )
    value: str = strawberry.field(description="The exact value, such as a customer ID.")


@built_directly
@strawberry.input(description="A record an operator seeds or corrects with addAgentMemory.")
class AgentMemoryInput:
    summary: str = strawberry.field(description="One line the agent can act on, at most 512 bytes.")
    content: str = strawberry.field(
        default="",
        description="The evidence and specifics behind the summary, at most 16 KiB; empty when "
        "the summary says it all.",
    )
    kind: str = strawberry.field(
        description="One of the agent's memory kinds (harness.memory.kinds; by default "
        "guidance, fact, event, reference)."
    )
    labels: list[AgentMemoryLabelInput] | None = strawberry.field(
        default=None, description="Label values, each by the label's name or number."
    )
    scope: ActionAgentMemoryScope | None = strawberry.field(
        default=None,
        description="SESSION or AGENT: which sessions recall it. By default SESSION when a "
        "sessionId is given, else AGENT; either must be a scope the agent reads "
        "(harness.memory.scope.read).",
    )
    session_id: str | None = strawberry.field(
        default=None, description="The session a session-scoped record belongs to."
    )
    pinned: bool = strawberry.field(
        default=False,
        description="List its summary in every turn's instructions; needs harness.memory.pinned "
        "and UPDATE on financial.Action.document.",
    )
    replaces: UUID | None = strawberry.field(
        default=None,
        description="A record the new one corrects: that record becomes SUPERSEDED, and its "
        "`replacedBy` names the new one.",
    )
    metadata: Value | None = strawberry.field(
        default=None, description="Metadata attached to the fact: any JSON."
    )


@strawberry.type(description="A memory record of an agent, at its current or an exact version.")
class ActionAgentMemory(Node):
    view: strawberry.Private[MemoryView]
    memory_id: UUID = strawberry.field(description="Unique identifier of the record.")
    created: Timestamp = strawberry.field(description="When the record was first written.")
    modified: Timestamp = strawberry.field(description="The time of the record's last change.")
    version: int = strawberry.field(
        description="The record's current version (or the version read). Previous versions are "
        "in `history`."
    )
    action_id: UUID = strawberry.field(description="The agent the record belongs to.")
    summary: str = strawberry.field(description="One line the agent can act on, at most 512 bytes.")
    content: str = strawberry.field(
        description="The evidence and specifics behind the summary, at most 16 KiB; empty when "
        "the summary says it all."
    )
    metadata: Value = strawberry.field(description="Metadata the agent attached to the fact.")
    status: ActionAgentMemoryStatus = strawberry.field(
        description="ACTIVE, DELETED, or SUPERSEDED."
    )
    scope: ActionAgentMemoryScope = strawberry.field(
        description="SESSION or AGENT: which sessions recall it."
    )
    kind: str = strawberry.field(description="One of the agent's memory kinds.")
    source: ActionAgentMemorySource = strawberry.field(
        description="EXTRACTION, TOOL, OPERATOR or MCP: what wrote it."
    )
    pinned: bool = strawberry.field(description="Whether every turn lists its summary.")
    labels: list[ActionAgentMemoryLabel] = strawberry.field(
        description="Its label values, each a `number` and a `value`, in number order."
    )
    replaces: UUID | None = strawberry.field(description="The record it replaced, if any.")
    replaced_by: UUID | None = strawberry.field(
        description="The record that replaced it, when it is SUPERSEDED."
    )
    preview: bool = strawberry.field(
        description="Whether a turn in preview mode wrote it. Live turns never recall a preview "
        "record."
    )
    execution_id: UUID = strawberry.field(
        description="The execution whose turn wrote the record. `execution` reads it, subject to "
        "your read permissions."
    )
    invocation_number: int = strawberry.field(description="The invocation that wrote the record.")
    action_version: int = strawberry.field(description="The agent version that wrote the record.")
    session_id: str | None = strawberry.field(
        description="The session whose turn wrote the record. Null for an agent without sessions."
    )
    modified_by: str = strawberry.field(
        description="Principal that made the last change: the writing agent's principal, or "
        "whoever deleted the record."
    )

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
            status=_STATUS[r.status],
            scope=_SCOPE[r.scope],
            kind=r.kind,
            source=_SOURCE[r.source],
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
    async def action(self, info: Info) -> ACTION:
        found = await info.context.load("Action", (self.action_id, self.action_version))
        if found is None:
            raise NotFound(f"action {self.action_id} version {self.action_version} not found")
        return found

    @strawberry.field(description="The session whose turn wrote it; null without a session.")
    async def session(self, info: Info) -> SESSION | None:
        if self.session_id is None:
            return None
        return await info.context.load("ActionSession", (self.action_id, self.session_id))

    @strawberry.field(description="The execution whose turn (or operator call) wrote it.")
    async def execution(self, info: Info) -> EXECUTION | None:
        return await info.context.load("ActionExecution", (self.action_id, self.execution_id))

    @strawberry.field(description="Every version of the record, deleted or not, newest first.")
    async def history(
        self, info: Info, first: FIRST, after: AFTER = None
    ) -> Connection["ActionAgentMemory"]:
        return await keyset_connection(
            first,
            after,
            VERSIONS.bound(
                "ActionAgentMemory.history",
                info.context.caller.account_id,
                self.action_id,
                self.memory_id,
            ),
            lambda before, limit: info.context.load(
                "ActionAgentMemory.history",
                HistoryPage(self.action_id, self.memory_id, before[0] if before else None, limit),
            ),
            lambda v: (v.record.version,),
            lambda v: ActionAgentMemory.of(v, exact_version=True),
        )


batch_pages("ActionAgentMemory.history", operator.memory_history_pages)


async def _read(
    info: Info, action_id: UUID, memory_id: UUID, version: int | None
) -> ActionAgentMemory | None:
    found = await operator.get_memory(
        info.context.pool,
        info.context.caller,
        action_id=action_id,
        memory_id=memory_id,
        version=version,
    )
    if found is None:
        return None
    return ActionAgentMemory.of(found, exact_version=version is not None)


@graphql_enum("How a search with a query ranks records.")
class ActionAgentMemorySearchMode(Enum):
    HYBRID = (
        "hybrid",
        "By meaning and shared words together (the default): the cosine similarity and the text "
        "rank scaled to the best match, fused.",
    )
    LEXICAL = ("lexical", "By the words a record shares with the query (full text).")
    VECTOR = ("vector", "By meaning: the similarity of the record's embedding to the query's.")


@strawberry.type(
    description="A record a search found, with its score: the fused score in "
    "hybrid mode, the cosine similarity in vector mode, the text rank in lexical."
)
class ActionAgentMemorySearchEdge:
    cursor: str = strawberry.field(
        description="Pass as `after`, with the same arguments, for the records after this one."
    )
    node: ActionAgentMemory = strawberry.field(description="The record found.")
    score: float = strawberry.field(
        description="Its score (higher is better); 0 for a listing without a query."
    )


@strawberry.type(description="A page of the records a search found, best first.")
class ActionAgentMemorySearchConnection:
    edges: list[ActionAgentMemorySearchEdge] = strawberry.field(
        description="The records of this page, with their scores and cursors."
    )
    nodes: list[ActionAgentMemory] = strawberry.field(
        description="The records of this page, without their scores."
    )
    page_info: PageInfo = strawberry.field(
        description="Whether another page follows, and the cursor to ask for it."
    )


@strawberry.type
class ActionMemoryFields:
    """The memory fields of `Action`, which inherits them (app/graphql/actions.py)."""

    if TYPE_CHECKING:
        action_id: UUID

    @strawberry.field(
        description="The agent's memory records by creation time, newest first unless "
        "`sort: ASC`; deleted and superseded records are omitted, except preview deletions. "
        "Optionally filtered by kind, exact label values, scope, preview, status and session: "
        "`sessionId` lists the session-scope records of that session, what the agent remembers "
        "for that conversation alone."
    )
    async def memories(
        self,
        info: Info,
        *,
        sort: Annotated[
            SortOrder | None,
            strawberry.argument(description="By creation time: DESC (newest first) or ASC."),
        ] = SortOrder.DESC,
        first: FIRST,
        after: AFTER = None,
        kind: Annotated[
            str | None, strawberry.argument(description="Only records of this kind.")
        ] = None,
        labels: Annotated[
            list[AgentMemoryLabelInput] | None,
            strawberry.argument(description="Only records holding every one of these values."),
        ] = None,
        scope: Annotated[
            ActionAgentMemoryScope | None,
            strawberry.argument(description="Only records of this scope."),
        ] = None,
        preview: Annotated[
            bool | None,
            strawberry.argument(description="Only preview records (true) or live ones (false)."),
        ] = None,
        status: Annotated[
            list[ActionAgentMemoryStatus] | None,
            strawberry.argument(
                description="Only records of these statuses (current versions); omitted: "
                "the usual listing, live records and preview deletions."
            ),
        ] = None,
        session_id: Annotated[
            str | None,
            strawberry.argument(
                description="Only the session-scope records of this session (agent-scope "
                "records belong to no one session, even those its turns wrote); a session the "
                "agent never had lists none."
            ),
        ] = None,
    ) -> Connection[ActionAgentMemory]:
        filters = operator.MemoryFilters(
            kind=kind,
            labels=[LabelValue(v.value, v.name, v.number) for v in labels or []],
            scope=Scope[scope.name] if scope else None,
            preview=preview,
            statuses=[s.value for s in status] if status is not None else None,
            session_id=session_id,
        )
        # A cursor belongs to these arguments: the same filter spelled otherwise (labels or
        # statuses in another order) is the same listing.
        bound = CREATED_ID.bound(
            "Action.memories",
            info.context.caller.account_id,
            self.action_id,
            (sort or SortOrder.DESC).name,
            kind,
            sorted({(v.name, v.number, v.value) for v in labels or []}, key=str),
            filters.scope,
            preview,
            sorted(set(filters.statuses)) if filters.statuses is not None else None,
            session_id,
        )
        return await keyset_connection(
            first,
            after,
            bound,
            lambda keyset, limit: info.context.load(
                "Action.memories",
                operator.MemoryPage(
                    self.action_id,
                    keyset,
                    limit,
                    sort == SortOrder.ASC,
                    filters,
                    _current(self),  # its labels name the records': not read again
                ),
            ),
            lambda v: (v.record.created, v.record.memory_id),
            ActionAgentMemory.of,
        )

    @strawberry.field(
        description="One of the agent's records, whatever its status, or an exact version; "
        "null if none exists."
    )
    async def memory(
        self, info: Info, id: MEMORY_ID, version: VERSION = None
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
        query: Annotated[
            str | None,
            strawberry.argument(
                description="What to find, in words; without it (or blank), the newest records."
            ),
        ] = None,
        mode: Annotated[
            ActionAgentMemorySearchMode | None,
            strawberry.argument(
                description="How to rank; by default the agent's harness.memory.search.mode."
            ),
        ] = None,
        kind: Annotated[
            str | None, strawberry.argument(description="Only records of this kind.")
        ] = None,
        labels: Annotated[
            list[AgentMemoryLabelInput] | None,
            strawberry.argument(description="Only records with all of these exact label values."),
        ] = None,
        ids: Annotated[
            list[UUID] | None,
            strawberry.argument(
                description="Only these records (at most 1,000), read by ID: an empty list "
                "finds none, where null (or leaving it out) filters by no ID. (The agent's "
                "search_memory tool reads an empty ids as left out: models send [] for an array "
                "they leave empty.)"
            ),
        ] = None,
        first: Annotated[
            int,
            strawberry.argument(description="How many records to return, from 1 to 1,000."),
        ],
        after: Annotated[
            str | None,
            strawberry.argument(
                description="The `cursor` of the last record of the previous page, asked with "
                "the same arguments: the records after it. A ranked search pages through its "
                "best 10,000."
            ),
        ] = None,
    ) -> ActionAgentMemorySearchConnection:
        check_first(first, memory_search.MAX_PAGE)
        async with info.context.searching:
            views, issued = await memory_search.search_as_operator(
                info.context.pool,
                info.context.embedder,
                info.context.caller,
                action_id=self.action_id,
                query=query,
                # graphql_enum's value, the str, not the (value, description) mypy reads.
                mode=cast(str, mode.value) if mode else None,
                kind=kind,
                labels=[LabelValue(v.value, v.name, v.number) for v in labels or []],
                ids=ids,
                limit=first + 1,
                after=after,
                max_query_chars=info.context.state.settings.max_search_query_chars,
                action=_current(self),
            )
        return page(
            list(zip(views, issued, strict=False)),
            first,
            after,
            lambda found: ActionAgentMemorySearchEdge(
                cursor=found[1],
                node=ActionAgentMemory.of(found[0]),
                score=found[0].record.score if found[0].record.score is not None else 0.0,
            ),
            ActionAgentMemorySearchConnection,
        )


batch_pages("Action.memories", operator.memory_pages)


def _current(fields: ActionMemoryFields) -> ActionVersion | None:
    """The agent as its `Action` was read in this request, when that is its current version:
    the search needs its harness, and need not read it again."""
    record = getattr(fields, "record", None)
    if isinstance(record, ActionVersion) and record.version == record.current_version:
        return record
    return None


# Records by ID, for node(id) and nodes(ids): those of one request in three queries.
batch_loader("ActionAgentMemory", operator.get_memories, lambda view: view)


def _memory_key(parts: list[str]) -> tuple[UUID, UUID, int | None]:
    version = parse_int4(parts[2]) if len(parts) == 3 else None
    if len(parts) not in (2, 3) or (len(parts) == 3 and version is None):
        raise BadInput("an ActionAgentMemory ID names an agent, a record and maybe a version")
    return parse_uuid(parts[0]), parse_uuid(parts[1]), version


@node_type("ActionAgentMemory", _memory_key)
async def _memory_node(info: Info, key: tuple[UUID, UUID, int | None]) -> ActionAgentMemory | None:
    found = await info.context.load("ActionAgentMemory", key)
    return ActionAgentMemory.of(found, exact_version=key[2] is not None) if found else None


@strawberry.type(description="Reading an agent's records.")
class MemoryQuery:
    @strawberry.field(
        description="One of the agent's records, deleted or not, or an exact retained version; "
        "null if none exists."
    )
    async def agent_memory(
        self, info: Info, action_id: ACTION_ID, id: MEMORY_ID, version: VERSION = None
    ) -> ActionAgentMemory | None:
        return await _read(info, action_id, id, version)


IDEMPOTENCY_KEY = strawberry.argument(
    description="Sent again with the same arguments (after a lost answer), returns the first "
    "request's result instead of writing twice; the same key with other arguments is CONFLICT. "
    "Scoped to the caller and kept at least 24 hours."
)


@strawberry.type(description="Writing an agent's records.")
class MemoryMutation:
    @strawberry.mutation(
        description="Deletes one of the agent's records: the agent no longer recalls it, and it "
        "stays readable with its versions. Deleting a deleted record returns it unchanged."
    )
    async def delete_agent_memory(
        self,
        info: Info,
        action_id: ACTION_ID,
        id: MEMORY_ID,
        idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None,
    ) -> ActionAgentMemory:
        deleted = await operator.delete_memory(
            info.context.pool,
            info.context.caller,
            action_id=action_id,
            memory_id=id,
            idempotency_key=idempotency_key,
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
        action_id: ACTION_ID,
        input: Annotated[AgentMemoryInput, strawberry.argument(description="The record.")],
        idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None,
    ) -> ActionAgentMemory:
        added = await operator.add_memory(
            info.context.pool,
            info.context.embedder,
            info.context.caller,
            action_id=action_id,
            memory=_operator_memory(input),
            idempotency_key=idempotency_key,
        )
        return ActionAgentMemory.of(added)

    @strawberry.mutation(
        description=f"Seeds up to {operator.MAX_BULK:,} records at once, as addAgentMemory does "
        "(the same grants and checks), in one transaction and one execution: all or none. An "
        "invalid input refuses the call, naming its index (`inputs[17].summary: ...`). Select "
        "`memoryIds` alone when the records themselves are not needed: it is the fastest."
    )
    async def add_agent_memories(
        self,
        info: Info,
        action_id: ACTION_ID,
        inputs: Annotated[
            list[AgentMemoryInput],
            strawberry.argument(
                description=f"1 to {operator.MAX_BULK:,} records, as addAgentMemory takes them."
            ),
        ],
        idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None,
    ) -> "AddAgentMemoriesResult":
        added = await operator.add_memories(
            info.context.pool,
            info.context.embedder,
            info.context.caller,
            action_id=action_id,
            memories=[_operator_memory(i) for i in inputs],
            idempotency_key=idempotency_key,
        )
        return AddAgentMemoriesResult(added=added)


def _operator_memory(input: AgentMemoryInput) -> OperatorMemory:
    return OperatorMemory(
        summary=input.summary,
        kind=input.kind,
        content=input.content,
        labels=[LabelValue(v.value, v.name, v.number) for v in input.labels or []],
        scope=Scope[input.scope.name] if input.scope else None,
        session_id=input.session_id,
        pinned=input.pinned,
        replaces=input.replaces,
        metadata=input.metadata,
    )


@strawberry.type(description="The records addAgentMemories wrote, in the order of its inputs.")
class AddAgentMemoriesResult:
    added: strawberry.Private[list[MemoryView]]

    @strawberry.field(description="The execution that wrote them (kind OPERATOR).")
    def execution_id(self) -> UUID:
        return self.added[0].record.execution_id

    @strawberry.field(description="Their IDs, in the order of the inputs.")
    def memory_ids(self) -> list[UUID]:
        return [v.record.memory_id for v in self.added]

    @strawberry.field(description="The records, in the order of the inputs.")
    def memories(self) -> list[ActionAgentMemory]:
        return [ActionAgentMemory.of(v) for v in self.added]
