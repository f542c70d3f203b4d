"""eraseSession: a person's request that what a session said be gone for good.

Erases the session's history (events, parts and their vectors), its running summary, and the
text of its executions' inputs, outputs and transcripts (replaced by a marker); memory records
are left to deleteAgentMemory, and the answer lists the session's live ones so an operator
can delete them. Needs DELETE on financial.ActionExecution.document, and is recorded as an
execution of kind ERASE naming who asked. While an execution of the session runs (a turn, an
MCP call, an ingest), it is CONFLICT and erases nothing: that execution holds the session's
words in memory and would write them back when it ends.
"""

import uuid
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from app.actions.service import load_action
from app.auth import resources
from app.auth.caller import Caller
from app.errors import Conflict, NotFound, action_not_found
from app.executions import erasure_store, store
from app.executions.service import Execution
from app.history import store as history_store
from app.scope import check_session_id
from app.text import check_storable

ERASE_SESSION = (("DELETE", resources.EXECUTION_DOCUMENT),)


@dataclass(frozen=True)
class Erased:
    execution: Execution  # the ERASE execution that records the erasure
    events: int  # history events erased (their parts and vectors with them)
    executions: int  # executions whose input and output text was replaced
    transcript_events: int
    memory_ids: list[UUID]  # the session's live memory records, left to deleteAgentMemory


async def erase_session(
    pool: asyncpg.Pool, caller: Caller, action_id: UUID, session_id: str
) -> Erased:
    caller.require(*ERASE_SESSION)
    check_storable(session_id, "sessionId")
    check_session_id(session_id, stored=True)  # (one no session can have is no session's)
    async with pool.acquire() as conn, conn.transaction():
        action = await load_action(conn, caller.account_id, action_id)
        if action is None:
            raise action_not_found(action_id)
        # Locked first, as a turn's start and commit lock it: a turn starting now waits for
        # the erasure (and then reads what is left), and a turn that has started is seen.
        if await store.lock_session(conn, caller.account_id, action_id, session_id) is None:
            raise NotFound(f"session {session_id!r} of action {action_id} not found")
        running = await store.running_in_session(conn, caller.account_id, action_id, session_id)
        if running is not None:
            # Its words are in the process running it, which would write them back at its end.
            raise Conflict(
                f"execution {running} of session {session_id!r} is running; nothing was erased: "
                "erase the session once it has ended (one whose process stopped is failed when "
                "its lease, ENGRAM_TURN_LEASE_SECONDS, runs out)"
            )
        events = await history_store.erase(conn, caller.account_id, action_id, session_id)
        await erasure_store.erase_summaries(conn, caller.account_id, action_id, session_id)
        counts = await erasure_store.erase_executions(
            conn, caller.account_id, action_id, session_id
        )
        memory_ids = await erasure_store.live_memories(
            conn, caller.account_id, action_id, session_id
        )
        summary = {
            "operation": "eraseSession",
            "events": events,
            "executions": counts["executions"],
            "transcriptEvents": counts["transcriptEvents"],
            "liveMemories": [str(m) for m in memory_ids],
        }
        row = await store.insert_execution(
            conn,
            account_id=caller.account_id,
            action_id=action_id,
            execution_id=uuid.uuid4(),
            action_version=action.version,
            session_id=session_id,
            turn=None,
            kind="ERASE",
            status="SUCCEEDED",
            preview=False,
            principal=caller.principal,
            token_id=caller.token_id,
            input={"operation": "eraseSession", "sessionId": session_id},
            output=summary,
        )
    return Erased(
        Execution.of(row), events, counts["executions"], counts["transcriptEvents"], memory_ids
    )
