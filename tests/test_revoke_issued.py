"""After a leak, one call revokes every token the leaked one issued, in turn
(`revokeTokensIssuedBy`, `engram client revoke-issued`): the tokens whose `issuedByTokenId` is
its, those whose `issuedByTokenId` is one of theirs, and so on, across the accounts the caller
reaches, even once the leaked token itself is revoked; nothing else. Another reads them first,
revoking nothing (`tokensIssuedBy`, `engram client issued`)."""

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import httpx
import pytest
from helpers import eventually, holding
from servers import clean_env, run

from app.auth import service, store

BOOTSTRAP = "revoke-issued-bootstrap-token-0123456789"
CREATE_ACCOUNT = "mutation($n: String!) { createAccount(input: {name: $n}) { accountId } }"
CREATE_CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { principal } }"
CREATE_TOKEN = """mutation($p: String!, $a: UUID) {
  createClientToken(principal: $p, accountId: $a) { token tokenId } }"""
REVOKE = """mutation($p: String!, $t: UUID!, $a: UUID) {
  revokeClientToken(principal: $p, tokenId: $t, accountId: $a) { tokenId } }"""
REVOKE_ISSUED = """mutation($t: UUID!) {
  revokeTokensIssuedBy(tokenId: $t) { tokenId issuedByTokenId } }"""
ISSUED = """query($t: UUID!, $n: Int!, $after: String) {
  tokensIssuedBy(tokenId: $t, first: $n, after: $after) {
    nodes { tokenId accountId principal issuedByTokenId }
    pageInfo { hasNextPage endCursor } } }"""
VIEWER = "{ viewer { principal tokenId } }"
ALL_OF_IT = {
    "effect": "ALLOW",
    "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"],
    "resources": ["financial.*"],
}
SOME = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}

pytestmark = pytest.mark.settings(bootstrap_token=BOOTSTRAP)


async def send(url: str, token: str, query: str, **variables: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return await http.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
        )


async def post(url: str, token: str, query: str, **variables: Any) -> dict[str, Any]:
    """A GraphQL operation over HTTP that must succeed; its data."""
    answer = await send(url, token, query, **variables)
    assert answer.status_code == 200, answer.text
    assert not answer.json().get("errors"), answer.text
    return answer.json()["data"]


async def works(url: str, token: str) -> bool:
    """Whether a request sending `token` is served (not UNAUTHENTICATED)."""
    answer = await send(url, token, VIEWER)
    if answer.status_code == 401:
        assert answer.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        return False
    assert answer.status_code == 200, answer.text
    return True


async def client(url: str, token: str, principal: str, account: str | None, *policies: dict):
    made = {"principal": principal, "name": principal, "policies": list(policies)}
    if account is not None:
        made["accountId"] = account
    await post(url, token, CREATE_CLIENT, input=made)


async def issue(url: str, token: str, principal: str, account: str | None = None) -> dict:
    """A token for the client, issued by the request that sends `token`: {token, tokenId}."""
    return (await post(url, token, CREATE_TOKEN, p=principal, a=account))["createClientToken"]


async def account(url: str, name: str) -> str:
    return (await post(url, BOOTSTRAP, CREATE_ACCOUNT, n=name))["createAccount"]["accountId"]


