"""GraphQL fuzzing over real HTTP: operations generated from the schema, as a hostile tenant.

Starts `engram serve` on loopback (its own embedded PostgreSQL in a temporary directory) unless
--url names a running service, sets up two tenants with agents, memories, sessions, executions
and clients, and seeds tenant B's text with a marker string. Then hypothesis generates
operations as tenant A from the schema itself: every root field of Query and Mutation, with
arguments drawn from valid values (tenant A's own IDs, names and kinds), unknown IDs of every
Node type, tenant B's IDs, and hostile values (NUL, lone surrogates, bidi controls, huge strings,
deep JSON, out-of-range integers), and selections of the returned type's fields. A fifth of
the queries are `nodes(ids:)`: a few IDs, or up to 1,001 mostly duplicated or unknown, mixing
A's, B's, IDs built of both tenants' parts (A's agent with B's record, event or session), and
IDs whose parts are hostile; `after` takes every listing's cursors (each bound to its list and
arguments) of both tenants, copies with their places replaced (past int4, NaN, Infinity, wrong
types, timestamps out of range), other digests and base64 spelled otherwise, and B's places
under A's digests.

It prints the requests sent, those that passed validation and executed (a resolver ran: data,
or an error with a path) per root field, and the three figures that must be 0: HTTP 5xx
answers, INTERNAL errors, and cross-tenant reads (a response to A holding B's marker, or data
holding one of B's IDs, bare or in a global ID). It exits non-zero when any of the three is not
0.

    python bench/fuzz_graphql.py                       # 12,000 operations, seed 11
    python bench/fuzz_graphql.py --examples 500 --seed 3
    python bench/fuzz_graphql.py --url http://127.0.0.1:8000 --admin-token ...

A turn (`executeAction`) talks to ENGRAM_MODEL_BASE_URL: the service started here points it at
a scripted model on loopback whose replies are hostile too (NUL and lone surrogates in its text,
native tool calls with hostile and other-tenant arguments, malformed arguments, 500s);
--no-model points it at a closed port instead, so every turn fails cleanly.
"""

import argparse
import atexit
import base64
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from graphql import (
    GraphQLEnumType,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLInterfaceType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
    GraphQLSchema,
    GraphQLUnionType,
)
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ChatServer  # noqa: E402

MARKER = "ZQXMARKERB"  # in tenant B's text only; never sent by A
# The queries that are `nodes(ids:)` whatever the root field drawn: many IDs of both tenants,
# hybrids of their parts, malformed ones, each call reading several types at once.
NODES_SHARE = 0.2
NODE_TYPES = (
    "Action",
    "ActionAgentMemory",
    "ActionExecution",
    "ActionSession",
    "ActionHistoryEvent",
    "ActionExecutionEvent",
    "Client",
    "ClientToken",
    "Account",
)
HARNESS = {
    "memory": {
        "enabled": True,
        "kinds": ["fact", "preference"],
        "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        "labels": {"topic": {"number": 5, "description": "The topic."}},
        "tools": ["add_memory", "read_memory", "delete_memory"],
    },
    # The turns' history (kept when a turn succeeds: with the scripted model), which
    # `ActionSession.history` lists and `searchHistory` searches.
    "history": {"index": "messages_and_tools"},
}
EVERYTHING = [
    {"effect": "ALLOW", "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"], "resources": ["*"]}
]


def node_id(*parts: object) -> str:
    raw = json.dumps([str(p) for p in parts], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@dataclass
class Tenant:
    token: str
    account_id: str
    principal: str
    other_principal: str
    action_ids: list[str] = field(default_factory=list)
    memory_ids: list[str] = field(default_factory=list)
    execution_ids: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)
    cursors: list[str] = field(default_factory=list)
    # Every listing's cursors as issued (each bound to its list and arguments), before the
    # crafted copies `cursors` holds as well.
    bound: list[str] = field(default_factory=list)
    event_ids: list[tuple[str, str, str]] = field(default_factory=list)  # agent, session, event
    # Transcript events: agent, execution, sequence.
    transcript_events: list[tuple[str, str, int]] = field(default_factory=list)
    token_ids: list[str] = field(default_factory=list)

    def owned(self) -> set[str]:
        """The IDs (UUIDs) of what this tenant owns: none may reach another tenant's answers."""
        return {
            self.account_id,
            *self.action_ids,
            *self.memory_ids,
            *self.execution_ids,
            *self.token_ids,
            *(e[2] for e in self.event_ids),
        }


@dataclass
class World:
    a: Tenant
    b: Tenant


@dataclass
class Report:
    sent: int = 0
    executed: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    server_errors: int = 0
    internal: int = 0
    cross_tenant: int = 0
    samples: list[str] = field(default_factory=list)
    messages: Counter[str] = field(default_factory=Counter)  # "root CODE message", for --errors
    nodes_calls: int = 0  # of them `nodes(ids:)`, with `ids` as a variable
    ids_sent: int = 0  # the IDs those passed

    @property
    def failures(self) -> int:
        return self.server_errors + self.internal + self.cross_tenant

    def lines(self) -> list[str]:
        out = [f"  {name:<22} {count:>6}" for name, count in sorted(self.executed.items())]
        return [
            "executed per root field:",
            *out,
            f"requests sent:          {self.sent}",
            f"requests executed:      {sum(self.executed.values())}",
            f"nodes(ids:) calls:      {self.nodes_calls} ({self.ids_sent} IDs)",
            "error codes:            "
            + ", ".join(f"{c} {n}" for c, n in sorted(self.codes.items())),
            f"HTTP 5xx:               {self.server_errors}",
            f"INTERNAL:               {self.internal}",
            f"cross-tenant reads:     {self.cross_tenant}",
        ]


