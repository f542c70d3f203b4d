"""The record store (app/memory/service.py): every rule a write, read or delete obeys, staging
and commit, visibility by agent, session, scope and preview, pins, and concurrent writers."""

import asyncio
import json

import asyncpg
import numpy as np
import pytest
from factories import (
    allow,
    caller,
    commit,
    forget,
    full_memory,
    listed,
    make_account,
    make_agent,
    remember,
    work,
    writer,
)

from app.errors import BadInput, Conflict, NotFound
from app.memory import operator, store
from app.memory.records import pinned_tokens
from app.memory.service import MemoryWork, NewMemory
from app.memory.vectors import memory_text
from app.memory.visibility import OperatorReader
from app.scope import Scope

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")


@pytest.fixture
async def agent(state, admin):
    return await make_agent(state, admin)


async def count_rows(state, agent) -> tuple[int, int]:
    """(rows of agent_memories, rows of agent_memory_versions) of the agent."""
    async with state.pool.acquire() as conn:
        rows = await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE action_id = $1", agent.action_id
        )
        versions = await conn.fetchval(
            "SELECT count(*) FROM agent_memory_versions WHERE action_id = $1", agent.action_id
        )
    return rows, versions


async def versions_of(state, record) -> list[tuple[int, str]]:
    async with state.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT version, status FROM agent_memory_versions WHERE memory_id = $1 "
            "ORDER BY version",
            record.memory_id,
        )
    return [(r["version"], r["status"]) for r in rows]


async def operator_sees(state, agent, memory_id):
    async with state.pool.acquire() as conn:
        row = await store.get_visible(
            conn, OperatorReader(agent.account_id, agent.action_id), memory_id
        )
    return store.record(row) if row else None


# --- M33 summary and content ------------------------------------------------------------------


# M33
@pytest.mark.parametrize(
    "summary", ["two\nlines", "carriage\rreturn", "para\u2028graph", "", "   "]
)
async def test_m33_summary_is_one_non_empty_line(state, agent, summary):
    unit = work(state, writer(agent))
    with pytest.raises(BadInput, match="summary"):
        await unit.add(NewMemory(summary=summary, kind="fact"))
    assert await count_rows(state, agent) == (0, 0)  # M47: a refused call changes nothing


# M33
async def test_m33_summary_at_most_512_bytes_utf8(state, agent):
    fits = "é" * 256  # 512 bytes, 256 characters
    record = await remember(state, agent, fits)
    assert record.summary == fits
    unit = work(state, writer(agent))
    with pytest.raises(BadInput, match="513 bytes; at most 512"):
        await unit.add(NewMemory(summary=fits + "a", kind="fact"))


