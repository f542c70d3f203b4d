"""SQL for the liveness of service processes: their heartbeats (table service_processes),
and the turns a dead process left RUNNING and the memory rows they staged, failed and dropped.
Called by app/runtime/liveness.py (each process's heartbeat and sweep) and by
app/runtime/turns.py (a turn's start discards what its agent's dead turns left)."""

from uuid import UUID

import asyncpg

from app.executions.store import Row

# What an execution of each kind is called in its errors and logs (an OPERATOR write fails
# otherwise), and what its error tells its caller to do: a turn (kind TURN) is retried by its
# executionId (ExecuteActionInput.executionId); an MCP tool call or a conversation handed in
# (MCP, INGEST) can only be sent again.
NAMES = {"TURN": "turn", "MCP": "tool call", "INGEST": "conversation"}
RETRY = "retry the execution"
SEND_AGAIN = "send it again"


def named(kind: str) -> str:
    """What an execution of `kind` is called in its errors and logs: "turn", "tool call"..."""
    return NAMES.get(kind, "execution")


def told(kind: str) -> str:
    """What the error of a failed execution of `kind` tells its caller to do."""
    return RETRY if kind == "TURN" else SEND_AGAIN


def dead_process_error(kind: str) -> str:
    return f"the {named(kind)} stopped without finishing (its process ended); {told(kind)}"


def unrecorded_error(kind: str) -> str:
    return (
        f"the {named(kind)} failed but its end could not be recorded (the database was "
        f"unreachable); {told(kind)}"
    )


DEAD_PROCESS_ERROR = dead_process_error("TURN")
UNRECORDED_ERROR = unrecorded_error("TURN")
# As a sweep ends an execution, by its kind: {kind: error} (jsonb, read with ->> kind), and
# under "" an execution's of a kind without words of its own (a later release's, met in a
# rolling upgrade), as `named` calls it, rather than no error.
_DEAD_PROCESS = {kind: dead_process_error(kind) for kind in (*NAMES, "")}
_UNRECORDED = {kind: unrecorded_error(kind) for kind in (*NAMES, "")}


async def beat(
    conn: asyncpg.Connection, boot_id: UUID, host: str, pid: int, lease_seconds: float
) -> None:
    """Registers the process, or refreshes its heartbeat (its row may have been removed while
    it stalled: it comes back), with the lease after which its silence means it is gone."""
    await conn.execute(
        """
        INSERT INTO service_processes (boot_id, host, pid, lease_seconds) VALUES ($1, $2, $3, $4)
        ON CONFLICT (boot_id) DO UPDATE SET heartbeat = now(), lease_seconds = $4
        """,
        boot_id,
        host,
        pid,
        lease_seconds,
    )


def _lease(asker: str) -> str:
    """SQL: process `p`'s lease, its own or (a process of a release before migration 0028
    recorded none) the asker's, the parameter `asker`."""
    return f"make_interval(secs => coalesce(p.lease_seconds, {asker}))"


async def remove_process(conn: asyncpg.Connection, boot_id: UUID) -> None:
    await conn.execute("DELETE FROM service_processes WHERE boot_id = $1", boot_id)


async def fail_dead_turns(
    conn: asyncpg.Connection,
    *,
    boot_id: UUID,
    live: list[UUID],
    lease_seconds: float,
    grace_seconds: float,
    legacy_seconds: float,
) -> list[Row]:
    """Fails, in every account, the RUNNING turns no process runs any more: those of a process
    whose heartbeat is older than the lease (or whose row is gone); those of this process that
    it no longer runs (their end could not be recorded); and those without a boot ID (written
    before boot IDs) by their last sign of life. A turn that showed life in the last
    `grace_seconds` is spared (it may have started just now). Safe to run from several
    processes at once: each row is updated only while it is still RUNNING."""
    return await conn.fetch(
        f"""
        UPDATE executions e
        SET status = 'FAILED', modified = now(),
            error = CASE WHEN e.boot_id = $1 THEN coalesce($7::jsonb ->> e.kind, $7::jsonb ->> '')
                         ELSE coalesce($6::jsonb ->> e.kind, $6::jsonb ->> '') END
        WHERE e.status = 'RUNNING' AND e.kind <> 'OPERATOR'
          AND e.modified < now() - make_interval(secs => $4)
          AND ((e.boot_id <> $1 AND NOT EXISTS (
                  SELECT 1 FROM service_processes p
                  WHERE p.boot_id = e.boot_id
                    AND p.heartbeat >= now() - {_lease("$3")}))
               OR (e.boot_id = $1 AND e.execution_id <> ALL($2::uuid[]))
               OR (e.boot_id IS NULL AND e.modified < now() - make_interval(secs => $5)))
        RETURNING e.account_id, e.action_id, e.execution_id
        """,
        boot_id,
        live,
        lease_seconds,
        grace_seconds,
        legacy_seconds,
        _DEAD_PROCESS,
        _UNRECORDED,
    )


