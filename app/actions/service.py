"""Agents (actions) and their versions: every update writes the next version."""

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

import asyncpg

from app.actions import store
from app.actions.harness import Harness, parse_harness
from app.actions.model import ModelConfig, check_endpoint, parse_model
from app.auth import resources
from app.auth.caller import AGENT_PREFIX, Caller
from app.auth.policies import is_allowed
from app.config import Settings
from app.errors import BadInput, Conflict, action_not_found
from app.text import check_one_line

MAX_INSTRUCTIONS = 64 * 1024
MAX_EXTRACTION_PROMPT = 16 * 1024  # the review's prompt: about 4,000 tokens at most
# Kinds and label descriptions are in the tools' schemas, sent with every model call: 100,000
# kinds and a long description made 3.5 MB a call, of a harness only the body limit bounded.
MAX_KINDS = 100
MAX_LABEL_DESCRIPTION = 1024  # bytes


def agent_principal(action_id: UUID) -> str:
    """The principal an agent acts as: what `modifiedBy` names when the agent writes."""
    return f"{AGENT_PREFIX}{action_id}"


@dataclass(frozen=True)
class ActionVersion:
    account_id: UUID
    action_id: UUID
    version: int
    current_version: int
    name: str
    instructions: str
    model: ModelConfig
    model_raw: dict[str, Any]
    harness: Harness
    created: datetime
    modified: datetime
    created_by: str

    @classmethod
    def of(cls, row: asyncpg.Record) -> "ActionVersion":
        """A version as `store` reads it (its model and harness as JSON text)."""
        model, model_raw = _model(row["model"])
        return cls(
            account_id=row["account_id"],
            action_id=row["action_id"],
            version=row["version"],
            current_version=row["current_version"],
            name=row["name"],
            instructions=row["instructions"],
            model=model,
            model_raw=model_raw,
            harness=_harness(row["harness"]),
            created=row["action_created"],
            modified=row["created"],
            created_by=row["created_by"],
        )


# A version's model and harness, parsed from their stored JSON text. A version is written once
# and never changed, so every request naming an agent reads the same text: each is parsed once
# per process (0.15-0.4 ms of the service's CPU a request, bench/README.md, `http_load.py`),
# keyed by the text itself, so a document rewritten in place (a restore) is parsed anew. The
# parsed values are shared between requests: they are frozen, but for the raw model dict and
# `Harness.raw`, which nothing may change.
@lru_cache(maxsize=1024)
def _model(text: str) -> tuple[ModelConfig, dict[str, Any]]:
    return parse_model(json.loads(text))


@lru_cache(maxsize=1024)
def _harness(text: str) -> Harness:
    return parse_harness(json.loads(text))


def check_name(name: str, *, stored: bool = False) -> str:
    """An agent's name as it is stored: 1 to 200 characters once trimmed, on one line.
    `stored`: a name stored already (check_one_line's `stored`)."""
    name = name.strip()
    if not name or len(name) > 200:
        raise BadInput("name must be 1 to 200 characters")
    return check_one_line(name, "name", stored=stored)


def check_instructions(instructions: str) -> None:
    """An agent's instructions: at most MAX_INSTRUCTIONS bytes (of UTF-8)."""
    if len(instructions.encode()) > MAX_INSTRUCTIONS:
        raise BadInput(f"instructions must be at most {MAX_INSTRUCTIONS} bytes")


def _values(
    name: str,
    instructions: str,
    model: Any,
    harness: Harness,
    settings: Settings | None,
    account_id: UUID,
    current_name: str | None = None,
) -> dict[str, Any]:
    """`current_name`: the agent's name before an update (None: a new agent); kept as it is,
    it is taken as it was stored."""
    name = check_name(name, stored=name.strip() == current_name)
    check_instructions(instructions)
    # Checked when written, not when a stored version is read (one written before the limit
    # still loads, and can be updated).
    prompt = harness.memory.extraction_prompt
    if prompt is not None and (size := len(prompt.encode())) > MAX_EXTRACTION_PROMPT:
        raise BadInput(
            f"harness.memory.extraction.prompt: must be at most {MAX_EXTRACTION_PROMPT} bytes "
            f"(the review sends it with each of its calls), not {size}"
        )
    memory = harness.memory
    if len(memory.kinds) > MAX_KINDS:
        raise BadInput(
            f"harness.memory.kinds: must be at most {MAX_KINDS} kinds (each is in the tools' "
            f"schemas of every model call), not {len(memory.kinds):,}"
        )
    for label in memory.labels:
        if (size := len(label.description.encode())) > MAX_LABEL_DESCRIPTION:
            raise BadInput(
                f"harness.memory.labels.{label.name}.description: must be at most "
                f"{MAX_LABEL_DESCRIPTION} bytes (it is in the tools' schemas of every model "
                f"call), not {size:,}"
            )
    config, model_raw = parse_model(model)
    if settings is not None:
        # Refused when written, not at the action's first turn (turns check again).
        check_endpoint(config, settings, account_id)
    return {"name": name, "instructions": instructions, "model": model_raw, "harness": harness.raw}


