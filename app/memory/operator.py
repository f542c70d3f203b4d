"""Operators on an agent's memory: list, read, history, delete and seed, behind their grants.

Spec: listing and reading need SELECT on financial.AgentMemory.indexes.* and on
financial.AgentMemory.document; deleting needs SELECT and UPDATE, whoever asks. An agent's use
of its own memory (app/memory/service.py) grants nothing to anyone.
"""

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import asyncpg

from app.actions.harness import MemoryConfig
from app.actions.service import ActionVersion, load_action, load_actions
from app.auth import resources
from app.auth.caller import Caller
from app.embeddings.base import Embedder
from app.errors import AccessDenied, BadInput, Conflict, NotFound, action_not_found
from app.executions import store as executions_store
from app.idempotency.keys import Duplicate, Key, key_for
from app.memory import maintenance, store
from app.memory.records import MemoryRecord, Scope
from app.memory.service import MemoryWork, NewMemory, Writer
from app.memory.visibility import OperatorReader
from app.scope import check_session_id


@dataclass(frozen=True)
class MemoryView:
    """A record with the names of its labels (numbers are fixed, names come from the agent)."""

    record: MemoryRecord
    label_names: Mapping[int, str]


@dataclass(frozen=True)
class LabelValue:
    value: str
    name: str | None = None
    number: int | None = None


@dataclass(frozen=True)
class OperatorMemory:
    """A record an operator seeds or corrects."""

    summary: str
    kind: str
    content: str = ""
    labels: Sequence[LabelValue] = ()
    scope: Scope | None = None  # None: SESSION with a session_id, else AGENT
    session_id: str | None = None
    pinned: bool = False
    replaces: UUID | None = None
    metadata: Any = None


async def _label_names(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID
) -> dict[int, str]:
    # Later versions keep every label with its number, so the current version names them all.
    action = await load_action(conn, account_id, action_id)
    return label_names_of(action) if action is not None else {}


@dataclass(frozen=True)
class MemoryFilters:
    """Filters of an operator's listing; None: that field is not filtered."""

    kind: str | None = None
    labels: Sequence[LabelValue] = ()
    scope: Scope | None = None
    preview: bool | None = None
    statuses: Sequence[str] | None = None  # None: the spec's listing
    session_id: str | None = None  # the session-scope records of this session

    def __post_init__(self) -> None:
        # As tuples: filters are part of a page's key in the request's DataLoader (a hash).
        object.__setattr__(self, "labels", tuple(self.labels))
        if self.statuses is not None:
            object.__setattr__(self, "statuses", tuple(self.statuses))


def _list_filters(
    filters: MemoryFilters, action_id: UUID, action: ActionVersion | None = None
) -> store.ListFilters:
    """The store's filters of an operator's listing of the agent `action_id`; `action`, its
    current version, names the numbers of the labels it filters by (None: no such agent)."""
    # Imported here: app.memory.search imports this module's types.
    from app.memory.search import label_numbers

    if filters.statuses is not None and not filters.statuses:
        raise BadInput("`status` names at least one status; omit it for the usual listing")
    check_session_id(filters.session_id, stored=True)
    numbers: dict[int, str] | None = None
    if filters.labels:
        if action is None:
            raise action_not_found(action_id)
        numbers = label_numbers(action.harness.memory, filters.labels)
    return store.ListFilters(
        kind=filters.kind,
        labels=numbers,
        scope=filters.scope,
        preview=filters.preview,
        statuses=filters.statuses,
        session_id=filters.session_id,
    )


@dataclass(frozen=True)
class MemoryPage:
    """A page of an agent's listing (list_memories'): after `after`, at most `limit`, oldest
    first if `ascending`, narrowed by `filters`. `agent`: its current version where the caller
    has read it already (GraphQL's `action(actionId) { memories }`), whose labels name the
    records' label values (a later version keeps every label of the earlier ones): one
    statement fewer than reading it again here, unless a record holds a label it does not
    declare (one a version written since added). Label filters read the agent. Not part of the
    page's identity."""

    action_id: UUID
    after: tuple[datetime, UUID] | None
    limit: int
    ascending: bool
    filters: MemoryFilters
    agent: ActionVersion | None = field(default=None, compare=False)