class Api:
    def __init__(self, client: httpx.Client, token: str) -> None:
        self.client = client
        self.headers = {"authorization": f"Bearer {token}"}

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        response = self.client.post(
            "/graphql", json={"query": query, "variables": variables}, headers=self.headers
        )
        body = response.json()
        if body.get("errors"):
            raise RuntimeError(f"setup failed: {body['errors']}")
        return body["data"]


def _tenant(client: httpx.Client, admin: Api, name: str, text: str) -> Tenant:
    account_id = admin(
        "mutation($i: AccountInput!) { createAccount(input: $i) { accountId } }",
        i={"name": f"{text} account"},
    )["createAccount"]["accountId"]
    create_client = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
    token_of = "mutation($p: String!, $a: UUID) { createClientToken(principal: $p, accountId: $a) { token } }"  # noqa: E501
    for principal in (f"fuzz-{name}", f"helper-{name}"):
        admin(
            create_client,
            i={
                "accountId": account_id,
                "principal": principal,
                "name": f"{text} client",
                "policies": EVERYTHING,
            },
        )
    token = admin(token_of, p=f"fuzz-{name}", a=account_id)["createClientToken"]["token"]
    tenant = Tenant(token, account_id, f"fuzz-{name}", f"helper-{name}")
    api = Api(client, token)
    for i in range(2):
        action = api(
            "mutation($i: ActionInput!) { createAction(input: $i) { actionId id } }",
            i={
                "name": f"{text} agent {i}",
                "instructions": f"{text} instructions",
                "harness": HARNESS,
            },
        )["createAction"]
        tenant.action_ids.append(action["actionId"])
        tenant.node_ids.append(action["id"])
        for j in range(3):
            session = f"{text}-session-{j}"
            added = api(
                """mutation($a: UUID!, $i: AgentMemoryInput!) {
                  addAgentMemory(actionId: $a, input: $i) { id memoryId executionId }
                }""",
                a=action["actionId"],
                i={
                    "summary": f"{text} memory {i}.{j}",
                    "content": f"{text} content",
                    "kind": "fact",
                    "sessionId": session,
                    "metadata": {"note": text},
                    "labels": [{"name": "topic", "value": f"{text} topic"}],
                },
            )["addAgentMemory"]
            tenant.memory_ids.append(added["memoryId"])
            tenant.node_ids.append(added["id"])
            tenant.execution_ids.append(added["executionId"])
            tenant.sessions.append(session)
        turn = api(
            """mutation($i: ExecuteActionInput!) {
              executeAction(input: $i) {
                executionId id session { id } transcript(first: 5) { nodes { id sequence } }
              }
            }""",
            i={"actionId": action["actionId"], "sessionId": f"{text}-turn", "input": text},
        )["executeAction"]
        tenant.execution_ids.append(turn["executionId"])
        tenant.node_ids.append(turn["id"])
        for event in turn["transcript"]["nodes"]:
            tenant.node_ids.append(event["id"])
            tenant.transcript_events.append(
                (action["actionId"], turn["executionId"], event["sequence"])
            )
        if turn["session"]:
            tenant.node_ids.append(turn["session"]["id"])
        page = api(
            "query($a: UUID!) { action(actionId: $a) { memories(first: 1) { edges { cursor } }"
            " executions(first: 1) { edges { cursor } }"
            " sessions(first: 5) { nodes { history(first: 1) { edges { cursor } } } } } }",
            a=action["actionId"],
        )["action"]
        tenant.cursors += [e["cursor"] for e in page["memories"]["edges"]]
        tenant.cursors += [e["cursor"] for e in page["executions"]["edges"]]
        for session in page["sessions"]["nodes"]:
            tenant.cursors += [e["cursor"] for e in session["history"]["edges"]]
        # A ranked search's cursors (each carries its search's key, its place, its depth and
        # what ranked its first page), as issued and crafted at the bounds they are read with.
        for mode in ("HYBRID", "LEXICAL", "VECTOR"):
            ranked = api(
                "query($a: UUID!, $m: ActionAgentMemorySearchMode) { action(actionId: $a) {"
                ' searchMemories(query: "tenant A memory", mode: $m, first: 1)'
                " { edges { cursor } } } }",
                a=action["actionId"],
                m=mode,
            )["action"]["searchMemories"]["edges"]
            tenant.cursors += [c for e in ranked for c in _ranked_variants(e["cursor"])]
        listed = api(LISTINGS, a=action["actionId"])["action"]
        for session in listed["sessions"]["nodes"]:
            tenant.node_ids.append(session["id"])
            for event in session["history"]["nodes"]:
                tenant.node_ids.append(event["id"])
                tenant.event_ids.append((action["actionId"], event["sessionId"], event["eventId"]))
        for record in listed["memories"]["nodes"]:
            tenant.node_ids += [v["id"] for v in record["history"]["nodes"]]
        tenant.bound += _cursors_in(listed)
    client_node = api("query($p: String!) { client(principal: $p) { id } }", p=f"helper-{name}")
    tenant.node_ids.append(client_node["client"]["id"])
    account = api(
        "query($p: String!) { actions(first: 1) { edges { cursor } }"
        " clients(first: 1) { edges { cursor } }"
        " client(principal: $p) { tokens(first: 1) { edges { cursor node { id tokenId } } } } }",
        p=tenant.principal,
    )
    for edge in account["client"]["tokens"]["edges"]:
        tenant.node_ids.append(edge["node"]["id"])
        tenant.token_ids.append(edge["node"]["tokenId"])
    tenant.node_ids.append(node_id("Account", account_id))
    tenant.bound += _cursors_in(account)
    tenant.cursors += [c for cursor in tenant.bound for c in _bound_variants(cursor)]
    return tenant


