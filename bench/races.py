"""Concurrency probe: operations on the same objects at once, over real HTTP, many rounds.

Each race runs ENGRAM_RACE_ROUNDS rounds (default 20; seeded by ENGRAM_RACE_SEED, default 1)
of requests sent together (asyncio.gather) to the service on loopback, then checks what was
stored against the truth. Every race fails on an HTTP 500 or an INTERNAL error, and prints
its rounds, the answers by status and code, and the rounds whose check failed (which must be
0):

- pinned_lists: turns (live and preview, pinning, replacing, unpinning, deleting pins, some
  failing after their tool call and retried) and operator pins, unpins and deletions on one
  agent's three sessions: each session's kept lengths (migration 0030) against a recount.
- erase: turns (some failing, retried) in two sessions while eraseSession erases one: every
  execution is erased whole (its history and transcript words gone) or not at all, and the
  other session's never.
- tokens: a client's requests (reads, and keyed writes) while it is deleted or its token
  revoked: none sent after the mutation answered is accepted; a client made again with a
  deleted one's principal finds none of its keys.
- ingest_key: rememberConversation sent several times at once with one idempotency key, the
  review adding a record, or replacing one (both reviews read it): one execution, one answer.
- replaces: addAgentMemories batches at once whose `replaces` overlap (in cycles): each record
  replaced at most once, `replacedBy` and status consistent, a refused batch writes nothing,
  no staged row left, pinned lengths kept.
- review: turns of one agent at once (every turn on three sessions, or `every: {messages: 6}`
  on one), whose memory reviews learn each turn's own fact and its round's fact at agent
  scope; some fail before their review (retried next round), two a round replace one record
  with add_memory so that one rolls back after its review staged: no two live records say the
  same (M12), no record of an attempt that did not commit (M17), and after one more turn a
  session, every reviewed turn's fact kept and fewer than N messages waiting (M14).
- history: turns of one session at once (live and preview, some kept in parts, a third failing
  after their search_history call, retried next round), a replay searching, eraseSession every
  fourth round: kept events only of committed attempts and never twice, turn numbers 1..the
  session's count, parts whole, each search's results from turns before its own (H5, H6, H8,
  H12, H13).
- ingest: rememberConversation beside turns of the same sessions: the review's and history's
  checks.
- import: engram export while turns run, the file imported back into its own account and into
  a new one while turns start on the agent there: whole, or CONFLICT naming a row; turn numbers
  unique; pinned lists as counted.
- gate: the pool's connection gate (app/db/pool.py `Connections`) under many accounts'
  acquires, timeouts and cancellations: nothing held or waiting once all ended.

    PYTHONPATH=.:tests ENGRAM_RACE_ROUNDS=100 pytest bench/races.py -p conftest -q -s \\
        -p no:cacheprovider [-k pinned_lists]
"""

import asyncio
import hashlib
import io
import json
import os
import random
import re
import time
import types
from collections import Counter

import httpx
import pytest
from factories import (
    allow,
    assert_pinned_lists_kept,
    full_memory,
    make_account,
    make_agent,
    remember,
    token_for,
)
from openai_server import CHAT, ChatReply
from runtime_support import candidates, decide

from app.db.pool import Share, create_pool, drawing_on

ROUNDS = int(os.environ.get("ENGRAM_RACE_ROUNDS", "20"))
SEED = int(os.environ.get("ENGRAM_RACE_SEED", "1"))
# The suite's 300 s bound a test (pytest-timeout, pyproject.toml) is for tests: a race runs as
# many rounds as asked, longer as they add up (`import` on 2 cores: 54 s for 10 rounds, 577 s
# for 40, which the bound cut short), so its bound grows with them.
pytestmark = pytest.mark.timeout(300 + 60 * ROUNDS)
EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")

EXECUTE = """mutation($input: ExecuteActionInput!) { executeAction(input: $input) {
    executionId sessionId preview status error } }"""
ADD = """mutation($a: UUID!, $i: AgentMemoryInput!, $k: String) {
    addAgentMemory(actionId: $a, input: $i, idempotencyKey: $k) { memoryId } }"""
ADDS = """mutation($a: UUID!, $i: [AgentMemoryInput!]!) {
    addAgentMemories(actionId: $a, inputs: $i) { memoryIds } }"""
DELETE = """mutation($a: UUID!, $m: UUID!) {
    deleteAgentMemory(actionId: $a, id: $m) { status } }"""
ERASE = """mutation($a: UUID!, $s: String!) {
    eraseSession(actionId: $a, sessionId: $s) { erasedEvents } }"""
VIEWER = "{ viewer { principal } }"
DELETE_CLIENT = "mutation($p: String!) { deleteClient(principal: $p) { principal } }"
CREATE_TOKEN = "mutation($p: String!) { createClientToken(principal: $p) { token tokenId } }"
REVOKE = """mutation($p: String!, $t: UUID!) {
    revokeClientToken(principal: $p, tokenId: $t) { tokenId } }"""
REMEMBER = """mutation($input: RememberConversationInput!) {
    rememberConversation(input: $input) { executionId status error } }"""


