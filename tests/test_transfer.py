"""`engram export` / `engram import`: an agent read back identical in another database."""

import asyncio
import errno
import fcntl
import io
import itertools
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import termios
import uuid
from asyncio.subprocess import PIPE
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from factories import (
    LABELS,
    assert_pinned_lists_kept,
    full_memory,
    make_agent,
    make_agent_id,
    pinned_lists,
    record_turn,
    work,
    writer,
)
from helpers import GQL, database_copy, db_settings, holding, scratch_dir
from openai_server import OpenAIServer
from runtime_support import run as run_turn
from servers import clean_env, engram_command, run, run_closed

from app import cli
from app.actions import service as actions
from app.auth import service as auth_service
from app.auth import store as auth_store
from app.auth.service import ensure_default_account
from app.db.pool import create_pool
from app.embeddings import store as embeddings_store
from app.errors import Conflict, NotFound
from app.memory.maintenance import ROUND_LOCK
from app.memory.service import NewMemory
from app.memory.vectors import VECTOR_COLUMNS
from app.services import start_services, stop_services
from app.state import AppState
from app.transfer import store
from app.transfer.service import export_action, import_file

RECORD = """
  id memoryId created modified version actionId summary content metadata status scope kind
  source pinned labels { number value name } replaces replacedBy preview executionId
  invocationNumber actionVersion sessionId modifiedBy
  action { actionId version name }
  session { sessionId turns }
  execution { executionId status preview sessionId actionVersion invocationNumber }
"""
LISTED = f"""
query($a: UUID!, $sort: SortOrder) {{
  action(actionId: $a) {{
    actionId version name instructions harness
    memories(first: 1000, sort: $sort) {{ nodes {{ {RECORD} }} }}
  }}
}}"""
ONE = f"""
query($a: UUID!, $id: UUID!) {{
  agentMemory(actionId: $a, id: $id) {{
    {RECORD}
    history(first: 100) {{ nodes {{ {RECORD} }} }}
  }}
}}"""


async def turn(state, agent, *, preview=False, session="s1", steps=()):
    """One committed turn of the agent, with its execution and session, doing `steps`."""
    w = writer(agent, preview=preview, session=session)
    unit = work(state, w)
    out = []
    for step in steps:
        if isinstance(step, NewMemory):
            out.append((await unit.add(step))[0])
        else:
            out.append(await unit.delete(step))
    await record_turn(state, w)
    async with state.pool.acquire() as conn, conn.transaction():
        await unit.commit(conn)
    return out


async def build_agent(state, admin):
    """An agent with a supersede chain, deletions, preview records and a second version."""
    agent = await make_agent(state, admin, harness=full_memory(pinned={"max_tokens": 200}))
    a, b, c = await turn(
        state,
        agent,
        steps=[
            NewMemory("prefers email", "fact", labels={"customer_id": "c-1"}, scope="AGENT"),
            NewMemory("lives in Bergen", "fact", content="said so twice", metadata={"n": 1}),
            NewMemory("always greet by name", "guidance", pinned=True, scope="AGENT"),
        ],
    )
    (b2,) = await turn(
        state, agent, steps=[NewMemory("lives in Oslo", "fact", replaces=b.memory_id)]
    )
    (b3,) = await turn(
        state, agent, steps=[NewMemory("lives in Trondheim", "fact", replaces=b2.memory_id)]
    )
    await turn(state, agent, steps=[a.memory_id])  # deleted
    # Preview: a preview record, a preview replacement and a preview deletion of live records.
    await turn(
        state,
        agent,
        preview=True,
        steps=[
            NewMemory("preview only", "fact"),
            NewMemory("moves to Tromsø", "fact", replaces=b3.memory_id),
            c.memory_id,
        ],
    )
    # A second version of the agent writes the last record.
    v2 = await actions.update_action(
        state.pool,
        admin,
        action_id=agent.action_id,
        name="support v2",
        instructions="be brief",
        model=None,
        harness=full_memory(pinned={"max_tokens": 200}),
    )
    await turn(state, v2, steps=[NewMemory("asked for a refund", "fact", scope="AGENT")])
    return agent


async def reads(gql: GQL, who, action_id) -> dict[str, Any]:
    """Everything an operator reads of the agent's memory through GraphQL."""
    listed = {}
    for sort in ("ASC", "DESC"):
        listed[sort] = (await gql(who, LISTED, a=str(action_id), sort=sort)).ok()
    async with gql.state.pool.acquire() as conn:
        ids = await conn.fetch(
            "SELECT memory_id FROM agent_memories WHERE action_id = $1 AND pending_execution "
            "IS NULL ORDER BY created, memory_id",
            action_id,
        )
    records = {}
    for r in ids:
        result = await gql(who, ONE, a=str(action_id), id=str(r["memory_id"]))
        records[str(r["memory_id"])] = result.ok()["agentMemory"]
    return {"listed": listed, "records": records}


@pytest.fixture
async def second(pg_server, template_db, embedder) -> AsyncIterator[AppState]:
    """Another deployment: a fresh database from the template, with its own app state."""
    name = f"engram_second_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, template_db, name) as url:
        pool = await create_pool(url, min_size=1, max_size=4)
        state = AppState(settings=db_settings(url), pool=pool, embedder=embedder)
        await start_services(state)
        try:
            yield state
        finally:
            await stop_services(state)
            await pool.close()


async def admin_of(state):
    from app.auth.caller import Caller
    from app.auth.policies import ADMIN_POLICIES

    async with state.pool.acquire() as conn:
        account_id = await ensure_default_account(conn)
    return Caller(account_id, "admin", ADMIN_POLICIES, in_default_account=True)


async def exported(state, admin, agent, **options) -> list[str]:
    out = io.StringIO()
    await export_action(
        state.pool, account_id=admin.account_id, action_id=agent.action_id, out=out, **options
    )
    return out.getvalue().splitlines()


async def load(target: AppState, account_id, lines, **options):
    async def opener():
        return target.embedder

    return await import_file(
        target.pool, account_id=account_id, lines=lines, open_embedder=opener, **options
    )


async def table_counts(state) -> dict[str, int]:
    tables = (
        "actions",
        "action_versions",
        "sessions",
        "executions",
        "transcript_events",
        "agent_memory_versions",
        "agent_memories",
    )
    async with state.pool.acquire() as conn:
        return {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in tables}


async def test_export_import_reads_back_identical(state, admin, gql, second):
    agent = await build_agent(state, admin)
    before = await reads(gql, admin, agent.action_id)
    statuses = {(r["status"], r["preview"]) for r in before["records"].values()}
    assert {("SUPERSEDED", False), ("DELETED", False), ("ACTIVE", True)} <= statuses
    assert any(r["status"] == "DELETED" and r["preview"] for r in before["records"].values())
    records = before["records"].values()
    assert len(records) == 9 and len(before["listed"]["ASC"]["action"]["memories"]["nodes"]) > 3
    assert max(len(r["history"]["nodes"]) for r in records) == 2
    assert all(r["execution"] and r["execution"]["status"] == "SUCCEEDED" for r in records)
    assert {r["actionVersion"] for r in records} == {1, 2}
    assert before["listed"]["ASC"]["action"]["version"] == 2
    lines = await exported(state, admin, agent)
    header = json.loads(lines[0])
    assert header["embedder"]["name"] == state.embedder.name and header["embeddings"]
    assert {json.loads(line)["type"] for line in lines[1:]} == {
        "action",
        "action_version",
        "session",
        "execution",
        "memory_version",
        "memory",
    }
    target_admin = await admin_of(second)
    result = await load(second, target_admin.account_id, lines)
    assert result.vectors == "copied" and result.present == 0
    after = await reads(GQL(second), target_admin, agent.action_id)
    assert after == before
    # The vectors came across unchanged: search finds the same records.
    async with state.pool.acquire() as a, second.pool.acquire() as b:
        query = "SELECT memory_id, embedding::text FROM agent_memories ORDER BY memory_id"
        assert [tuple(r) for r in await a.fetch(query)] == [tuple(r) for r in await b.fetch(query)]

    # Importing again changes nothing.
    counts = await table_counts(second)
    again = await load(second, target_admin.account_id, lines)
    assert again.inserted == 0 and again.present == result.inserted
    assert await table_counts(second) == counts
    assert await reads(GQL(second), target_admin, agent.action_id) == before


async def test_rows_are_read_a_page_at_a_time(state, admin):
    """Each page starts after the last row of the one before (in the order of an index, not
    after a sort of all the rows): pages of two give every row once, as one page does."""
    agent = await build_agent(state, admin)
    ids = (admin.account_id, agent.action_id)
    async with state.pool.acquire() as conn:
        for _ in range(2):  # the temporary tables go with the transaction
            async with conn.transaction(isolation="repeatable_read"):
                await store.note_named(conn, *ids)
                for table in store.TABLES:
                    whole = [
                        r async for r in store.export_rows(conn, table, *ids, embeddings=False)
                    ]
                    paged = [
                        r
                        async for r in store.export_rows(
                            conn, table, *ids, embeddings=False, batch=2
                        )
                    ]
                    assert paged == whole
                    assert len(set(whole)) == len(whole) == await store.count(conn, table, *ids)
                with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                    async with conn.transaction():
                        await conn.execute("CREATE TABLE written ()")


async def test_an_interrupted_import_continues(state, admin, gql, second):
    agent = await build_agent(state, admin)
    before = await reads(gql, admin, agent.action_id)
    lines = await exported(state, admin, agent, embeddings=False)
    target_admin = await admin_of(second)
    part = await load(second, target_admin.account_id, lines[: len(lines) // 2], batch_rows=3)
    # The header's counts tell what a file cut short is missing.
    assert part.missing and all(got < n for got, n in part.missing.values())
    rest = await load(second, target_admin.account_id, lines, batch_rows=3)
    assert rest.missing == {}
    assert rest.present == part.inserted and part.inserted + rest.inserted == len(lines) - 1
    # Without vectors in the file, the records were embedded again with the same model.
    assert rest.vectors == "re-embedded"
    assert await reads(GQL(second), target_admin, agent.action_id) == before


@pytest.mark.parametrize("hung", ["check_rows", "write_rows"])
async def test_an_import_cancelled_as_it_reads_leaves_no_batch_running(
    state, admin, second, monkeypatch, hung
):
    """Each pass reads the rows after a batch while PostgreSQL tries it (the check) or stores
    it (the write): an import cancelled as it reads (Ctrl-C, SIGTERM) cancels that batch too,
    and waits for it to end, so that no statement of it goes on, nor a transaction of its
    connection, once the pool has the connection back (or the import ended)."""
    from app.transfer import service

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    reached = asyncio.Event()

    async def holding(*args: Any) -> None:
        reached.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(store, hung, holding)
    batches, passes = service._batches, []

    async def reading(rows: Any, batch_rows: int) -> Any:
        passes.append(None)
        async for batch in batches(rows, batch_rows):
            yield batch
            if len(passes) == (1 if hung == "check_rows" else 2):  # cancelled here
                await reached.wait()
                await asyncio.sleep(3600)

    monkeypatch.setattr(service, "_batches", reading)
    before = asyncio.all_tasks()
    importing = asyncio.create_task(load(second, target_admin.account_id, lines))
    await reached.wait()
    importing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await importing
    left = asyncio.all_tasks() - before - {asyncio.current_task()}
    for task in left:  # (else the test would wait for them at its end)
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)
    assert not left
    assert not await second.pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state <> 'idle'"
    )


# M52
async def test_m52_an_import_counts_each_sessions_pinned_list(state, admin, second):
    """Imported in batches written two at a time (a preview record's batch beside the batch of
    the live pin it replaces), the pinned lists are counted as the agent's turns list them."""
    agent = await make_agent(state, admin, harness=full_memory(pinned={"max_tokens": 200}))
    _, b = await turn(
        state,
        agent,
        steps=[
            NewMemory("a pin", "fact", pinned=True),
            NewMemory('a "b" pin', "fact", pinned=True),
        ],
    )
    await turn(state, agent, session="s2", steps=[NewMemory("s2's pin", "fact", pinned=True)])
    await turn(
        state,
        agent,
        preview=True,
        steps=[NewMemory("a preview pin", "fact", pinned=True), b.memory_id],
    )
    kept = await assert_pinned_lists_kept(state, agent)
    assert set(kept) == {"s1", "s2"} and kept["s1"][0] != kept["s1"][1]
    target_admin = await admin_of(second)
    await load(second, target_admin.account_id, await exported(state, admin, agent), batch_rows=1)
    imported = agent.__class__(**{**vars(agent), "account_id": target_admin.account_id})
    assert await assert_pinned_lists_kept(second, imported) == kept
    assert await pinned_lists(second, imported) == kept


async def _edited_after_import(target: AppState, lines: list[str]) -> str:
    """The last record imported, edited in the target since: importing it again conflicts."""
    memory = json.loads(lines[-1])["row"]["memory_id"]
    async with target.pool.acquire() as conn:
        await conn.execute(
            "UPDATE agent_memories SET summary = 'edited here' WHERE memory_id = $1",
            uuid.UUID(memory),
        )
    return memory


async def test_a_conflicting_id_is_refused(state, admin, second):
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    await load(second, target_admin.account_id, lines)
    memory = await _edited_after_import(second, lines)
    with pytest.raises(Conflict, match=f"memory {memory} already exists"):
        await load(second, target_admin.account_id, lines)
    # The refusal names the row's line, in the middle of its batch as at its end; the file's
    # ID in capitals is the same ID.
    at = next(i for i, x in enumerate(lines) if memory in x and '"type":"memory"' in x)
    edited = [*lines[:at], lines[at].replace(memory, memory.upper()), *lines[at + 1 :]]
    for batch_rows in (1000, 2):
        with pytest.raises(Conflict, match=f"^line {at + 1}: memory {memory} already"):
            await load(second, target_admin.account_id, edited, batch_rows=batch_rows)
    # So is a row of another type that differs, the first the file holds.
    session = next(i for i, x in enumerate(lines) if json.loads(x)["type"] == "session")
    async with second.pool.acquire() as conn:
        await conn.execute(
            "UPDATE sessions SET turns = turns + 1 WHERE account_id = $1",
            target_admin.account_id,
        )
    with pytest.raises(Conflict, match=f"^line {session + 1}: session s1 of action"):
        await load(second, target_admin.account_id, lines)


async def test_a_session_a_turn_starts_while_the_import_writes_it_stops_the_import(
    state, admin, second
):
    """A turn of the imported agent that starts in a session of the file while the import
    writes that session (its row inserted, not yet committed, when the import looks for rows
    with other content) holds its own turn count: the import stops with CONFLICT naming the
    session, as for a row there before, and never leaves the turn's row with the imported
    turns' numbers (two turns of the session numbered 1)."""
    from app.executions import store as executions_store

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target = (await admin_of(second)).account_id
    # The agent first (a file cut short after its versions): turns can start on it.
    head = [x for x in lines if json.loads(x)["type"] in ("header", "action", "action_version")]
    await load(second, target, head)
    async with second.pool.acquire() as conn:
        turn = conn.transaction()
        await turn.start()  # a turn's start: the session ensured, not yet committed
        await executions_store.ensure_session(conn, target, agent.action_id, "s1")
        importing = asyncio.create_task(load(second, target, lines))
        async with asyncio.timeout(30):  # the import waits for the turn's row
            while not await second.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INSERT INTO sessions%'"
            ):
                assert not importing.done(), importing.result()
                await asyncio.sleep(0.01)
        await turn.commit()
    with pytest.raises(Conflict, match="session s1 of action .* already exists"):
        await importing
    async with second.pool.acquire() as conn:
        assert (
            await conn.fetchval(
                "SELECT turns FROM sessions WHERE account_id = $1 AND session_id = 's1'", target
            )
            == 0
        )
        assert not await conn.fetchval(
            "SELECT count(*) FROM executions WHERE account_id = $1 AND session_id = 's1'", target
        )