# Every listing of an agent, a page of one each (sessions, their history and executions; the
# agent's executions, their transcripts; its records, their versions; searchMemories without a
# query, with and without a kind): their cursors, each bound to its list and arguments, and the
# IDs of what they list.
LISTINGS = """query($a: UUID!) { action(actionId: $a) {
  sessions(first: 3) { edges { cursor } nodes { id
    history(first: 2) { edges { cursor } nodes { id sessionId eventId } }
    executions(first: 1) { edges { cursor } } } }
  executions(first: 2) { edges { cursor } nodes { transcript(first: 1) { edges { cursor } } } }
  memories(first: 2) { edges { cursor }
    nodes { history(first: 2) { edges { cursor } nodes { id } } } }
  plain: searchMemories(first: 1) { edges { cursor } }
  ofKind: searchMemories(first: 1, kind: "fact") { edges { cursor } }
} }"""


def _cursors_in(value: Any) -> list[str]:
    """Every `cursor` in an answer."""
    if isinstance(value, dict):
        found = [value["cursor"]] if isinstance(value.get("cursor"), str) else []
        return found + [c for v in value.values() for c in _cursors_in(v)]
    if isinstance(value, list):
        return [c for v in value for c in _cursors_in(v)]
    return []


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# What a bound cursor's places are replaced with (app/db/cursors.py reads each as its kind):
# integers past int4 and int8, negative ones, floats past a double, NaN and Infinity (which
# json.dumps writes), wrong types, timestamps that leave datetime's range in UTC, a naive one,
# UUIDs that are none, NUL and a lone surrogate (as JSON escapes), nesting.
BOUND_PLACES: list[Any] = [
    2**31,
    -(2**31) - 1,
    2**64,
    -1,
    1e308,
    float("nan"),
    float("inf"),
    "x",
    None,
    True,
    [[["x"]]],
    {"t": "0001-01-01T00:00:00+14:00"},
    {"t": "9999-12-31T23:59:59-14:00"},
    {"t": "2026-01-01T00:00:00"},
    {"u": "not-a-uuid"},
    {"u": "0" * 31},
    "9999-12-31T23:59:59-14:00",
    "\x00",
    "\ud800",
]


def _bound_variants(cursor: str) -> list[str]:
    """A bound listing's cursor (its binding's digest, then its places) and copies of it: each
    place replaced (BOUND_PLACES), a place more or less, another digest, and base64 spelled
    otherwise (padded, the standard alphabet, characters outside it)."""
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError:
        return [cursor]
    if not isinstance(values, list) or not values or not isinstance(values[0], str):
        return [cursor]
    crafted = []
    for i in range(1, len(values)):
        for place in BOUND_PLACES:
            edited = [*values[:i], place, *values[i + 1 :]]
            # (NUL and a lone surrogate go as JSON escapes, as json.dumps writes them.)
            crafted.append(_b64(json.dumps(edited, separators=(",", ":")).encode()))
    digest, places = values[0], values[1:]
    for edited in ([*values, 1], values[:-1], ["0" * 16, *places], [digest.upper(), *places]):
        crafted.append(_b64(json.dumps(edited, separators=(",", ":")).encode()))
    padded = cursor + "=" * (-len(cursor) % 4)
    crafted += [padded, padded.replace("-", "+").replace("_", "/"), cursor + "!~", cursor[:-2]]
    return [cursor, *crafted]


def _mixed_cursors(own: list[str], other: list[str]) -> list[str]:
    """The other tenant's places under this tenant's digests: a valid-looking binding whose
    position was never issued for it (every pair of the same length)."""

    def values(cursor: str) -> Any:
        return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))

    mixed = []
    for mine in own:
        for theirs in other:
            a, b = values(mine), values(theirs)
            if len(a) == len(b) and a[0] != b[0]:
                mixed.append(_b64(json.dumps([a[0], *b[1:]], separators=(",", ":")).encode()))
    return mixed


def _ranked_variants(cursor: str) -> list[str]:
    """A ranked search's cursor, and copies with its depth, score, weights and best text score
    changed to values at and past the bounds they are read with (app/db/cursors.py)."""
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError:
        return [cursor]
    if not isinstance(values, list) or len(values) != 7:
        return [cursor]

    def weights(*numbers: float) -> str:
        packed = struct.pack(f"<{len(numbers)}d", *numbers)
        return base64.urlsafe_b64encode(packed).decode().rstrip("=")

    changes: list[dict[int, Any]] = [
        {4: 9_999},
        {4: 10_000},
        {4: 0},
        {1: 1e308},
        {1: -1e308},
        {5: weights(1e6, 1e6, 1e6), 6: 1e-12},
        {5: weights(1e-30, 1e-30, 1e-30), 6: 1e12},
        {5: weights(0.0, 0.0, 0.0), 6: None},
        {5: weights(*[1.0] * 65)},
        {6: 0.0},
    ]
    crafted = []
    for change in changes:
        edited = [change.get(i, v) for i, v in enumerate(values)]
        text = json.dumps(edited, separators=(",", ":")).encode()
        crafted.append(base64.urlsafe_b64encode(text).decode().rstrip("="))
    return [cursor, *crafted]