# M33
async def test_m33_content_at_most_16_kib_and_empty_by_default(state, agent):
    assert (await remember(state, agent, "no content")).content == ""
    full = "€" * (16 * 1024 // 3) + "x"  # 16,384 bytes
    assert len(full.encode()) == 16 * 1024
    assert (await remember(state, agent, "full", content=full)).content == full
    unit = work(state, writer(agent))
    with pytest.raises(BadInput, match="content is 16385 bytes"):
        await unit.add(NewMemory(summary="too much", kind="fact", content=full + "y"))


# --- M34 kinds, M35-M37 labels ----------------------------------------------------------------


# M34
async def test_m34_kind_is_one_of_the_agents_kinds(state, admin, agent):
    for kind in ("guidance", "fact", "event", "reference"):
        assert (await remember(state, agent, f"a {kind}", kind=kind)).kind == kind
    with pytest.raises(BadInput, match="guidance, fact, event, reference"):
        await work(state, writer(agent)).add(NewMemory(summary="x", kind="opinion"))
    custom = await make_agent(
        state, admin, name="custom", harness=full_memory(kinds=["preference"])
    )
    assert (await remember(state, custom, "likes tea", kind="preference")).kind == "preference"
    with pytest.raises(BadInput, match="kinds: preference"):
        await work(state, writer(custom)).add(NewMemory(summary="x", kind="fact"))


# M35 M37
async def test_m35_m37_labels_by_name_or_number_stored_by_number(state, agent):
    record = await remember(
        state, agent, "refund promised", labels={"customer_id": " c-1 ", 7: "T-9"}
    )
    assert record.labels == {5: " c-1 ", 7: "T-9"}  # exact values, untrimmed
    again = await remember(state, agent, "by number as text", labels={"5": "c-2"})
    assert again.labels == {5: "c-2"}
    async with state.pool.acquire() as conn:
        stored = await conn.fetchval(
            "SELECT labels FROM agent_memories WHERE memory_id = $1", record.memory_id
        )
    assert stored == {"5": " c-1 ", "7": "T-9"}


# M35
async def test_m35_undeclared_label_refused_naming_the_declared_ones(state, admin, agent):
    unit = work(state, writer(agent))
    with pytest.raises(
        BadInput, match=r"'region' is not declared.*customer_id \(number 5\), ticket"
    ):
        await unit.add(NewMemory(summary="x", kind="fact", labels={"region": "eu"}))
    with pytest.raises(BadInput, match="not declared"):
        await unit.add(NewMemory(summary="x", kind="fact", labels={6: "eu"}))
    bare = await make_agent(state, admin, name="bare", harness=full_memory(labels={}))
    with pytest.raises(BadInput, match="declares no labels"):
        await work(state, writer(bare)).add(NewMemory(summary="x", kind="fact", labels={5: "a"}))


# M35
@pytest.mark.parametrize("key", ["²", "①", "٥"])
async def test_m35_a_label_key_of_non_ascii_digits_is_refused_as_undeclared(state, agent, key):
    # str.isdigit holds for "²" and "①", which int() cannot read: that was an internal error.
    with pytest.raises(BadInput, match="is not declared by this agent"):
        await work(state, writer(agent)).add(NewMemory(summary="x", kind="fact", labels={key: "a"}))


# M37
@pytest.mark.parametrize("value", ["", 5, None, True])
async def test_m37_label_values_are_non_empty_strings(state, agent, value):
    with pytest.raises(BadInput, match="customer_id needs an exact, non-empty string"):
        await work(state, writer(agent)).add(
            NewMemory(summary="x", kind="fact", labels={"customer_id": value})
        )


# M35
async def test_m35_label_given_twice_refused(state, agent):
    with pytest.raises(BadInput, match="given twice"):
        await work(state, writer(agent)).add(
            NewMemory(summary="x", kind="fact", labels={"customer_id": "a", 5: "b"})
        )


# M59
async def test_m59_a_new_record_was_modified_when_it_was_created(state, agent):
    # Both from one reading of the clock: two readings in a row fell in different microseconds
    # now and then (one insert in ten or so), and the record said it had changed since.
    unit = work(state, writer(agent))
    for i in range(60):
        await unit.add(NewMemory(summary=f"fact {i}", kind="fact"))
    await commit(state, unit)
    rows = await state.pool.fetch(
        "SELECT created, modified FROM agent_memories WHERE action_id = $1", agent.action_id
    )
    assert len(rows) == 60 and all(r["created"] == r["modified"] for r in rows)
    versions = await state.pool.fetch(
        "SELECT created, modified FROM agent_memory_versions WHERE action_id = $1",
        agent.action_id,
    )
    assert len(versions) == 60 and all(r["created"] == r["modified"] for r in versions)


# --- M1, M6-M9 scope --------------------------------------------------------------------------


# M1
async def test_m1_memory_off_unless_enabled(state, admin):
    off = await make_agent(state, admin, name="off", harness=full_memory(enabled=False))
    unit = work(state, writer(off))
    with pytest.raises(BadInput, match="not enabled"):
        await unit.add(NewMemory(summary="x", kind="fact"))
    assert await count_rows(state, off) == (0, 0)


# M6 M8
async def test_m6_m8_session_scope_by_default(state, admin):
    defaults = await actions_with(state, admin, {"memory": {"enabled": True}})
    assert defaults.harness.memory.read == (Scope.SESSION,)
    assert defaults.harness.memory.write == (Scope.SESSION,)
    record = await remember(state, defaults, "default scope")
    assert record.scope == "SESSION" and record.session_id == "s1"
    both = await make_agent(state, admin, name="both")
    assert (await remember(state, both, "unless agent is chosen")).scope == "SESSION"


# M7
async def test_m5_m7_scope_write_decides_what_is_written_agent_only_if_named(state, admin):
    session_only = await make_agent(
        state,
        admin,
        name="s",
        harness=full_memory(scope={"read": ["session", "agent"], "write": ["session"]}),
    )
    with pytest.raises(BadInput, match="scope AGENT is not allowed"):
        await work(state, writer(session_only)).add(
            NewMemory(summary="x", kind="fact", scope="AGENT")
        )
    both = await make_agent(state, admin, name="b")
    chosen = await remember(state, both, "for every session", scope="AGENT")
    assert chosen.scope == "AGENT" and chosen.session_id == "s1"  # the session that wrote it


# M6 M7 M5
async def test_m6_m7_an_agent_writing_agent_scope_alone_never_writes_session_scope(state, admin):
    """In a session, an agent whose scope.write is ["agent"] writes agent scope by default (M6:
    session scope only when write includes session), and may not choose session scope (M5:
    write is what the agent may write)."""
    agent_only = await make_agent(
        state,
        admin,
        name="a",
        harness=full_memory(scope={"read": ["session", "agent"], "write": ["agent"]}),
    )
    record = await remember(state, agent_only, "for every session", session="s1")
    assert record.scope == "AGENT" and record.session_id == "s1"
    with pytest.raises(BadInput, match="scope SESSION is not allowed"):
        await work(state, writer(agent_only, session="s1")).add(
            NewMemory(summary="x", kind="fact", scope="SESSION")
        )
    assert await count_rows(state, agent_only) == (1, 1)


# M9
async def test_m9_writer_without_session_writes_agent_scope_only(state, admin):
    sessionless = await make_agent(
        state, admin, name="n", harness=full_memory(scope={"read": ["agent"], "write": ["agent"]})
    )
    record = await remember(state, sessionless, "no session", session=None)
    assert record.scope == "AGENT" and record.session_id is None
    misconfigured = await make_agent(state, admin, name="m")  # write includes session
    with pytest.raises(BadInput, match="has no session scope"):
        await work(state, writer(misconfigured, session=None)).add(
            NewMemory(summary="x", kind="fact", scope="SESSION")
        )
    session_only = await actions_with(state, admin, {"memory": {"enabled": True}})
    with pytest.raises(BadInput, match='must be {"read": \\["agent"\\], "write": \\["agent"\\]}'):
        await work(state, writer(session_only, session=None)).add(
            NewMemory(summary="x", kind="fact")
        )


async def actions_with(state, admin, harness):
    from app.actions import service

    return await service.create_action(
        state.pool, admin, name="plain", instructions="", model=None, harness=harness
    )


# --- M3, M4, M5, M2 visibility ----------------------------------------------------------------


# M3
async def test_m3_session_record_only_in_its_own_session(state, agent):
    record = await remember(state, agent, "account 42 is overdue", session="s1")
    other = writer(agent, session="s2")
    assert record.memory_id in await listed(state, writer(agent, session="s1"))
    assert record.memory_id not in await listed(state, other)
    assert await work(state, other).read(record.memory_id) is None
    with pytest.raises(NotFound):
        await work(state, other).delete(record.memory_id)
    with pytest.raises(NotFound):
        await work(state, other).add(NewMemory(summary="y", kind="fact", replaces=record.memory_id))


# M4
async def test_m4_agent_record_seen_by_every_session_that_reads_agent(state, admin, agent):
    record = await remember(state, agent, "office closes at 5", scope="AGENT", session="s1")
    for session in ("s1", "s2", "s3"):
        assert record.memory_id in await listed(state, writer(agent, session=session))
    assert record.memory_id in await listed(state, writer(agent, session=None))


# M5
async def test_m5_read_scopes_decide_what_is_seen(state, admin):
    agent = await make_agent(state, admin, name="r")
    agent_rec = await remember(state, agent, "agent wide", scope="AGENT")
    session_rec = await remember(state, agent, "session only")
    from app.actions import service

    async def reading_only(scope: str):
        """The agent's next version, reading and writing records of `scope` only."""
        memory = {
            "enabled": True,
            "scope": {"read": [scope], "write": [scope]},
            "labels": agent.harness.raw["memory"]["labels"],
        }
        return await service.update_action(
            state.pool,
            admin,
            action_id=agent.action_id,
            name="r",
            instructions="",
            model=None,
            harness={"memory": memory},
        )

    session_reader = await reading_only("session")
    seen = await listed(state, writer(session_reader))
    assert session_rec.memory_id in seen and agent_rec.memory_id not in seen
    assert await work(state, writer(session_reader)).read(agent_rec.memory_id) is None
    agent_reader = await reading_only("agent")
    seen = await listed(state, writer(agent_reader))
    assert agent_rec.memory_id in seen and session_rec.memory_id not in seen


# M2
async def test_m2_no_agent_sees_another_agents_records(state, admin, agent):
    record = await remember(state, agent, "private to the first agent", scope="AGENT")
    second = await make_agent(state, admin, name="second")
    intruder = writer(second, session="s1")
    assert await listed(state, intruder) == []
    assert await work(state, intruder).read(record.memory_id) is None
    with pytest.raises(NotFound):
        await work(state, intruder).delete(record.memory_id)
    with pytest.raises(NotFound):
        await work(state, intruder).add(
            NewMemory(summary="x", kind="fact", replaces=record.memory_id)
        )
    tenant = caller(await make_account(state), EVERYTHING)
    foreign = await make_agent(state, tenant, name="foreign")
    assert await work(state, writer(foreign)).read(record.memory_id) is None
    assert (await operator_sees(state, agent, record.memory_id)).summary == record.summary


# --- M42 replaces -----------------------------------------------------------------------------


# M42
async def test_m42_replaces_supersedes_at_commit_in_the_same_transaction(state, agent):
    old = await remember(state, agent, "customer prefers email")
    unit = work(state, writer(agent))
    new, replaced = await unit.add(
        NewMemory(summary="customer prefers phone", kind="fact", replaces=old.memory_id)
    )
    assert new.replaces == old.memory_id and new.version == 1
    assert replaced.status == "SUPERSEDED" and replaced.replaced_by == new.memory_id
    assert replaced.version == 2
    # Staged: nobody else sees the change yet; the writer already reads it.
    assert (await operator_sees(state, agent, old.memory_id)).status == "ACTIVE"
    assert old.memory_id in await listed(state, writer(agent))
    assert old.memory_id not in await listed(state, unit.writer)
    assert (await unit.read(old.memory_id)).status == "SUPERSEDED"

    written = await commit(state, unit)
    assert {(r.memory_id, r.status) for r in written} == {
        (new.memory_id, "ACTIVE"),
        (old.memory_id, "SUPERSEDED"),
    }
    after = await operator_sees(state, agent, old.memory_id)
    assert after.status == "SUPERSEDED" and after.replaced_by == new.memory_id
    assert after.version == 2 and after.modified_by == unit.writer.principal
    assert await versions_of(state, old) == [(1, "ACTIVE"), (2, "SUPERSEDED")]
    assert await versions_of(state, new) == [(1, "ACTIVE")]
    seen = await listed(state, writer(agent))
    assert new.memory_id in seen and old.memory_id not in seen


# M42
async def test_m42_replaced_record_must_be_active_and_writable(state, admin, agent):
    old = await remember(state, agent, "v1")
    newer = await remember(state, agent, "v2", replaces=old.memory_id)
    with pytest.raises(BadInput, match=f"already replaced by memory {newer.memory_id}"):
        await work(state, writer(agent)).add(
            NewMemory(summary="v3", kind="fact", replaces=old.memory_id)
        )
    gone = await remember(state, agent, "to delete")
    await forget(state, agent, gone.memory_id)
    with pytest.raises(BadInput, match="is deleted"):
        await work(state, writer(agent)).add(
            NewMemory(summary="x", kind="fact", replaces=gone.memory_id)
        )
    # An agent that writes only session scope reads an agent-scope record it cannot replace.
    narrow = await make_agent(
        state,
        admin,
        name="narrow",
        harness=full_memory(scope={"read": ["session", "agent"], "write": ["session"]}),
    )
    seeded = await seed(state, admin, narrow, "agent-wide fact", scope="AGENT")
    with pytest.raises(BadInput, match="AGENT scope, which this agent does not write"):
        await work(state, writer(narrow)).add(
            NewMemory(summary="x", kind="fact", replaces=seeded.memory_id)
        )


async def seed(state, admin, agent, summary, **options):
    view = await operator.add_memory(
        state.pool,
        state.embedder,
        admin,
        action_id=agent.action_id,
        memory=operator.OperatorMemory(
            summary=summary, kind=options.pop("kind", "fact"), **options
        ),
    )
    return view.record


# --- M17 staging, discard ---------------------------------------------------------------------


# M17
async def test_m17_staged_writes_are_invisible_to_others_until_commit(state, agent):
    unit = work(state, writer(agent))
    (staged,) = await unit.add(NewMemory(summary="staged", kind="fact", pinned=False))
    assert staged.memory_id in await listed(state, unit.writer)
    assert (await unit.read(staged.memory_id)).summary == "staged"
    same_session = writer(agent)
    assert staged.memory_id not in await listed(state, same_session)
    assert await work(state, same_session).read(staged.memory_id) is None
    assert await operator_sees(state, agent, staged.memory_id) is None
    assert (
        await operator.list_memories(
            state.pool,
            caller(agent.account_id, EVERYTHING),
            action_id=agent.action_id,
            limit=10,
            after=None,
            ascending=False,
        )
        == []
    )
    await commit(state, unit)
    assert staged.memory_id in await listed(state, same_session)


# M17
async def test_m17_discard_leaves_nothing(state, agent):
    kept = await remember(state, agent, "kept")
    before = await count_rows(state, agent)
    unit = work(state, writer(agent))
    await unit.add(NewMemory(summary="dropped", kind="fact"))
    await unit.add(NewMemory(summary="replacer", kind="fact", replaces=kept.memory_id))
    await unit.discard()
    assert await count_rows(state, agent) == before
    unit = work(state, writer(agent))
    await unit.delete(kept.memory_id)
    await unit.discard()
    assert await count_rows(state, agent) == before
    assert (await operator_sees(state, agent, kept.memory_id)).status == "ACTIVE"
    assert await versions_of(state, kept) == [(1, "ACTIVE")]


# M17
async def test_m17_a_turn_that_rolls_back_leaves_no_record(state, agent):
    old = await remember(state, agent, "old")
    unit = work(state, writer(agent))
    (new, _) = await unit.add(NewMemory(summary="new", kind="fact", replaces=old.memory_id))
    with pytest.raises(RuntimeError):
        async with state.pool.acquire() as conn, conn.transaction():
            await unit.commit(conn)
            raise RuntimeError("the turn failed after its memory was committed")
    await unit.discard()
    assert await operator_sees(state, agent, new.memory_id) is None
    assert (await operator_sees(state, agent, old.memory_id)).status == "ACTIVE"
    assert await count_rows(state, agent) == (1, 1)


async def test_a_retry_never_sees_what_a_failed_attempt_staged(state, agent):
    first = writer(agent, invocation=1)
    (orphan,) = await work(state, first).add(
        NewMemory(summary="from the failed attempt", kind="fact")
    )
    retry = writer(agent, execution_id=first.execution_id, invocation=2)
    assert orphan.memory_id not in await listed(state, retry)
    unit = work(state, retry)
    assert await unit.read(orphan.memory_id) is None
    (mine,) = await unit.add(NewMemory(summary="from the retry", kind="fact"))
    await commit(state, unit)
    assert await count_rows(state, agent) == (1, 1)  # the failed attempt's row is gone
    assert (await operator_sees(state, agent, mine.memory_id)).summary == "from the retry"


async def test_dropping_an_ended_attempt_keeps_what_a_retry_begun_meanwhile_staged(state, agent):
    """Another turn drops what a turn found ended had staged; if that turn was retried in the
    meantime, the retry's rows are its own and stay."""
    first = writer(agent, invocation=1)
    await work(state, first).add(NewMemory(summary="from the failed attempt", kind="fact"))
    unit = work(state, writer(agent, execution_id=first.execution_id, invocation=2))
    (mine,) = await unit.add(NewMemory(summary="from the retry", kind="fact"))
    await work(state, first).discard()  # as `_discard_ended` does, having read it ended
    await commit(state, unit)
    assert (await operator_sees(state, agent, mine.memory_id)).summary == "from the retry"
    assert await count_rows(state, agent) == (1, 1)


# --- M43 read, M44/M58 delete -----------------------------------------------------------------


# M43
async def test_m43_read_any_status_or_an_exact_version(state, agent):
    old = await remember(state, agent, "v1 summary")
    new = await remember(state, agent, "v2 summary", replaces=old.memory_id)
    reader = work(state, writer(agent))
    current = await reader.read(old.memory_id)
    assert current.status == "SUPERSEDED" and current.version == 2
    assert current.replaced_by == new.memory_id
    first = await reader.read(old.memory_id, version=1)
    assert first.status == "ACTIVE" and first.version == 1 and first.replaced_by is None
    assert await reader.read(old.memory_id, version=3) is None
    await forget(state, agent, new.memory_id)
    assert (await reader.read(new.memory_id)).status == "DELETED"


# M44
async def test_m44_delete_writes_a_deleted_version_by_the_writer(state, agent):
    record = await remember(state, agent, "wrong fact")
    unit = work(state, writer(agent, principal="action:deleter"))
    deleted = await unit.delete(record.memory_id)
    assert deleted.status == "DELETED" and deleted.version == 2
    assert deleted.modified_by == "action:deleter"
    assert (await unit.read(record.memory_id)).status == "DELETED"
    assert record.memory_id not in await listed(state, unit.writer)
    assert (await operator_sees(state, agent, record.memory_id)).status == "ACTIVE"
    await commit(state, unit)
    stored = await operator_sees(state, agent, record.memory_id)
    assert (stored.status, stored.version, stored.modified_by) == ("DELETED", 2, "action:deleter")
    assert await versions_of(state, record) == [(1, "ACTIVE"), (2, "DELETED")]
    assert await count_rows(state, agent) == (1, 2)  # the staged tombstone is gone


# M58
async def test_m58_deleting_a_deleted_record_returns_it_unchanged(state, agent):
    record = await remember(state, agent, "to delete")
    first = await forget(state, agent, record.memory_id)
    unit = work(state, writer(agent))
    again = await unit.delete(record.memory_id)
    assert again == await operator_sees(state, agent, record.memory_id)
    assert again.version == first.version == 2
    await commit(state, unit)
    assert await versions_of(state, record) == [(1, "ACTIVE"), (2, "DELETED")]
    # Within one turn too: the second delete of a staged deletion stages nothing more.
    other = await remember(state, agent, "other")
    unit = work(state, writer(agent))
    staged = await unit.delete(other.memory_id)
    assert await unit.delete(other.memory_id) == staged
    await commit(state, unit)
    assert await versions_of(state, other) == [(1, "ACTIVE"), (2, "DELETED")]


# M44
async def test_m44_delete_reaches_only_the_scopes_the_writer_writes(state, admin):
    narrow = await make_agent(
        state,
        admin,
        name="narrow",
        harness=full_memory(scope={"read": ["session", "agent"], "write": ["session"]}),
    )
    seeded = await seed(state, admin, narrow, "agent-wide", scope="AGENT")
    unit = work(state, writer(narrow))
    assert (await unit.read(seeded.memory_id)).summary == "agent-wide"
    with pytest.raises(BadInput, match="AGENT scope, which this agent does not write"):
        await unit.delete(seeded.memory_id)
    own = await remember(state, narrow, "own session record")
    assert (await forget(state, narrow, own.memory_id)).status == "DELETED"
    # It reaches every scope it writes, one it does not read too: an agent that writes agent
    # scope but reads its session alone still corrects and deletes what it wrote there,
    # from another session as well; it reads none of it.
    blind = await make_agent(
        state,
        admin,
        name="blind",
        harness=full_memory(scope={"read": ["session"], "write": ["session", "agent"]}),
    )
    wide = await remember(state, blind, "agent-wide v1", scope="AGENT", session="s1")
    assert await work(state, writer(blind, session="s2")).read(wide.memory_id) is None
    fixed = await remember(
        state, blind, "agent-wide v2", replaces=wide.memory_id, scope="AGENT", session="s2"
    )
    assert await versions_of(state, wide) == [(1, "ACTIVE"), (2, "SUPERSEDED")]
    assert (await forget(state, blind, fixed.memory_id, session="s3")).status == "DELETED"
    assert await versions_of(state, fixed) == [(1, "ACTIVE"), (2, "DELETED")]
    # Another session's session-scope record stays out of reach.
    theirs = await remember(state, blind, "session record", session="s1")
    with pytest.raises(NotFound, match=f"no memory {theirs.memory_id} is visible"):
        await work(state, writer(blind, session="s2")).delete(theirs.memory_id)


async def test_deleting_a_superseded_record_is_refused(state, agent):
    old = await remember(state, agent, "old")
    new = await remember(state, agent, "new", replaces=old.memory_id)
    with pytest.raises(BadInput, match=f"replaced by memory {new.memory_id}"):
        await work(state, writer(agent)).delete(old.memory_id)


# --- M49-M52 pins -----------------------------------------------------------------------------


# M49
async def test_m49_nothing_can_be_pinned_without_pinned(state, agent):
    with pytest.raises(BadInput, match="nothing can be pinned"):
        await work(state, writer(agent)).add(NewMemory(summary="x", kind="fact", pinned=True))
    assert await count_rows(state, agent) == (0, 0)


# M52
async def test_m52_pin_over_budget_is_refused_with_consolidate(state, admin):
    # Three lines of 60 characters: two fit in 31 tokens (121 characters), three do not.
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 31})
    )
    summary = "x" * (60 - len('- "') - len('" (memory 00000000-0000-0000-0000-000000000000)'))
    first = await remember(state, pinner, summary, pinned=True)
    assert len(first.pinned_line()) == 60
    second = await remember(state, pinner, summary, pinned=True)
    assert pinned_tokens([first.pinned_line(), second.pinned_line()]) == 31
    before = await count_rows(state, pinner)
    with pytest.raises(BadInput) as refused:
        await work(state, writer(pinner)).add(NewMemory(summary=summary, kind="fact", pinned=True))
    message = refused.value.message
    assert "Consolidate" in message and "replaces" in message and "budget of 31" in message
    assert str(first.memory_id) in message and str(second.memory_id) in message
    assert await count_rows(state, pinner) == before  # M47
    # Consolidating: a pin that replaces one of them counts without it.
    merged = await remember(
        state, pinner, summary[:-1] + "y", pinned=True, replaces=first.memory_id
    )
    unit = work(state, writer(pinner))
    assert [r.memory_id for r in await unit.pinned()] == [second.memory_id, merged.memory_id]
    # Unpinned records never count.
    assert (await remember(state, pinner, "not pinned")).pinned is False