async def test_an_import_into_an_account_deleted_meanwhile_says_so(state, admin, second):
    """`--account`'s account deleted as the import checks the file (it was there when the
    import began): its first write waits for the deletion, finds no account and says so (it
    said the file was cut short), and nothing from the file is kept."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    async with second.pool.acquire() as conn:
        account = (await auth_store.insert_account(conn, uuid.uuid4(), "acme"))["account_id"]
    url = second.settings.database_url_value()
    assert url is not None
    async with holding(url, "DELETE FROM accounts WHERE account_id = $1", account):
        importing = asyncio.create_task(load(second, account, lines))
        async with asyncio.timeout(30):  # the import's first write waits for the deletion
            while not await second.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INSERT INTO actions%'"
            ):
                assert not importing.done(), importing.result()
                await asyncio.sleep(0.01)
    with pytest.raises(NotFound) as refused:
        await importing
    assert refused.value.message == (
        f"account {account} was deleted while the import ran; nothing from the file was kept"
    )
    assert set((await table_counts(second)).values()) == {0}


async def test_an_import_that_fails_reports_its_own_error(state, admin, second, monkeypatch):
    """The pinned lists' recount after a failed import cannot hide why the import failed
    (a database that stopped answering fails both)."""
    from app.transfer import service as transfer_service

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    await load(second, target_admin.account_id, lines)
    await _edited_after_import(second, lines)

    async def recount_fails(self) -> None:
        raise ConnectionResetError("the database went away")

    monkeypatch.setattr(transfer_service._Importer, "count_pinned_lists", recount_fails)
    with pytest.raises(Conflict, match="already exists"):
        await load(second, target_admin.account_id, lines)


# Whether the agent has its own search indexes (listed by maintenance).
INDEXED = "SELECT count(*) FROM agent_indexes WHERE action_id = $1"


async def test_cli_export_and_import(state, admin, db_url, second, tmp_path):
    agent = await build_agent(state, admin)
    before = await reads(GQL(state), admin, agent.action_id)
    path = tmp_path / "agent.jsonl"
    done = run(
        clean_env(database_url=db_url), "export", "--action", str(agent.action_id), "-o", str(path)
    )
    assert done.returncode == 0, done.stderr
    assert "exported action" in done.stderr
    target_url = second.settings.database_url_value()
    # Past the (lowered) threshold: the import builds the agent's own search indexes itself.
    env = clean_env(database_url=target_url, agent_index_min_records="2")
    imported = run(env, "import", str(path))
    assert imported.returncode == 0, imported.stderr
    assert "vectors copied" in imported.stdout
    assert await second.pool.fetchval(INDEXED, agent.action_id) == 1
    # It says when the build it waited for is done (a large agent's takes minutes).
    assert f"built search indexes for agent {agent.action_id} in " in imported.stderr
    target_admin = await admin_of(second)
    assert await reads(GQL(second), target_admin, agent.action_id) == before
    again = run(clean_env(database_url=target_url), "import", str(path))
    assert again.returncode == 0 and "imported 0 rows" in again.stdout
    missing = run(clean_env(database_url=target_url), "export", "--action", str(uuid.uuid4()))
    assert missing.returncode == 2 and "not found" in missing.stderr
    # A failed export leaves a file already there as it was (it is written beside it first).
    kept = path.read_bytes()
    failed = run(
        clean_env(database_url=target_url), "export", "--action", str(uuid.uuid4()), "-o", str(path)
    )
    assert failed.returncode == 2 and path.read_bytes() == kept
    assert not path.with_name(path.name + ".partial").exists()
    # A file cut short imports what it holds, and says so with an error.
    short = tmp_path / "short.jsonl"
    short.write_text("".join(path.read_text().splitlines(keepends=True)[:4]))
    cut = run(clean_env(database_url=target_url), "import", str(short))
    assert cut.returncode == 2 and "the file is cut short" in cut.stderr
    # Arguments a person can get wrong: refused with a message, never a traceback.
    for args, said in [
        (["import", "--batch-size", "0", str(path)], "must be an integer at least 1"),
        (["import", str(tmp_path / "nowhere.jsonl")], "cannot read"),
        (["export", "--action", str(agent.action_id), "-o", "/nonexistent/x.jsonl"], "No such"),
        (["account", "create", os.fsdecode(b"bad\xffname")], "is not valid text"),
    ]:
        refused = run(clean_env(database_url=target_url), *args)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr


async def test_cli_export_of_a_tenants_agent_without_account_says_to_pass_it(
    state, admin, db_url, monkeypatch, capsys
):
    """Without --account the agent is looked for in the default account (made, with `admin`, as
    the service's start makes it before any tenant): a tenant's agent is NOT_FOUND there, and
    the error says that --account is what it needs."""
    from factories import caller, make_account

    account = await make_account(state, "acme")
    owner = caller(account, {"effect": "ALLOW", "actions": ["INSERT"], "resources": ["*"]})
    agent = await make_agent(state, owner)
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    args = ["export", "--action", str(agent.action_id)]
    code = await asyncio.to_thread(cli.main, args)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error (NOT_FOUND): action ")
    assert "an agent of another account needs --account ID" in err
    code = await asyncio.to_thread(cli.main, [*args, "--account", str(account)])
    assert code == 0 and '"type": "header"' in capsys.readouterr().out


async def test_cli_export_summary_counts_each_kind_in_english(
    state, admin, db_url, monkeypatch, capsys
):
    """The line `engram export` ends with names each kind of row it counts as English does, one
    or several: it read "1 action, 0 session, 3 memory_version"."""
    bare = await make_agent(state, admin)
    built = await build_agent(state, admin)
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    said = []
    for agent in (bare, built):
        code = await asyncio.to_thread(cli.main, ["export", "--action", str(agent.action_id)])
        err = capsys.readouterr().err
        assert code == 0, err
        said.append(err)
    assert said[0] == (
        f"exported action {bare.action_id}: 1 action, 1 action version, 0 sessions, "
        "0 executions, 0 transcript events, 0 memory versions, 0 memories\n"
    )
    assert said[1] == (
        f"exported action {built.action_id}: 1 action, 2 action versions, 1 session, "
        "5 executions, 0 transcript events, 12 memory versions, 9 memories\n"
    )
    # Every kind an export counts is named in the line.
    assert set(store.BY_KIND) == {
        "action",
        "action_version",
        "session",
        "execution",
        "transcript_event",
        "memory_version",
        "memory",
    }


async def test_an_export_during_an_interrupted_reembed_leaves_the_vectors_out(
    state, admin, db_url, second, tmp_path
):
    # An `engram reembed` stopped part way leaves vectors of two models, or none, under the old
    # model's name: copied, they would give the target records without vectors, or of another
    # model. The export leaves them out, says so, and the import embeds the records again.
    agent = await build_agent(state, admin)
    before = await reads(GQL(state), admin, agent.action_id)
    unembedded = "SELECT count(*) FROM agent_memories WHERE embedding IS NULL"
    without_vectors = await state.pool.fetchval(unembedded)  # (deleted records have none)
    async with state.pool.acquire() as conn, conn.transaction():
        # What `engram reembed` to a 48-d model does before its first batch (app/embeddings).
        await embeddings_store.set_reembed_target(conn, "openai:test-embed", 48)
        await embeddings_store.reset_vectors(conn, 48, VECTOR_COLUMNS)
    path = tmp_path / "agent.jsonl"
    export = ("export", "--action", str(agent.action_id), "-o", str(path))
    done = run(clean_env(database_url=db_url), *export)
    assert done.returncode == 0, done.stderr
    assert "the vectors are left out: an `engram reembed` was interrupted" in done.stderr
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["embeddings"] is False
    assert all("embedding" not in line["row"] for line in lines[1:])
    imported = run(
        clean_env(database_url=second.settings.database_url_value()), "import", str(path)
    )
    assert imported.returncode == 0, imported.stderr
    assert "vectors re-embedded" in imported.stdout
    assert await second.pool.fetchval("SELECT count(*) FROM agent_memories") > 0
    assert await second.pool.fetchval(unembedded) == without_vectors
    assert await reads(GQL(second), await admin_of(second), agent.action_id) == before


async def many_records(state, admin, count: int) -> Any:
    """An agent with `count` records (rows as the memory layer writes them, one version each)."""
    agent = await make_agent(state, admin)
    await state.pool.execute(
        """
        INSERT INTO agent_memories
            (account_id, action_id, memory_id, version, created, modified, summary, content,
             status, scope, kind, source, execution_id, invocation_number, action_version,
             modified_by, embedding)
        SELECT $1, $2, gen_random_uuid(), 1, now(), now(), 'fact ' || i, repeat('evidence ', 20),
               'ACTIVE', 'AGENT', 'fact', 'TOOL', gen_random_uuid(), 1, 1, 'agent',
               array_fill(0.0625::real, ARRAY[256])::vector
        FROM generate_series(1, $3) AS i
        """,
        admin.account_id,
        agent.action_id,
        count,
    )
    return agent


async def test_cli_export_to_a_file_another_export_is_writing_is_refused(
    state, admin, db_url, tmp_path
):
    """Two exports to one file at once (a nightly job that overran): the second emptied the
    first's .partial and wrote into it too, and the first then put that file in place of the
    good one there was. The .partial is held while it is written: the second is refused and
    touches nothing. One a killed export left (nobody holds it) is taken and written anew."""
    agent = await make_agent(state, admin)
    path = tmp_path / "agent.jsonl"
    path.write_text("an earlier export\n")
    partial = tmp_path / "agent.jsonl.partial"
    env = clean_env(database_url=db_url)
    command = ["export", "--action", str(agent.action_id), "-o", str(path)]
    with open(partial, "w") as writing:  # another export's, under way
        writing.write('{"type": "header", "format": "engram-export"}\n')
        writing.flush()
        fcntl.flock(writing.fileno(), fcntl.LOCK_EX)
        result = await asyncio.to_thread(run, env, *command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"engram: {path}: another export is writing it now (agent.jsonl.partial is in use): "
            "run this one once it has ended"
        ]
        assert partial.read_text() == '{"type": "header", "format": "engram-export"}\n'
        assert path.read_text() == "an earlier export\n"
    # Left by an export that was killed: nobody holds it.
    result = await asyncio.to_thread(run, env, *command)
    assert result.returncode == 0, result.stderr
    assert json.loads(path.read_text().splitlines()[0])["type"] == "header"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.jsonl"]


def _patched_env(db_url: str, tmp_path: Path, code: str) -> dict[str, str]:
    """The environment of an `engram` command on the test database that runs `code` at its
    start (a `sitecustomize` in tmp_path)."""
    (tmp_path / "sitecustomize.py").write_text(code)
    env = clean_env(database_url=db_url)
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    return env


# Python run with this sitecustomize stops as the export is about to lock the .partial it has
# opened, until the file `go` beside it is made (its first lock only).
_WAIT_BEFORE_LOCK = (
    "import fcntl, pathlib, time\n"
    "flock = fcntl.flock\n"
    "here = pathlib.Path(__file__).parent\n"
    "def waited(fd, op):\n"
    "    if not (here / 'go').exists():\n"
    "        (here / 'opened').touch()\n"
    "        while not (here / 'go').exists():\n"
    "            time.sleep(0.01)\n"
    "    return flock(fd, op)\n"
    "fcntl.flock = waited\n"
)


@pytest.mark.parametrize("ended", ["placed", "failed"])
async def test_cli_export_that_opened_the_partial_of_one_that_just_ended_holds_its_own(
    state, admin, db_url, tmp_path, ended
):
    """An export that opened the .partial as another export ended (its file took its name, or it
    failed and removed it) locked that file, no longer the .partial, and wrote a new .partial
    by name that nobody held: a third export to the same file took it and wrote into it too.
    The lock is taken again on the .partial there is now."""
    agent = await many_records(state, admin, 3000)
    path = tmp_path / "out" / "agent.jsonl"
    path.parent.mkdir()
    path.write_text("an earlier export\n")
    partial = path.with_name(path.name + ".partial")
    env = _patched_env(db_url, tmp_path, _WAIT_BEFORE_LOCK)
    export = [*engram_command(), "export", "--action", str(agent.action_id), "-o", str(path)]
    with open(partial, "w") as first:  # an export under way, which ends as the second opens it
        fcntl.flock(first.fileno(), fcntl.LOCK_EX)
        proc = await asyncio.create_subprocess_exec(*export, env=env, stdout=PIPE, stderr=PIPE)
        while not (tmp_path / "opened").exists():
            assert proc.returncode is None, await proc.communicate()
            await asyncio.sleep(0.01)
        if ended == "placed":
            first.write("the first export\n")
            first.flush()
            os.replace(partial, path)
        else:
            partial.unlink()
    (tmp_path / "go").touch()
    try:
        while not partial.exists() or partial.stat().st_size == 0:
            assert proc.returncode is None, await proc.communicate()
            await asyncio.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        # A third export now: the .partial the second writes is held.
        with open(partial) as third, pytest.raises(BlockingIOError):
            fcntl.flock(third.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        proc.send_signal(signal.SIGCONT)
    err = await stderr_once_ended(proc, "the export did not end")
    assert proc.returncode == 0, err
    assert len(path.read_text().splitlines()) > 3000
    assert sorted(p.name for p in path.parent.iterdir()) == ["agent.jsonl"]


@pytest.mark.parametrize(
    ("kind", "said"), [("link", "a link"), ("directory", "a directory"), ("fifo", "a FIFO")]
)
async def test_cli_export_whose_partial_name_is_no_file_is_refused_touching_nothing(
    state, admin, db_url, tmp_path, kind, said
):
    """FILE.partial a link: the export was written into the file it points at (another file of
    the user's, gone), and the link put in place of FILE; a directory: refused as "FILE: Is a
    directory", of a FILE that is a file; a FIFO: the export waited, for ever, for a writer."""
    agent = await make_agent(state, admin)
    path = tmp_path / "out" / "agent.jsonl"
    path.parent.mkdir()
    path.write_text("an earlier export\n")
    partial = path.with_name(path.name + ".partial")
    other = tmp_path / "notes.txt"
    other.write_text("the user's notes\n")
    if kind == "link":
        partial.symlink_to(other)
    elif kind == "directory":
        partial.mkdir()
    else:
        os.mkfifo(partial)
    command = ["export", "--action", str(agent.action_id), "-o", str(path)]
    result = await asyncio.to_thread(run, clean_env(database_url=db_url), *command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"engram: {path}: agent.jsonl.partial, which the export writes first, is {said}: "
        "remove it, or name another file"
    ]
    assert path.read_text() == "an earlier export\n"
    assert other.read_text() == "the user's notes\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["agent.jsonl", "agent.jsonl.partial"]
    assert partial.is_symlink() == (kind == "link")


def test_cli_export_under_a_umask_without_the_owners_write_writes_its_file():
    """Under `umask 0222` (files made read-only) the export made its .partial, then could not
    open it to write: every export to a file failed, "Permission denied". And a .partial such
    an export left when killed, read-only, was refused "Permission denied" at every export
    after. (The file as the export writes it, in a process of its own: another user than root,
    whom no mode keeps from writing, cannot reach the test database.)"""
    folder = scratch_dir("engram-export-umask-")  # (tmp_path is private to its user)
    user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

    def export(text: str) -> subprocess.CompletedProcess[str]:
        write = (
            "import sys\n"
            "from app.cli import _file_or_std\n"
            "with _file_or_std(sys.argv[1], 'w') as f:\n"
            f"    f.write({text!r})\n"
        )
        return subprocess.run(
            [*(user if os.geteuid() == 0 else []), "sh", "-c", 'umask 0222 && exec "$@"', "sh"]
            + [sys.executable, "-c", write, str(path)],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        folder.chmod(0o777)
        path = folder / "agent.jsonl"
        result = export("the export\n")
        assert result.returncode == 0, result.stderr
        assert path.read_text() == "the export\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
        assert os.listdir(folder) == ["agent.jsonl"]

        partial = folder / "agent.jsonl.partial"
        partial.write_text("a killed export's first rows\n")
        partial.chmod(0o444)
        if os.geteuid() == 0:
            os.chown(partial, 65534, 65534)
        again = export("again\n")
        assert again.returncode == 0, again.stderr
        assert path.read_text() == "again\n"
        assert os.listdir(folder) == ["agent.jsonl"]
    finally:
        shutil.rmtree(folder)


def test_cli_export_locking_its_partial_gives_up_when_it_never_holds_it(tmp_path, monkeypatch):
    """Each pass of the lock taken again (the .partial's name no longer naming the file locked:
    another export ended just then) is bounded: told as another export writing it, every
    descriptor closed, where the loop had no end."""
    monkeypatch.setattr(cli, "_names", lambda path, known: False)
    opened = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as refused:
        cli._partial_held(tmp_path / "agent.jsonl.partial", str(tmp_path / "agent.jsonl"))
    assert refused.value.errno == errno.EBUSY
    assert "another export is writing it now" in str(refused.value)
    assert len(os.listdir("/proc/self/fd")) == opened


@pytest.mark.parametrize(
    ("name", "said"), [("agent.jsonl/", "Not a directory"), ("folder/", "Is a directory")]
)
async def test_cli_export_to_a_name_ending_in_a_slash_writes_no_file(
    state, admin, db_url, tmp_path, name, said
):
    """The slash was dropped (`Path.resolve`): `-o agent.jsonl/` replaced the file agent.jsonl,
    `-o folder/` wrote a file named folder. Refused as a shell's `>` refuses them."""
    agent = await make_agent(state, admin)
    (tmp_path / "agent.jsonl").write_text("an earlier export\n")
    command = ["export", "--action", str(agent.action_id), "-o", f"{tmp_path}/{name}"]
    result = await asyncio.to_thread(run, clean_env(database_url=db_url), *command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"engram: {tmp_path}/{name}: {said}"]
    assert (tmp_path / "agent.jsonl").read_text() == "an earlier export\n"
    assert os.listdir(tmp_path) == ["agent.jsonl"]


async def test_cli_export_to_a_link_to_itself_is_refused_in_one_line(
    state, admin, db_url, tmp_path
):
    agent = await make_agent(state, admin)
    path = tmp_path / "agent.jsonl"
    path.symlink_to(path)
    command = ["export", "--action", str(agent.action_id), "-o", str(path)]
    result = await asyncio.to_thread(run, clean_env(database_url=db_url), *command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"engram: {path}: Too many levels of symbolic links"]
    assert os.listdir(tmp_path) == ["agent.jsonl"] and path.is_symlink()


async def test_cli_export_to_an_empty_file_name_is_refused_before_it_runs(state, admin, db_url):
    """`-o ""` was taken for the folder the command runs in: the whole export was written, then
    refused as it took the name (`engram: /parent/folder.partial: Is a directory`)."""
    agent = await make_agent(state, admin)
    command = ["export", "--action", str(agent.action_id), "-o", ""]
    result = await asyncio.to_thread(run, clean_env(database_url=db_url), *command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "error (BAD_REQUEST): -o names no file: give the file to write, or - for standard output"
    ]


def test_cli_export_to_a_file_that_cannot_be_made_names_that_file(db_url, tmp_path):
    """The line named the `.partial` file the export writes first, which the user never
    asked for (`engram: /x/agent.jsonl.partial: No such file or directory`)."""
    path = tmp_path / "no such folder" / "agent.jsonl"
    agent = str(uuid.uuid4())
    result = run(clean_env(database_url=db_url), "export", "--action", agent, "-o", str(path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"engram: {path}: No such file or directory"]


async def engram_started(
    db_url: str, ctrl_c: Any, *args: str, **streams: Any
) -> asyncio.subprocess.Process:
    """`engram ARGS` on the test database, with Ctrl-C as a shell leaves it: default in a
    terminal, ignored (`signal.SIG_IGN`) for a command it started in the background."""
    return await asyncio.create_subprocess_exec(
        *engram_command(),
        *args,
        env=clean_env(database_url=db_url),
        preexec_fn=lambda: signal.signal(signal.SIGINT, ctrl_c),
        **streams,
    )


async def stderr_once_ended(proc: asyncio.subprocess.Process, held: str) -> str:
    """What `proc` wrote on stderr, once it ended; killed and failed with `held` if it has not
    within 30 s (a stop that never ends held a whole CI run once)."""
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        raise AssertionError(held) from None
    return err.decode()


@pytest.mark.parametrize(
    ("sig", "status", "said", "ctrl_c"),
    [
        (signal.SIGINT, 130, "interrupted", signal.SIG_DFL),
        (signal.SIGTERM, 143, "stopped by SIGTERM", signal.SIG_DFL),
        # Started in the background by a shell, which ignores Ctrl-C for it.
        (signal.SIGTERM, 143, "stopped by SIGTERM", signal.SIG_IGN),
    ],
)
async def test_cli_export_stopped_part_way_leaves_no_file_and_says_so(
    state, admin, db_url, tmp_path, sig, status, said, ctrl_c
):
    agent = await many_records(state, admin, 5000)
    path = tmp_path / "agent.jsonl"
    path.write_text("an earlier export\n")
    partial = path.with_name(path.name + ".partial")
    export = ("export", "--action", str(agent.action_id), "-o", str(path))
    proc = await engram_started(db_url, ctrl_c, *export, stdout=PIPE, stderr=PIPE)
    # Until the export has written to the file (the .partial is made before its event loop
    # starts, and a signal while asyncio builds the loop leaves Python's "Exception ignored"
    # lines of the half-made loop on stderr).
    while not partial.exists() or partial.stat().st_size == 0:
        assert proc.returncode is None, await proc.communicate()
        await asyncio.sleep(0.01)
    # Stopped while it writes the file, so that the signal comes before the export ends.
    proc.send_signal(signal.SIGSTOP)
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    err = await stderr_once_ended(proc, f"{sig.name} left the export running")
    assert proc.returncode == status and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"engram export {said}: no file was written (a file already there is as it was); what "
        "went to standard output is cut short, and an import refuses it as such"
    )
    assert path.read_text() == "an earlier export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.jsonl"]


# Python run with this sitecustomize sends itself SIGTERM as an event loop is made (before
# its self-pipe, where one stopped half made printed "Exception ignored ... no attribute
# '_ssock'" at exit), or just after one closed (which puts back SIGTERM's default: the export
# was killed without a word, its .partial file left).
_SIGTERM_AT = {
    "made": "from asyncio.selector_events import BaseSelectorEventLoop as Loop\n"
    "made = Loop._make_self_pipe\n"
    "def _make_self_pipe(self):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    made(self)\n"
    "Loop._make_self_pipe = _make_self_pipe\n",
    "closed": "from asyncio.unix_events import _UnixSelectorEventLoop as Loop\n"
    "closed = Loop.close\n"
    "def close(self):\n"
    "    closed(self)\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "Loop.close = close\n",
    # As `made`, and again as the export removes its .partial file: a second SIGTERM raised a
    # KeyboardInterrupt in the first one's cleanup, which left the file (and a traceback).
    "twice": "from asyncio.selector_events import BaseSelectorEventLoop as Loop\n"
    "import pathlib\n"
    "made = Loop._make_self_pipe\n"
    "def _make_self_pipe(self):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    made(self)\n"
    "Loop._make_self_pipe = _make_self_pipe\n"
    "unlink = pathlib.Path.unlink\n"
    "def removed(self, *args, **kwargs):\n"
    "    if self.name.endswith('.partial'):\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "    unlink(self, *args, **kwargs)\n"
    "pathlib.Path.unlink = removed\n",
}


# Ctrl-C as the shell leaves it: default in a terminal, ignored for a command it started in
# the background.
CTRL_C = pytest.mark.parametrize("ctrl_c", [signal.SIG_DFL, signal.SIG_IGN], ids=["fg", "bg"])


async def _export_patched(
    db_url: str, tmp_path: Path, agent: Any, patch: str, ctrl_c: Any = signal.SIG_DFL
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`engram export` of `agent` over an earlier export at tmp_path/out/agent.jsonl, with
    `patch` (Python under `import os, signal`) run at its start by a `sitecustomize`, and Ctrl-C
    as `ctrl_c`: its result and the file's path."""
    env = _patched_env(db_url, tmp_path, f"import os, signal\n{patch}")
    path = tmp_path / "out" / "agent.jsonl"
    path.parent.mkdir()
    path.write_text("an earlier export\n")
    result = await asyncio.to_thread(
        subprocess.run,
        [*engram_command(), "export", "--action", str(agent.action_id), "-o", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, ctrl_c),
    )
    return result, path


@CTRL_C
@pytest.mark.parametrize("moment", sorted(_SIGTERM_AT))
async def test_cli_export_stopped_as_its_event_loop_is_made_or_closed_or_twice_says_so(
    state, admin, db_url, tmp_path, moment, ctrl_c
):
    agent = await make_agent(state, admin)
    result, path = await _export_patched(db_url, tmp_path, agent, _SIGTERM_AT[moment], ctrl_c)
    assert result.returncode == 143, result.stderr
    assert result.stderr.splitlines() == [
        "engram export stopped by SIGTERM: no file was written (a file already there is as it "
        "was); what went to standard output is cut short, and an import refuses it as such"
    ], result.stderr
    assert path.read_text() == "an earlier export\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["agent.jsonl"]


# Python run with this sitecustomize sends itself SIGNAL as the export's finished file has
# taken its name: as `os.replace` returns, or in the cleanup just after, as it asks whether the
# .partial name is still its own to remove (a stop raised in that cleanup skipped the check of
# whether the file took its name: it said "no file was written" with the new file in place).
_SIGNAL_ONCE_PLACED = {
    "replace": "replace = os.replace\n"
    "def replaced(source, target, **kwargs):\n"
    "    replace(source, target, **kwargs)\n"
    "    if str(target).endswith('agent.jsonl'):\n"  # (not another library's)
    "        os.kill(os.getpid(), SIGNAL)\n"
    "os.replace = replaced\n",
    # (once it has replaced the file: the .partial name is asked after as it is locked, too)
    "cleanup": "stat, replace = os.stat, os.replace\n"
    "placed = []\n"
    "def replaced(source, target, **kwargs):\n"
    "    replace(source, target, **kwargs)\n"
    "    placed.append(target)\n"
    "def stated(path, *args, **kwargs):\n"
    "    if placed and str(path).endswith('agent.jsonl.partial'):\n"
    "        os.kill(os.getpid(), SIGNAL)\n"
    "    return stat(path, *args, **kwargs)\n"
    "os.stat, os.replace = stated, replaced\n",
}


@pytest.mark.parametrize("moment", sorted(_SIGNAL_ONCE_PLACED))
@pytest.mark.parametrize(
    ("sig", "status", "how"),
    [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")],
)
async def test_cli_export_stopped_as_its_file_takes_its_name_says_it_was_written(
    state, admin, db_url, tmp_path, sig, status, how, moment
):
    """A stop that came as the finished file replaced the one there was told "no file was
    written (a file already there is as it was)", while the new file was in place."""
    agent = await make_agent(state, admin)
    patch = f"SIGNAL = {int(sig)}\n{_SIGNAL_ONCE_PLACED[moment]}"
    result, path = await _export_patched(db_url, tmp_path, agent, patch)
    assert result.returncode == status, result.stderr
    assert result.stderr.splitlines() == [
        f"engram export {how}: it came after {path} was written in full"
    ], result.stderr
    assert json.loads(path.read_text().splitlines()[0])["type"] == "header"
    assert sorted(p.name for p in path.parent.iterdir()) == ["agent.jsonl"]


@pytest.mark.parametrize(
    ("output", "sig", "said"),
    [
        (
            "-",
            signal.SIGTERM,
            "stopped by SIGTERM: it came after the export was written in full to standard output",
        ),
        (
            "/dev/stdout",
            signal.SIGINT,
            "interrupted: it came after /dev/stdout was written in full",
        ),
    ],
)
async def test_cli_export_to_standard_output_stopped_once_written_says_it_was_written(
    state, admin, db_url, tmp_path, output, sig, said
):
    """A stop that came as the export said it was done (its last line, on stderr), with the
    whole export on standard output or in a device, was told "what went to standard output is
    cut short, and an import refuses it as such"."""
    agent = await make_agent(state, admin)
    env = _patched_env(
        db_url,
        tmp_path,
        "import builtins, os\n"
        "said = builtins.print\n"
        "def print(*args, **kwargs):\n"
        "    if args and str(args[0]).startswith('exported action'):\n"
        f"        os.kill(os.getpid(), {int(sig)})\n"
        "    said(*args, **kwargs)\n"
        "builtins.print = print\n",
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [*engram_command(), "export", "--action", str(agent.action_id), "-o", output],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 128 + sig, result.stderr
    assert result.stderr.splitlines() == [f"engram export {said}"], result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 1 + sum(rows[0]["counts"].values())


@CTRL_C
async def test_cli_import_waiting_on_a_stalled_pipe_is_stopped_by_sigterm(db_url, ctrl_c):
    """Standard input from a pipe is copied (the import reads it twice): copied inside the
    event loop, a writer that stalled kept the import waiting past SIGTERM, whose cancelling of
    the work waits for the loop's next turn, which a read that does not return never reaches."""
    read, write = os.pipe()
    try:
        proc = await engram_started(
            db_url, ctrl_c, "import", "-", stdin=read, stdout=PIPE, stderr=PIPE
        )
        os.write(write, b'{"type": "header", "format": "engram-export"')  # and nothing more
        # Until the import has read it: then it waits on the pipe for the rest.
        while int.from_bytes(fcntl.ioctl(write, termios.FIONREAD, b"\0" * 4), "little"):
            assert proc.returncode is None, await proc.communicate()
            await asyncio.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        err = await stderr_once_ended(proc, "SIGTERM left the import waiting on its input")
    finally:
        os.close(read)
        os.close(write)
    assert proc.returncode == 143, err
    assert err.splitlines() == [
        f"engram import stopped by SIGTERM: {cli._INTERRUPTED['import']}"
    ], err


@CTRL_C
async def test_cli_export_to_a_pipe_nobody_reads_is_stopped_by_a_second_sigterm(
    state, admin, db_url, ctrl_c
):
    """Held in a write to a full pipe, the export's loop cannot turn, so the first SIGTERM's
    cancel never reaches the work; a second one stopped nothing either (a reader left waiting,
    a pipeline whose SIGTERM went to the export alone): only SIGKILL ended it."""
    agent = await many_records(state, admin, 200)
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)
    try:
        proc = await engram_started(
            db_url, ctrl_c, "export", "--action", str(agent.action_id), stdout=write, stderr=PIPE
        )
        os.close(write)
        write = -1
        # Until the pipe is full: the export waits in the kernel to write the rest.
        wchan = Path(f"/proc/{proc.pid}/wchan")
        for _ in range(6000):
            if "pipe_write" in wchan.read_text():
                break
            assert proc.returncode is None, await proc.communicate()
            await asyncio.sleep(0.01)
        else:
            said = wchan.read_text()
            proc.kill()
            raise AssertionError(f"the export never waited to write ({wchan}: {said})")
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        err = await stderr_once_ended(proc, "a second SIGTERM left the export held in its write")
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    assert proc.returncode == 143, err
    assert err.splitlines() == [
        f"engram export stopped by SIGTERM: {cli._INTERRUPTED['export']}"
    ], err


async def test_an_export_cut_in_a_line_is_refused_by_that_line(state, admin, second, tmp_path):
    # As an export to standard output stopped part way (a full disk, a reader gone) leaves it.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:5]) + "\n" + lines[5][: len(lines[5]) // 2])
    cut = run(clean_env(database_url=second.settings.database_url_value()), "import", str(short))
    assert cut.returncode == 2 and "Traceback" not in cut.stderr, cut.stderr
    assert cut.stderr.strip().splitlines()[-1] == (
        "error (BAD_REQUEST): line 6 is not JSON: the file is damaged or cut short"
    )
    assert set((await table_counts(second)).values()) == {0}


async def test_an_export_cut_in_its_header_is_refused_as_cut_short(state, admin, second, tmp_path):
    """It was told as a file of another kind ("its first line is not an export header")."""
    agent = await build_agent(state, admin)
    head = (await exported(state, admin, agent))[0]
    env = clean_env(database_url=second.settings.database_url_value())
    for cut in (head[:20], head[: len(head) // 2], head[:-1]):
        short = tmp_path / "short.jsonl"
        short.write_text(cut)
        refused = run(env, "import", str(short))
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.strip().splitlines()[-1] == (
            "error (BAD_REQUEST): line 1, the export's header, is not JSON: the file is damaged "
            "or cut short"
        ), cut
    short.write_text('{"type": "notes"}\n')
    other = run(env, "import", str(short))
    assert other.stderr.strip().splitlines()[-1] == (
        "error (BAD_REQUEST): this is not an Engram export: its first line is not an export header"
    )
    assert set((await table_counts(second)).values()) == {0}


async def test_cli_export_writes_through_a_link_and_into_a_fifo(state, admin, db_url, tmp_path):
    # A link stays a link, its file replaced; a FIFO (as /dev/stdout can be) is written into:
    # neither becomes a file of that name.
    agent = await make_agent(state, admin)
    env = clean_env(database_url=db_url)
    export = ("export", "--action", str(agent.action_id), "-o")
    target = tmp_path / "agent.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    done = run(env, *export, str(link))
    assert done.returncode == 0, done.stderr
    header = json.loads(target.read_text().splitlines()[0])
    assert link.is_symlink() and header["actionId"] == str(agent.action_id)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    try:
        done = run(env, *export, str(fifo))
        read, _ = reader.communicate(timeout=10)
    finally:
        reader.kill()
    assert done.returncode == 0, done.stderr
    assert json.loads(read.splitlines()[0])["actionId"] == str(agent.action_id)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.jsonl", "fifo", "link.jsonl"]


@pytest.mark.parametrize("size", ["large", "small"])
async def test_cli_export_to_a_full_disk_says_what_it_could_not_write(
    state, admin, db_url, tmp_path, size
):
    # /dev/full: every write fails with ENOSPC. The export says what it could not write, in
    # one line: a large export while it writes (its rows fill the output's buffer), a small
    # one (an agent without records) at its end, not at Python's exit.
    agent = await (build_agent(state, admin) if size == "large" else make_agent(state, admin))
    export = ["export", "--action", str(agent.action_id)]
    unbuffered = clean_env(database_url=db_url)
    buffered = {k: v for k, v in unbuffered.items() if k != "PYTHONUNBUFFERED"}  # as a shell
    outputs = [([], "standard output"), (["-o", "/dev/full"], "/dev/full")]
    for (output, named), env in itertools.product(outputs, [unbuffered, buffered]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [*engram_command(), *export, *output],
                env=env,
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
            )
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"error: cannot write {named}: No space left on device"
        ], done.stderr
    # A file: written beside it, whose write fails (past a limit on a file's size, as on a
    # full disk): named as given, the file already there left as it was.
    path = tmp_path / "agent.jsonl"
    path.write_text("kept")

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the write kills the process

    done = subprocess.run(
        [*engram_command(), *export, "-o", str(path)],
        env=buffered,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limited,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: cannot write {path}: File too large"]
    assert path.read_text() == "kept" and os.listdir(tmp_path) == ["agent.jsonl"]
    # A reader gone (`engram export | head`) is no such error: quiet, as other tools.
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [*engram_command(), *export], env=buffered, stdout=write, stderr=PIPE, timeout=120
        )
    finally:
        os.close(write)
    assert done.returncode == 1 and done.stderr == b""


def devnull_descriptors() -> int:
    """How many of this process's descriptors are open on /dev/null."""
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == os.devnull)


@pytest.mark.parametrize("output", ["full disk", "reader gone"])
async def test_cli_export_that_cannot_write_leaves_no_descriptor_open(
    state, admin, db_url, monkeypatch, output
):
    # Its standard output, which failed, is pointed at /dev/null (what is left in its buffer
    # would fail again at exit) through a descriptor closed once used: `main` called in a
    # process that goes on (as here) keeps none of them.
    agent = await build_agent(state, admin)
    if output == "full disk":
        out = open("/dev/full", "w")  # noqa: SIM115 (closed below)
    else:
        read, write = os.pipe()
        os.close(read)
        out = os.fdopen(write, "w")
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.setattr(sys, "stdout", out)
    before = devnull_descriptors()
    try:
        code = await asyncio.to_thread(cli.main, ["export", "--action", str(agent.action_id)])
        assert code == (2 if output == "full disk" else 1)
        # The output's own descriptor now is /dev/null's; no other one is.
        assert os.path.realpath(f"/proc/self/fd/{out.fileno()}") == os.devnull
        assert devnull_descriptors() == before + 1
    finally:
        out.close()


@pytest.mark.parametrize(
    ("command", "closed", "said"),
    [
        (["import", "-"], 0, "error: cannot read -: standard input is closed: name the file"),
        (["export", "--action"], 1, "engram: standard output is closed: name the file to write"),
    ],
)
async def test_cli_import_or_export_with_its_standard_stream_closed_says_so(
    state, admin, db_url, command, closed, said
):
    """Started with standard input or output closed (`<&-`, `>&-`), which Python makes None:
    the import ended in a traceback (`'NoneType' object is not iterable`), an export of an
    agent there is in one (`'NoneType' object has no attribute 'write'`) once it had read it."""
    agent = await build_agent(state, admin)
    if command[0] == "export":
        command = [*command, str(agent.action_id)]
    result = run_closed(clean_env(database_url=db_url), closed, *command)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(said), result.stderr


@pytest.mark.parametrize("output", ["/dev/stdout", "/dev/fd/1", "link"])
async def test_cli_export_to_standard_output_by_name_with_it_closed_says_so(
    state, admin, db_url, tmp_path, output
):
    """`engram export -o /dev/stdout >&-`: the export went into the /dev/null the closed
    descriptor is held on, exit status 0, "exported action ...", where `-o -` says standard
    output is closed."""
    agent = await make_agent(state, admin)
    if output == "link":
        (tmp_path / "out").symlink_to("/dev/stdout")
        output = str(tmp_path / "out")
    command = ["export", "--action", str(agent.action_id), "-o", output]
    result = await asyncio.to_thread(run_closed, clean_env(database_url=db_url), 1, *command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"engram: {output}: standard output is closed: name the file to write with -o FILE"
    ]


async def test_cli_with_standard_error_closed_writes_nothing_of_its_own_to_standard_output(
    state, admin, db_url, tmp_path
):
    """Started with standard error closed (`2>&-`), which Python makes None: the export and
    the import failed at once, without a word (`sys.stderr.isatty()`, exit status 1), and
    what they print on standard error went to standard output (`print(file=None)`), into an
    export written there. (Python itself, not the `engram` script, which may be a shell script
    that takes the closed descriptor for itself, such as pyenv's.)"""
    agent = await build_agent(state, admin)
    env = clean_env(database_url=db_url)
    path = tmp_path / "agent.jsonl"

    def engram(*args: str) -> subprocess.CompletedProcess[str]:
        return run_closed(env, 2, *args)

    exported = engram("export", "--action", str(agent.action_id), "-o", str(path))
    assert (exported.returncode, exported.stdout) == (0, "")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["type"] == "header"
    assert len(rows) == 1 + sum(rows[0]["counts"].values())
    to_stdout = engram("export", "--action", str(agent.action_id))
    assert to_stdout.returncode == 0
    # The export alone, each line a row (no "exported action ..." line after them).
    assert [json.loads(line)["type"] for line in to_stdout.stdout.splitlines()] == [
        row["type"] for row in rows
    ]
    imported = engram("import", str(path))
    assert imported.returncode == 0
    assert imported.stdout.startswith("imported 0 rows,"), imported.stdout
    refused = engram("export", "--action", "not-an-id")
    assert (refused.returncode, refused.stdout) == (2, "")


async def test_cli_import_from_standard_input_is_checked_before_it_is_written(
    state, admin, second, tmp_path
):
    # Standard input cannot be read twice: it is copied, checked, then written.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    env = clean_env(database_url=second.settings.database_url_value())

    def imported(text: str) -> subprocess.CompletedProcess[str]:
        command = [*engram_command(), "import", "-"]
        return subprocess.run(command, env=env, input=text, capture_output=True, text=True)

    bad = edited(lines, len(lines) - 1, summary="two\nlines")
    done = imported("\n".join(bad) + "\n")
    assert done.returncode == 2 and f"line {len(lines)}:" in done.stderr, done.stderr
    assert set((await table_counts(second)).values()) == {0}
    done = imported("\n".join(lines) + "\n")
    assert done.returncode == 0 and f"imported {len(lines) - 1} rows" in done.stdout, done.stderr


WAITS = "another process is running search maintenance"


@asynccontextmanager
async def import_waiting_for_maintenance(
    state: AppState, admin: Any, db_url: str, second: AppState, tmp_path: Any
) -> AsyncIterator[tuple[asyncio.subprocess.Process, uuid.UUID]]:
    """`engram import` of an agent past the index threshold into `second`, while this test
    holds search maintenance's lock as another process would: yields the command once it has
    said that its index builds wait, and the agent's ID; the lock is freed on exit."""
    agent = await build_agent(state, admin)
    path = tmp_path / "agent.jsonl"
    env = clean_env(database_url=db_url)
    assert run(env, "export", "--action", str(agent.action_id), "-o", str(path)).returncode == 0
    env = clean_env(database_url=second.settings.database_url_value(), agent_index_min_records="2")
    async with second.pool.acquire() as holder:
        await holder.execute(f"SELECT pg_advisory_lock({ROUND_LOCK})")
        command = await asyncio.create_subprocess_exec(
            *engram_command(),
            "import",
            str(path),
            env=env,
            stdout=PIPE,
            stderr=PIPE,
            # Ctrl-C's default, even where the test run was started with SIGINT ignored.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert command.stderr is not None
        before: list[str] = []
        try:
            async with asyncio.timeout(60):
                while WAITS not in (line := (await command.stderr.readline()).decode()):
                    assert line, "".join(before)  # ended without saying it
                    before.append(line)
            assert await second.pool.fetchval(INDEXED, agent.action_id) == 0
            yield command, agent.action_id
        except BaseException:
            await stopped(command)
            raise
        finally:
            await holder.execute(f"SELECT pg_advisory_unlock({ROUND_LOCK})")


async def stopped(command: asyncio.subprocess.Process) -> None:
    """Kills the command if it still runs (a failed test), so that it holds no connection."""
    if command.returncode is None:
        with suppress(ProcessLookupError):
            command.kill()
        await command.wait()


async def ended(command: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """The command's stdout and stderr once it ends by itself (within 60 s)."""
    try:
        return await asyncio.wait_for(command.communicate(), 60)
    finally:
        await stopped(command)


async def test_cli_import_says_when_its_index_builds_wait_for_another_process(
    state, admin, db_url, second, tmp_path
):
    # The rows are stored; the agent's own search indexes wait while another process holds
    # search maintenance's lock (a round of `engram serve`, say): the command says so once,
    # rather than hang silently, and builds them as soon as the lock is free.
    async with import_waiting_for_maintenance(state, admin, db_url, second, tmp_path) as (
        command,
        action_id,
    ):
        pass  # the lock is freed: the build goes on (within the 5 s between tries)
    out, rest = await ended(command)
    assert command.returncode == 0, rest.decode()
    assert b"imported " in out
    assert await second.pool.fetchval(INDEXED, action_id) == 1


async def test_cli_import_interrupted_while_waiting_keeps_the_rows(
    state, admin, db_url, second, tmp_path
):
    # Ctrl-C while the builds wait: the rows stay, the command says what to do, no traceback.
    async with import_waiting_for_maintenance(state, admin, db_url, second, tmp_path) as (
        command,
        action_id,
    ):
        command.send_signal(signal.SIGINT)
        out, rest = await ended(command)
    assert command.returncode == 130, rest.decode()
    assert "import interrupted" in rest.decode() and "Traceback" not in rest.decode()
    stored = "SELECT count(*) FROM agent_memories WHERE action_id = $1"
    assert await second.pool.fetchval(stored, action_id) > 0
    assert await second.pool.fetchval(INDEXED, action_id) == 0


SEARCH = """query($a: UUID!, $q: String) { action(actionId: $a) {
  searchMemories(query: $q, first: 5) { edges { score node { memoryId } } } } }"""


async def searched_alike(gql, admin, second, action_id, queries) -> None:
    """Each query finds something, and the same, in the exporting and the importing deployment."""
    target_admin = await admin_of(second)
    for q in queries:
        here = (await gql(admin, SEARCH, a=str(action_id), q=q)).ok()
        there = (await GQL(second)(target_admin, SEARCH, a=str(action_id), q=q)).ok()
        assert there == here and here["action"]["searchMemories"]["edges"]


async def test_search_finds_the_same_after_import(state, admin, gql, second):
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    await load(second, target_admin.account_id, lines)
    queries = ("where does the customer live", "email", "refund")
    await searched_alike(gql, admin, second, agent.action_id, queries)


@asynccontextmanager
async def unstarted(pg_server, embedder) -> AsyncIterator[tuple[AppState, uuid.UUID]]:
    """A deployment no service has started on yet (migrated, no embedding model recorded),
    and its default account."""
    from app.db import migrate

    name = f"engram_unstarted_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        await asyncio.to_thread(migrate.upgrade, url)
        pool = await create_pool(url, min_size=1, max_size=4)
        try:
            async with pool.acquire() as conn:
                account_id = await ensure_default_account(conn)
            yield AppState(settings=db_settings(url), pool=pool, embedder=embedder), account_id
        finally:
            await pool.close()


async def test_an_import_before_the_first_start_copies_the_files_vectors(
    state, admin, pg_server, embedder
):
    """A deployment no service has started on yet (migrated, no embedding model recorded):
    the import records the configured model, as a first start would, and copies the vectors
    of a file of that model rather than embedding every record again."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    async with unstarted(pg_server, embedder) as (target, account_id):
        async with target.pool.acquire() as conn:
            assert await embeddings_store.recorded_model(conn) is None
        result = await load(target, account_id, lines)
        assert (result.vectors, result.reembedded) == ("copied", 0)
        async with state.pool.acquire() as a, target.pool.acquire() as b:
            assert await embeddings_store.recorded_model(b) == {
                "name": embedder.name,
                "dimensions": embedder.dimensions,
            }
            query = "SELECT memory_id, embedding::text FROM agent_memories ORDER BY memory_id"
            assert [tuple(r) for r in await a.fetch(query)] == [
                tuple(r) for r in await b.fetch(query)
            ]


async def test_an_import_before_the_first_start_checks_the_vectors_length(
    state, admin, pg_server, embedder
):
    """Before the first start the vector columns have no dimensions yet (the import fixes
    them): a vector in the file of other dimensions than its model's is refused by the check,
    as once they are fixed, and nothing is written (it was refused by the write, part way,
    after the rows before it were stored)."""
    from app.errors import BadInput

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    last = max(i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory")
    lines = edited(lines, last, embedding=json.dumps([0.5] * (embedder.dimensions - 1)))
    async with unstarted(pg_server, embedder) as (target, account_id):
        before = await table_counts(target)
        said = f"line {last + 1}: its memory row is not valid .*dimensions"
        with pytest.raises(BadInput, match=said):
            await load(target, account_id, lines, batch_rows=1)
        assert await table_counts(target) == before


async def test_another_embedding_model_is_embedded_again(state, admin, gql, second):
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    header = json.loads(lines[0])
    header["embedder"] = {"name": "openai:text-embedding-3-small", "dimensions": 256}
    target_admin = await admin_of(second)
    result = await load(second, target_admin.account_id, [json.dumps(header), *lines[1:]])
    # Every record but the preview deletion (a tombstone has no vector) is embedded again.
    assert result.vectors == "re-embedded" and result.reembedded == 8
    async with second.pool.acquire() as conn:
        missing = await conn.fetchval(
            "SELECT count(*) FROM agent_memories WHERE embedding IS NULL AND NOT tombstone"
        )
    assert missing == 0


@pytest.mark.parametrize("edit", ["null", "no column"])
async def test_a_record_the_file_has_no_vector_for_is_embedded_again(
    state, admin, gql, second, edit
):
    # A file whose header says it has vectors, with a record without one (edited, or written
    # by hand): copied as it is, the record would be stored without a vector, found by no
    # search by meaning. It is embedded again, and the rest copied.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    assert json.loads(lines[0])["embeddings"]
    memories = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory"]
    if edit == "null":
        refund = next(i for i in memories if "refund" in json.loads(lines[i])["row"]["summary"])
        lines = edited(lines, refund, embedding=None)
    else:
        for i in memories:
            item = json.loads(lines[i])
            del item["row"]["embedding"]
            lines[i] = json.dumps(item)
    target_admin = await admin_of(second)
    result = await load(second, target_admin.account_id, lines)
    assert result.vectors == "copied" and result.reembedded == (1 if edit == "null" else 8)
    query = "SELECT memory_id, embedding::text FROM agent_memories ORDER BY memory_id"
    async with state.pool.acquire() as a, second.pool.acquire() as b:
        assert [tuple(r) for r in await a.fetch(query)] == [tuple(r) for r in await b.fetch(query)]
    queries = ("refund", "where does the customer live")
    await searched_alike(gql, admin, second, agent.action_id, queries)


async def test_cli_import_says_which_records_it_embedded_again(state, admin, second, tmp_path):
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    lines = edited(lines, first(lines, "memory"), embedding=None)
    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(lines) + "\n")
    imported = run(
        clean_env(database_url=second.settings.database_url_value()), "import", str(path)
    )
    assert imported.returncode == 0, imported.stderr
    assert (
        "vectors copied (1 records the file has no vector for: embedded again)" in imported.stdout
    )


@asynccontextmanager
async def exported_bare_to_openai(
    state, admin, pg_server, template_db, tmp_path
) -> AsyncIterator[tuple[Any, Path, OpenAIServer, dict[str, str]]]:
    """An agent exported without vectors, and a copy of the test's database whose embedder is
    a scripted OpenAI-compatible server's, its vectors re-embedded with it: (the agent, its
    export, the server, the environment `engram` runs in on the copy)."""
    agent = await build_agent(state, admin)
    bare = tmp_path / "bare.jsonl"
    bare.write_text("\n".join(await exported(state, admin, agent, embeddings=False)) + "\n")
    name = f"engram_openai_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with OpenAIServer() as server:
        async with database_copy(pg_server, template_db, name) as url:
            env = clean_env(
                database_url=url,
                embedder="openai",
                embedding_url=server.url,
                embedding_model=server.embedding_model,
            )
            assert run(env, "reembed").returncode == 0  # this deployment's model: the server's
            yield agent, bare, server, env


async def test_an_import_again_embeds_no_record_already_there(
    state, admin, pg_server, template_db, tmp_path
):
    """Records already imported are skipped: none is sent to the embedding model again, and the
    report counts only those it embedded (here none), whether the file has no vectors at all or
    lacks one for an edited record."""
    async with exported_bare_to_openai(state, admin, pg_server, template_db, tmp_path) as copy:
        agent, bare, server, env = copy

        def imported(path) -> tuple[str, list[str]]:
            before = len(server.requests_to("/v1/embeddings"))
            done = run(env, "import", str(path))
            assert done.returncode == 0, done.stderr
            sent = server.requests_to("/v1/embeddings")[before:]
            return done.stdout.strip(), [text for r in sent for text in r.body["input"]]

        said, texts = imported(bare)
        rows = int(said.split()[1])
        assert said == (
            f"imported {rows} rows, 0 already there unchanged; vectors re-embedded (8 records)"
        )
        assert len(texts) == 1 + 8  # the embedder's dimension probe, opening it; the records
        said, texts = imported(bare)
        nothing = "no record written, so no vector copied or embedded"
        assert said == f"imported 0 rows, {rows} already there unchanged; {nothing}"
        assert texts == []
        # Its own export, edited: a record without a vector, which it already holds.
        edited_path = tmp_path / "edited.jsonl"
        exported_again = run(
            env, "export", "--action", str(agent.action_id), "-o", str(edited_path)
        )
        assert exported_again.returncode == 0, exported_again.stderr
        lines = edited_path.read_text().splitlines()
        edited_path.write_text(
            "\n".join(edited(lines, first(lines, "memory"), embedding=None)) + "\n"
        )
        said, texts = imported(edited_path)
        assert said == f"imported 0 rows, {rows} already there unchanged; {nothing}"
        assert texts == []


async def test_an_import_refused_by_the_embedding_provider_names_its_address_not_its_words(
    state, admin, pg_server, template_db, tmp_path
):
    """The provider refuses the records sent, quoting them: the import prints its address and
    the status, not its words nor the records' text, as a log line leaves them out."""
    async with exported_bare_to_openai(state, admin, pg_server, template_db, tmp_path) as copy:
        _, bare, server, env = copy
        server.stall_next(1, 0.0)  # the dimension probe
        server.fail_next(1, status=400, message="cannot embed", quoting=True)
        done = run(env, "import", str(bare))
    assert done.returncode == 2, done.stderr
    (sent,) = [r.body["input"] for r in server.requests_to("/v1/embeddings")][-1:]
    refused = f"{server.url}/embeddings refused the request for model {server.embedding_model}"
    assert done.stderr.startswith(f"error: {refused} (HTTP 400)"), done.stderr
    assert "cannot embed" not in done.stderr, done.stderr
    assert not [text for text in sent if text.strip() in done.stderr], done.stderr


@pytest.mark.parametrize("embeddings", [False, True])
async def test_cli_import_of_new_rows_but_no_new_record_says_none_needed_embedding(
    state, admin, second, tmp_path, embeddings
):
    """A file whose records are all there already but some other row is not (here an
    execution) writes that row and embeds nothing: the import says so (the README's `no record
    needed embedding`), not `vectors re-embedded (0 records)` (a file without vectors) nor
    `vectors copied` (one with: none was)."""
    agent = await build_agent(state, admin)
    bare = await exported(state, admin, agent, embeddings=embeddings)
    path = tmp_path / "bare.jsonl"
    path.write_text("\n".join(bare) + "\n")
    target_admin = await admin_of(second)
    await load(second, target_admin.account_id, bare)
    async with second.pool.acquire() as conn:
        gone = await conn.execute(
            "DELETE FROM executions WHERE ctid = (SELECT ctid FROM executions LIMIT 1)"
        )
    assert gone == "DELETE 1"
    imported = run(
        clean_env(database_url=second.settings.database_url_value()), "import", str(path)
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("imported 1 rows, "), imported.stdout
    assert imported.stdout.rstrip().endswith("; no record needed embedding"), imported.stdout


@pytest.mark.parametrize(
    ("vector", "fault"),
    [
        ([[0.25, 0.5]] * 128, "item 0 is a list"),
        ([0.25] * 100 + [[0.25, 0.5]] + [0.25] * 155, "item 100 is a list"),
        ([0.25] * 7 + ["0.5"] + [0.25] * 248, "item 7 is text"),
    ],
)
async def test_cli_import_refuses_a_vector_that_is_not_a_list_of_numbers_in_one_line(
    state, admin, second, tmp_path, vector, fault
):
    # A vector written as a JSON list (an export writes a vector's text) holding a list or
    # text: named as such, not by PostgreSQL's message quoting the whole vector.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    line = first(lines, "memory")
    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(edited(lines, line, embedding=vector)) + "\n")
    done = run(clean_env(database_url=second.settings.database_url_value()), "import", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error (BAD_REQUEST): line {line + 1}: its memory row is not valid (embedding is not a "
        f"list of numbers: {fault})"
    ]
    assert set((await table_counts(second)).values()) == {0}


@pytest.mark.parametrize(
    ("first_line", "message"),
    [
        ('{"hello": 1}', "not an Engram export"),
        ('{"type": "header", "format": "engram-export", "version": 9}', "format version 9"),
    ],
)
async def test_a_file_that_is_not_an_export_is_refused(second, first_line, message):
    from app.errors import BadInput

    target_admin = await admin_of(second)
    with pytest.raises(BadInput, match=message):
        await load(second, target_admin.account_id, [first_line])


async def test_an_empty_file_is_said_empty(second):
    from app.errors import BadInput

    target_admin = await admin_of(second)
    with pytest.raises(BadInput, match="^the file is empty: an Engram export starts with its"):
        await load(second, target_admin.account_id, [])


@pytest.mark.parametrize(
    "content",
    [b"\n", b"\r\n", b"  \t\n\n   ", b"\xef\xbb\xbf", b"\xef\xbb\xbf\n", b"\xef\xbb\xbf \n\n"],
    ids=["newline", "crlf", "whitespace", "bom", "bom-newline", "bom-blank-lines"],
)
async def test_a_file_of_blank_lines_alone_is_said_empty(second, tmp_path, content):
    """A file holding a newline alone, whitespace, or a byte order mark (as an editor saves an
    empty file) was said not to be an export, as if it held another file's text; it holds none,
    as an empty file, read as `engram import` reads a file. A blank line before a header is
    still not an export's first line."""
    from app.errors import BadInput

    target_admin = await admin_of(second)
    path = tmp_path / "agent.jsonl"
    path.write_bytes(content)
    with (
        open(path, encoding="utf-8", errors="surrogateescape") as file,
        pytest.raises(BadInput, match="^the file is empty: an Engram export starts with its"),
    ):
        await load(second, target_admin.account_id, file)
    with pytest.raises(BadInput, match="^this is not an Engram export"):
        await load(second, target_admin.account_id, ["\n", '{"hello": 1}'])


async def test_damaged_lines_and_unknown_columns_are_refused(state, admin, second):
    from app.errors import BadInput

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    # A record whose current version's row the file lacks would have no history: it is
    # refused by its line, and nothing is stored (as for every row refused below: every row is
    # checked before any is written).
    current, unversioned = without_current_version(lines)
    assert len(unversioned) == len(lines) - 1
    at = next(i for i, x in enumerate(unversioned) if json.loads(x)["type"] == "memory")
    await refused(
        second,
        target_admin.account_id,
        unversioned,
        f"line {at + 1}: memory {current['memory_id']} has no row for its current version",
    )
    with pytest.raises(BadInput, match="line 3 is not JSON"):
        await load(second, target_admin.account_id, [lines[0], lines[1], lines[2][:20]])
    action = json.loads(lines[1])
    action["row"]["colour"] = "blue"
    with pytest.raises(BadInput, match=r"columns this deployment does not \(colour\)"):
        await load(second, target_admin.account_id, [lines[0], json.dumps(action)])
    # A header whose counts are not rows by type; a line nested past any limit.
    header = json.loads(lines[0])
    for counts in ([1, 2], {"memory": "x"}, {"memory": -1}):
        damaged = json.dumps({**header, "counts": counts})
        with pytest.raises(BadInput, match="header is damaged"):
            await load(second, target_admin.account_id, [damaged, *lines[1:]])
    with pytest.raises(BadInput, match="line 2 is not JSON"):
        await load(second, target_admin.account_id, [lines[0], "[" * 100_000])
    # A row of a type with other columns than the rows before it (one left out would be
    # stored as its default for every row of the batch).
    memories = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory"]
    assert len(memories) >= 2
    edited = list(lines)
    row = json.loads(edited[memories[1]])
    del row["row"]["metadata"]
    edited[memories[1]] = json.dumps(row)
    with pytest.raises(BadInput, match=f"line {memories[1] + 1}: its memory row has other columns"):
        await load(second, target_admin.account_id, edited)
    # What the API reads back must hold as it wrote it: an edited row is refused, not stored.
    version = next(
        i for i, line in enumerate(lines) if json.loads(line)["type"] == "action_version"
    )
    for index, column, value, said in [
        (memories[0], "labels", [1, 2], "labels are not text values by label number"),
        (memories[0], "labels", {"abc": "x"}, "labels are not text values by label number"),
        # A digit to Python, not the key "5" that label filters read.
        (memories[0], "labels", {"\uff15": "x"}, "labels are not text values by label number"),
        (memories[0], "summary", "two\nlines", "summary must be one line"),
        (memories[0], "summary", "s" * 600, "summary is 600 bytes"),
        (memories[0], "content", 7, "its summary and content are not text"),
        (memories[0], "modified", "-infinity", "modified is not a time"),
        (version, "harness", {"memory": {"enabled": "yes"}}, "harness.memory.enabled"),
    ]:
        edited = list(lines)
        row = json.loads(edited[index])
        row["row"][column] = value
        edited[index] = json.dumps(row)
        with pytest.raises(BadInput, match=f"line {index + 1}: .* not valid .*{said}"):
            await load(second, target_admin.account_id, edited)
    # Embedded again (no vectors in the file): a record's text must be text.
    plain = await exported(state, admin, agent, embeddings=False)
    first = next(i for i, line in enumerate(plain) if json.loads(line)["type"] == "memory")
    row = json.loads(plain[first])
    row["row"]["summary"] = 12345
    plain[first] = json.dumps(row)
    with pytest.raises(BadInput, match="its summary and content are not text"):
        await load(second, target_admin.account_id, plain)


def edited(lines: list[str], index: int, **columns: Any) -> list[str]:
    """The export's lines with these columns of the row at `index` changed."""
    item = json.loads(lines[index])
    item["row"].update(columns)
    return [*lines[:index], json.dumps(item), *lines[index + 1 :]]


def edited_record(lines: list[str], index: int, **columns: Any) -> tuple[list[str], list[int]]:
    """The export's lines with these columns changed in every row (each version, and the
    record's row) of the record of the row at `index`, as the API would have written them; and
    the indexes of those rows."""
    memory_id = json.loads(lines[index])["row"]["memory_id"]
    rows = [
        i
        for i, line in enumerate(lines)
        if json.loads(line)["type"] in ("memory_version", "memory")
        and json.loads(line)["row"]["memory_id"] == memory_id
    ]
    for i in rows:
        lines = edited(lines, i, **columns)
    return lines, rows


def first(lines: list[str], kind: str) -> int:
    """The index of the first line of a row of `kind`."""
    return next(i for i, line in enumerate(lines) if json.loads(line)["type"] == kind)


def without_current_version(lines: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The first record's row, and the export's lines without the row of its current version."""
    current = json.loads(lines[first(lines, "memory")])["row"]
    kept = [
        line
        for line in lines
        if json.loads(line)["type"] != "memory_version"
        or (json.loads(line)["row"]["memory_id"], json.loads(line)["row"]["version"])
        != (current["memory_id"], current["version"])
    ]
    return current, kept


async def digests(conn: asyncpg.Connection, *, but: tuple[str, ...] = ()) -> dict[str, str]:
    """A digest of every table's rows (but those of the tables `but`), by table."""
    tables = await conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    every = "SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} t"
    return {
        r["tablename"]: await conn.fetchval(every.format(f'"{r["tablename"]}"'))
        for r in tables
        if r["tablename"] not in but
    }


async def refused(
    target: AppState, account_id, lines: list[str], said: str, **options: Any
) -> None:
    """The import is refused with BAD_REQUEST saying `said`, and changes nothing: no table's
    rows (but the running service's own heartbeat, service_processes)."""
    from app.errors import BadInput

    async with target.pool.acquire() as conn:
        before = await digests(conn, but=("service_processes",))
    with pytest.raises(BadInput, match=said):
        await load(target, account_id, lines, **options)
    async with target.pool.acquire() as conn:
        assert await digests(conn, but=("service_processes",)) == before


async def test_a_line_with_more_than_its_type_and_row_is_refused_writing_nothing(
    state, admin, second
):
    """A line holds its type and its row, as the export writes it: one with more (an edited
    file, or a format that says more of a row) is refused by its line, as a row with a column
    this deployment lacks is, rather than imported without what it said."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    at = next(i for i, x in enumerate(lines) if json.loads(x)["type"] == "memory")
    line = json.loads(lines[at])
    line["deleted"] = True
    edited = [*lines[:at], json.dumps(line), *lines[at + 1 :]]
    await refused(
        second,
        target_admin.account_id,
        edited,
        f"line {at + 1} holds more than its type and row \\(deleted\\)",
    )


async def test_a_row_refused_writes_nothing_of_the_rows_before_it(state, admin, second):
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = edited(lines, len(lines) - 1, summary="two\nlines")
    await refused(second, target_admin.account_id, last, "summary must be one line")


async def test_a_batch_postgresql_refuses_is_said_before_a_row_read_after_it(state, admin, second):
    """PostgreSQL tries a batch while the rows after it are read and checked: the refusal said
    is still the first in the file's order, as when each batch was tried before the rows after
    it were read (the first row after a batch is read, and checked, before the batch is tried:
    its own refusal comes first)."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    memories = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory"]
    a, _, c, d = memories[:4]  # in batches of 2: (a, b), (c, d)
    # Refused by the table's CHECK, not before (at a version the file has no row of: a record's
    # row at its version is held to that version's row).
    lost = edited(lines, a, status="LOST", version=99)
    checked = 'violates check constraint \\"agent_memories_status_check\\"'
    await refused(
        second,
        target_admin.account_id,
        edited(lost, d, summary="two\nlines"),
        f"line {a + 1}: its memory row is not valid \\(new row for relation "
        f'\\"agent_memories\\" {checked}',
        batch_rows=2,
    )
    await refused(
        second,
        target_admin.account_id,
        edited(lost, c, summary="two\nlines"),
        f"line {c + 1}: its memory row is not valid \\(summary must be one line",
        batch_rows=2,
    )


async def test_a_file_changed_after_its_check_is_not_written(state, admin, second):
    """The import reads its file twice: every row checked, then written. A row changed in
    between was written as changed, checked by none of the checks of the first pass (against the
    rows before it, and as PostgreSQL stores it); the write compares each batch's lines with the
    ones checked, and refuses a batch that changed, writing nothing of it."""
    from app.errors import BadInput

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = len(lines) - 1  # a record's row, of the last batch
    changed = edited(lines, last, summary="not what was checked")

    class Rewritten(list):
        """Read from its start each time: its header, its rows to check, then to write."""

        reads = 0

        def __iter__(self) -> Any:
            self.reads += 1
            return iter(changed if self.reads > 2 else lines)

    with pytest.raises(
        BadInput,
        match=f"lines {first(lines, 'memory') + 1} to {last + 1} of the file changed after the "
        "import checked them: they were not imported",
    ):
        await load(second, target_admin.account_id, Rewritten(lines))
    assert await second.pool.fetchval("SELECT count(*) FROM agent_memories") == 0
    assert await second.pool.fetchval("SELECT count(*) FROM agent_memory_versions") > 0
    # The file as it was checked imports whole.
    result = await load(second, target_admin.account_id, lines)
    assert result.missing == {} and result.by_type["memory"] == len(lines) - first(lines, "memory")


class _Rewritten(list):
    """An export read from its start each time, as a file is: its header, its rows to check,
    then `changed`, the rows to write (the file as something else wrote it in between)."""

    def __init__(self, lines: list[str], changed: list[str]) -> None:
        super().__init__(lines)
        self.changed, self.reads = changed, 0

    def __iter__(self) -> Any:
        self.reads += 1
        return iter(self.changed) if self.reads > 2 else super().__iter__()


async def test_a_file_no_longer_an_export_after_its_check_is_refused_as_changed(
    state, admin, second
):
    """A line that is no row when the write reads it (the file changed after the check: a
    line cut short, or written over) is refused as a batch that changed is, the batches before
    it written (one was being written as the line was read: it was cancelled, and the refusal
    was the JSON's, as of a file the check had refused). A file cut short after its check where
    a batch ended is refused as changed too, not imported as a file that was cut short."""
    from app.errors import BadInput

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    versions, records = first(lines, "memory_version"), first(lines, "memory")
    cut = [*lines[:records], lines[records][:40], *lines[records + 1 :]]
    with pytest.raises(
        BadInput,
        match=f"lines {versions + 1} to {records + 1} of the file changed after the import "
        "checked them: they were not imported \\(rows before them were\\)",
    ):
        await load(second, target_admin.account_id, _Rewritten(lines, cut))
    counts = await table_counts(second)
    executions = sum(json.loads(line)["type"] == "execution" for line in lines)
    assert counts["executions"] == executions and counts["agent_memory_versions"] == 0
    with pytest.raises(
        BadInput,
        match=f"lines {records + 1} to {len(lines)} of the file changed after the import "
        "checked them",
    ):
        await load(second, target_admin.account_id, _Rewritten(lines, lines[:records]))
    assert (await table_counts(second))["agent_memories"] == 0
    result = await load(second, target_admin.account_id, lines)
    assert result.missing == {} and result.present > 0


async def test_a_file_with_rows_added_after_its_check_is_refused_as_changed(state, admin, second):
    """Rows past the file's end as it was checked, a batch of their own, are refused as
    changed: the write writes only the lines checked."""
    from app.errors import BadInput

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    added = [*lines, lines[1]]  # (the agent's row again: a batch of another type)
    with pytest.raises(
        BadInput,
        match=f"lines {len(added)} to {len(added)} of the file changed after the import checked",
    ):
        await load(second, target_admin.account_id, _Rewritten(lines, added))
    result = await load(second, target_admin.account_id, lines)
    assert result.missing == {} and result.present == len(lines) - 1


async def test_blank_lines_are_skipped_and_counted(state, admin, second):
    """Blank lines, or lines of white space alone, are no rows: skipped by both passes, and
    counted in the numbers of the lines after them."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = len(lines) - 1
    spaced = [lines[0], "", " \t", *lines[1:last], "\n", lines[last], "  "]
    await refused(
        second,
        target_admin.account_id,
        edited(spaced, last + 3, summary="two\nlines"),
        f"line {last + 4}: its memory row is not valid \\(summary must be one line",
    )
    result = await load(second, target_admin.account_id, spaced)
    assert result.missing == {} and result.inserted == len(lines) - 1


async def test_the_records_are_written_once_their_versions_are(state, admin, second, monkeypatch):
    """A batch is written while the rows after it are read, but the records' first batch
    waits for the batch before it (their versions, which the records' insert looks for)."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    write_rows = store.write_rows

    async def slower(conn, table, *args):
        if table.kind == "memory_version":
            await asyncio.sleep(0.3)
        return await write_rows(conn, table, *args)

    monkeypatch.setattr(store, "write_rows", slower)
    result = await load(second, target_admin.account_id, lines)
    assert result.missing == {} and result.inserted == len(lines) - 1


async def test_of_batches_written_at_once_the_first_to_fail_is_said(
    state, admin, second, monkeypatch
):
    """Records' batches are written two at once: when both fail, the first in the file's order
    is said (the later one failed first here), once the batches before it are written."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    await load(second, target_admin.account_id, lines)
    records = first(lines, "memory")
    a, b = (json.loads(lines[i])["row"]["memory_id"] for i in (records, records + 2))
    for memory_id in (a, b):
        async with second.pool.acquire() as conn:
            await conn.execute(
                "UPDATE agent_memories SET summary = 'edited here' WHERE memory_id = $1",
                uuid.UUID(memory_id),
            )
    write_rows = store.write_rows

    async def slower(conn, table, account_id, rows_json, *args):
        if a in rows_json:  # the first batch of records fails last
            await asyncio.sleep(0.5)
        return await write_rows(conn, table, account_id, rows_json, *args)

    monkeypatch.setattr(store, "write_rows", slower)
    with pytest.raises(Conflict, match=f"memory {a} already exists"):
        await load(second, target_admin.account_id, lines, batch_rows=2)
    # The later one failing alone is said all the same, once the first is written.
    async with second.pool.acquire() as conn:
        await conn.execute(
            "UPDATE agent_memories SET summary = $2 WHERE account_id = $1 AND memory_id = $3",
            target_admin.account_id,
            json.loads(lines[records])["row"]["summary"],
            uuid.UUID(a),
        )
    with pytest.raises(Conflict, match=f"memory {b} already exists"):
        await load(second, target_admin.account_id, lines, batch_rows=2)


async def test_the_write_refuses_a_record_whose_current_version_has_no_row(
    state, admin, second, monkeypatch
):
    """A record whose current version has no row in the account would have no history: the
    check refuses a file without it by its line, and the write looks again, in the statement
    that inserts the batch, rolling the batch back. (The check's own look is left out here.)"""
    from app.errors import BadInput
    from app.transfer import service

    monkeypatch.setattr(service._Across, "stored", lambda self, table, batch: None)
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    current, unversioned = without_current_version(lines)
    with pytest.raises(
        BadInput,
        match=f"memory {current['memory_id']} has no row for its current version in this "
        "export \\(the file is cut short or edited\\): nothing of its batch was imported",
    ):
        await load(second, target_admin.account_id, unversioned)
    assert await second.pool.fetchval("SELECT count(*) FROM agent_memories") == 0
    # So it does when the other rows of the batch are there already (the insert wrote some).
    others = [line for line in unversioned if current["memory_id"] not in line]
    assert (await load(second, target_admin.account_id, others)).missing
    with pytest.raises(BadInput, match=f"memory {current['memory_id']} has no row for its"):
        await load(second, target_admin.account_id, unversioned)
    record = "SELECT count(*) FROM agent_memories WHERE memory_id = $1"
    assert await second.pool.fetchval(record, uuid.UUID(current["memory_id"])) == 0


async def test_a_record_whose_ids_are_not_text_is_refused_naming_its_line(state, admin, second):
    """An edit that writes a record's ID, or the record it replaces, as a number, a list or an
    object: the check noting which records the file has took it for an ID and failed."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    # A record's only version: a record's version 1 edited so would leave a version 2 after it
    # with no version 1 before (refused first, naming that line).
    versions = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory_version"]
    records = Counter(json.loads(lines[i])["row"]["memory_id"] for i in versions)
    version = next(i for i in versions if records[json.loads(lines[i])["row"]["memory_id"]] == 1)
    last = len(lines) - 1
    for index, column, value in [
        (version, "memory_id", 5),
        (last, "memory_id", ["a"]),
        (last, "replaces", {"a": 1}),
        (version, "replaced_by", 7.5),
    ]:
        kind = json.loads(lines[index])["type"]
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, **{column: value}),
            f"line {index + 1}: its {kind} row is not valid",
        )


async def test_a_time_python_cannot_hold_is_refused_writing_nothing(state, admin, second):
    # PostgreSQL stores 44 BC or the year 10000; every read of it after (the account's list of
    # agents, the records, a turn of the session) would fail.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    action, last = first(lines, "action"), len(lines) - 1  # the last: a record's row
    for index, column, value in [
        (last, "modified", "infinity"),
        (action, "created", "0044-03-15T00:00:00+00:00 BC"),
        (last, "created", "10000-01-01T00:00:00+00:00"),
        (last, "modified", "0001-01-01T00:00:00+05:00"),  # the year 0 in UTC
        (last, "modified", "9999-12-31T23:59:59.9999999+00:00"),  # rounded: the year 10000
        (last, "modified", "2026-12-01T10:00:00"),  # no offset
    ]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, **{column: value}),
            f"line {index + 1}: .* not valid \\({column} is not a time from year 1 to 9999",
        )
    year_one = edited(lines, action, created="0001-01-01T00:00:00+00:00")
    assert (await load(second, target_admin.account_id, year_one)).missing == {}


async def test_a_time_python_reads_but_postgresql_does_not_is_refused(state, admin, second):
    """ISO 8601 forms Python's fromisoformat reads (a week date, an hour alone, a comma, an
    offset PostgreSQL does not take): refused as rows PostgreSQL would not store, never stored
    as another time or failing the import as a fault of the service."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = len(lines) - 1
    for value in (
        "2026-W48-2T10:00:00+00:00",
        "2026-12-01T10+00:00",
        "2026-12-01T10:00:00,5+00:00",
        "2026-12-01T10:00:00-23:59",
    ):
        await refused(
            second,
            target_admin.account_id,
            edited(lines, last, modified=value),
            f"line {last + 1}: .*not valid",
        )


async def test_a_row_of_another_agent_is_refused(state, admin, second):
    # An edited export would put a record into another agent of the account it is imported
    # into; every row is the exported agent's, and names no account.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    other = await make_agent(second, target_admin, name="other")
    record = json.loads(lines[-1])["row"]
    version = next(
        i
        for i, line in enumerate(lines)
        if json.loads(line)["type"] == "memory_version"
        and json.loads(line)["row"]["memory_id"] == record["memory_id"]
        and json.loads(line)["row"]["version"] == record["version"]
    )
    moved = edited(lines, version, action_id=str(other.action_id))
    moved = edited(moved, len(lines) - 1, action_id=str(other.action_id), pinned=True)
    said = f"line {version + 1}: .*\\(action_id is '{other.action_id}', not the exported agent"
    await refused(second, target_admin.account_id, moved, said)
    accounted = edited(lines, first(lines, "action"), account_id=str(target_admin.account_id))
    await refused(second, target_admin.account_id, accounted, "it names an account")
    async with second.pool.acquire() as conn:
        stored = "SELECT count(*) FROM agent_memories WHERE action_id = $1"
        assert await conn.fetchval(stored, other.action_id) == 0
    # The exported agent's ID written otherwise (in capitals, without its hyphens) is its own.
    capitals = edited(lines, len(lines) - 1, action_id=str(agent.action_id).upper())
    capitals = edited(capitals, version, action_id=agent.action_id.hex)
    result = await load(second, target_admin.account_id, capitals)
    assert result.missing == {} and result.inserted == len(lines) - 1


async def test_a_counter_the_service_cannot_go_on_from_is_refused(state, admin, second):
    # A session at 2^31 - 1 turns would fail every turn after: its next one is no int32.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    session, execution = first(lines, "session"), first(lines, "execution")
    for index, column, value in [
        (session, "turns", 2**31 - 1),
        (execution, "invocation_number", "2147483647"),  # PostgreSQL would read the text
        (first(lines, "action"), "current_version", -1),
    ]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, **{column: value}),
            f"line {index + 1}: .* not valid \\({column} is not an integer from 0 to 1073741824",
        )


async def test_a_session_id_or_name_the_api_refuses_is_refused(state, admin, second):
    # A session ID no turn can name (the API takes 1 to 200 characters on one line), an agent
    # name the API would not store.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    session, version = first(lines, "session"), first(lines, "action_version")
    for index, column, value, said in [
        (session, "session_id", "S" * 5000, "session_id must be 1 to 200 characters"),
        (session, "session_id", "s1\x1b[31m", "session_id contains U\\+001B"),
        (first(lines, "memory"), "session_id", " ", "session_id must be 1 to 200 characters"),
        (version, "name", "two\nlines", "name contains U\\+000A"),
        (version, "name", "", "name must be 1 to 200 characters"),
    ]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, **{column: value}),
            f"line {index + 1}: .* not valid .*{said}",
        )


# As the API refuses a new client's principal (app/auth/service.py).
PRINCIPAL_TAKES = (
    "must be 1 to 200 characters: letters, digits and _ . : @ / + -, starting with a letter or "
    "digit"
)


def with_event(lines: list[str], **columns: Any) -> tuple[list[str], int]:
    """The export's lines with a transcript event of its first execution (`columns` changed),
    and the event's index."""
    execution = json.loads(lines[first(lines, "execution")])["row"]
    event = {
        "action_id": execution["action_id"],
        "execution_id": execution["execution_id"],
        "sequence": 1,
        "invocation_number": 1,
        "type": "turn.input",
        "data": {"input": "hello"},
        "created": execution["created"],
        **columns,
    }
    at = first(lines, "memory_version")
    return [*lines[:at], json.dumps({"type": "transcript_event", "row": event}), *lines[at:]], at


async def test_a_principal_instructions_or_event_type_the_api_never_writes_is_refused(
    state, admin, second
):
    """Who wrote a version of the agent or of a record, and who ran an execution, are
    principals as the API names them (a client's, `admin`, an agent's `action:ID`); an agent's
    instructions are at most 64 KiB; a transcript event's type is one the runtime writes. Each
    was imported as any text: controls and bidi overrides a console or a log then showed as
    they are, a principal no client can have, instructions no update could keep. Refused by
    their line, naming the column and what it takes, writing nothing."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    version, execution = first(lines, "action_version"), first(lines, "execution")
    record, last = first(lines, "memory_version"), len(lines) - 1
    for index, column, value, said in [
        (version, "created_by", "admin\x1b[31m", f"created_by {PRINCIPAL_TAKES}"),
        (version, "created_by", "", f"created_by {PRINCIPAL_TAKES}"),
        (version, "created_by", "a" * 201, f"created_by {PRINCIPAL_TAKES}"),
        (execution, "principal", "admin\u202e", f"principal {PRINCIPAL_TAKES}"),
        (execution, "principal", "\u0430dmin", f"principal {PRINCIPAL_TAKES}"),  # Cyrillic a
        (record, "modified_by", "admin\n", f"modified_by {PRINCIPAL_TAKES}"),
        (last, "modified_by", " admin", f"modified_by {PRINCIPAL_TAKES}"),
        (last, "modified_by", 5, "modified_by is not text"),
        (version, "instructions", "x" * (64 * 1024 + 1), "instructions must be at most 65536"),
        (version, "instructions", "é" * (32 * 1024 + 1), "instructions must be at most 65536"),
        (version, "instructions", ["be brief"], "instructions are not text"),
    ]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, **{column: value}),
            f"line {index + 1}: its {json.loads(lines[index])['type']} row is not valid "
            f"\\({re.escape(said)}",
        )
    for value in ("model.call\u202e", "bogus", "Turn.Input", None, ["turn.input"]):
        changed, at = with_event(lines, type=value)
        await refused(
            second,
            target_admin.account_id,
            changed,
            f"line {at + 1}: its transcript_event row is not valid \\(type is .*, not one of "
            "the event types turn.input, memory.pinned, model.call, ",
        )
    # What the API writes imports: an agent's principal, a client's, 64 KiB of instructions.
    kept, _ = with_event(lines, type="memory.review.dropped")
    kept = edited(kept, version, instructions="é" * (32 * 1024), created_by="ops@acme.example/1")
    kept = edited(kept, execution, principal=f"action:{agent.action_id}")
    assert (await load(second, target_admin.account_id, kept)).by_type["transcript_event"] == 1


def test_every_event_type_the_runtime_names_is_one_an_import_takes():
    """An import takes the event types of `transcript.TYPES` only: a type added to the runtime
    and left out of it would make every export holding one refused."""
    from app.runtime import transcript

    named = {v for k, v in vars(transcript).items() if k.isupper() and isinstance(v, str)}
    assert set(transcript.TYPES) == named and len(transcript.TYPES) == len(named)


async def test_cli_import_refused_without_account_makes_no_default_account(
    state, admin, pg_server, template_db, tmp_path
):
    """`engram import FILE` without --account into a deployment whose default account no start
    of the service has made yet: a refused file changes nothing in the database, where the
    default account was made before the file was read, and stayed. A file that imports makes it,
    and writes into it."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    version = first(lines, "action_version")
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    bad.write_text("\n".join(edited(lines, version, created_by="admin\x1b[2J")) + "\n")
    good.write_text("\n".join(lines) + "\n")
    name = f"engram_no_default_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, template_db, name) as url:
        conn = await asyncpg.connect(url)
        try:
            before = await digests(conn)
            assert await conn.fetchval("SELECT count(*) FROM accounts") == 0
            done = await asyncio.to_thread(run, clean_env(database_url=url), "import", str(bad))
            assert done.returncode == 2, done.stderr
            assert done.stderr.splitlines() == [
                f"error (BAD_REQUEST): line {version + 1}: its action_version row is not valid "
                f"(created_by {PRINCIPAL_TAKES})"
            ]
            assert await digests(conn) == before
            done = await asyncio.to_thread(run, clean_env(database_url=url), "import", str(good))
            assert done.returncode == 0, done.stderr
            (account,) = await conn.fetch("SELECT account_id, is_default FROM accounts")
            assert account["is_default"]
            held = "SELECT DISTINCT account_id FROM agent_memories"
            assert [r["account_id"] for r in await conn.fetch(held)] == [account["account_id"]]
        finally:
            await conn.close()


async def test_commands_that_only_read_make_no_default_account(pg_server, template_db):
    """`engram export` and `engram client tokens` only read: on a database no start of the
    service has made the default account of, each is refused in one line that says what to do
    (start the service, or name the account), and writes nothing, where the export made the
    default account (then answered NOT_FOUND in it) and the listing made it, its admin and the
    admin's token. With --account named, the account is looked for, and not made; one that
    exists is read (the listing was refused, the admin it acts as being the default account's)."""
    name = f"engram_unstarted_reads_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, template_db, name) as url:
        env = clean_env(database_url=url)
        conn = await asyncpg.connect(url)
        try:
            before = await digests(conn)
            assert await conn.fetchval("SELECT count(*) FROM accounts") == 0
            unstarted = (
                "error (NOT_FOUND): this database has no default account yet (the service "
                "makes it when it first starts): `engram {}` only reads, and makes no account; "
                "start the service first (`engram serve`){}"
            )
            named = ", or name the account with --account ID"
            action, account = str(uuid.uuid4()), str(uuid.uuid4())
            for args, said in [
                (["export", "--action", action], unstarted.format("export", named)),
                (["client", "tokens", "admin"], unstarted.format("client tokens", named)),
                (
                    ["client", "tokens", "admin", "--account", account],
                    "error (NOT_FOUND): this database has no default account yet (the service "
                    f"makes it when it first starts), nor account {account}: `engram client "
                    "tokens` only reads, and makes no account; check the account ID (`engram "
                    "account create` printed it), or start the service first (`engram serve`)",
                ),
                (
                    ["export", "--action", action, "--account", account],
                    f"error (NOT_FOUND): action {action} not found in account {account}",
                ),
            ]:
                done = await asyncio.to_thread(run, env, *args)
                assert (done.returncode, done.stdout) == (2, ""), (args, done.stderr)
                assert done.stderr.splitlines() == [said], args
                assert await digests(conn) == before, args
            assert await conn.fetchval("SELECT count(*) FROM accounts") == 0
            assert await conn.fetchval("SELECT count(*) FROM clients") == 0
            # An account that exists (a tenant's, the default account's gone) is read, as its
            # own admin, making nothing either.
            tenant = uuid.uuid4()
            await conn.execute(
                "INSERT INTO accounts (account_id, name) VALUES ($1, 'acme')", tenant
            )
            await auth_store.insert_client(conn, tenant, "ops", "Ops", "[]")  # (a raw jsonb)
            token = auth_service.new_token()
            await auth_store.insert_token(
                conn,
                auth_service.hash_token(token),
                tenant,
                "ops",
                issued_by=auth_service.ISSUER_COMMAND_LINE,
                prefix=auth_service.token_prefix(token),
            )
            before = await digests(conn)
            done = await asyncio.to_thread(
                run, env, "client", "tokens", "ops", "--account", str(tenant)
            )
            assert done.returncode == 0, done.stderr
            listed = json.loads(done.stdout)
            assert listed["principal"] == "ops"
            assert [t["prefix"] for t in listed["tokens"]] == [auth_service.token_prefix(token)]
            done = await asyncio.to_thread(
                run, env, "client", "tokens", "ghost", "--account", str(tenant)
            )
            assert (done.returncode, done.stdout) == (2, ""), done.stderr
            assert done.stderr.splitlines() == ["error (NOT_FOUND): client 'ghost' not found"]
            assert await digests(conn) == before
            assert await conn.fetchval("SELECT count(*) FROM accounts WHERE is_default") == 0
            # Once a command that writes made the default account, each reads in it.
            done = await asyncio.to_thread(run, env, "client", "create", "ops")
            assert done.returncode == 0, done.stderr
            done = await asyncio.to_thread(run, env, "client", "tokens", "ops")
            assert done.returncode == 0 and json.loads(done.stdout)["tokens"] == [], done.stderr
            done = await asyncio.to_thread(run, env, "export", "--action", action)
            assert done.returncode == 2 and done.stderr.startswith(
                f"error (NOT_FOUND): action {action} not found in account "
            ), done.stderr
            assert "an agent of another account needs --account ID" in done.stderr
        finally:
            await conn.close()


async def test_an_import_refused_before_the_first_start_changes_nothing_and_closes_its_model(
    state, admin, pg_server, embedder
):
    """Into a deployment no service has started on (no model recorded, no default account):
    the import opens the configured embedding model before it checks the file (to copy its
    vectors), and a refused file closed it never; nor does the refusal record the model or
    make the default account (the import of no account named makes it once it writes)."""
    from app.db import migrate
    from app.errors import BadInput

    class Held:
        """The embedder, counting its closes."""

        def __init__(self) -> None:
            self.name, self.dimensions, self.closed = embedder.name, embedder.dimensions, 0

        async def aclose(self) -> None:
            self.closed += 1

    held = Held()

    async def opener():
        return held

    agent = await build_agent(state, admin)
    changed, at = with_event(await exported(state, admin, agent), type="turn.started")
    name = f"engram_unstarted_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    async with database_copy(pg_server, None, name) as url:
        await asyncio.to_thread(migrate.upgrade, url)
        pool = await create_pool(url, min_size=1, max_size=4)
        try:
            async with pool.acquire() as conn:
                before = await digests(conn)
            with pytest.raises(BadInput, match=f"line {at + 1}: its transcript_event row"):
                await import_file(pool, account_id=None, lines=changed, open_embedder=opener)
            async with pool.acquire() as conn:
                assert await digests(conn) == before
                assert await conn.fetchval("SELECT count(*) FROM accounts") == 0
            assert held.closed == 1
        finally:
            await pool.close()


async def test_text_postgresql_cannot_hold_is_refused_naming_its_line_and_place(
    state, admin, second
):
    # A NUL or a lone surrogate anywhere in a row (a column, a JSON value or key inside one),
    # or a number JSON has not: refused before anything is written, not by PostgreSQL after
    # the rows before it were (which named neither the line nor the place).
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    execution, last = first(lines, "execution"), len(lines) - 1
    nan = json.loads(lines[last])
    nan["row"]["metadata"] = {"n": float("nan")}
    for changed, said in [
        (edited(lines, execution, input={"x": "a\x00b"}), "input.x contains a NUL character"),
        (edited(lines, execution, error="a\x00"), "error contains a NUL character"),
        (edited(lines, last, metadata={"\udc00": 1}), "a key in metadata contains a lone"),
        (edited(lines, last, labels={"5": "c-\ud800"}), "labels.5 contains a lone UTF-16"),
        ([*lines[:last], json.dumps(nan)], "metadata.n is nan: numbers must be finite"),
        # A number too large for a float is one too (Python reads 1e999 as inf), and so is
        # NaN or Infinity written in capitals or signed.
        (
            [
                *lines[:execution],
                lines[execution].replace('"input": {', '"input": {"n": 1E999, '),
                *lines[execution + 1 :],
            ],
            "input.n is inf: numbers must be finite",
        ),
        (
            [
                *lines[:execution],
                lines[execution].replace('"input": {', '"input": {"n": -1e+400, '),
                *lines[execution + 1 :],
            ],
            "input.n is -inf: numbers must be finite",
        ),
        (
            [
                *lines[:execution],
                lines[execution].replace('"input": {', '"input": {"n": -Infinity, '),
                *lines[execution + 1 :],
            ],
            "input.n is -inf: numbers must be finite",
        ),
        # Given as text (not read from a file, whose bytes that are not UTF-8 are refused as
        # such), a lone surrogate as it is, not escaped: its batch's digest took it (INTERNAL).
        (
            [
                *lines[:execution],
                lines[execution].replace('"input": {', '"input": {"s": "a\ud800b", '),
                *lines[execution + 1 :],
            ],
            "Unicode low surrogate must follow a high surrogate",
        ),
    ]:
        index = next(i for i, (a, b) in enumerate(zip(lines, changed, strict=True)) if a != b)
        await refused(
            second, target_admin.account_id, changed, f"line {index + 1}: .* not valid .*{said}"
        )


async def test_a_row_postgresql_would_refuse_is_refused_before_any_is_written(state, admin, second):
    # The last row (a record's, written last) is checked as PostgreSQL stores it, its types and
    # checks, with the others: a refusal names its line and leaves nothing half imported.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = len(lines) - 1
    assert json.loads(lines[last])["row"]["version"] == 1
    for columns, said in [
        ({"memory_id": "not-a-uuid"}, 'invalid input syntax for type uuid: "not-a-uuid"'),
        # (At a version the file has no row of: a record's row at its version is held to it.)
        ({"status": "EXPLODED", "version": 2}, 'violates check constraint "agent_memories_status'),
        ({"version": None}, 'null value in column "version"'),
    ]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, last, **columns),
            f"line {last + 1}: its memory row is not valid \\(.*{said}",
        )


async def test_a_batch_too_large_together_is_refused_by_its_lines_writing_nothing(
    state, admin, second, monkeypatch
):
    """A batch past the JSON PostgreSQL takes in one statement (a jsonb array's 256 MB), each of
    its rows alone within it, is refused by its lines, saying to import with a smaller
    --batch-size, before anything is written; with one, the same file imports whole. The bound
    is lowered so that a small batch takes that path."""
    from app.transfer import service

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    # The records' rows, with their vectors, make the file's largest batch.
    records = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for line in lines[1:]:
        item = json.loads(line)
        by_kind.setdefault(item["type"], []).append(item["row"])
    largest_row = max(len(json.dumps([r])) for rows in by_kind.values() for r in rows)
    others = max(len(json.dumps(rows)) for kind, rows in by_kind.items() if kind != "memory")
    bound = max(largest_row, others) + 1
    assert len(records) >= 2 and len(json.dumps(by_kind["memory"])) > bound
    monkeypatch.setattr(service, "MAX_BATCH_BYTES", bound)
    target_admin = await admin_of(second)
    await refused(
        second,
        target_admin.account_id,
        lines,
        f"^lines {records[0] + 1} to {records[-1] + 1}: their memory rows are not valid "
        f"together \\([0-9,]+ bytes as JSON, past the {bound:,} PostgreSQL takes in one "
        "statement\\); import with a smaller --batch-size$",
    )
    result = await load(second, target_admin.account_id, lines, batch_rows=1)
    assert result.by_type["memory"] == len(records) and result.missing == {}


async def test_a_batch_its_vectors_take_past_one_statement_is_written_in_several(
    state, admin, second, monkeypatch
):
    """A file without vectors passes the check by its rows as the file holds them; the records'
    vectors, which the import's embedding adds, took the batch's write past what PostgreSQL
    takes in one statement (a jsonb array's 256 MB: about 3,600 records at 1,536 dimensions),
    and it was refused after earlier batches were stored. The write sends such a batch in
    several statements, in the batch's transaction. The bound is lowered, and the database's
    refusal of a larger array stood in for, so that a small batch takes that path."""
    from app.transfer import service, store

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent, embeddings=False)
    items = [json.loads(line) for line in lines[1:]]
    memories = [item["row"] for item in items if item["type"] == "memory"]
    others = [item["row"] for item in items if item["type"] != "memory"]
    assert memories and all("embedding" not in row for row in memories)
    bound = max(len(json.dumps(memories)), len(json.dumps(others))) + 1
    monkeypatch.setattr(service, "MAX_BATCH_BYTES", bound)
    sent: list[int] = []
    write_rows = store.write_rows

    async def bounded(conn, table, account_id, rows_json, rows, row_columns):
        sent.append(len(rows_json))
        if len(rows_json) > bound:  # as PostgreSQL refuses a jsonb array past its bound
            raise asyncpg.ProgramLimitExceededError("total size of jsonb array elements exceeds")
        return await write_rows(conn, table, account_id, rows_json, rows, row_columns)

    monkeypatch.setattr(store, "write_rows", bounded)
    target_admin = await admin_of(second)
    result = await load(second, target_admin.account_id, lines)
    assert result.by_type["memory"] == len(memories) and result.missing == {}
    assert len(sent) > len({item["type"] for item in items})  # a batch sent in several
    unembedded = "SELECT count(*) FROM agent_memories WHERE embedding IS NULL"
    assert await second.pool.fetchval(unembedded) == await state.pool.fetchval(unembedded)
    assert await reads(GQL(second), target_admin, agent.action_id) == await reads(
        GQL(state), admin, agent.action_id
    )


