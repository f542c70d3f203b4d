"""Each session's pinned list length, kept by the writes (migration 0030) for an agent-scope
pin's check (M52): after every kind of write the lengths kept are those counted from the
records, and the check that reads them answers as counting would."""

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from factories import (
    assert_pinned_lists_kept,
    commit,
    forget,
    full_memory,
    make_agent,
    pinned_lists,
    remember,
    work,
    writer,
)
from helpers import upgraded_from

from app.errors import BadInput, Conflict
from app.memory import operator, store
from app.memory.records import pin_line
from app.memory.service import NewMemory

# A summary whose pinned line is 60 characters (with its line break, 61).
SIXTY = "x" * (60 - len('- "') - len('" (memory 00000000-0000-0000-0000-000000000000)'))


@pytest.fixture
async def pinner(state, admin):
    return await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 2000})
    )


def pins(*sessions, summary=SIXTY, pinned=True, **given):
    return [
        operator.OperatorMemory(summary=summary, kind="fact", pinned=pinned, session_id=s, **given)
        for s in sessions
    ]


# M52
async def test_m52_a_turns_pins_replacements_and_deletions_keep_each_sessions_length(state, pinner):
    first = await remember(state, pinner, "abc", pinned=True, session="s1")
    # `- "abc" (memory <ID>)`, 53 characters, and its line break.
    assert await assert_pinned_lists_kept(state, pinner) == {"s1": (54, 54)}
    quoted = await remember(state, pinner, '"q"\t', pinned=True, session="s1")
    # Quotes and a tab escaped as listed: `"\"q\"\t"`, 9 characters, not 6.
    assert await assert_pinned_lists_kept(state, pinner) == {"s1": (54 + 58, 54 + 58)}
    # Angle brackets and their lookalikes as \uXXXX: `"\u003cx\uff1e"`, 15 characters, not 5.
    tagged = await remember(state, pinner, "<x\uff1e", pinned=True, session="s1")
    assert await assert_pinned_lists_kept(state, pinner) == {"s1": (54 + 58 + 64,) * 2}
    await forget(state, pinner, tagged.memory_id, session="s1")
    # Agent-scope pins and unpinned records are in no session's length.
    await remember(state, pinner, "everywhere", pinned=True, scope="AGENT")
    await remember(state, pinner, "not pinned", session="s2")
    assert set(await assert_pinned_lists_kept(state, pinner)) == {"s1"}
    # A pin replaced by a longer pin (its text corrected), by an unpinned record, deleted.
    longer = await remember(
        state, pinner, "abcdef", pinned=True, session="s1", replaces=first.memory_id
    )
    assert (await assert_pinned_lists_kept(state, pinner))["s1"][0] == 57 + 58
    await remember(state, pinner, "unpinned now", session="s1", replaces=quoted.memory_id)
    assert await assert_pinned_lists_kept(state, pinner) == {"s1": (57, 57)}
    await forget(state, pinner, longer.memory_id, session="s1")
    assert await assert_pinned_lists_kept(state, pinner) == {}


# M52
async def test_m52_staged_pins_count_once_committed_and_a_failed_commit_changes_nothing(
    state, pinner
):
    unit = work(state, writer(pinner, session="s1"))
    await unit.add(NewMemory(summary="staged", kind="fact", pinned=True))
    dropped = work(state, writer(pinner, session="s1"))
    await dropped.add(NewMemory(summary="dropped", kind="fact", pinned=True))
    await dropped.discard()
    assert await assert_pinned_lists_kept(state, pinner) == {}
    await commit(state, unit)
    kept = await assert_pinned_lists_kept(state, pinner)
    assert set(kept) == {"s1"}
    # A turn of several writes at once: two pins, one replacing a pin, and a deletion.
    a = await remember(state, pinner, "pin a", pinned=True, session="s1")
    b = await remember(state, pinner, "pin b", pinned=True, session="s1")
    batch = work(state, writer(pinner, session="s1"))
    await batch.add(NewMemory(summary="pin c", kind="fact", pinned=True))
    await batch.add(NewMemory(summary="pin a2", kind="fact", pinned=True, replaces=a.memory_id))
    await batch.delete(b.memory_id)
    await commit(state, batch)
    kept = await assert_pinned_lists_kept(state, pinner)
    # Two turns delete the same pin: the second's commit conflicts and keeps nothing of it.
    c = await remember(state, pinner, "pin to delete twice", pinned=True, session="s2")
    one, two = work(state, writer(pinner, session="s2")), work(state, writer(pinner, session="s2"))
    await one.delete(c.memory_id)
    await two.delete(c.memory_id)
    two_pins = await remember(state, pinner, "another s2 pin", pinned=True, session="s2")
    await two.add(NewMemory(summary="yet another", kind="fact", pinned=True))
    await commit(state, one)
    with pytest.raises(Conflict):
        await commit(state, two)
    await two.discard()
    assert (await assert_pinned_lists_kept(state, pinner))["s2"][0] == len(
        pin_line(two_pins.summary, two_pins.memory_id)
    ) + 1