# M52
async def test_m52_budget_counts_only_the_pins_the_writer_reads(state, admin):
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 15})
    )
    summary = "x" * (60 - len('- "') - len('" (memory 00000000-0000-0000-0000-000000000000)'))
    await remember(state, pinner, summary, pinned=True, session="s1")
    with pytest.raises(BadInput, match="Consolidate"):
        await work(state, writer(pinner, session="s1")).add(
            NewMemory(summary=summary, kind="fact", pinned=True)
        )
    # Another session reads none of s1's session pins: its own pin fits.
    assert (await remember(state, pinner, summary, pinned=True, session="s2")).pinned


# M52
async def test_m52_an_agent_scope_pin_counts_against_every_sessions_list(state, admin):
    """An agent-scope pin is listed in every session's turns: it is refused when it would take
    another session's list (that session's pins with the agent's) over the budget, from any
    session or none (an operator), and at commit when that session's pin committed meanwhile;
    one that fits every list is taken."""
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 31})
    )
    summary = "x" * (60 - len('- "') - len('" (memory 00000000-0000-0000-0000-000000000000)'))
    await remember(state, pinner, summary, pinned=True, session="s1")  # s1's list: 60 characters
    longer = NewMemory(summary=summary + "y" * 20, kind="fact", pinned=True, scope="AGENT")
    for session in ("s2", None):  # 60 + 1 + 80 characters in s1: 36 tokens
        with pytest.raises(BadInput, match="Consolidate"):
            await work(state, writer(pinner, session=session)).add(longer)
    # 60 + 1 + 60 characters: 31 tokens, taken; then s1 pins 62 more characters meanwhile (its
    # own list, without the staged pin, 31 tokens): the commit finds s1's list over.
    staged = work(state, writer(pinner, session="s3"))
    fits = NewMemory(summary=summary, kind="fact", pinned=True, scope="AGENT")
    (taken,) = await staged.add(fits)
    assert taken.pinned
    await remember(state, pinner, "z" * 12, pinned=True, session="s1")
    with pytest.raises(Conflict, match="Consolidate"):
        await commit(state, staged)
    await staged.discard()
    assert len(await work(state, writer(pinner, session="s1")).pinned()) == 2