async def test_a_batch_past_one_statement_as_jsonb_though_not_as_text_is_written_in_several(
    state, admin, second, monkeypatch
):
    """PostgreSQL's bound is on the jsonb array's binary size, which for short numbers is
    several times their text: records whose vectors are all zeros took 2.4 times their text, so
    a batch whose text was within the bound was sent in one statement and refused ("total size
    of jsonb array elements exceeds the maximum") after earlier batches were stored. The bound
    is lowered between the batch's text and its size as jsonb, and PostgreSQL's refusal stood
    in for, past it, by the size PostgreSQL gives the array as jsonb."""
    from app.transfer import service, store

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    records = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory"]
    dimensions = len(json.loads(json.loads(lines[records[0]])["row"]["embedding"]))
    # As JSON lists (as the import's embedding adds them), of zeros but one (a vector of zeros
    # only has no direction, and is embedded again).
    for i in records:
        lines = edited(lines, i, embedding=[1.0] + [0.0] * (dimensions - 1))
    items = [json.loads(line) for line in lines[1:]]
    memories = [item["row"] for item in items if item["type"] == "memory"]
    others = [item["row"] for item in items if item["type"] != "memory"]
    bound = max(len(json.dumps(memories)), len(json.dumps(others))) + 1
    sizes: list[int] = []

    async def jsonb_size(conn, rows_json: str) -> int:
        return await conn.fetchval("SELECT pg_column_size($1::text::jsonb)", rows_json)

    async with state.pool.acquire() as conn:
        assert await jsonb_size(conn, json.dumps(memories)) > 1.5 * bound  # each row far within
        assert max([await jsonb_size(conn, json.dumps([r])) for r in memories]) < bound / 2
    monkeypatch.setattr(service, "MAX_BATCH_BYTES", bound)
    write_rows = store.write_rows

    async def bounded(conn, table, account_id, rows_json, rows, row_columns):
        sizes.append(size := await jsonb_size(conn, rows_json))
        if size > bound:  # as PostgreSQL refuses a jsonb array past its bound
            raise asyncpg.ProgramLimitExceededError(
                f"total size of jsonb array elements exceeds the maximum of {bound} bytes"
            )
        return await write_rows(conn, table, account_id, rows_json, rows, row_columns)

    monkeypatch.setattr(store, "write_rows", bounded)
    target_admin = await admin_of(second)
    result = await load(second, target_admin.account_id, lines)
    assert result.vectors == "copied" and result.reembedded == 0
    assert result.by_type["memory"] == len(memories) and result.missing == {}
    assert len(sizes) > len({item["type"] for item in items}) + 1  # the records' in several
    copied = (
        "SELECT count(*) FROM agent_memories "
        "WHERE embedding = ('[1' || repeat(',0', $1::int - 1) || ']')::vector"
    )
    assert await second.pool.fetchval(copied, dimensions) == len(memories)
    assert await reads(GQL(second), target_admin, agent.action_id) == await reads(
        GQL(state), admin, agent.action_id
    )


