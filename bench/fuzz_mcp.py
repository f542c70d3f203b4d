"""MCP fuzzing over real HTTP: generated JSON-RPC to `/mcp/<actionId>`, as two hostile tenants.

Starts `engram serve` on loopback (its own embedded PostgreSQL in a temporary directory, and a
scripted model on loopback for `remember_conversation`'s review) unless --url names a running
service, sets up two tenants, each with its own client and token, agents (every memory tool,
pins and history; agent scope only; memory off), records written over GraphQL and over MCP,
a turn's history and listing cursors; each tenant's text carries its own marker. Then
it generates requests (from a Random of the seed and the request's number, so that a run
repeats but for the IDs the service makes), each sent as tenant A or B with its own token:

- `tools/call` of every tool (`search_memory`, `add_memory`, `read_memory`, `delete_memory`,
  `search_history`, `remember_conversation`) and of unknown or hostile names, with arguments
  drawn from valid values, the other tenant's record, event and execution IDs and cursors,
  malformed and global IDs, wrong JSON types, missing and extra arguments, huge strings and
  lists, NUL, lone surrogates (sent as `\\ud800` escapes), control and bidi characters;
- other methods (`initialize` at every protocol version and some that are none, `tools/list`
  with cursors, `ping`, methods the server does not offer, unknown ones), notifications,
  responses, batches (empty, mixed, long);
- raw bodies: not JSON, not UTF-8, a BOM, truncated, nested thousands deep, numbers past int64,
  `NaN`, `Infinity` and `1e400` as JSON text in arguments, IDs and params, duplicate keys;
- headers and URLs: no or another tenant's or a bad token, another tenant's agent, a malformed
  path, hostile `?session=` and `?preview=`, `Mcp-Session-Id`, `MCP-Protocol-Version` (the
  2025 ones, the modern 2026-07-28 with and without its `_meta` envelope, unknown ones),
  `Mcp-Method` / `Mcp-Name` that disagree with the body, duplicate routing headers, missing or
  wrong Accept and Content-Type, a User-Agent of 60,000 bytes or past ASCII (it is recorded
  with each call), GET, DELETE, PUT; and clients that leave before the answer.

Two requests in five are hostile throughout; the others are well-meant but for their IDs (the
other tenant's at times). The IDs, events and cursors each tenant's answers give it join its
pools, for its later requests and for the check of the other tenant's answers.

It counts, and prints with the command that reproduces the run, the figures that must be 0:
HTTP 5xx answers, internal errors (JSON-RPC -32603, or any code that is no refusal's, or an
answer saying "internal error"), tracebacks and ERROR lines in the service's log, requests
unanswered within --timeout (hangs), and cross-tenant reads (an answer to one tenant holding
the other's marker, or one of the other's IDs that the request did not itself carry, in any
spelling, bare or in a global ID). It exits non-zero when any is not 0. --concurrency sends
that many at once (each on its own connection; a log line is then put down to one of them,
and the scripted model's answers no longer repeat from run to run).

    python bench/fuzz_mcp.py                         # 4,000 operations, seed 11
    python bench/fuzz_mcp.py --operations 6000 --seed 3
    python bench/fuzz_mcp.py --url http://127.0.0.1:8000 --admin-token ... --log serve.log
"""

import argparse
import atexit
import base64
import contextlib
import json
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ChatServer, Log, faults  # noqa: E402
from bench.fuzz_graphql import EVERYTHING, HOSTILE_TEXT, Api, node_id, serve  # noqa: E402

MARKERS = {"a": "ZQXMARKERA", "b": "ZQXMARKERB"}  # each tenant's text only; never sent by the other
HARNESS = {
    "memory": {
        "enabled": True,
        "kinds": ["fact", "preference"],
        "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        "labels": {"topic": {"number": 5, "description": "The topic."}},
        "tools": ["add_memory", "read_memory", "delete_memory"],
        "pinned": {"max_tokens": 200},
        "extraction": {"every": "turn"},
    },
    "history": {"index": "messages_and_tools"},
}
AGENT_ONLY = {  # no session: `?session=` is optional, search_history is not offered
    "memory": {
        "enabled": True,
        "scope": {"read": ["agent"], "write": ["agent"]},
        "tools": ["add_memory", "read_memory", "delete_memory"],
    }
}
TOOLS = (
    "search_memory",
    "add_memory",
    "read_memory",
    "delete_memory",
    "search_history",
    "remember_conversation",
)
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
# The JSON-RPC and MCP error codes of a refusal. Any other (-32603; or 0, the SDK's answer to a
# handler's exception on the 2025 protocol versions, in the exception's own words) counts as
# an internal error.
REFUSALS = {-32700, -32600, -32601, -32602, -32000, -32001, -32020, -32021, -32022, -32042}


@dataclass
class Tenant:
    name: str
    token: str
    account_id: str
    marker: str
    action_ids: list[str] = field(default_factory=list)  # full, agent-only, memory off
    memory_ids: list[str] = field(default_factory=list)
    execution_ids: list[str] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)
    cursors: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)

    def owned(self) -> set[str]:
        """What only this tenant wrote or owns: none may reach the other tenant's answers."""
        return {
            self.account_id,
            *self.action_ids,
            *self.memory_ids,
            *self.execution_ids,
            *self.event_ids,
        }


@dataclass
class World:
    a: Tenant
    b: Tenant

    def other(self, tenant: Tenant) -> Tenant:
        return self.b if tenant is self.a else self.a