# M52
async def test_m52_pins_committed_meanwhile_count_at_commit(state, admin):
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 15})
    )
    summary = "x" * (60 - len('- "') - len('" (memory 00000000-0000-0000-0000-000000000000)'))
    one, two = work(state, writer(pinner)), work(state, writer(pinner))
    await one.add(NewMemory(summary=summary, kind="fact", pinned=True, scope="AGENT"))
    await two.add(NewMemory(summary=summary, kind="fact", pinned=True, scope="AGENT"))
    await commit(state, one)
    with pytest.raises(Conflict, match="Consolidate"):
        await commit(state, two)
    await two.discard()
    assert len(await work(state, writer(pinner)).pinned()) == 1


# M50
async def test_m50_pinned_lists_the_pins_the_writer_reads_in_a_stable_order(state, admin):
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 2000})
    )
    a = await remember(state, pinner, "first pin", pinned=True, scope="AGENT")
    b = await remember(state, pinner, "second pin", pinned=True)
    await remember(state, pinner, "not pinned")
    await remember(state, pinner, "other session pin", pinned=True, session="s2")
    preview_pin = await remember(state, pinner, "preview pin", pinned=True, preview=True)
    unit = work(state, writer(pinner))
    (staged,) = await unit.add(NewMemory(summary="staged pin", kind="fact", pinned=True))
    expected = [a.memory_id, b.memory_id, staged.memory_id]
    assert [r.memory_id for r in await unit.pinned()] == expected
    assert [r.memory_id for r in await unit.pinned()] == expected
    preview = work(state, writer(pinner, preview=True))
    assert [r.memory_id for r in await preview.pinned()] == [
        a.memory_id,
        b.memory_id,
        preview_pin.memory_id,
    ]