@pytest.mark.parametrize(
    "value",
    [0, 0.0, 7, 1.5, -1.5, 12.5, 10001, 1e-300, 1.5e300, 0.1234567890123456, "", "a", "é😀",
     ",", None, True, [], {}, [0], [[]], {"": 0}, {"k": [1.5]}, {"a": 1.5}, {"abc": 1.5},
     {"a": 1.5, "bb": 1.5}],
)  # fmt: skip
async def test_the_bound_on_a_batch_as_jsonb_is_never_below_what_postgresql_takes(state, value):
    """`_jsonb_bound` against PostgreSQL's own size of the array as jsonb: values alone, many,
    and after a string of each length; in objects, after keys of each length (an object's keys
    come before its values, each number padded to 4 bytes)."""
    from app.transfer.service import _jsonb_bound

    texts = [json.dumps([value] * n) for n in (1, 2, 3, 1000)]
    texts += [json.dumps(["x" * k, value] * 100) for k in range(4)]
    async with state.pool.acquire() as conn:
        for text in texts:
            size = await conn.fetchval("SELECT pg_column_size($1::text::jsonb)", text)
            assert size <= _jsonb_bound(text), (text[:60], size, _jsonb_bound(text))


async def test_a_row_twice_or_out_of_order_is_refused_writing_nothing(state, admin, second):
    # A key twice: the write kept the first and counted the other as already there, whatever
    # it held. The same ID in capitals is the same key to PostgreSQL: the check took it for
    # another, and the write stopped part way ("already exists"). A row before those it names
    # (a session after the executions in it): refused by PostgreSQL once the rows before it
    # were written.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = len(lines) - 1
    other = json.loads(lines[last])
    other["row"]["summary"] = "never said"
    memory_id = other["row"]["memory_id"]
    shouted = edited(edited(lines, last, summary="never said"), last, memory_id=memory_id.upper())
    for twice, shown in (
        (json.dumps(other), memory_id),
        (lines[last], memory_id),
        (shouted[last], memory_id.upper()),
    ):
        await refused(
            second,
            target_admin.account_id,
            [*lines, twice],
            f"line {last + 2}: its memory row has the key of line {last + 1}'s "
            f"\\(memory {shown}\\)",
        )
    session = first(lines, "session")
    late = [*lines[:session], *lines[session + 1 :], lines[session]]
    await refused(
        second,
        target_admin.account_id,
        late,
        f"line {len(lines)}: a session row after memory rows; an export holds its rows in the "
        "order action, action_version, session,",
    )