class Race:
    """One race's answers and failed checks."""

    def __init__(self, name: str) -> None:
        self.name, self.answers, self.failed = name, Counter(), 0

    async def post(self, http: httpx.AsyncClient, token: str, query: str, **variables) -> dict:
        response = await http.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code < 500, response.text
        body = response.json()
        for error in body.get("errors") or []:
            code = error.get("extensions", {}).get("code")
            assert code not in (None, "INTERNAL"), body
            self.answers[code] += 1
        for value in (body.get("data") or {}).values():
            if isinstance(value, dict) and "status" in value:
                self.answers[value["status"]] += 1
        return body

    def check(self, ok: bool, *about: object) -> None:
        if not ok:
            self.failed += 1
            print(self.name, "CHECK FAILED", *about)

    def report(self) -> None:
        print(f"{self.name}: {ROUNDS} rounds, {self.failed} failed checks, {dict(self.answers)}")
        assert self.failed == 0


def fail_once(server, when: str) -> None:
    """The scripted model answers 500 to the next call of the turn whose input holds `when`."""
    with server._lock:
        server._chat_script.append(ChatReply(status=500, when=when))


@pytest.mark.settings(max_requests_per_account=64)
async def test_pinned_lists(state, admin, base_url, model_server):
    race, rng = Race("pinned_lists"), random.Random(SEED)
    agent = await make_agent(state, admin, harness=full_memory(pinned={"max_tokens": 100_000}))
    token, a = await token_for(state, admin, "probe", EVERYTHING), str(agent.action_id)
    failed: list[dict] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            pins = await state.pool.fetch(
                "SELECT memory_id::text FROM agent_memories WHERE action_id = $1 AND pinned "
                "AND scope = 'SESSION' AND status = 'ACTIVE' AND pending_execution IS NULL "
                "ORDER BY created DESC LIMIT 3",
                agent.action_id,
            )
            # The same few pins for every writer of the round.
            targets = [r["memory_id"] for r in pins] or [None]
            jobs = []
            for t in range(6):
                tag, target = f"<r{n}t{t}>", rng.choice(targets)
                what = rng.choice(["pin", "pin", "replace", "delete", "unpin"])
                pin = {"summary": f"pin {tag}" * rng.randint(1, 3), "kind": "fact", "pinned": True}
                if target is None or what == "pin":
                    call = ("add_memory", pin | ({"scope": "agent"} if rng.random() < 0.15 else {}))
                elif what == "replace":
                    call = ("add_memory", pin | {"replaces": target})
                elif what == "unpin":
                    call = (
                        "add_memory",
                        {"summary": f"un {tag}", "kind": "fact", "replaces": target},
                    )
                else:
                    call = ("delete_memory", {"id": target})
                model_server.call_tools(call, when=tag)
                if rng.random() < 0.25:
                    fail_once(model_server, tag)  # staged, then dropped
                else:
                    model_server.say("ok", when=tag)
                turn = {"actionId": a, "sessionId": rng.choice(["s1", "s2", "s3"]), "input": tag}
                jobs.append(
                    race.post(http, token, EXECUTE, input=turn | {"preview": rng.random() < 0.3})
                )
            for retried in failed[-2:]:
                jobs.append(race.post(http, token, EXECUTE, input={"actionId": a, **retried}))
            failed.clear()
            batch = [
                {
                    "summary": f"op {n} {i}",
                    "kind": "fact",
                    "pinned": True,
                    "sessionId": rng.choice(["s1", "s2", "s3"]),
                }
                for i in range(3)
            ]
            if targets[0] is not None:
                batch[0]["replaces"] = rng.choice(targets)
                jobs.append(race.post(http, token, DELETE, a=a, m=rng.choice(targets)))
                unpin = {"summary": f"unpin {n}", "kind": "fact", "sessionId": "s1"}
                jobs.append(
                    race.post(http, token, ADD, a=a, i=unpin | {"replaces": rng.choice(targets)})
                )
            jobs.append(race.post(http, token, ADDS, a=a, i=batch))
            preview = await state.pool.fetchval(
                "SELECT memory_id::text FROM agent_memories WHERE action_id = $1 AND preview "
                "AND status = 'ACTIVE' AND pending_execution IS NULL ORDER BY random() LIMIT 1",
                agent.action_id,
            )
            if preview is not None:
                jobs.append(race.post(http, token, DELETE, a=a, m=preview))
            for body in await asyncio.gather(*jobs):
                done = (body.get("data") or {}).get("executeAction")
                if done and done["status"] == "FAILED":
                    failed.append({k: done[k] for k in ("executionId", "sessionId", "preview")})
            try:
                await assert_pinned_lists_kept(state, agent)
            except AssertionError as drift:
                race.check(False, n, drift)
    race.report()