async def list_memories(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    action_id: UUID,
    limit: int,
    after: tuple[datetime, UUID] | None,
    ascending: bool,
    filters: MemoryFilters | None = None,
) -> list[MemoryView]:
    """Spec: newest first unless ascending; deleted and superseded records omitted, except
    preview deletions; staged records of running turns never shown. `filters` narrow the
    listing; only `statuses` widens it, to the records of the statuses it names. A
    `session_id` lists that session's session-scope records (the agent-scope records its turns
    wrote are not among them); a session the agent never had lists nothing."""
    page = MemoryPage(action_id, after, limit, ascending, filters or MemoryFilters())
    (found,) = await memory_pages(pool, caller, pages=[page])
    if isinstance(found, Exception):
        raise found
    return found


async def memory_pages(
    pool: asyncpg.Pool, caller: Caller, *, pages: Sequence[MemoryPage]
) -> list[list[MemoryView] | BadInput | NotFound]:
    """Pages of agents' listings, each as list_memories reads it: one query for the pages asked
    in the same order with the same filters, and one for the agents (their label names). A
    page filtered by label values is a query of its own, planned for its values (how many
    records hold a value decides the plan; the labels' numbers are its agent's). A page's own
    filters that name nothing (no status, a label its agent does not declare) are that page's
    error."""
    caller.require(*resources.READ_MEMORY)
    account_id = caller.account_id
    found: list[list[store.Row] | BadInput | NotFound] = [[] for _ in pages]
    together: dict[tuple[bool, store.ListFilters], list[int]] = {}
    apart: dict[int, store.ListFilters] = {}
    # The agents the pages were given (the current version, read earlier in the request) name
    # their records' labels; a label filter reads its agent, which may have been updated since.
    given = {
        p.action_id: p.agent
        for p in pages
        if p.agent is not None
        and (p.agent.account_id, p.agent.action_id) == (account_id, p.action_id)
    }
    async with pool.acquire() as conn:
        labelled = {p.action_id for p in pages if p.filters.labels}
        agents = await load_actions(conn, account_id, list(labelled)) if labelled else {}
        for i, page in enumerate(pages):
            try:
                narrowed = _list_filters(page.filters, page.action_id, agents.get(page.action_id))
            except (BadInput, NotFound) as error:
                found[i] = error
                continue
            if narrowed.labels:
                apart[i] = narrowed
            else:
                together.setdefault((page.ascending, narrowed), []).append(i)
        if apart:
            rows = await store.list_pages_apart(
                conn,
                account_id,
                [
                    (pages[i].action_id, pages[i].after, pages[i].limit, pages[i].ascending, f)
                    for i, f in apart.items()
                ],
            )
            for i, page_rows in zip(apart, rows, strict=True):
                found[i] = page_rows
        for (ascending, narrowed), indexes in together.items():
            if len(indexes) == 1:  # one agent's page: its own statement, 0.3 ms the faster
                page = pages[indexes[0]]
                found[indexes[0]] = await store.list_page(
                    conn,
                    OperatorReader(account_id, page.action_id),
                    after=page.after,
                    limit=page.limit,
                    ascending=ascending,
                    filters=narrowed,
                )
                continue
            rows = await store.list_pages(
                conn,
                account_id,
                [(pages[i].action_id, pages[i].after, pages[i].limit) for i in indexes],
                ascending=ascending,
                filters=narrowed,
            )
            for i, page_rows in zip(indexes, rows, strict=True):
                found[i] = page_rows
        # Read unless given, or given but a record holds a label it does not declare (one
        # declared since).
        unread = {
            p.action_id
            for p, rows in zip(pages, found, strict=True)
            if isinstance(rows, list)
            and rows
            and p.action_id not in agents
            and not (p.action_id in given and _declares(given[p.action_id], rows))
        }
        if unread:
            agents |= await load_actions(conn, account_id, list(unread))
    names = {action_id: label_names_of(action) for action_id, action in (given | agents).items()}
    return [
        [MemoryView(store.record(r), names.get(p.action_id, {})) for r in rows]
        if isinstance(rows, list)
        else rows
        for p, rows in zip(pages, found, strict=True)
    ]


def _declares(agent: ActionVersion, rows: Sequence[store.Row]) -> bool:
    """Whether `agent` declares every label the records of `rows` hold (keyed as stored, by
    their numbers as text)."""
    declared = {str(label.number) for label in agent.harness.memory.labels}
    return all(number in declared for r in rows for number in r["labels"])


async def get_memory(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    action_id: UUID,
    memory_id: UUID,
    version: int | None = None,
) -> MemoryView | None:
    """One record, whatever its status, or one exact version of it; None if none exists."""
    caller.require(*resources.READ_MEMORY)
    reader = OperatorReader(caller.account_id, action_id)
    async with pool.acquire() as conn:
        row = await store.get_visible(conn, reader, memory_id)
        if row is not None and version is not None and version != row["version"]:
            row = await store.get_version(conn, caller.account_id, action_id, memory_id, version)
        if row is None:
            return None
        names = await _label_names(conn, caller.account_id, action_id)
    return MemoryView(store.record(row), names)


async def get_memories(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, UUID, int | None]]
) -> dict[tuple[UUID, UUID, int | None], MemoryView]:
    """The records (or exact versions) of `keys` (action_id, memory_id, version) that
    get_memory finds, in three queries however many agents they are of: the records the
    caller sees, the versions asked of them, their agents' label names."""
    caller.require(*resources.READ_MEMORY)
    account_id = caller.account_id
    async with pool.acquire() as conn:
        rows = await store.get_visible_many(conn, account_id, list({k[:2] for k in keys}))
        current = {(r["action_id"], r["memory_id"]): r for r in rows}
        earlier = [
            (k[0], k[1], k[2])
            for k in keys
            if k[2] is not None and k[:2] in current and current[k[:2]]["version"] != k[2]
        ]
        versions = await store.get_versions(conn, account_id, earlier) if earlier else []
        agents = await load_actions(conn, account_id, list({k[0] for k in current}))
    exact = {(r["action_id"], r["memory_id"], r["version"]): r for r in versions}
    found: dict[tuple[UUID, UUID, int | None], MemoryView] = {}
    for k in keys:
        row = current.get(k[:2])
        if row is not None and k[2] is not None and k[2] != row["version"]:
            row = exact.get(k)
        if row is not None:
            action = agents.get(k[0])
            found[k] = MemoryView(
                store.record(row), label_names_of(action) if action is not None else {}
            )
    return found


class HistoryPage(NamedTuple):
    """A page of a record's versions, newest first: below `before_version` (None: from the
    newest), at most `limit`."""

    action_id: UUID
    memory_id: UUID
    before_version: int | None
    limit: int


async def memory_history_pages(
    pool: asyncpg.Pool, caller: Caller, *, pages: Sequence[HistoryPage]
) -> list[list[MemoryView]]:
    """Pages of records' committed versions, every status, in three queries per agent (which
    records the caller sees, their versions, the agent's label names); a record the caller
    does not see has none."""
    caller.require(*resources.READ_MEMORY)
    found: list[list[MemoryView]] = [[] for _ in pages]
    by_agent: dict[UUID, list[int]] = {}
    for i, page in enumerate(pages):
        by_agent.setdefault(page.action_id, []).append(i)
    async with pool.acquire() as conn:
        for action_id, indexes in by_agent.items():
            reader = OperatorReader(caller.account_id, action_id)
            seen = await store.visible_ids(conn, reader, [pages[i].memory_id for i in indexes])
            asked = [i for i in indexes if pages[i].memory_id in seen]
            if not asked:
                continue
            rows = await store.list_version_pages(
                conn,
                caller.account_id,
                action_id,
                [(pages[i].memory_id, pages[i].before_version, pages[i].limit) for i in asked],
            )
            if not any(rows):
                continue
            names = await _label_names(conn, caller.account_id, action_id)
            for i, page_rows in zip(asked, rows, strict=True):
                found[i] = [MemoryView(store.record(r), names) for r in page_rows]
    return found


async def _answered(
    pool: asyncpg.Pool, caller: Caller, action_id: UUID, key: Key
) -> list[MemoryView] | None:
    """The record versions a key already answered with (a bulk key's in order, another's one);
    None for a new key."""
    async with pool.acquire() as conn:
        result = await key.previous(conn)
    if result is None:
        return None
    answer = (
        result["memories"] if "memories" in result else [(result["memoryId"], result["version"])]
    )
    views = []
    for memory_id, version in answer:
        view = await get_memory(
            pool, caller, action_id=action_id, memory_id=UUID(memory_id), version=version
        )
        if view is None:
            raise NotFound(
                f"idempotency key {key.key!r} answered with memory {memory_id}, which no longer "
                "exists (its agent was deleted)"
            )
        views.append(view)
    return views


async def _answered_meanwhile(
    pool: asyncpg.Pool, caller: Caller, action_id: UUID, key: Key | None
) -> list[MemoryView] | None:
    """For a write refused once its key was found new: the first request's answer when one with
    the same key committed meanwhile, whose replacement made this one's stale (the key's
    promise is that request's answer, not the refusal)."""
    return None if key is None else await _answered(pool, caller, action_id, key)


async def delete_memory(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    action_id: UUID,
    memory_id: UUID,
    idempotency_key: str | None = None,
) -> MemoryView:
    """Writes the record's next version, DELETED, with modifiedBy the caller; deleting a deleted
    record returns it unchanged. A retry with the same idempotency key returns the first
    answer."""
    caller.require(*resources.DELETE_MEMORY)
    arguments = {"actionId": action_id, "id": memory_id}
    key = key_for(idempotency_key, caller, "deleteAgentMemory", arguments)
    if key is not None and (answered := await _answered(pool, caller, action_id, key)):
        return answered[0]
    try:
        return await _delete(pool, caller, action_id, memory_id, key)
    except Duplicate:
        return (await _answered_first(pool, caller, action_id, key))[0]


async def _delete(
    pool: asyncpg.Pool, caller: Caller, action_id: UUID, memory_id: UUID, key: Key | None
) -> MemoryView:
    reader = OperatorReader(caller.account_id, action_id)
    async with pool.acquire() as conn:
        async with conn.transaction():
            row = await store.get_visible(conn, reader, memory_id, for_update=True)
            if row is None:
                raise NotFound(f"memory {memory_id} of agent {action_id} not found")
            current = store.record(row)
            # A pinned record too: deleting needs what the spec names, SELECT and UPDATE on
            # memory (M55), and takes a line out of the instructions without putting one in.
            if current.status == "SUPERSEDED":
                raise BadInput(
                    f"memory {memory_id} was replaced by memory {current.replaced_by} and is no "
                    "longer recalled; delete that record to remove what replaced it"
                )
            if current.status == "ACTIVE":
                # The row is locked: it is still at the version just read.
                row = await store.change_status(
                    conn,
                    caller.account_id,
                    action_id,
                    memory_id,
                    expected_version=current.version,
                    status="DELETED",
                    replaced_by=None,
                    modified_by=caller.principal,
                )
                assert row is not None  # locked: None only for a record changed meanwhile
                if current.pinned and current.scope == Scope.SESSION:
                    await store.count_pinned_lists(conn, caller.account_id, action_id, [memory_id])
            if key is not None:
                await key.record(conn, {"memoryId": str(memory_id), "version": row["version"]})
        names = await _label_names(conn, caller.account_id, action_id)
    return MemoryView(store.record(row), names)


def _label_keys(config: MemoryConfig, labels: Sequence[LabelValue]) -> dict[str | int, str]:
    keys: dict[str | int, str] = {}
    for label in labels:
        if label.name is None and label.number is None:
            raise BadInput("each label needs its name or its number, and a value")
        if label.name is not None and label.number is not None:
            config.resolve_label(label.name, label.number)
        key: str | int = label.name if label.name is not None else label.number  # type: ignore[assignment]
        if key in keys:
            raise BadInput(f"label {key!r} is given twice")
        keys[key] = label.value
    return keys


async def _answered_first(
    pool: asyncpg.Pool, caller: Caller, action_id: UUID, key: Key | None
) -> list[MemoryView]:
    """The answer of the concurrent request with the same key that committed first."""
    assert key is not None
    answered = await _answered(pool, caller, action_id, key)
    if answered is None:
        raise key.lost()
    return answered


def _new_memory(memory: OperatorMemory, labels: dict[str | int, str]) -> NewMemory:
    """The record to write: an operator's fields are NewMemory's, with its labels resolved."""
    given = {f.name: getattr(memory, f.name) for f in fields(memory)}
    return NewMemory(**{**given, "labels": labels})