def set_up(base_url: str, admin_token: str) -> World:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        admin = Api(client, admin_token)
        world = World(
            a=_tenant(client, admin, "a", "tenant A"), b=_tenant(client, admin, "b", MARKER)
        )
        world.a.cursors += _mixed_cursors(world.a.bound, world.b.bound)
        return world


# Values


HOSTILE_TEXT = [
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "\u202eevil\u202c",
    "\u2066x\u2069",
    "\ufeff",
    "'; DROP TABLE agent_memories; --",
    "%_\\",
    "*?*?*?*?*?*?Z",
    "\n\r\t",
    "😀" * 50,
    "A" * 5000,
    "word " * 2000,
    "Z" * 100_000,
    "0" * 40,
    "-1",
    "ⅷ",
    "١٢٣",
    "null",
    "{}",
    "[]",
]


class Draw:
    """Values for one operation, from hypothesis's data and a hypothesis-seeded Random."""

    def __init__(self, data: Any, world: World, schema: GraphQLSchema, hostile: bool) -> None:
        self.data = data
        self.rnd: random.Random = data.draw(st.randoms(use_true_random=False))
        self.world = world
        self.schema = schema
        self.hostile = hostile

    def chance(self, p: float) -> bool:
        return self.rnd.random() < p

    def fresh(self) -> str:
        return str(uuid.UUID(int=self.rnd.getrandbits(128)))

    def text(self, name: str) -> str:
        a, b = self.world.a, self.world.b
        if self.hostile and self.chance(0.3):
            if self.chance(0.5):
                return self.rnd.choice(HOSTILE_TEXT)
            return self.data.draw(st.text(max_size=30))
        pools = {
            "principal": [a.other_principal, "nobody", b.other_principal],  # never its own
            "sessionId": a.sessions + ["new-session", "s"],
            "kind": ["fact", "preference", "unknown_kind"],
            "query": ["tenant A memory", "content", "topic", "", "   "],
            "after": a.cursors + b.cursors + ["", "bm90IGEgY3Vyc29y"],
            "name": ["topic", "tenant A thing", "agent"],
            "value": ["tenant A topic", "v"],
            "summary": ["tenant A fuzz summary", "s"],
            "content": ["tenant A fuzz content", ""],
            "instructions": ["You help.", ""],
        }
        return self.rnd.choice(pools.get(name, ["tenant A text", "x", ""]))

    def uuid(self, name: str) -> str:
        a, b = self.world.a, self.world.b
        if "action" in name.lower():
            own, other = a.action_ids, b.action_ids
        elif "execution" in name.lower():
            own, other = a.execution_ids, b.execution_ids
        elif "account" in name.lower():
            own, other = [a.account_id], [b.account_id]
        else:
            own, other = a.memory_ids, b.memory_ids
        roll = self.rnd.random()
        if roll < 0.6:
            return self.rnd.choice(own)
        if roll < 0.8:
            return self.rnd.choice(other)
        if roll < 0.9:
            return self.rnd.choice(a.memory_ids + a.action_ids + a.execution_ids)
        return str(uuid.UUID(int=self.rnd.getrandbits(128)))

    def node_id(self) -> str:
        a, b = self.world.a, self.world.b
        roll = self.rnd.random()
        if roll < 0.35:
            return self.rnd.choice(a.node_ids)
        if roll < 0.55:
            return self.rnd.choice(b.node_ids)
        if roll < 0.75:  # unknown IDs of every Node type
            kind = self.rnd.choice(NODE_TYPES)
            fresh = str(uuid.UUID(int=self.rnd.getrandbits(128)))
            action = self.rnd.choice(a.action_ids + b.action_ids + [fresh])
            return {
                "Action": node_id("Action", action, self.rnd.choice([1, 2, 99, 2**31 - 1])),
                "ActionAgentMemory": node_id("ActionAgentMemory", action, fresh),
                "ActionExecution": node_id("ActionExecution", action, fresh),
                "ActionSession": node_id("ActionSession", action, "no-such-session"),
                "ActionHistoryEvent": node_id("ActionHistoryEvent", action, "s", fresh),
                "ActionExecutionEvent": node_id("ActionExecutionEvent", action, fresh, 1),
                "Client": node_id(
                    "Client",
                    self.rnd.choice([a.account_id, b.account_id]),
                    self.rnd.choice(["nobody", a.other_principal]),
                ),
                "ClientToken": node_id("ClientToken", a.account_id, a.principal, fresh),
                "Account": node_id("Account", fresh),
            }[kind]
        if roll < 0.88:
            return self.hybrid_id()
        if roll < 0.95:
            return self.hostile_id()
        return self.rnd.choice(
            [
                "",
                "not-base64!",
                node_id("Nope", "x"),
                node_id("Action"),
                node_id("Action", "x", "1"),
                node_id("Action", fresh_uuid(), "-1"),
            ]
        )

    def hybrid_id(self) -> str:
        """An ID whose parts are of both tenants: one's agent (or account) with the other's
        record, execution, session, event or token, so that a check of one part alone would
        read the other tenant's object."""
        a, b = self.world.a, self.world.b
        mine, theirs = (a, b) if self.chance(0.5) else (b, a)
        event = self.rnd.choice(theirs.event_ids or [(theirs.action_ids[0], "s", self.fresh())])
        transcript = self.rnd.choice(
            theirs.transcript_events or [(theirs.action_ids[0], self.fresh(), 1)]
        )
        agent = self.rnd.choice(mine.action_ids)
        return self.rnd.choice(
            [
                node_id("ActionAgentMemory", agent, self.rnd.choice(theirs.memory_ids)),
                node_id("ActionAgentMemory", agent, self.rnd.choice(theirs.memory_ids), 1),
                node_id("ActionExecution", agent, self.rnd.choice(theirs.execution_ids)),
                node_id("ActionSession", agent, self.rnd.choice(theirs.sessions)),
                node_id("ActionHistoryEvent", agent, event[1], event[2]),
                node_id("ActionHistoryEvent", event[0], self.rnd.choice(mine.sessions), event[2]),
                node_id("ActionExecutionEvent", agent, transcript[1], transcript[2]),
                node_id(
                    "ActionExecutionEvent", transcript[0], self.rnd.choice(mine.execution_ids), 1
                ),
                node_id("Action", agent, 1),
                node_id("Client", mine.account_id, theirs.principal),
                node_id(
                    "ClientToken",
                    mine.account_id,
                    theirs.principal,
                    self.rnd.choice(theirs.token_ids or [self.fresh()]),
                ),
                node_id("Account", theirs.account_id),
            ]
        )

    def hostile_id(self) -> str:
        """A well-encoded global ID whose parts are hostile: NUL and lone surrogates (as JSON
        escapes), numbers past int4 and int8, negative, non-ASCII digits, parts that are not
        text, nesting, a part of 50,000 characters, too many or too few parts."""
        action = self.rnd.choice(self.world.a.action_ids)
        memory = self.rnd.choice(self.world.a.memory_ids)
        part = self.rnd.choice(
            [
                '"\\u0000"',
                '"a\\u0000b"',
                '"\\ud800"',
                '"\\udfff\\ud800"',
                '"2147483648"',
                '"99999999999999999999999"',
                '"-1"',
                '"\\uff11"',
                '" 1"',
                '"1e3"',
                "1",
                "1e400",
                "NaN",
                "null",
                "true",
                '["1"]',
                "[" * 2000 + "]" * 2000,
                json.dumps("x" * 50_000),
            ]
        )
        shapes = [
            f'["Action","{action}",{part}]',
            f'["ActionAgentMemory","{action}","{memory}",{part}]',
            f'["ActionAgentMemory","{action}",{part}]',
            f'["ActionSession","{action}",{part}]',
            f'["ActionHistoryEvent","{action}",{part},"{memory}"]',
            f'["ActionExecution",{part},"{memory}"]',
            f'["Client","{self.world.a.account_id}",{part}]',
            f'["Account",{part}]',
            f'[{part},"{action}"]',
            f'["Action","{action}","1","extra"]',
            '["Account"]',
        ]
        return _b64(self.rnd.choice(shapes).encode())

    def node_ids(self) -> list[str]:
        """`nodes(ids:)`: a few IDs of every kind; or tens to a thousand, mostly duplicates
        or unknown, with a malformed one among them at times; or one past the bound."""
        roll = self.rnd.random()
        if roll < 0.6:
            return [self.node_id() for _ in range(self.rnd.randint(0, 6))]
        count = self.rnd.choice([20, 100, 999, 1000, 1000, 1001])
        if roll < 0.75:  # the other tenant's objects and unknown ones, each many times
            pool = [self.node_id() for _ in range(8)]
            ids = [self.rnd.choice(pool) for _ in range(count)]
        elif roll < 0.9:  # distinct unknown ones (one read each, none found)
            agent = self.rnd.choice(self.world.a.action_ids + self.world.b.action_ids)
            ids = [node_id("ActionAgentMemory", agent, self.fresh()) for _ in range(count)]
        else:  # own objects, then one malformed at a random place
            ids = [self.rnd.choice(self.world.a.node_ids) for _ in range(count)]
            ids[self.rnd.randrange(count)] = self.hostile_id()
        return ids

    def json_value(self, depth: int = 0) -> Any:
        if self.hostile and depth == 0 and self.chance(0.1):
            deep: Any = "x"
            for _ in range(self.rnd.choice([10, 63, 70, 200])):
                deep = [deep]
            return deep
        roll = self.rnd.random()
        if depth > 3 or roll < 0.4:
            wild = [float("nan"), float("inf"), -float("inf")] if self.hostile else []
            return self.rnd.choice(
                [1, -1, 0, 2**31, 10**20, 1.5, True, None, "x", self.text("value"), *wild]
            )
        if roll < 0.7:
            return {
                self.text("key"): self.json_value(depth + 1) for _ in range(self.rnd.randint(0, 3))
            }
        return [self.json_value(depth + 1) for _ in range(self.rnd.randint(0, 3))]

    def value(self, type_: GraphQLInputType, name: str, depth: int = 0) -> Any:
        required = isinstance(type_, GraphQLNonNull)
        inner = type_.of_type if isinstance(type_, GraphQLNonNull) else type_
        if not required and self.chance(0.25):
            return None
        if isinstance(inner, GraphQLList) and _named(inner).name == "ID":
            return self.node_ids()
        if isinstance(inner, GraphQLList):
            count = self.rnd.choice([0, 1, 1, 2, 3])
            return [self.value(inner.of_type, name, depth + 1) for _ in range(count)]
        if isinstance(inner, GraphQLEnumType):
            return self.rnd.choice(list(inner.values))
        if isinstance(inner, GraphQLInputObjectType):
            out = {}
            for field_name, field_ in inner.fields.items():
                if isinstance(field_.type, GraphQLNonNull) or self.chance(0.6):
                    out[field_name] = self.value(field_.type, field_name, depth + 1)
            return out
        assert isinstance(inner, GraphQLScalarType)
        return self.scalar(inner.name, name)

    def scalar(self, type_name: str, name: str) -> Any:
        if type_name == "Int":
            if name == "first":
                return self.rnd.choice(
                    [0, 1, 2, 5, 10] + ([-1, 1001, 2**31 - 1] if self.hostile else [])
                )
            return self.rnd.choice(
                [1, 2, 0, 5] + ([-1, 2**31 - 1, -(2**31)] if self.hostile else [])
            )
        if type_name == "Boolean":
            return self.chance(0.5)
        if type_name == "Float":
            return self.rnd.choice([0.0, 1.5, -3.0])
        if type_name == "UUID":
            return self.uuid(name)
        if type_name == "ID":
            return self.node_id()
        if type_name == "Value":
            if name == "harness":
                return HARNESS if self.chance(0.7) else self.json_value()
            if name == "model":
                return self.rnd.choice([None, {}, {"name": "m"}, self.json_value()])
            if name == "input":
                return self.rnd.choice(["hello", {"text": self.text("x")}, self.json_value()])
            return self.json_value()
        if type_name == "Timestamp":
            return self.rnd.choice(["2026-01-01T00:00:00Z", "not a time", "9999-12-31T23:59:59Z"])
        return self.text(name)