async def create_action(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    name: str,
    instructions: str,
    model: Any,
    harness: Any,
    settings: Settings | None = None,
) -> ActionVersion:
    """A new action. With `settings`, a model naming an endpoint or key variable the
    deployment does not allow the caller's account is BadInput (the API always passes them)."""
    caller.require(("INSERT", resources.ACTION))
    values = _values(name, instructions, model, parse_harness(harness), settings, caller.account_id)
    action_id = uuid.uuid4()
    async with pool.acquire() as conn:
        async with conn.transaction():
            await store.insert_action(conn, caller.account_id, action_id, values, caller.principal)
        row = await store.get_version(conn, caller.account_id, action_id, None)
    return ActionVersion.of(row)


async def update_action(
    pool: asyncpg.Pool,
    caller: Caller,
    *,
    action_id: UUID,
    name: str,
    instructions: str,
    model: Any,
    harness: Any,
    settings: Settings | None = None,
    expected_version: int | None = None,
) -> ActionVersion:
    """Writes the next version. With `expected_version` (the version the change was based on),
    an agent saved meanwhile is Conflict and nothing is written: a form filled from an older
    version never overwrites a newer one unseen."""
    caller.require(("UPDATE", resources.ACTION))
    async with pool.acquire() as conn:
        async with conn.transaction():
            current = await store.lock_current(conn, caller.account_id, action_id)
            if current is None:
                raise action_not_found(action_id)
            if expected_version is not None and current["version"] != expected_version:
                raise Conflict(
                    f"action {action_id} is at version {current['version']}, saved after "
                    f"version {expected_version} that this change was based on; nothing was "
                    "written: read it again and make the change to what it holds now"
                )
            previous = _harness(current["harness"])
            values = _values(
                name,
                instructions,
                model,
                parse_harness(harness, previous),
                settings,
                caller.account_id,
                current["name"],
            )
            version = await store.bump_version(conn, caller.account_id, action_id)
            await store.insert_version(
                conn, caller.account_id, action_id, version, values, caller.principal
            )
        row = await store.get_version(conn, caller.account_id, action_id, version)
    return ActionVersion.of(row)


async def load_action(
    conn: asyncpg.Connection, account_id: UUID, action_id: UUID, version: int | None = None
) -> ActionVersion | None:
    """Reads an action with no grant check: for layers that already decided access."""
    row = await store.get_version(conn, account_id, action_id, version)
    return ActionVersion.of(row) if row else None


async def load_actions(
    conn: asyncpg.Connection, account_id: UUID, action_ids: list[UUID]
) -> dict[UUID, ActionVersion]:
    """Actions at their current versions, those that exist, in one query; with no grant check,
    as load_action."""
    rows = await store.get_current(conn, account_id, action_ids)
    return {r["action_id"]: ActionVersion.of(r) for r in rows}


async def get_action(
    pool: asyncpg.Pool, caller: Caller, *, action_id: UUID, version: int | None = None
) -> ActionVersion | None:
    """One of the caller's actions, needing no grant by itself: its document fields are
    checked one by one (`require_document`), so that a client holding only the memory grants
    reaches `action(actionId) { memories }`, and its memory fields check their own grants."""
    async with pool.acquire() as conn:
        return await load_action(conn, caller.account_id, action_id, version)


async def get_action_versions(
    pool: asyncpg.Pool, caller: Caller, keys: list[tuple[UUID, int]]
) -> dict[tuple[UUID, int], ActionVersion]:
    """The caller's actions at the (action_id, version) of `keys` that exist, in one query;
    no grant needed, as `get_action`."""
    async with pool.acquire() as conn:
        rows = await store.get_versions(conn, caller.account_id, keys)
    found = (ActionVersion.of(r) for r in rows)
    return {(a.action_id, a.version): a for a in found}


def require_document(caller: Caller) -> None:
    """Reading an action's document (name, instructions, model, harness, ...)."""
    caller.require(("SELECT", resources.ACTION))


def may_read_document(caller: Caller) -> bool:
    """Whether require_document lets the caller through."""
    return is_allowed(caller.policies, "SELECT", resources.ACTION)


async def require_action(pool: asyncpg.Pool, caller: Caller, *, action_id: UUID) -> ActionVersion:
    """The current version of one of the caller's actions (no grant on the action needed)."""
    async with pool.acquire() as conn:
        action = await load_action(conn, caller.account_id, action_id)
    if action is None:
        raise action_not_found(action_id)
    return action


async def list_actions(
    pool: asyncpg.Pool, caller: Caller, *, limit: int, after: tuple[Any, UUID] | None
) -> list[ActionVersion]:
    caller.require(("SELECT", resources.ACTION_INDEX), ("SELECT", resources.ACTION))
    async with pool.acquire() as conn:
        rows = await store.list_current(conn, caller.account_id, limit, after)
    return [ActionVersion.of(r) for r in rows]