# --- P1-P4 preview ----------------------------------------------------------------------------


# P1
async def test_p1_preview_writes_are_preview_records(state, agent):
    record = await remember(state, agent, "from a preview turn", preview=True)
    assert record.preview is True
    assert (await operator_sees(state, agent, record.memory_id)).preview is True
    assert (await remember(state, agent, "live")).preview is False


# P2
async def test_p2_live_turns_never_see_a_preview_record(state, agent):
    record = await remember(state, agent, "preview only", preview=True, scope="AGENT")
    live = writer(agent)
    assert record.memory_id not in await listed(state, live)
    assert await work(state, live).read(record.memory_id) is None
    with pytest.raises(NotFound):
        await work(state, live).delete(record.memory_id)
    with pytest.raises(NotFound):
        await work(state, live).add(NewMemory(summary="x", kind="fact", replaces=record.memory_id))
    assert record.memory_id in await listed(state, writer(agent, preview=True))


# P3 P4
async def test_p3_p4_preview_replace_leaves_the_live_record_unchanged(state, agent):
    live = await remember(state, agent, "live fact", scope="AGENT")
    other = await remember(state, agent, "another live fact", scope="AGENT")
    unit = work(state, writer(agent, preview=True))
    written = await unit.add(
        NewMemory(summary="preview correction", kind="fact", scope="AGENT", replaces=live.memory_id)
    )
    assert len(written) == 1  # the live record is not written
    correction = written[0]
    assert correction.preview and correction.replaces == live.memory_id
    await commit(state, unit)
    stored = await operator_sees(state, agent, live.memory_id)
    assert (stored.status, stored.version, stored.replaced_by) == ("ACTIVE", 1, None)
    assert await versions_of(state, live) == [(1, "ACTIVE")]
    # P3: preview turns see every record except the ones a preview record names.
    previewing = await listed(state, writer(agent, preview=True, session="s9"))
    assert set(previewing) == {correction.memory_id, other.memory_id}
    viewed = await work(state, writer(agent, preview=True)).read(live.memory_id)
    assert viewed.status == "SUPERSEDED" and viewed.replaced_by == correction.memory_id
    # Live turns see the live record as it was, and never the preview one.
    assert set(await listed(state, writer(agent))) == {live.memory_id, other.memory_id}


