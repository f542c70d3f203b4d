"""Tokens verified in the last second answer GraphQL requests without a lookup
(app/auth/verified.py): a revocation through this process still takes effect at once, one
made elsewhere within VERIFIED_SECONDS, and a token's expiry is never outlived."""

import asyncio
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from factories import allow
from helpers import db_settings
from servers import serving

from app.auth import service, store, verified
from app.db.pool import Share, drawing_on
from app.errors import Unauthenticated

ADMIN = "verified-tokens-admin-token-0123456789"
VIEWER = {"query": "{ viewer { principal } }"}
CREATE_CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { principal } }"
CREATE_TOKEN = """mutation($p: String!, $e: Timestamp) {
  createClientToken(principal: $p, expires: $e) { token tokenId } }"""
REVOKE = """mutation($p: String!, $t: UUID!) {
  revokeClientToken(principal: $p, tokenId: $t) { tokenId } }"""
UPDATE_CLIENT = """mutation($p: String!, $input: ClientUpdateInput!) {
  updateClient(principal: $p, input: $input) { principal } }"""
DELETE_CLIENT = "mutation($p: String!) { deleteClient(principal: $p) { principal } }"
READ_CLIENTS = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["*"]}
ALLOWED = """{ viewer { allowed(operations: ["client"]) { allowed } } }"""


class Api:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def post(self, token: str, body: dict) -> httpx.Response:
        return await self.http.post(
            "/graphql", json=body, headers={"Authorization": f"Bearer {token}"}
        )

    async def admin(self, query: str, **variables: object) -> dict:
        answer = (await self.post(ADMIN, {"query": query, "variables": variables})).json()
        assert not answer.get("errors"), answer
        return answer["data"]

    async def bot_token(self, expires: datetime | None = None) -> tuple[str, str]:
        issued = await self.admin(CREATE_TOKEN, p="bot", e=expires.isoformat() if expires else None)
        return issued["createClientToken"]["token"], issued["createClientToken"]["tokenId"]

    async def status(self, token: str) -> tuple[int, str | None]:
        answer = await self.post(token, VIEWER)
        errors = answer.json().get("errors")
        return answer.status_code, errors[0]["message"] if errors else None


async def with_api(db_url, embedder, test) -> None:
    with serving(db_settings(db_url, bootstrap_token=ADMIN), embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            api = Api(http)
            client = {"principal": "bot", "name": "Bot", "policies": [READ_CLIENTS]}
            await api.admin(CREATE_CLIENT, input=client)
            await test(api)


async def test_a_token_revoked_through_this_process_is_refused_at_once(db_url, embedder):
    async def test(api: Api) -> None:
        token, token_id = await api.bot_token()
        assert await api.status(token) == (200, None)  # verified, and now kept
        await api.admin(REVOKE, p="bot", t=token_id)
        assert await api.status(token) == (401, service.NOT_VALID)

    await with_api(db_url, embedder, test)


async def test_changed_policies_and_a_deleted_client_apply_to_the_next_request(db_url, embedder):
    async def test(api: Api) -> None:
        token, _ = await api.bot_token()
        assert await api.status(token) == (200, None)

        async def may_read_clients() -> bool:
            answer = (await api.post(token, {"query": ALLOWED})).json()
            return answer["data"]["viewer"]["allowed"][0]["allowed"]

        assert await may_read_clients()
        await api.admin(UPDATE_CLIENT, p="bot", input={"policies": []})
        assert not await may_read_clients()
        await api.admin(DELETE_CLIENT, p="bot")
        assert await api.status(token) == (401, service.NOT_VALID)

    await with_api(db_url, embedder, test)


async def test_a_token_revoked_elsewhere_is_refused_within_the_bound(db_url, embedder, state):
    async def test(api: Api) -> None:
        token, token_id = await api.bot_token()
        assert await api.status(token) == (200, None)
        # Another process (another replica, the CLI) deletes it: this one is not told.
        async with state.pool.acquire() as conn:
            await conn.execute("DELETE FROM client_tokens WHERE token_id = $1", token_id)
        await asyncio.sleep(verified.VERIFIED_SECONDS + 0.1)
        assert await api.status(token) == (401, service.NOT_VALID)

    await with_api(db_url, embedder, test)


async def test_a_kept_token_is_not_outlived_by_its_expiry(db_url, embedder):
    async def test(api: Api) -> None:
        # Two seconds: on a loaded machine the token's creation alone once took 0.5 s.
        expires = datetime.now(UTC) + timedelta(seconds=2)
        token, _ = await api.bot_token(expires)
        assert await api.status(token) == (200, None)
        await asyncio.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.05)
        status, message = await api.status(token)
        assert status == 401 and message is not None and "expired" in message, message

    await with_api(db_url, embedder, test)