def fresh_uuid() -> str:
    return str(uuid.uuid4())


def _named(type_: Any) -> Any:
    while isinstance(type_, GraphQLNonNull | GraphQLList):
        type_ = type_.of_type
    return type_


# Operations


def _selection(draw: Draw, type_: Any, depth: int) -> str:
    while isinstance(type_, GraphQLNonNull | GraphQLList):
        type_ = type_.of_type
    if isinstance(type_, GraphQLScalarType | GraphQLEnumType):
        return ""
    if isinstance(type_, GraphQLInterfaceType | GraphQLUnionType):
        possible = draw.schema.get_possible_types(type_)
        parts = ["__typename"]
        if isinstance(type_, GraphQLInterfaceType):  # its own fields too (Node's `id`)
            parts += [
                name
                for name, field_ in type_.fields.items()
                if not field_.args
                and isinstance(_named(field_.type), GraphQLScalarType)
                and draw.chance(0.7)
            ]
        for concrete in draw.rnd.sample(possible, min(len(possible), 2)):
            parts.append(f"... on {concrete.name} {{ {_selection(draw, concrete, depth)} }}")
        return " ".join(parts)
    assert isinstance(type_, GraphQLObjectType)
    parts = []
    for name, field_ in type_.fields.items():
        leaf = isinstance(
            getattr(getattr(field_.type, "of_type", field_.type), "of_type", field_.type),
            GraphQLScalarType | GraphQLEnumType,
        ) or isinstance(field_.type, GraphQLScalarType | GraphQLEnumType)
        if leaf and not field_.args and draw.chance(0.7):
            parts.append(name)
        elif not leaf and depth < 3 and draw.chance(0.3):
            args = _literal_args(draw, field_.args)
            inner = _selection(draw, field_.type, depth + 1)
            if inner:
                parts.append(f"{name}{args} {{ {inner} }}")
        elif leaf and field_.args and draw.chance(0.3):
            parts.append(f"{name}{_literal_args(draw, field_.args)}")
    return " ".join(parts) or "__typename"


def _literal_args(draw: Draw, args: dict[str, Any]) -> str:
    """Nested fields' arguments, as literals (mostly valid: the root field is the target)."""
    out = []
    for name, arg in args.items():
        if isinstance(arg.type, GraphQLNonNull) or draw.chance(0.3):
            value = draw.value(arg.type, name)
            if value is not None:
                out.append(f"{name}: {_literal(value, arg.type)}")
    return f"({', '.join(out)})" if out else ""


def _literal(value: Any, type_: Any) -> str:
    inner = type_.of_type if isinstance(type_, GraphQLNonNull) else type_
    if value is None:
        return "null"
    if isinstance(inner, GraphQLEnumType):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, list):
        item = inner.of_type if isinstance(inner, GraphQLList) else inner
        return "[" + ", ".join(_literal(v, item) for v in value) + "]"
    if isinstance(value, dict):
        if isinstance(inner, GraphQLInputObjectType):
            fields = ", ".join(
                f"{k}: {_literal(v, inner.fields[k].type)}" for k, v in value.items()
            )
            return "{" + fields + "}"
        return _value_literal(value)
    if isinstance(inner, GraphQLScalarType) and inner.name == "Value":
        return _value_literal(value)
    return _string_literal(value) if isinstance(value, str) else json.dumps(value)


def _string_literal(text: str) -> str:
    # GraphQL strings escape as JSON does, except that a lone surrogate stays raw (the body's
    # JSON then carries it as an escape): the server must refuse it, not the parser.
    return json.dumps(text, ensure_ascii=False)


def _value_literal(value: Any) -> str:
    """Any JSON value as a GraphQL literal (objects with quoted keys are not GraphQL)."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if k.isidentifier() and k.isascii()]
        return "{" + ", ".join(f"{k}: {_value_literal(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value_literal(v) for v in value) + "]"
    if isinstance(value, str):
        return _string_literal(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _type_ref(type_: Any) -> str:
    if isinstance(type_, GraphQLNonNull):
        return _type_ref(type_.of_type) + "!"
    if isinstance(type_, GraphQLList):
        return "[" + _type_ref(type_.of_type) + "]"
    return type_.name


def operation(draw: Draw) -> tuple[str, str, dict[str, Any]]:
    """(root field, document, variables): every argument of the root field as a variable."""
    kind = "mutation" if draw.chance(0.35) else "query"
    root = draw.schema.mutation_type if kind == "mutation" else draw.schema.query_type
    assert root is not None
    name = draw.rnd.choice(sorted(root.fields))
    if kind == "query" and draw.chance(NODES_SHARE):
        name = "nodes"
    field_ = root.fields[name]
    variables: dict[str, Any] = {}
    definitions, args = [], []
    inline = draw.chance(0.2)  # arguments as literals in the document, not variables
    for arg_name, arg in field_.args.items():
        value = draw.value(arg.type, arg_name)
        if value is None and not isinstance(arg.type, GraphQLNonNull) and draw.chance(0.5):
            continue
        if inline:
            args.append(f"{arg_name}: {_literal(value, arg.type)}")
            continue
        variables[arg_name] = value
        definitions.append(f"${arg_name}: {_type_ref(arg.type)}")
        args.append(f"{arg_name}: ${arg_name}")
    # Under node and nodes, at times deeper: the objects' own lists and their objects' lists.
    deeper = name in ("node", "nodes") and draw.chance(0.3)
    selection = _selection(draw, field_.type, -1 if deeper else 1)
    body = f"{name}({', '.join(args)})" if args else name
    if selection:
        body += f" {{ {selection} }}"
    header = f"{kind} Fuzz({', '.join(definitions)})" if definitions else f"{kind} Fuzz"
    return name, f"{header} {{ {body} }}", variables


def _foreign(value: Any, theirs: set[str]) -> str | None:
    """A string of an answer's data that is, or is a global ID naming, one of `theirs`."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return next((f for v in value if (f := _foreign(v, theirs)) is not None), None)
    if not isinstance(value, str):
        return None
    if value in theirs:
        return value
    try:
        parts = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (ValueError, RecursionError):
        return None
    if isinstance(parts, list) and any(isinstance(p, str) and p in theirs for p in parts):
        return value
    return None


def check(
    report: Report, root: str, response: httpx.Response, theirs: set[str] | None = None
) -> None:
    """Counts the answer: 5xx, INTERNAL, and a cross-tenant read (B's marker anywhere in it, or
    in its data one of `theirs`, B's IDs, bare or in a global ID)."""
    report.sent += 1
    text = response.text
    if response.status_code >= 500:
        report.server_errors += 1
        report.samples.append(f"HTTP {response.status_code} on {root}: {text[:300]}")
    if MARKER in text:
        report.cross_tenant += 1
        report.samples.append(f"cross-tenant read on {root}: {text[:300]}")
    try:
        body = response.json()
    except ValueError:
        report.samples.append(f"not JSON on {root}: {text[:200]}")
        report.server_errors += response.status_code >= 500
        return
    found = _foreign(body.get("data"), theirs) if theirs and MARKER not in text else None
    if found is not None:
        report.cross_tenant += 1
        report.samples.append(f"cross-tenant ID on {root}: {found[:100]} in {text[:300]}")
    errors = body.get("errors") or []
    for error in errors:
        code = (error.get("extensions") or {}).get("code", "NONE")
        report.codes[code] += 1
        report.messages[f"{root} {code} {str(error.get('message'))[:120]}"] += 1
        if code == "INTERNAL":
            report.internal += 1
            report.samples.append(f"INTERNAL on {root}: {json.dumps(error)[:300]}")
    if body.get("data") is not None or any(e.get("path") for e in errors):
        report.executed[root] += 1


def fuzz(base_url: str, world: World, examples: int, seed_value: int) -> Report:
    from app.graphql.schema import schema as app_schema

    graphql_schema = app_schema._schema
    report = Report()
    theirs = world.b.owned()
    headers = {"authorization": f"Bearer {world.a.token}", "content-type": "application/json"}
    client = httpx.Client(base_url=base_url, timeout=120, headers=headers)

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def one(data: Any) -> None:
        hostile = data.draw(st.integers(0, 9)) < 3
        draw = Draw(data, world, graphql_schema, hostile)
        root, document, variables = operation(draw)
        if root == "nodes":
            report.nodes_calls += 1
            ids = variables.get("ids")
            report.ids_sent += len(ids) if isinstance(ids, list) else 0
        payload = json.dumps({"query": document, "variables": variables})
        check(report, root, client.post("/graphql", content=payload.encode()), theirs)

    try:
        one()
    finally:
        client.close()
    return report


# A scripted, hostile model