# P4
async def test_p4_preview_delete_writes_a_preview_deletion_record(state, agent):
    live = await remember(state, agent, "live fact", scope="AGENT")
    unit = work(state, writer(agent, preview=True))
    deletion = await unit.delete(live.memory_id)
    assert deletion.preview and deletion.status == "DELETED"
    assert deletion.replaces == live.memory_id and deletion.summary == "live fact"
    assert deletion.memory_id != live.memory_id
    assert await unit.delete(live.memory_id) == deletion
    await commit(state, unit)
    assert await versions_of(state, live) == [(1, "ACTIVE")]
    assert await versions_of(state, deletion) == [(1, "DELETED")]
    assert (await operator_sees(state, agent, live.memory_id)).status == "ACTIVE"
    assert live.memory_id in await listed(state, writer(agent))
    assert live.memory_id not in await listed(state, writer(agent, preview=True))
    # A later preview turn deleting it again gets the same deletion, unchanged.
    assert await work(state, writer(agent, preview=True)).delete(live.memory_id) == deletion


# P4
async def test_p4_preview_turn_changes_preview_records_in_place(state, agent):
    draft = await remember(state, agent, "preview draft", preview=True)
    deleted = await forget(state, agent, draft.memory_id, preview=True)
    assert deleted.memory_id == draft.memory_id and deleted.status == "DELETED"
    assert await versions_of(state, draft) == [(1, "ACTIVE"), (2, "DELETED")]
    assert await count_rows(state, agent) == (1, 2)
    second = await remember(state, agent, "preview v1", preview=True)
    third = await remember(state, agent, "preview v2", preview=True, replaces=second.memory_id)
    stored = await operator_sees(state, agent, second.memory_id)
    assert stored.status == "SUPERSEDED" and stored.replaced_by == third.memory_id


