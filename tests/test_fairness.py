"""Fairness between accounts (app/fairness.py), over real HTTP: one account's requests, turns
and pooled connections in progress are bounded per process, so another account's requests and
/healthz are answered meanwhile.

A request is held in progress here by a lock the test takes on `executions`: reading an
execution (GraphQL) or starting one (an MCP tool call) then waits on it, holding its place
(and a pooled connection) until the test lets go."""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import httpx
import pytest
from factories import allow, caller, make_account, make_agent_id, memory_harness, token_for
from helpers import eventually
from openai_server import OpenAIServer
from runtime_support import EXECUTE

from app.auth.caller import Caller
from app.auth.policies import ADMIN_POLICIES
from app.config import Settings
from app.db.pool import Connections, Share
from app.fairness import Fairness, PerAccount, Slots
from app.state import AppState

EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")
# Waits while the test holds `executions` locked.
BLOCKED = "query($e: UUID!) { execution(executionId: $e) { status } }"
SMALL = "{ actions(first: 5) { nodes { name } } }"
WAITING = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'executions'::regclass"


@asynccontextmanager
async def executions_locked(state: AppState) -> AsyncIterator[None]:
    async with state.pool.acquire() as conn, conn.transaction():
        await conn.execute("LOCK TABLE executions IN ACCESS EXCLUSIVE MODE")
        yield


async def waiting_on_lock(state: AppState) -> int:
    async with state.pool.acquire() as conn:
        return await conn.fetchval(WAITING)


async def tenant(state: AppState, name: str) -> tuple[UUID, str]:
    """A new account, and the token of a client of it that may do anything in it."""
    account = await make_account(state, name)
    owner = Caller(account, "admin", ADMIN_POLICIES)
    return account, await token_for(state, owner, f"{name}-client", EVERYTHING)


class Client:
    def __init__(self, http: httpx.AsyncClient, token: str) -> None:
        self.http, self.token = http, token

    async def post(self, query: str, **variables: Any) -> httpx.Response:
        return await self.http.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {self.token}"},
        )

    def blocked(self) -> "asyncio.Task[httpx.Response]":
        return asyncio.create_task(self.post(BLOCKED, e=str(uuid.uuid4())))