@pytest.mark.settings(max_requests_per_account=64)
async def test_erase(state, admin, base_url, model_server):
    race, rng = Race("erase"), random.Random(SEED)
    harness = {**full_memory(), "history": {"index": "messages_and_tools"}}
    agent = await make_agent(state, admin, harness=harness)
    token, a = await token_for(state, admin, "probe", EVERYTHING), str(agent.action_id)
    failed: list[dict] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            jobs = []
            for t in range(6):
                tag = f"<r{n}t{t}>"
                if rng.random() < 0.4:
                    fail_once(model_server, tag)
                session = rng.choice(["s1", "s1", "s2"])
                turn = {"actionId": a, "sessionId": session, "input": f"{tag} secret"}
                jobs.append(race.post(http, token, EXECUTE, input=turn))
            for retried in failed[-3:]:
                jobs.append(race.post(http, token, EXECUTE, input={"actionId": a, **retried}))
            failed.clear()
            jobs += [race.post(http, token, ERASE, a=a, s="s1") for _ in range(2)]
            rng.shuffle(jobs)
            for body in await asyncio.gather(*jobs):
                done = (body.get("data") or {}).get("executeAction")
                if done and done["status"] == "FAILED":
                    failed.append({k: done[k] for k in ("executionId", "sessionId")})
            rows = await state.pool.fetch(
                """
                SELECT x.session_id, x.status, x.input = to_jsonb('[erased]'::text) AS erased,
                    (SELECT count(*) FROM history_events e WHERE e.action_id = x.action_id
                       AND e.execution_id = x.execution_id) AS events,
                    (SELECT count(*) FROM transcript_events t WHERE t.action_id = x.action_id
                       AND t.execution_id = x.execution_id AND t.data->>'erased' IS NULL) AS words
                FROM executions x WHERE x.action_id = $1 AND x.kind = 'TURN'
                """,
                agent.action_id,
            )
            for row in rows:
                whole = row["erased"] and row["events"] == 0 and row["words"] == 0
                kept = not row["erased"] and (row["events"] > 0 or row["status"] != "SUCCEEDED")
                race.check(
                    (whole or kept) and not (row["erased"] and row["session_id"] == "s2"),
                    n,
                    dict(row),
                )
    race.report()


async def _token_round(race, http, client_token, asking, **variables) -> tuple[bool, set]:
    """A client's requests (reads, and a keyed write) until 0.3 s after `asking` answered:
    whether one sent after that was accepted, and the records its writes answered."""
    answered_at: float | None = None
    seen: list[tuple[float, int]] = []
    written: set[str] = set()

    async def requests(i: int) -> None:
        while answered_at is None or time.monotonic() - answered_at < 0.3:
            at = time.monotonic()
            query, asked = (
                (ADD, {"a": variables["a"], "i": variables["fact"], "k": "k"})
                if i % 2
                else (VIEWER, {})
            )
            response = await http.post(
                "/graphql",
                json={"query": query, "variables": asked},
                headers={"Authorization": f"Bearer {client_token}"},
            )
            assert response.status_code in (200, 401), response.text
            body = response.json()
            for error in body.get("errors") or []:
                assert error["extensions"]["code"] != "INTERNAL", body
            if (body.get("data") or {}).get("addAgentMemory"):
                written.add(body["data"]["addAgentMemory"]["memoryId"])
            seen.append((at, response.status_code))

    async def mutate() -> None:
        nonlocal answered_at
        await asyncio.sleep(variables["after"])
        await race.post(http, variables["boss"], asking, **variables["mutation"])
        answered_at = time.monotonic()

    await asyncio.gather(mutate(), *(requests(i) for i in range(8)))
    race.answers["requests"] += len(seen)
    race.answers["sent after the mutation"] += sum(at > answered_at for at, _ in seen)
    return any(at > answered_at and status == 200 for at, status in seen), written


@pytest.mark.settings(max_requests_per_account=200)
async def test_tokens(state, admin, base_url):
    race, rng = Race("tokens"), random.Random(SEED)
    boss = await token_for(state, admin, "boss", EVERYTHING)
    a = str((await make_agent(state, admin, harness=full_memory())).action_id)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            principal, revoke = f"victim{n}", rng.random() < 0.5
            token = await token_for(state, admin, principal, EVERYTHING)
            fact = {"summary": f"fact {n}", "kind": "fact"}
            given = {"a": a, "fact": fact, "boss": boss, "after": rng.random() * 0.2}
            if revoke:
                issued = (await race.post(http, boss, CREATE_TOKEN, p=principal))["data"]
                token = issued["createClientToken"]["token"]
                revoked = {"p": principal, "t": issued["createClientToken"]["tokenId"]}
                late, _ = await _token_round(race, http, token, REVOKE, **given, mutation=revoked)
                race.check(not late, n, "accepted after revokeClientToken")
                continue
            deleted = {"p": principal}
            late, written = await _token_round(
                race, http, token, DELETE_CLIENT, **given, mutation=deleted
            )
            race.check(not late, n, "accepted after deleteClient")
            kept = await state.pool.fetchval(
                "SELECT count(*) FROM idempotency_keys WHERE principal = $1", principal
            )
            again = await token_for(state, admin, principal, EVERYTHING)
            anew = (await race.post(http, again, ADD, a=a, i=fact, k="k"))["data"]
            race.check(kept == 0 and anew["addAgentMemory"]["memoryId"] not in written, n, kept)
    race.report()


@pytest.mark.settings(max_requests_per_account=64, max_turns_per_account=64)
async def test_ingest_key(state, admin, base_url, model_server):
    race = Race("ingest_key")
    token = await token_for(state, admin, "probe", EVERYTHING)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            agent = await make_agent(state, admin, name=f"ingest{n}", harness=full_memory())
            replacing = n % 2 == 1
            if replacing:
                await remember(state, agent, "Ada lives in Paris", session=None, scope="AGENT")
            for _ in range(3):
                candidates(model_server, {"summary": "Ada lives in Berlin"})
                if replacing:
                    decide(model_server, {"candidate": "c1", "action": "replace", "record": "r1"})
            request = {
                "actionId": str(agent.action_id),
                "sessionId": "s1",
                "idempotencyKey": f"k{n}",
                "messages": [{"role": "user", "content": f"I moved to Berlin ({n})"}],
            }
            answers = [
                (body.get("data") or {}).get("rememberConversation") or {}
                for body in await asyncio.gather(
                    *(race.post(http, token, REMEMBER, input=request) for _ in range(3))
                )
            ]
            active = await state.pool.fetchval(
                "SELECT count(*) FROM agent_memories WHERE action_id = $1 AND status = 'ACTIVE'",
                agent.action_id,
            )
            one = len({x.get("executionId") for x in answers}) == 1
            race.check(
                one and active == 1 and {x.get("status") for x in answers} == {"SUCCEEDED"},
                n,
                answers,
            )
            # The model's unused replies (the requests answered before their review) go.
            with model_server._lock:
                model_server._chat_script.clear()
    race.report()