@dataclass
class Report:
    sent: int = 0
    kinds: Counter[str] = field(default_factory=Counter)  # what was sent
    statuses: Counter[int] = field(default_factory=Counter)
    rpc_codes: Counter[int] = field(default_factory=Counter)
    tool_calls: Counter[str] = field(default_factory=Counter)  # tools/call answered with a result
    tool_errors: Counter[str] = field(default_factory=Counter)  # of them isError
    server_errors: int = 0
    internal: int = 0
    tracebacks: int = 0
    errors_logged: int = 0  # ERROR lines of the service's log, tracebacks' or not
    hangs: int = 0
    cross_tenant: int = 0
    samples: list[str] = field(default_factory=list)
    messages: Counter[str] = field(default_factory=Counter)  # refusals' words, for --errors

    @property
    def failures(self) -> int:
        return self.server_errors + self.internal + self.tracebacks + self.hangs + self.cross_tenant

    def lines(self) -> list[str]:
        def joined(counter: Counter[Any]) -> str:
            return ", ".join(f"{k} {n}" for k, n in sorted(counter.items(), key=str))

        calls = [
            f"  {name:<26} {count:>6} ({self.tool_errors[name]} isError)"
            for name, count in sorted(self.tool_calls.items())
        ]
        return [
            "tool calls answered with a result:",
            *calls,
            f"requests sent:          {self.sent}",
            f"  by kind:              {joined(self.kinds)}",
            f"HTTP statuses:          {joined(self.statuses)}",
            f"JSON-RPC error codes:   {joined(self.rpc_codes)}",
            f"HTTP 5xx:               {self.server_errors}",
            f"internal errors:        {self.internal}",
            f"tracebacks logged:      {self.tracebacks}",
            f"ERROR lines logged:     {self.errors_logged}",
            f"hangs:                  {self.hangs}",
            f"cross-tenant reads:     {self.cross_tenant}",
        ]


# Set-up


def _rpc(id_: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        message["params"] = params
    return message


HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _mcp_call(
    client: httpx.Client, tenant: Tenant, action: str, session: str | None, tool: str, **args: Any
) -> dict[str, Any]:
    """A tool call that must succeed during the set-up; its output."""
    url = f"/mcp/{action}" + (f"?session={session}" if session else "")
    response = client.post(
        url,
        json=_rpc(1, "tools/call", {"name": tool, "arguments": args}),
        headers={**HEADERS, "authorization": f"Bearer {tenant.token}"},
    )
    result = response.json().get("result")
    if response.status_code != 200 or result is None or result.get("isError"):
        raise RuntimeError(f"set-up call {tool} failed: {response.status_code} {response.text}")
    return json.loads(result["content"][0]["text"])


def _tenant(client: httpx.Client, admin: Api, name: str) -> Tenant:
    marker = MARKERS[name]
    text = f"tenant {name.upper()} {marker}"
    account_id = admin(
        "mutation($i: AccountInput!) { createAccount(input: $i) { accountId } }",
        i={"name": f"{text} account"},
    )["createAccount"]["accountId"]
    admin(
        "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
        i={
            "accountId": account_id,
            "principal": f"mcp-fuzz-{name}",
            "name": f"{text} client",
            "policies": EVERYTHING,
        },
    )
    token = admin(
        "mutation($p: String!, $a: UUID) { createClientToken(principal: $p, accountId: $a)"
        " { token } }",
        p=f"mcp-fuzz-{name}",
        a=account_id,
    )["createClientToken"]["token"]
    tenant = Tenant(name, token, account_id, marker)
    api = Api(client, token)
    for harness in (HARNESS, AGENT_ONLY, None):
        action = api(
            "mutation($i: ActionInput!) { createAction(input: $i) { actionId id } }",
            i={"name": f"{text} agent", "instructions": f"{text} instructions", "harness": harness},
        )["createAction"]
        tenant.action_ids.append(action["actionId"])
        tenant.node_ids.append(action["id"])
    full, agent_only, _ = tenant.action_ids
    for j in range(3):
        session = f"{text} session {j}".replace(" ", "-")
        tenant.sessions.append(session)
        added = api(
            """mutation($a: UUID!, $i: AgentMemoryInput!) {
              addAgentMemory(actionId: $a, input: $i) { id memoryId executionId }
            }""",
            a=full,
            i={
                "summary": f"{text} memory {j}",
                "content": f"{text} content {j}",
                "kind": "fact",
                "sessionId": session,
                "labels": [{"name": "topic", "value": f"{text} topic"}],
            },
        )["addAgentMemory"]
        tenant.memory_ids.append(added["memoryId"])
        tenant.node_ids.append(added["id"])
        tenant.execution_ids.append(added["executionId"])
    session = tenant.sessions[0]
    # Over MCP too: records of source MCP, a pinned one, one of agent scope, one replaced.
    for args in (
        {"summary": f"{text} mcp fact", "kind": "fact", "labels": {"topic": text}},
        {"summary": f"{text} pinned", "kind": "preference", "pinned": True},
        {"summary": f"{text} agent-wide", "kind": "fact", "scope": "AGENT"},
        {"summary": f"{text} corrected", "kind": "fact", "replaces": tenant.memory_ids[0]},
    ):
        out = _mcp_call(client, tenant, full, session, "add_memory", **args)
        tenant.memory_ids += [m["id"] for m in out.get("memories", [])]
    out = _mcp_call(client, tenant, agent_only, None, "add_memory", summary=text, kind="fact")
    tenant.memory_ids += [m["id"] for m in out.get("memories", [])]
    # A turn (history for search_history) and a conversation handed in over MCP.
    turn = api(
        """mutation($i: ExecuteActionInput!) {
          executeAction(input: $i) { executionId id } }""",
        i={"actionId": full, "sessionId": session, "input": f"{text} remember my parcel"},
    )["executeAction"]
    tenant.execution_ids.append(turn["executionId"])
    tenant.node_ids.append(turn["id"])
    ingest = _mcp_call(
        client,
        tenant,
        full,
        session,
        "remember_conversation",
        messages=[
            {"role": "user", "content": f"{text} I moved to Berlin"},
            {"role": "assistant", "content": f"{text} noted"},
        ],
        idempotencyKey=f"{name}-setup",
    )
    tenant.execution_ids.append(ingest["executionId"])
    tenant.memory_ids += [m["id"] for m in ingest.get("memories", [])]
    found = _mcp_call(client, tenant, full, session, "search_history", query=text, limit=50)
    tenant.event_ids += [r["id"] for r in found.get("results", []) if isinstance(r, dict)]
    # Listing cursors (a search without a query), of both agents with memory.
    for action, place in ((full, session), (agent_only, None)):
        page = _mcp_call(client, tenant, action, place, "search_memory", limit=1)
        while page.get("nextCursor") and len(tenant.cursors) < 12:
            tenant.cursors.append(page["nextCursor"])
            page = _mcp_call(
                client, tenant, action, place, "search_memory", limit=1, after=page["nextCursor"]
            )
    listed = api(
        "query($a: UUID!) { action(actionId: $a) { memories(first: 50) { nodes { id memoryId"
        " executionId } } executions(first: 50) { nodes { executionId } } } }",
        a=full,
    )["action"]
    for record in listed["memories"]["nodes"]:
        tenant.node_ids.append(record["id"])
        tenant.memory_ids.append(record["memoryId"])
    tenant.execution_ids += [e["executionId"] for e in listed["executions"]["nodes"]]
    tenant.memory_ids = sorted(set(tenant.memory_ids))
    tenant.execution_ids = sorted(set(tenant.execution_ids))
    return tenant


def set_up(base_url: str, admin_token: str) -> World:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        admin = Api(client, admin_token)
        return World(a=_tenant(client, admin, "a"), b=_tenant(client, admin, "b"))


# Values


# Raw JSON text that Python's json module writes otherwise or not at all: sent as it is.
class Raw(str):
    """JSON text to splice in as it is (a number past int64, NaN, 1e400, an escape)."""


RAW_NUMBERS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1" + "0" * 400,
    "1.5",
    "-0",
    "0.0000000000000000000000001",
    "1E2",
]
# Strings as JSON text: lone surrogates and pairs in the wrong order as escapes.
RAW_STRINGS = [
    '"\\ud800"',
    '"x\\udfff"',
    '"\\udc00\\ud800"',
    '"\\ud83d\\ude00"',
    '"a\\u0000b"',
    '"\\u0000"',
    '"\\u202egnp.exe\\u202c"',
    '"\\u2066x\\u2069"',
    '"\\u0007\\u001b[31m\\u007f"',
    '"\\ufeff"',
    '"\\uffff\\ufffe"',
]
# Characters of every plane and kind: ASCII, Latin-1, combining marks, RTL scripts, CJK, private
# use, noncharacters, emoji, tags, and the planes' last code points.
CODE_POINTS = [
    *range(0x20, 0x7F),
    *range(0xA0, 0x180),
    *range(0x300, 0x370),
    *range(0x590, 0x700),
    *range(0x4E00, 0x4E40),
    0xE000,
    0xF8FF,
    0xFDD0,
    0xFFFE,
    0xFFFF,
    *range(0x1F600, 0x1F650),
    *range(0xE0000, 0xE0080),
    0x10FFFF,
]
CONTROL = "".join(chr(c) for c in range(0, 32)) + "\x7f\x85\u2028\u2029"