def refused_too_many(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == "1"
    body = response.json()
    assert body["data"] is None
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "TOO_MANY_REQUESTS"
    assert "in progress" in error["message"] and "retry in 1 s" in error["message"]


def answered(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        yield client


@pytest.mark.settings(max_requests_per_account=1, account_queue_seconds=2)
async def test_an_account_beyond_its_bound_waits_then_429_while_another_is_answered(
    state: AppState, http: httpx.AsyncClient
) -> None:
    a = Client(http, (await tenant(state, "a"))[1])
    b = Client(http, (await tenant(state, "b"))[1])
    async with executions_locked(state):
        holding = a.blocked()
        await eventually(lambda: waiting_on_lock(state), "A's request waits on the lock")
        started = time.monotonic()
        queued = asyncio.create_task(a.post(SMALL))
        # In the same moment, B's request is answered, while A's second one still waits.
        assert answered(await b.post(SMALL)) == {"actions": {"nodes": []}}
        assert not queued.done()
        # A request without a valid token is refused as such: it took none of A's places.
        stranger = await http.post("/graphql", json={"query": SMALL})
        assert stranger.status_code == 401
        assert (await http.get("/healthz")).status_code == 200  # never bounded
        refused_too_many(await queued)
        assert time.monotonic() - started >= 2  # it waited its time in the queue first
        assert not holding.done()
    assert (await holding).status_code == 200
    # The place is free again once the request is answered.
    assert answered(await a.post(SMALL)) == {"actions": {"nodes": []}}


@asynccontextmanager
async def actions_locked(state: AppState) -> AsyncIterator[None]:
    async with state.pool.acquire() as conn, conn.transaction():
        await conn.execute("LOCK TABLE actions IN ACCESS EXCLUSIVE MODE")
        yield


@pytest.mark.settings(max_requests_per_account=1, account_queue_seconds=3)
async def test_waiting_requests_take_freed_places_in_order_and_the_rest_are_slowed(
    state: AppState, http: httpx.AsyncClient
) -> None:
    """One request waits in line (as many as may run); one beyond it is answered only after
    the same wait, so that a client sending again at once is not refused as fast as it sends."""
    a = Client(http, (await tenant(state, "a"))[1])
    async with actions_locked(state):
        async with executions_locked(state):
            holding = a.blocked()
            await eventually(lambda: waiting_on_lock(state), "A's request waits on the lock")
            in_line = asyncio.create_task(a.post(SMALL))  # reads actions: waits on that lock
            await asyncio.sleep(0.3)
            started = time.monotonic()
            beyond = asyncio.create_task(a.post(SMALL))
            await asyncio.sleep(0.3)
        # The first request ends: its place goes to the one in line, which then waits on the
        # actions lock, holding it, until the one beyond the line is refused.
        assert (await holding).status_code == 200
        refused_too_many(await beyond)
        assert time.monotonic() - started >= 3
        assert not in_line.done()
    answered(await in_line)


@pytest.mark.settings(max_requests_per_account=1, account_queue_seconds=0)
async def test_the_place_is_given_back_after_errors_and_a_client_gone(
    state: AppState, http: httpx.AsyncClient, base_url: str
) -> None:
    a = Client(http, (await tenant(state, "a"))[1])
    # Refusals of every kind, each after its request took A's only place.
    for query, variables in (
        ("{ actions(first: -1) { nodes { name } } }", {}),  # the resolver refuses it
        ("{ nosuchfield }", {}),  # validation refuses it
        ("query($a: UUID!) { action(actionId: $a) { name } }", {"a": "not-a-uuid"}),
    ):
        response = await a.post(query, **variables)
        assert response.status_code in (200, 400), response.text
        assert response.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"
    answered(await a.post(SMALL))

    async with executions_locked(state):
        # A client that gives up on its request: the request still runs, holding the place...
        async with httpx.AsyncClient(base_url=base_url, timeout=0.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await Client(impatient, a.token).post(BLOCKED, e=str(uuid.uuid4()))
        await eventually(lambda: waiting_on_lock(state), "the abandoned request waits")
        refused_too_many(await a.post(SMALL))
    # ...and gives it back when it ends.

    async def free() -> bool:
        return (await a.post(SMALL)).status_code == 200

    await eventually(free, "A's place given back")
    # Given back once, not twice: the bound still holds.
    async with executions_locked(state):
        holding = a.blocked()
        await eventually(lambda: waiting_on_lock(state), "A's request waits on the lock")
        refused_too_many(await a.post(SMALL))
    assert (await holding).status_code == 200


def _mcp_headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-06-18",
    }


def _rpc(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


@pytest.mark.settings(max_requests_per_account=1, account_queue_seconds=1)
async def test_mcp_requests_share_the_bound_with_graphql(
    state: AppState, http: httpx.AsyncClient
) -> None:
    a_account, a_token = await tenant(state, "a")
    b_account, b_token = await tenant(state, "b")
    harness = memory_harness()
    a_agent = await make_agent_id(state, caller(a_account, EVERYTHING), harness=harness)
    b_agent = await make_agent_id(state, caller(b_account, EVERYTHING), harness=harness)
    a, b = _mcp_headers(a_token), _mcp_headers(b_token)
    search = _rpc("tools/call", name="search_memory", arguments={"query": "parcel"})
    listing = _rpc("tools/list")
    async with executions_locked(state):
        # A's tool call starts an execution: it waits on the lock, holding A's place.
        calling = asyncio.create_task(
            http.post(f"/mcp/{a_agent}?session=s1", json=search, headers=a)
        )
        await eventually(lambda: waiting_on_lock(state), "A's tool call waits on the lock")
        queued = asyncio.create_task(
            http.post(f"/mcp/{a_agent}?session=s1", json=listing, headers=a)
        )
        theirs = await http.post(f"/mcp/{b_agent}?session=s1", json=listing, headers=b)
        assert theirs.status_code == 200, theirs.text
        assert "search_memory" in {t["name"] for t in theirs.json()["result"]["tools"]}
        assert not queued.done()
        refused = await queued
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == -32000 and error["data"]["code"] == "TOO_MANY_REQUESTS"
        assert "in progress" in error["message"]
        # The same bound holds A's GraphQL requests.
        refused_too_many(await Client(http, a_token).post(SMALL))
    done = await calling
    assert done.status_code == 200 and done.json()["result"]["isError"] is False, done.text
    again = await http.post(f"/mcp/{a_agent}?session=s1", json=listing, headers=a)
    assert again.status_code == 200, again.text


@pytest.mark.settings(
    max_requests_per_account=1, max_turns_per_account=1, account_queue_seconds=0.5
)
async def test_a_turn_holds_a_turns_place_not_a_requests(
    state: AppState, http: httpx.AsyncClient, model_server: OpenAIServer
) -> None:
    """A long turn leaves its account's short reads a place; turns beyond their own bound are
    refused before anything is written."""
    account, token = await tenant(state, "a")
    agent = await make_agent_id(state, caller(account, EVERYTHING), harness=None)
    a = Client(http, token)
    model_server.say("slow answer", delay=3)
    turn = {"actionId": agent, "sessionId": "s1"}
    running = asyncio.create_task(a.post(EXECUTE, input={**turn, "input": "first"}))
    await eventually(lambda: model_server.chat_requests(), "the turn asks its model")
    # The turn runs; A's requests still have their place.
    answered(await a.post(SMALL))
    refused_too_many(await a.post(EXECUTE, input={**turn, "input": "second"}))
    finished = answered(await running)["executeAction"]
    assert finished["status"] == "SUCCEEDED" and finished["output"] == "slow answer"
    async with state.pool.acquire() as conn:
        inputs = await conn.fetch(
            "SELECT input FROM executions WHERE action_id = $1", uuid.UUID(agent)
        )
    assert [r["input"] for r in inputs] == ["first"]  # the refused turn wrote nothing
    # Its place is free again.
    assert answered(await a.post(EXECUTE, input={**turn, "input": "third"}))


@pytest.mark.settings(
    pool_max_size=4,
    max_connections_per_account=2,
    max_requests_per_account=8,
    account_queue_seconds=0,
)
async def test_an_account_holds_at_most_its_share_of_the_pool(
    state: AppState, http: httpx.AsyncClient
) -> None:
    """GraphQL requests and MCP tool calls of one account draw on one share of the pool."""
    account, token = await tenant(state, "a")
    a = Client(http, token)
    b = Client(http, (await tenant(state, "b"))[1])
    agent = await make_agent_id(state, caller(account, EVERYTHING), harness=memory_harness())
    search = _rpc("tools/call", name="search_memory", arguments={"query": "parcel"})
    async with executions_locked(state):
        holding = [a.blocked(), a.blocked()]
        holding += [
            asyncio.create_task(
                http.post(f"/mcp/{agent}?session=s1", json=search, headers=_mcp_headers(token))
            )
            for _ in range(2)
        ]
        await eventually(lambda: _at_least(state, 2), "A's requests hold their share of the pool")
        # The pool's other two connections answer B and /healthz, which waited without a share.
        answered(await asyncio.wait_for(b.post(SMALL), 10))
        health = await asyncio.wait_for(http.get("/healthz"), 10)
        assert health.status_code == 200
        assert await waiting_on_lock(state) == 2  # A's other two wait for A's own connections
    for request in holding:
        assert (await request).status_code == 200


async def _at_least(state: AppState, count: int) -> bool:
    return await waiting_on_lock(state) >= count


@pytest.mark.settings(pool_max_size=4, max_connections_per_account=2, account_queue_seconds=0)
async def test_a_third_account_is_served_while_two_others_fill_their_shares(
    state: AppState, http: httpx.AsyncClient
) -> None:
    """Two accounts, each with more requests than its share (half the pool), hold one
    connection fewer than the pool between them: the last is B's, at once, while A's and C's
    requests beyond wait for theirs."""
    a = Client(http, (await tenant(state, "a"))[1])
    b = Client(http, (await tenant(state, "b"))[1])
    c = Client(http, (await tenant(state, "c"))[1])
    async with executions_locked(state):
        holding = [a.blocked() for _ in range(3)] + [c.blocked() for _ in range(3)]
        await eventually(lambda: _at_least(state, 3), "A and C hold 3 of the 4 connections")
        # Without the free connection B would wait here for one of theirs, until the lock goes.
        answered(await asyncio.wait_for(b.post(SMALL), 30))
        assert await waiting_on_lock(state) == 3
        assert not any(request.done() for request in holding)
    for request in holding:
        assert (await request).status_code == 200


@pytest.mark.settings(pool_max_size=4, max_connections_per_account=2, account_queue_seconds=0)
async def test_healthz_answers_while_three_accounts_fill_the_pool(
    state: AppState, http: httpx.AsyncClient
) -> None:
    """/healthz asks the database on a connection of its own, and says the process is up rather
    than waiting for one of the pool's."""
    a = Client(http, (await tenant(state, "a"))[1])
    c = Client(http, (await tenant(state, "c"))[1])
    d = Client(http, (await tenant(state, "d"))[1])
    async with executions_locked(state):
        holding = [a.blocked(), a.blocked(), c.blocked(), c.blocked()]
        await eventually(lambda: _at_least(state, 3), "A and C hold all they may")
        holding.append(d.blocked())
        await eventually(lambda: _at_least(state, 4), "D holds the last connection")
        health = await asyncio.wait_for(http.get("/healthz"), 10)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert not any(request.done() for request in holding)
    for request in holding:
        assert (await request).status_code == 200


# --- the bounds themselves --------------------------------------------------------------------


async def test_slots_a_waiter_cancelled_or_timed_out_holds_nothing() -> None:
    slots = Slots(1, queue=2, wait=None)
    assert await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # Handed the place just as it was cancelled: it passes the place on.
    waiter = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.held == 0 and slots.idle
    # Cancelled, and passed over by a release before it ran again: nothing left to undo.
    assert await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    slots.release()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.held == 0 and slots.idle
    timed = Slots(1, queue=1, wait=0.05)
    assert await timed.acquire()
    assert not await timed.acquire()
    timed.release()
    assert timed.idle


async def test_per_account_bounds_are_forgotten_when_idle() -> None:
    bound = PerAccount(2, queue=0, wait=0)
    first, second = uuid.uuid4(), uuid.uuid4()
    assert await bound.take(first) and await bound.take(first)
    assert not await bound.take(first)  # refused at once: no queue
    assert await bound.take(second)
    bound.give_back(first)
    bound.give_back(first)
    bound.give_back(second)
    assert bound.held(first) == bound.held(second) == 0
    assert not bound._slots


async def test_per_account_bounds_keep_an_account_while_a_request_waits_beyond_the_line() -> None:
    bound = PerAccount(1, queue=0, wait=0.1)
    account = uuid.uuid4()
    assert await bound.take(account)
    beyond = asyncio.create_task(bound.take(account))
    await asyncio.sleep(0.01)
    bound.give_back(account)  # the account holds nothing now, but one of its requests waits
    assert await beyond  # the place it finds free at the end of its wait
    assert bound.held(account) == 1
    bound.give_back(account)
    assert bound.held(account) == 0 and not bound._slots


async def test_a_request_cancelled_while_running_or_waiting_gives_its_place_back() -> None:
    fairness = Fairness(Settings(max_requests_per_account=1, account_queue_seconds=30))
    account = uuid.uuid4()
    started = asyncio.Event()

    async def request() -> None:
        admission = await fairness.admit(account)
        with admission.running():
            started.set()
            await asyncio.sleep(30)

    running = asyncio.create_task(request())
    await started.wait()
    waiting = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    assert fairness.requests.held(account) == 1
    waiting.cancel()
    running.cancel()
    for task in (waiting, running):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert fairness.requests.held(account) == 0 and not fairness.requests._slots


@pytest.mark.settings(
    max_requests_per_account=1, max_turns_per_account=1, account_queue_seconds=0.5
)
async def test_a_conversation_handed_in_over_mcp_holds_a_turns_place(
    state: AppState, http: httpx.AsyncClient, model_server: OpenAIServer
) -> None:
    account, token = await tenant(state, "a")
    agent = await make_agent_id(state, caller(account, EVERYTHING), harness=memory_harness())
    model_server.call_tools(("remember", {"candidates": []}), delay=3, purpose="memory")
    said = {"messages": [{"role": "user", "content": "My flight is on Friday"}]}
    remember = _rpc("tools/call", name="remember_conversation", arguments=said)
    url, headers = f"/mcp/{agent}?session=s1", _mcp_headers(token)
    reviewing = asyncio.create_task(http.post(url, json=remember, headers=headers))
    await eventually(lambda: model_server.chat_requests("memory"), "the review asks its model")
    # The review waits on its model holding a turn's place: A's requests have theirs.
    answered(await Client(http, token).post(SMALL))
    again = await http.post(url, json=remember, headers=headers)
    assert again.status_code == 200, again.text  # a tool's refusal, which the agent reads
    result = again.json()["result"]
    assert result["isError"] is True
    refusal = json.loads(result["content"][0]["text"])
    assert refusal["code"] == "TOO_MANY_REQUESTS"
    assert "already has 1 turn in progress here" in refusal["error"]
    done = await reviewing
    assert done.json()["result"]["isError"] is False, done.text


# --- who takes the pool's connections (app/db/pool.py `Connections`) ----------------------------


def _taking(connections: Connections, share: Share | None) -> "asyncio.Task[None]":
    return asyncio.create_task(connections.take(share))


async def test_an_account_holding_none_takes_a_connection_before_those_holding_some() -> None:
    connections = Connections(4)
    a, b, c, d = (Share(name, 2) for name in "abcd")
    for share in (a, a, c):
        await connections.take(share)
    # C holds one: its second would leave none free, so it waits; A waits for its own share.
    c_second, a_third = _taking(connections, c), _taking(connections, a)
    await asyncio.sleep(0)
    assert not c_second.done() and not a_third.done()
    # D, holding none, takes the free one at once.
    await asyncio.wait_for(connections.take(d), 1)
    assert connections.in_use == 4
    # The pool is full: B waits too, behind C and A...
    b_first = _taking(connections, b)
    await asyncio.sleep(0)
    assert not b_first.done()
    # ...and takes the first connection given back, holding none.
    connections.give_back(a)
    await asyncio.sleep(0)
    assert b_first.done() and not c_second.done() and not a_third.done()
    # A newcomer holding none finds the pool full: it takes nothing B was given (no barging).
    assert connections.in_use == 4 and connections.held("b") == 1
    e_first = _taking(connections, Share("e", 2))
    await asyncio.sleep(0)
    assert not e_first.done()
    # Then: E holds none; C and A one each, C waiting the longer.
    connections.give_back(d)
    await asyncio.sleep(0)
    assert e_first.done() and not c_second.done() and not a_third.done()
    connections.give_back(b)  # one free: the reserve, which neither C nor A may take
    await asyncio.sleep(0)
    assert not c_second.done() and not a_third.done()
    connections.give_back(Share("e", 2))
    await asyncio.sleep(0)
    assert c_second.done() and not a_third.done()
    assert (connections.in_use, connections.held("c"), connections.held("a")) == (3, 2, 1)
    connections.give_back(c)
    await asyncio.sleep(0)
    assert a_third.done()
    for share in (a, a, c):
        connections.give_back(share)
    assert connections.in_use == 0 and not connections._held and not connections._waiting


async def test_unshared_work_and_a_tasks_second_connection_take_the_reserve_first() -> None:
    """Work without a share (or a second connection of a task holding one, which acquires
    without its share) is never held back by a share or the reserve: a task holding the
    connections it waits on never waits for itself."""
    connections = Connections(3)
    a = Share("a", 3)
    await connections.take(a)
    await connections.take(a)
    waiting = _taking(connections, a)  # would leave none free
    await asyncio.sleep(0)
    assert not waiting.done()
    await asyncio.wait_for(connections.take(None), 1)  # takes the last one at once
    second = _taking(connections, None)
    b = _taking(connections, Share("b", 3))
    await asyncio.sleep(0)
    connections.give_back(a)
    await asyncio.sleep(0)
    assert second.done() and not b.done()  # unshared first, then B holding none
    connections.give_back(None)
    await asyncio.sleep(0)
    assert b.done() and not waiting.done()


async def test_a_cancelled_wait_for_a_connection_takes_nothing() -> None:
    connections = Connections(1)
    a, b = Share("a", 1), Share("b", 1)
    await connections.take(a)
    waiter = _taking(connections, b)
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # Given leave just as it was cancelled: it passes the connection on.
    c = Share("c", 1)
    waiter, after = _taking(connections, b), _taking(connections, c)
    await asyncio.sleep(0)
    connections.give_back(a)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(after, 1)
    connections.give_back(c)
    # Cancelled, and passed over by a give back before it ran again.
    await connections.take(a)
    waiter = _taking(connections, b)
    await asyncio.sleep(0)
    waiter.cancel()
    connections.give_back(a)
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert connections.in_use == 0 and not connections._held
    assert not connections._waiting and not connections._first