# P3 P4
async def test_p3_p4_a_live_record_whose_preview_replacement_was_deleted_stays_replaced(
    state, agent
):
    """To preview turns, a live record a preview record replaced stays replaced by it when that
    replacement is deleted later, as a live record stays replaced by a deleted successor: it
    is not deleted itself, and changing it is refused naming its replacement."""
    live = await remember(state, agent, "live fact", scope="AGENT")
    fix = await remember(
        state, agent, "preview fix", scope="AGENT", preview=True, replaces=live.memory_id
    )
    assert (await forget(state, agent, fix.memory_id, preview=True)).status == "DELETED"

    previewing = writer(agent, preview=True)
    seen = await work(state, previewing).read(live.memory_id)
    assert (seen.status, seen.replaced_by) == ("SUPERSEDED", fix.memory_id)
    assert live.memory_id not in await listed(state, previewing)  # P3: still hidden
    with pytest.raises(BadInput, match=f"replaced by memory {fix.memory_id}; delete that"):
        await work(state, previewing).delete(live.memory_id)
    with pytest.raises(BadInput, match=f"already replaced by memory {fix.memory_id}"):
        await work(state, previewing).add(
            NewMemory(summary="again", kind="fact", scope="AGENT", replaces=live.memory_id)
        )
    # P4: the live record is unchanged, and live turns see it as it is.
    assert await versions_of(state, live) == [(1, "ACTIVE")]
    assert (await work(state, writer(agent)).read(live.memory_id)).status == "ACTIVE"


# P3 P4
async def test_p3_p4_a_live_record_deleted_live_is_deleted_whatever_preview_replaced_it(
    state, agent
):
    """A live record deleted by a live turn, after a preview record replaced it and that one
    was deleted: a preview turn deleting it is answered with the record itself, deleted, not
    with the deleted preview replacement as if that were its deletion."""
    live = await remember(state, agent, "live fact", scope="AGENT")
    fix = await remember(
        state, agent, "preview fix", scope="AGENT", preview=True, replaces=live.memory_id
    )
    await forget(state, agent, fix.memory_id, preview=True)
    await forget(state, agent, live.memory_id)

    deleted = await work(state, writer(agent, preview=True)).delete(live.memory_id)
    assert (deleted.memory_id, deleted.status) == (live.memory_id, "DELETED")


# --- conflicts and concurrency ----------------------------------------------------------------


async def test_replacing_a_record_that_changed_meanwhile_conflicts(state, agent):
    record = await remember(state, agent, "contested")
    slow, fast = work(state, writer(agent)), work(state, writer(agent))
    await slow.add(NewMemory(summary="slow correction", kind="fact", replaces=record.memory_id))
    await fast.add(NewMemory(summary="fast correction", kind="fact", replaces=record.memory_id))
    await commit(state, fast)
    with pytest.raises(Conflict, match=f"memory {record.memory_id} changed meanwhile"):
        await commit(state, slow)
    await slow.discard()
    assert await versions_of(state, record) == [(1, "ACTIVE"), (2, "SUPERSEDED")]
    assert await count_rows(state, agent) == (2, 3)


async def test_deleting_a_record_that_changed_meanwhile_conflicts(state, admin, agent):
    record = await remember(state, agent, "contested")
    unit = work(state, writer(agent))
    await unit.delete(record.memory_id)
    await operator.delete_memory(
        state.pool, admin, action_id=agent.action_id, memory_id=record.memory_id
    )
    with pytest.raises(Conflict, match="changed meanwhile"):
        await commit(state, unit)
    await unit.discard()
    assert await versions_of(state, record) == [(1, "ACTIVE"), (2, "DELETED")]
    stored = await operator_sees(state, agent, record.memory_id)
    assert stored.modified_by == "admin"


async def test_concurrent_writers_replacing_one_record_leave_exactly_one_successor(state, agent):
    record = await remember(state, agent, "contested by many", scope="AGENT")
    units = [work(state, writer(agent, session=f"s{i}")) for i in range(6)]
    for i, unit in enumerate(units):
        await unit.add(NewMemory(summary=f"correction {i}", kind="fact", replaces=record.memory_id))

    async def commit_one(unit: MemoryWork):
        try:
            return await commit(state, unit)
        except Conflict as e:
            await unit.discard()
            return e

    results = await asyncio.gather(*(commit_one(u) for u in units))
    winners = [r for r in results if not isinstance(r, Conflict)]
    assert len(winners) == 1
    assert all("changed meanwhile" in r.message for r in results if isinstance(r, Conflict))
    successor = next(r for r in winners[0] if r.memory_id != record.memory_id)
    stored = await operator_sees(state, agent, record.memory_id)
    assert stored.status == "SUPERSEDED" and stored.replaced_by == successor.memory_id
    assert await versions_of(state, record) == [(1, "ACTIVE"), (2, "SUPERSEDED")]
    async with state.pool.acquire() as conn:
        naming = await conn.fetch(
            "SELECT memory_id, pending_execution FROM agent_memories WHERE replaces = $1",
            record.memory_id,
        )
        versions = await conn.fetch(
            "SELECT memory_id, version FROM agent_memory_versions WHERE action_id = $1",
            agent.action_id,
        )
    assert [(r["memory_id"], r["pending_execution"]) for r in naming] == [
        (successor.memory_id, None)
    ]
    assert sorted((r["memory_id"], r["version"]) for r in versions) == sorted(
        [(record.memory_id, 1), (record.memory_id, 2), (successor.memory_id, 1)]
    )


