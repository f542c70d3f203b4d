"""Pinned lists and their budget (harness.memory.pinned.max_tokens): how many tokens the list
of pins a turn's instructions hold may reach, and what a pin that would take one over is told.

A session's turns list its own pins and the agent-scope ones; an agent-scope pin so joins every
session's list, and the one it would take over may be another session's. Pins are checked as
they are staged (`PinnedLists.check`), and again as their turn commits, with the pins other
turns committed meanwhile (`PinnedLists.recheck`): the budget holds once committed.
"""

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from uuid import UUID

import asyncpg

from app.actions.harness import MemoryConfig
from app.errors import BadInput, Conflict
from app.memory import store
from app.memory.records import MemoryRecord, Scope, pinned_tokens
from app.memory.visibility import AgentReader
from app.text import CHARS_PER_TOKEN


class OverPinBudget(BadInput):
    """A pin the agent's pinned list has no room for (harness.memory.pinned.max_tokens)."""


def pinned_in(scope: str, session_id: str | None) -> str | None:
    """The pinned list a pin joins: its session's; None for an agent-scope pin (every list)."""
    return None if scope == Scope.AGENT.value else session_id


@dataclass(frozen=True)
class _PinnedList:
    """A pinned list as a turn would read it with the new pins: its tokens, its records (less
    those replaced), and whose list it is (a session's, or None: the agent's alone)."""

    tokens: int
    pins: list[MemoryRecord]
    session_id: str | None


@dataclass(frozen=True)
class PinnedLists:
    """One writer's pinned lists: `reader` is how it reads (its session, its read scopes, its
    own staged rows), `config` its agent's memory settings (the budget, and the scopes it
    writes, which a refusal's advice names), `is_operator` whether an operator writes (told
    the pins of any list; an agent only those it reads)."""

    reader: AgentReader
    config: MemoryConfig
    is_operator: bool

    async def check(
        self,
        conn: asyncpg.Connection,
        lines: Mapping[str | None, Sequence[str]],
        replaced: Set[UUID | None],
    ) -> None:
        """Refuses new pins (OverPinBudget) that would take a list they join over the budget.
        `lines`: the new pins' lines by the list they join (`pinned_in`); `replaced`: the
        records they replace, which no list holds any more."""
        budget = self.config.pinned_max_tokens
        assert budget is not None
        longest = await _longest_list(conn, self.reader, lines, replaced)
        if longest.tokens > budget:
            raise OverPinBudget(self._over_budget(longest, budget))

    async def recount(
        self, conn: asyncpg.Connection, published: list[MemoryRecord], changed: list[MemoryRecord]
    ) -> None:
        """Counts again the pinned lists of the sessions a commit changes
        (`store.count_pinned_lists`): its pinned session-scope records, new, replaced or
        deleted, and the records its preview records replace or delete, which preview turns no
        longer list."""
        ids = [r.memory_id for r in (*published, *changed) if r.pinned and r.scope == Scope.SESSION]
        ids += [r.replaces for r in published if r.preview and r.replaces is not None]
        if ids:
            await store.count_pinned_lists(conn, self.reader.account_id, self.reader.action_id, ids)

    async def recheck(self, conn: asyncpg.Connection, published: list[MemoryRecord]) -> None:
        """Pins other turns committed meanwhile count too: the budget holds once committed."""
        budget = self.config.pinned_max_tokens
        if budget is None or not any(r.pinned for r in published):
            return
        await store.lock_pins(conn, self.reader.account_id, self.reader.action_id)
        committed = replace(self.reader, execution_id=None, invocation_number=None)
        lists: dict[str | None, list[str]] = {
            pinned_in(r.scope, r.session_id): [] for r in published if r.pinned
        }
        longest = await _longest_list(conn, committed, lists)
        if longest.tokens > budget:
            raise Conflict(
                "other turns pinned memories meanwhile; nothing was saved. "
                + self._over_budget(longest, budget)
            )

    def _over_budget(self, longest: _PinnedList, budget: int) -> str:
        """What a refused pin is told. An agent whose agent-scope pin would take another
        session's list over is told so, and shown only the pins it reads: that session's own
        are no more its business than their text (spec: what one session learns never reaches
        another)."""
        session_id = self.reader.session_id
        over = (
            f"over this agent's budget of {budget} (harness.memory.pinned.max_tokens, about "
            f"{CHARS_PER_TOKEN} characters a token)"
        )
        if self.is_operator or longest.session_id in (None, session_id):
            pinned = ", ".join(str(r.memory_id) for r in longest.pins) or "none"
            return (
                f"pinning this memory would take the pinned list to about {longest.tokens} "
                f"tokens, {over}. Consolidate: {self._consolidate('pinned memories')}; or "
                f"save this memory unpinned. Pinned now: {pinned}"
            )
        agent_pins = [r for r in longest.pins if r.scope == Scope.AGENT.value]
        pinned = ", ".join(str(r.memory_id) for r in agent_pins) or "none"
        alone = (
            "pin it for this session alone (scope SESSION); "
            if Scope.SESSION in self.config.write and session_id is not None
            else ""
        )
        return (
            "an agent-scope pin is listed in every session's turns, with that session's own "
            f"pins, and this one would take another session's pinned list to about "
            f"{longest.tokens} tokens, {over}. Consolidate the agent-scope pins: "
            f"{self._consolidate('agent-scope pins')}; or {alone}or save this memory unpinned. "
            f"Agent-scope pins now: {pinned}"
        )

    def _consolidate(self, pins: str) -> str:
        """How to fold several pins into one, in an order that works: a new pin replacing one
        of them is counted with the others, so they are unpinned first (by the means the
        writer has: an agent without delete_memory replaces each with an unpinned record)."""
        unpin = "replace each with an unpinned record (replaces naming it, pinned false)"
        if self.is_operator or "delete_memory" in self.config.tools:
            unpin = "delete them, or " + unpin
        return (
            f"first unpin all but one of the {pins} you fold together ({unpin}), then add one "
            "pinned memory that says what they all said, with replaces naming the one left"
        )


async def _longest_list(
    conn: asyncpg.Connection,
    reader: AgentReader,
    lines: Mapping[str | None, Sequence[str]],
    replaced: Set[UUID | None] = frozenset(),
) -> _PinnedList:
    """The longest pinned list that new pins join, with their lines. `lines`: the
    new pins' lines by the list they join (`pinned_in`): a session's, or None for agent-scope
    pins, which every list lists. The lists: each named session's (the pins its turns read,
    less `replaced`, with the lines it gains), or the reader's own when none is named (its
    session's, or the agent's alone); with agent-scope pins, when turns read session scope,
    every other session's too (the agent's pins with that session's own), of which one
    statement reads the longest (`store.other_sessions_pins`)."""
    everywhere = list(lines.get(None, ()))
    sessions: list[str | None] = [s for s in lines if s is not None] or [reader.session_id]
    lists: list[tuple[list[MemoryRecord], list[str], str | None]] = []
    for session in sessions:
        rows = await store.list_pinned(conn, replace(reader, session_id=session))
        pins = [r for r in map(store.record, rows) if r.memory_id not in replaced]
        own = lines.get(session, ()) if session is not None else ()
        lists.append((pins, [*everywhere, *own], session))
    if None in lines and Scope.SESSION in reader.scopes:
        agent = [r for r in lists[0][0] if r.scope == Scope.AGENT.value]
        others: dict[str, list[MemoryRecord]] = {}
        named = [s for s in sessions if s is not None]
        for row in await store.other_sessions_pins(conn, reader, named):
            others.setdefault(row["session_id"], []).append(store.record(row))
        lists += [(agent + own, everywhere, session) for session, own in others.items()]
    counted = [
        _PinnedList(pinned_tokens([*(r.pinned_line() for r in pins), *new]), pins, session)
        for pins, new, session in lists
    ]
    return max(counted, key=lambda c: c.tokens)