def test_a_lookup_overtaken_by_a_change_is_not_kept():
    pool, token_hash = object(), b"hash"
    since = verified.generation()
    verified.forget()  # a revocation committed while the lookup ran
    verified.keep(pool, token_hash, "caller", None, since, time.monotonic())
    assert verified.recall(pool, token_hash) is None
    verified.keep(pool, token_hash, "caller", None, verified.generation(), 0.0)
    assert verified.recall(pool, token_hash) is None  # kept a second from long ago: gone


@pytest.mark.parametrize("change", ["revokeClientToken", "deleteClient"])
async def test_a_lookup_while_a_revocation_commits_is_not_kept(state, admin, monkeypatch, change):
    """A request verified between the revocation's write and its commit (the row still there
    for other transactions) was kept, and the token answered for up to a second after
    revokeClientToken or deleteClient returned: each forgets what was kept once it committed."""
    await service.create_client(
        state.pool,
        admin,
        account_id=None,
        principal="bot",
        name="Bot",
        policies=[allow(["SELECT"], "financial.Client.*")],
    )
    issued = await service.issue_client_token(state.pool, admin, account_id=None, principal="bot")
    bearer = f"Bearer {issued.token}"
    await service.authenticate(state.pool, bearer)  # its last use noted: the lookup writes not
    looked_up = []

    def meanwhile(write):
        async def written(*args, **kwargs):
            row = await write(*args, **kwargs)  # in the revocation's transaction, uncommitted
            looked_up.append(await service.authenticate(state.pool, bearer, recent=True))
            return row

        return written

    if change == "revokeClientToken":
        monkeypatch.setattr(store, "delete_token", meanwhile(store.delete_token))
        await service.revoke_client_token(
            state.pool, admin, account_id=None, principal="bot", token_id=issued.info.token_id
        )
    else:
        monkeypatch.setattr(store, "delete_client", meanwhile(store.delete_client))
        await service.delete_client(state.pool, admin, account_id=None, principal="bot")
    assert looked_up and looked_up[0].principal == "bot"  # the token was there meanwhile
    with pytest.raises(Unauthenticated):
        await service.authenticate(state.pool, bearer, recent=True)


async def test_a_flood_of_unknown_tokens_leaves_the_pool_to_known_ones(state, admin):
    """Random tokens sent without pause, each looked up, wait on a share of the pool of their
    own (service.STRANGERS): a known token's lookup and its account's work still find a
    connection. Before, every lookup came first in the pool's line, and a flood of them kept
    the accounts' work waiting for as long as it lasted."""
    await service.create_client(
        state.pool, admin, account_id=None, principal="bot", name="Bot", policies=[]
    )
    issued = await service.issue_client_token(state.pool, admin, account_id=None, principal="bot")
    bearer = f"Bearer {issued.token}"
    await service.authenticate(state.pool, bearer)  # known from now on
    flooding = True
    refused = 0

    async def stranger() -> None:
        nonlocal refused
        while flooding:
            with pytest.raises(Unauthenticated):
                await service.authenticate(state.pool, f"Bearer {service.new_token()}")
            refused += 1

    strangers = [asyncio.create_task(stranger()) for _ in range(40)]
    try:
        await asyncio.sleep(0.2)
        async with asyncio.timeout(10):
            caller = await service.authenticate(state.pool, bearer)
            with drawing_on(Share(caller.account_id, 2)):
                async with state.pool.acquire() as conn:
                    assert await conn.fetchval("SELECT 1") == 1
        assert refused > 0  # the flood was served meanwhile, on its share
        assert state.pool.connections.held(service.STRANGERS) <= 2  # a quarter of 8
    finally:
        flooding = False
        await asyncio.gather(*strangers)