async def chain(url: str) -> dict[str, Any]:
    """In the default account, `ops` and `deputy` (every grant) and `bot`; in account `acme`,
    `acme-admin` (every grant) and `bot`. The leaked token `a` (ops's, the bootstrap token's
    issue) issued `b` (deputy's), which issued `c` (bot's), and `e` in acme (acme-admin's),
    which issued `f` (acme's bot's). `d` (bot's) and `g` (acme-admin's) the bootstrap token
    issued: outside the chain."""
    acme = await account(url, "acme")
    await client(url, BOOTSTRAP, "ops", None, ALL_OF_IT)
    await client(url, BOOTSTRAP, "deputy", None, ALL_OF_IT)
    await client(url, BOOTSTRAP, "bot", None, SOME)
    await client(url, BOOTSTRAP, "acme-admin", acme, ALL_OF_IT)
    await client(url, BOOTSTRAP, "bot", acme, SOME)
    made: dict[str, Any] = {"acme": acme}
    made["a"] = await issue(url, BOOTSTRAP, "ops")
    made["b"] = await issue(url, made["a"]["token"], "deputy")
    made["c"] = await issue(url, made["b"]["token"], "bot")
    made["e"] = await issue(url, made["a"]["token"], "acme-admin", acme)
    made["f"] = await issue(url, made["e"]["token"], "bot")
    made["d"] = await issue(url, BOOTSTRAP, "bot")
    made["g"] = await issue(url, BOOTSTRAP, "acme-admin", acme)
    return made


async def test_a_leaked_token_revoked_first_takes_every_token_it_issued_in_turn(base_url):
    made = await chain(base_url)
    leaked = made["a"]["tokenId"]
    await post(base_url, BOOTSTRAP, REVOKE, p="ops", t=leaked)
    assert not await works(base_url, made["a"]["token"])
    assert all([await works(base_url, made[k]["token"]) for k in "bcef"])

    revoked = (await post(base_url, BOOTSTRAP, REVOKE_ISSUED, t=leaked))["revokeTokensIssuedBy"]
    # Oldest first; across accounts for the operator.
    issuer = {k: made[i]["tokenId"] for k, i in zip("bcef", "abae", strict=True)}
    assert revoked == [
        {"tokenId": made[k]["tokenId"], "issuedByTokenId": issuer[k]} for k in "bcef"
    ]
    for k in "bcef":
        assert not await works(base_url, made[k]["token"]), k
    for k in "dg":
        assert await works(base_url, made[k]["token"]), k
    assert await works(base_url, BOOTSTRAP)
    # Again: nothing left to revoke, an empty answer, not an error.
    assert (await post(base_url, BOOTSTRAP, REVOKE_ISSUED, t=leaked)) == {
        "revokeTokensIssuedBy": []
    }


async def test_the_named_token_goes_too_when_it_is_still_there(base_url):
    made = await chain(base_url)
    revoked = (await post(base_url, BOOTSTRAP, REVOKE_ISSUED, t=made["b"]["tokenId"]))[
        "revokeTokensIssuedBy"
    ]
    assert [t["tokenId"] for t in revoked] == [made["b"]["tokenId"], made["c"]["tokenId"]]
    assert not await works(base_url, made["b"]["token"])
    assert not await works(base_url, made["c"]["token"])
    for k in "aefdg":
        assert await works(base_url, made[k]["token"]), k


async def test_a_tenant_revokes_in_its_own_account_alone(base_url):
    """A tenant's client follows the tokens its own account's clients issued: naming the
    operator's token, whose issue reached its account, or another tenant's, revokes nothing
    and says nothing of them; its own chain it revokes."""
    made = await chain(base_url)
    tenant = made["g"]["token"]  # acme-admin's, the operator's issue
    await client(base_url, tenant, "deputy", None, ALL_OF_IT)
    own = await issue(base_url, tenant, "deputy")
    under = await issue(base_url, own["token"], "bot")
    globex = await account(base_url, "globex")
    await client(base_url, BOOTSTRAP, "globex-admin", globex, ALL_OF_IT)
    await client(base_url, BOOTSTRAP, "bot", globex, SOME)
    theirs = await issue(base_url, BOOTSTRAP, "globex-admin", globex)
    theirs_issued = await issue(base_url, theirs["token"], "bot")

    for named in (made["a"], made["e"], theirs):
        answer = await post(base_url, tenant, REVOKE_ISSUED, t=named["tokenId"])
        if named is made["e"]:
            # acme-admin's own token, revoked, and what it issued in acme; the operator's
            # token that issued e is not shown to the tenant.
            assert answer["revokeTokensIssuedBy"] == [
                {"tokenId": made["e"]["tokenId"], "issuedByTokenId": None},
                {"tokenId": made["f"]["tokenId"], "issuedByTokenId": made["e"]["tokenId"]},
            ]
        else:
            assert answer == {"revokeTokensIssuedBy": []}
    for token in (made["a"], made["b"], made["c"], made["d"], theirs, theirs_issued, own, under):
        assert await works(base_url, token["token"]), token
    assert not await works(base_url, made["e"]["token"])
    assert not await works(base_url, made["f"]["token"])

    answer = await post(base_url, tenant, REVOKE_ISSUED, t=own["tokenId"])
    assert [t["tokenId"] for t in answer["revokeTokensIssuedBy"]] == [
        own["tokenId"],
        under["tokenId"],
    ]
    assert not await works(base_url, own["token"]) and not await works(base_url, under["token"])
    assert await works(base_url, tenant)