@pytest.mark.settings(max_requests_per_account=64)
async def test_replaces(state, admin, base_url):
    race, rng = Race("replaces"), random.Random(SEED)
    agent = await make_agent(state, admin, harness=full_memory(pinned={"max_tokens": 100_000}))
    token, a = await token_for(state, admin, "probe", EVERYTHING), str(agent.action_id)

    def record(summary: str, **given) -> dict:
        session = rng.choice(["s1", "s2", None])
        return {
            "summary": summary,
            "kind": "fact",
            "pinned": rng.random() < 0.5,
            "sessionId": session,
            **given,
        }

    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            base = await race.post(
                http, token, ADDS, a=a, i=[record(f"base {n} {i}") for i in range(4)]
            )
            ids = base["data"]["addAgentMemories"]["memoryIds"]
            batches = [
                [record(f"new {n} {b} {j}", replaces=t) for j, t in enumerate(rng.sample(ids, 2))]
                + [{"summary": f"extra {n} {b}", "kind": "fact", "sessionId": "s3"}]
                for b in range(4)
            ]
            done = await asyncio.gather(*(race.post(http, token, ADDS, a=a, i=i) for i in batches))
            written = [
                m
                for body in done
                if body.get("data")
                for m in body["data"]["addAgentMemories"]["memoryIds"]
            ]
            rows = await state.pool.fetch(
                "SELECT memory_id::text AS id, status, replaces::text, replaced_by::text, summary, "
                "pending_execution FROM agent_memories WHERE action_id = $1",
                agent.action_id,
            )
            race.answers["batches committed"] += len(written) // 3
            by = {r["id"]: r for r in rows}
            successors = Counter(r["replaces"] for r in rows if r["replaces"])
            race.check(not any(r["pending_execution"] for r in rows), n, "staged rows left")
            race.check(all(m in by for m in written), n, "a written record is missing")
            race.check(max(successors.values(), default=0) <= 1, n, successors)
            for i in ids:
                superseded = by[i]["status"] == "SUPERSEDED"
                race.check(superseded == (successors[i] == 1), n, i, by[i]["status"])
                if by[i]["replaced_by"] is not None:
                    race.check(by[by[i]["replaced_by"]]["replaces"] == i, n, "replacedBy")
            extras = sum(r["summary"].startswith(f"extra {n} ") for r in rows)
            race.check(extras == len(written) // 3, n, "a refused batch wrote", extras)
            try:
                await assert_pinned_lists_kept(state, agent)
            except AssertionError as drift:
                race.check(False, n, drift)
    race.report()


async def test_gate(db_url):
    race, rng = Race("gate"), random.Random(SEED)
    pool = await create_pool(db_url, min_size=0, max_size=4)

    async def work(share: Share, second: bool, sleep: float, timeout: float | None) -> None:
        with drawing_on(share):
            async with pool.acquire(timeout=timeout) as conn:
                if second:  # a task's second connection while it holds one
                    async with pool.acquire(timeout=timeout) as other:
                        await other.execute(f"SELECT pg_sleep({sleep / 2})")
                async with conn.transaction():
                    await conn.execute(f"SELECT pg_sleep({sleep})")

    async def one() -> None:
        share = Share(f"account {rng.randrange(8)}", 2)
        sleep = rng.choice([0, 0.001, 0.01, 0.03])
        acquire = rng.choice([None, 0.01, 0.05, 1])
        try:
            await asyncio.wait_for(
                work(share, rng.random() < 0.2, sleep, acquire), rng.choice([0.005, 0.02, 0.1, 10])
            )
            race.answers["done"] += 1
        except TimeoutError:
            race.answers["timed out"] += 1
        except asyncio.CancelledError:
            race.answers["cancelled"] += 1
            raise

    try:
        for n in range(ROUNDS):
            tasks = [asyncio.create_task(one()) for _ in range(60)]
            await asyncio.sleep(rng.random() * 0.05)
            for task in rng.sample(tasks, 10):
                task.cancel()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
            await asyncio.sleep(0.05)
            c = pool.connections
            busy = sum(h._in_use is not None for h in pool._holders)
            held = (c.in_use, dict(c._held), len(c._waiting), len(c._first), busy)
            race.check(held == (0, {}, 0, 0, 0), n, held)
            async with asyncio.timeout(10):  # every connection still given
                await asyncio.gather(*(pool.fetchval("SELECT 1") for _ in range(8)))
    finally:
        await pool.close()
    race.report()


# A turn's tag (its input, or in it): a round's `#rNtT#`, or a sweep's. No angle brackets: the
# review reads the conversation with them escaped.
TAG = re.compile(r"#(r\d+)t\d+#|#sweep \w+#")


def fact(seed: str) -> str:
    """A summary of words no other fact shares."""
    digest = hashlib.blake2b(seed.encode(), digest_size=12).hexdigest()
    return " ".join("q" + digest[i : i + 6] for i in range(0, 24, 6))


REVIEWER = ChatReply(content="review", purpose="memory")


def reviewing(server) -> None:
    """The scripted model's memory review learns, from each turn whose tag `#rNtT#` it reads,
    that turn's own fact (session scope) and its round's fact (agent scope: every turn of the
    round learns it); a decide call skips a candidate a shown record says word for word, and
    adds the others."""
    plain = server._completion

    def completion(self, body, reply, number):
        if reply is not REVIEWER:
            return plain(body, reply, number)
        tools = [t["function"]["name"] for t in body.get("tools", [])]
        if "decide" in tools:
            shown = json.loads(body["messages"][1]["content"])
            said = {r["summary"] for r in shown["records"].values()}
            decisions = [
                {"candidate": c["handle"], "action": "skip" if c["summary"] in said else "add"}
                for c in shown["candidates"]
            ]
            return plain(body, ChatReply(tool_calls=[("decide", {"decisions": decisions})]), number)
        said = json.dumps(body["messages"][1:])
        items = []
        for m in TAG.finditer(said):
            items.append({"summary": fact(m.group(0)), "kind": "fact", "scope": "session"})
            if m.group(1):
                items.append({"summary": fact(m.group(1)), "kind": "fact", "scope": "agent"})
        return plain(body, ChatReply(tool_calls=[("remember", {"candidates": items})]), number)

    server._completion = types.MethodType(completion, server)
    server.chat_defaults["memory"] = REVIEWER


async def _review_checks(race: Race, state, agent, n: object) -> None:
    """No two live records say the same (M12); no record of an attempt that did not commit
    (M17)."""
    twice = await state.pool.fetch(
        "SELECT memory_summary_key(summary) AS key, count(*) FROM agent_memories "
        "WHERE account_id = $2 AND action_id = $1 AND status = 'ACTIVE' "
        "AND pending_execution IS NULL GROUP BY 1 HAVING count(*) > 1",
        agent.action_id,
        agent.account_id,
    )
    race.check(not twice, n, "restated facts piled up", [dict(r) for r in twice])
    stray = await state.pool.fetch(
        "SELECT m.memory_id, x.status, m.invocation_number, x.invocation_number AS now "
        "FROM agent_memories m JOIN executions x ON x.account_id = m.account_id "
        "AND x.action_id = m.action_id AND x.execution_id = m.execution_id "
        "WHERE m.account_id = $2 AND m.action_id = $1 AND m.source = 'EXTRACTION' "
        "AND m.pending_execution IS NULL "
        "AND (x.status <> 'SUCCEEDED' OR x.invocation_number <> m.invocation_number)",
        agent.action_id,
        agent.account_id,
    )
    race.check(not stray, n, "a record of a turn that rolled back", [dict(r) for r in stray])


@pytest.mark.parametrize("every", ["turn", 6])
@pytest.mark.settings(max_requests_per_account=64)
async def test_review(state, admin, base_url, model_server, every):
    """Turns of one agent at once, on three sessions, whose reviews learn the same agent-scope
    fact; some fail before their review (retried next round), and two a round replace one
    record with add_memory, so that one of them rolls back after its review staged."""
    race, rng = Race(f"review[{every}]"), random.Random(SEED)
    reviewing(model_server)
    extraction = {} if every == "turn" else {"extraction": {"every": {"messages": every}}}
    agent = await make_agent(state, admin, harness=full_memory(**extraction))
    token, a = await token_for(state, admin, "probe", EVERYTHING), str(agent.action_id)
    failed: list[dict] = []
    sessions = ["s1", "s2", "s3"] if every == "turn" else ["s1"]
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            target = await race.post(
                http, token, ADD, a=a, i={"summary": fact(f"target {n}"), "kind": "fact"}
            )
            target = target["data"]["addAgentMemory"]["memoryId"]
            jobs = []
            for t in range(6):
                tag = f"#r{n}t{t}#"
                if t < 2:
                    replacing = {"summary": fact(f"by {tag}"), "kind": "fact", "replaces": target}
                    model_server.call_tools(("add_memory", replacing), when=tag)
                if rng.random() < 0.25:
                    fail_once(model_server, tag)
                model_server.say("ok", when=tag)
                turn = {"actionId": a, "sessionId": rng.choice(sessions), "input": tag}
                jobs.append(race.post(http, token, EXECUTE, input=turn))
            for retried in failed[-2:]:
                jobs.append(race.post(http, token, EXECUTE, input={"actionId": a, **retried}))
            failed.clear()
            for body in await asyncio.gather(*jobs):
                done = (body.get("data") or {}).get("executeAction")
                if done and done["status"] == "FAILED" and "scripted" in (done["error"] or ""):
                    failed.append({k: done[k] for k in ("executionId", "sessionId")})
                elif done and done["status"] == "FAILED":
                    race.answers["rolled back after the review"] += 1
            with model_server._lock:
                model_server._chat_script.clear()
            await _review_checks(race, state, agent, n)
            if every != "turn":
                waiting = await state.pool.fetchval(
                    "SELECT coalesce(sum(review_messages - review_read), 0) FROM executions "
                    "WHERE action_id = $1 "
                    "AND review_messages IS NOT NULL AND reviewed_by IS NULL",
                    agent.action_id,
                )
                race.answers["rounds ending with a review due"] += waiting >= every
        # One more turn a session, alone: whatever waits is reviewed, once.
        for s in sessions:
            sweep = {"actionId": a, "sessionId": s, "input": f"#sweep {s}#"}
            await race.post(http, token, EXECUTE, input=sweep)
        await _review_checks(race, state, agent, "sweep")
        rows = await state.pool.fetch(
            "SELECT input #>> '{}' AS tag, reviewed_by IS NOT NULL AS reviewed, "
            "review_messages - review_read AS review_messages "
            "FROM executions WHERE action_id = $1 AND kind = 'TURN' AND status = 'SUCCEEDED'",
            agent.action_id,
        )
        kept = {
            r["summary"]
            for r in await state.pool.fetch(
                "SELECT summary FROM agent_memories WHERE action_id = $1 AND status = 'ACTIVE' "
                "AND source = 'EXTRACTION'",
                agent.action_id,
            )
        }
        unreviewed = sum(r["review_messages"] for r in rows if not r["reviewed"])
        race.check(unreviewed < (2 if every == "turn" else every), "sweep", unreviewed, "waiting")
        for r in rows:
            if r["reviewed"]:
                race.check(fact(r["tag"]) in kept, "sweep", r["tag"], "reviewed, fact not kept")
        race.answers["decide calls"] += sum(
            '"decide"' in json.dumps(x.body.get("tools")) for x in model_server.requests_to(CHAT)
        )
    race.report()


EXECUTE_REPLAY = """mutation($input: ExecuteActionInput!) { executeAction(input: $input) {
    executionId status error } }"""


async def _history_checks(race: Race, state, agent, n: object, every_turn: bool = True) -> None:
    """What the tables hold against the rules: kept events only of committed attempts (H5),
    none twice, turn numbers unique and 1..the session's count, parts whole (H8), and every
    committed search's results from turns before its own (H6), its original's (H12), never a
    preview turn's for a live turn (H13)."""
    a, account = agent.action_id, agent.account_id
    wrong = await state.pool.fetch(
        """
        SELECT e.event_id, e.turn, x.turn AS committed, x.status, e.invocation_number,
            x.invocation_number AS now, x.replay_of IS NOT NULL AS replay, e.preview, x.preview
        FROM history_events e LEFT JOIN executions x ON x.account_id = e.account_id
            AND x.action_id = e.action_id AND x.execution_id = e.execution_id
        WHERE e.account_id = $2 AND e.action_id = $1 AND (x.status IS DISTINCT FROM 'SUCCEEDED'
            OR x.invocation_number <> e.invocation_number OR x.turn IS DISTINCT FROM e.turn
            OR x.replay_of IS NOT NULL OR x.preview <> e.preview OR e.text LIKE '%lost%')
        """,
        a,
        account,
    )
    race.check(not wrong, n, "kept events of no committed attempt", [dict(r) for r in wrong])
    twice = await state.pool.fetch(
        "SELECT execution_id, sequence, count(*) FROM history_events WHERE action_id = $1 "
        "AND account_id = $2 GROUP BY 1, 2 HAVING count(*) > 1",
        a,
        account,
    )
    race.check(not twice, n, "an event kept twice", [dict(r) for r in twice])
    for s in await state.pool.fetch(
        "SELECT session_id, turns FROM sessions WHERE action_id = $1 AND account_id = $2",
        a,
        account,
    ):
        numbers = [
            r["turn"]
            for r in await state.pool.fetch(
                "SELECT turn FROM executions WHERE action_id = $1 AND session_id = $2 "
                "AND status = 'SUCCEEDED' AND replay_of IS NULL AND kind IN ('TURN', 'INGEST') "
                "AND account_id = $3 ORDER BY turn",
                a,
                s["session_id"],
                account,
            )
        ]
        if every_turn:
            race.check(numbers == list(range(1, s["turns"] + 1)), n, "turn numbers", s, numbers)
        else:  # an import holds the turns its records name, not every turn
            unique = len(set(numbers)) == len(numbers) and max(numbers, default=0) <= s["turns"]
            race.check(unique, n, "turn numbers", dict(s), numbers)
    torn = await state.pool.fetch(
        """
        SELECT e.event_id, e.parts, array_agg(p.part ORDER BY p.part) AS numbers
        FROM history_events e LEFT JOIN history_parts p ON p.account_id = e.account_id
            AND p.action_id = e.action_id AND p.session_id = e.session_id
            AND p.event_id = e.event_id AND p.turn = e.turn AND p.preview = e.preview
        WHERE e.action_id = $1 AND e.account_id = $2 GROUP BY 1, 2
        HAVING array_agg(p.part ORDER BY p.part) <> array(SELECT generate_series(1, e.parts))
        """,
        a,
        account,
    )
    race.check(not torn, n, "an event's parts not whole", [dict(r) for r in torn])
    searches = await state.pool.fetch(
        """
        SELECT x.execution_id, x.turn, x.preview, o.turn AS original, o.preview AS opreview,
            t.data->'output'->'events' AS found
        FROM executions x
        JOIN transcript_events t ON t.account_id = x.account_id AND t.action_id = x.action_id
            AND t.execution_id = x.execution_id AND t.invocation_number = x.invocation_number
        LEFT JOIN executions o ON o.account_id = x.account_id AND o.action_id = x.action_id
            AND o.execution_id = x.replay_of
        WHERE x.action_id = $1 AND x.account_id = $2 AND x.status = 'SUCCEEDED'
            AND t.type = 'tool.execution' AND t.data->>'name' = 'search_history'
        """,
        a,
        account,
    )
    for r in searches:
        before = r["original"] if r["original"] is not None else r["turn"]
        preview = r["opreview"] if r["original"] is not None else r["preview"]
        for found in r["found"] or []:
            race.answers["results checked"] += 1
            ok = found["turn"] < before and (preview or not found.get("preview"))
            race.check(ok, n, "a search saw", found["turn"], found.get("preview"), dict(r))


@pytest.mark.settings(max_requests_per_account=64)
async def test_history(state, admin, base_url, model_server):
    """Turns of one session at once (live and preview, some with a long message, a third
    failing after their search, retried next round), each searching the session's history;
    a replay of an earlier turn searching; an eraseSession of the session every fourth round;
    turns of a second session beside them."""
    race, rng = Race("history"), random.Random(SEED)
    agent = await make_agent(state, admin, harness={"history": {"index": "messages_and_tools"}})
    token, a = await token_for(state, admin, "probe", EVERYTHING), str(agent.action_id)
    failed: list[dict] = []
    replayable: list[tuple[str, str]] = []  # (execution, tag) of committed live turns
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            jobs, sent = [], []
            for t in range(6):
                tag = f"#r{n}t{t}#"
                failing = rng.random() < 0.33
                # A failing attempt's search (its call, its result) is said only by it.
                words = f"lost{n}x{t}" if failing else "entry"
                search = {"query": f"ledger {words}", "limit": 20}
                model_server.call_tools(("search_history", search), when=tag)
                if failing:
                    fail_once(model_server, tag)  # after the search: its words never kept
                else:
                    model_server.say(f"noted ledger {tag}", when=tag)
                words = f"{tag} ledger entry {n} {t}."
                long = " ".join([f"Ledger line {i} of {tag} says nothing new." for i in range(60)])
                turn = {
                    "actionId": a,
                    "sessionId": "s2" if t == 5 else "s1",
                    "input": words + (" " + long if rng.random() < 0.3 else ""),
                    "preview": rng.random() < 0.2,
                }
                sent.append(tag)
                jobs.append(race.post(http, token, EXECUTE, input=turn))
            for retried in failed[-3:]:
                jobs.append(race.post(http, token, EXECUTE, input={"actionId": a, **retried}))
            failed.clear()
            if replayable:
                original, tag = rng.choice(replayable)
                model_server.call_tools(("search_history", {"query": "ledger"}), when=tag)
                model_server.say("replayed", when=tag)
                replay = {"actionId": a, "replayOf": original}
                jobs.append(race.post(http, token, EXECUTE_REPLAY, input=replay))
            if n % 4 == 3:
                jobs.append(race.post(http, token, ERASE, a=a, s="s1"))
            rng.shuffle(jobs)
            for body in await asyncio.gather(*jobs):
                done = (body.get("data") or {}).get("executeAction")
                if done and "sessionId" in done and done["status"] == "FAILED":
                    failed.append({k: done[k] for k in ("executionId", "sessionId", "preview")})
            with model_server._lock:
                model_server._chat_script.clear()
            replayable = [
                (str(r["execution_id"]), r["tag"])
                for r in await state.pool.fetch(
                    "SELECT execution_id, substring(input #>> '{}' from '#r[0-9]+t[0-9]+#') AS tag "
                    "FROM executions WHERE action_id = $1 AND kind = 'TURN' AND NOT preview "
                    "AND status = 'SUCCEEDED' AND replay_of IS NULL "
                    "AND input <> to_jsonb('[erased]'::text)",
                    agent.action_id,
                )
                if r["tag"]
            ]
            await _history_checks(race, state, agent, n)
    race.report()


@pytest.mark.settings(max_requests_per_account=64)
async def test_ingest(state, admin, base_url, model_server):
    """rememberConversation beside turns of the same sessions, an agent that keeps history and
    writes agent scope: the reviews of both learn each one's fact and the round's (M12, M17),
    and an ingest is a turn of its session (H5, H8, turn numbers)."""
    race, rng = Race("ingest"), random.Random(SEED)
    reviewing(model_server)
    harness = {**full_memory(), "history": {"index": "messages_and_tools"}}
    agent = await make_agent(state, admin, harness=harness)
    token, a = await token_for(state, admin, "probe", EVERYTHING), str(agent.action_id)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            jobs = []
            for t in range(6):
                tag, session = f"#r{n}t{t}#", rng.choice(["s1", "s1", "s2"])
                if t < 3:
                    if rng.random() < 0.25:
                        fail_once(model_server, tag)
                    model_server.say(f"noted {tag}", when=tag)
                    turn = {"actionId": a, "sessionId": session, "input": f"{tag} ledger"}
                    jobs.append(race.post(http, token, EXECUTE, input=turn))
                    continue
                said = [
                    {"role": "user", "content": f"{tag} ledger"},
                    {"role": "assistant", "content": f"noted {tag}"},
                ]
                request = {"actionId": a, "sessionId": session, "messages": said}
                jobs.append(race.post(http, token, REMEMBER, input=request))
            await asyncio.gather(*jobs)
            with model_server._lock:
                model_server._chat_script.clear()
            await _review_checks(race, state, agent, n)
            await _history_checks(race, state, agent, n)
    race.report()


async def _turns_until(race, http, token, agent_id: str, tags: list[str], model_server, rng):
    """Turns of an agent that may not exist yet (an import writes it): each sent again while
    the answer is NOT_FOUND, pinning and replacing pins in sessions the import holds and one
    it does not. Returns the answers, each with when it came."""
    answers = []
    for tag in tags:
        pin = {"summary": f"pin {tag}", "kind": "fact", "pinned": True}
        if rng.random() < 0.5:
            pin["scope"] = "agent"
        model_server.call_tools(("add_memory", pin), when=tag)
        model_server.say(f"noted {tag}", when=tag)
        turn = {"actionId": agent_id, "sessionId": rng.choice(["s1", "s2", "s9"]), "input": tag}
        for _ in range(200):
            body = await race.post(http, token, EXECUTE, input=turn)
            codes = {e["extensions"]["code"] for e in body.get("errors") or []}
            if codes != {"NOT_FOUND"}:
                break
            await asyncio.sleep(0.005)
        answers.append((time.monotonic(), body))
    return answers


async def _import(race, state, account, lines: list[str], batch: int, n: int) -> float:
    """Imports the lines into the account; returns when it ended (time.monotonic)."""
    from app.errors import Conflict
    from app.transfer.service import import_file

    async def opener():
        return state.embedder

    try:
        await import_file(
            state.pool, account_id=account, lines=lines, open_embedder=opener, batch_rows=batch
        )
        race.answers["imports whole"] += 1
    except Conflict as e:
        race.answers["imports stopped: CONFLICT"] += 1
        race.check("already exists" in e.message or "clashes" in e.message, n, e)
    return time.monotonic()


def _answered_at(answers: list) -> list[float]:
    return [at for at, _ in answers]


@pytest.mark.settings(max_requests_per_account=64)
async def test_import(state, admin, base_url, model_server):
    """`engram import` of an agent (import_file, batches of 2 to 20 rows) into a new account
    while turns of that account start on the agent as soon as it exists, in sessions the file
    holds and another; `engram export` of the agent while its turns run, and the file imported
    back into its own account while more run. An import ends whole or stops with CONFLICT
    naming a row (nothing overwritten); each session's turn numbers unique; the pinned lists
    kept as counted (migration 0030), in both accounts; no deadlock between an import and the
    turns (PostgreSQL's count, pg_stat_database: a turn's would be answered CONFLICT, which
    the checks above do not look at)."""
    from types import SimpleNamespace

    from app.transfer.service import export_action

    race, rng = Race("import"), random.Random(SEED)
    harness = {
        **full_memory(pinned={"max_tokens": 100_000}),
        "history": {"index": "messages_and_tools"},
    }
    agent = await make_agent(state, admin, harness=harness)
    token, a = await token_for(state, admin, "probe", EVERYTHING), str(agent.action_id)
    deadlocks = await _deadlocks(state)

    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for n in range(ROUNDS):
            out = io.StringIO()
            turns = _turns_until(
                race, http, token, a, [f"#r{n}h{t}#" for t in range(4)], model_server, rng
            )
            exporting = export_action(
                state.pool, account_id=admin.account_id, action_id=agent.action_id, out=out
            )
            await asyncio.gather(turns, exporting)
            lines = out.getvalue().splitlines()
            # The same file into its own account, while more turns run: all there already, or
            # changed since (CONFLICT); nothing overwritten.
            again = _turns_until(
                race, http, token, a, [f"#r{n}a{t}#" for t in range(4)], model_server, rng
            )
            await asyncio.gather(
                _import(race, state, admin.account_id, lines, rng.randint(2, 6), n), again
            )
            try:
                await assert_pinned_lists_kept(state, agent)
            except AssertionError as drift:
                race.check(False, n, "pinned lists", drift)
            account = await make_account(state, f"copy{n}")
            other = await token_for(state, admin, f"copy{n}", EVERYTHING, account_id=account)

            tags = [f"#r{n}c{t}#" for t in range(6)]
            batch = rng.randint(2, 6)
            ended, *answers = await asyncio.gather(
                _import(race, state, account, lines, batch, n),
                *(_turns_until(race, http, other, a, [t], model_server, rng) for t in tags),
            )
            race.answers["turns answered while the import ran"] += sum(
                at < ended for each in answers for at in _answered_at(each)
            )
            with model_server._lock:
                model_server._chat_script.clear()
            copy = SimpleNamespace(account_id=account, action_id=agent.action_id)
            try:
                await assert_pinned_lists_kept(state, copy)
            except AssertionError as drift:
                race.check(False, n, "pinned lists", drift)
            await _history_checks(race, state, copy, n, every_turn=False)
            await _history_checks(race, state, agent, n)
    await asyncio.sleep(11)  # a backend reports its counts once idle, within 10 s
    race.answers["deadlocks"] = await _deadlocks(state) - deadlocks
    race.check(race.answers["deadlocks"] == 0, "deadlocks", race.answers["deadlocks"])
    race.report()


async def _deadlocks(state) -> int:
    """The deadlocks PostgreSQL has found in this database (as its backends reported them)."""
    return await state.pool.fetchval(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )
