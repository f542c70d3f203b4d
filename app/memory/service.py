"""Memory records: writes (staged per turn, committed atomically), reads, deletes.

CONTRACT (used by the runtime and the GraphQL layer; implemented in this module):

- `Writer` names who writes and with what provenance.
- `MemoryWork(pool, embedder, writer)` is one writer's unit of work. `add`, `delete` stage
  changes as rows of `agent_memories` with `pending_execution = writer.execution_id` (and
  `pending_invocation`, the attempt), which only this attempt's own reads see
  (app/memory/visibility.py); `commit(conn)` makes them visible inside the caller's
  transaction (with the turn's other writes) and raises Conflict when a record it replaces
  or deletes changed meanwhile; `discard()` drops them. After a Conflict (or any failure of
  the caller's transaction) call `discard()`: the rolled-back rows are staged again.
- Embeddings are computed in `add` (outside any transaction); `embed_tokens` collects usage.
- No grant is checked here: an agent's use of its own memory needs none (spec); operators
  reach this through app/memory/operator.py, which checks theirs.
"""

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from uuid import UUID

import asyncpg

from app.actions.harness import MemoryConfig
from app.actions.service import ActionVersion
from app.embeddings.base import Embedder
from app.errors import BadInput, Conflict, DomainError, NotFound
from app.memory import store
from app.memory.pins import PinnedLists, pinned_in
from app.memory.records import (
    MAX_CONTENT_BYTES,
    MAX_SUMMARY_BYTES,
    MemoryRecord,
    NewRecord,
    Scope,
    Source,
    pin_line,
)
from app.memory.vectors import memory_text
from app.memory.visibility import AgentReader, OperatorReader, Reader
from app.scope import as_harness

# Every character that ends a line for str.splitlines: a summary is one line.
LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
# A label value is matched exactly (an ID, a customer's name): 1 to this many bytes of UTF-8.
MAX_LABEL_VALUE_BYTES = 512
MAX_METADATA_BYTES = 16 * 1024
NO_SESSION = (
    "this agent runs without a session, so it has no session scope: its harness.memory.scope "
    'must be {"read": ["agent"], "write": ["agent"]}'
)


@dataclass(frozen=True)
class Writer:
    account_id: UUID
    action: ActionVersion  # the agent version writing: its harness decides what is allowed
    execution_id: UUID
    invocation_number: int
    session_id: str | None
    principal: str  # becomes modifiedBy
    source: Source
    preview: bool

    def reader(self, *, writing: bool = False, adding: Scope | None = None) -> AgentReader:
        """How this writer reads: its read scopes, its session, its own staged rows.
        `writing`: what it changes (a replacement, a deletion), the scopes it writes too, even
        one it does not read, so that it finds what it wrote there. `adding`: what a new record
        of that scope may restate (a memory review's neighbours and duplicates): the records of
        its read scopes and of that scope, so that a fact kept in a scope the agent writes but
        does not read is not kept there again, but is kept again where the session reads it."""
        config = self.action.harness.memory
        scopes = config.read
        if writing or adding is not None:
            scopes = tuple(
                s
                for s in Scope
                if s in config.read or (s in config.write if writing else s == adding)
            )
        return AgentReader(
            account_id=self.account_id,
            action_id=self.action.action_id,
            session_id=self.session_id,
            scopes=scopes,
            preview=self.preview,
            execution_id=self.execution_id,
            invocation_number=self.invocation_number,
        )

    @property
    def is_operator(self) -> bool:
        return self.source == "OPERATOR"


@dataclass(frozen=True)
class NewMemory:
    summary: str
    kind: str
    content: str = ""
    labels: Mapping[str | int, str] = field(default_factory=dict)  # by label name or number
    scope: Scope | None = None  # None: SESSION when write includes session, else AGENT
    pinned: bool = False
    replaces: UUID | None = None
    metadata: Any = None
    source: Source | None = None  # None: the writer's (the memory review writes EXTRACTION)
    # None: the writer's session. A bulk operator write names each record's own session.
    session_id: str | None = None


def check_summary(summary: str) -> None:
    if not isinstance(summary, str) or not summary.strip():
        raise BadInput(
            "summary is empty: give one line the agent can act on without reading further"
        )
    if not LINE_BREAKS.isdisjoint(summary):
        raise BadInput("summary must be one line, without line breaks: move the details to content")
    _check_bytes(
        "summary", summary, MAX_SUMMARY_BYTES, "UTF-8", "shorten it and move the details to content"
    )


def check_content(content: str) -> None:
    if not isinstance(content, str):
        raise BadInput("content must be text")
    _check_bytes(
        "content",
        content,
        MAX_CONTENT_BYTES,
        "16 KiB, UTF-8",
        "keep only the evidence and specifics behind the summary",
    )


def _check_bytes(name: str, text: str, most: int, unit: str, advice: str) -> None:
    size = len(text.encode())
    if size > most:
        raise BadInput(
            f"{name} is {size} bytes; at most {most} bytes ({unit}) are allowed: {advice}"
        )


def label_value_fits(value: str) -> bool:
    """Whether a label value is within its bound (`MAX_LABEL_VALUE_BYTES`): every door that
    takes one (the API, the memory review, the import) asks this, each with its own words."""
    return 0 < len(value.encode()) <= MAX_LABEL_VALUE_BYTES


def check_label_filter(label: str | int, value: str) -> None:
    """A search's or listing's label filter: refused when no record can hold its value (one of
    more than `MAX_LABEL_VALUE_BYTES`, or empty), where it found nothing without a word why."""
    if not label_value_fits(value):
        raise BadInput(
            f"label {label}'s filter value is {len(value.encode())} bytes; a record's label value"
            f" is 1 to {MAX_LABEL_VALUE_BYTES} bytes, so none holds it: filter on the exact value"
            " a record was given"
        )


def check_kind(config: MemoryConfig, kind: str) -> None:
    if kind not in config.kinds:
        raise BadInput(
            f"kind {kind!r} is not one of this agent's memory kinds: {', '.join(config.kinds)}"
        )


def check_labels(config: MemoryConfig, labels: Mapping[str | int, str]) -> dict[int, str]:
    """Label values by number, from values given by declared label name or number."""
    result: dict[int, str] = {}
    for key, value in labels.items():
        # "²" is a digit to str.isdigit, not to int(): only ASCII digits name a number.
        number = isinstance(key, str) and key.isascii() and key.isdigit()
        label = config.resolve_label(int(key) if number else key)
        if not isinstance(value, str) or not value:
            raise BadInput(
                f"label {label.name} needs an exact, non-empty string value, such as an ID"
            )
        if not label_value_fits(value):
            raise BadInput(
                f"label {label.name}'s value must be at most {MAX_LABEL_VALUE_BYTES} bytes"
            )
        if label.number in result:
            raise BadInput(f"label {label.name} (number {label.number}) is given twice")
        result[label.number] = value
    return result


def check_metadata(metadata: Any) -> Any:
    if metadata is None:
        return {}
    try:
        size = len(json.dumps(metadata, allow_nan=False).encode())
    except (TypeError, ValueError):
        raise BadInput("metadata must be a JSON value") from None
    if size > MAX_METADATA_BYTES:
        raise BadInput(
            f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} are allowed"
        )
    return metadata


@dataclass(frozen=True)
class _Checked:
    """What the checks of a new record give: its label values by number, its metadata, scope
    and session."""

    labels: dict[int, str]
    metadata: Any
    scope: Scope
    session_id: str | None


# What a tombstone keeps of the record it deletes.
_TOMBSTONE_COPIES = ("summary", "content", "metadata", "scope", "kind", "labels")


@dataclass(frozen=True)
class _Target:
    """A record a writer replaces, deletes or reads: as stored, and as the writer sees it."""

    current: MemoryRecord  # committed, or staged by this attempt
    shadow: MemoryRecord | None  # the row hiding it from this writer (app.memory.visibility)
    deletes: bool  # the shadow is a tombstone: a deletion, not a replacement
    effective: MemoryRecord


@dataclass(frozen=True)
class _Change:
    """A status change that commit applies to a record the writer read at `version`."""

    target: UUID
    version: int
    status: Literal["SUPERSEDED", "DELETED"]
    by: UUID  # the staged row that replaces or deletes it
    # A preview record naming a live record: the live record stays unchanged (spec P4).
    preview_of_live: bool
    # The staged row only marks a deletion until commit, which removes it.
    tombstone: bool


def _as_changed(
    current: MemoryRecord,
    status: Literal["SUPERSEDED", "DELETED"],
    by: MemoryRecord,
    principal: str,
) -> MemoryRecord:
    """The record as committing a staged replacement or deletion will write it."""
    return replace(
        current,
        status=status,
        replaced_by=by.memory_id if status == "SUPERSEDED" else None,
        version=current.version + 1,
        modified=by.modified,
        modified_by=principal,
    )


def _effective(
    current: MemoryRecord, shadow: MemoryRecord | None, deletes: bool, principal: str
) -> MemoryRecord:
    """The record as a reader whose `shadow` names it sees it: replaced by the shadow, or
    deleted when the shadow is a deletion (`deletes`, a tombstone). A replacement deleted
    since is no deletion: the record stays replaced by it, as a live one does (P3, P4)."""
    if shadow is None or current.status != "ACTIVE":
        return current
    status: Literal["SUPERSEDED", "DELETED"] = "DELETED" if deletes else "SUPERSEDED"
    if shadow.preview and not current.preview:
        # A preview record names this live record, which no preview writer changes: to a
        # preview reader it is replaced or deleted all the same.
        return replace(
            current, status=status, replaced_by=shadow.memory_id if status == "SUPERSEDED" else None
        )
    return _as_changed(current, status, shadow, principal)


class MemoryWork:
    def __init__(self, pool: asyncpg.Pool, embedder: Embedder, writer: Writer) -> None:
        self.pool = pool
        self.embedder = embedder
        self.writer = writer
        self.embed_tokens: list[int] = []
        self._staged: list[UUID] = []  # rows this work staged, in order
        self._unstaged: list[NewRecord] = []  # rows `commit` inserts (add_many)
        self._changes: list[_Change] = []
        self._started = False
        self._pins = PinnedLists(writer.reader(), self.config, writer.is_operator)

    @property
    def config(self) -> MemoryConfig:
        return self.writer.action.harness.memory

    def _provenance(self) -> dict[str, Any]:
        """The fields of every record this work writes that its writer decides."""
        w = self.writer
        return {
            "account_id": w.account_id,
            "action_id": w.action.action_id,
            "action_version": w.action.version,
            "execution_id": w.execution_id,
            "invocation_number": w.invocation_number,
            "preview": w.preview,
            "modified_by": w.principal,
        }

    def _new_record(
        self, new: NewMemory, memory_id: UUID, checked: _Checked, embedding: Any
    ) -> NewRecord:
        """The row of a new record this work writes, with the writer's provenance."""
        return NewRecord(
            memory_id=memory_id,
            status="ACTIVE",
            summary=new.summary,
            content=new.content,
            kind=new.kind,
            pinned=new.pinned,
            replaces=new.replaces,
            source=new.source or self.writer.source,
            labels=checked.labels,
            metadata=checked.metadata,
            scope=checked.scope,
            session_id=checked.session_id,
            embedding=embedding,
            **self._provenance(),
        )

    async def add(self, new: NewMemory) -> list[MemoryRecord]:
        """Stages a record; returns the records written (the new one, and the one it replaces)."""
        w = self.writer
        checked = self._check(new)
        memory_id = uuid.uuid4()
        target: _Target | None = None
        async with self.pool.acquire() as conn:
            await self._start(conn)
            if new.replaces is not None:
                target = await self._target(conn, new.replaces)
                self._check_replaceable(target)
            if new.pinned:
                lines = {
                    pinned_in(checked.scope, checked.session_id): [pin_line(new.summary, memory_id)]
                }
                await self._pins.check(conn, lines, {new.replaces})
        # Embedded with no connection held: a remote embedder may take its time.
        embedded = await self.embedder.embed([memory_text(new.summary, new.content)])
        self.embed_tokens.append(embedded.tokens)
        row = self._new_record(new, memory_id, checked, embedded.vectors[0])
        async with self.pool.acquire() as conn:
            staged = store.record(await store.insert_staged(conn, row))
        self._staged.append(staged.memory_id)
        if target is None:
            return [staged]
        change = self._stage_change(target, "SUPERSEDED", staged, tombstone=False)
        if change.preview_of_live:
            return [staged]
        return [staged, _as_changed(target.current, "SUPERSEDED", staged, w.principal)]

    def _check(self, new: NewMemory, *, where: str | None = None) -> _Checked:
        """The checks of a new record that need no database: its label values by number, its
        metadata, scope and session. `where` (e.g. `inputs[17]`) prefixes each error with the
        input and field it is about."""
        config = self.config
        self._require_enabled()
        with _about(where, "summary"):
            check_summary(new.summary)
        with _about(where, "content"):
            check_content(new.content)
        with _about(where, "kind"):
            check_kind(config, new.kind)
        with _about(where, "labels"):
            labels = check_labels(config, new.labels)
        with _about(where, "metadata"):
            metadata = check_metadata(new.metadata)
        session_id = new.session_id if new.session_id is not None else self.writer.session_id
        with _about(where, "scope"):
            scope = self._scope(new.scope, session_id)
        if new.pinned and config.pinned_max_tokens is None:
            with _about(where, "pinned"):
                raise BadInput(
                    "nothing can be pinned: this agent has no harness.memory.pinned; "
                    "save the memory unpinned"
                )
        return _Checked(labels, metadata, scope, session_id)

    async def add_many(self, news: Sequence[NewMemory]) -> list[UUID]:
        """Checks many new records and embeds them in one call of the embedder; `commit`
        writes them, in its transaction, without staging them first (no turn reads them
        before). Returns their IDs in order. One invalid record refuses all: the error names
        its index and field (`inputs[17].summary: ...`), and nothing is kept.

        The same checks as `add`, one by one; then the ones needing the database at once."""
        w = self.writer
        checked = [self._check(new, where=f"inputs[{i}]") for i, new in enumerate(news)]
        ids = [uuid.uuid4() for _ in news]
        changes: list[_Change] = []
        seen: dict[UUID, int] = {}
        async with self.pool.acquire() as conn:
            await self._start(conn)
            for i, new in enumerate(news):
                if new.replaces is None:
                    continue
                with _about(f"inputs[{i}]", "replaces"):
                    if new.replaces in seen:
                        raise BadInput(
                            f"inputs[{seen[new.replaces]}] already replaces memory "
                            f"{new.replaces}; a record is replaced once"
                        )
                    seen[new.replaces] = i
                    target = await self._target(conn, new.replaces)
                    self._check_replaceable(target)
                changes.append(
                    _Change(
                        target=target.current.memory_id,
                        version=target.current.version,
                        status="SUPERSEDED",
                        by=ids[i],
                        preview_of_live=w.preview and not target.current.preview,
                        tombstone=False,
                    )
                )
            pins: dict[str | None, list[str]] = {}
            for new, c, memory_id in zip(news, checked, ids, strict=True):
                if new.pinned:
                    lines = pins.setdefault(pinned_in(c.scope, c.session_id), [])
                    lines.append(pin_line(new.summary, memory_id))
            if pins:
                replaced = {n.replaces for n in news if n.pinned and n.replaces is not None}
                await self._pins.check(conn, pins, replaced)
        # Embedded with no connection held: a remote embedder may take its time.
        embedded = await self.embedder.embed([memory_text(n.summary, n.content) for n in news])
        self.embed_tokens.append(embedded.tokens)
        self._unstaged.extend(
            self._new_record(*values)
            for values in zip(news, ids, checked, embedded.vectors, strict=True)
        )
        self._changes.extend(changes)
        return ids

    async def delete(self, memory_id: UUID, *, source: Source | None = None) -> MemoryRecord:
        """Stages a deletion; deleting a deleted record returns it unchanged."""
        w = self.writer
        self._require_enabled()
        async with self.pool.acquire() as conn:
            await self._start(conn)
            target = await self._target(conn, memory_id)
        current, shadow, effective = target.current, target.shadow, target.effective
        if effective.status == "DELETED":
            if shadow is not None and shadow.preview and not current.preview and target.deletes:
                return shadow  # the preview record that deleted this live record
            return effective
        if effective.status == "SUPERSEDED":
            raise BadInput(
                f"memory {memory_id} was replaced by memory {effective.replaced_by}; "
                "delete that record instead"
            )
        self._check_writable(effective)
        preview_of_live = w.preview and not current.preview
        # A tombstone: the deleted record's text and kind, unpinned, with no vector.
        row = NewRecord(
            memory_id=uuid.uuid4(),
            status="DELETED",
            replaces=memory_id,
            source=source or w.source,
            session_id=w.session_id,
            pinned=False,
            embedding=None,
            **{c: getattr(current, c) for c in _TOMBSTONE_COPIES},
            **self._provenance(),
        )
        async with self.pool.acquire() as conn:
            staged = store.record(await store.insert_staged(conn, row))
        self._staged.append(staged.memory_id)
        self._stage_change(target, "DELETED", staged, tombstone=not preview_of_live)
        return staged if preview_of_live else _as_changed(current, "DELETED", staged, w.principal)

    async def read(self, memory_id: UUID, *, version: int | None = None) -> MemoryRecord | None:
        """One record the writer can see, whatever its status (or an exact version)."""
        async with self.pool.acquire() as conn:
            target = await self._find(conn, memory_id)
            if target is None:
                return None
            if version is None or version == target.effective.version:
                return target.effective
            if version == target.current.version:
                return target.current
            row = await store.get_version(
                conn, self.writer.account_id, self.writer.action.action_id, memory_id, version
            )
        return store.record(row) if row else None

    async def pinned(self) -> list[MemoryRecord]:
        """The pinned records the writer reads, as every turn's instructions list them."""
        async with self.pool.acquire() as conn:
            rows = await store.list_pinned(conn, self.writer.reader())
        return [store.record(r) for r in rows]

    @property
    def idle(self) -> bool:
        """Whether `commit` has nothing to write."""
        return not self._staged and not self._unstaged

    async def commit(self, conn: asyncpg.Connection) -> list[MemoryRecord]:
        """Makes the staged changes visible in the caller's transaction; Conflict if stale."""
        if self.idle:
            return []
        w = self.writer
        account_id, action_id = w.account_id, w.action.action_id
        tombstones = [c.by for c in self._changes if c.tombstone]
        records = [m for m in self._staged if m not in tombstones]
        try:
            published = [
                store.record(r)
                for r in await store.publish(conn, account_id, action_id, w.execution_id, records)
            ]
            if len(published) != len(records):
                raise Conflict(
                    "this turn's staged memory records were discarded before it committed; "
                    "nothing was saved"
                )
            if self._unstaged:
                inserted = await store.insert_committed(conn, self._unstaged)
                published.extend(store.record(r) for r in inserted)
            changed: list[MemoryRecord] = []
            for change in self._changes:
                if change.preview_of_live:
                    unchanged = await store.lock_unchanged(
                        conn, account_id, action_id, change.target, change.version
                    )
                    if not unchanged:
                        raise Conflict(_changed_meanwhile(change.target))
                    continue
                row = await store.change_status(
                    conn,
                    account_id,
                    action_id,
                    change.target,
                    expected_version=change.version,
                    status=change.status,
                    replaced_by=change.by if change.status == "SUPERSEDED" else None,
                    modified_by=w.principal,
                )
                if row is None:
                    raise Conflict(_changed_meanwhile(change.target))
                changed.append(store.record(row))
            if tombstones:
                await store.delete_staged(conn, account_id, action_id, w.execution_id, tombstones)
            await self._pins.recount(conn, published, changed)
            await self._pins.recheck(conn, published)
        except asyncpg.UniqueViolationError:
            # Another writer committed a successor of a record this work replaces.
            targets = ", ".join(str(c.target) for c in self._changes)
            raise Conflict(_changed_meanwhile(targets)) from None
        except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError):
            raise Conflict(
                "memory records this turn changes were changed by another writer at the same "
                "time; nothing was saved: read them again and retry"
            ) from None
        self._staged.clear()
        self._unstaged.clear()
        self._changes.clear()
        return published + changed

    def mark(self) -> tuple[int, int, int]:
        """Where this work stands: `discard_since` drops what it stages after this."""
        return len(self._staged), len(self._unstaged), len(self._changes)

    async def discard_since(self, conn: asyncpg.Connection, mark: tuple[int, int, int]) -> None:
        """Drops, in the caller's transaction, what this work staged after `mark` (a memory
        review whose records the turn does not keep); what it staged before stays."""
        staged, unstaged, changes = mark
        w = self.writer
        if self._started:
            # Every row of this attempt but those staged before the mark: a staging insert cut
            # as its reply came (the turn's deadline) stored a row this work never listed.
            await store.delete_staged(
                conn,
                w.account_id,
                w.action.action_id,
                w.execution_id,
                keep=self._staged[:staged],
                invocation=w.invocation_number,
            )
        del self._staged[staged:], self._unstaged[unstaged:], self._changes[changes:]

    async def drop_restated(
        self, conn: asyncpg.Connection, mark: tuple[int, int, int]
    ) -> list[UUID]:
        """Drops, in the caller's transaction (a commit's, before `commit`), the records staged
        since `mark` that only add (replace and delete nothing) and whose summary a committed
        record this writer reads already says word for word: one another writer committed
        after this work checked (a memory review's exact duplicates, M12). Returns their IDs.
        Their summaries stay locked until the transaction ends, so of two commits adding the
        same at once the second finds the first's."""
        changing = {c.by for c in self._changes}
        added = [m for m in self._staged[mark[0] :] if m not in changing]
        restated = await store.restated_staged(conn, self.writer.reader(), added)
        if restated:
            w = self.writer
            await store.delete_staged(
                conn, w.account_id, w.action.action_id, w.execution_id, restated
            )
            self._staged = [m for m in self._staged if m not in restated]
        return restated

    async def discard(self) -> None:
        """Drops whatever this work staged (a failed turn leaves no memory).

        Every row its execution staged goes, earlier attempts' included, but not a later
        attempt's: a turn found ended is dropped by another turn, and may be retried
        meanwhile.
        """
        w = self.writer
        async with self.pool.acquire() as conn:
            await store.delete_staged(
                conn,
                w.account_id,
                w.action.action_id,
                w.execution_id,
                through_invocation=w.invocation_number,
            )
        self._staged.clear()
        self._unstaged.clear()
        self._changes.clear()

    def _require_enabled(self) -> None:
        if not self.config.enabled:
            raise BadInput("memory is not enabled for this agent (harness.memory.enabled is false)")

    async def _start(self, conn: asyncpg.Connection) -> None:
        """A retried turn first drops what its failed attempts staged and never committed."""
        if not self._started and self.writer.invocation_number > 1:
            w = self.writer
            await store.delete_earlier_attempts(
                conn, w.account_id, w.action.action_id, w.execution_id, w.invocation_number
            )
        self._started = True

    def _scope(self, requested: Scope | None, session_id: str | None) -> Scope:
        w, config = self.writer, self.config
        if requested is not None and requested not in tuple(Scope):
            raise BadInput(f"scope must be SESSION or AGENT, got {requested!r}")
        if w.is_operator:
            # Operators choose either scope; the agent's write scopes restrain only the agent.
            scope = Scope(requested or (Scope.SESSION if session_id is not None else Scope.AGENT))
            if scope == Scope.SESSION and session_id is None:
                raise BadInput(
                    "a SESSION record needs the sessionId of the session that recalls it"
                )
            if scope not in config.read:
                refusal = (
                    f"this agent never recalls {scope} records: its harness.memory.scope.read "
                    f"is {as_harness(config.read)}"
                )
                if requested is None:
                    # The scope came from the sessionId, given or not: say so, or the refusal
                    # names a scope the caller never asked for.
                    refusal = (
                        f"a record without a sessionId is AGENT-scoped, and {refusal}; give the "
                        "sessionId of the session that recalls it"
                        if session_id is None
                        else f"a record with a sessionId is SESSION-scoped unless its scope says "
                        f"AGENT, and {refusal}; give scope AGENT"
                    )
                raise BadInput(refusal)
            return scope
        if requested == Scope.AGENT:
            if Scope.AGENT not in config.write:
                raise BadInput(
                    "scope AGENT is not allowed: this agent writes only session scope "
                    "(harness.memory.scope.write); leave scope out to save it for this session"
                )
            return Scope.AGENT
        if requested == Scope.SESSION:
            if Scope.SESSION not in config.write:
                raise BadInput(
                    "scope SESSION is not allowed: this agent writes only agent scope "
                    "(harness.memory.scope.write); leave scope out"
                )
            if session_id is None:
                raise BadInput(NO_SESSION)
            return Scope.SESSION
        if Scope.SESSION in config.write and session_id is not None:
            return Scope.SESSION
        if Scope.AGENT in config.write:
            return Scope.AGENT
        raise BadInput(NO_SESSION)

    def scope_of(self, requested: Scope | None) -> Scope | None:
        """The scope a record this work adds with `requested` (None: the default) would have;
        None when it would be refused."""
        try:
            return self._scope(requested, self.writer.session_id)
        except BadInput:
            return None

    def _target_reader(self, *, writing: bool) -> Reader:
        """Whose records a call finds: an operator every record; an agent those of the scopes
        it reads and, `writing` (a deletion or a replacement, which reach the scopes it
        writes), of the scopes it writes too, even one it does not read, so that it can still
        delete what it wrote there. `_check_writable` then refuses a record of a scope it
        only reads, with a message that says so."""
        w = self.writer
        if w.is_operator:
            return OperatorReader(w.account_id, w.action.action_id)
        return w.reader(writing=writing)

    async def _find(
        self, conn: asyncpg.Connection, memory_id: UUID, *, writing: bool = False
    ) -> _Target | None:
        reader = self._target_reader(writing=writing)
        row = await store.get_visible(conn, reader, memory_id)
        if row is None:
            return None
        current = store.record(row)
        shadow, deletes = None, False
        if isinstance(reader, AgentReader):
            shadow_row = await store.get_shadow(conn, reader, memory_id)
            if shadow_row is not None:
                shadow, deletes = store.record(shadow_row), shadow_row["tombstone"]
        effective = _effective(current, shadow, deletes, self.writer.principal)
        return _Target(current, shadow, deletes, effective)

    async def _target(self, conn: asyncpg.Connection, memory_id: UUID) -> _Target:
        found = await self._find(conn, memory_id, writing=True)
        if found is None:
            raise NotFound(
                f"no memory {memory_id} is visible to this agent: check the ID "
                "(another session's session-scope records are never visible)"
                if not self.writer.is_operator
                else f"memory {memory_id} of agent {self.writer.action.action_id} not found"
            )
        return found

    def _check_writable(self, record: MemoryRecord) -> None:
        """Spec: the agent reaches only the scopes it writes."""
        write = self.config.write
        if not self.writer.is_operator and record.scope not in write:
            raise BadInput(
                f"memory {record.memory_id} has {record.scope} scope, which this agent does not "
                f"write (harness.memory.scope.write is {as_harness(write)}): it can neither "
                "replace nor "
                "delete it"
            )

    def _check_replaceable(self, target: _Target) -> None:
        record = target.effective
        if record.status == "SUPERSEDED":
            raise BadInput(
                f"memory {record.memory_id} was already replaced by memory {record.replaced_by}; "
                "replace that record instead"
            )
        if record.status == "DELETED":
            raise BadInput(
                f"memory {record.memory_id} is deleted and cannot be replaced; add the memory "
                "without replaces"
            )
        self._check_writable(record)
        if self.writer.is_operator and record.preview:
            raise BadInput(
                f"memory {record.memory_id} was written by a turn in preview mode; a live record "
                "cannot replace it (delete it instead)"
            )

    def _stage_change(
        self,
        target: _Target,
        status: Literal["SUPERSEDED", "DELETED"],
        by: MemoryRecord,
        *,
        tombstone: bool,
    ) -> _Change:
        change = _Change(
            target=target.current.memory_id,
            version=target.current.version,
            status=status,
            by=by.memory_id,
            preview_of_live=self.writer.preview and not target.current.preview,
            tombstone=tombstone,
        )
        self._changes.append(change)
        return change


def _changed_meanwhile(target: object) -> str:
    return (
        f"memory {target} changed meanwhile: another turn or an operator replaced or deleted it "
        "after this turn read it. Nothing was saved; read it again and decide anew"
    )


@contextmanager
def _about(where: str | None, field: str) -> Iterator[None]:
    """Names the input and field an error is about (`inputs[17].summary: ...`), when given."""
    try:
        yield
    except DomainError as e:
        if where is None:
            raise
        raise type(e)(f"{where}.{field}: {e.message}") from None
