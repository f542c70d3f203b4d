"""Listing accounts (tenants): `accounts(first, after)` and `engram account list`. An operator
who lost a tenant's accountId finds it by the account's name."""

import asyncio
import base64
import json

import asyncpg
import httpx
from factories import allow, caller, deny, make_account, token_for

from app import cli
from app.auth.caller import Caller
from app.auth.policies import parse_policies

ACCOUNTS = """query($first: Int!, $after: String) {
  accounts(first: $first, after: $after) {
    edges { cursor node { id accountId name created isDefault } }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
  }
}"""
READ_ACCOUNTS = allow(["SELECT"], "financial.Account.document")
EVERYTHING = allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*")
# Names that tie (two acme) and sort apart from the order they were made in.
NAMES = ["zeta", "acme", "Beta co", "acme", "mid", "alpha", "acme-eu"]


async def stored_order(state) -> list[dict]:
    async with state.pool.acquire() as conn:
        rows = await conn.fetch("SELECT account_id, name FROM accounts ORDER BY name, account_id")
    return [{"accountId": str(r["account_id"]), "name": r["name"]} for r in rows]


async def test_the_operator_pages_through_every_account_over_http(state, admin, base_url):
    """Each account once, by name then ID, over pages of 3: none left out, none twice."""
    made = {str(await make_account(state, name)) for name in NAMES}
    token = await token_for(state, admin, "operator", READ_ACCOUNTS)
    listed: list[dict] = []
    after, pages = None, 0
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as http:
        while True:
            answer = http.post(
                "/graphql", json={"query": ACCOUNTS, "variables": {"first": 3, "after": after}}
            ).json()
            assert "errors" not in answer, answer
            page = answer["data"]["accounts"]
            pages += 1
            assert page["pageInfo"]["hasPreviousPage"] is (after is not None)
            assert page["pageInfo"]["endCursor"] == page["edges"][-1]["cursor"]
            listed += [e["node"] for e in page["edges"]]
            if not page["pageInfo"]["hasNextPage"]:
                break
            after = page["pageInfo"]["endCursor"]
    assert pages == 3  # the default account and the seven made, three a page
    assert [{"accountId": a["accountId"], "name": a["name"]} for a in listed] == (
        await stored_order(state)
    )
    ids = [a["accountId"] for a in listed]
    assert len(set(ids)) == len(ids) == len(NAMES) + 1 and made <= set(ids)
    acme = [a["name"] for a in listed if a["name"].startswith("acme")]
    assert acme == ["acme", "acme", "acme-eu"]
    assert [a["accountId"] for a in listed if a["isDefault"]] == [str(admin.account_id)]
    assert all(a["created"] for a in listed)


async def test_a_new_account_reads_back_the_same_by_node_and_in_the_list(gql, admin):
    fields = "id accountId name created isDefault"
    made = (
        await gql(admin, f'mutation {{ createAccount(input: {{name: "acme"}}) {{ {fields} }} }}')
    ).ok()["createAccount"]
    assert made["isDefault"] is False
    node = f"query($id: ID!) {{ node(id: $id) {{ ... on Account {{ {fields} }} }} }}"
    assert (await gql(admin, node, id=made["id"])).ok()["node"] == made
    page = (await gql(admin, ACCOUNTS, first=10)).ok()["accounts"]
    assert made in [e["node"] for e in page["edges"]]


async def test_a_tenant_lists_its_own_account_alone(gql, state, admin):
    """As `clients` and `node(id)` reach no other account for it: the others are not there."""
    own = await make_account(state, "acme")
    await make_account(state, "another")
    tenant = caller(own, READ_ACCOUNTS)
    page = (await gql(tenant, ACCOUNTS, first=1000)).ok()["accounts"]
    assert [e["node"]["accountId"] for e in page["edges"]] == [str(own)]
    assert page["pageInfo"]["hasNextPage"] is False
    after = page["pageInfo"]["endCursor"]
    rest = (await gql(tenant, ACCOUNTS, first=10, after=after)).ok()["accounts"]
    assert rest["edges"] == [] and rest["pageInfo"]["hasNextPage"] is False
    # Even a tenant's client allowed everything.
    everything = (await gql(caller(own, EVERYTHING), ACCOUNTS, first=10)).ok()["accounts"]
    assert [e["node"]["name"] for e in everything["edges"]] == ["acme"]


async def test_listing_accounts_needs_select_on_accounts(gql, state, admin):
    operator = Caller(
        admin.account_id,
        "operator",
        parse_policies([EVERYTHING, deny(["SELECT"], "financial.Account.document")]),
        in_default_account=True,
    )
    tenant = caller(await make_account(state), allow(["SELECT"], "financial.Client.*"))
    for who in (operator, tenant):
        refused = await gql(who, ACCOUNTS, first=10)
        assert refused.codes == ["ACCESS_DENIED"] and refused.data is None
        assert "SELECT financial.Account.document" in refused.errors[0]["message"]
    allowed = '{ viewer { allowed(operations: ["accounts"]) { allowed reason } } }'
    answer = (await gql(tenant, allowed)).ok()["viewer"]["allowed"]
    assert answer == [
        {
            "allowed": False,
            "reason": "this client is not allowed to SELECT financial.Account.document",
        }
    ]


async def test_a_wrong_first_or_cursor_is_bad_request(gql, state, admin):
    await make_account(state, "acme")
    await token_for(state, admin, "someone")  # a client, whose page's cursor is another list's
    for first in (0, -1, 1001):
        wrong = await gql(admin, ACCOUNTS, first=first)
        assert wrong.codes == ["BAD_REQUEST"], first
        assert "`first` must be from 1 to 1000" in wrong.errors[0]["message"]
    clients = (await gql(admin, "{ clients(first: 1) { pageInfo { endCursor } } }")).ok()
    crafted = base64.urlsafe_b64encode(json.dumps(["acme", "x"]).encode()).decode()
    for after in ("not a cursor", clients["clients"]["pageInfo"]["endCursor"], crafted):
        wrong = await gql(admin, ACCOUNTS, first=10, after=after)
        assert wrong.codes == ["BAD_REQUEST"], after
        assert "cursor" in wrong.errors[0]["message"]


async def test_cli_lists_every_account_by_name(db_url, state, admin, monkeypatch, capsys):
    made = [await make_account(state, name) for name in NAMES]
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    code = await asyncio.to_thread(cli.main, ["account", "list"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    listed = json.loads(printed.out)["accounts"]
    assert [{"accountId": a["accountId"], "name": a["name"]} for a in listed] == (
        await stored_order(state)
    )
    assert {str(m) for m in made} < {a["accountId"] for a in listed}
    assert [a["accountId"] for a in listed if a["isDefault"]] == [str(admin.account_id)]
    assert all(isinstance(a["created"], str) for a in listed)
    # It only reads: the admin's token, which a command that writes makes, is not printed.
    assert "admin token" not in printed.err


async def test_cli_listing_before_any_start_makes_no_account(db_url, monkeypatch, capsys):
    """Only reads: on a database without the default account it is refused, makes none, and
    does not point at an --account it does not take."""
    monkeypatch.setenv("ENGRAM_DATABASE_URL", db_url)
    monkeypatch.delenv("ENGRAM_BOOTSTRAP_TOKEN", raising=False)
    code = await asyncio.to_thread(cli.main, ["account", "list"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[-1] == (
        "error (NOT_FOUND): this database has no default account yet (the service makes it when "
        "it first starts): `engram account list` only reads, and makes no account; start the "
        "service first (`engram serve`)"
    )
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM accounts") == 0
    finally:
        await conn.close()
