"""Tokens can be rotated, listed, expired and revoked (issue 11, item 3)."""

import asyncio
import json
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from factories import allow, caller, make_account, make_agent, token_for
from helpers import db_settings, eventually
from openai_server import CHAT
from servers import clean_env, run, serving

from app.auth import service
from app.errors import Unauthenticated

CREATE_CLIENT = "mutation($input: ClientInput!) { createClient(input: $input) { principal } }"
CREATE_TOKEN = """mutation($p: String!, $a: UUID, $e: Timestamp) {
  createClientToken(principal: $p, accountId: $a, expires: $e) {
    token tokenId prefix created expires } }"""
TOKENS = """query($p: String!, $a: UUID, $first: Int! = 100, $after: String) {
  client(principal: $p, accountId: $a) { tokens(first: $first, after: $after) {
    nodes { id tokenId prefix created expires lastUsed bootstrap }
    pageInfo { hasNextPage endCursor } } } }"""
REVOKE = """mutation($p: String!, $t: UUID!, $a: UUID) {
  revokeClientToken(principal: $p, tokenId: $t, accountId: $a) { tokenId prefix } }"""
POLICY = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}
FIRST = "first-bootstrap-token-value-0123456789"
SECOND = "second-bootstrap-token-value-0123456789"


async def bot(gql, admin, state):
    account = await make_account(state)
    client = {"accountId": str(account), "principal": "bot", "name": "Bot", "policies": [POLICY]}
    (await gql(admin, CREATE_CLIENT, input=client)).ok()
    return account


async def valid(state, token: str) -> bool:
    try:
        await service.authenticate(state.pool, f"Bearer {token}")
    except Unauthenticated:
        return False
    return True


async def test_a_changed_bootstrap_token_replaces_the_old_one_and_others_stay(state, admin):
    await service.bootstrap_admin(state.pool, FIRST)
    other = await service.create_client_token(state.pool, admin, account_id=None, principal="admin")
    assert await valid(state, FIRST)

    await service.bootstrap_admin(state.pool, SECOND)
    assert not await valid(state, FIRST)  # the old setting's token no longer works
    assert await valid(state, SECOND)
    assert await valid(state, other)  # an admin token issued otherwise stays
    listed = await service.list_client_tokens(state.pool, admin, account_id=None, principal="admin")
    assert sorted(t.bootstrap for t in listed) == [False, True]
    # The same setting again changes nothing.
    await service.bootstrap_admin(state.pool, SECOND)
    assert await valid(state, SECOND) and await valid(state, other)
    assert (
        len(await service.list_client_tokens(state.pool, admin, account_id=None, principal="admin"))
        == 2
    )


async def test_a_bootstrap_token_from_before_the_marking_is_marked_then_replaced(state, admin):
    # Before tokens were marked, the setting's value was stored as a plain admin token.
    await service.bootstrap_admin(state.pool, None)
    async with state.pool.acquire() as conn:
        await conn.execute("DELETE FROM client_tokens")
        await conn.execute(
            "INSERT INTO client_tokens (token_hash, account_id, principal) "
            "VALUES ($1, $2, 'admin')",
            service.hash_token(FIRST),
            admin.account_id,
        )
    await service.bootstrap_admin(state.pool, FIRST)
    (marked,) = await service.list_client_tokens(
        state.pool, admin, account_id=None, principal="admin"
    )
    assert marked.bootstrap and marked.prefix == FIRST[:8]
    await service.bootstrap_admin(state.pool, SECOND)
    assert not await valid(state, FIRST) and await valid(state, SECOND)


async def test_restarting_with_a_new_bootstrap_token_over_http(db_url, embedder):
    # What an operator does: change ENGRAM_BOOTSTRAP_TOKEN and restart the service.
    query = {"query": "{ viewer { principal } }"}
    statuses = []
    for token in (FIRST, SECOND):
        settings = db_settings(db_url, bootstrap_token=token)
        with serving(settings, embedder) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                headers = {"Authorization": f"Bearer {FIRST}"}
                answer = await http.post("/graphql", json=query, headers=headers)
                statuses.append(answer.status_code)
    assert statuses == [200, 401]
    assert answer.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


OWN_TOKENS = '{ client(principal: "admin") { tokens(first: 9) { nodes { tokenId bootstrap } } } }'


def revoked_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "holds a token that was revoked" in r.getMessage()
    ]