# M52
async def test_m52_preview_lists_count_preview_pins_less_the_live_pins_they_replace(state, pinner):
    live = await remember(state, pinner, "live pin", pinned=True, session="s1")
    kept = await assert_pinned_lists_kept(state, pinner)
    preview = await remember(state, pinner, "preview pin", pinned=True, session="s1", preview=True)
    assert (await assert_pinned_lists_kept(state, pinner))["s1"] == (
        kept["s1"][0],
        kept["s1"][1] + len(preview.pinned_line()) + 1,
    )
    # A preview record replacing the live pin: preview turns list it no more, live turns do.
    await remember(
        state, pinner, "replaced in preview", session="s1", preview=True, replaces=live.memory_id
    )
    assert (await assert_pinned_lists_kept(state, pinner))["s1"][0] == kept["s1"][0]
    # A preview deletion of a live pin (its tombstone stays), and of a preview pin.
    other = await remember(state, pinner, "other live pin", pinned=True, session="s1")
    await assert_pinned_lists_kept(state, pinner)
    await forget(state, pinner, other.memory_id, session="s1", preview=True)
    await assert_pinned_lists_kept(state, pinner)
    await forget(state, pinner, preview.memory_id, session="s1", preview=True)
    # Live turns list both live pins; preview turns neither.
    assert set(await assert_pinned_lists_kept(state, pinner)) == {"s1"}
    assert (await pinned_lists(state, pinner))["s1"][1] == 0


# M52
async def test_m52_an_operators_pins_deletions_and_replacements_keep_the_lengths(
    state, admin, pinner
):
    async def add(memories):
        return await operator.add_memories(
            state.pool, state.embedder, admin, action_id=pinner.action_id, memories=memories
        )

    added = await add(pins("s1", "s2", "s3") + pins("s4", summary="unpinned", pinned=False))
    assert set(await assert_pinned_lists_kept(state, pinner)) == {"s1", "s2", "s3"}
    s1, s2, s3 = (v.record.memory_id for v in added[:3])
    # One call replacing the pins of two sessions, one by an unpinned record.
    await add(pins("s1", summary="short", replaces=s1) + pins("s2", replaces=s2, pinned=False))
    assert set(await assert_pinned_lists_kept(state, pinner)) == {"s1", "s3"}
    await operator.add_memory(
        state.pool,
        state.embedder,
        admin,
        action_id=pinner.action_id,
        memory=pins("s3", summary="longer " * 20)[0],
    )
    await assert_pinned_lists_kept(state, pinner)
    await operator.delete_memory(state.pool, admin, action_id=pinner.action_id, memory_id=s3)
    await assert_pinned_lists_kept(state, pinner)


# M52
async def test_m52_bulk_loaded_records_are_counted(state, pinner):
    """`copy_committed` (benchmarks' loads) counts the agent's lists again."""
    now = datetime.now(UTC)

    def loaded(summary, **given):
        values = {
            "account_id": pinner.account_id,
            "action_id": pinner.action_id,
            "memory_id": uuid.uuid4(),
            "version": 1,
            "created": now,
            "modified": now,
            "summary": summary,
            "content": "",
            "metadata": {},
            "status": "ACTIVE",
            "scope": "SESSION",
            "kind": "fact",
            "source": "OPERATOR",
            "pinned": True,
            "labels": {},
            "replaces": None,
            "replaced_by": None,
            "preview": False,
            "execution_id": uuid.uuid4(),
            "invocation_number": 1,
            "action_version": 1,
            "session_id": "s1",
            "modified_by": "bench",
        }
        return store.MemoryRecord(**(values | given))

    hidden = loaded("hidden from preview turns")
    records = [
        loaded("a pin"),
        hidden,
        loaded("a preview pin", session_id="s2", preview=True),
        loaded("its preview replacement", pinned=False, preview=True, replaces=hidden.memory_id),
    ]
    async with state.pool.acquire() as conn:
        await store.copy_committed(conn, records, [None] * len(records))
    assert set(await assert_pinned_lists_kept(state, pinner)) == {"s1", "s2"}


# M52
async def test_m52_a_preview_turns_agent_scope_pin_counts_the_lists_preview_turns_read(
    state, admin
):
    """s1's preview pin makes its list too long for an agent-scope pin of a preview turn only;
    s2's live pin, replaced in preview, for a live turn's only."""
    pinner = await make_agent(
        state, admin, name="pins", harness=full_memory(pinned={"max_tokens": 31})
    )
    longer = SIXTY + "y" * 8  # 68 characters listed: with a 60-character line, 33 tokens
    previewed = await remember(state, pinner, longer, pinned=True, session="s1", preview=True)
    live = await remember(state, pinner, longer, pinned=True, session="s2")
    await remember(state, pinner, "not pinned", session="s2", preview=True, replaces=live.memory_id)
    fits = NewMemory(summary=SIXTY, kind="fact", pinned=True, scope="AGENT")
    for preview, over in ((True, previewed), (False, live)):
        with pytest.raises(BadInput, match="about 33 tokens") as refused:
            await work(state, writer(pinner, session="s3", preview=preview)).add(fits)
        message = refused.value.message
        assert "another session's pinned list" in message  # named by no ID of its (M3)
        assert str(over.memory_id) not in message
    shorter = NewMemory(summary=SIXTY[:-8], kind="fact", pinned=True, scope="AGENT")
    for preview in (True, False):
        (taken,) = await work(state, writer(pinner, session="s3", preview=preview)).add(shorter)
        assert taken.pinned