async def test_label_values_and_metadata_the_api_would_refuse_are_refused(state, admin, second):
    # The API takes label values of 1 to 512 bytes (filters match them exactly) and metadata of
    # at most 16 KiB as JSON; an edited file is held to the same.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = len(lines) - 1
    for column, value, said in [
        ("labels", {"5": "v" * 513}, "labels.5 is 513 bytes; a label value is 1 to 512 bytes"),
        ("labels", {"6": ""}, "labels.6 is 0 bytes"),
        ("metadata", {"k": "m" * 20_000}, "metadata is 20009 bytes as JSON; at most 16384"),
    ]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, last, **{column: value}),
            f"line {last + 1}: its memory row is not valid \\({said}",
        )


async def test_cli_import_names_the_line_of_a_byte_that_is_not_utf8(state, admin, second, tmp_path):
    # A decoding error named a byte of the block being decoded (some thousands into it), not
    # of the file; the file or standard input is refused naming the line, writing nothing.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    env = clean_env(database_url=second.settings.database_url_value())
    last = len(lines) - 1
    data = ("\n".join(lines) + "\n").encode()
    cut = data.rindex(b'"summary"')  # in the last line, well past the first 8 KiB block
    assert cut > 20_000
    damaged = data[:cut] + b"\xff" + data[cut:]
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(damaged)
    said = f"line {last + 1} is not UTF-8 text (character "
    for command, stdin in [(["import", str(path)], None), (["import", "-"], damaged)]:
        done = subprocess.run(
            [*engram_command(), *command], env=env, input=stdin, capture_output=True
        )
        assert done.returncode == 2 and said in done.stderr.decode(), done.stderr
        assert "Traceback" not in done.stderr.decode()
    assert set((await table_counts(second)).values()) == {0}