def dumps(value: Any) -> str:
    """JSON text of a value in which a Raw is spliced in as it is (a key stays quoted)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


class Draw:
    """Values for one request, from a hypothesis-seeded Random."""

    def __init__(self, world: World, tenant: Tenant, rnd: random.Random) -> None:
        self.rnd = rnd  # seeded by the run's seed and the request's number: a run repeats
        self.world = world
        self.me = tenant
        self.them = world.other(tenant)
        # Two requests in five hostile throughout; the others well-meant but for their IDs
        # (the other tenant's at times) and whatever their kind of request is.
        self.hostile = self.chance(0.4)

    def chance(self, p: float) -> bool:
        return self.rnd.random() < p

    def bad(self, p: float) -> bool:
        """A hostile request's chance: never in a well-meant one."""
        return self.hostile and self.rnd.random() < p

    def pick(self, options: list[Any]) -> Any:
        return self.rnd.choice(options)

    def fresh(self) -> str:
        return str(uuid.UUID(int=self.rnd.getrandbits(128)))

    def hostile_text(self) -> Any:
        roll = self.rnd.random()
        if roll < 0.35:
            return self.pick(HOSTILE_TEXT)
        if roll < 0.55:
            return Raw(self.pick(RAW_STRINGS))
        if roll < 0.7:
            return "".join(self.pick(CONTROL) for _ in range(self.rnd.randint(1, 40)))
        if roll < 0.8:
            return self.pick(["x" * 70_000, "word " * 30_000, "é" * 300_000, "\U0001f600" * 20_000])
        return "".join(chr(self.pick(CODE_POINTS)) for _ in range(self.rnd.randint(0, 40)))

    def text(self, what: str) -> Any:
        if self.bad(0.3):
            return self.hostile_text()
        own = f"tenant {self.me.name.upper()}"
        blank = ["", " "] if self.hostile else []  # refused where text is required
        return self.pick([f"{own} {what}", f"{own} parcel", "Berlin", "topic", *blank])

    def record_id(self) -> Any:
        # A well-meant request names its own records three times in four, the other's else.
        roll = self.rnd.random() * (1 if self.hostile else 0.55)
        if roll < 0.4:
            return self.pick(self.me.memory_ids)
        if roll < 0.65:
            return self.pick(self.them.memory_ids)
        if roll < 0.75:
            return self.pick(self.me.execution_ids + self.them.execution_ids + self.me.action_ids)
        if roll < 0.85:
            return self.pick(self.me.node_ids + self.them.node_ids)
        return self.malformed_id()

    def event_id(self) -> Any:
        roll = self.rnd.random()
        if roll < 0.45 and self.me.event_ids:
            return self.pick(self.me.event_ids)
        if roll < 0.75 and self.them.event_ids:
            return self.pick(self.them.event_ids)
        if roll < 0.85:
            return self.pick(self.me.memory_ids + self.them.memory_ids)
        return self.malformed_id()

    def malformed_id(self) -> Any:
        base = self.pick(self.me.memory_ids + self.them.memory_ids)
        return self.pick(
            [
                "",
                "not-a-uuid",
                base.upper(),
                base.replace("-", ""),
                "{" + base + "}",
                "urn:uuid:" + base,
                base + "\x00",
                " " + base,
                base[:-1],
                base[:-1] + "g",
                "0" * 32,
                "00000000-0000-0000-0000-000000000000",
                "\uff10" * 32,
                node_id(
                    "ActionAgentMemory",
                    self.pick(self.me.action_ids),
                    self.pick(self.them.memory_ids),
                ),
                node_id("Nope", base),
                Raw('"\\ud800' + base[1:] + '"'),
                Raw("1e400"),
                Raw("NaN"),
                12345,
                None,
                [base],
                {"id": base},
                True,
            ]
        )

    def cursor(self) -> Any:
        pool = self.me.cursors + self.them.cursors
        if not pool or self.bad(0.25):
            return self.pick(
                ["", "zz", "bm90IGEgY3Vyc29y", "W10", "WyJ4Il0", Raw('"\\ud800"'), 1, None]
            )
        cursor = self.pick(pool)
        roll = self.rnd.random()
        if roll < 0.6:
            return cursor
        try:
            values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        except ValueError:
            return cursor + "!"
        if not isinstance(values, list) or not values:
            return cursor[:-2]
        place = self.pick(
            [2**63, -1, 1e308, "x", None, True, [[[]]], "\x00", "\ud800", {"t": "0001-01-01"}]
        )
        i = self.rnd.randrange(len(values))
        edited = [*values[:i], place, *values[i + 1 :]]
        if self.chance(0.3):  # the other tenant's places under this tenant's digest
            mine = self.me.cursors or [cursor]
            try:
                own = json.loads(base64.urlsafe_b64decode(self.pick(mine) + "=="))
                edited = [own[0], *values[1:]]
            except (ValueError, IndexError, TypeError, KeyError):
                pass
        raw = json.dumps(edited, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def wrong(self) -> Any:
        """A value of any JSON type, mostly not the one wanted."""
        return self.pick(
            [
                None,
                True,
                0,
                -1,
                2**31,
                1.5,
                Raw(self.pick(RAW_NUMBERS)),
                "",
                "x",
                [],
                ["x"] * self.pick([1, 101, 5000]),
                {},
                {"a": {"b": [1]}},
                self.deep(),
                self.deep(),
            ]
        )

    def deep(self) -> Raw:
        """Arrays or objects nested 10 to 900 deep, as JSON text (Python's parser takes them)."""
        n = self.pick([10, 100, 300, 900])
        if self.chance(0.5):
            return Raw("[" * n + '"x"' + "]" * n)
        return Raw('{"a":' * n + '"x"' + "}" * n)

    def labels(self) -> Any:
        roll = self.rnd.random()
        if roll < 0.5:
            return {"topic": self.text("topic")}
        if roll < 0.7:
            return {"nope": "x"}
        if roll < 0.8:
            return {f"k{i}": "v" for i in range(self.pick([10, 2000]))}
        return self.wrong()

    def messages(self) -> Any:
        if self.bad(0.15):
            return self.wrong()
        count = self.pick([0, 1, 2, 3, 5, 501]) if self.bad(0.3) else self.rnd.randint(1, 3)
        out = []
        for _ in range(count):
            message: dict[str, Any] = {
                "role": self.pick(["user", "assistant", "tool"])
                if not self.bad(0.15)
                else self.pick(["system", "", None, 1, "USER", Raw('"\\ud800"')]),
                "content": self.text("I moved to Berlin last week")
                if not self.bad(0.1)
                else self.wrong(),
            }
            if self.chance(0.2):
                message["time"] = self.pick(
                    [
                        "2026-11-24T09:30:00+01:00",
                        "2026-11-24T09:30:00",
                        "0001-01-01T00:00:00+14:00",
                        "9999-12-31T23:59:59-14:00",
                        "yesterday",
                        Raw("1e400"),
                        12,
                        None,
                    ]
                )
            if self.bad(0.05):
                message["extra"] = 1
            if self.bad(0.05):
                del message["content"]
            out.append(message if not self.bad(0.05) else self.wrong())
        return out

    def arguments(self, tool: str) -> Any:
        """A tool's arguments: mostly of the right shape, each value at times wrong."""
        if self.bad(0.05):
            return self.pick([None, [], "x", 1, Raw("NaN"), self.deep(), {}])
        args: dict[str, Any] = {}
        if tool == "search_memory":
            if self.chance(0.6):
                args["query"] = self.text("memory")
            if self.chance(0.25):
                args["ids"] = [self.record_id() for _ in range(self.pick([1, 2, 5, 100, 101]))]
            if self.chance(0.3):
                args["limit"] = self.pick([1, 5, 100, 0, 101, -1, 2**63, Raw("1e400"), "5"])
            if self.chance(0.3):
                args["after"] = self.cursor()
            if self.chance(0.2):
                args["kind"] = self.pick(
                    ["fact", "preference", "nope", ""][: 4 if self.hostile else 2]
                )
            if self.chance(0.2):
                args["labels"] = self.labels()
        elif tool == "add_memory":
            if not self.bad(0.2):
                args["summary"] = self.text("fuzz fact")
            if not self.bad(0.2):
                args["kind"] = self.pick(
                    ["fact", "preference", "nope", "", None][: 5 if self.hostile else 2]
                )
            if self.chance(0.3):
                args["content"] = self.text("fuzz content")
            if self.chance(0.2):
                args["labels"] = self.labels()
            if self.chance(0.2):
                args["scope"] = self.pick(["SESSION", "AGENT", "session", "ACCOUNT", None])
            if self.chance(0.2):
                args["replaces"] = self.record_id()
            if self.chance(0.15):
                args["pinned"] = self.pick([True, False, "true", 1, None])
        elif tool in ("read_memory", "delete_memory"):
            if not self.bad(0.2):
                args["id"] = self.record_id()
        elif tool == "search_history":
            if self.chance(0.7):
                args["query"] = self.text("parcel")
            if self.chance(0.3):
                args["ids"] = [self.event_id() for _ in range(self.pick([1, 2, 50, 51]))]
            if self.chance(0.3):
                args["limit"] = self.pick([1, 5, 50, 0, 51, Raw("-Infinity"), "5"])
        elif tool == "remember_conversation":
            if not self.bad(0.1):
                args["messages"] = self.messages()
            if self.chance(0.4):
                args["idempotencyKey"] = self.pick(
                    ["k1", "k2", f"{self.them.name}-setup", "", self.hostile_text(), 7]
                )
        # Each value replaced by a wrong one at times, and arguments no tool takes.
        for key in list(args):
            if self.bad(0.08):
                args[key] = self.wrong()
        if self.bad(0.1):
            args[self.pick(["extra", "", "\x00", "__proto__", "summary\ud800"])] = self.wrong()
        return args

    def tool_name(self) -> Any:
        if not self.bad(0.25):
            return self.pick(list(TOOLS))
        return self.pick(
            [
                "no_such_tool",
                "",
                "Search_Memory",
                "search_memory\x00",
                "search_memory ",
                Raw('"\\ud800"'),
                "x" * 100_000,
                "\u202esearch_memory",
                "remember",
                "decide",
                None,
                1,
                ["search_memory"],
            ]
        )

    def meta(self, version: str | None = None) -> dict[str, Any]:
        """The modern protocol's per-request envelope, at times wrong."""
        meta: dict[str, Any] = {
            META_VERSION: version or MODERN,
            META_CAPABILITIES: {},
        }
        if self.chance(0.3):
            meta[META_CLIENT] = {"name": self.text("client"), "version": "1"}
        if self.chance(0.2):
            del meta[self.pick([META_VERSION, META_CAPABILITIES])]
        if self.chance(0.1):
            meta[META_VERSION] = self.wrong()
        if self.bad(0.05):
            meta[self.pick([META_CAPABILITIES, META_CLIENT, "progressToken", "x"])] = self.deep()
        return meta


# Requests


@dataclass
class Request:
    kind: str
    method: str
    path: str
    headers: list[tuple[str, str | bytes]]
    body: bytes
    tenant: Tenant
    leave: float | None = None  # the client leaves after this many seconds, answered or not


def message(draw: Draw, notification: bool = False) -> tuple[str, Any]:
    """(kind, one JSON-RPC message as a value for `dumps`)."""
    id_: Any = draw.pick(
        [1, 2, "a", "call-\x00", 2**53, 0, -1]
        if not draw.bad(0.1)
        else [Raw("1e400"), Raw("NaN"), Raw("9223372036854775808"), "\ud800", "x" * 5000]
    )
    roll = draw.rnd.random()
    if roll < 0.72:
        tool = draw.tool_name()
        params: Any = {"name": tool, "arguments": draw.arguments(str(tool))}
        if draw.chance(0.05):
            del params["arguments"]
        if draw.chance(0.05):
            params = draw.wrong()
        kind = "tools/call"
        method: Any = "tools/call"
    elif roll < 0.78:
        kind = method = "tools/list"
        params = draw.pick([None, {}, {"cursor": draw.pick(["", "x", "\x00", 1])}])
    elif roll < 0.84:
        kind = method = "initialize"
        params = {
            "protocolVersion": draw.pick([*VERSIONS, MODERN, "1999-01-01", "", "latest", 1]),
            "capabilities": draw.pick([{}, {"roots": {"listChanged": True}}, None, "x"]),
            "clientInfo": draw.pick(
                [
                    {"name": "fuzz", "version": "1"},
                    {"name": draw.hostile_text(), "version": draw.hostile_text()},
                    {},
                    None,
                ]
            ),
        }
        if draw.chance(0.2):
            del params[draw.pick(list(params))]
    else:
        kind = "other method"
        method = draw.pick(
            [
                "ping",
                "resources/list",
                "resources/read",
                "resources/templates/list",
                "prompts/list",
                "prompts/get",
                "completion/complete",
                "logging/setLevel",
                "sampling/createMessage",
                "roots/list",
                "tasks/get",
                "server/discover",
                "subscriptions/listen",
                "nope",
                "",
                "tools/call/",
                "rpc.discover",
                "x" * 10_000,
                "notifications/initialized",
                "notifications/cancelled",
                "notifications/progress",
                "notifications/roots/list_changed",
                None,
                7,
            ]
        )
        params = draw.pick(
            [
                None,
                {},
                {"uri": "file:///etc/passwd"},
                {"name": "x", "arguments": {}},
                {"level": draw.pick(["debug", "nope"])},
                {"requestId": 1, "reason": "x"},
                {"progressToken": 1, "progress": Raw("NaN")},
                draw.wrong(),
            ]
        )
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    if draw.bad(0.15) and isinstance(params, dict):
        params["_meta"] = draw.meta()
    if draw.bad(0.05) and isinstance(params, dict):  # deep JSON beside the arguments
        params[draw.pick(["_meta", "extra", "cursor", "clientInfo", "capabilities"])] = draw.deep()
    if notification or draw.chance(0.05):
        del msg["id"]
        kind = "notification"
    if draw.bad(0.03):
        msg["jsonrpc"] = draw.pick(["1.0", 2, None, ""])
    if draw.bad(0.03):  # a response, as a client answers a server's request
        msg = draw.pick(
            [
                {"jsonrpc": "2.0", "id": 1, "result": {}},
                {"jsonrpc": "2.0", "id": "x", "error": {"code": -1, "message": "no"}},
                {"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}},
            ]
        )
        kind = "response"
    return kind, msg


def raw_body(draw: Draw) -> tuple[str, bytes]:
    """A body that is not a well-formed JSON-RPC message."""
    _, msg = message(draw)
    text = dumps(msg)
    return draw.pick(
        [
            ("not JSON", b"{not json"),
            ("not JSON", b""),
            ("not JSON", b"null"),
            ("not JSON", b"[]"),
            ("not JSON", b'"tools/call"'),
            ("not JSON", b"42"),
            ("not JSON", text[: len(text) // 2].encode()),
            ("not JSON", text.encode() + b"garbage"),
            ("not JSON", text.replace('"', "'").encode()),
            ("not UTF-8", text.encode().replace(b'"2.0"', b'"2.0\xff"')),
            ("not UTF-8", b'{"jsonrpc": "2.0", "id": 1, "method": "\xc3\x28"}'),
            ("not UTF-8", text.encode("utf-16")),
            ("BOM", b"\xef\xbb\xbf" + text.encode()),
            ("deep", ("[" * 100_000 + "]" * 100_000).encode()),
            ("deep", ('{"a":' * 50_000 + "1" + "}" * 50_000).encode()),
            (
                "deep",
                (
                    '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
                    '"search_memory","arguments":{"query":'
                    + "[" * 5000
                    + '"x"'
                    + "]" * 5000
                    + "}}}"
                ).encode(),
            ),
            ("duplicate keys", text.replace('"jsonrpc"', '"id":{"a":1},"jsonrpc"', 1).encode()),
            (
                "duplicate keys",
                b'{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":'
                b'{"name":"read_memory","arguments":{"id":"x"}}}',
            ),
            (
                "huge",
                b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"'
                + b"y" * 2_000_000
                + b'"}}',
            ),
            ("NUL", text.encode() + b"\x00"),
            ("control", b"\x00\x01" + text.encode()),
        ]
    )


def batch(draw: Draw) -> bytes:
    count = draw.pick([0, 1, 2, 3, 5, 50, 200])
    items = []
    for _ in range(count):
        if draw.chance(0.1):
            items.append(draw.pick([1, "x", None, [], {}]))
        else:
            items.append(message(draw, notification=draw.chance(0.2))[1])
    return dumps(items).encode()


def request(draw: Draw) -> Request:
    me = draw.me
    action = draw.pick(me.action_ids[:2]) if draw.chance(0.9) else me.action_ids[2]
    # The first agent needs a session, the second takes none; either is sent otherwise at times.
    needs = action == me.action_ids[0]
    session: str | None = draw.pick(me.sessions) if needs != draw.chance(0.1) else None
    preview: str | None = "true" if draw.chance(0.1) else None
    headers: list[tuple[str, str | bytes]] = [
        ("authorization", f"Bearer {me.token}"),
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ]
    if draw.chance(0.3):
        headers.append(("mcp-protocol-version", draw.pick(list(VERSIONS))))
    roll = draw.rnd.random()
    if roll < 0.58:
        kind, msg = message(draw)
        body = dumps(msg).encode()
    elif roll < 0.67:
        kind, body = "batch", batch(draw)
    elif roll < 0.75:
        kind, body = raw_body(draw)
    elif roll < 0.87:  # the modern protocol: its header, its envelope, its routing headers
        kind, msg = message(draw)
        kind = "modern " + kind
        params = msg.get("params")
        if isinstance(params, dict):
            params["_meta"] = draw.meta()
        headers = [h for h in headers if h[0] != "mcp-protocol-version"]
        headers.append(("mcp-protocol-version", draw.pick([MODERN, MODERN, "2099-01-01", ""])))
        if draw.chance(0.7):
            headers.append(("mcp-method", str(msg.get("method")) if draw.chance(0.8) else "ping"))
        if draw.chance(0.5) and isinstance(params, dict):
            name = params.get("name") if draw.chance(0.8) else "other"
            headers.append(("mcp-name", str(name)[:200].encode("ascii", "replace").decode()))
        if draw.chance(0.15):
            headers.append(("mcp-method", "tools/list"))  # a routing header twice
        if draw.chance(0.15):
            headers.append(("mcp-param-query", draw.pick(["x", "=?utf-8?b?eA==?=", "\t"])))
        body = dumps(msg).encode()
    else:  # headers and URL
        kind, msg = message(draw)
        body = dumps(msg).encode()
        change = draw.pick(
            [
                "no token",
                "bad token",
                "other token",
                "other agent",
                "bad path",
                "session query",
                "preview",
                "session header",
                "protocol header",
                "accept",
                "content-type",
                "http method",
                "user agent",
            ]
        )
        kind = change
        if change == "no token":
            headers = headers[1:]
        elif change == "bad token":
            headers[0] = (
                "authorization",
                draw.pick(["Bearer x", "Basic eA==", "Bearer ", "bearer"]),
            )
        elif change == "other token":
            headers[0] = ("authorization", f"Bearer {draw.them.token}")
        elif change == "other agent":
            action = draw.pick(draw.them.action_ids)
        elif change == "bad path":
            action = draw.pick(
                [
                    "",
                    "x",
                    "%00",
                    "%FF",
                    "..%2F..%2Fgraphql",
                    action.upper(),
                    action + "%20",
                    node_id("Action", action, 1),
                    "0" * 32,
                ]
            )
        elif change == "session query":
            session = draw.pick(
                ["%FF", "%00", "%ED%A0%80", "a%0Ab", "%E2%80%AE", "x" * 5000, "", "%20"]
            )
        elif change == "preview":
            preview = draw.pick(["false", "1", "TRUE", "%00", "", "true&preview=false"])
        elif change == "session header":
            headers.append(("mcp-session-id", draw.pick(["x", "", "\t", "a" * 5000, draw.fresh()])))
        elif change == "protocol header":
            headers.append(
                (
                    "mcp-protocol-version",
                    draw.pick(["1999-01-01", "", "x" * 500, "2025-06-18, 2025-03-26"]),
                )
            )
        elif change == "accept":
            headers[1] = (
                "accept",
                draw.pick(["text/html", "", "*/*", "application/*", "text/event-stream"]),
            )
        elif change == "content-type":
            headers[2] = (
                "content-type",
                draw.pick(
                    ["text/plain", "", "application/json; charset=latin-1", "multipart/form-data"]
                ),
            )
    if kind == "user agent":  # recorded with each call; bytes past ASCII read as Latin-1
        agent = draw.pick(
            [b"\xff\xfe\x80", "é".encode("latin-1") * 20_000, b"a\x7fb", b"x" * 60_000]
        )
        headers.append(("user-agent", agent))
    method = "POST"
    if kind == "http method":
        method = draw.pick(["GET", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"])
    query = []
    if session is not None:
        query.append(f"session={session}")
    if preview is not None:
        query.append(f"preview={preview}")
    path = f"/mcp/{action}" + ("?" + "&".join(query) if query else "")
    sent = Request(kind, method, path, headers, body, me)
    if draw.chance(0.03):  # a client that leaves mid-request (its tool call may go on)
        sent.leave = draw.pick([0.002, 0.01, 0.03])
    return sent


# Checks


def _foreign(text: str, theirs: set[str], sent: str) -> str | None:
    """One of `theirs` in an answer, bare or in a global ID, that the request did not carry."""
    for value in theirs:
        if value in text and value not in sent:
            return value
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return None
    pending = [body]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += item.values()
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str):
            if item.startswith("{") or item.startswith("["):  # a tool's result is JSON text
                with contextlib.suppress(ValueError, RecursionError):
                    pending.append(json.loads(item))
                continue
            if len(item) < 16 or len(item) > 400 or item in sent:
                continue
            try:
                parts = json.loads(base64.urlsafe_b64decode(item + "=" * (-len(item) % 4)))
            except (ValueError, RecursionError):
                continue
            if isinstance(parts, list) and any(isinstance(p, str) and p in theirs for p in parts):
                return item
    return None


_UUID = re.compile(
    r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.IGNORECASE
)
_BASE64 = re.compile(r"[A-Za-z0-9_+/=-]{16,}")


def _carried(sent: str) -> str:
    """A request's text, with every ID it carries in another spelling (upper case, without
    hyphens, in braces, inside a global ID) also in the canonical one: an answer that names
    what the request named echoes it, and reads nothing."""
    found = [sent]
    for token in _BASE64.findall(sent):
        with contextlib.suppress(ValueError):
            found.append(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    spelled = " ".join(found)
    canonical = [str(uuid.UUID(u)) for u in _UUID.findall(spelled)]
    return " ".join([spelled, *canonical])


def check(report: Report, world: World, sent: Request, response: httpx.Response | None) -> None:
    report.sent += 1
    report.kinds[sent.kind] += 1
    where = f"{sent.kind} as {sent.tenant.name} {sent.method} {sent.path[:80]}"
    body_text = sent.body.decode(errors="replace")
    if response is None:
        report.hangs += 1
        report.samples.append(f"no answer in time: {where}: {body_text[:300]}")
        return
    report.statuses[response.status_code] += 1
    text = response.text
    if response.status_code >= 500:
        report.server_errors += 1
        report.samples.append(
            f"HTTP {response.status_code}: {where}: {body_text[:200]} -> {text[:300]}"
        )
    other = world.other(sent.tenant)
    if other.marker in text:
        report.cross_tenant += 1
        report.samples.append(f"the other tenant's marker: {where}: {text[:300]}")
    elif (found := _foreign(text, other.owned(), _carried(body_text + sent.path))) is not None:
        report.cross_tenant += 1
        report.samples.append(
            f"the other tenant's ID {found}: {where}: {body_text[:300]} -> {text[:300]}"
        )
    if "internal error" in text.lower():
        report.internal += 1
        report.samples.append(f"internal error: {where}: {body_text[:200]} -> {text[:300]}")
    try:
        answer = response.json() if text else None
    except ValueError:
        return
    answers = answer if isinstance(answer, list) else [answer]
    for item in answers:
        if not isinstance(item, dict):
            continue
        error = item.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            report.rpc_codes[code] += 1
            report.messages[f"{code} {str(error.get('message'))[:100]}"] += 1
            if code not in REFUSALS and "internal error" not in text.lower():
                report.internal += 1
                report.samples.append(f"code {code}: {where}: {body_text[:200]} -> {text[:300]}")
        result = item.get("result")
        if isinstance(result, dict) and "content" in result:
            try:
                name = json.dumps(json.loads(sent.body).get("params", {}).get("name"))[:40]
            except (ValueError, AttributeError, RecursionError):
                name = "?"
            report.tool_calls[name] += 1
            report.tool_errors[name] += bool(result.get("isError"))
            if result.get("isError"):
                content = result["content"][0].get("text", "") if result["content"] else ""
                report.messages[f"{name} isError {content[:100]}"] += 1
            elif sent.kind != "other token":  # answered to this tenant: what it may use next
                _learn(sent.tenant, result)


def _learn(tenant: Tenant, result: dict[str, Any]) -> None:
    """The IDs and cursors a tool's answer gave its tenant (records written, found or read,
    history events, executions, a listing's next page): later requests use them, and the other
    tenant's answers must hold none of them."""
    for content in result.get("content") or []:
        try:
            output = json.loads(content.get("text", ""))
        except (ValueError, AttributeError, RecursionError):
            continue
        if not isinstance(output, dict):
            continue
        if isinstance(output.get("nextCursor"), str) and len(tenant.cursors) < 200:
            tenant.cursors.append(output["nextCursor"])
        if isinstance(output.get("executionId"), str):
            tenant.execution_ids.append(output["executionId"])
        for key, pool in (
            ("records", tenant.memory_ids),
            ("memories", tenant.memory_ids),
            ("results", tenant.event_ids),
        ):
            for item in output.get(key) or []:
                known = isinstance(item, dict) and item.get("id") in pool
                if isinstance(item, dict) and isinstance(item.get("id"), str) and not known:
                    pool.append(item["id"])


def fuzz(
    base_url: str,
    world: World,
    operations: int,
    seed_value: int,
    log: Log,
    timeout: float = 30,
    concurrency: int = 1,
) -> Report:
    """Sends the requests numbered 0 to `operations` - 1, `concurrency` at a time (each worker
    every `concurrency`-th one, on its own connection); a traceback logged is put down to the
    request answered just before it was read (with more than one at a time, to one of those in
    flight)."""
    report = Report()
    lock = threading.Lock()

    def one(client: httpx.Client, number: int) -> None:
        tenant = world.a if number % 2 else world.b
        sent = request(Draw(world, tenant, random.Random(f"{seed_value}-{number}")))
        try:
            response: httpx.Response | None = client.request(
                sent.method,
                sent.path,
                headers=sent.headers,
                content=sent.body,
                timeout=sent.leave if sent.leave is not None else timeout,
            )
        except httpx.TimeoutException:
            if sent.leave is not None:  # left on purpose: only the log is looked at
                with lock:
                    report.kinds["client gone"] += 1
                    logged(report, log.new(), f"a client gone during {sent.kind}")
                return
            response = None
        except httpx.LocalProtocolError:  # httpx would not send it: not the service's doing
            with lock:
                report.kinds["not sendable"] += 1
            return
        except httpx.TransportError as e:  # the connection dropped: counted as a 5xx
            with lock:
                report.sent += 1
                report.server_errors += 1
                report.samples.append(f"{type(e).__name__} on {sent.kind}: {sent.body[:200]!r}")
            return
        with lock:
            check(report, world, sent, response)
            logged(report, log.new(), f"{sent.kind} as {sent.tenant.name}: {sent.body[:200]!r}")

    def worker(first: int) -> None:
        with httpx.Client(base_url=base_url, timeout=timeout) as client:
            for number in range(first, operations, concurrency):
                one(client, number)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with lock:
        logged(report, log.new(), "the last requests")  # what they left behind them
    return report


def logged(report: Report, text: str, after: str) -> None:
    """Counts what the service logged (`common.faults`)."""
    tracebacks, errors, sample = faults(text, after)
    report.tracebacks += tracebacks
    report.errors_logged += errors
    if sample is not None:
        report.samples.append(sample)


# A scripted model for the memory review


class Model:
    """An OpenAI-compatible chat endpoint on loopback: a turn is answered with text; the review's
    `remember` with candidates taken from the conversation it was sent (so a tenant's marker
    stays in its own records), at times hostile (NUL, lone surrogates, wrong types, malformed
    arguments); its `decide` with a decision per candidate, at times malformed; now and then
    a 500."""

    def __init__(self, seed_value: int) -> None:
        self.rnd = random.Random(seed_value)
        self.hostile = False  # plain answers during the set-up
        self.chat = ChatServer(self.reply)

    @property
    def url(self) -> str:
        return self.chat.url

    def close(self) -> None:
        self.chat.close()

    def reply(self, asked: dict[str, Any]) -> tuple[int, str]:
        tools = [t.get("function", {}).get("name") for t in asked.get("tools") or []]
        said = " ".join(
            m["content"] for m in asked.get("messages", []) if isinstance(m.get("content"), str)
        )
        hostile = self.hostile and self.rnd.random() < 0.3
        if self.hostile and self.rnd.random() < 0.04:
            return 500, '{"error": {"message": "scripted failure"}}'
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if "remember" in tools:
            marker = next((m for m in MARKERS.values() if m in said), "")
            summary = f"user moved to Berlin {marker}".strip()
            candidates: Any = [{"summary": summary, "kind": "fact", "content": said[-200:]}]
            if hostile:
                candidates = self.rnd.choice(
                    [
                        [{"summary": "a\x00b", "kind": "fact"}],
                        [{"summary": "\ud800", "kind": "fact"}],
                        [{"summary": "x" * 5000, "kind": "nope"}],
                        [{"summary": 7}],
                        "not a list",
                        [{"summary": summary, "kind": "fact", "labels": {"topic": "\ud800"}}],
                    ]
                )
            arguments = json.dumps({"candidates": candidates})
            if hostile and self.rnd.random() < 0.2:
                arguments = "{not json"
            message["tool_calls"] = [self._call("remember", arguments)]
        elif "decide" in tools:
            handles = sorted(set(_handles(said)))
            decisions: Any = [
                {"candidate": h, "action": self.rnd.choice(["add", "skip", "add"])} for h in handles
            ]
            if hostile:
                decisions = self.rnd.choice(
                    [
                        [{"candidate": "c99", "action": "replace", "record": "r99"}],
                        [{"candidate": "c1", "action": "delete", "record": "\x00"}],
                        None,
                        [{"candidate": "c1", "action": "nope"}],
                    ]
                )
            message["tool_calls"] = [self._call("decide", json.dumps({"decisions": decisions}))]
        else:
            message["content"] = "Noted."
        body = json.dumps(
            {
                "id": "fuzz",
                "object": "chat.completion",
                "model": "fuzz",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if message["content"] is None else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )
        return 200, body

    def _call(self, name: str, arguments: str) -> dict[str, Any]:
        return {
            "id": f"call_{self.rnd.getrandbits(32)}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }


def _handles(text: str) -> list[str]:
    return re.findall(r"\bc\d+\b", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--operations", type=int, default=4_000)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--timeout", type=float, default=30, help="seconds a request may take")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--url", help="a running service (default: start engram serve)")
    p.add_argument("--admin-token", help="the running service's admin token")
    p.add_argument("--log", type=Path, help="the running service's log, read for tracebacks")
    p.add_argument("--data-dir", type=Path, help="where the started service keeps its data")
    p.add_argument("--errors", type=int, default=0, help="print the N commonest refusals")
    args = p.parse_args(argv)

    process = None
    model = None
    if args.url:
        url, admin_token, log_path = args.url, args.admin_token, args.log
    else:
        data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="engram-fuzz-mcp-"))
        data_dir.mkdir(parents=True, exist_ok=True)
        if args.data_dir is None:  # the scratch server's, however the run ends
            atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
        admin_token = "fuzz-admin-" + uuid.uuid4().hex
        model = Model(args.seed)
        process, url = serve(data_dir, admin_token, model.url)
        log_path = data_dir / "serve.log"
    try:
        started = time.monotonic()
        world = set_up(url, admin_token)
        if model is not None:
            model.hostile = True
        report = fuzz(
            url, world, args.operations, args.seed, Log(log_path), args.timeout, args.concurrency
        )
        elapsed = time.monotonic() - started
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=60)
        if model is not None:
            model.close()
    command = f"python bench/fuzz_mcp.py --operations {args.operations} --seed {args.seed}"
    if args.concurrency != 1:
        command += f" --concurrency {args.concurrency}"
    print(
        f"fuzz_mcp: {args.operations} operations, seed {args.seed},"
        f" {args.concurrency} at a time, {elapsed:.0f} s"
    )
    print(f"reproduce: {command}")
    for line in report.lines():
        print(line)
    for sample in report.samples[:30]:
        print("  " + sample)
    for message, count in report.messages.most_common(args.errors):
        print(f"  {count:>5}  {message}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