async def test_it_needs_the_grant_revoke_client_token_needs(base_url):
    made = await chain(base_url)
    acme = made["acme"]
    denied = {"effect": "DENY", "actions": ["DELETE"], "resources": ["financial.Client.token"]}
    await client(base_url, BOOTSTRAP, "auditor", acme, ALL_OF_IT, denied)
    auditor = (await issue(base_url, BOOTSTRAP, "auditor", acme))["token"]
    e = made["e"]["tokenId"]

    single = await send(base_url, auditor, REVOKE, p="acme-admin", t=e)
    every = await send(base_url, auditor, REVOKE_ISSUED, t=e)
    for answer in (single, every):
        (error,) = answer.json()["errors"]
        assert error["extensions"]["code"] == "ACCESS_DENIED", error
        assert "DELETE financial.Client.token" in error["message"]
    assert await works(base_url, made["e"]["token"]) and await works(base_url, made["f"]["token"])


async def issued_by(url: str, token: str, token_id: str, first: int = 1000) -> list[dict]:
    """tokensIssuedBy(tokenId), every page of `first`."""
    found: list[dict] = []
    after = None
    while True:
        page = (await post(url, token, ISSUED, t=token_id, n=first, after=after))["tokensIssuedBy"]
        found += page["nodes"]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]


async def test_reading_what_a_token_issued_lists_its_chain_and_revokes_nothing(base_url):
    """tokensIssuedBy answers, oldest first and across accounts for the operator, exactly the
    tokens revokeTokensIssuedBy then revokes, each with its client, and leaves them working."""
    made = await chain(base_url)
    acme = made["acme"]
    bootstrap = (await post(base_url, BOOTSTRAP, VIEWER))["viewer"]["tokenId"]
    issuer = {k: made[i]["tokenId"] for k, i in zip("bcef", "abae", strict=True)}
    issuer["a"] = bootstrap
    client_of = {"a": "ops", "b": "deputy", "c": "bot", "e": "acme-admin", "f": "bot"}
    listed = await issued_by(base_url, BOOTSTRAP, made["a"]["tokenId"])
    assert [(t["tokenId"], t["principal"], t["issuedByTokenId"]) for t in listed] == [
        (made[k]["tokenId"], client_of[k], issuer[k]) for k in "abcef"
    ]
    accounts = [t["accountId"] for t in listed]
    assert accounts[3:] == [acme, acme] and acme not in accounts[:3]
    # Paged one by one, the same list.
    assert await issued_by(base_url, BOOTSTRAP, made["a"]["tokenId"], first=1) == listed
    for k in "abcefdg":
        assert await works(base_url, made[k]["token"]), k

    await post(base_url, BOOTSTRAP, REVOKE, p="ops", t=made["a"]["tokenId"])
    listed = await issued_by(base_url, BOOTSTRAP, made["a"]["tokenId"])
    assert [t["tokenId"] for t in listed] == [made[k]["tokenId"] for k in "bcef"]
    revoked = (await post(base_url, BOOTSTRAP, REVOKE_ISSUED, t=made["a"]["tokenId"]))[
        "revokeTokensIssuedBy"
    ]
    assert [t["tokenId"] for t in revoked] == [t["tokenId"] for t in listed]
    assert await issued_by(base_url, BOOTSTRAP, made["a"]["tokenId"]) == []