async def test_a_record_replacing_another_agents_record_is_refused(state, admin, second):
    # An edited file would have a record replace, or be replaced by, a record of another agent
    # of the account it is imported into (one the file does not hold may be in the part of a
    # file cut short that is not there: test_an_interrupted_import_continues).
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    other = await make_agent(second, target_admin, name="other")
    (foreign,) = await turn(second, other, steps=[NewMemory("another agent's", "fact")])
    # (A record's `replaces` is in each of its rows: all of them edited.)
    replacing, rows = edited_record(lines, len(lines) - 1, replaces=str(foreign.memory_id))
    # Its SUPERSEDED version, and the record's row, which the import holds to it (only a
    # SUPERSEDED version names a record in `replaced_by`).
    _, _, two, current = changed_record(lines)
    replaced = edited(lines, two, replaced_by=str(foreign.memory_id))
    replaced = edited(replaced, current, replaced_by=str(foreign.memory_id))
    for edits, index, column in [
        (replacing, rows[0], "replaces"),
        (replaced, two, "replaced_by"),
    ]:
        await refused(
            second,
            target_admin.account_id,
            edits,
            f"line {index + 1}: .* not valid \\({column} names record {foreign.memory_id}, "
            "which is another agent's",
        )


async def test_an_agent_whose_current_version_the_file_lacks_is_refused(state, admin, second):
    # Every read of an agent is of its current version: one no version row has would leave the
    # agent imported but never listed nor found, and a second import refused as a conflict.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    action = first(lines, "action")
    for version in (7, 0):
        await refused(
            second,
            target_admin.account_id,
            edited(lines, action, current_version=version),
            f"line {action + 1}: its action row is not valid \\(current_version is {version}, "
            "a version no action_version row of this export has",
        )


async def test_a_transcript_event_of_no_execution_of_the_file_is_refused(state, admin, second):
    # Refused by its foreign key only once the rows before it were written; now by its line.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    stray = str(uuid.uuid4())
    changed, at = with_event(lines, execution_id=stray, data={"text": "hello"})
    await refused(
        second,
        target_admin.account_id,
        changed,
        f"line {at + 1}: its transcript_event row is not valid \\(execution_id "
        f"{stray} is no execution of this export",
    )
    # The same event of an execution the file has is imported.
    kept, _ = with_event(lines, data={"text": "hello"})
    assert (await load(second, target_admin.account_id, kept)).by_type["transcript_event"] == 1


async def test_two_records_replacing_one_are_refused_writing_nothing(state, admin, second):
    # A record has one successor (and one preview record naming it): PostgreSQL refused the
    # second by a unique index once the batches before it were written.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    memories = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory"]
    rows = {i: json.loads(lines[i])["row"] for i in memories}
    successor = next(i for i in memories if rows[i]["replaces"] and not rows[i]["preview"])
    other = next(i for i in memories if not rows[i]["replaces"] and not rows[i]["preview"])
    replaced = rows[successor]["replaces"]
    later, earlier = max(successor, other), min(successor, other)
    await refused(
        second,
        target_admin.account_id,
        edited_record(lines, other, replaces=replaced)[0],
        f"line {later + 1}: its memory row is not valid \\(it replaces record {replaced}, as the "
        f"record of line {earlier + 1} does",
    )


async def test_an_agent_or_record_behind_its_own_latest_version_is_refused(state, admin, second):
    # An agent whose current_version is below a version the file has (a record likewise) would
    # be imported, and its next change refused: that change's version is already taken.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    action = first(lines, "action")
    await refused(
        second,
        target_admin.account_id,
        edited(lines, action, current_version=1),
        f"line {action + 1}: its action row is not valid \\(current_version is 1, but this "
        "export has its version 2",
    )
    memories = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "memory"]
    rows = {i: json.loads(lines[i])["row"] for i in memories}
    behind = next(i for i in memories if rows[i]["version"] > 1)
    memory_id = rows[behind]["memory_id"]
    await refused(
        second,
        target_admin.account_id,
        edited(lines, behind, version=1),
        f"line {behind + 1}: memory {memory_id} is at version 1, but this export has its "
        f"version {rows[behind]['version']}",
    )


