"""eraseSession: a person's request that what a session said be gone for good.

Erases the session's history (events, parts and their vectors), its running summary, and the
text of its executions' inputs, outputs and transcripts (replaced by a marker); memory records
are left to deleteAgentMemory, and the answer lists the session's live ones so an operator
can delete them. Needs DELETE on financial.ActionExecution.document, and is recorded as an
execution of kind ERASE naming who asked.
"""

import uuid
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from app.actions.service import load_action
from app.auth import resources
from app.auth.caller import Caller
from app.errors import NotFound
from app.executions import store
from app.executions.service import Execution
from app.history import store as history_store
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
    async with pool.acquire() as conn, conn.transaction():
        action = await load_action(conn, caller.account_id, action_id)
        if action is None:
            raise NotFound(f"action {action_id} not found")
        if await store.get_session(conn, caller.account_id, action_id, session_id) is None:
            raise NotFound(f"session {session_id!r} of action {action_id} not found")
        events = await history_store.erase(conn, caller.account_id, action_id, session_id)
        await store.erase_summaries(conn, caller.account_id, action_id, session_id)
        counts = await store.erase_executions(conn, caller.account_id, action_id, session_id)
        memory_ids = await store.live_memories(conn, caller.account_id, action_id, session_id)
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
            input={"operation": "eraseSession", "sessionId": session_id},
            output=summary,
        )
    return Erased(
        Execution.of(row), events, counts["executions"], counts["transcriptEvents"], memory_ids
    )