async def test_a_tenant_reads_what_a_token_issued_in_its_own_account_alone(base_url):
    """As it revokes: the operator's token, whose issue reached its account, and another
    tenant's answer nothing; its own token the tokens it issued in its account."""
    made = await chain(base_url)
    tenant = made["g"]["token"]  # acme-admin's, the operator's issue
    globex = await account(base_url, "globex")
    await client(base_url, BOOTSTRAP, "globex-admin", globex, ALL_OF_IT)
    await client(base_url, BOOTSTRAP, "bot", globex, SOME)
    theirs = await issue(base_url, BOOTSTRAP, "globex-admin", globex)
    await issue(base_url, theirs["token"], "bot")
    for named in (made["a"], made["b"], theirs):
        assert await issued_by(base_url, tenant, named["tokenId"]) == [], named
    listed = await issued_by(base_url, tenant, made["e"]["tokenId"])
    assert listed == [
        {
            "tokenId": made["e"]["tokenId"],
            "accountId": made["acme"],
            "principal": "acme-admin",
            "issuedByTokenId": None,  # the operator's token, not shown to the tenant
        },
        {
            "tokenId": made["f"]["tokenId"],
            "accountId": made["acme"],
            "principal": "bot",
            "issuedByTokenId": made["e"]["tokenId"],
        },
    ]
    assert await works(base_url, made["e"]["token"]) and await works(base_url, made["f"]["token"])


async def test_a_cursor_of_what_a_token_issued_pages_only_the_list_it_came_from(base_url):
    """A chain's cursor pages that chain as its caller's account reaches it: another token's
    chain, or the same token's read from another account (which reaches other tokens), refuses
    it rather than paging from a place it never reached."""
    made = await chain(base_url)
    tenant = made["g"]["token"]
    page = (await post(base_url, BOOTSTRAP, ISSUED, t=made["e"]["tokenId"], n=1))["tokensIssuedBy"]
    cursor = page["pageInfo"]["endCursor"]
    assert page["pageInfo"]["hasNextPage"]
    for token, named in [(BOOTSTRAP, made["a"]), (tenant, made["e"])]:
        answer = await send(base_url, token, ISSUED, t=named["tokenId"], n=1, after=cursor)
        (error,) = answer.json()["errors"]
        assert error["extensions"]["code"] == "BAD_REQUEST", (named, error)
    # Its own next page, as it reaches it.
    mine = await post(base_url, tenant, ISSUED, t=made["e"]["tokenId"], n=1)
    after = mine["tokensIssuedBy"]["pageInfo"]["endCursor"]
    rest = await post(base_url, tenant, ISSUED, t=made["e"]["tokenId"], n=1, after=after)
    assert [t["tokenId"] for t in rest["tokensIssuedBy"]["nodes"]] == [made["f"]["tokenId"]]


async def test_reading_what_a_token_issued_needs_the_grant_reading_tokens_needs(base_url):
    """SELECT on financial.Client.token, as Client.tokens: a client that may revoke but not read
    tokens is refused; one that may read but not revoke reads."""
    made = await chain(base_url)
    acme = made["acme"]
    no_read = {"effect": "DENY", "actions": ["SELECT"], "resources": ["financial.Client.token"]}
    no_delete = {"effect": "DENY", "actions": ["DELETE"], "resources": ["financial.Client.token"]}
    await client(base_url, BOOTSTRAP, "revoker", acme, ALL_OF_IT, no_read)
    await client(base_url, BOOTSTRAP, "reader", acme, ALL_OF_IT, no_delete)
    revoker = (await issue(base_url, BOOTSTRAP, "revoker", acme))["token"]
    reader = (await issue(base_url, BOOTSTRAP, "reader", acme))["token"]

    answer = await send(base_url, revoker, ISSUED, t=made["e"]["tokenId"], n=10)
    (error,) = answer.json()["errors"]
    assert error["extensions"]["code"] == "ACCESS_DENIED", error
    assert "SELECT financial.Client.token" in error["message"]
    listed = await issued_by(base_url, reader, made["e"]["tokenId"])
    assert [t["tokenId"] for t in listed] == [made[k]["tokenId"] for k in "ef"]