async def test_the_check_holds_no_table_of_rows_it_has_checked(state, admin, second, monkeypatch):
    """The check pass takes a table's lock only while it tries a batch of its rows: a command
    that needs a table alone (`maintain-search --reorder`'s CLUSTER, a migration) does not
    wait for the whole check, with every request queued behind it."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    check_rows = store.check_rows
    taken: list[str] = []

    async def watched(conn, table, *args):
        if table.name == "agent_memories" and not taken:  # the last rows: the others are done
            async with second.pool.acquire() as other, other.transaction():
                for name in ("actions", "sessions", "agent_memory_versions"):
                    await other.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE NOWAIT")
                    taken.append(name)
        return await check_rows(conn, table, *args)

    monkeypatch.setattr(store, "check_rows", watched)
    await load(second, target_admin.account_id, lines, batch_rows=2)
    assert taken == ["actions", "sessions", "agent_memory_versions"]


async def test_a_refusal_quotes_a_long_value_of_the_file_shortened(state, admin, second):
    """A message names the line and shows what is wrong, but a value of the file (an ID of a
    megabyte, as an edit can make) is shown cut, never whole."""
    from app.errors import BadInput

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    long = "x" * 1_000_000
    last = len(lines) - 1
    execution = first(lines, "execution")
    event = {
        "action_id": str(agent.action_id),
        "execution_id": long,
        "sequence": 1,
        "invocation_number": 1,
        "type": "turn.input",
        "data": {},
        "created": json.loads(lines[execution])["row"]["created"],
    }
    at = first(lines, "memory_version")
    twice = edited(lines, execution, execution_id=long)
    # (Records of no version: each row of a record has its `replaces`.)
    replacing = edited(lines, last, memory_id=str(uuid.uuid4()), replaces=long)[last]
    cases = [
        (edited(lines, last, memory_id=long), f"line {last + 1}: its memory row is not valid"),
        (edited(lines, last, action_id=[long]), f"line {last + 1}: its memory row is not valid"),
        (
            [*twice[: execution + 1], twice[execution], *twice[execution + 1 :]],
            f"line {execution + 2}: its execution row has the key of line {execution + 1}",
        ),
        (
            [*lines[:at], json.dumps({"type": "transcript_event", "row": event}), *lines[at:]],
            f"line {at + 1}: its transcript_event row is not valid",
        ),
        (  # two records replacing one
            [*lines, replacing, edited([replacing], 0, memory_id=str(uuid.uuid4()))[0]],
            f"line {last + 3}: its memory row is not valid (it replaces record",
        ),
    ]
    for changed, said in cases:
        before = await table_counts(second)
        with pytest.raises(BadInput) as refusal:
            await load(second, target_admin.account_id, changed)
        assert refusal.value.message.startswith(said), refusal.value.message[:300]
        assert len(refusal.value.message) < 1000, refusal.value.message[:300]
        assert await table_counts(second) == before


# Text of the shapes the import's checks look for, as a model may write it: the words NaN and
# Infinity, a NUL's and a surrogate's escapes as text, an astral character, a bidi override.
ODD = 'NaN Infinity -Infinity 1e999 \\u0000 \\uD800 \\\\u0000 "q" 😀 \u202e tab\tend'


@pytest.mark.settings(model_name="scripted")
async def test_an_export_of_real_turns_imports_whole_and_identical(
    state, admin, gql, second, db_url, tmp_path, model_server
):
    """Two agents, one written by real turns (tool calls, their transcripts, sessions, a pin,
    a preview turn, text that looks like what the checks refuse): each exported with `engram
    export` imports whole, reads back the same, and exports again line for line."""
    factory_made = await build_agent(state, admin)
    harness = full_memory(pinned={"max_tokens": 200}, tools=["add_memory", "delete_memory"])
    turned = await make_agent_id(state, admin, name="other", harness=harness)
    model_server.call_tools(
        (
            "add_memory",
            {
                "summary": ODD,
                "kind": "fact",
                "content": ODD + "\nline",
                "labels": {"customer_id": "NaN"},
                "pinned": True,
                "scope": "AGENT",
            },
        )
    )
    model_server.say("ok " + ODD)
    executions = [await run_turn(gql, admin, turned, {"x": ODD, "n": 1.5e300}, session="a")]
    model_server.call_tools(("add_memory", {"summary": "second", "kind": "fact"}))
    model_server.say("done")
    executions.append(await run_turn(gql, admin, turned, "again", session="b"))
    model_server.call_tools(("add_memory", {"summary": "previewed", "kind": "fact"}))
    model_server.say("preview")
    executions.append(await run_turn(gql, admin, turned, "p", session="b", preview=True))
    assert [e["status"] for e in executions] == ["SUCCEEDED"] * 3, executions
    target_url = second.settings.database_url_value()
    target_admin = await admin_of(second)
    for action_id in (str(factory_made.action_id), turned):
        before = await reads(GQL(state), admin, uuid.UUID(action_id))
        path, again = tmp_path / f"{action_id}.jsonl", tmp_path / f"{action_id}.again.jsonl"
        done = run(clean_env(database_url=db_url), "export", "--action", action_id, "-o", str(path))
        assert done.returncode == 0, done.stderr
        imported = run(clean_env(database_url=target_url), "import", str(path))
        assert imported.returncode == 0, imported.stderr
        assert await reads(GQL(second), target_admin, uuid.UUID(action_id)) == before
        done = run(
            clean_env(database_url=target_url), "export", "--action", action_id, "-o", str(again)
        )
        assert done.returncode == 0, done.stderr
        lines, lines_again = path.read_text().splitlines(), again.read_text().splitlines()
        assert lines[1:] == lines_again[1:]
        assert len(lines) > 20
    assert "transcript_event" in {json.loads(line)["type"] for line in lines[1:]}
    query = "SELECT count(*) FROM agent_memories WHERE summary = $1 AND pinned"
    assert await second.pool.fetchval(query, ODD) == 1


async def test_cli_import_says_a_refusal_of_postgresql_in_one_line_the_files_text_escaped(
    state, admin, second, tmp_path
):
    """PostgreSQL's refusal came with its DETAIL on a line of its own (every column of the row,
    the account a random one of the check's copy); the text of the file it quotes (an escape
    sequence, a bidi override) reached the terminal as it is. Now one line, escaped."""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    env = clean_env(database_url=second.settings.database_url_value())
    action, execution, last = first(lines, "action"), first(lines, "execution"), len(lines) - 1
    for index, columns, said in [
        (
            action,
            {"modified": None},
            'null value in column "modified" of relation "actions" violates not-null constraint)',
        ),
        (  # (at a version the file has no row of: a record's row is held to its version's row)
            last,
            {"status": "EXPLODED", "version": 2},
            'new row for relation "agent_memories" violates check constraint '
            '"agent_memories_status_check")',
        ),
        (
            execution,
            {"boot_id": "\x1b[2J\x1b[31mred\u202eevil"},
            'invalid input syntax for type uuid: "\\u001b[2J\\u001b[31mred\\u202eevil")',
        ),
    ]:
        path = tmp_path / "edited.jsonl"
        path.write_text("\n".join(edited(lines, index, **columns)) + "\n")
        done = run(env, "import", str(path))
        assert done.returncode == 2, done.stderr
        kind = json.loads(lines[index])["type"]
        assert done.stderr.splitlines() == [
            f"error (BAD_REQUEST): line {index + 1}: its {kind} row is not valid ({said}"
        ]
    assert set((await table_counts(second)).values()) == {0}


async def test_a_header_nested_past_pythons_limit_or_of_a_version_as_text_is_refused(second):
    # A header nested past Python's recursion limit ended the import in a RecursionError (exit
    # 1, a traceback); a version written as text was said as the version it is not ("format
    # version 1; this Engram reads version 1").
    from app.errors import BadInput

    target_admin = await admin_of(second)
    for header, said in [
        ('{"a":' * 100_000, "this is not an Engram export"),
        (
            json.dumps({"type": "header", "format": "engram-export", "version": "1"}),
            'this export has format version "1"; this Engram reads version 1 \\(the header is '
            "damaged\\)",
        ),
        (
            json.dumps({"type": "header", "format": "engram-export", "version": 2}),
            "this export has format version 2; this Engram reads version 1: import it into an "
            "Engram at least as new as the one that exported it",
        ),
    ]:
        with pytest.raises(BadInput, match=said):
            await load(second, target_admin.account_id, [header])


async def test_an_export_after_a_byte_order_mark_imports_whole(state, admin, gql, second, tmp_path):
    # Saved by an editor that starts a file with a BOM, the export was refused as "damaged or
    # cut short"; JSON readers may ignore it (RFC 8259), and the import does.
    agent = await build_agent(state, admin)
    before = await reads(gql, admin, agent.action_id)
    lines = await exported(state, admin, agent)
    path = tmp_path / "agent.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + ("\n".join(lines) + "\n").encode())
    done = run(clean_env(database_url=second.settings.database_url_value()), "import", str(path))
    assert done.returncode == 0, done.stderr
    target_admin = await admin_of(second)
    assert await reads(GQL(second), target_admin, agent.action_id) == before


async def test_a_record_version_of_a_status_scope_or_source_the_api_never_writes_is_refused(
    state, admin, second
):
    # A version's row has no CHECK of these (its record's row has): stored, every `history` of
    # the record failed, INTERNAL.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    version = first(lines, "memory_version")
    for column, value, allowed in [
        ("status", "bogus", "ACTIVE, DELETED, SUPERSEDED"),
        ("scope", "session", "SESSION, AGENT"),
        ("source", 5, "EXTRACTION, TOOL, OPERATOR, MCP"),
    ]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, version, **{column: value}),
            f"line {version + 1}: its memory_version row is not valid \\({column} is "
            f"{re.escape(json.dumps(value))}, not one of {allowed}\\)",
        )


async def test_a_row_naming_an_agent_version_the_file_lacks_is_refused(state, admin, second):
    # A record's (and an execution's) `action` is the agent at the version it names: one the
    # file lacks (a version number edited, a version's row renumbered) was imported, and every
    # read of the record's agent failed, NOT_FOUND.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    agent_version = first(lines, "action_version")
    execution = first(lines, "execution")
    # (A record's rows name the version that wrote it, each of them: all of them edited.)
    record, rows = edited_record(lines, first(lines, "memory"), action_version=9)
    for changed, index in [
        (edited(lines, execution, action_version=9), execution),
        (record, rows[0]),
    ]:
        kind = json.loads(lines[index])["type"]
        await refused(
            second,
            target_admin.account_id,
            changed,
            f"line {index + 1}: its {kind} row is not valid \\(action_version is 9, a version no "
            "action_version row of this export has",
        )
    # Version 1 renumbered 0: the rows written by version 1 name a version the file lacks.
    await refused(
        second,
        target_admin.account_id,
        edited(lines, agent_version, version=0),
        f"line {first(lines, 'execution') + 1}: its execution row is not valid \\(action_version "
        "is 1, a version no action_version row",
    )


async def test_rows_without_their_agents_row_are_refused_by_their_line(state, admin, second):
    # Without the action row, the check passed and the first write failed on its reference,
    # naming no line.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    action = first(lines, "action")
    await refused(
        second,
        target_admin.account_id,
        [*lines[:action], *lines[action + 1 :]],
        f"line {action + 1}: a action_version row, but no action row before it",
    )


async def test_a_record_of_a_kind_no_harness_names_is_refused_writing_nothing(state, admin, second):
    # A kind of 12,000 characters that do not compress passed the check (its copy of the
    # table has no index) and failed the index of records by kind once every row before the
    # records was written: a file half imported, its refusal naming no line.
    import random
    import string

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    chosen = random.Random(1)
    long = "".join(chosen.choice(string.ascii_letters) for _ in range(12_000))
    for kind in ("memory", "memory_version"):
        index = first(lines, kind)
        for value, said in [(long, f'"{long[:8]}…'), ("Fact", '"Fact"'), (None, "null")]:
            await refused(
                second,
                target_admin.account_id,
                edited(lines, index, kind=value),
                f"line {index + 1}: its {kind} row is not valid \\(kind is {said}",
            )


async def test_a_row_nested_deeper_than_the_service_writes_is_refused(state, admin, gql, second):
    # An execution's input nested 500 levels (Python reads some 990) was imported, and reading
    # the execution as a caller its memory is redacted for failed, INTERNAL: the redaction
    # recurses over it past Python's limit.
    from app.auth.caller import Caller
    from app.auth.policies import Policy
    from app.auth.resources import MEMORY_DOCUMENT

    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    execution = first(lines, "execution")

    def nested(levels: int) -> list[str]:
        item = json.loads(lines[execution])
        item["row"]["input"] = "@"
        deep = '{"a":' * levels + "1" + "}" * levels
        return [*lines[:execution], json.dumps(item).replace('"@"', deep), *lines[execution + 1 :]]

    await refused(
        second,
        target_admin.account_id,
        nested(500),
        f"line {execution + 1}: its execution row is not valid \\(it nests deeper than 300 levels",
    )
    await load(second, target_admin.account_id, nested(250))
    redacted = Caller(
        target_admin.account_id,
        "no memory",
        (*target_admin.policies, Policy("DENY", ("SELECT",), (MEMORY_DOCUMENT,))),
    )
    read = await GQL(second)(
        redacted,
        "query($e: UUID!) { execution(executionId: $e) { input } }",
        e=json.loads(lines[execution])["row"]["execution_id"],
    )
    assert read.ok()["execution"]["input"] is not None


# Session IDs the API takes (app/text.py `check_one_line`): Persian with its zero-width
# non-joiner, an emoji ZWJ sequence and England's flag (tag characters), Mongolian with its
# vowel separator before a final a.
PERSIAN = "می\u200cخواهم"
FAMILY = "👨\u200d👩\u200d👧 🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"
MONGOLIAN = "\u182d\u1823\u1837\u1822\u1828\u180e\u1820"


async def test_a_refusal_quotes_a_session_id_the_api_takes_as_it_is(state, admin, second):
    """`escaped` wrote the joiners of Persian words and emoji sequences, and an emoji flag's
    tags, as escapes (`می\\u200cخواهم`, `👨\\u200d👩\\u200d👧`): characters the API keeps in
    a name or an ID (`check_one_line`), and that a terminal shows as the text they write."""
    agent = await make_agent(state, admin)
    for session in (PERSIAN, FAMILY, MONGOLIAN):
        await turn(state, agent, session=session, steps=[NewMemory(f"in {session}", "fact")])
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    await load(second, target_admin.account_id, lines)
    for session in (PERSIAN, FAMILY, MONGOLIAN):
        await second.pool.execute(
            "UPDATE sessions SET turns = turns + 1 WHERE session_id = $1", session
        )
        with pytest.raises(Conflict) as conflict:
            await load(second, target_admin.account_id, lines)
        assert f"session {session} of action {agent.action_id} already exists" in str(
            conflict.value.message
        ), conflict.value.message
        await second.pool.execute(
            "UPDATE sessions SET turns = turns - 1 WHERE session_id = $1", session
        )
    # What disguises a line is still written as its escape, next to the joiners kept.
    from app.text import escaped

    assert escaped(f"a\u202eb\u200c\u200d\u200bc {PERSIAN}\u200c") == (
        f"a\\u202eb\\u200c\\u200d\\u200bc {PERSIAN}\\u200c"
    )
    assert escaped("\U000e0067tag x\u061cy") == "\\U000e0067tag x\\u061cy"
    # And what shows as nothing, which a new name or ID may not hold (a Hangul filler, a soft
    # hyphen, the Mongolian vowel separator but before a final a or e).
    assert escaped(f"{MONGOLIAN} a\u3164b\u00adc \u180e\u1820") == (
        f"{MONGOLIAN} a\\u3164b\\u00adc \\u180e\u1820"
    )


async def test_a_refusal_of_postgresql_quotes_the_files_text_as_it_is(state, admin, second):
    """PostgreSQL's refusal was put on one line by collapsing all its white space, the file's
    text it quotes included: a record naming the execution "x\\u00a0y\\ny\\u3000z  w" was said
    to name "x y y z w", a value the file does not hold. The quote keeps each character, its
    line break written as an escape. (A replaced record's `replaced_by` edited, in its
    SUPERSEDED version, the one version that names a record there, and in its own row, held to
    its current version's before PostgreSQL sees them.)"""
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    _, _, two, current = changed_record(lines)
    replaced_by = "x\u00a0y\ny\u3000z  w"
    changed = edited(edited(lines, two, replaced_by=replaced_by), current, replaced_by=replaced_by)
    await refused(
        second,
        target_admin.account_id,
        changed,
        re.escape(
            f"line {two + 1}: its memory_version row is not valid (invalid input syntax for "
            "type uuid: "
            '"x\u00a0y\\u000ay\u3000z  w")'
        ),
    )


async def test_a_record_whose_metadata_holds_large_numbers_imports(state, admin, gql, second):
    """Metadata the API took as 500 bytes (60 numbers of 1e300) is stored as jsonb, whose
    numbers come back written out in full (1e300: a 1 and 300 zeros): its export's metadata was
    18,000 bytes as JSON, and the import refused the record as past the 16 KiB the API allows.
    A number is measured as it may be written (1e300), as the API measured it."""
    agent = await make_agent(state, admin)
    metadata = {"scores": [1e300] * 60, "n": [2.5e20, -1.5e16, 10**20, 1e-300, 7]}
    await turn(state, agent, steps=[NewMemory("scored", "fact", metadata=metadata)])
    before = await reads(gql, admin, agent.action_id)
    lines = await exported(state, admin, agent)
    assert len(lines[-1]) > 16 * 1024
    target_admin = await admin_of(second)
    # Past the API's bound written either way, still refused.
    index = first(lines, "memory")
    await refused(
        second,
        target_admin.account_id,
        edited(lines, index, metadata={"scores": [10**300] * 3000}),
        f"line {index + 1}: its memory row is not valid \\(metadata is 21012 bytes as JSON",
    )
    await load(second, target_admin.account_id, lines)
    assert await reads(GQL(second), target_admin, agent.action_id) == before


def labelled_versions(lines: list[str], harness_labels: dict[str, Any]) -> list[str]:
    """The export's lines with the agent's last version declaring `harness_labels`."""
    index = max(i for i, line in enumerate(lines) if json.loads(line)["type"] == "action_version")
    harness = json.loads(lines[index])["row"]["harness"]
    harness["memory"]["labels"] = harness_labels
    return edited(lines, index, harness=harness)


async def test_m36_an_agent_version_dropping_or_renumbering_a_label_is_refused(
    state, admin, second
):
    # A version that drops a label, or gives its number another name, was imported: the
    # records written under the earlier version then read their customer_id as order_id, and
    # no `updateAction` could restore it (each version is checked against the one before).
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    last = max(i for i, line in enumerate(lines) if json.loads(line)["type"] == "action_version")
    ticket = LABELS["ticket"]
    for labels, said in [
        (
            {"customer_id": {"number": 9, "description": "d"}, "ticket": ticket},
            "harness.memory.labels.customer_id.number: an earlier version declares this label "
            "with number 5; it cannot change to 9",
        ),
        (
            {"order_id": {"number": 5, "description": "An order."}, "ticket": ticket},
            "harness.memory.labels.customer_id: an earlier version declares this label "
            "\\(number 5\\); later versions must keep it with the same number",
        ),
    ]:
        await refused(
            second,
            target_admin.account_id,
            labelled_versions(lines, labels),
            f"line {last + 1}: its action_version row is not valid \\({said}; the earlier "
            "version is 1, this row's is 2\\)",
        )
    # Adding a label is what a later version may do.
    added = {**LABELS, "order_id": {"number": 9, "description": "An order."}}
    await load(second, target_admin.account_id, labelled_versions(lines, added))


async def test_m36_a_record_label_its_agent_version_does_not_declare_is_refused(
    state, admin, second
):
    # A record holding label 9, which its agent never declared, was imported: its label read
    # with no name, and a review correcting it was refused ("label 9 is not declared").
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    for kind in ("memory_version", "memory"):
        index = first(lines, kind)
        # The first record may have been written by either of the agent's versions (records
        # come in no fixed order); both declare the same labels.
        wrote = json.loads(lines[index])["row"]["action_version"]
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, labels={"5": "c-1", "9": "x"}),
            f"line {index + 1}: its {kind} row is not valid \\(labels.9: version {wrote} of the "
            "agent, which wrote it, declares no label number 9; its labels are customer_id "
            "\\(number 5\\), ticket \\(number 7\\)\\)",
        )
    # "05" and "５" read as label 5, but a search filtered on label 5 never found the record.
    index = first(lines, "memory")
    for key in ("05", "\uff15"):
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, labels={key: "c-1"}),
            f"line {index + 1}: its memory row is not valid \\(labels are not text values by "
            "label number",
        )


async def test_m36_a_record_whose_versions_differ_in_labels_is_refused(state, admin, second):
    # The API writes a record's labels once: versions with other labels were imported, and its
    # `history` showed labels the record never had.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    rows = [(i, json.loads(line)) for i, line in enumerate(lines)]
    versions = [(i, item["row"]) for i, item in rows if item["type"] == "memory_version"]
    labelled = next(row["memory_id"] for _, row in versions if row["labels"])
    plain = next(
        row["memory_id"] for _, row in versions if not row["labels"] and row["version"] > 1
    )
    (one, two) = [i for i, row in versions if row["memory_id"] == labelled]
    current = next(
        i for i, item in rows if item["type"] == "memory" and item["row"]["memory_id"] == labelled
    )
    for index, labels in [(two, {"5": "c-2"}), (two, {}), (current, {"5": "c-1", "7": "t-1"})]:
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, labels=labels),
            f"line {index + 1}: its {rows[index][1]['type']} row is not valid \\(its labels are "
            f"not those of line {one + 1}, a row of the same record {labelled}: a record keeps "
            "its labels in every version\\)",
        )
    (earlier, later) = [i for i, row in versions if row["memory_id"] == plain]
    await refused(
        second,
        target_admin.account_id,
        edited(lines, later, labels={"7": "t-1"}),
        f"line {later + 1}: its memory_version row is not valid \\(its labels are not those of "
        f"line {earlier + 1}, a row of the same record {plain}",
    )


def changed_record(lines: list[str]) -> tuple[str, int, int, int]:
    """The record of `build_agent` that was replaced (two versions: ACTIVE, then SUPERSEDED):
    its ID and the indexes of its version 1, version 2 and current rows."""
    items = [(i, json.loads(line)) for i, line in enumerate(lines)]
    rows = {
        (item["type"], item["row"]["version"]): i
        for i, item in items
        if item["type"] in ("memory_version", "memory")
        and item["row"]["summary"] == "lives in Bergen"
    }
    memory_id = json.loads(lines[rows["memory", 2]])["row"]["memory_id"]
    return memory_id, rows["memory_version", 1], rows["memory_version", 2], rows["memory", 2]


async def refused_apart(
    target: AppState, lines: list[str], edits: dict[str, Any], also_current: str
) -> None:
    """Each of `edits` made to one version of `changed_record` is refused by its line, naming
    the column and the line of the record's first row; `also_current` made to the record's row
    likewise. The API writes these columns with the record, and no version changes them."""
    memory_id, one, two, current = changed_record(lines)
    admin = await admin_of(target)
    cases = [(two, column, value) for column, value in edits.items()]
    cases.append((current, also_current, edits[also_current]))
    for index, column, value in cases:
        assert json.loads(lines[index])["row"][column] != value
        await refused(
            target,
            admin.account_id,
            edited(lines, index, **{column: value}),
            re.escape(
                f"line {index + 1}: its {json.loads(lines[index])['type']} row is not valid (its "
                f"{column} is not that of line {one + 1}, a row of the same record {memory_id}: "
                f"a record keeps its {column} in every version)"
            ),
        )


async def test_m59_a_record_whose_versions_differ_in_what_it_says_is_refused(state, admin, second):
    # A version with another summary was imported: the record's `history` said its text changed,
    # and its version 2 read otherwise through `agentMemory(version: 2)` than the record at 2.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    edits = {"summary": "lives in Paris", "content": "never said", "metadata": {"n": 2}}
    await refused_apart(second, lines, edits, also_current="summary")
    # The same JSON written otherwise (keys in another order, 2 as 2.0) is the same metadata.
    _, one, two, _ = changed_record(lines)
    record, _ = edited_record(lines, one, metadata={"a": 1, "b": 2})
    record = edited(record, two, metadata={"b": 2.0, "a": 1})
    target_admin = await admin_of(second)
    assert (await load(second, target_admin.account_id, record)).missing == {}


async def test_m3_m4_m50_a_record_whose_versions_differ_in_where_it_is_read_is_refused(
    state, admin, second
):
    # A version of another scope, session, kind or pin was imported: its `history` said the
    # record moved between sessions or scopes, which no write of the API does.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    edits = {"scope": "AGENT", "session_id": None, "kind": "guidance", "pinned": True}
    await refused_apart(second, lines, edits, also_current="scope")