async def _commit_write(
    pool: asyncpg.Pool,
    caller: Caller,
    work: MemoryWork,
    *,
    sessions: Sequence[str],
    input: dict[str, Any],
    key: Key | None,
    answer: Callable[[list[MemoryRecord]], dict[str, Any]],
) -> list[MemoryRecord] | None:
    """Commits an operator's staged records in one transaction with the OPERATOR execution it
    is recorded as (and the sessions they name), and the key's `answer`; None when a request
    with the same key committed first. Whatever fails, the staged rows go.

    `input` holds IDs only: the records' text is readable only with the memory grants (M55)."""
    w = work.writer
    try:
        async with pool.acquire() as conn, conn.transaction():
            for session_id in sessions:
                await executions_store.ensure_session(
                    conn, caller.account_id, w.action.action_id, session_id
                )
            await executions_store.insert_execution(
                conn,
                account_id=caller.account_id,
                action_id=w.action.action_id,
                execution_id=w.execution_id,
                action_version=w.action.version,
                session_id=w.session_id,
                turn=None,
                kind="OPERATOR",
                status="SUCCEEDED",
                preview=False,
                principal=caller.principal,
                token_id=caller.token_id,
                input=input,
            )
            written = await work.commit(conn)
            if key is not None:
                await key.record(conn, answer(written))
    except Duplicate:
        await work.discard()
        return None
    except Conflict:
        await work.discard()
        # A request with the same key that committed first changed the records this one
        # replaces: it answers as that request did, as a duplicate does.
        if key is not None:
            async with pool.acquire() as conn:
                if await key.previous(conn) is not None:
                    return None
        raise
    except BaseException:
        await work.discard()
        raise
    maintenance.wrote(pool, (caller.account_id, w.action.action_id), len(written))
    return written


def label_names_of(action: ActionVersion) -> dict[int, str]:
    """The labels the agent version declares: each one's name by its number."""
    return {label.number: label.name for label in action.harness.memory.labels}


def _require_unpin(caller: Caller, memory_id: UUID) -> None:
    """A pinned record is listed in every turn's instructions: replacing it changes what they
    say, as pinning does."""
    try:
        caller.require(*resources.PIN_MEMORY)
    except AccessDenied:
        raise AccessDenied(
            f"memory {memory_id} is pinned (listed in every turn's instructions): replacing it "
            f"needs UPDATE on {resources.ACTION}, as pinning does"
        ) from None


async def _check_unpinning(
    conn: asyncpg.Connection, caller: Caller, action_id: UUID, memory_id: UUID
) -> None:
    row = await store.get_visible(conn, OperatorReader(caller.account_id, action_id), memory_id)
    if row is not None:
        current = store.record(row)
        if current.status == "ACTIVE" and current.pinned:
            _require_unpin(caller, memory_id)


async def add_memory(
    pool: asyncpg.Pool,
    embedder: Embedder,
    caller: Caller,
    *,
    action_id: UUID,
    memory: OperatorMemory,
    idempotency_key: str | None = None,
) -> MemoryView:
    """Seeds or corrects a record (source OPERATOR), recorded as an execution of its own so
    that every record names the execution that wrote it. A retry with the same idempotency key
    returns the first answer.

    The record is staged before the transaction that commits it (its embedding is computed
    outside any transaction); a process that dies between the two leaves a staged row that the
    liveness sweep (app/runtime/liveness.py) deletes."""
    # The stored record is returned, which needs READ_MEMORY; a replacement removes the record
    # it replaces from recall, as a deletion does, so it needs DELETE_MEMORY's grants too.
    caller.require(*resources.ADD_MEMORY, *resources.READ_MEMORY)
    if memory.replaces is not None:
        caller.require(*resources.DELETE_MEMORY)
    if memory.pinned:
        caller.require(*resources.PIN_MEMORY)
    check_session_id(memory.session_id)
    arguments = {"actionId": action_id, **asdict(memory)}
    key = key_for(idempotency_key, caller, "addAgentMemory", arguments)
    if key is not None and (answered := await _answered(pool, caller, action_id, key)):
        return answered[0]
    async with pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, action_id)
        if memory.replaces is not None:
            await _check_unpinning(conn, caller, action_id, memory.replaces)
    if action is None:
        raise action_not_found(action_id)
    writer = Writer(
        account_id=caller.account_id,
        action=action,
        execution_id=uuid.uuid4(),
        invocation_number=1,
        session_id=memory.session_id,
        principal=caller.principal,
        source="OPERATOR",
        preview=False,
    )
    labels = _label_keys(action.harness.memory, memory.labels)
    work = MemoryWork(pool, embedder, writer)
    try:
        new_id = (await work.add(_new_memory(memory, labels)))[0].memory_id
    except BadInput:
        if (answered := await _answered_meanwhile(pool, caller, action_id, key)) is not None:
            return answered[0]
        raise

    def answer(written: list[MemoryRecord]) -> dict[str, Any]:
        version = next(r.version for r in written if r.memory_id == new_id)
        return {"memoryId": str(new_id), "version": version}

    written = await _commit_write(
        pool,
        caller,
        work,
        sessions=[memory.session_id] if memory.session_id is not None else [],
        input={
            "operation": "addAgentMemory",
            "memoryId": str(new_id),
            "replaces": str(memory.replaces) if memory.replaces else None,
        },
        key=key,
        answer=answer,
    )
    if written is None:
        return (await _answered_first(pool, caller, action_id, key))[0]
    record = next(r for r in written if r.memory_id == new_id)
    return MemoryView(record, label_names_of(action))


MAX_BULK = 1000


async def add_memories(
    pool: asyncpg.Pool,
    embedder: Embedder,
    caller: Caller,
    *,
    action_id: UUID,
    memories: Sequence[OperatorMemory],
    idempotency_key: str | None = None,
) -> list[MemoryView]:
    """Seeds up to MAX_BULK records at once: the grants and checks of `add_memory`, one call
    of the embedder, one transaction, one execution of kind OPERATOR. An invalid input
    refuses the whole call, naming its index (`inputs[17].summary: ...`); nothing is written.
    A retry with the same idempotency key returns the first answer."""
    caller.require(*resources.ADD_MEMORY, *resources.READ_MEMORY)
    if any(m.replaces is not None for m in memories):
        caller.require(*resources.DELETE_MEMORY)
    if any(m.pinned for m in memories):
        caller.require(*resources.PIN_MEMORY)
    if not 0 < len(memories) <= MAX_BULK:
        raise BadInput(
            f"inputs holds {len(memories)} records; a call adds 1 to {MAX_BULK:,}: "
            "split larger imports into several calls (or use `engram import`)"
        )
    for i, memory in enumerate(memories):
        try:
            check_session_id(memory.session_id)
        except BadInput as e:
            raise BadInput(f"inputs[{i}].sessionId: {e.message}") from None
    key = None
    if idempotency_key is not None:
        arguments = {"actionId": action_id, "inputs": [asdict(m) for m in memories]}
        key = key_for(idempotency_key, caller, "addAgentMemories", arguments)
    if key is not None and (answered := await _answered(pool, caller, action_id, key)):
        return answered
    async with pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, action_id)
    if action is None:
        raise action_not_found(action_id)
    sessions = sorted({m.session_id for m in memories if m.session_id is not None})
    writer = Writer(
        account_id=caller.account_id,
        action=action,
        execution_id=uuid.uuid4(),
        invocation_number=1,
        # The execution belongs to a session when every record does to the same one.
        session_id=sessions[0]
        if len(sessions) == 1 and all(m.session_id for m in memories)
        else None,
        principal=caller.principal,
        source="OPERATOR",
        preview=False,
    )
    new_memories = []
    for i, memory in enumerate(memories):
        try:
            labels = _label_keys(action.harness.memory, memory.labels)
        except BadInput as e:
            raise BadInput(f"inputs[{i}].labels: {e.message}") from None
        new_memories.append(_new_memory(memory, labels))
    work = MemoryWork(pool, embedder, writer)
    try:
        ids = await work.add_many(new_memories)
    except BadInput:
        if (answered := await _answered_meanwhile(pool, caller, action_id, key)) is not None:
            return answered
        raise
    written = await _commit_write(
        pool,
        caller,
        work,
        sessions=sessions,
        input={
            "operation": "addAgentMemories",
            "memoryIds": [str(i) for i in ids],
            "replaces": [str(m.replaces) if m.replaces else None for m in memories],
        },
        key=key,
        answer=lambda written: {
            "memories": [[str(r.memory_id), r.version] for r in _in_order(written, ids)]
        },
    )
    if written is None:
        return await _answered_first(pool, caller, action_id, key)
    names = label_names_of(action)
    return [MemoryView(record, names) for record in _in_order(written, ids)]


def _in_order(written: list[MemoryRecord], ids: list[UUID]) -> list[MemoryRecord]:
    """The records written as `ids` lists them (a commit also returns those they replaced)."""
    by_id = {r.memory_id: r for r in written}
    return [by_id[i] for i in ids]