async def test_the_command_lists_what_a_token_issued_revoking_nothing(base_url, db_url, tmp_path):
    made = await chain(base_url)
    await post(base_url, BOOTSTRAP, REVOKE, p="ops", t=made["a"]["tokenId"])
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))

    ran = await asyncio.to_thread(run, env, "client", "issued", made["a"]["tokenId"])
    assert ran.returncode == 0, ran.stderr
    printed = json.loads(ran.stdout)["issued"]
    assert [(t["principal"], t["tokenId"]) for t in printed] == [
        ("deputy", made["b"]["tokenId"]),
        ("bot", made["c"]["tokenId"]),
        ("acme-admin", made["e"]["tokenId"]),
        ("bot", made["f"]["tokenId"]),
    ]
    assert [t["accountId"] for t in printed][2:] == [made["acme"]] * 2
    assert printed[0]["issuedByTokenId"] == made["a"]["tokenId"]
    assert printed[0].keys() >= {"prefix", "created", "lastUsed", "expires", "issuedBy"}
    for k in "bcefdg":
        assert await works(base_url, made[k]["token"]), k
    # What revoke-issued then prints, as it prints it.
    gone = await asyncio.to_thread(run, env, "client", "revoke-issued", made["a"]["tokenId"])
    assert gone.returncode == 0, gone.stderr
    revoked = json.loads(gone.stdout)["revoked"]
    assert [t["tokenId"] for t in revoked] == [t["tokenId"] for t in printed]
    again = await asyncio.to_thread(run, env, "client", "issued", made["a"]["tokenId"])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"issued": []}


async def test_the_command_revokes_what_a_token_issued_and_prints_it(base_url, db_url, tmp_path):
    made = await chain(base_url)
    await post(base_url, BOOTSTRAP, REVOKE, p="ops", t=made["a"]["tokenId"])
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"))

    ran = await asyncio.to_thread(run, env, "client", "revoke-issued", made["a"]["tokenId"])
    assert ran.returncode == 0, ran.stderr
    printed = json.loads(ran.stdout)["revoked"]
    assert [(t["principal"], t["tokenId"]) for t in printed] == [
        ("deputy", made["b"]["tokenId"]),
        ("bot", made["c"]["tokenId"]),
        ("acme-admin", made["e"]["tokenId"]),
        ("bot", made["f"]["tokenId"]),
    ]
    assert [t["accountId"] for t in printed][2:] == [made["acme"]] * 2
    assert printed[0]["issuedByTokenId"] == made["a"]["tokenId"]
    for k in "bcef":
        assert not await works(base_url, made[k]["token"]), k
    assert await works(base_url, made["d"]["token"]) and await works(base_url, made["g"]["token"])

    again = await asyncio.to_thread(run, env, "client", "revoke-issued", made["a"]["tokenId"])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"revoked": []}