async def test_m53_a_record_whose_versions_differ_in_what_wrote_it_is_refused(state, admin, second):
    # A version naming another execution, invocation, agent version, source or time of writing
    # was imported: the record's versions disagreed on what wrote it.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    execution_ids = [
        json.loads(line)["row"]["execution_id"]
        for line in lines[1:]
        if json.loads(line)["type"] == "execution"
    ]
    _, one, two, current = changed_record(lines)
    written_by = json.loads(lines[one])["row"]
    edits = {
        "created": "2020-01-01T00:00:00+00:00",
        "source": "OPERATOR",
        "execution_id": next(e for e in execution_ids if e != written_by["execution_id"]),
        "invocation_number": 2,
        "action_version": 2,
    }
    await refused_apart(second, lines, edits, also_current="execution_id")
    # The same ID in capitals, the same time at another offset: the same values.
    when = datetime.fromisoformat(written_by["created"]).astimezone(timezone(timedelta(hours=1)))
    same = edited(
        lines,
        two,
        execution_id=written_by["execution_id"].upper(),
        created=when.isoformat(),
    )
    target_admin = await admin_of(second)
    assert (await load(second, target_admin.account_id, same)).missing == {}


async def test_m42_p1_a_record_whose_versions_differ_in_what_it_replaces_is_refused(
    state, admin, second
):
    # A version replacing another record, or written by a preview turn where the record was
    # not, was imported: `history` said the record came to replace one, or became a preview.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    memory_id, *_ = changed_record(lines)
    other = next(
        json.loads(line)["row"]["memory_id"]
        for line in lines[1:]
        if json.loads(line)["type"] == "memory"
        and json.loads(line)["row"]["memory_id"] != memory_id
    )
    await refused_apart(second, lines, {"replaces": other, "preview": True}, also_current="preview")


async def test_m59_a_records_versions_differ_only_in_what_a_new_version_writes(state, admin):
    """`engram import` holds a file's record to what the service writes: every column of a
    record but those `change_status` writes is the same in each of its versions. Records the
    API superseded, deleted (by the agent, and by an operator) and left alone."""
    from app.memory import operator as memory_operator
    from app.memory.store import CHANGED_BY_A_VERSION, KEPT_ACROSS_VERSIONS

    agent = await build_agent(state, admin)
    (kept,) = await turn(state, agent, steps=[NewMemory("kept apart", "fact")])
    await memory_operator.delete_memory(
        state.pool, admin, action_id=agent.action_id, memory_id=kept.memory_id
    )
    rows = await state.pool.fetch(
        "SELECT * FROM agent_memory_versions WHERE action_id = $1 ORDER BY memory_id, version",
        agent.action_id,
    )
    by_record: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for row in rows:
        by_record.setdefault(row["memory_id"], []).append(dict(row))
    assert sum(len(versions) == 2 for versions in by_record.values()) == 4
    keys = {"account_id", "action_id", "memory_id"}
    assert set(rows[0].keys()) == keys | set(CHANGED_BY_A_VERSION) | set(KEPT_ACROSS_VERSIONS)
    for first_row, *later in by_record.values():
        for row in later:
            changed = {c for c, value in row.items() if first_row[c] != value}
            assert {"status", "version", "modified"} <= changed <= set(CHANGED_BY_A_VERSION)


async def refused_beside_its_version(target: AppState, lines: list[str], column: str, value: Any):
    """`column` of the record's row of `changed_record` (at version 2) edited to `value`, apart
    from its version 2's row, is refused by the record's line, naming the column and that row's
    line. The API writes a record's row and its new version's row in one statement."""
    memory_id, _, two, current = changed_record(lines)
    assert json.loads(lines[current])["row"][column] != value
    admin = await admin_of(target)
    await refused(
        target,
        admin.account_id,
        edited(lines, current, **{column: value}),
        re.escape(
            f"line {current + 1}: its memory row is not valid (its {column} is not that of line "
            f"{two + 1}, the memory_version row of its version 2 in record {memory_id}: a "
            "record's row is its current version)"
        ),
    )


async def test_a_records_row_of_another_status_than_its_current_version_is_refused(
    state, admin, second
):
    # A replaced record's row edited back to ACTIVE was imported: it was read, and found by
    # search, beside the record that replaced it, while its `history` said SUPERSEDED.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    await refused_beside_its_version(second, lines, "status", "ACTIVE")


async def test_a_records_row_replaced_by_another_than_its_current_version_is_refused(
    state, admin, second
):
    # `replacedBy` null (or another record) on the record, its version 2 naming its successor.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    memory_id, _, two, current = changed_record(lines)
    await refused_beside_its_version(second, lines, "replaced_by", None)
    other = next(
        json.loads(line)["row"]["memory_id"]
        for line in lines[1:]
        if json.loads(line)["type"] == "memory"
        and json.loads(line)["row"]["memory_id"]
        not in (memory_id, json.loads(lines[two])["row"]["replaced_by"])
    )
    await refused_beside_its_version(second, lines, "replaced_by", other)
    # The same ID in capitals is the same record.
    successor = json.loads(lines[two])["row"]["replaced_by"]
    target_admin = await admin_of(second)
    same = edited(lines, current, replaced_by=successor.upper())
    assert (await load(second, target_admin.account_id, same)).missing == {}


async def test_a_records_row_modified_by_another_than_its_current_version_is_refused(
    state, admin, second
):
    # The record said one principal made its last change, its `history` another.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    await refused_beside_its_version(second, lines, "modified_by", "user:someone-else")


async def test_a_records_row_modified_at_another_time_than_its_current_version_is_refused(
    state, admin, second
):
    # The record's `modified` said another time than its current version's.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    await refused_beside_its_version(second, lines, "modified", "2020-01-01T00:00:00+00:00")
    # The same time at another offset is the same time.
    _, _, _, current = changed_record(lines)
    modified = datetime.fromisoformat(json.loads(lines[current])["row"]["modified"])
    when = modified.astimezone(timezone(timedelta(hours=1))).isoformat()
    target_admin = await admin_of(second)
    same = edited(lines, current, modified=when)
    assert (await load(second, target_admin.account_id, same)).missing == {}


def with_version(lines: list[str], index: int, **columns: Any) -> list[str]:
    """The export's lines with a copy of the memory_version row at `index`, these columns
    changed, on the line after it."""
    return [*lines[: index + 1], edited(lines, index, **columns)[index], *lines[index + 1 :]]


def later(lines: list[str], index: int, seconds: float) -> str:
    """The `modified` of the row at `index`, `seconds` later (earlier, below 0)."""
    modified = datetime.fromisoformat(json.loads(lines[index])["row"]["modified"])
    return (modified + timedelta(seconds=seconds)).isoformat()


def preview_deletion(lines: list[str]) -> tuple[str, int, int]:
    """The preview deletion of `build_agent` (a tombstone, DELETED at its version 1): its ID and
    the indexes of its version 1 and its own row."""
    items = [json.loads(line) for line in lines[1:]]
    tombstone = next(i for i, item in enumerate(items, 1) if item["row"].get("tombstone"))
    memory_id = json.loads(lines[tombstone])["row"]["memory_id"]
    version = next(
        i
        for i, item in enumerate(items, 1)
        if item["type"] == "memory_version" and item["row"]["memory_id"] == memory_id
    )
    return memory_id, version, tombstone


async def test_m59_a_record_whose_versions_skip_or_start_past_1_is_refused(state, admin, second):
    # Versions 1 and 3 were imported (`history` listed the two, version 2 read as none), so was
    # a version 0 (listed before the first) and a record whose versions start at 2.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    memory_id, one, two, current = changed_record(lines)
    skipped = edited(edited(lines, two, version=3), current, version=3)
    await refused(
        second,
        target_admin.account_id,
        skipped,
        re.escape(
            f"line {two + 1}: its memory_version row is not valid (it is version 3 of record "
            f"{memory_id}, after its version 1 of line {one + 1}: a record's versions come in "
            "order, from 1, one more each time)"
        ),
    )
    zero = [*lines[:one], edited(lines, one, version=0)[one], *lines[one:]]
    without_one = [*lines[:one], *lines[one + 1 :]]
    swapped = [*lines[:one], lines[two], lines[one], *lines[two + 1 :]]
    for edits, version in ((zero, 0), (without_one, 2), (swapped, 2)):
        await refused(
            second,
            target_admin.account_id,
            edits,
            re.escape(
                f"line {one + 1}: its memory_version row is not valid (it is version {version} "
                f"of record {memory_id}, and no row of its version 1 comes before it: a record's "
                "versions come in order, from 1)"
            ),
        )


async def test_m58_m42_a_record_changed_after_it_was_deleted_or_replaced_is_refused(
    state, admin, second
):
    # A version 3 ACTIVE after the record was replaced was imported: the record was listed, and
    # found by search, beside the record that replaced it. No write of the API changes a
    # deleted or replaced record (deleting it again returns it unchanged).
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    memory_id, _, two, current = changed_record(lines)
    again = {"version": 3, "replaced_by": None, "modified": later(lines, two, 60)}
    restored = with_version(lines, two, status="ACTIVE", **again)
    await refused(
        second,
        target_admin.account_id,
        edited(restored, current + 1, status="ACTIVE", **again),
        re.escape(
            f"line {two + 2}: its memory_version row is not valid (its version 3 is ACTIVE: a "
            "record's later version deletes or replaces it (DELETED or SUPERSEDED), and none "
            "makes it ACTIVE again)"
        ),
    )
    deleted = with_version(lines, two, status="DELETED", **again)
    await refused(
        second,
        target_admin.account_id,
        edited(deleted, current + 1, status="DELETED", **again),
        re.escape(
            f"line {two + 2}: its memory_version row is not valid (it is version 3 of record "
            f"{memory_id}, after its version 2 of line {two + 1}, which deleted or replaced it: "
            "nothing changes a deleted or replaced record)"
        ),
    )
    # A preview deletion (P5) is DELETED from its version 1: nothing follows it either.
    deletion, version, tombstone = preview_deletion(lines)
    again = {"version": 2, "modified": later(lines, version, 60)}
    await refused(
        second,
        target_admin.account_id,
        edited(with_version(lines, version, **again), tombstone + 1, **again),
        re.escape(
            f"line {version + 2}: its memory_version row is not valid (it is version 2 of record "
            f"{deletion}, after its version 1 of line {version + 1}, a preview deletion: nothing "
            "changes a deleted or replaced record)"
        ),
    )


async def test_m42_p5_a_records_version_1_or_replaced_by_the_api_never_writes_is_refused(
    state, admin, second
):
    # A record is written ACTIVE (or as a preview deletion), and `replacedBy` names a record
    # only once it is SUPERSEDED. A version 1 SUPERSEDED (or DELETED, the record's version 2
    # made ACTIVE) was imported as a record replaced, or deleted, before it was ever read; a
    # version ACTIVE naming its successor, or SUPERSEDED naming none, likewise.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    memory_id, one, two, current = changed_record(lines)
    successor = json.loads(lines[two])["row"]["replaced_by"]
    for status in ("SUPERSEDED", "DELETED"):
        replaced = {"replaced_by": successor} if status == "SUPERSEDED" else {}
        first_ended = edited(lines, one, status=status, **replaced)
        active = {"status": "ACTIVE", "replaced_by": None}
        first_ended = edited(edited(first_ended, two, **active), current, **active)
        await refused(
            second,
            target_admin.account_id,
            first_ended,
            re.escape(
                f"line {one + 1}: its memory_version row is not valid (its version 1 is "
                f"{status}: a record is written ACTIVE, or DELETED as a preview record naming in "
                "replaces the record it deletes; a later version deletes or replaces it)"
            ),
        )
    await refused(
        second,
        target_admin.account_id,
        edited(lines, one, replaced_by=successor),
        re.escape(
            f"line {one + 1}: its memory_version row is not valid (its replaced_by is "
            f"{successor}, but its status is ACTIVE: only a SUPERSEDED record names the record "
            "that replaced it)"
        ),
    )
    await refused(
        second,
        target_admin.account_id,
        edited(edited(lines, two, replaced_by=None), current, replaced_by=None),
        re.escape(
            f"line {two + 1}: its memory_version row is not valid (its status is SUPERSEDED, but "
            "its replaced_by is null: a replaced record names the record that replaced it)"
        ),
    )


async def test_m59_a_records_version_modified_before_it_was_written_is_refused(
    state, admin, second
):
    # `modified` is the time of the record's last change: version 1's is its `created` (one
    # reading of the clock; a few µs after it in records of the service's first days, which
    # stay importable), a later version's after it. One going back was imported, and the
    # record's `history` said it changed a day before it was written.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    _, one, two, current = changed_record(lines)
    created = json.loads(lines[one])["row"]["created"]
    day_before = later(lines, one, -86400)
    await refused(
        second,
        target_admin.account_id,
        edited(edited(lines, two, modified=day_before), current, modified=day_before),
        re.escape(
            f"line {two + 1}: its memory_version row is not valid (its version 2 was modified "
            f"{day_before}, before the record was created ({created}): a version is written "
            "when or after the record is)"
        ),
    )
    second_before = later(lines, one, -1)
    await refused(
        second,
        target_admin.account_id,
        edited(lines, one, modified=second_before),
        re.escape(
            f"line {one + 1}: its memory_version row is not valid (its version 1 was modified "
            f"{second_before}, before the record was created ({created}): a version is written "
            "when or after the record is)"
        ),
    )
    # The same time at another offset is the same time.
    when = datetime.fromisoformat(created).astimezone(timezone(timedelta(hours=1))).isoformat()
    assert (
        await load(second, target_admin.account_id, edited(lines, one, modified=when))
    ).missing == {}


async def test_p5_a_records_row_a_tombstone_apart_from_its_version_1_is_refused(
    state, admin, second
):
    # A preview deletion's row not marked as a tombstone was imported and left out of
    # `Action.memories`; a record marked as one was listed as a deletion (and a preview reader
    # took the record it replaces as deleted).
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    deletion, version, tombstone = preview_deletion(lines)
    _, one, _, current = changed_record(lines)
    for index, value, first_line, status in (
        (tombstone, False, version, "DELETED"),
        (current, True, one, "ACTIVE"),
    ):
        await refused(
            second,
            target_admin.account_id,
            edited(lines, index, tombstone=value),
            re.escape(
                f"line {index + 1}: its memory row is not valid (its tombstone is "
                f"{json.dumps(value)}, but its version 1 of line {first_line + 1} is {status}: a "
                "record's row is a tombstone exactly when the record is a preview deletion, "
                "DELETED at version 1)"
            ),
        )


def record_rows(
    lines: list[str], summary: str, *, preview: bool = False
) -> tuple[str, list[int], int]:
    """The record of `build_agent` with this summary, live or preview (a preview deletion keeps
    the summary of the record it deletes): its ID, the indexes of its versions' rows and that of
    its own row."""
    items = [(i, json.loads(line)) for i, line in enumerate(lines)]
    rows = [
        (i, item)
        for i, item in items
        if item["type"] in ("memory_version", "memory")
        and item["row"]["summary"] == summary
        and item["row"]["preview"] == preview
    ]
    (own,) = [i for i, item in rows if item["type"] == "memory"]
    versions = [i for i, item in rows if item["type"] == "memory_version"]
    return json.loads(lines[own])["row"]["memory_id"], versions, own


async def test_m42_p3_a_replaced_record_and_its_replacement_apart_are_refused(state, admin, second):
    # A record B written with `replaces` naming A makes A SUPERSEDED naming B in `replaced_by`,
    # in one transaction; but a preview record naming a live record leaves it unchanged (P3,
    # P5). Edited apart, each was imported: A read as replaced by a record that replaces
    # another, or none; a live record replacing an ACTIVE one was listed, and found, beside it.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)

    def said(line: int, why: str) -> str:
        return re.escape(f"line {line + 1}: its memory row is not valid ({why})")

    bergen, _, bergen_row = record_rows(lines, "lives in Bergen")
    oslo, oslo_versions, _ = record_rows(lines, "lives in Oslo")
    email, _, _ = record_rows(lines, "prefers email")
    greet, _, _ = record_rows(lines, "always greet by name")
    preview, _, _ = record_rows(lines, "preview only", preview=True)
    refund, _, refund_row = record_rows(lines, "asked for a refund")
    tombstone = preview_deletion(lines)[2]
    # Bergen is replaced by Oslo, which names no record, or another (a deleted one) instead.
    for replaces in (None, email):
        changed, rows = edited_record(lines, oslo_versions[0], replaces=replaces)
        which = f"of line {rows[-1] + 1} replaces record {email}" if replaces else "replaces none"
        await refused(
            second,
            target_admin.account_id,
            changed,
            said(
                bergen_row,
                f"replaced_by names record {oslo}, which {which}: a replaced record names the "
                "record that replaced it",
            ),
        )
    # A live record replacing one still ACTIVE; a preview deletion of a preview record (which
    # deletes it: the tombstone is dropped once the turn commits).
    for row, replaces in ((refund_row, greet), (tombstone, preview)):
        await refused(
            second,
            target_admin.account_id,
            edited_record(lines, row, replaces=replaces)[0],
            said(
                row,
                f"it replaces record {replaces}, which is not SUPERSEDED naming it in "
                "replaced_by: a record replaces the record it names, the two written at once, "
                "unless it is a preview record naming a live record, which it leaves unchanged",
            ),
        )
    # A live record replaced by a preview record (which leaves a live record unchanged).
    changed, rows = edited_record(lines, oslo_versions[0], preview=True)
    await refused(
        second,
        target_admin.account_id,
        changed,
        said(
            bergen_row,
            f"replaced_by names record {oslo}, which of line {rows[-1] + 1} is a preview record, "
            "and this one is a live record: a record is replaced by one of its own kind (a "
            "preview record leaves a live record it names unchanged)",
        ),
    )
    # The preview replacement of a live record and the preview deletion import as exported.
    assert (await load(second, target_admin.account_id, lines)).missing == {}


async def test_m42_a_record_replaced_by_one_the_export_does_not_hold_is_refused(
    state, admin, second
):
    # An export holds every record of its agent: `replaced_by` naming one it lacks was imported,
    # and the record read as replaced by a record no read finds.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    _, one, two, current = changed_record(lines)
    _, oslo_versions, _ = record_rows(lines, "lives in Oslo")
    absent = str(uuid.uuid4())
    changed = edited(edited(lines, two, replaced_by=absent), current, replaced_by=absent)
    changed = edited_record(changed, oslo_versions[0], replaces=None)[0]
    await refused(
        second,
        target_admin.account_id,
        changed,
        re.escape(
            f"line {two + 1}: its memory_version row is not valid (replaced_by names record "
            f"{absent}, which this export does not hold: an export holds every record of its "
            "agent)"
        ),
    )


async def test_m42_an_export_cut_between_a_replaced_record_and_its_replacement_imports_it(
    state, admin, second
):
    # A file cut short imports what it holds: a record whose replacement's row, or the row of
    # the record it replaces, is in the part not written yet is not refused (the rest follows),
    # but a link the rows it holds break still is.
    agent = await build_agent(state, admin)
    lines = await exported(state, admin, agent)
    target_admin = await admin_of(second)
    bergen, _, bergen_row = record_rows(lines, "lives in Bergen")
    oslo, _, oslo_row = record_rows(lines, "lives in Oslo")
    trondheim, _, trondheim_row = record_rows(lines, "lives in Trondheim")
    # An export lists its records in no fixed order: this one Bergen's and Trondheim's rows
    # (Oslo replaced Bergen, and Trondheim Oslo) before Oslo's, where it is cut.
    moved = [lines[bergen_row], lines[trondheim_row], lines[oslo_row]]
    start = first(lines, "memory")
    others = [line for line in lines[start:] if line not in moved]
    ordered = [*lines[:start], *moved, *others]
    cut = ordered[: start + 2]
    # Bergen named Trondheim as the record that replaced it: Trondheim's row replaces Oslo.
    _, _, superseded, _ = changed_record(cut)
    changed = edited(edited(cut, superseded, replaced_by=trondheim), start, replaced_by=trondheim)
    await refused(
        second,
        target_admin.account_id,
        changed,
        re.escape(
            f"line {start + 1}: its memory row is not valid (replaced_by names record "
            f"{trondheim}, which of line {start + 2} replaces record {oslo}: a replaced record "
            "names the record that replaced it)"
        ),
    )
    part = await load(second, target_admin.account_id, cut)
    assert part.missing == {"memory": (2, len(lines) - start)}
    async with second.pool.acquire() as conn:
        held = await conn.fetch(
            "SELECT memory_id, replaces, replaced_by FROM agent_memories WHERE action_id = $1",
            agent.action_id,
        )
    bergen_id, oslo_id, trondheim_id = map(uuid.UUID, (bergen, oslo, trondheim))
    assert {tuple(r) for r in held} == {
        (bergen_id, None, oslo_id),
        (trondheim_id, oslo_id, None),
    }
    whole = await load(second, target_admin.account_id, ordered)
    assert whole.missing == {} and whole.present == part.inserted