class Model:
    """An OpenAI-compatible chat endpoint on loopback whose replies are drawn at random:
    plain text, text with NUL, lone surrogates and bidi controls, calls of the native tools
    with valid, hostile and other-tenant arguments, malformed arguments, and errors."""

    def __init__(self, seed_value: int) -> None:
        self.world: World | None = None  # until set: plain replies (the setup's turns)
        self.rnd = random.Random(seed_value)
        self.chat = ChatServer(lambda asked: self.reply())

    @property
    def url(self) -> str:
        return self.chat.url

    def close(self) -> None:
        self.chat.close()

    def _text(self) -> str:
        return self.rnd.choice(
            ["Done.", "ok\u0000then", "half \ud800 a pair", "\u202egnp.exe", "x" * 20_000, ""]
        )

    def _call(self) -> dict[str, Any]:
        assert self.world is not None
        a, b = self.world.a, self.world.b
        memory = self.rnd.choice(a.memory_ids + b.memory_ids + [fresh_uuid(), "not-a-uuid"])
        name, args = self.rnd.choice(
            [
                ("search_memory", {"query": self.rnd.choice(["tenant A", "x" * 5000, "\u0000"])}),
                ("search_memory", {"ids": [memory], "limit": self.rnd.choice([1, 0, 1000])}),
                ("search_memory", {"after": self.rnd.choice(a.cursors + b.cursors + ["zz"])}),
                (
                    "add_memory",
                    {
                        "summary": self.rnd.choice(["tenant A fact", "\u0000", "y" * 900]),
                        "kind": self.rnd.choice(["fact", "nope"]),
                        "labels": {"topic": "\ud800"},
                    },
                ),
                ("read_memory", {"id": memory}),
                ("delete_memory", {"id": memory}),
                ("no_such_tool", {}),
            ]
        )
        arguments = json.dumps(args)  # NUL and lone surrogates as JSON escapes, as sent
        if self.rnd.random() < 0.1:
            arguments = "{not json"
        return {
            "id": f"call_{self.rnd.getrandbits(32)}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def reply(self) -> tuple[int, str]:
        roll = self.rnd.random() if self.world is not None else 0.99
        if roll < 0.05:
            return 500, '{"error": {"message": "scripted failure"}}'
        if roll < 0.08:
            return 200, '{"choices": []}'
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if roll < 0.55:
            message["tool_calls"] = [self._call() for _ in range(self.rnd.randint(1, 3))]
            finish = "tool_calls"
        else:
            message["content"] = self._text() if self.world is not None else "Noted."
            finish = "stop"
        body = json.dumps(
            {
                "id": "fuzz",
                "object": "chat.completion",
                "model": "fuzz",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )
        return 200, body


# The service


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(
    data_dir: Path, admin_token: str, model_url: str | None, more: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`engram serve` on loopback with its own embedded PostgreSQL in `data_dir`, its log in
    serve.log there; `more`: further settings (ENGRAM_* variables)."""
    port = _free_port()
    env = {
        **os.environ,
        "ENGRAM_DATA_DIR": str(data_dir),
        "ENGRAM_BOOTSTRAP_TOKEN": admin_token,
        "ENGRAM_PORT": str(port),
        "ENGRAM_SEARCH_MAINTENANCE_SECONDS": "0",
        # Without a model, at a closed port: turns fail cleanly.
        "ENGRAM_MODEL_BASE_URL": model_url or f"http://127.0.0.1:{_free_port()}/v1",
        "ENGRAM_MODEL_MAX_RETRIES": "0",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        **(more or {}),
    }
    log = open(data_dir / "serve.log", "wb")  # noqa: SIM115  (closed with the process)
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"engram serve exited; see {data_dir / 'serve.log'}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return process, url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit("engram serve did not start in 120 s")
    except BaseException:  # Ctrl-C too: a service stopped while it starts stops its server
        process.terminate()
        process.wait(timeout=60)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=12_000)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--url", help="a running service (default: start engram serve)")
    p.add_argument("--admin-token", help="the running service's admin token")
    p.add_argument("--data-dir", type=Path, help="where the started service keeps its data")
    p.add_argument("--errors", type=int, default=0, help="print the N commonest error messages")
    p.add_argument(
        "--no-model",
        action="store_true",
        help="no scripted model: every turn fails cleanly (its model cannot be reached)",
    )
    args = p.parse_args(argv)

    process = None
    model = None
    if args.url:
        url, admin_token = args.url, args.admin_token
    else:
        data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="engram-fuzz-"))
        data_dir.mkdir(parents=True, exist_ok=True)
        if args.data_dir is None:  # the scratch server's, however the run ends
            atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
        admin_token = "fuzz-admin-" + uuid.uuid4().hex
        model = None if args.no_model else Model(args.seed)
        process, url = serve(data_dir, admin_token, model.url if model else None)
    try:
        started = time.monotonic()
        world = set_up(url, admin_token)
        if model is not None:
            model.world = world
        report = fuzz(url, world, args.examples, args.seed)
        elapsed = time.monotonic() - started
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=60)
        if model is not None:
            model.close()
    print(f"fuzz_graphql: {args.examples} examples, seed {args.seed}, {elapsed:.0f} s")
    for line in report.lines():
        print(line)
    for sample in report.samples[:20]:
        print("  " + sample)
    for message, count in report.messages.most_common(args.errors):
        print(f"  {count:>5}  {message}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