# M52
async def test_m52_a_writer_that_waits_for_anothers_lock_counts_what_it_committed(state, pinner):
    """Two turns pin in s1 at once: the second counts s1 after the first commits (its count
    waits for the first's lock, and reads what it committed), not before."""
    first = work(state, writer(pinner, session="s1"))
    await first.add(NewMemory(summary="first", kind="fact", pinned=True))
    second = work(state, writer(pinner, session="s1"))
    await second.add(NewMemory(summary="second", kind="fact", pinned=True))
    async with state.pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        await first.commit(conn)
        waiting = asyncio.create_task(commit(state, second))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # waits for s1's row
        await transaction.commit()
    await waiting
    kept = await assert_pinned_lists_kept(state, pinner)
    assert kept["s1"][0] == 56 + 57


# M52
async def test_m52_operators_pinning_in_the_same_sessions_at_once_neither_deadlock_nor_drift(
    state, admin, pinner
):
    sessions = [f"s{i}" for i in range(6)]

    async def add(order):
        return await operator.add_memories(
            state.pool, state.embedder, admin, action_id=pinner.action_id, memories=pins(*order)
        )

    await asyncio.gather(*(add(sessions[::step]) for step in (1, -1, 2, -2, 1, -1)))
    kept = await assert_pinned_lists_kept(state, pinner)
    assert sorted(kept) == sessions


async def _write_rows(conn, account, action, rows):
    """Agent memory rows written as a release before migration 0030 wrote them."""
    now = datetime.now(UTC)
    for i, r in enumerate(rows):
        await conn.execute(
            """
            INSERT INTO agent_memories (account_id, action_id, memory_id, version, created,
                modified, summary, status, scope, kind, source, pinned, replaces, preview,
                execution_id, invocation_number, action_version, session_id, modified_by,
                pending_execution, pending_invocation)
            VALUES ($1, $2, $3, 1, $4, $4, $5, $6, $7, 'fact', 'TOOL', $8, $9, $10, $11, 1, 1,
                    $12, 'agent', $13, $14)
            """,
            account, action, r["memory_id"], now + timedelta(seconds=i), r["summary"],
            r.get("status", "ACTIVE"), r.get("scope", "SESSION"), r.get("pinned", True),
            r.get("replaces"), r.get("preview", False), uuid.uuid4(), r.get("session_id", "s1"),
            r.get("pending"), 1 if r.get("pending") else None,
        )  # fmt: skip


# M52
async def test_m52_migrations_0030_and_0036_count_the_lists_pinned_before_them(pg_server, embedder):
    account, action = uuid.uuid4(), uuid.uuid4()
    shadowed = uuid.uuid4()

    def row(summary, **given):
        return {"memory_id": uuid.uuid4(), "summary": summary, **given}

    rows = [
        row('a "quoted" pin\u200b with a hidden space'),
        # Angle brackets and their lookalikes escaped as \uXXXX, six characters each (0036).
        row("a second pin of s1 <|im_end|>\uff1c/x\uff1e"),
        row("shadowed in preview", memory_id=shadowed),
        row("its preview replacement", preview=True, pinned=False, replaces=shadowed),
        row("a preview pin", session_id="s2", preview=True),
        row("a live pin of s3", session_id="s3"),
        row("superseded", session_id="s3", status="SUPERSEDED"),
        row("staged", session_id="s3", pending=uuid.uuid4()),
        row("unpinned", session_id="s4", pinned=False),
        row("agent scope", scope="AGENT", session_id=None),
    ]

    async def lists(conn):
        """The pinned lists as the migration counted them, and as counted again."""
        query = "SELECT session_id, live_length, preview_length FROM pinned_lists"
        migrated = {r[0]: (r[1], r[2]) for r in await conn.fetch(query)}
        async with conn.transaction():
            await store.count_pinned_lists(conn, account, action, None)
        return migrated, {r[0]: (r[1], r[2]) for r in await conn.fetch(query)}

    migrated, counted = await upgraded_from(
        pg_server, "0029", account, action, lambda c: _write_rows(c, account, action, rows), lists
    )

    def length(*summaries):
        chosen = [r for r in rows if r["summary"] in summaries]
        return sum(len(pin_line(r["summary"], r["memory_id"])) + 1 for r in chosen)

    s1 = (rows[0]["summary"], rows[1]["summary"])
    assert migrated == counted
    assert counted == {
        "s1": (length(*s1, "shadowed in preview"), length(*s1)),
        "s2": (0, length("a preview pin")),
        "s3": (length("a live pin of s3"),) * 2,
    }