async def test_a_revoked_bootstrap_token_stays_revoked_when_restarted_over_http(
    db_url, embedder, caplog
):
    # A leaked bootstrap token revoked, and the service restarted with the setting unchanged.
    viewer = {"query": "{ viewer { principal } }"}
    own = {"query": OWN_TOKENS}
    revoke: dict = {"query": REVOKE, "variables": {"p": "admin"}}
    with serving(db_settings(db_url, bootstrap_token=FIRST), embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            headers = {"Authorization": f"Bearer {FIRST}"}
            listed = (await http.post("/graphql", json=own, headers=headers)).json()
            (token,) = listed["data"]["client"]["tokens"]["nodes"]
            assert token["bootstrap"]
            revoke["variables"]["t"] = token["tokenId"]
            answer = await http.post("/graphql", json=revoke, headers=headers)
            assert answer.json()["data"]["revokeClientToken"]["tokenId"] == token["tokenId"]
    caplog.clear()
    with serving(db_settings(db_url, bootstrap_token=FIRST), embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            headers = {"Authorization": f"Bearer {FIRST}"}
            answer = await http.post("/graphql", json=viewer, headers=headers)
    assert answer.status_code == 401
    assert answer.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    (warning,) = revoked_warnings(caplog)
    assert "stays revoked; give the setting a new value, or unset it" in warning
    assert FIRST not in caplog.text and FIRST[:8] not in caplog.text
    # A new value works as before.
    with serving(db_settings(db_url, bootstrap_token=SECOND), embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            headers = {"Authorization": f"Bearer {SECOND}"}
            answer = await http.post("/graphql", json=viewer, headers=headers)
    assert answer.json() == {"data": {"viewer": {"principal": "admin"}}}


async def test_a_replaced_bootstrap_token_does_not_come_back(state, admin, caplog):
    # A value rotated out is as good as revoked: setting it again does not bring it back.
    await service.bootstrap_admin(state.pool, FIRST)
    await service.bootstrap_admin(state.pool, SECOND)
    caplog.clear()
    await service.bootstrap_admin(state.pool, FIRST)
    assert not await valid(state, FIRST)
    assert await valid(state, SECOND)  # nothing changed: the value before stays
    assert len(revoked_warnings(caplog)) == 1 and FIRST not in caplog.text


async def test_deleting_the_admin_client_revokes_its_bootstrap_token_for_good(state, admin, caplog):
    await service.bootstrap_admin(state.pool, FIRST)
    everything = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "financial.*")
    ops = await service.authenticate(
        state.pool, f"Bearer {await token_for(state, admin, 'ops', everything)}"
    )
    await service.delete_client(state.pool, ops, account_id=None, principal="admin")
    assert not await valid(state, FIRST)

    caplog.clear()
    # The next start makes the admin client again, but not its revoked bootstrap token.
    assert await service.bootstrap_admin(state.pool, FIRST) is None
    assert not await valid(state, FIRST)
    assert len(revoked_warnings(caplog)) == 1 and FIRST not in caplog.text
    await service.bootstrap_admin(state.pool, SECOND)
    assert (await service.authenticate(state.pool, f"Bearer {SECOND}")).principal == "admin"


async def test_tokens_are_listed_without_their_secret(gql, state, admin):
    account = await bot(gql, admin, state)
    expires = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    issued = (await gql(admin, CREATE_TOKEN, p="bot", a=str(account), e=expires)).ok()
    issued = issued["createClientToken"]
    token = issued["token"]
    assert issued["prefix"] == token[:8] and issued["expires"] is not None
    second = (await gql(admin, CREATE_TOKEN, p="bot", a=str(account))).ok()["createClientToken"]

    listing = await gql(admin, TOKENS, p="bot", a=str(account))
    tokens = listing.ok()["client"]["tokens"]["nodes"]
    assert [t["tokenId"] for t in tokens] == [second["tokenId"], issued["tokenId"]]
    assert tokens[1]["prefix"] == token[:8]
    assert tokens[1]["expires"] is not None and tokens[0]["expires"] is None
    assert all(t["lastUsed"] is None and not t["bootstrap"] for t in tokens)
    text = json.dumps(listing.data)
    assert token not in text and second["token"] not in text and token[8:20] not in text
    # A page at a time, newest first (a Relay connection); node(id) reads one back.
    page = (await gql(admin, TOKENS, p="bot", a=str(account), first=1)).ok()["client"]["tokens"]
    assert [t["tokenId"] for t in page["nodes"]] == [second["tokenId"]]
    assert page["pageInfo"]["hasNextPage"]
    rest = await gql(admin, TOKENS, p="bot", a=str(account), after=page["pageInfo"]["endCursor"])
    rest = rest.ok()["client"]["tokens"]
    assert [t["tokenId"] for t in rest["nodes"]] == [issued["tokenId"]]
    assert not rest["pageInfo"]["hasNextPage"]
    node = await gql(
        admin,
        "query($id: ID!) { node(id: $id) { ... on ClientTokenInfo { tokenId } } }",
        id=tokens[1]["id"],
    )
    assert node.ok()["node"] == {"tokenId": issued["tokenId"]}


async def test_last_used_is_written_at_most_once_a_minute(gql, state, admin):
    account = await bot(gql, admin, state)
    token = await service.create_client_token(
        state.pool, admin, account_id=account, principal="bot"
    )

    async def last_used():
        (info,) = await service.list_client_tokens(
            state.pool, admin, account_id=account, principal="bot"
        )
        return info.last_used

    await service.authenticate(state.pool, f"Bearer {token}")
    first = await last_used()
    assert first is not None
    await service.authenticate(state.pool, f"Bearer {token}")
    assert await last_used() == first  # within the minute: not written again
    async with state.pool.acquire() as conn:
        await conn.execute("UPDATE client_tokens SET last_used = now() - interval '2 minutes'")
    stale = await last_used()
    await service.authenticate(state.pool, f"Bearer {token}")
    assert await last_used() > stale


async def test_an_expired_token_is_unauthenticated(gql, state, admin):
    account = await bot(gql, admin, state)
    past = (datetime.now(UTC) - timedelta(seconds=1)).replace(microsecond=0)
    # Sent with an offset, the time is named back in UTC as every Timestamp is written.
    sent = past.astimezone(timezone(timedelta(hours=2))).isoformat()
    refused = await gql(admin, CREATE_TOKEN, p="bot", a=str(account), e=sent)
    assert refused.codes == ["BAD_REQUEST"]
    shown = past.isoformat().replace("+00:00", "Z")
    assert f"expires must be in the future, got {shown}" in refused.errors[0]["message"]
    soon = datetime.now(UTC) + timedelta(hours=1)
    token = await service.create_client_token(
        state.pool, admin, account_id=account, principal="bot", expires=soon
    )
    assert (await service.authenticate(state.pool, f"Bearer {token}")).principal == "bot"
    async with state.pool.acquire() as conn:  # an hour passes
        await conn.execute("UPDATE client_tokens SET expires = now() - interval '1 second'")
    with pytest.raises(Unauthenticated, match=r"expired at \d{4}-\d\d-\d\dT[\d:.]+Z;"):
        await service.authenticate(state.pool, f"Bearer {token}")


async def test_a_revoked_token_is_refused(gql, state, admin):
    account = await bot(gql, admin, state)
    kept = await service.create_client_token(state.pool, admin, account_id=account, principal="bot")
    token = await service.create_client_token(
        state.pool, admin, account_id=account, principal="bot"
    )
    tokens = (await gql(admin, TOKENS, p="bot", a=str(account))).ok()["client"]["tokens"]["nodes"]
    token_id = tokens[0]["tokenId"]
    revoked = await gql(admin, REVOKE, p="bot", t=token_id, a=str(account))
    assert revoked.ok()["revokeClientToken"] == {"tokenId": token_id, "prefix": token[:8]}
    assert not await valid(state, token)
    assert await valid(state, kept)
    again = await gql(admin, REVOKE, p="bot", t=token_id, a=str(account))
    assert again.codes == ["NOT_FOUND"]


@pytest.mark.parametrize("change", ["revoke", "delete"])
async def test_a_turn_running_when_its_token_is_revoked_keeps_nothing(
    gql, state, admin, model_server, base_url, change
):
    """A request is checked when it starts, and its turn again as it commits (docs/access.md):
    a turn waiting on its model when its token is revoked, or its client deleted, ends FAILED
    and keeps nothing of what it did; the next request with that token is refused."""
    agent = await make_agent(state, admin)
    runner = allow(["INSERT"], "financial.ActionExecution.document")
    token = await token_for(state, admin, "runner", runner)
    model_server.call_tools(
        ("add_memory", {"summary": "Ada pays by card", "kind": "fact"}), delay=3
    )
    model_server.say("Saved.")
    execute = """mutation($a: UUID!) { executeAction(input: {actionId: $a, sessionId: "s1",
      input: "Ada pays by card"}) { status output error } }"""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:

        async def post(query: str, **variables: str) -> httpx.Response:
            body = {"query": query, "variables": variables}
            return await http.post(
                "/graphql", json=body, headers={"Authorization": f"Bearer {token}"}
            )

        turn = asyncio.create_task(post(execute, a=str(agent.action_id)))
        await eventually(lambda: model_server.requests_to(CHAT), "the turn's model call")
        if change == "revoke":
            (issued,) = await service.list_client_tokens(
                state.pool, admin, account_id=None, principal="runner"
            )
            await service.revoke_client_token(
                state.pool, admin, account_id=None, principal="runner", token_id=issued.token_id
            )
        else:
            await service.delete_client(state.pool, admin, account_id=None, principal="runner")
        refused = await post("{ viewer { principal } }")
        assert refused.status_code == 401 and not turn.done()
        answered = await turn
    revoked = (
        "the API token that started this turn was revoked, or its client deleted, while the "
        "turn ran; nothing of this turn was kept"
    )
    assert answered.json() == {
        "data": {"executeAction": {"status": "FAILED", "output": None, "error": revoked}}
    }
    listed = (
        """query($a: UUID!) { action(actionId: $a) { memories(first: 5) { nodes { summary } } } }"""
    )
    found = (await gql(admin, listed, a=str(agent.action_id))).ok()
    assert found["action"]["memories"]["nodes"] == []


async def test_token_operations_need_their_grants(gql, state, admin):
    account = await bot(gql, admin, state)
    await service.create_client_token(state.pool, admin, account_id=account, principal="bot")
    (info,) = await service.list_client_tokens(
        state.pool, admin, account_id=account, principal="bot"
    )
    a, t = str(account), str(info.token_id)
    documents = caller(account, allow(["SELECT", "DELETE"], "financial.Client.document"))
    listed = await gql(documents, TOKENS, p="bot")
    assert listed.codes == ["ACCESS_DENIED"]
    assert "SELECT financial.Client.token" in listed.errors[0]["message"]
    revoked = await gql(documents, REVOKE, p="bot", t=t)
    assert revoked.codes == ["ACCESS_DENIED"]
    assert "DELETE financial.Client.token" in revoked.errors[0]["message"]
    granted = caller(
        account,
        allow(["SELECT"], "financial.Client.document", "financial.Client.token"),
        allow(["DELETE"], "financial.Client.token"),
    )
    assert len((await gql(granted, TOKENS, p="bot")).ok()["client"]["tokens"]["nodes"]) == 1
    # Another tenant's client never shows, nor its tokens.
    stranger = caller(await make_account(state), allow(["SELECT", "DELETE"], "*"))
    assert (await gql(stranger, REVOKE, p="bot", t=t, a=a)).codes == ["NOT_FOUND"]
    assert (await gql(granted, REVOKE, p="bot", t=t)).ok()["revokeClientToken"]["tokenId"] == t


async def test_cli_issues_lists_and_revokes_tokens(db_url, state, admin, monkeypatch, capsys):
    from app import cli

    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    await service.create_client(
        state.pool, admin, account_id=None, principal="ops", name="Ops", policies=[POLICY]
    )

    async def engram(*args: str) -> dict:
        assert await asyncio.to_thread(cli.main, list(args)) == 0
        return json.loads(capsys.readouterr().out)

    issued = await engram("client", "token", "ops", "--expires", "2999-01-01T00:00:00Z")
    assert issued["expires"].startswith("2999-01-01") and issued["prefix"] == issued["token"][:8]
    listed = await engram("client", "tokens", "ops")
    assert [t["tokenId"] for t in listed["tokens"]] == [issued["tokenId"]]
    assert issued["token"] not in json.dumps(listed)
    assert await valid(state, issued["token"])
    revoked = await engram("client", "revoke-token", "ops", issued["tokenId"])
    assert revoked["revoked"]["tokenId"] == issued["tokenId"]
    assert not await valid(state, issued["token"])


async def test_an_expiry_past_the_representable_range_is_bad_request(gql, state, admin):
    """9999-12-31T23:00:00-10:00 is a valid RFC 3339 time whose UTC instant is in year 10000:
    refused as BAD_REQUEST, not INTERNAL from the database driver."""
    account = await bot(gql, admin, state)
    # Out of range: past year 9999 in UTC, and asyncpg's infinity (which it reads back without
    # a zone) and -infinity.
    for expires in (
        "9999-12-31T23:00:00-10:00",
        "9999-12-31T23:59:59.999999Z",
        "0001-01-01T00:00:00Z",
    ):
        refused = await gql(admin, CREATE_TOKEN, p="bot", a=str(account), e=expires)
        assert refused.codes == ["BAD_REQUEST"], (expires, refused.errors)
        assert "must fall between" in refused.errors[0]["message"]
    # Not RFC 3339 (the Timestamp scalar's format): other ISO 8601 forms, no offset, an
    # offset's minutes past 59 or hours past 23.
    for expires in (
        "not a time",
        "2027-01-01T00:00:00",
        "20270101T000000Z",
        "2027-W01-5T00:00Z",
        "2027-01-01T00:00:00+00:60",
        "2027-01-01T00:00:00+24:00",
    ):
        refused = await gql(admin, CREATE_TOKEN, p="bot", a=str(account), e=expires)
        assert refused.codes == ["BAD_REQUEST"], (expires, refused.errors)
        assert "RFC 3339" in refused.errors[0]["message"], expires
    for expires, stored in [
        ("2027-01-01T09:00:00+09:00", "2027-01-01T00:00:00Z"),
        ("2027-01-01t00:00:00.5z", "2027-01-01T00:00:00.500000Z"),  # T and Z in either case
    ]:
        fine = await gql(admin, CREATE_TOKEN, p="bot", a=str(account), e=expires)
        assert fine.ok()["createClientToken"]["expires"] == stored


@pytest.mark.parametrize(
    ("sent", "read"),
    [
        ("2099-01-01T00:00:00Z", "2099-01-01T00:00:00Z"),
        ("2099-01-01t02:00:00+02:00", "2099-01-01T00:00:00Z"),
        ("2099-01-01T00:00:00-00:00", "2099-01-01T00:00:00Z"),
        ("2099-01-01T00:00:00z", "2099-01-01T00:00:00Z"),
        ("2099-01-01T00:00:00.1234569Z", "2099-01-01T00:00:00.123456Z"),  # cut, not rounded
        ("2099-03-29T02:30:00+01:00", "2099-03-29T01:30:00Z"),  # skipped by DST: the offset's
        ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"),
        ("2099-01-01T00:00:00", None),  # no offset: no zone is assumed
        ("2016-12-31T23:59:60Z", None),  # a leap second
        ("2099-01-01T24:00:00Z", None),
        ("2099-01-01T00:00:00+0100", None),
        ("2099-01-01T00:00:00,5Z", None),
        ("2099-W01-1T00:00:00Z", None),
        ("2099-01-01T00:00Z", None),
        ("20990101T000000Z", None),
        ("9999-12-31T23:59:59.999999Z", None),
        ("9999-12-31T23:30:00-01:00", None),
        ("10000-01-01T00:00:00Z", None),
    ],
)
async def test_timestamps_are_rfc3339_read_back_in_utc(gql, state, admin, sent, read):
    """docs/graphql.md: what a Timestamp accepts, what it refuses (BAD_REQUEST naming the
    variable) and how it is written back."""
    account = await bot(gql, admin, state)
    answer = await gql(admin, CREATE_TOKEN, p="bot", a=str(account), e=sent)
    if read is None:
        assert answer.codes == ["BAD_REQUEST"], answer.errors
        assert "$e" in answer.errors[0]["message"]
    else:
        assert answer.ok()["createClientToken"]["expires"] == read


async def test_a_command_leaves_a_revoked_bootstrap_token_revoked(db_url, tmp_path):
    # `engram` commands that write make the admin (and the setting's token) as a start does.
    env = clean_env(database_url=db_url, data_dir=str(tmp_path / "unused"), bootstrap_token=FIRST)

    async def engram(*args: str) -> tuple[dict, str]:
        ran = await asyncio.to_thread(run, env, *args)
        assert ran.returncode == 0, ran.stderr
        assert FIRST not in ran.stderr and FIRST not in ran.stdout
        return json.loads(ran.stdout), ran.stderr

    async def bootstrap_tokens() -> list[str]:
        listed, _ = await engram("client", "tokens", "admin")
        return [t["tokenId"] for t in listed["tokens"] if t["bootstrap"]]

    await engram("client", "create", "ops")
    (leaked,) = await bootstrap_tokens()
    _, said = await engram("client", "revoke-token", "admin", leaked)
    assert "was revoked" not in said

    _, said = await engram("client", "create", "bot")
    assert "ENGRAM_BOOTSTRAP_TOKEN holds a token that was revoked (at " in said
    assert "it stays revoked; give the setting a new value, or unset it" in said
    assert await bootstrap_tokens() == []