async def test_a_token_the_chain_issues_while_it_is_revoked_goes_too(state, admin, db_url):
    """A token of the chain issuing another while the chain is revoked holds itself locked, as
    createClientToken does, and commits the new token after the walk read the chain: its delete
    waits for that, and the walk goes round again from it, taking the new token too."""
    for principal, policies in (("ops", [ALL_OF_IT]), ("deputy", []), ("bot", [])):
        await service.create_client(
            state.pool,
            admin,
            account_id=None,
            principal=principal,
            name=principal,
            policies=policies,
        )
    a = await service.issue_client_token(state.pool, admin, account_id=None, principal="ops")
    ops = await service.authenticate(state.pool, f"Bearer {a.token}")
    b = await service.issue_client_token(state.pool, ops, account_id=None, principal="deputy")

    async def waiting() -> bool:
        async with state.pool.acquire() as conn:
            return await conn.fetchval(
                "SELECT count(*) > 0 FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )

    lock = "SELECT FROM client_tokens WHERE token_id = $1 FOR SHARE"
    async with holding(db_url, lock, b.info.token_id) as issuing:
        revoking = asyncio.create_task(
            service.revoke_tokens_issued_by(state.pool, admin, token_id=a.info.token_id)
        )
        await eventually(waiting, "the revocation waiting for the issuing token")
        c = await store.insert_token(
            issuing,
            service.hash_token("issued meanwhile"),
            admin.account_id,
            "bot",
            issued_by="deputy",
            issued_by_account=admin.account_id,
            issued_by_token=b.info.token_id,
        )
    revoked = await revoking
    assert [t.token_id for t in revoked] == [a.info.token_id, b.info.token_id, c["token_id"]]
    async with state.pool.acquire() as conn:
        assert (
            await conn.fetchval("SELECT count(*) FROM client_tokens WHERE principal = 'bot'") == 0
        )


async def test_tokens_naming_each_other_as_issuers_are_walked_once(state, admin):
    """No request can make such rows (a token's issuer exists before it), but a restore or a
    hand-made fix could: the walk ends, and revokes each once."""
    await service.create_client(
        state.pool, admin, account_id=None, principal="bot", name="bot", policies=[]
    )
    ids = []
    async with state.pool.acquire() as conn:
        for value in ("first", "second"):
            row = await store.insert_token(
                conn, service.hash_token(value), admin.account_id, "bot", issued_by="bot"
            )
            ids.append(row["token_id"])
        for token, issuer in ((ids[0], ids[1]), (ids[1], ids[0])):
            await conn.execute(
                "UPDATE client_tokens SET issued_by_account = $1, issued_by_token = $2"
                " WHERE token_id = $3",
                admin.account_id,
                issuer,
                token,
            )
    revoked = await service.revoke_tokens_issued_by(state.pool, admin, token_id=ids[0])
    assert sorted(t.token_id for t in revoked) == sorted(ids)


async def test_a_revocation_that_deadlocks_with_another_starts_again(state, admin, db_url):
    """Two revocations of overlapping chains can each hold a token the other deletes next:
    PostgreSQL rolls one back (here the revocation: the other side waits longer before it
    checks), which starts again once the other is done, rather than failing as INTERNAL."""
    await service.create_client(
        state.pool, admin, account_id=None, principal="bot", name="bot", policies=[]
    )
    ids: list[Any] = []
    async with state.pool.acquire() as conn:
        for value in ("a", "b", "c"):
            row = await store.insert_token(
                conn,
                service.hash_token(f"deadlock {value}"),
                admin.account_id,
                "bot",
                issued_by="bot",
                issued_by_account=admin.account_id if ids else None,
                issued_by_token=ids[-1] if ids else None,
            )
            ids.append(row["token_id"])

    async def waiting() -> bool:
        async with state.pool.acquire() as conn:
            return await conn.fetchval(
                "SELECT count(*) > 0 FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )

    other = await asyncpg.connect(db_url)
    try:
        async with other.transaction():
            await other.execute("SET LOCAL deadlock_timeout = '30s'")
            await other.execute("SELECT FROM client_tokens WHERE token_id = $1 FOR UPDATE", ids[-1])
            revoking = asyncio.create_task(
                service.revoke_tokens_issued_by(state.pool, admin, token_id=ids[0])
            )
            await eventually(waiting, "the revocation waiting for the last token")
            # The tokens the revocation deleted before it waited: a deadlock, which it loses.
            await other.execute(
                "SELECT FROM client_tokens WHERE token_id = any($1::uuid[]) FOR UPDATE", ids[:-1]
            )
            assert not revoking.done()
    finally:
        await other.close()
    revoked = await revoking
    assert [t.token_id for t in revoked] == ids


@pytest.mark.settings(statement_timeout_seconds=3)
async def test_a_long_chain_a_leaked_token_made_is_revoked_within_the_statement_timeout(
    state, admin
):
    """A leaked token can make a chain as long as it likes, each token issuing the next: each
    step of the walk is a lookup of the tokens one issued (migration 0038), not a read of the
    account's every token, which made 10,000 steps cost minutes past the statement timeout."""
    await service.create_client(
        state.pool, admin, account_id=None, principal="bot", name="bot", policies=[]
    )
    async with state.pool.acquire() as conn:
        ids = await conn.fetchval(
            """
            WITH made AS (
                SELECT i, gen_random_uuid() AS token_id FROM generate_series(0, 9999) i
            ), chained AS (
                SELECT i, token_id, lag(token_id) OVER (ORDER BY i) AS issuer FROM made
            ), stored AS (
                INSERT INTO client_tokens (account_id, principal, token_hash, token_id, issued_by,
                                           issued_by_account, issued_by_token, created)
                SELECT $1, 'bot', sha256(token_id::text::bytea), token_id, 'bot', $1, issuer,
                       now() + i * interval '1 ms'
                FROM chained
                RETURNING token_id, created
            )
            SELECT array_agg(token_id ORDER BY created) FROM stored
            """,
            admin.account_id,
        )
    # Read first, a page at a time (tokensIssuedBy's `first` is at most 1,000): the same walk.
    page = await service.list_tokens_issued_by(state.pool, admin, token_id=ids[0], limit=1001)
    assert [t.token_id for t in page] == ids[:1001]
    last = page[999]
    after = await service.list_tokens_issued_by(
        state.pool, admin, token_id=ids[0], after=(last.created, last.token_id), limit=1001
    )
    assert [t.token_id for t in after] == ids[1000:2001]
    revoked = await service.revoke_tokens_issued_by(state.pool, admin, token_id=ids[0])
    assert [t.token_id for t in revoked] == ids


async def test_a_revoked_bootstrap_token_stays_revoked_at_a_start_with_the_same_setting(
    state, admin, caplog
):
    """Revoking the bootstrap token and what it issued holds when the service starts again with
    ENGRAM_BOOTSTRAP_TOKEN unchanged: the start leaves the value revoked and logs a warning
    (never the token); a new value works (docs/access.md)."""
    from app.errors import Unauthenticated

    await service.bootstrap_admin(state.pool, BOOTSTRAP)
    leaked = await service.authenticate(state.pool, f"Bearer {BOOTSTRAP}")
    await service.create_client(
        state.pool, admin, account_id=None, principal="ops", name="ops", policies=[ALL_OF_IT]
    )
    issued = await service.issue_client_token(state.pool, leaked, account_id=None, principal="ops")
    revoked = await service.revoke_tokens_issued_by(state.pool, admin, token_id=leaked.token_id)
    assert [t.token_id for t in revoked] == [leaked.token_id, issued.info.token_id]
    for token in (BOOTSTRAP, issued.token):
        with pytest.raises(Unauthenticated):
            await service.authenticate(state.pool, f"Bearer {token}")

    caplog.clear()
    await service.bootstrap_admin(state.pool, BOOTSTRAP)  # a start, the setting unchanged
    for token in (BOOTSTRAP, issued.token):
        with pytest.raises(Unauthenticated):
            await service.authenticate(state.pool, f"Bearer {token}")
    (warning,) = [r for r in caplog.records if "ENGRAM_BOOTSTRAP_TOKEN" in r.getMessage()]
    assert warning.levelname == "WARNING" and "stays revoked" in warning.getMessage()
    assert BOOTSTRAP not in caplog.text and BOOTSTRAP[:8] not in caplog.text

    await service.bootstrap_admin(state.pool, "revoke-issued-new-bootstrap-token-9876543210")
    await service.authenticate(state.pool, "Bearer revoke-issued-new-bootstrap-token-9876543210")
    with pytest.raises(Unauthenticated):
        await service.authenticate(state.pool, f"Bearer {BOOTSTRAP}")


class _Explained:
    """A connection that runs a store's statement as EXPLAIN ANALYZE, and keeps its plan."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.plan: dict[str, Any] = {}

    async def fetchval(self, sql: str, *args: Any) -> Any:
        explained = await self.conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
        self.plan = explained[0]["Plan"]  # (decoded by the pool's json codec)
        return None


def _token_reads(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's scans of client_tokens and of its indexes."""
    found = (
        [plan]
        if "client_tokens" in (plan.get("Index Name") or plan.get("Relation Name") or "")
        else []
    )
    for child in plan.get("Plans", []):
        found += _token_reads(child)
    return found


async def test_a_token_and_the_accounts_it_issued_in_are_found_by_index_lookups(state):
    """A request's lock on its own token (`lock_token`, in every write a token's caller makes)
    and the accounts a walk from a token looks in (`accounts_issued_from`) named no column an
    index leads with: PostgreSQL 18 skipped through (account, client, token) once per client,
    1.5 to 3.9 ms at 200,000 tokens of 200 clients (an older one reads the whole index). Each is
    one lookup per index now (migration 0040; its figures there)."""
    accounts = [uuid.uuid4() for _ in range(3)]
    async with state.pool.acquire() as conn:
        for n, account in enumerate(accounts):
            await conn.execute(
                "INSERT INTO accounts (account_id, name) VALUES ($1, $2)", account, f"plans {n}"
            )
            await conn.execute(
                "INSERT INTO clients (account_id, principal, name) "
                "SELECT $1, 'c' || n, 'c' || n FROM generate_series(1, 30) n",
                account,
            )
            await conn.execute(
                """
                INSERT INTO client_tokens (token_hash, account_id, principal, prefix)
                SELECT sha256(convert_to($1::uuid::text || n, 'UTF8')), $1, 'c' || (n % 30 + 1),
                       'eng_'
                FROM generate_series(1, 600) n
                """,
                account,
            )
        issuer, account, principal = await conn.fetchrow(
            "SELECT token_id, account_id, principal FROM client_tokens WHERE account_id = $1 "
            "LIMIT 1",
            accounts[1],
        )
        await conn.execute(
            "UPDATE client_tokens SET issued_by_token = $1 WHERE account_id = $2 AND token_hash IN "
            "(SELECT token_hash FROM client_tokens WHERE account_id = $2 LIMIT 5)",
            issuer,
            accounts[2],
        )
        await conn.execute("ANALYZE client_tokens")
        explained = _Explained(conn)
        async with conn.transaction():
            # As a table of many tokens is read: not in a sequential scan of a few pages.
            await conn.execute("SET LOCAL enable_seqscan = off")
            await store.lock_token(explained, account, principal, issuer)
            locked = _token_reads(explained.plan)
            await store.accounts_issued_from(explained, [issuer])
            walked = _token_reads(explained.plan)
    # One search of an index whose key leads to the token (its ID, or its account, client and
    # ID), not a skip through (or a read of) one whose first column was not given.
    [lock] = locked
    assert lock["Index Name"] == "client_tokens_token" or (
        lock["Index Name"] == "client_tokens_id" and "account_id = " in lock["Index Cond"]
    )
    assert (lock["Index Searches"], lock.get("Rows Removed by Filter", 0)) == (1, 0)
    assert f"token_id = '{issuer}'::uuid" in lock["Index Cond"]
    assert sorted(
        (r["Node Type"], r.get("Index Name", ""), r.get("Index Cond", "")) for r in walked
    ) == [
        ("Bitmap Heap Scan", "", ""),
        (
            "Bitmap Index Scan",
            "client_tokens_issued_by",
            f"(issued_by_token = ANY ('{{{issuer}}}'::uuid[]))",
        ),
        ("Bitmap Index Scan", "client_tokens_token", f"(token_id = ANY ('{{{issuer}}}'::uuid[]))"),
    ]