async def test_concurrent_preview_replacements_of_a_live_record_leave_one(state, agent):
    record = await remember(state, agent, "live", scope="AGENT")
    units = [work(state, writer(agent, preview=True, session=f"p{i}")) for i in range(4)]
    for unit in units:
        await unit.add(NewMemory(summary="preview fix", kind="fact", replaces=record.memory_id))

    async def commit_one(unit: MemoryWork):
        try:
            await commit(state, unit)
            return True
        except Conflict:
            await unit.discard()
            return False

    assert sorted(await asyncio.gather(*(commit_one(u) for u in units))) == [
        False,
        False,
        False,
        True,
    ]
    assert await versions_of(state, record) == [(1, "ACTIVE")]
    assert await count_rows(state, agent) == (2, 2)


# --- embeddings and the append-only versions ---------------------------------------------------


async def test_add_embeds_the_memory_text_and_reports_usage(state, agent, embedder):
    unit = work(state, writer(agent))
    (record,) = await unit.add(
        NewMemory(summary="customer 7 prefers phone", kind="fact", content="said so on 3 May")
    )
    expected = await embedder.embed([memory_text(record.summary, record.content)])
    assert unit.embed_tokens == [expected.tokens] and expected.tokens > 0
    async with state.pool.acquire() as conn:
        stored = await conn.fetchval(
            "SELECT embedding FROM agent_memories WHERE memory_id = $1", record.memory_id
        )
    assert np.allclose(stored.to_numpy(), expected.vectors[0], atol=1e-6)


async def test_versions_are_append_only(state, agent):
    record = await remember(state, agent, "kept forever")
    async with state.pool.acquire() as conn:
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("UPDATE agent_memory_versions SET summary = 'rewritten'")
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("DELETE FROM agent_memory_versions")
    assert await versions_of(state, record) == [(1, "ACTIVE")]


async def test_metadata_is_kept_as_json(state, agent):
    record = await remember(state, agent, "with metadata", metadata={"source": "chat", "n": [1, 2]})
    assert record.metadata == {"source": "chat", "n": [1, 2]}
    assert (await remember(state, agent, "without")).metadata == {}
    with pytest.raises(BadInput, match="metadata"):
        await work(state, writer(agent)).add(
            NewMemory(summary="x", kind="fact", metadata={"big": "x" * 20_000})
        )
    assert json.dumps(record.metadata)


# M52
async def test_m52_the_longest_other_list_is_found_by_its_listed_length(state, admin):
    """Another session's list is as long as its lines as listed: a summary's quotes are
    escaped there (twice as long), and each line adds its ID. Session a's one pin of quotes
    is the longest list though three sessions have more summary characters in more pins: an
    agent-scope pin that fits theirs and not a's is refused."""
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 140})
    )
    quotes = await remember(state, pinner, '"' * 250, pinned=True, session="a")
    assert len(quotes.pinned_line()) == 550  # 138 tokens, within the budget alone
    for session in ("b", "c", "d"):  # 2 x 150 + 1 characters: 76 tokens each
        for _ in range(2):
            await remember(state, pinner, "b" * 100, pinned=True, session=session)
    # In a's list: 550 + 1 + 50 characters, 151 tokens; in the others', 89.
    with pytest.raises(BadInput, match="Consolidate") as refused:
        await work(state, writer(pinner, session="e")).add(
            NewMemory(summary="x", kind="fact", pinned=True, scope="AGENT")
        )
    message = refused.value.message
    assert "another session's pinned list to about 151 tokens" in message
    assert str(quotes.memory_id) not in message  # a's own pin is none of e's business (M3)


# M52
async def test_m52_an_operators_pins_for_several_sessions_count_against_each_list(state, admin):
    """addAgentMemories pins records of several sessions at once: each counts against its own
    session's list (with that session's pins), not against the agent's alone, nor against the
    other sessions' of the call."""
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 15})
    )
    summary = "x" * (60 - len('- "') - len('" (memory 00000000-0000-0000-0000-000000000000)'))
    await remember(state, pinner, summary, pinned=True, session="s1")  # s1's list: 15 tokens

    def pins(*sessions, pinned=True):
        return [
            operator.OperatorMemory(summary=summary, kind="fact", pinned=pinned, session_id=s)
            for s in sessions
        ]

    async def add(memories):
        return await operator.add_memories(
            state.pool, state.embedder, admin, action_id=pinner.action_id, memories=memories
        )

    before = await count_rows(state, pinner)
    with pytest.raises(BadInput, match="Consolidate"):
        # s1's list: 60 + 1 + 60 characters, 31 tokens (the call's unpinned s2 record aside)
        await add(pins("s1") + pins("s2", pinned=False))
    assert await count_rows(state, pinner) == before
    # One pin for each of two other sessions: 60 characters in each list, taken.
    added = await add(pins("s2", "s3"))
    assert [v.record.session_id for v in added] == ["s2", "s3"]