async def drop_orphaned_staged(conn: asyncpg.Connection, grace_seconds: float) -> int:
    """Deletes, in every account, staged memory rows that can never commit: those of a turn
    attempt no longer running, and those of an operator write whose execution was never
    recorded (its process died between staging and committing) once `grace_seconds` old."""
    status = await conn.execute(
        """
        DELETE FROM agent_memories m
        WHERE m.pending_execution IS NOT NULL
          AND NOT EXISTS (
              SELECT 1 FROM executions e
              WHERE e.account_id = m.account_id AND e.action_id = m.action_id
                AND e.execution_id = m.pending_execution AND e.status = 'RUNNING'
                AND e.invocation_number = m.pending_invocation)
          AND (m.created < now() - make_interval(secs => $1) OR EXISTS (
              SELECT 1 FROM executions e
              WHERE e.account_id = m.account_id AND e.action_id = m.action_id
                AND e.execution_id = m.pending_execution))
        """,
        grace_seconds,
    )
    return int(status.split()[-1])


async def forget_dead_processes(conn: asyncpg.Connection, lease_seconds: float) -> None:
    """Removes the rows of processes past their lease that no longer own a RUNNING turn."""
    await conn.execute(
        f"""
        DELETE FROM service_processes p
        WHERE p.heartbeat < now() - {_lease("$1")}
          AND NOT EXISTS (
              SELECT 1 FROM executions e WHERE e.boot_id = p.boot_id AND e.status = 'RUNNING')
        """,
        lease_seconds,
    )


# The agent's ($1, $2) turns still RUNNING long after any turn could have ended ($3 seconds)
# marked FAILED with the error $4 gives their kind ({kind: error}, "" for any other),
# returning their rows.
_FAIL_STALE = """
        UPDATE executions
        SET status = 'FAILED', modified = now(),
            error = coalesce($4::jsonb ->> kind, $4::jsonb ->> '')
        WHERE account_id = $1 AND action_id = $2 AND status = 'RUNNING' AND kind <> 'OPERATOR'
          AND modified < now() - make_interval(secs => $3)
        RETURNING *"""


async def fail_stale_turns(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, older_than_seconds: float
) -> list[UUID]:
    """Marks FAILED the turns still RUNNING long after any turn could have ended."""
    rows = await conn.fetch(
        f"WITH failed AS ({_FAIL_STALE}) SELECT execution_id FROM failed",
        account_id,
        action_id,
        older_than_seconds,
        _DEAD_PROCESS,
    )
    return [r["execution_id"] for r in rows]


async def fail_stale_and_find_ended(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, older_than_seconds: float
) -> list[Row]:
    """`fail_stale_turns`, then the agent's turns no longer running that still have staged
    memory rows (their process died, or this statement failed them), in one statement."""
    return await conn.fetch(
        f"""
        WITH failed AS ({_FAIL_STALE}
        ), staged AS (
            SELECT DISTINCT m.pending_execution FROM agent_memories m
            WHERE m.account_id = $1 AND m.action_id = $2 AND m.pending_execution IS NOT NULL
        )
        SELECT f.* FROM failed f WHERE f.execution_id IN (SELECT * FROM staged)
        UNION ALL
        -- The statement's snapshot still sees the turns it failed as RUNNING: none twice.
        SELECT e.* FROM executions e
        WHERE e.account_id = $1 AND e.action_id = $2 AND e.kind <> 'OPERATOR'
          AND e.status <> 'RUNNING'
          AND e.execution_id IN (SELECT * FROM staged)
        """,
        account_id,
        action_id,
        older_than_seconds,
        _DEAD_PROCESS,
    )
