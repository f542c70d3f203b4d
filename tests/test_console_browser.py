"""The admin console (issue 17) in a real browser: headless Chromium driven by Playwright against
the service on loopback, with every other host refused (the page needs nothing from elsewhere).

Screenshots of the main views go to ENGRAM_SCREENSHOT_DIR (/tmp/engram-screens by default).
Under CI (CI=true) a missing browser fails the run; elsewhere the tests are skipped, saying how
to get one: `apt-get install chromium` (Debian) and `pip install -e '.[test]'` (Playwright)."""

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from browser import chromium, offline_browser, screenshot_path
from helpers import db_settings
from openai_server import OpenAIServer
from runtime_support import NOTHING_TO_KEEP
from servers import serving

ADMIN = "console-browser-test-admin-token"
HARNESS = {
    "memory": {
        "enabled": True,
        "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        "labels": {"customer_id": {"number": 5, "description": "The customer."}},
        "tools": ["add_memory", "read_memory", "delete_memory"],
    }
}
# Data is shown as text: markup in a record must not become page elements or run.
HOSTILE = '<img src=x onerror="window.pwned=1"><b>bold</b> & <script>window.pwned=2</script>'
READER = [
    {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]},
    {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.AgentMemory.*"]},
]


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def raw(self, query: str, **variables: Any) -> dict[str, Any]:
        return self.client.post("/graphql", json={"query": query, "variables": variables}).json()

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        body = self.raw(query, **variables)
        assert not body.get("errors"), body
        return body["data"]


def seed(api: Api, model: OpenAIServer) -> dict[str, Any]:
    """An agent with records and one session whose turn called tools; a reader's token; and
    another tenant's agent."""
    # Session history (issue 13) where the server has it: the console then offers its search.
    fields = api('{ __type(name: "ActionSession") { fields { name } } }')["__type"]["fields"]
    has_history = "searchHistory" in {f["name"] for f in fields}
    harness = {**HARNESS, "history": {"index": "messages"}} if has_history else HARNESS
    agent = api(
        "mutation($i: ActionInput!) { createAction(input: $i) { actionId } }",
        i={"name": "Support desk", "instructions": "Help customers.", "harness": harness},
    )["createAction"]["actionId"]
    ids = {}
    for summary, kind in [
        ("Customer c-42 prefers espresso over filter coffee", "fact"),
        ("Refunds over 100 EUR need a manager", "guidance"),
        ("Outage on 3 March delayed orders", "event"),
    ]:
        record = {
            "summary": summary,
            "kind": kind,
            "content": f"Evidence: {summary}.",
            "labels": [{"name": "customer_id", "value": "c-42"}],
            "sessionId": "s-1",
        }
        ids[kind] = api(ADD, a=agent, i=record)["addAgentMemory"]["memoryId"]
    # One turn: the agent saves a record with a tool, then answers.
    model.call_tools(
        ("add_memory", {"summary": "Customer c-42 asked about a late order", "kind": "event"}),
    )
    model.say("I noted it; your order ships tomorrow.")
    turn = api(
        """mutation($i: ExecuteActionInput!) { executeAction(input: $i) { status error } }""",
        i={"actionId": agent, "sessionId": "s-1", "input": "Where is my order?"},
    )["executeAction"]
    assert turn["status"] == "SUCCEEDED", turn
    client = """mutation($i: ClientInput!) { createClient(input: $i) { principal } }"""
    token = """mutation($p: String!, $a: UUID) { createClientToken(principal: $p, accountId: $a)
      { token } }"""
    api(client, i={"principal": "auditor", "name": "Auditor", "policies": READER})
    reader = api(token, p="auditor")["createClientToken"]["token"]
    # Another tenant with an agent of its own.
    other = api('mutation { createAccount(input: {name: "Other Co"}) { accountId } }')
    other_account = other["createAccount"]["accountId"]
    api(
        client,
        i={
            "accountId": other_account,
            "principal": "boss",
            "name": "Boss",
            "policies": [
                {"effect": "ALLOW", "actions": ["SELECT", "INSERT"], "resources": ["financial.*"]}
            ],
        },
    )
    boss = Api(
        str(api.client.base_url),
        api(token, p="boss", a=other_account)["createClientToken"]["token"],
    )
    secret = boss(
        "mutation($i: ActionInput!) { createAction(input: $i) { actionId } }",
        i={"name": "Other tenant's secret agent", "harness": HARNESS},
    )["createAction"]["actionId"]
    return {
        "agent": agent,
        "espresso": ids["fact"],
        "refunds": ids["guidance"],
        "reader": reader,
        "other": secret,
        "history": has_history,
    }


ADD = """mutation($a: UUID!, $i: AgentMemoryInput!) {
  addAgentMemory(actionId: $a, input: $i) { memoryId } }"""


@asynccontextmanager
async def console(db_url: str, embedder) -> AsyncIterator[tuple[str, Any, dict[str, Any]]]:
    """The service (with the scripted model, `seeded["model"]`) seeded, and a browser page that
    may reach only it."""
    chromium()  # without a browser, skipped before the service is seeded
    with OpenAIServer() as model:
        model.chat_defaults["memory"] = NOTHING_TO_KEEP
        settings = db_settings(
            db_url, bootstrap_token=ADMIN, model_base_url=model.url, model_max_retries=0
        )
        with serving(settings, embedder) as url:
            seeded = {**seed(Api(url, ADMIN), model), "model": model}
            async with offline_browser(url) as browser:
                page = await browser.page(height=900)
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))

                # And what its console reports as an error, where a CSP violation (an inline
                # style or script) shows, but an answer with an error status (a refusal a test
                # provokes).
                def said(message: Any) -> None:
                    if message.type == "error" and not message.text.startswith(
                        "Failed to load resource"
                    ):
                        errors.append(message.text)

                page.on("console", said)
                yield url, page, seeded
                assert browser.elsewhere == [], browser.elsewhere
                assert errors == [], errors


async def sign_in(page, url: str, token: str) -> None:
    from playwright.async_api import expect

    await page.goto(url + "/console")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.get_by_label("API token").fill(token)
    await page.get_by_label("API token").press("Enter")  # the form submits with Enter
    await expect(page.get_by_role("heading", name="Agents")).to_be_visible()


async def test_console_finds_a_record_shows_its_history_and_deletes_it(db_url, embedder):
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        agent = seeded["agent"]
        await sign_in(page, url, ADMIN)
        # The token stays in this tab's session storage only.
        stored = await page.evaluate("[sessionStorage.length, localStorage.length]")
        assert stored == [1, 0]
        await expect(page.get_by_role("link", name="Support desk")).to_be_visible()
        await page.screenshot(path=screenshot_path("console-agents.png"))

        # The agent's configuration, and an edit the server refuses, shown at its field.
        await page.get_by_role("link", name="Support desk").click()
        await expect(page.get_by_role("heading", name="Support desk")).to_be_visible()
        await expect(page.locator("pre.json").first).to_contain_text('"customer_id"')
        harness = page.get_by_label("Harness (JSON)")
        bad = dict(HARNESS["memory"], extraction={"every": 0})
        await harness.fill(json.dumps({"memory": bad}, indent=2))
        await page.get_by_role("button", name="Save new version").click()
        error = page.locator("#" + await harness.get_attribute("aria-describedby"))
        await expect(error).to_contain_text("harness.memory.extraction.every")
        await expect(harness).to_have_attribute("aria-invalid", "")
        await page.screenshot(path=screenshot_path("console-agent-edit.png"), full_page=True)
        # Corrected, it saves as the next version; the first stays readable.
        await harness.fill(json.dumps(HARNESS))
        await page.get_by_label("Instructions").fill("Help customers kindly.")
        await page.get_by_label("Instructions").press("Control+Enter")
        await expect(page.get_by_role("heading", name="Version 2 (current)")).to_be_visible()
        await expect(page.locator("details.version summary")).to_contain_text("Version 1")

        # Memories: find the record by search, with scores.
        await page.get_by_role("link", name="Memories").click()
        await expect(page.get_by_role("heading", name="Memories of Support desk")).to_be_visible()
        await page.get_by_label("Search memories").fill("espresso coffee")
        await page.get_by_label("Mode").select_option("HYBRID")
        await page.get_by_label("Search memories").press("Enter")
        results = page.locator("table", has=page.locator("caption", has_text="Search results"))
        hit = results.get_by_role("link", name="Customer c-42 prefers espresso over filter coffee")
        await expect(hit).to_be_visible()
        await expect(results.locator("td[data-label=Score]").first).to_have_text(
            re.compile(r"^\d\.\d{4}$")
        )
        await page.screenshot(path=screenshot_path("console-memories.png"), full_page=True)
        await page.screenshot(  # the README's picture (docs/console.png), kept small
            path=screenshot_path("console-readme.png"),
            clip={"x": 0, "y": 0, "width": 1280, "height": 640},
        )
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.screenshot(path=screenshot_path("console-memories-phone.png"), full_page=True)
        await page.set_viewport_size({"width": 1280, "height": 900})

        # The record's page: content, provenance and its history.
        await hit.click()
        title = "Customer c-42 prefers espresso over filter coffee"
        await expect(page.get_by_role("heading", name=title)).to_be_visible()
        history = page.get_by_role("list", name="Version history")
        await expect(history.locator("li")).to_have_count(1)
        await expect(page.get_by_text("Evidence: Customer c-42").first).to_be_visible()
        await page.screenshot(path=screenshot_path("console-record.png"), full_page=True)

        # Delete, after a confirmation that says what deleting does and does not remove.
        # With the keyboard alone: the dialog opens on Cancel, Tab reaches the delete button.
        await page.get_by_role("button", name="Delete this record…").focus()
        await page.keyboard.press("Enter")
        dialog = page.get_by_role("dialog")
        await expect(dialog).to_contain_text("no longer recalls")
        await expect(dialog).to_contain_text("does not erase")
        # Opened with the focus on Cancel, a screen reader says its title and what it does.
        await expect(dialog).to_have_accessible_name("Delete this record?")
        await expect(dialog).to_have_accessible_description(re.compile("^Deleting writes a new"))
        await expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
        await page.screenshot(path=screenshot_path("console-delete-confirm.png"))
        await page.keyboard.press("Escape")  # Escape cancels: nothing deleted
        await expect(dialog).to_be_hidden()
        await expect(history.locator("li")).to_have_count(1)
        await page.get_by_role("button", name="Delete this record…").focus()
        await page.keyboard.press("Enter")
        await page.keyboard.press("Tab")
        await expect(dialog.get_by_role("button", name="Delete record")).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("status")).to_contain_text("Deleted")
        await expect(history.locator("li")).to_have_count(2)
        await expect(history.locator("li").first).to_contain_text("DELETED")
        await expect(page.get_by_role("button", name="Delete this record…")).to_have_count(0)

        # Gone from the list, still readable with its history by its address.
        await page.get_by_role("link", name="← Memories").click()
        listing = page.locator("table", has=page.locator("caption", has_text="newest first"))
        await expect(listing.get_by_role("link", name="Refunds over 100 EUR")).to_be_visible()
        await expect(listing.get_by_role("link", name=title)).to_have_count(0)
        await page.get_by_label("Status").select_option("DELETED")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(listing.get_by_role("link", name=title)).to_be_visible()
        await page.goto(f"{url}/console/#/agents/{agent}/memories/{seeded['espresso']}")
        await expect(history.locator("li")).to_have_count(2)

        # The session: its turn with model calls (purpose, usage) and tool executions.
        await page.goto(f"{url}/console/#/agents/{agent}/sessions")
        await page.get_by_role("link", name="s-1").click()
        await expect(page.get_by_role("heading", name="Session s-1")).to_be_visible()
        events = page.locator("li.event")
        await expect(events.filter(has_text="Model call").first).to_contain_text("purpose turn")
        await expect(events.filter(has_text="Tool execution").first).to_contain_text("add_memory")
        await expect(events.filter(has_text="Output").last).to_contain_text("ships tomorrow")
        await page.screenshot(path=screenshot_path("console-session.png"), full_page=True)
        # History search shows once the schema has it (session history, issue 13).
        box = page.get_by_label("Search this session's history")
        await expect(box).to_have_count(1 if seeded["history"] else 0)
        if seeded["history"]:
            await box.fill("where is my order")
            await box.press("Enter")
            found = page.locator("form[role=search] ~ div li.event")
            await expect(found.first).to_contain_text("score")
            await expect(found.first).to_contain_text("order")
            await page.screenshot(path=screenshot_path("console-history-search.png"))

        # Clients and tokens: create one, shown once, then revoke it.
        await page.get_by_role("link", name="Clients and tokens").click()
        auditor = page.locator("section.client", has_text="auditor")
        await expect(auditor.locator("li").first).to_have_text("ALLOW SELECT on financial.Action.*")
        await auditor.get_by_role("button", name="Create token").click()
        shown = auditor.get_by_label("The new token")
        await expect(shown).to_be_visible()
        new_token = await shown.input_value()
        assert Api(url, new_token)("{ viewer { principal } }")["viewer"]["principal"] == "auditor"
        await page.screenshot(path=screenshot_path("console-clients.png"), full_page=True)
        await page.reload()
        auditor = page.locator("section.client", has_text="auditor")
        revokes = auditor.get_by_role("button", name=re.compile("^Revoke token"))
        await expect(revokes).to_have_count(2)
        await revokes.first.click()  # newest first: the token just made
        await page.get_by_role("dialog").get_by_role("button", name="Revoke token").click()
        await expect(revokes).to_have_count(1)
        refused = Api(url, new_token).raw("{ viewer { principal } }")
        assert refused["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        # A client's tokens come a page at a time (20), the rest on request.
        admin = Api(url, ADMIN)
        for _ in range(20):
            admin('mutation { createClientToken(principal: "auditor") { tokenId } }')
        await page.reload()
        auditor = page.locator("section.client", has_text="auditor")
        revokes = auditor.get_by_role("button", name=re.compile("^Revoke token"))
        await expect(revokes).to_have_count(20)
        more = auditor.get_by_role("button", name="Show more tokens")
        await more.dblclick()  # a double click loads the next page once
        await expect(revokes).to_have_count(21)
        await expect(more).to_be_hidden()
        await page.wait_for_timeout(300)
        await expect(revokes).to_have_count(21)

        # The skip link moves focus to the page, and leaves it where it is.
        before = page.url
        await page.locator("a.skip").focus()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("heading", name="Clients and tokens")).to_be_visible()
        assert page.url == before
        # A session that does not exist is "Not found", not an error.
        await page.goto(f"{url}/console#/agents/{seeded['agent']}/sessions/no-such-session")
        await expect(page.get_by_role("heading", name="Not found")).to_be_visible()


async def test_a_reader_sees_no_delete_button_and_a_direct_delete_is_refused(db_url, embedder):
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        agent, record = seeded["agent"], seeded["espresso"]
        Api(url, ADMIN)(ADD, a=agent, i={"summary": HOSTILE, "kind": "reference"})
        # A token the server does not know is refused at the field, in a sentence.
        await page.goto(url + "/console")
        await page.get_by_label("API token").fill("not-a-token")
        await page.get_by_label("API token").press("Enter")
        await expect(page.get_by_role("alert")).to_have_text(
            "The server did not accept this token: the API token is not valid (mistyped, "
            "revoked, or its client deleted); ask for a new one. Sign in again with a valid token."
        )
        await sign_in(page, url, seeded["reader"])
        # No clients view for a token without the grant.
        await expect(page.get_by_role("link", name="Clients and tokens")).to_have_count(0)
        await page.goto(f"{url}/console/#/agents/{agent}/memories/{record}")
        title = "Customer c-42 prefers espresso over filter coffee"
        await expect(page.get_by_role("heading", name=title)).to_be_visible()
        await expect(page.get_by_role("button", name="Delete this record…")).to_have_count(0)
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.screenshot(path=screenshot_path("console-record-phone.png"), full_page=True)
        await page.set_viewport_size({"width": 1280, "height": 900})
        # Its agent reads, but offers no edit: the token may not UPDATE agents.
        await page.goto(f"{url}/console/#/agents/{agent}")
        await expect(page.get_by_role("heading", name="Support desk")).to_be_visible()
        await expect(page.get_by_role("button", name="Save new version")).to_have_count(0)
        await expect(page.get_by_role("link", name="Sessions")).to_have_count(0)
        # Markup in a record shows as its text, in the list and on its page.
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        await expect(page.get_by_role("link", name=HOSTILE)).to_be_visible()
        await page.get_by_role("link", name=HOSTILE).click()
        await expect(page.get_by_role("heading", name=HOSTILE)).to_be_visible()
        assert await page.evaluate("window.pwned") is None
        assert await page.locator("main img, main b, main script").count() == 0

        # A correction: the new record's page shows the supersede chain, oldest first.
        corrected = Api(url, ADMIN)(
            ADD,
            a=agent,
            i={
                "summary": "Refunds over 200 EUR need a manager",
                "kind": "guidance",
                "replaces": seeded["refunds"],
            },
        )["addAgentMemory"]["memoryId"]
        await page.goto(f"{url}/console/#/agents/{agent}/memories/{corrected}")
        chain = page.locator("h2:text('Supersede chain') + ol > li")
        await expect(chain).to_have_count(2)
        await expect(chain.nth(0)).to_contain_text("Refunds over 100 EUR need a manager")
        await expect(chain.nth(0)).to_contain_text("SUPERSEDED")
        await expect(chain.nth(1)).to_contain_text("(this record)")
        await chain.nth(0).get_by_role("link").click()
        await expect(page.get_by_role("heading", name="Refunds over 100 EUR")).to_be_visible()
        await expect(page.get_by_role("list", name="Version history")).to_contain_text(
            "Replaced by"
        )

        # A view the grants refuse reads as a sentence, not JSON.
        await page.goto(f"{url}/console/#/clients")
        await expect(page.locator(".notice")).to_contain_text(
            "Your token's grants do not allow listing clients: this client is not allowed to "
            "SELECT financial.Client.document."
        )
        await expect(page.locator("main")).not_to_contain_text("{")
        await page.screenshot(path=screenshot_path("console-refused.png"))

        # The same token, straight to GraphQL: refused, and the record is untouched.
        reader = Api(url, seeded["reader"])
        answer = reader.raw(
            "mutation($a: UUID!, $m: UUID!) { deleteAgentMemory(actionId: $a, id: $m) { status } }",
            a=agent,
            m=record,
        )
        assert answer["errors"][0]["extensions"]["code"] == "ACCESS_DENIED"
        status = reader(
            "query($a: UUID!, $m: UUID!) { agentMemory(actionId: $a, id: $m) { status } }",
            a=agent,
            m=record,
        )
        assert status["agentMemory"]["status"] == "ACTIVE"


async def test_another_tenants_agent_cannot_be_opened_by_url(db_url, embedder):
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        await sign_in(page, url, ADMIN)
        other = seeded["other"]
        for path in ["", "/memories", "/sessions", "/memories/" + seeded["espresso"]]:
            await page.goto(f"{url}/console/#/agents/{other}{path}")
            await expect(page.get_by_role("heading", name="Not found")).to_be_visible()
            await expect(page.locator("main")).not_to_contain_text("secret agent")
            await expect(page.locator("main table, main pre")).to_have_count(0)
        await page.screenshot(path=screenshot_path("console-not-found.png"))


async def test_tokens_change_in_place_and_revoking_ones_own_signs_out(db_url, embedder):
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        for n in range(25):  # two pages of clients, ordered by principal: these fill the second
            admin(
                "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
                i={"principal": f"client-{n:02}", "name": f"Client {n:02}", "policies": READER},
            )
        made = admin('mutation { createClientToken(principal: "admin") { token tokenId } }')
        mine, mine_id = made["createClientToken"]["token"], made["createClientToken"]["tokenId"]
        await sign_in(page, url, mine)
        await page.get_by_role("link", name="Clients and tokens").click()
        cards = page.locator("section.client")
        await expect(cards).to_have_count(20)

        # With the keyboard: the last page hides "Show more", and focus lands on what it loaded.
        await page.get_by_role("button", name="Show more clients").focus()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("button", name="Show more clients")).to_be_hidden()
        loaded = await cards.count()
        assert loaded > 20
        await expect(cards.nth(20).locator("h2")).to_be_focused()

        # A new token joins its client's table at once, newest first, while its secret shows.
        auditor = page.locator("section.client", has=page.locator("h2", has_text="auditor"))
        rows = auditor.locator("tbody tr")
        await expect(rows).to_have_count(1)
        await auditor.get_by_role("button", name="Create token").click()
        secret = await auditor.get_by_label("The new token").input_value()
        await expect(rows).to_have_count(2)
        await expect(rows.first.locator("td").first).to_have_text(
            re.compile(rf"^{re.escape(secret[:8])}… new ID [0-9a-f-]{{36}}$")
        )
        await expect(auditor.get_by_label("The new token")).to_be_visible()
        # Who issued each token (the signed-in admin's request; the bootstrap setting's own).
        await expect(rows.first.locator('td[data-label="Issued by"]')).to_have_text(
            f"admin via token {mine_id}"
        )
        admins = page.locator(
            "section.client", has=page.locator("h2 .mono", has_text=re.compile("^admin$"))
        )
        await expect(
            admins.locator("tr", has_text="bootstrap").locator('td[data-label="Issued by"]')
        ).to_have_text("bootstrap setting")
        await auditor.screenshot(path=screenshot_path("console-token-created.png"))

        # Revoked, it leaves its table; the clients loaded by "Show more" stay.
        await rows.first.get_by_role("button", name=re.compile("^Revoke token")).click()
        dialog = page.get_by_role("dialog")
        await expect(dialog).not_to_contain_text("signed in with")
        await dialog.get_by_role("button", name="Revoke token").click()
        await expect(rows).to_have_count(1)
        await expect(cards).to_have_count(loaded)
        await expect(auditor.get_by_role("status").first).to_contain_text(
            f"Token {secret[:8]}… revoked"
        )
        await expect(auditor.get_by_label("The new token")).to_have_count(0)  # no use now
        await expect(
            rows.first.get_by_role("button", name=re.compile("^Revoke token"))
        ).to_be_focused()
        refused = Api(url, secret).raw("{ viewer { principal } }")
        assert refused["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"

        # The console's own token: marked, and revoking it warns, then signs out.
        own = page.locator(
            "section.client", has=page.locator("h2 .mono", has_text=re.compile("^admin$"))
        )
        bootstrap = own.locator("tr", has_text="bootstrap")
        await bootstrap.get_by_role("button", name=re.compile("^Revoke token")).click()
        await expect(dialog).not_to_contain_text("signed in with")
        await page.keyboard.press("Escape")
        ours = own.locator("tr", has_text=mine[:8])
        await expect(ours).to_contain_text("signed in")
        await ours.get_by_role("button", name=re.compile("^Revoke token")).click()
        await expect(dialog).to_contain_text("This is the token you are signed in with")
        await expect(dialog).to_contain_text("signs you out")
        await page.screenshot(path=screenshot_path("console-revoke-own-token.png"))
        await dialog.get_by_role("button", name="Revoke and sign out").click()
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await expect(page.get_by_role("status")).to_contain_text("the one you were signed in with")
        await expect(page.locator("#nav")).to_be_hidden()
        assert await page.evaluate("sessionStorage.length") == 0
        await expect(page.get_by_label("API token")).to_be_focused()
        refused = Api(url, mine).raw("{ viewer { principal } }")
        assert refused["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        # The operator's other token still works.
        assert admin("{ viewer { principal } }")["viewer"]["principal"] == "admin"


EVERY_GRANT = [
    {"effect": "ALLOW", "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"], "resources": ["*"]}
]
ISSUE = """mutation($p: String!) { createClientToken(principal: $p) { token tokenId prefix } }"""


def refused(url: str, token: str) -> bool:
    """Whether a request sending `token` is refused as UNAUTHENTICATED over HTTP."""
    answer = httpx.post(
        url + "/graphql",
        json={"query": "{ viewer { principal } }"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    if answer.status_code != 401:
        assert answer.status_code == 200 and not answer.json().get("errors"), answer.text
        return False
    return answer.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_after_a_leak_the_operator_revokes_a_token_with_the_tokens_it_issued(
    db_url, embedder
):
    """revokeTokensIssuedBy from the clients page: beside a token's revoke, "Revoke with the
    tokens it issued" takes it and every token whose issuers lead back to it (a issued b, b
    issued c), reloads the tables and says which went; a token already revoked, and so in no
    table, by its ID. Tokens issued otherwise keep working; a token whose grants may not revoke
    tokens is offered neither."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        client = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
        for principal, policies in [("ops", EVERY_GRANT), ("deputy", EVERY_GRANT), ("bot", READER)]:
            admin(client, i={"principal": principal, "name": principal, "policies": policies})
        lister = [{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Client.*"]}]
        admin(client, i={"principal": "lister", "name": "lister", "policies": lister})

        def chain() -> dict[str, dict[str, str]]:
            a = admin(ISSUE, p="ops")["createClientToken"]
            b = Api(url, a["token"])(ISSUE, p="deputy")["createClientToken"]
            c = Api(url, b["token"])(ISSUE, p="bot")["createClientToken"]
            return {"a": a, "b": b, "c": c}

        made = chain()
        other = admin(ISSUE, p="bot")["createClientToken"]  # the bootstrap token's: no part of it
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()

        def card(principal: str):
            name = page.locator("h2 .mono", has_text=re.compile(f"^{principal}$"))
            return page.locator("section.client", has=name)

        def row(principal: str, t: dict[str, str]):
            return card(principal).locator("tbody tr", has_text=t["prefix"])

        for principal, k in [("ops", "a"), ("deputy", "b"), ("bot", "c")]:
            await expect(row(principal, made[k])).to_have_count(1)
        dialog = page.get_by_role("dialog")
        a = made["a"]["prefix"] + "…"
        await (
            row("ops", made["a"])
            .get_by_role(
                "button", name=f"Revoke with the tokens it issued: token {made['a']['prefix']}"
            )
            .click()
        )
        await expect(dialog).to_contain_text(f"Revoke token {a} and every token it issued?")
        await expect(dialog).not_to_contain_text("This is the token you are signed in with")
        # What goes, read first (tokensIssuedBy): how many, of which clients, by prefix.
        await expect(dialog).to_contain_text("This revokes 3 tokens of 3 clients in 1 account:")
        await expect(
            dialog.get_by_role("list", name="Tokens to revoke").locator("li")
        ).to_have_text(
            [
                f"{made[k]['prefix']}… of {p}"
                for k, p in [("a", "ops"), ("b", "deputy"), ("c", "bot")]
            ]
        )
        await expect(dialog).not_to_contain_text("signed in with is among them")
        await page.screenshot(path=screenshot_path("console-revoke-issued.png"))
        await dialog.get_by_role("button", name="Revoke with the tokens it issued").click()
        report = page.get_by_role("region", name="Tokens revoked")
        await expect(report.get_by_role("heading", name="Tokens revoked")).to_be_focused()
        await expect(report.locator("p")).to_have_text(
            f"Revoked token {a} and the 2 tokens it issued, in turn: requests sending any of them "
            "are refused from now on."
        )
        await expect(page.get_by_role("list", name="Tokens revoked").locator("li")).to_have_text(
            [made[k]["prefix"] + "…" for k in "abc"]
        )
        for principal, k in [("ops", "a"), ("deputy", "b"), ("bot", "c")]:
            await expect(row(principal, made[k])).to_have_count(0)
        await page.screenshot(path=screenshot_path("console-revoked-issued.png"))
        await expect(row("bot", other)).to_have_count(1)
        assert [refused(url, made[k]["token"]) for k in "abc"] == [True, True, True]
        assert not refused(url, other["token"])

        # Its token revoked first (so in no table), the rest of a chain goes by the token's ID.
        made = chain()
        admin(
            'mutation($t: UUID!) { revokeClientToken(principal: "ops", tokenId: $t) { tokenId } }',
            t=made["a"]["tokenId"],
        )
        assert refused(url, made["a"]["token"]) and not refused(url, made["c"]["token"])
        await page.reload()
        await expect(row("deputy", made["b"])).to_have_count(1)
        await expect(row("ops", made["a"])).to_have_count(0)
        await page.get_by_text("Revoke every token a leaked token issued, by its ID").click()
        await page.get_by_label("Token ID").fill("not-an-id")
        await page.get_by_label("Token ID").press("Enter")
        await expect(page.get_by_label("Token ID")).to_have_attribute("aria-invalid", "")
        await page.locator("details.leak").screenshot(path=screenshot_path("console-leak-form.png"))
        await page.get_by_label("Token ID").fill(made["a"]["tokenId"])
        await page.get_by_label("Token ID").press("Enter")
        await expect(dialog).to_contain_text(f"Revoke token {made['a']['tokenId']}")
        await expect(dialog).to_contain_text("This revokes 2 tokens of 2 clients in 1 account:")
        await dialog.get_by_role("button", name="Revoke with the tokens it issued").click()
        await expect(report.locator("p")).to_have_text(
            f"Revoked the 2 tokens it issued, in turn (token {made['a']['tokenId']} itself was "
            "revoked already): requests sending any of them are refused from now on."
        )
        await expect(page.get_by_role("list", name="Tokens revoked").locator("li")).to_have_text(
            [made[k]["prefix"] + "…" for k in "bc"]
        )
        await expect(row("deputy", made["b"])).to_have_count(0)
        await expect(row("bot", made["c"])).to_have_count(0)
        assert [refused(url, made[k]["token"]) for k in "bc"] == [True, True]
        assert not refused(url, other["token"])
        # Asked again: nothing is left to revoke, which is no error.
        await page.get_by_text("Revoke every token a leaked token issued, by its ID").click()
        await page.get_by_label("Token ID").fill(made["a"]["tokenId"])
        await page.get_by_label("Token ID").press("Enter")
        await expect(dialog).to_contain_text(
            "Your grants reach no such token, nor any token it issued"
        )
        await dialog.get_by_role("button", name="Revoke with the tokens it issued").click()
        nothing = page.get_by_role("region", name="Nothing revoked")
        await expect(nothing.get_by_role("heading")).to_be_focused()
        await expect(nothing).to_contain_text(
            f"Nothing revoked: token {made['a']['tokenId']} and every token it issued were "
            "revoked already, or your grants reach none of them."
        )
        await expect(page.locator("main .error")).to_have_count(0)

        # A token that may list tokens but not revoke them is offered neither.
        lister_token = admin(ISSUE, p="lister")["createClientToken"]["token"]
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, lister_token)
        await page.get_by_role("link", name="Clients and tokens").click()
        await expect(row("bot", other)).to_have_count(1)
        await expect(page.get_by_role("button", name=re.compile("^Revoke"))).to_have_count(0)
        await expect(page.get_by_label("Token ID")).to_have_count(0)

        # A token that may revoke tokens but not read them is told what goes in general words.
        blind = [
            *EVERY_GRANT,
            {"effect": "DENY", "actions": ["SELECT"], "resources": ["financial.Client.token"]},
        ]
        admin(client, i={"principal": "blind", "name": "blind", "policies": blind})
        blind_token = admin(ISSUE, p="blind")["createClientToken"]["token"]
        kept = chain()
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, blind_token)
        await page.get_by_role("link", name="Clients and tokens").click()
        await page.get_by_text("Revoke every token a leaked token issued, by its ID").click()
        await page.get_by_label("Token ID").fill(kept["a"]["tokenId"])
        await page.get_by_label("Token ID").press("Enter")
        await expect(dialog).to_contain_text("Requests sending it, any token it issued")
        await expect(dialog).to_contain_text("If the token you are signed in with is among them")
        await expect(dialog).not_to_contain_text("This revokes")
        await dialog.get_by_role("button", name="Cancel").click()
        assert not refused(url, kept["c"]["token"])

        # Signed in with a token the chain reaches (b), the console signs out, saying why.
        made = chain()
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, made["b"]["token"])
        await page.get_by_role("link", name="Clients and tokens").click()
        await (
            row("ops", made["a"])
            .get_by_role("button", name=re.compile("^Revoke with the tokens it issued"))
            .click()
        )
        await expect(dialog).to_contain_text(
            "The token you are signed in with is among them: this signs you out."
        )
        await dialog.get_by_role("button", name="Revoke with the tokens it issued").click()
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await expect(page.get_by_role("status")).to_contain_text(
            "The token you were signed in with was among them. Sign in with another token."
        )
        assert await page.evaluate("sessionStorage.length") == 0
        assert [refused(url, made[k]["token"]) for k in "abc"] == [True, True, True]


async def test_a_revocation_keeps_as_many_clients_shown_as_before(db_url, embedder):
    """After "Revoke with the tokens it issued" the clients page is loaded again, as it is now:
    it loaded the first page of clients alone, so that the clients "Show more" had loaded (where
    the revoked token was, here) went from the page. As many pages are loaded as were shown."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        client = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
        for n in range(25):  # two pages of clients, ordered by principal: ops is on the second
            admin(client, i={"principal": f"client-{n:02}", "name": f"{n:02}", "policies": READER})
        admin(client, i={"principal": "ops", "name": "ops", "policies": EVERY_GRANT})
        leaked = admin(ISSUE, p="ops")["createClientToken"]
        issued = Api(url, leaked["token"])(ISSUE, p="client-24")["createClientToken"]
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()
        cards = page.locator("section.client")
        await expect(cards).to_have_count(20)
        more = page.get_by_role("button", name="Show more clients")
        await more.click()
        await expect(more).to_be_hidden()
        shown = await cards.count()
        assert shown > 20
        ops = page.locator("section.client", has=page.locator("h2 .mono", has_text="ops"))
        await (
            ops.locator("tbody tr", has_text=leaked["prefix"])
            .get_by_role("button", name=re.compile("^Revoke with the tokens it issued"))
            .click()
        )
        await (
            page.get_by_role("dialog")
            .get_by_role("button", name="Revoke with the tokens it issued")
            .click()
        )
        report = page.get_by_role("region", name="Tokens revoked")
        await expect(report.get_by_role("heading", name="Tokens revoked")).to_be_focused()
        await expect(cards).to_have_count(shown)
        await expect(more).to_be_hidden()
        for token in (leaked, issued):
            await expect(page.locator("tbody tr", has_text=token["prefix"])).to_have_count(0)
        await expect(ops).to_have_count(1)


async def test_a_chain_longer_than_the_dialog_reads_still_warns_of_signing_out(db_url, embedder):
    """The revoke dialog reads a chain's first 1,000 tokens: past those it cannot tell that the
    signed-in token is not among them, so it says it may be, rather than nothing."""
    import asyncpg
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        client = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
        for principal, policies in [("ops", EVERY_GRANT), ("bot", READER)]:
            admin(client, i={"principal": principal, "name": principal, "policies": policies})
        a = admin(ISSUE, p="ops")["createClientToken"]
        conn = await asyncpg.connect(db_url)
        try:
            # 1,000 tokens a issued, older than b (which a issues next): the dialog's read.
            await conn.execute(
                """
                INSERT INTO client_tokens (account_id, principal, token_hash, issued_by,
                                           issued_by_account, issued_by_token, created)
                SELECT account_id, 'bot', sha256(('chain' || i)::bytea), 'ops', account_id, $1,
                       now() - interval '1 hour' + i * interval '1 ms'
                FROM accounts, generate_series(1, 1000) i WHERE is_default
                """,
                a["tokenId"],
            )
        finally:
            await conn.close()
        b = Api(url, a["token"])(ISSUE, p="ops")["createClientToken"]
        await sign_in(page, url, b["token"])
        await page.get_by_role("link", name="Clients and tokens").click()
        ops = page.locator("section.client", has=page.locator("h2 .mono", has_text="ops"))
        await (
            ops.locator("tbody tr", has_text=a["prefix"])
            .get_by_role("button", name=re.compile("^Revoke with the tokens it issued"))
            .click()
        )
        dialog = page.get_by_role("dialog")
        await expect(dialog).to_contain_text("This revokes more than 1000 tokens")
        await expect(dialog).to_contain_text(
            "If the token you are signed in with is among them, this signs you out."
        )
        await dialog.get_by_role("button", name="Cancel").click()
        assert not refused(url, b["token"])


async def test_tokens_show_their_ids_and_other_accounts_show_by_name(db_url, embedder):
    """Each token row shows its ID, and the token its issuer's request sent ("via token"), as
    the leak form asks for them; an operator's revoke dialog names other accounts (read once
    with `accounts`) beside their IDs. A tenant reads no other account's name or ID."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        account = "mutation($n: String!) { createAccount(input: {name: $n}) { accountId } }"
        acme = admin(account, n="Acme Ltd")["createAccount"]["accountId"]
        globex = admin(account, n="Globex")["createAccount"]["accountId"]
        client = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
        tenant = [
            {"effect": "ALLOW", "actions": ["SELECT", "INSERT"], "resources": ["financial.*"]}
        ]
        for principal, policies, at in [
            ("ops", EVERY_GRANT, None),
            ("deputy", READER, None),
            ("acme-bot", tenant, acme),
            ("globex-bot", tenant, globex),
        ]:
            admin(
                client,
                i={
                    "principal": principal,
                    "name": principal,
                    "policies": policies,
                    "accountId": at,
                },
            )
        issue = """mutation($p: String!, $a: UUID) { createClientToken(principal: $p, accountId: $a)
          { token tokenId prefix } }"""
        a = admin(ISSUE, p="ops")["createClientToken"]
        ops = Api(url, a["token"])
        b = ops(issue, p="deputy")["createClientToken"]
        c = ops(issue, p="acme-bot", a=acme)["createClientToken"]
        d = ops(issue, p="globex-bot", a=globex)["createClientToken"]

        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()

        def row(principal: str, t: dict[str, str]):
            name = page.locator("h2 .mono", has_text=re.compile(f"^{re.escape(principal)}$"))
            return page.locator("section.client", has=name).locator(
                "tbody tr", has_text=t["prefix"]
            )

        await expect(row("ops", a).locator('td[data-label="Token"]')).to_have_text(
            f"{a['prefix']}… ID {a['tokenId']}"
        )
        await expect(row("deputy", b).locator('td[data-label="Issued by"]')).to_have_text(
            f"ops via token {a['tokenId']}"
        )
        await page.locator(
            "section.client", has=page.locator("h2 .mono", has_text="deputy")
        ).screenshot(path=screenshot_path("console-token-ids.png"))
        await (
            row("ops", a)
            .get_by_role("button", name=re.compile("^Revoke with the tokens it issued"))
            .click()
        )
        dialog = page.get_by_role("dialog")
        await expect(dialog).to_contain_text("This revokes 4 tokens of 4 clients in 3 accounts:")
        await expect(
            dialog.get_by_role("list", name="Tokens to revoke").locator("li")
        ).to_have_text(
            [
                f"{a['prefix']}… of ops",
                f"{b['prefix']}… of deputy",
                f"{c['prefix']}… of acme-bot (account Acme Ltd {acme})",
                f"{d['prefix']}… of globex-bot (account Globex {globex})",
            ]
        )
        await page.screenshot(path=screenshot_path("console-revoke-accounts.png"))
        await dialog.get_by_role("button", name="Cancel").click()

        # Another account chosen: its clients, their tokens' issuers by account name and ID.
        accounts = admin("{ accounts(first: 100) { nodes { accountId name } } }")["accounts"]
        names = {n["accountId"]: n["name"] for n in accounts["nodes"]}
        operator = admin("{ viewer { accountId } }")["viewer"]["accountId"]
        choice = page.get_by_label("Account", exact=True)
        await expect(choice.locator("option")).to_have_count(4)  # with the seed's Other Co
        await expect(choice).to_have_value(operator)
        await choice.select_option(acme)
        await expect(page).to_have_url(re.compile(f"#/clients\\?account={acme}$"))
        await expect(page.locator("section.client h2 .mono")).to_have_text(["acme-bot"])
        await expect(row("acme-bot", c).locator('td[data-label="Issued by"]')).to_have_text(
            f"ops (account {names[operator]} {operator}) via token {a['tokenId']}"
        )
        await page.screenshot(path=screenshot_path("console-clients-of-account.png"))
        # A client created there is that account's.
        await page.get_by_role("button", name="New client").click()
        form = page.get_by_role("form", name="New client")
        await form.get_by_label("Principal").fill("acme-helper")
        await form.get_by_label("Name").fill("Acme helper")
        resources = form.get_by_role("group", name="Policy 1").get_by_label("Resources")
        await resources.fill("financial.Action.*")
        await form.get_by_role("button", name="Create client").click()
        await expect(page.locator("section.client h2 .mono")).to_have_text(
            ["acme-helper", "acme-bot"]
        )
        read = 'query($a: UUID) { client(principal: "acme-helper", accountId: $a) { name } }'
        assert admin(read, a=acme)["client"] == {"name": "Acme helper"}
        assert admin(read)["client"] is None

        # A tenant's token: its tokens' IDs; of the operator's, neither account nor token.
        mine = admin(issue, p="acme-bot", a=acme)["createClientToken"]
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, mine["token"])
        await page.get_by_role("link", name="Clients and tokens").click()
        await expect(row("acme-bot", c).locator('td[data-label="Token"]')).to_have_text(
            f"{c['prefix']}… ID {c['tokenId']}"
        )
        await expect(row("acme-bot", c).locator('td[data-label="Issued by"]')).to_have_text(
            "default account"
        )
        await expect(page.get_by_label("Account", exact=True)).to_have_count(0)
        main = page.locator("main")
        for unseen in ["Globex", globex, operator, a["tokenId"]]:
            await expect(main).not_to_contain_text(unseen)


SEARCHER = [
    {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]},
    {
        "effect": "ALLOW",
        "actions": ["SELECT"],
        "resources": ["financial.AgentMemory.indexes.search"],
    },
    {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.AgentMemory.document"]},
]


async def test_a_token_expiry_past_the_year_9999_is_said_at_its_field(db_url, embedder):
    """The browser's date field takes years past 9999, which no time the server holds reaches:
    the field says so and no token is made, not "Something went wrong: RangeError"."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()
        auditor = page.locator("section.client", has=page.locator("h2", has_text="auditor"))
        rows = auditor.locator("tbody tr")
        await expect(rows).to_have_count(1)
        expires = auditor.get_by_label("Expires (optional, your local time)")
        await expires.fill("10000-01-01T00:00")
        await auditor.get_by_role("button", name="Create token").click()
        error = page.locator("#" + await expires.get_attribute("aria-describedby"))
        await expect(error).to_contain_text("before the year 10000")
        await expect(expires).to_be_focused()
        await expect(auditor.locator(".error")).to_have_count(0)
        await expect(rows).to_have_count(1)

        # A date it holds makes the token, and the note goes.
        await expires.fill("2999-01-01T00:00")
        await auditor.get_by_role("button", name="Create token").click()
        await expect(auditor.get_by_label("The new token")).to_be_visible()
        await expect(rows).to_have_count(2)
        await expect(error).to_be_hidden()


async def test_a_searcher_may_search_and_caps_are_stated(db_url, embedder):
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        agent = seeded["agent"]
        # A supersede chain longer than the page shows either way of a record.
        chain = [admin(ADD, a=agent, i={"summary": "Opening hours v0", "kind": "fact"})]
        for n in range(1, 23):
            added = admin(
                ADD,
                a=agent,
                i={
                    "summary": f"Opening hours v{n}",
                    "kind": "fact",
                    "replaces": chain[-1]["addAgentMemory"]["memoryId"],
                },
            )
            chain.append(added)
        ids = [c["addAgentMemory"]["memoryId"] for c in chain]
        await sign_in(page, url, ADMIN)
        steps = page.get_by_role("list", name="Supersede chain").locator("> li")
        await page.goto(f"{url}/console/#/agents/{agent}/memories/{ids[22]}")
        await expect(steps).to_have_count(21)
        await expect(steps.first).to_contain_text("Opening hours v2")
        notice = page.locator("main .notice")
        await expect(notice).to_have_count(1)
        await expect(notice).to_contain_text("Showing 20 earlier records of the chain")
        await notice.get_by_role("link", name="the earliest one shown").click()
        await expect(page.get_by_role("heading", name="Opening hours v2")).to_be_visible()
        await expect(notice).to_have_count(0)  # 2 earlier, 20 later: nothing left out
        await expect(steps).to_have_count(23)
        await page.goto(f"{url}/console/#/agents/{agent}/memories/{ids[0]}")
        await expect(steps).to_have_count(21)
        await expect(notice).to_contain_text("Showing 20 later records of the chain")

        # An agent shows its 20 newest earlier versions, and says when there are more.
        await page.goto(f"{url}/console/#/agents/{agent}")
        await expect(page.get_by_role("heading", name="Support desk")).to_be_visible()
        await expect(page.locator("main .notice")).to_have_count(0)
        harness = admin("query($a: UUID!) { action(actionId: $a) { harness } }", a=agent)
        for n in range(21):
            admin(
                "mutation($a: UUID!, $i: ActionInput!) { updateAction(actionId: $a, input: $i)"
                " { version } }",
                a=agent,
                i={
                    "name": "Support desk",
                    "instructions": f"v{n}",
                    "harness": harness["action"]["harness"],
                },
            )
        await page.reload()
        await expect(page.locator("details.version")).to_have_count(20)
        await expect(page.locator("main .notice")).to_have_text(
            "Showing the 20 newest of 21 earlier versions; read older ones with the API: "
            "action(actionId, version)."
        )

        # A token that may search but not list memories is offered search, and told the cap.
        admin(
            "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
            i={"principal": "searcher", "name": "Searcher", "policies": SEARCHER},
        )
        searcher = admin('mutation { createClientToken(principal: "searcher") { token } }')
        for n in range(21):
            admin(ADD, a=agent, i={"summary": f"Latte order number {n}", "kind": "event"})
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, searcher["createClientToken"]["token"])
        await page.goto(f"{url}/console/#/agents/{agent}")
        await page.get_by_role("link", name="Memories").click()
        await expect(page.get_by_role("heading", name="Memories of Support desk")).to_be_visible()
        await expect(page.locator(".notice")).to_contain_text(
            "Your token's grants do not allow listing this agent's memories"
        )
        await page.get_by_label("Search memories").fill("latte")
        await page.get_by_label("Mode").select_option("LEXICAL")
        await page.get_by_label("Search memories").press("Enter")
        results = page.locator("table", has=page.locator("caption", has_text="Search results"))
        await expect(results.locator("tbody tr")).to_have_count(20)
        await expect(results.locator("caption")).to_have_text(
            "Search results for “latte” (first 20)"
        )
        found = page.locator("form[role=search] + p[role=status]")
        await expect(found).to_have_text(
            "Showing the first 20 results; more matched: show more, or refine the query to narrow "
            "them."
        )
        await page.screenshot(path=screenshot_path("console-search-capped.png"), full_page=True)
        # It may not read a record, so a result links to no page it would be refused.
        await expect(results.get_by_role("link")).to_have_count(0)
        await page.get_by_label("Search memories").fill("espresso")
        await page.get_by_label("Search memories").press("Enter")
        await expect(results.locator("tbody tr")).to_have_count(1)
        await expect(found).to_have_text("1 record matched.")
        await expect(results.locator("caption")).to_have_text("Search results for “espresso” (1)")


async def test_a_blank_search_is_said_not_shown_as_results_scored_0(db_url, embedder):
    """Spaces alone pass the field's `required`, and the server lists the newest records for a
    blank query, each scored 0: the field says to type words, and no results are shown."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{seeded['agent']}/memories")
        query = page.get_by_label("Search memories")
        await query.fill("   ")
        await query.press("Enter")
        error = page.locator("#" + await query.get_attribute("aria-describedby"))
        await expect(error).to_contain_text("Type the words to search for")
        await expect(query).to_be_focused()
        await expect(page.locator("caption", has_text="Search results")).to_have_count(0)

        await query.fill("espresso")
        await query.press("Enter")
        results = page.locator("table", has=page.locator("caption", has_text="Search results"))
        await expect(results.get_by_text("prefers espresso")).to_be_visible()
        await expect(error).to_be_hidden()

        # What was typed is shown as records are: a right-to-left override as its code point,
        # which cannot reorder the caption.
        await query.fill("espresso \u202eoffee")
        await query.press("Enter")
        caption = page.locator("caption", has_text="Search results")
        await expect(caption).to_contain_text("U+202E")
        assert "\u202e" not in await caption.inner_text()


async def test_search_shows_more_results_a_page_at_a_time(db_url, embedder):
    """Memory search pages with searchMemories' cursor: "Show more results" appends the next
    page (the same query and mode), each record once, in the order one large page has them, and
    hides after the last page, leaving focus on the first row it loaded."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        agent = seeded["agent"]
        for n in range(45):  # more than two pages (20) match
            admin(
                ADD, a=agent, i={"summary": f"Latte order {n} for table {n % 7}", "kind": "event"}
            )
        whole = admin(
            """query($a: UUID!) { action(actionId: $a) { searchMemories(query: "latte order",
              mode: HYBRID, first: 1000) { nodes { summary } pageInfo { hasNextPage } } } }""",
            a=agent,
        )["action"]["searchMemories"]
        assert not whole["pageInfo"]["hasNextPage"]
        expected = [n["summary"] for n in whole["nodes"]]
        assert 45 <= len(expected) < 60  # three pages: 20, 20 and the rest

        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        await page.get_by_label("Search memories").fill("latte order")
        await page.get_by_label("Mode").select_option("HYBRID")
        await page.get_by_label("Search memories").press("Enter")
        results = page.locator("table", has=page.locator("caption", has_text="Search results"))
        rows = results.locator("tbody tr")
        summaries = rows.locator("td[data-label=Summary]")
        more = page.get_by_role("button", name="Show more results")
        await expect(rows).to_have_count(20)
        await expect(results.locator("caption")).to_have_text(
            "Search results for “latte order” (first 20)"
        )

        # With the keyboard: the next page joins the table, and focus stays to ask for more.
        await more.focus()
        await page.keyboard.press("Enter")
        await expect(rows).to_have_count(40)
        await expect(more).to_be_focused()
        await expect(results.locator("caption")).to_have_text(
            "Search results for “latte order” (first 40)"
        )
        # The last page: the button goes, focus lands on the first row it loaded.
        await page.keyboard.press("Enter")
        await expect(rows).to_have_count(len(expected))
        await expect(more).to_be_hidden()
        await expect(rows.nth(40)).to_be_focused()
        await expect(results.locator("caption")).to_have_text(
            f"Search results for “latte order” ({len(expected)})"
        )
        await expect(page.locator("form[role=search] + p[role=status]")).to_have_text(
            f"{len(expected)} records matched."
        )
        # Each record once, in the order of the one large page.
        assert await summaries.all_inner_texts() == expected
        await page.screenshot(path=screenshot_path("console-search-more.png"), full_page=True)


CREATE_CLIENT = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
READ_CLIENT = """query($p: String!) { client(principal: $p) {
  name modified policies { effect actions resources } } }"""
MEMORY = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.AgentMemory.*"]}
MANAGE = {
    "effect": "ALLOW",
    "actions": ["SELECT", "INSERT", "UPDATE", "DELETE"],
    "resources": ["financial.Client.*"],
}


def client_card(page, principal: str):
    name = page.locator("h2 .mono", has_text=re.compile(f"^{re.escape(principal)}$"))
    return page.locator("section.client", has=name)


async def as_manager(page, url: str) -> Api:
    """A manager (every verb on clients, SELECT on memory) and a memory reader it covers,
    the console signed in as the manager on the clients page; the administrator's Api."""
    admin = Api(url, ADMIN)
    admin(
        CREATE_CLIENT, i={"principal": "manager", "name": "Manager", "policies": [MANAGE, MEMORY]}
    )
    admin(CREATE_CLIENT, i={"principal": "memory-reader", "name": "Memory", "policies": [MEMORY]})
    token = admin('mutation { createClientToken(principal: "manager") { token } }')
    await sign_in(page, url, token["createClientToken"]["token"])
    await page.get_by_role("link", name="Clients and tokens").click()
    return admin


async def test_edit_and_new_tokens_are_offered_only_for_clients_the_token_covers(db_url, embedder):
    """A client changes and issues tokens only for clients holding no more than it does: the
    console asks (Client.coveredByViewer) and offers "Edit client" and "Create token" for those
    alone, saying why elsewhere; a token that may not update clients is told so once."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = await as_manager(page, url)

        # Wider than the manager: the administrator, and the auditor (it reads agents).
        for wider in ("admin", "auditor"):
            await expect(client_card(page, wider).locator(".notice")).to_have_text(
                "Your token cannot edit this client or create tokens for it: it holds grants yours "
                "does not (a client changes, and issues tokens for, only clients that hold no more "
                "than it does)."
            )
            for offer in ("Edit client", "Create token"):
                await expect(
                    client_card(page, wider).get_by_role("button", name=offer)
                ).to_have_count(0)
        await client_card(page, "auditor").screenshot(
            path=screenshot_path("console-token-not-offered.png")
        )
        # Covered: itself, and a client holding part of what it holds. Both are offered.
        for covered in ("manager", "memory-reader"):
            await expect(client_card(page, covered).locator(".notice")).to_have_count(0)
            for offer in ("Edit client", "Create token"):
                await expect(
                    client_card(page, covered).get_by_role("button", name=offer)
                ).to_have_count(1)
        covered = client_card(page, "memory-reader")
        await covered.get_by_role("button", name="Create token").click()
        secret = await covered.get_by_label("The new token").input_value()
        assert (
            Api(url, secret)("{ viewer { principal } }")["viewer"]["principal"] == "memory-reader"
        )

        # A token that may list clients but not change them: no edit anywhere, and why, once.
        looker = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Client.*"]}
        admin(CREATE_CLIENT, i={"principal": "looker", "name": "Looker", "policies": [looker]})
        token = admin('mutation { createClientToken(principal: "looker") { token } }')
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, token["createClientToken"]["token"])
        await page.get_by_role("link", name="Clients and tokens").click()
        await expect(client_card(page, "looker")).to_be_visible()
        await expect(page.get_by_role("button", name="Edit client")).to_have_count(0)
        # Nor creating or deleting clients: no button for either, and why.
        await expect(page.get_by_role("button", name="New client")).to_have_count(0)
        await expect(page.get_by_role("button", name=re.compile("^Delete client"))).to_have_count(0)
        await expect(page.locator("main > .notice")).to_have_text(
            [
                f"Your token's grants do not allow {what}: this client is not allowed to "
                f"{verb} financial.Client.document."
                for what, verb in [
                    ("editing clients", "UPDATE"),
                    ("deleting clients", "DELETE"),
                    ("creating clients", "INSERT"),
                ]
            ]
        )


async def test_an_operator_edits_a_client_and_sees_the_new_values(db_url, embedder):
    """ "Edit client" opens a form filled with the client's name and policies (focus on the name,
    Escape cancels); a pattern the server refuses is said at its field with nothing saved; the
    saved values show in the card at once, without reloading the page; and a change someone
    made meanwhile is shown, not overwritten, until the operator saves again."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()
        await page.evaluate("window.stayed = true")  # gone if the page were loaded again
        auditor = client_card(page, "auditor")
        edit = auditor.get_by_role("button", name="Edit client auditor")
        form = auditor.get_by_role("form", name="Edit client auditor")
        first = form.get_by_role("group", name="Policy 1")
        second = form.get_by_role("group", name="Policy 2")

        # Filled with what it holds; Escape leaves it as it was, focus back on the button.
        await edit.click()
        await expect(form.get_by_label("Name")).to_be_focused()
        await expect(form.get_by_label("Name")).to_have_value("Auditor")
        await expect(first.get_by_label("Effect")).to_have_value("ALLOW")
        await expect(first.get_by_label("SELECT")).to_be_checked()
        await expect(first.get_by_label("UPDATE")).not_to_be_checked()
        await expect(first.get_by_label("Resources")).to_have_value("financial.Action.*")
        await expect(second.get_by_label("Resources")).to_have_value("financial.AgentMemory.*")
        await page.keyboard.press("Escape")
        await expect(form).to_have_count(0)
        await expect(edit).to_be_focused()
        await expect(auditor.locator("li")).to_have_text(
            ["ALLOW SELECT on financial.Action.*", "ALLOW SELECT on financial.AgentMemory.*"]
        )

        # A typo in a pattern: refused at its field, the form open with what was typed.
        await page.keyboard.press("Enter")
        await form.get_by_label("Name").fill("Auditor (EU)")
        await second.get_by_label("Resources").fill("financial.agentmemory.document")
        await form.get_by_role("button", name="Save changes").click()
        resources = second.get_by_label("Resources")
        error = page.locator("#" + await resources.get_attribute("aria-describedby"))
        await expect(error).to_contain_text("'financial.agentmemory.document' matches no known")
        await expect(resources).to_have_attribute("aria-invalid", "")
        await expect(resources).to_be_focused()
        await expect(form.get_by_role("alert").last).to_have_text(
            "Not saved: correct the resources of policy 2."
        )
        await expect(form.get_by_label("Name")).to_have_value("Auditor (EU)")
        assert admin(READ_CLIENT, p="auditor")["client"]["name"] == "Auditor"  # nothing half-saved

        # Corrected, with one more policy; saved, the card shows it at once.
        await resources.fill("financial.AgentMemory.document")
        await form.get_by_role("button", name="Add a policy").click()
        third = form.get_by_role("group", name="Policy 3")
        await expect(third.get_by_label("Resources")).to_be_focused()
        await page.keyboard.type("financial.AgentMemory.indexes.search")
        await third.get_by_label("Effect").select_option("DENY")
        await page.screenshot(path=screenshot_path("console-client-edit.png"), full_page=True)
        await third.get_by_label("Resources").press("Control+Enter")
        await expect(form).to_have_count(0)
        await expect(auditor.locator("h2")).to_have_text("Auditor (EU) auditor")
        policies = [
            "ALLOW SELECT on financial.Action.*",
            "ALLOW SELECT on financial.AgentMemory.document",
            "DENY SELECT on financial.AgentMemory.indexes.search",
        ]
        await expect(auditor.locator("li")).to_have_text(policies)
        await expect(auditor.get_by_role("status").first).to_have_text("Saved client auditor.")
        await expect(edit).to_be_focused()
        assert await page.evaluate("window.stayed") is True
        saved = admin(READ_CLIENT, p="auditor")["client"]
        assert saved["name"] == "Auditor (EU)"
        assert [p["resources"] for p in saved["policies"]] == [
            ["financial.Action.*"],
            ["financial.AgentMemory.document"],
            ["financial.AgentMemory.indexes.search"],
        ]
        assert saved["policies"][2]["effect"] == "DENY"
        # The next form starts from the saved values.
        await edit.click()
        await expect(form.get_by_label("Name")).to_have_value("Auditor (EU)")
        await expect(third.get_by_label("Effect")).to_have_value("DENY")

        # Someone else changes it meanwhile: not overwritten; shown, the typing kept.
        admin(
            """mutation { updateClient(principal: "auditor", input: {name: "Auditor (theirs)"})
              { name } }"""
        )
        await form.get_by_label("Name").fill("Auditor (mine)")
        await form.get_by_role("button", name="Save changes").click()
        alert = form.get_by_role("alert").last
        await expect(alert).to_contain_text(
            "someone changed this client after you opened this form"
        )
        await expect(alert).to_contain_text("Name: Auditor (theirs)")
        await expect(form.get_by_label("Name")).to_have_value("Auditor (mine)")
        assert admin(READ_CLIENT, p="auditor")["client"]["name"] == "Auditor (theirs)"
        await page.screenshot(
            path=screenshot_path("console-client-edit-conflict.png"), full_page=True
        )
        # Having seen theirs, saving again is a choice: it is made.
        await form.get_by_role("button", name="Save changes").click()
        await expect(auditor.locator("h2")).to_have_text("Auditor (mine) auditor")
        assert admin(READ_CLIENT, p="auditor")["client"]["name"] == "Auditor (mine)"


async def test_an_edit_wider_than_the_operators_grants_is_refused_and_changes_nothing(
    db_url, embedder
):
    """The manager may edit the memory reader it covers, but not give it a grant the manager
    does not hold: refused in words, the form open with the input, the client unchanged. Edited,
    the manager's own client changes what the console offers it at once."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = await as_manager(page, url)
        before = admin(READ_CLIENT, p="memory-reader")["client"]
        reader = client_card(page, "memory-reader")
        await reader.get_by_role("button", name="Edit client").click()
        form = reader.get_by_role("form", name="Edit client memory-reader")
        await form.get_by_role("button", name="Add a policy").click()
        added = form.get_by_role("group", name="Policy 2")
        await added.get_by_label("Resources").fill("financial.Action.*")
        await added.get_by_label("UPDATE").check()
        await form.get_by_role("button", name="Save changes").click()
        alert = form.get_by_role("alert").last
        await expect(alert).to_contain_text(
            "Not saved: these policies would give SELECT financial.Action.document"
        )
        await expect(alert).to_contain_text("which your token does not hold")
        await expect(added.get_by_label("Resources")).to_have_value("financial.Action.*")
        await expect(added.get_by_label("UPDATE")).to_be_checked()
        await page.screenshot(
            path=screenshot_path("console-client-edit-refused.png"), full_page=True
        )
        assert admin(READ_CLIENT, p="memory-reader")["client"] == before
        # Nor wider by a verb on what it holds.
        await form.get_by_role("button", name="Remove policy 2").click()
        await form.get_by_role("group", name="Policy 1").get_by_label("DELETE").check()
        await form.get_by_role("button", name="Save changes").click()
        await expect(alert).to_contain_text("DELETE financial.AgentMemory.document")
        assert admin(READ_CLIENT, p="memory-reader")["client"] == before
        await page.keyboard.press("Escape")
        await expect(reader.locator("li")).to_have_text(["ALLOW SELECT on financial.AgentMemory.*"])

        # Its own client: it may narrow it; the console then offers what is left.
        mine = client_card(page, "manager")
        await mine.get_by_role("button", name="Edit client").click()
        form = mine.get_by_role("form", name="Edit client manager")
        await expect(form.locator(".notice")).to_contain_text("the client you are signed in as")
        await form.get_by_role("group", name="Policy 1").get_by_label("UPDATE").uncheck()
        await form.get_by_role("button", name="Save changes").click()
        await expect(page.get_by_role("status").first).to_contain_text(
            "Saved client manager, the one you are signed in as"
        )
        await expect(page.get_by_role("button", name="Edit client")).to_have_count(0)
        await expect(page.locator("main > .notice").last).to_have_text(
            "Your token's grants do not allow editing clients: this client is not allowed to "
            "UPDATE financial.Client.document."
        )
        await page.screenshot(path=screenshot_path("console-client-edit-own.png"), full_page=True)


# Text that hides or reorders what is around it: read plainly, "safe" + RLO + "exe.txt" shows
# as "safetxt.exe", and a zero-width space splits a word no one sees split.
DISGUISED = "safe\u202eexe.txt\u202c invoice\u200bpaid"
UNBROKEN = "x" * 200  # a label value, a client name: one word as wide as 20 screens of a phone

WIDER = """() => [document.documentElement.scrollWidth, window.innerWidth]"""


async def test_long_unbroken_data_wraps_and_disguising_characters_show(db_url, embedder):
    """Data from others reaches the page as text; also text made to mislead: a 200-character
    unbroken label value, client name or 500-character summary wraps inside the page (at desktop
    and phone width), and bidi overrides and zero-width spaces in a record show as their code
    points, while the agent's edit form keeps them as stored."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        agent = seeded["agent"]
        labelled = {"kind": "fact", "labels": [{"name": "customer_id", "value": UNBROKEN}]}
        wide = admin(ADD, a=agent, i={"summary": "L" * 500, **labelled})["addAgentMemory"]
        hidden = admin(ADD, a=agent, i={"summary": DISGUISED, "content": DISGUISED, "kind": "fact"})
        hidden = hidden["addAgentMemory"]["memoryId"]
        admin(
            "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
            i={"principal": "wide", "name": UNBROKEN, "policies": READER},
        )
        harness = admin("query($a: UUID!) { action(actionId: $a) { harness } }", a=agent)
        admin(
            "mutation($a: UUID!, $i: ActionInput!) { updateAction(actionId: $a, input: $i)"
            " { version } }",
            a=agent,
            i={"name": "Support desk", "instructions": DISGUISED, **harness["action"]},
        )
        await sign_in(page, url, ADMIN)
        pages = {
            "memories": f"#/agents/{agent}/memories",
            "record": f"#/agents/{agent}/memories/{wide['memoryId']}",
            "clients": "#/clients",
            "new agent": "#/agents/new",
            "session": f"#/agents/{agent}/sessions/s-1",
        }
        for width in (1280, 390):
            await page.set_viewport_size({"width": width, "height": 900})
            for name, path in pages.items():
                await page.goto(f"{url}/console/{path}")
                await expect(page.locator("main h1")).to_be_visible()
                await expect(page.locator("main[aria-busy]")).to_have_count(0)
                assert await page.evaluate(WIDER) == [width, width], (name, width)
        await page.screenshot(path=screenshot_path("console-long-data-phone.png"), full_page=True)
        await page.set_viewport_size({"width": 1280, "height": 900})

        await page.goto(f"{url}/console/#/agents/{agent}/memories/{hidden}")
        shown = "safeU+202Eexe.txtU+202C invoiceU+200Bpaid"
        await expect(page.locator("main h1")).to_have_text(shown)
        await expect(page.locator("main pre.json").first).to_have_text(shown)
        await expect(page.locator("main h1 .hidden-char")).to_have_count(3)
        text = await page.locator("main").inner_text()
        assert not set("\u202e\u202c\u200b") & set(text)
        await page.screenshot(path=screenshot_path("console-disguised-record.png"))
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        listed = page.locator("table", has=page.locator("caption", has_text="newest first"))
        await expect(listed.get_by_role("link", name=shown)).to_be_visible()
        # Edited, the instructions are what is stored, not what is shown.
        await page.goto(f"{url}/console/#/agents/{agent}")
        await expect(page.locator("main pre.json").nth(1)).to_have_text(shown)
        await expect(page.get_by_label("Instructions")).to_have_value(DISGUISED)


async def test_sign_in_says_what_is_wrong_with_a_token(db_url, embedder):
    """A token pasted with a character no token holds (such as the … a token list ends its
    prefix with) is said to be one, not "the server could not be reached"; one pasted with
    "Bearer " before it signs in; one that expires while the console is open signs it out
    saying when it expired, with the focus on the token field."""
    import asyncio

    import asyncpg
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        await page.goto(url + "/console")
        field = page.get_by_label("API token")
        await field.fill(ADMIN[:8] + "…")
        await field.press("Enter")
        await expect(page.get_by_role("alert")).to_have_text(
            "This is not a whole API token: it holds “…” (U+2026) at character 9, and a token "
            "holds only letters, digits, spaces and ASCII punctuation. Copy the whole token "
            "again (a list shows only its first characters, followed by …)."
        )
        await expect(field).to_be_focused()
        await field.fill(f"Bearer {seeded['reader']}")
        await field.press("Enter")
        await expect(page.get_by_role("heading", name="Agents")).to_be_visible()
        assert (
            await page.evaluate("sessionStorage.getItem('engram.console.token')")
            == (seeded["reader"])
        )

        # The reader's token expires while the page is open.
        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute(
                "UPDATE client_tokens SET expires = now() - interval '1 minute' "
                "WHERE principal = 'auditor'"
            )
        finally:
            await conn.close()
        await asyncio.sleep(1.2)  # auth/verified.py: a verification serves for a second
        await page.get_by_role("link", name="Support desk").click()
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await expect(page.get_by_role("status")).to_have_text(
            re.compile(
                r"^The server did not accept this token: the API token expired at \S+; ask for "
                r"a new one\. Sign in again with a valid token\.$"
            )
        )
        await expect(field).to_be_focused()
        assert await page.evaluate("sessionStorage.length") == 0


async def test_an_agent_saved_meanwhile_is_not_overwritten_unseen(db_url, embedder):
    """The agent's edit form saves with the version it was filled from (expectedVersion): a
    version someone saved meanwhile is said, not overwritten, and nothing is written; the edits
    stay in the form, and saving again writes them over that version as a choice."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        agent = seeded["agent"]
        read = "query($a: UUID!) { action(actionId: $a) { version instructions harness } }"
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}")
        await expect(page.get_by_role("heading", name="Version 1 (current)")).to_be_visible()
        harness = admin(read, a=agent)["action"]["harness"]
        update = """mutation($a: UUID!, $i: ActionInput!) { updateAction(actionId: $a, input: $i)
          { version } }"""
        theirs = {"name": "Support desk", "instructions": "Theirs.", "harness": harness}
        assert admin(update, a=agent, i=theirs)["updateAction"]["version"] == 2

        await page.get_by_label("Instructions").fill("Mine.")
        await page.get_by_role("button", name="Save new version").click()
        alert = page.locator("form").get_by_role("alert")
        await expect(alert).to_contain_text(
            "Not saved: admin saved version 2 at 20", use_inner_text=True
        )
        await expect(alert).to_contain_text("after version 1 this form was filled from")
        await page.screenshot(path=screenshot_path("console-agent-conflict.png"), full_page=True)
        now = admin(read, a=agent)["action"]
        assert (now["version"], now["instructions"]) == (2, "Theirs.")
        await expect(page.get_by_label("Instructions")).to_have_value("Mine.")

        # Saved again, knowingly: the next version, over version 2.
        await page.get_by_role("button", name="Save new version").click()
        await expect(page.get_by_role("heading", name="Version 3 (current)")).to_be_visible()
        now = admin(read, a=agent)["action"]
        assert (now["version"], now["instructions"]) == (3, "Mine.")


class Refusing:
    """The test's embedder, refusing every text once `refusing` is set, as a provider with a
    revoked key does: a refusal retrying does not mend (EmbeddingFailed, not transient)."""

    def __init__(self, inner) -> None:
        self.inner, self.refusing = inner, False
        self.name, self.dimensions = inner.name, inner.dimensions

    async def embed(self, texts: list[str]):
        from app.embeddings.errors import EmbeddingFailed

        if self.refusing:
            raise EmbeddingFailed("401 invalid key", transient=False)
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        return None


async def test_an_embedding_model_that_refuses_is_not_said_to_be_the_database(db_url, embedder):
    """UNAVAILABLE has more than one cause: a search the embedding model refuses says the
    server's own sentence (the provider is misconfigured, retrying will not help), not "the
    server cannot reach its database, try again"."""
    from playwright.async_api import expect

    refusing = Refusing(embedder)
    async with console(db_url, refusing) as (url, page, seeded):
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{seeded['agent']}/memories")
        refusing.refusing = True
        await page.get_by_label("Search memories").fill("espresso")
        await page.get_by_label("Mode").select_option("VECTOR")
        await page.get_by_label("Search memories").press("Enter")
        await expect(page.locator("main .error")).to_have_text(
            "The server cannot do this right now: the embedding model refused the text: the "
            "service's embedding provider is misconfigured (its log says why), and retrying will "
            "not help until an operator fixes it."
        )
        # Lexical search needs no model: it still finds the record.
        await page.get_by_label("Mode").select_option("LEXICAL")
        await page.get_by_label("Search memories").press("Enter")
        results = page.locator("table", has=page.locator("caption", has_text="Search results"))
        await expect(results.get_by_role("link", name=re.compile("espresso"))).to_be_visible()


async def test_a_token_revoked_elsewhere_leaves_its_list_and_a_bad_address_is_not_found(
    db_url, embedder
):
    """Revoking a token someone revoked since the list loaded (NOT_FOUND) is no error to act
    on: the row goes, saying it was already revoked. An address with a broken %-escape is a
    page that does not exist, not "Something went wrong: URIError"."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        made = admin('mutation { createClientToken(principal: "auditor") { tokenId prefix } }')
        made = made["createClientToken"]
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()
        auditor = page.locator("section.client", has=page.locator("h2", has_text="auditor"))
        rows = auditor.locator("tbody tr")
        await expect(rows).to_have_count(2)
        admin(
            'mutation($t: UUID!) { revokeClientToken(principal: "auditor", tokenId: $t) '
            "{ tokenId } }",
            t=made["tokenId"],
        )
        row = auditor.locator("tr", has_text=made["prefix"])
        await row.get_by_role("button", name=re.compile("^Revoke token")).click()
        await page.get_by_role("dialog").get_by_role("button", name="Revoke token").click()
        await expect(rows).to_have_count(1)
        await expect(auditor.get_by_role("status").first).to_have_text(
            f"Token {made['prefix']}… was already revoked (by someone else, or in another tab, "
            "since this page loaded): requests sending it are refused."
        )
        await expect(auditor.locator(".error")).to_have_count(0)

        await page.goto(f"{url}/console/#/agents/%E0%A4%A")
        await expect(page.get_by_role("heading", name="Not found")).to_be_visible()
        await expect(page.locator("main .notice")).to_have_text(
            "The address /agents/%E0%A4%A is not well-formed: each “%” in it must begin the"
            " escape of a character, such as %25 for “%” itself, %26 for “&”, %23 for “#” and"
            " %3F for “?”."
        )


async def test_a_page_asked_for_before_the_filters_changed_adds_nothing_to_the_new_list(
    db_url, embedder
):
    """ "Show older records", then Apply filters before that page came back (a slow server):
    the late page belongs to the old listing and is dropped, not appended under the new
    filters."""
    import asyncio

    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        agent = seeded["agent"]
        Api(url, ADMIN)(
            """mutation($a: UUID!, $i: [AgentMemoryInput!]!) {
              addAgentMemories(actionId: $a, inputs: $i) { memoryIds } }""",
            a=agent,
            i=[{"summary": f"Fact number {n}", "kind": "fact"} for n in range(25)],
        )
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        listing = page.locator("table", has=page.locator("caption", has_text="newest first"))
        await expect(listing.locator("tbody tr")).to_have_count(20)

        held, release = asyncio.Event(), asyncio.Event()

        async def slow_second_page(route):
            after = json.loads(route.request.post_data)["variables"].get("after")
            if after and not held.is_set():
                held.set()
                await release.wait()
            await route.fallback()

        await page.route("**/graphql", slow_second_page)
        await page.get_by_role("button", name="Show older records").click()
        await held.wait()
        await page.get_by_label("Kind").fill("guidance")
        await page.get_by_role("button", name="Apply filters").click()
        refunds = listing.get_by_role("link", name="Refunds over 100 EUR need a manager")
        await expect(refunds).to_be_visible()
        release.set()
        await page.wait_for_timeout(500)  # the old page comes back, and must change nothing
        await expect(listing.locator("tbody tr")).to_have_count(1)
        await expect(page.get_by_role("button", name="Show older records")).to_be_hidden()


SESSION_MEMORIES = """query($a: UUID!, $s: String) { action(actionId: $a) {
  memories(first: 100, sessionId: $s) { nodes { summary } } } }"""


async def test_the_memory_list_shows_each_records_session_and_filters_by_one(db_url, embedder):
    """Each record shows its session, or "agent scope"; the Session filter lists one
    session's records (with the other filters too), a blank one is refused and said; a
    session's page links to the memories of that session."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        for summary, kind, where in [
            ("Parcel for c-7 left at the door", "event", {"sessionId": "s-2"}),
            ("Customer c-7 wants invoices by post", "fact", {"sessionId": "s-2"}),
            ("The shop closes on Sundays", "fact", {"scope": "AGENT"}),
        ]:
            admin(ADD, a=agent, i={"summary": summary, "kind": kind, **where})
        in_s1 = [
            n["summary"]
            for n in admin(SESSION_MEMORIES, a=agent, s="s-1")["action"]["memories"]["nodes"]
        ]
        assert "Customer c-42 prefers espresso over filter coffee" in in_s1

        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        listing = page.locator("table", has=page.locator("caption", has_text="newest first"))
        rows = listing.locator("tbody tr")
        sessions = listing.locator("td[data-label=Session]")
        sundays = rows.filter(has_text="The shop closes on Sundays")
        await expect(sundays.locator("td[data-label=Session]")).to_have_text("agent scope")
        parcel = rows.filter(has_text="Parcel for c-7 left at the door")
        await expect(parcel.locator("td[data-label=Session]")).to_have_text("s-2")
        await expect(rows).to_have_count(len(in_s1) + 3)

        await page.get_by_label("Session").fill("s-2")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(rows).to_have_count(2)
        await expect(sessions).to_have_text(["s-2", "s-2"])
        await page.get_by_label("Kind").fill("event")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(rows).to_have_count(1)
        await expect(
            listing.get_by_role("link", name="Parcel for c-7 left at the door")
        ).to_be_visible()
        await page.screenshot(path=screenshot_path("console-memories-session.png"), full_page=True)

        # A blank session ID is refused, and the refusal says what a session ID must be.
        await page.get_by_label("Kind").fill("")
        await page.get_by_label("Session").fill("   ")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(page.get_by_text("sessionId must be 1 to 200 characters")).to_be_visible()
        await expect(rows).to_have_count(0)

        # From a session's page, its memories: the listing opens filtered by it.
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/s-1")
        await expect(page.get_by_role("heading", name="Session s-1")).to_be_visible()
        await page.get_by_role("link", name="Memories of this session").click()
        await expect(page.get_by_role("heading", name="Memories of Support desk")).to_be_visible()
        await expect(page.get_by_label("Session")).to_have_value("s-1")
        await expect(rows).to_have_count(len(in_s1))
        await expect(sessions).to_have_text(["s-1"] * len(in_s1))
        await expect(listing.get_by_text("The shop closes on Sundays")).to_have_count(0)


async def test_a_label_value_without_its_label_is_said_not_listed_unfiltered(db_url, embedder):
    """A value typed with no label to hold it filters nothing: the Label field says so, and the
    listing stays as it was, not all records shown as if the value had filtered them."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        admin(ADD, a=agent, i={"summary": "Customer c-7 pays by card", "kind": "fact"})
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        listing = page.locator("table", has=page.locator("caption", has_text="newest first"))
        rows = listing.locator("tbody tr")
        await page.get_by_label("Kind").fill("fact")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(rows).to_have_count(2)

        await page.get_by_label("Kind").fill("")
        await page.get_by_label("Label value").fill("c-42")
        await page.get_by_role("button", name="Apply filters").click()
        label = page.get_by_label("Label", exact=True)
        error = page.locator("#" + await label.get_attribute("aria-describedby"))
        await expect(error).to_contain_text("Name the label that holds this value")
        await expect(label).to_be_focused()
        await expect(rows).to_have_count(2)  # still the records of kind fact, as the page said

        # Named, it filters, and the note goes.
        await label.fill("customer_id")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(rows).to_have_count(3)
        await expect(rows.filter(has_text="Customer c-7 pays by card")).to_have_count(0)
        await expect(error).to_be_hidden()


ACTIONS_NAMED = "{ actions(first: 100) { nodes { actionId name version harness instructions } } }"


def agents_named(api: Api, name: str) -> list[dict[str, Any]]:
    return [a for a in api(ACTIONS_NAMED)["actions"]["nodes"] if a["name"] == name]


async def test_an_operator_creates_an_agent_and_a_refusal_keeps_the_form(db_url, embedder):
    """ "New agent" (createAction): a harness the server refuses is said at its field, and a
    grant taken away meanwhile above the button, with what was typed kept and nothing created;
    corrected, the agent is created and its page opens, and it is listed. A token that may not
    create agents is offered no form, and told why."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        maker = [
            {
                "effect": "ALLOW",
                "actions": ["SELECT", "INSERT"],
                "resources": ["financial.Action.*"],
            }
        ]
        admin(CREATE_CLIENT, i={"principal": "maker", "name": "Maker", "policies": maker})
        token = admin('mutation { createClientToken(principal: "maker") { token } }')
        await sign_in(page, url, token["createClientToken"]["token"])
        agents = page.get_by_role("table", name="Agents, newest first")
        await expect(agents.get_by_role("link", name="Support desk")).to_be_visible()
        await page.get_by_role("link", name="New agent").click()
        await expect(page.get_by_role("heading", name="New agent")).to_be_focused()
        form = page.get_by_role("form", name="New agent")
        await form.get_by_label("Name").fill("Billing desk")
        await form.get_by_label("Instructions").fill("Answer billing questions.")
        harness = form.get_by_label("Harness (JSON)")
        await expect(harness).to_have_value(json.dumps({"memory": {"enabled": True}}, indent=2))
        error = page.locator("#" + await harness.get_attribute("aria-describedby"))

        # Not JSON: said at the field before anything is sent.
        await harness.fill('{"memory": ')
        await form.get_by_role("button", name="Create agent").click()
        await expect(error).to_contain_text("This is not valid JSON")
        await expect(harness).to_be_focused()
        # JSON the server refuses: its sentence at the field, the input kept, nothing created.
        bad = {"memory": {"enabled": True, "extraction": {"every": 0}}}
        await harness.fill(json.dumps(bad))
        await harness.press("Control+Enter")
        await expect(error).to_contain_text("harness.memory.extraction.every")
        await expect(harness).to_have_attribute("aria-invalid", "")
        await expect(harness).to_be_focused()
        await expect(harness).to_have_value(json.dumps(bad))
        await expect(form.get_by_label("Name")).to_have_value("Billing desk")
        await page.screenshot(path=screenshot_path("console-new-agent-refused.png"), full_page=True)
        assert agents_named(admin, "Billing desk") == []

        # The grant taken away while the form is open: the server's sentence above the button.
        admin(
            """mutation($p: [PolicyInput!]!) { updateClient(principal: "maker",
              input: {policies: $p}) { name } }""",
            p=[{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}],
        )
        await harness.fill(
            json.dumps({"memory": {"enabled": True}, "history": {"index": "messages"}})
        )
        await form.get_by_role("button", name="Create agent").click()
        await expect(form.get_by_role("alert").last).to_have_text(
            "Your token's grants do not allow this: this client is not allowed to INSERT "
            "financial.Action.document."
        )
        await expect(form.get_by_label("Instructions")).to_have_value("Answer billing questions.")
        assert agents_named(admin, "Billing desk") == []

        # Given back, the same form creates it: the agent's page opens, saying so.
        admin(
            """mutation($p: [PolicyInput!]!) { updateClient(principal: "maker",
              input: {policies: $p}) { name } }""",
            p=maker,
        )
        await form.get_by_role("button", name="Create agent").click()
        await expect(page.get_by_role("heading", name="Billing desk")).to_be_focused()
        await expect(page.get_by_role("status")).to_have_text(
            "Created agent Billing desk (version 1)."
        )
        [made] = agents_named(admin, "Billing desk")
        assert page.url.endswith(f"#/agents/{made['actionId']}")
        assert made["version"] == 1 and made["instructions"] == "Answer billing questions."
        assert made["harness"]["history"] == {"index": "messages"}
        await page.get_by_role("link", name="Agents").first.click()
        await expect(agents.get_by_role("link", name="Billing desk")).to_be_visible()
        await expect(agents.locator("tbody tr").first).to_contain_text("Billing desk")  # newest

        # A token that may read agents but not create them: no link, no form, and why.
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, seeded["reader"])
        await expect(page.get_by_role("link", name="New agent")).to_have_count(0)
        refusal = (
            "Your token's grants do not allow creating agents: this client is not allowed to "
            "INSERT financial.Action.document."
        )
        await expect(page.locator("main > .notice")).to_have_text(refusal)
        await page.goto(f"{url}/console/#/agents/new")
        await expect(page.get_by_role("heading", name="New agent")).to_be_visible()
        await expect(page.locator("main > .notice")).to_have_text(refusal)
        await expect(page.locator("main form")).to_have_count(0)


async def test_an_operator_creates_a_client_with_its_first_token_then_deletes_it(db_url, embedder):
    """ "New client" (createClient): a principal taken and a pattern the server refuses are said
    at their fields, the form kept; created, the client heads the list offering its first token,
    shown once with a way to copy it. "Delete client…" (deleteClient) says in its dialog that the
    tokens stop working, and they do; a client deleted meanwhile (NOT_FOUND) leaves its place
    with a note. The console's own client offers no delete: the server refuses a client deleting
    itself."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        await page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()
        await page.evaluate("window.stayed = true")  # gone if the page were loaded again
        new = page.get_by_role("button", name="New client")
        await new.click()
        form = page.get_by_role("form", name="New client")
        principal = form.get_by_label("Principal")
        await expect(principal).to_be_focused()
        # Escape closes it, focus back on the button.
        await page.keyboard.press("Escape")
        await expect(form).to_have_count(0)
        await expect(new).to_be_focused()
        await page.keyboard.press("Enter")

        # A principal that is taken: refused at its field, what was typed kept.
        await principal.fill("auditor")
        await form.get_by_label("Name").fill("Support console")
        resources = form.get_by_role("group", name="Policy 1").get_by_label("Resources")
        await resources.fill("financial.AgentMemory.*")
        await form.get_by_role("button", name="Create client").click()
        error = page.locator("#" + await principal.get_attribute("aria-describedby"))
        await expect(error).to_have_text(
            "A client with principal 'auditor' already exists in this account. Choose another "
            "principal, or edit that client."
        )
        await expect(principal).to_be_focused()
        await expect(form.get_by_role("alert").last).to_have_text(
            "Not created: the principal is taken."
        )
        await expect(resources).to_have_value("financial.AgentMemory.*")
        assert admin(READ_CLIENT, p="auditor")["client"]["name"] == "Auditor"
        # A pattern that matches nothing: at its field.
        await principal.fill("support-console")
        await resources.fill("financial.agentmemory.*")
        await resources.press("Control+Enter")
        resources_error = page.locator("#" + await resources.get_attribute("aria-describedby"))
        await expect(resources_error).to_contain_text("'financial.agentmemory.*' matches no known")
        await expect(resources).to_be_focused()
        await page.screenshot(
            path=screenshot_path("console-new-client-refused.png"), full_page=True
        )
        assert admin(READ_CLIENT, p="support-console")["client"] is None

        # Created: it heads the list, and the focus is on creating its first token.
        await resources.fill("financial.AgentMemory.*")
        await form.get_by_role("button", name="Create client").click()
        await expect(form).to_have_count(0)
        created = client_card(page, "support-console")
        await expect(page.locator("section.client").first).to_contain_text("support-console")
        await expect(created.locator("h2")).to_have_text("Support console support-console new")
        await expect(created.locator("li")).to_have_text(
            ["ALLOW SELECT on financial.AgentMemory.*"]
        )
        await expect(page.get_by_role("status").first).to_have_text(
            "Created client support-console."
        )
        first = created.get_by_role("button", name="Create its first token")
        await expect(first).to_be_focused()
        offer = created.locator(".notice", has_text="has no token yet, so nothing can use it")
        await expect(offer).to_have_count(1)
        tokens = created.get_by_role("table", name="Tokens of support-console")
        await expect(tokens.locator("tbody tr")).to_have_text(["No tokens."])
        await page.keyboard.press("Enter")
        secret = created.get_by_label("The new token")
        await expect(secret).to_be_focused()
        token = await secret.input_value()
        await expect(created.locator(".token-once")).to_contain_text(
            "Copy it now: it is not shown again."
        )
        await expect(tokens.locator("tbody tr")).to_have_count(1)
        await expect(offer).to_have_count(0)  # it has one now
        await created.get_by_role("button", name="Copy the token").click()
        await expect(created.locator(".token-once [role=status]")).to_have_text("Copied.")
        assert await page.evaluate("navigator.clipboard.readText()") == token
        await page.screenshot(path=screenshot_path("console-new-client-token.png"), full_page=True)
        reader = Api(url, token)
        assert reader("{ viewer { principal } }")["viewer"]["principal"] == "support-console"
        assert await page.evaluate("window.stayed") is True
        # Listed once on the next visit (ordered by principal), no longer new.
        await page.reload()
        await expect(client_card(page, "support-console")).to_have_count(1)
        await expect(client_card(page, "support-console").locator("h2")).to_have_text(
            "Support console support-console"
        )

        # Deleted after a dialog saying what deleting does: its tokens stop working at once.
        card = client_card(page, "support-console")
        await card.get_by_role("button", name="Delete client support-console").click()
        dialog = page.get_by_role("dialog")
        await expect(dialog).to_have_accessible_name("Delete client support-console?")
        await expect(dialog).to_have_accessible_description(
            re.compile("every one of its tokens: requests sending any of them are refused at once")
        )
        await expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
        await page.screenshot(path=screenshot_path("console-delete-client-confirm.png"))
        await page.keyboard.press("Escape")  # cancelled: nothing deleted
        await expect(card).to_have_count(1)
        assert reader("{ viewer { principal } }")["viewer"]["principal"] == "support-console"
        await card.get_by_role("button", name="Delete client support-console").click()
        await dialog.get_by_role("button", name="Delete client").click()
        await expect(card).to_have_count(0)
        note = page.locator("main .notice", has_text="support-console")
        await expect(note).to_have_text(
            "Deleted client support-console: its tokens no longer work."
        )
        await expect(note).to_be_focused()
        gone = reader.raw("{ viewer { principal } }")
        assert gone["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        assert admin(READ_CLIENT, p="support-console")["client"] is None
        await page.reload()
        auditor = client_card(page, "auditor")
        await expect(auditor).to_be_visible()
        await expect(client_card(page, "support-console")).to_have_count(0)

        # Deleted by someone else since the page loaded: the card goes, with a note.
        admin('mutation { deleteClient(principal: "auditor") { principal } }')
        await auditor.get_by_role("button", name="Delete client auditor").click()
        await dialog.get_by_role("button", name="Delete client").click()
        await expect(auditor).to_have_count(0)
        await expect(page.locator("main .notice", has_text="auditor")).to_have_text(
            "Client auditor was already deleted (by someone else, or in another tab, since this "
            "page loaded); its tokens no longer work."
        )
        await expect(page.locator("main .error")).to_have_count(0)

        # The console's own client: no delete, and why.
        own = client_card(page, "admin")
        await expect(own.get_by_role("button", name=re.compile("^Delete client"))).to_have_count(0)
        await expect(own).to_contain_text(
            "This is the client you are signed in as: the console does not delete it"
        )


async def test_a_client_made_again_since_the_page_loaded_is_not_deleted_by_it(db_url, embedder):
    """A page loaded before a client was deleted and created again under the same principal
    deletes nothing with "Delete client…": deleteClient is sent the `modified` the card showed,
    is CONFLICT, and the card says why and shows the client as it is now, its new token
    included. Deleting from that card, which knows the new client, then deletes it."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()
        card = client_card(page, "auditor")
        await expect(card.locator("h2")).to_have_text("Auditor auditor")
        await expect(card.locator("tbody tr")).to_have_count(1)
        # Meanwhile someone deletes it and makes another client "auditor", with a token.
        admin('mutation { deleteClient(principal: "auditor") { principal } }')
        admin(CREATE_CLIENT, i={"principal": "auditor", "name": "Auditor II", "policies": [MEMORY]})
        made = admin('mutation { createClientToken(principal: "auditor") { token prefix } }')
        made = made["createClientToken"]
        await page.evaluate("window.stayed = true")  # gone if the page were loaded again

        await card.get_by_role("button", name="Delete client auditor").click()
        dialog = page.get_by_role("dialog")
        await dialog.get_by_role("button", name="Delete client").click()
        note = page.locator("main .notice", has_text="Not deleted")
        await expect(note).to_have_text(
            "Not deleted: client auditor was changed, or deleted and created again, after this "
            "page loaded. It is shown below as it is now; delete it again if this client must go."
        )
        await expect(note).to_be_focused()
        # The new client stays, its token working; its card shows it as it is now.
        assert admin(READ_CLIENT, p="auditor")["client"]["name"] == "Auditor II"
        new = Api(url, made["token"])
        assert new("{ viewer { principal } }")["viewer"]["principal"] == "auditor"
        card = client_card(page, "auditor")
        await expect(card).to_have_count(1)
        await expect(card.locator("h2")).to_have_text("Auditor II auditor")
        await expect(card.locator("li")).to_have_text(["ALLOW SELECT on financial.AgentMemory.*"])
        await expect(card.locator("tbody tr")).to_have_count(1)
        await expect(card.locator("tbody tr")).to_contain_text(made["prefix"])
        await expect(card.locator(".notice", has_text="Not deleted")).to_have_count(1)
        await expect(page.locator("main .error")).to_have_count(0)
        await page.screenshot(
            path=screenshot_path("console-delete-client-made-again.png"), full_page=True
        )
        assert await page.evaluate("window.stayed") is True

        # Asked again from the card that shows it: deleted.
        await card.get_by_role("button", name="Delete client auditor").click()
        await dialog.get_by_role("button", name="Delete client").click()
        await expect(card).to_have_count(0)
        await expect(page.locator("main .notice", has_text="Deleted client auditor")).to_have_text(
            "Deleted client auditor: its tokens no longer work."
        )
        assert admin(READ_CLIENT, p="auditor")["client"] is None
        gone = new.raw("{ viewer { principal } }")
        assert gone["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_a_new_client_is_held_to_the_operators_grants(db_url, embedder):
    """A client gives only grants it holds: a new client with a policy wider than the manager's
    is refused in words, the form kept and nothing created. A token that may create clients but
    not tokens is told so on the new client's card instead of being offered its first token."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = await as_manager(page, url)
        await page.get_by_role("button", name="New client").click()
        form = page.get_by_role("form", name="New client")
        await form.get_by_label("Principal").fill("wider")
        await form.get_by_label("Name").fill("Wider")
        await (
            form.get_by_role("group", name="Policy 1")
            .get_by_label("Resources")
            .fill("financial.Action.*")
        )
        await form.get_by_role("button", name="Create client").click()
        await expect(form.get_by_role("alert").last).to_contain_text(
            "Not created: these policies would give SELECT financial.Action.document"
        )
        await expect(form.get_by_label("Principal")).to_have_value("wider")
        assert admin(READ_CLIENT, p="wider")["client"] is None

        creator = [
            {
                "effect": "ALLOW",
                "actions": ["SELECT", "INSERT"],
                "resources": ["financial.Client.document"],
            },
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Client.token"]},
        ]
        admin(CREATE_CLIENT, i={"principal": "creator", "name": "Creator", "policies": creator})
        token = admin('mutation { createClientToken(principal: "creator") { token } }')
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, token["createClientToken"]["token"])
        await page.get_by_role("link", name="Clients and tokens").click()
        await page.get_by_role("button", name="New client").click()
        await form.get_by_label("Principal").fill("bare")
        await form.get_by_label("Name").fill("Bare")
        await form.get_by_role("button", name="Remove policy 1").click()
        await expect(form).to_contain_text("No policies: a client without any may do nothing.")
        await form.get_by_role("button", name="Create client").click()
        bare = client_card(page, "bare")
        await expect(bare.locator(".notice")).to_have_text(
            "Your token's grants do not allow creating tokens: this client is not allowed to "
            "INSERT financial.Client.token."
        )
        await expect(bare.get_by_role("button", name=re.compile("token"))).to_have_count(0)
        await expect(bare.locator("h2")).to_be_focused()
        assert admin(READ_CLIENT, p="bare")["client"]["policies"] == []


EXECUTE = """mutation($i: ExecuteActionInput!) { executeAction(input: $i) { status output } }"""
SESSION_TEXT = """query($a: UUID!) { action(actionId: $a) { sessions(first: 10) {
  nodes { sessionId executions(first: 10) { nodes { kind input output } } } } } }"""


async def test_an_operator_erases_a_session_after_typing_its_id(db_url, embedder):
    """ "Erase this session…" (eraseSession): a dialog says what erasing removes and leaves, and
    is confirmed only by typing the session's ID; refused while a turn of the session runs
    (CONFLICT), nothing erased; then erased, the page shows the counts, the ERASE execution and
    the memory records it left, and the turns' text is gone. A token that may read sessions but
    not erase them is offered no button, and told why."""
    import asyncio

    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent, model = Api(url, ADMIN), seeded["agent"], seeded["model"]

        def said() -> str:
            return json.dumps(admin(SESSION_TEXT, a=agent))  # s-1 is its one session

        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/sessions")
        sessions = page.get_by_role("table", name="Sessions, newest first")
        await sessions.get_by_role("link", name="s-1").click()
        await expect(page.get_by_role("heading", name="Session s-1")).to_be_visible()
        erase = page.get_by_role("button", name="Erase this session…")
        dialog = page.get_by_role("dialog")
        typed = dialog.get_by_label("Type s-1 to confirm")
        ok = dialog.get_by_role("button", name="Erase session")

        # The dialog: what erasing removes and leaves; the focus on the ID to type.
        await erase.click()
        await expect(dialog).to_have_accessible_name("Erase session s-1 for good?")
        await expect(dialog).to_have_accessible_description(
            re.compile("^Erasing removes for good what this session said: its history")
        )
        await expect(dialog).to_contain_text("does not delete the memory records")
        await expect(typed).to_be_focused()
        await expect(ok).to_be_disabled()
        await typed.fill("s-")
        await typed.press("Enter")  # not the ID: nothing happens
        await expect(dialog).to_be_visible()
        await expect(ok).to_be_disabled()
        await page.screenshot(path=screenshot_path("console-erase-confirm.png"))
        await page.keyboard.press("Escape")
        await expect(dialog).to_be_hidden()
        assert "ships tomorrow" in said()

        # A turn of the session is running: refused, nothing erased.
        model.say("Noted: your parcel is blue.", delay=4.0)
        turn = asyncio.create_task(
            asyncio.to_thread(
                admin,
                EXECUTE,
                i={"actionId": agent, "sessionId": "s-1", "input": "My parcel is blue."},
            )
        )
        await asyncio.sleep(1.0)
        await erase.click()
        await expect(typed).to_have_value("")  # a new dialog starts empty
        await typed.fill("s-1")
        await expect(ok).to_be_enabled()
        await typed.press("Enter")
        await expect(page.locator("main .error")).to_contain_text(
            "Conflict: execution", use_inner_text=True
        )
        await expect(page.locator("main .error")).to_contain_text("is running; nothing was erased")
        assert "ships tomorrow" in said()
        assert (await turn)["executeAction"]["status"] == "SUCCEEDED"

        # Once it has ended: erased, and what was erased shown.
        [session] = admin(SESSION_TEXT, a=agent)["action"]["sessions"]["nodes"]
        executions = len(session["executions"]["nodes"])  # the two turns, and operator writes
        await erase.click()
        await typed.fill("s-1")
        await ok.click()
        report = page.get_by_role("region", name="Session erased")
        await expect(report.get_by_role("heading", name="Session erased")).to_be_focused()
        await expect(report.locator("dt").nth(1)).to_have_text(
            "Executions whose input and output were erased"
        )
        await expect(report.locator("dd").nth(1)).to_have_text(str(executions))
        await expect(report).to_contain_text("of kind ERASE by admin")
        left = report.get_by_role("list", name="Live memory records left")
        await expect(left.get_by_role("link", name=re.compile("prefers espresso"))).to_be_visible()
        await page.screenshot(path=screenshot_path("console-erased.png"), full_page=True)
        # The page as it is now: the turns' words are gone, the erasure is listed.
        await expect(
            page.get_by_role("heading", name=re.compile("^Erased by admin"))
        ).to_be_visible()
        await expect(page.locator("main")).not_to_contain_text("ships tomorrow")
        await expect(page.locator("main")).not_to_contain_text("parcel is blue")
        inputs = page.locator("li.event.turn-input .event-head")
        await expect(inputs).to_have_text(["Input erased", "Input erased"])
        assert "ships tomorrow" not in said() and "parcel is blue" not in said()
        # A live record it left opens, still there to delete.
        await left.get_by_role("link", name=re.compile("prefers espresso")).click()
        await expect(page.get_by_role("button", name="Delete this record…")).to_be_visible()

        # A token that reads sessions but may not erase them: no button, and why.
        watcher = [{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.*"]}]
        admin(CREATE_CLIENT, i={"principal": "watcher", "name": "Watcher", "policies": watcher})
        token = admin('mutation { createClientToken(principal: "watcher") { token } }')
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, token["createClientToken"]["token"])
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/s-1")
        await expect(page.get_by_role("heading", name="Session s-1")).to_be_visible()
        await expect(erase).to_have_count(0)
        await expect(page.locator("main > .notice")).to_have_text(
            "Your token's grants do not allow erasing sessions: this client is not allowed to "
            "DELETE financial.ActionExecution.document."
        )


async def test_a_page_opened_while_a_session_is_erased_is_not_told_it_was_erased(db_url, embedder):
    """Erasing session s-1, then opening the agent's sessions before the server answered (a slow
    server): the erasure happens, and the page opened since shows nothing of it. The report
    ("Session erased", its counts and the records left) went under whichever page was open
    then, naming no session: under another session's heading, as if that one was erased."""
    import asyncio

    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/s-1")
        await expect(page.get_by_role("heading", name="Session s-1")).to_be_visible()
        held, release = asyncio.Event(), asyncio.Event()

        async def slow_erase(route):
            if "eraseSession" in (route.request.post_data or ""):
                held.set()
                await release.wait()
            await route.fallback()

        await page.route("**/graphql", slow_erase)
        await page.get_by_role("button", name="Erase this session…").click()
        await page.get_by_role("dialog").get_by_label("Type s-1 to confirm").fill("s-1")
        await page.get_by_role("dialog").get_by_role("button", name="Erase session").click()
        await held.wait()
        await page.get_by_role("link", name="← Sessions").click()
        sessions = page.get_by_role("table", name="Sessions, newest first")
        await expect(sessions.get_by_role("link", name="s-1")).to_be_visible()
        release.set()
        for _ in range(50):  # the erasure is made, answered, and the answer handled
            [session] = admin(SESSION_TEXT, a=agent)["action"]["sessions"]["nodes"]
            kinds = [x["kind"] for x in session["executions"]["nodes"]]
            if "ERASE" in kinds:
                break
            await asyncio.sleep(0.1)
        assert "ERASE" in kinds
        await page.wait_for_timeout(500)
        await expect(page.get_by_role("region", name="Session erased")).to_have_count(0)
        await expect(page.get_by_role("heading", level=1)).to_have_text(re.compile("^Sessions"))


async def test_a_turns_history_search_shows_the_events_it_found(db_url, embedder):
    """A transcript's search_history call (its tool execution and its output use) says how many
    history events it returned and the model was given, not "0 records" (its output holds
    events, not records); a memory tool's still counts its records."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent, model = Api(url, ADMIN), seeded["agent"], seeded["model"]
        if not seeded["history"]:
            return
        model.call_tools(("search_history", {"query": "late order"}))
        model.say("You asked about a late order before.")
        turn = admin(
            EXECUTE, i={"actionId": agent, "sessionId": "s-1", "input": "What did I ask before?"}
        )["executeAction"]
        assert turn["status"] == "SUCCEEDED", turn
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/s-1")
        await expect(page.get_by_role("heading", name="Session s-1")).to_be_visible()
        heads = page.locator("li.event .event-head")
        searched = heads.filter(has_text="Tool execution").filter(has_text="search_history")
        await expect(searched).to_have_text(re.compile(r"· [1-9]\d* history events?$"))
        used = heads.filter(has_text="Output use").filter(has_text="history event")
        await expect(used).to_have_text(re.compile(r"RETRIEVED · [1-9]\d* history events? reached"))
        saved = heads.filter(has_text="Tool execution").filter(has_text="add_memory")
        await expect(saved).to_have_text(re.compile(r"· 1 record$"))
        await page.screenshot(path=screenshot_path("console-history-search.png"), full_page=True)


async def test_a_sessions_executions_are_titled_by_their_kind(db_url, embedder):
    """A session's page titles each execution by what it is: an operator's write, a client's
    MCP tool call and a conversation handed in (rememberConversation) each name the client,
    and a replay says it replays its turn; an MCP call was titled "Operator write (no turn)"
    and an ingest as a plain turn."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        [first] = admin(
            """query($a: UUID!) { action(actionId: $a) { executions(first: 1) {
              nodes { executionId } } } }""",
            a=agent,
        )["action"]["executions"]["nodes"]
        replay = admin(
            """mutation($a: UUID!, $o: UUID!) { executeAction(input: {actionId: $a,
              replayOf: $o}) { status } }""",
            a=agent,
            o=first["executionId"],
        )["executeAction"]
        assert replay["status"] == "SUCCEEDED", replay
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "search_memory", "arguments": {"query": "espresso"}},
        }
        headers = {"accept": "application/json, text/event-stream"}
        answer = admin.client.post(f"/mcp/{agent}?session=s-1", json=call, headers=headers)
        assert answer.status_code == 200 and not answer.json()["result"]["isError"], answer.text
        ingest = admin(
            """mutation($a: UUID!) { rememberConversation(input: {actionId: $a, sessionId: "s-1",
              messages: [{role: "user", content: "My parcel is blue."}]}) { status } }""",
            a=agent,
        )["rememberConversation"]
        assert ingest["status"] == "SUCCEEDED", ingest

        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/s-1")
        await expect(page.get_by_role("heading", name="Session s-1")).to_be_visible()
        titles = page.locator("section.turn h2")
        # Newest first: the ingest (the session's second turn), the MCP call, the replay of
        # turn 1, turn 1, and the three records the seed wrote into the session.
        await expect(titles).to_have_count(7)
        said = [t.split(" SUCCEEDED")[0] for t in await titles.all_inner_texts()]
        assert said == [
            "Turn 2: conversation handed in by admin",
            "MCP tool call by admin",
            "Replay of turn 1",
            "Turn 1",
            *["Operator write by admin"] * 3,
        ], said
        # What the ingest handed in, and the MCP call's tool and arguments, open on request.
        ingest, mcp = page.locator("section.turn").nth(0), page.locator("section.turn").nth(1)
        await ingest.get_by_text("Messages handed in").click()
        await expect(ingest.locator("details.handed-in li.event")).to_have_count(1)
        await expect(ingest.locator("details.handed-in li.event")).to_contain_text(
            "user", use_inner_text=True
        )
        await expect(ingest.locator("details.handed-in")).to_contain_text("My parcel is blue.")
        await mcp.get_by_text("Tool and arguments").click()
        await expect(mcp.locator("details.handed-in pre")).to_contain_text('"query": "espresso"')
        await page.screenshot(path=screenshot_path("console-session-kinds.png"), full_page=True)


async def test_an_agent_without_a_model_says_it_uses_the_deployments(db_url, embedder):
    """An agent whose `model` is empty shows `{}` and says that its turns use the deployment's
    model; one that leaves out the model's name or endpoint says that those are the
    deployment's (a `{"temperature": 0.2}` said nothing of which model runs); one that names
    both says neither."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        note = page.get_by_text("None set: its turns use the deployment's model")
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}")
        await expect(page.get_by_role("heading", name="Version 1 (current)")).to_be_visible()
        await expect(note).to_contain_text("(its ENGRAM_MODEL_* settings)")
        admin(
            """mutation($a: UUID!, $i: ActionInput!) { updateAction(actionId: $a, input: $i)
              { version } }""",
            a=agent,
            i={"name": "Support desk", "model": {"temperature": 0.2}, "harness": HARNESS},
        )
        await page.reload()
        await expect(page.get_by_role("heading", name="Version 2 (current)")).to_be_visible()
        await expect(note).to_have_count(0)
        left = page.get_by_text("Its turns use the deployment's")
        await expect(left).to_have_text(
            "Its turns use the deployment's model name (ENGRAM_MODEL_NAME) and endpoint"
            " (ENGRAM_MODEL_BASE_URL): a field left out takes the deployment's setting."
        )
        admin(
            """mutation($a: UUID!, $i: ActionInput!) { updateAction(actionId: $a, input: $i)
              { version } }""",
            a=agent,
            i={"name": "Support desk", "model": {"name": "other-model"}, "harness": HARNESS},
        )
        await page.reload()
        await expect(page.get_by_role("heading", name="Version 3 (current)")).to_be_visible()
        await expect(left).to_have_text(
            "Its turns use the deployment's endpoint (ENGRAM_MODEL_BASE_URL): a field left out"
            " takes the deployment's setting."
        )
        admin(
            """mutation($a: UUID!, $i: ActionInput!) { updateAction(actionId: $a, input: $i)
              { version } }""",
            a=agent,
            i={
                "name": "Support desk",
                "model": {"name": "other-model", "baseUrl": seeded["model"].url},
                "harness": HARNESS,
            },
        )
        await page.reload()
        await expect(page.get_by_role("heading", name="Version 4 (current)")).to_be_visible()
        await expect(left).to_have_count(0)
        await expect(note).to_have_count(0)


async def test_an_operator_renames_an_account_and_deletes_it_once_it_holds_nothing(
    db_url, embedder
):
    """The clients page of a chosen account renames it, from the name it shows (a rename made
    meanwhile is refused, not undone), and deletes it after a dialog: refused, saying what it
    holds, while it holds a client; gone once it holds nothing. A tenant renames its own
    account and is offered no deletion."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        account = "mutation($n: String!) { createAccount(input: {name: $n}) { accountId } }"
        acme = admin(account, n="Acme Ltd")["createAccount"]["accountId"]
        globex = admin(account, n="Globex")["createAccount"]["accountId"]
        client = """mutation($p: String!, $a: UUID!, $r: [String!]!) { createClient(input: {
          principal: $p, name: $p, accountId: $a,
          policies: [{effect: ALLOW, actions: [SELECT, UPDATE], resources: $r}]}) { principal } }"""
        admin(client, p="acme-bot", a=acme, r=["financial.Action.*"])
        admin(client, p="globex-admin", a=globex, r=["financial.*"])
        await sign_in(page, url, ADMIN)
        await page.get_by_role("link", name="Clients and tokens").click()
        # The operator's own account: renamed, never deleted here.
        own = page.get_by_role("region", name="Manage account")
        await expect(own.get_by_role("form", name="Rename account")).to_be_visible()
        await expect(own.get_by_role("button", name=re.compile("^Delete account"))).to_have_count(0)

        await page.get_by_label("Account", exact=True).select_option(acme)
        await expect(page).to_have_url(re.compile(f"#/clients\\?account={acme}$"))
        card = page.get_by_role("region", name="Manage account")
        await expect(card.get_by_role("heading")).to_have_text(f"Account Acme Ltd {acme}")
        rename = card.get_by_role("form", name="Rename account")
        await expect(rename.get_by_label("New name")).to_have_value("Acme Ltd")
        await rename.get_by_label("New name").fill("   ")
        await rename.get_by_role("button", name="Rename account").click()
        await expect(rename.locator(".field-error")).to_contain_text(
            "account name must be 1 to 200 characters"
        )
        await rename.get_by_label("New name").fill("Acme Corp")
        await rename.get_by_role("button", name="Rename account").click()
        await expect(page.get_by_role("status").first).to_have_text(
            "Renamed account “Acme Ltd” to “Acme Corp”."
        )
        await expect(page.get_by_label("Account", exact=True)).to_contain_text("Acme Corp")
        # Renamed elsewhere since the page showed it: refused, not undone.
        renamed = """mutation($a: UUID!) { updateAccount(accountId: $a, input: {name: "Acme B"})
          { name } }"""
        admin(renamed, a=acme)
        rename = page.get_by_role("region", name="Manage account").get_by_role(
            "form", name="Rename account"
        )
        await rename.get_by_label("New name").fill("Acme C")
        await rename.get_by_role("button", name="Rename account").click()
        await expect(page.get_by_role("alert").filter(has_text="Conflict")).to_contain_text(
            "was renamed to 'Acme B'"
        )
        names = "{ accounts(first: 100) { nodes { accountId name } } }"
        listed = {a["accountId"]: a["name"] for a in admin(names)["accounts"]["nodes"]}
        assert listed[acme] == "Acme B"

        # Holding a client: refused, saying so; the dialog first.
        await page.reload()
        delete = page.get_by_role("button", name="Delete account Acme B")
        await delete.click()
        dialog = page.get_by_role("dialog")
        await expect(dialog).to_contain_text("Only an account that holds nothing is deleted")
        await page.screenshot(path=screenshot_path("console-delete-account.png"))
        await dialog.get_by_role("button", name="Cancel").click()
        await delete.click()
        await dialog.get_by_role("button", name="Delete account").click()
        await expect(page.get_by_role("alert")).to_contain_text(
            "still holds 1 client; nothing was deleted: delete its clients first"
        )
        remove = """mutation($a: UUID!) { deleteClient(principal: "acme-bot", accountId: $a)
          { principal } }"""
        admin(remove, a=acme)
        await delete.click()
        await dialog.get_by_role("button", name="Delete account").click()
        await expect(page).to_have_url(re.compile("#/clients$"))
        await expect(page.get_by_role("status").first).to_have_text("Deleted account “Acme B”.")
        await expect(page.get_by_label("Account", exact=True)).not_to_contain_text("Acme")
        assert acme not in {a["accountId"] for a in admin(names)["accounts"]["nodes"]}

        # A tenant: its own account renamed; no deletion offered.
        await page.get_by_role("button", name="Sign out").click()
        tenant = """mutation($a: UUID!) { createClientToken(principal: "globex-admin",
          accountId: $a) { token } }"""
        await sign_in(page, url, admin(tenant, a=globex)["createClientToken"]["token"])
        await page.get_by_role("link", name="Clients and tokens").click()
        card = page.get_by_role("region", name="Manage account")
        await expect(card.get_by_role("heading")).to_have_text(f"Account Globex {globex}")
        await expect(card.get_by_role("button", name=re.compile("^Delete account"))).to_have_count(
            0
        )
        await card.get_by_label("New name").fill("Globex Inc")
        await card.get_by_role("button", name="Rename account").click()
        await expect(page.get_by_role("status").first).to_have_text(
            "Renamed account “Globex” to “Globex Inc”."
        )


EVENTS = """query($a: UUID, $t: UUID) { adminEvents(first: 100, accountId: $a, tokenId: $t) {
  nodes { operation actor actorTokenId target } } }"""
RENAME = """mutation($p: String!, $n: String!) { updateClient(principal: $p, input: {name: $n})
  { principal } }"""


async def test_the_activity_page_lists_who_changed_what_newest_first(db_url, embedder):
    """Activity lists the account's changes newest first (adminEvents): who (principal and the
    token its request sent), the operation, the target and the changes in words; a page at a
    time; filtered by a token, typed or from its row on the clients page; another account's,
    picked by the operator, with the actor's other account by name."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        for n in range(15):  # older changes, to fill more than a page
            admin(RENAME, p="auditor", n=f"Auditor {n:02}")
        admin(CREATE_CLIENT, i={"principal": "ops", "name": "Ops", "policies": EVERY_GRANT})
        a = admin(ISSUE, p="ops")["createClientToken"]
        ops = Api(url, a["token"])
        ops(CREATE_CLIENT, i={"principal": "helper", "name": "Helper", "policies": READER})
        h = ops(ISSUE, p="helper")["createClientToken"]
        ops(RENAME, p="helper", n="Helper 2")
        revoke = """mutation($t: UUID!) { revokeClientToken(principal: "helper", tokenId: $t)
          { tokenId } }"""
        ops(revoke, t=h["tokenId"])
        events = admin(EVENTS)["adminEvents"]["nodes"]
        assert len(events) > 20

        await sign_in(page, url, a["token"])
        await page.get_by_role("link", name="Activity").click()
        await expect(page).to_have_url(re.compile("#/activity$"))
        await expect(page.get_by_role("heading", name="Activity")).to_be_visible()
        rows = page.locator("table.activity tbody tr")
        await expect(rows).to_have_count(20)
        operation = rows.locator('td[data-label="Operation"]')
        await expect(operation).to_have_text([e["operation"] for e in events[:20]])
        who = rows.locator('td[data-label="Who"]')
        target = rows.locator('td[data-label="Target"]')
        changes = rows.locator('td[data-label="Changes"]')
        await expect(operation.nth(0)).to_have_text("revokeClientToken")
        await expect(who.nth(0)).to_have_text(f"opsvia token {a['tokenId']} only this token")
        await expect(target.nth(0)).to_have_text(f"token {h['tokenId']} of helper")
        await expect(operation.nth(1)).to_have_text("updateClient")
        await expect(target.nth(1)).to_have_text("client helper")
        await expect(changes.nth(1)).to_have_text("name “Helper” → “Helper 2”")
        await expect(changes.nth(2)).to_have_text("never expires")
        await expect(changes.nth(3)).to_have_text(
            "name “Helper”policies ALLOW SELECT on financial.Action.*"
            "ALLOW SELECT on financial.AgentMemory.*"
        )
        await expect(operation.nth(5)).to_have_text("createClient")
        await expect(who.nth(5)).to_contain_text("admin")
        await expect(page.locator("table.activity")).not_to_contain_text("{")  # no JSON
        await page.screenshot(path=screenshot_path("console-activity.png"), full_page=True)

        # A page at a time: the rest, down to what the start made (no client made it).
        await page.get_by_role("button", name="Show more").click()
        await expect(rows).to_have_count(len(events))
        await expect(operation).to_have_text([e["operation"] for e in events])
        await expect(who.last).to_have_text("bootstrap setting")
        await expect(page.get_by_role("button", name="Show more")).to_be_hidden()

        # By a token typed: only what requests sending it changed.
        await page.get_by_label("Token ID").fill("not-a-token")
        await page.get_by_role("button", name="Filter").click()
        filtering = page.get_by_role("form", name="Filter by token")
        await expect(filtering.locator(".field-error")).to_contain_text("A token ID is a UUID")
        await page.get_by_label("Token ID").fill(a["tokenId"].upper())
        await page.get_by_label("Token ID").press("Enter")
        await expect(page).to_have_url(re.compile(f"#/activity\\?token={a['tokenId']}$"))
        expected = ["revokeClientToken", "updateClient", "createClientToken", "createClient"]
        await expect(operation).to_have_text(expected)
        await expect(page.locator("table.activity caption")).to_contain_text(
            f"made with token {a['tokenId']}"
        )
        # From a token's row on the clients page, and back to every token's.
        await page.get_by_role("link", name="Every token's changes").click()
        await expect(rows).to_have_count(20)
        await page.get_by_role("link", name="Clients and tokens").click()
        await page.get_by_role("link", name=f"Activity of token {a['prefix']}").click()
        await expect(page).to_have_url(re.compile(f"#/activity\\?token={a['tokenId']}$"))
        await expect(operation).to_have_text(expected)
        # A token's ID in a row filters by it too.
        await page.get_by_role("link", name="Every token's changes").click()
        first_admin = next(e for e in events if e["actor"] == "admin")
        await page.get_by_role(
            "link", name=f"Only token {first_admin['actorTokenId']}"
        ).first.click()
        # In every account the operator reaches: the other accounts said by name.
        its = admin(EVENTS, t=first_admin["actorTokenId"])["adminEvents"]["nodes"]
        await expect(operation).to_have_text([e["operation"] for e in its[:20]])
        elsewhere = rows.filter(has=page.locator("td", has_text="createAccount"))
        await expect(elsewhere.locator('td[data-label="Target"]')).to_contain_text(
            "in account Other Co"
        )

        # Another account, picked by the operator (or from its clients page): its changes, the
        # operator's account named beside the actor.
        acme = admin('mutation { createAccount(input: {name: "Acme Ltd"}) { accountId } }')
        acme = acme["createAccount"]["accountId"]
        operator = admin("{ viewer { accountId } }")["viewer"]["accountId"]
        accounts = admin("{ accounts(first: 100) { nodes { accountId name } } }")["accounts"]
        default = next(n["name"] for n in accounts["nodes"] if n["accountId"] == operator)
        await page.get_by_role("link", name="Clients and tokens").click()
        await page.get_by_label("Account", exact=True).select_option(acme)
        await expect(page).to_have_url(re.compile(f"#/clients\\?account={acme}$"))
        await page.get_by_role("link", name="Activity of this account").click()
        await expect(page).to_have_url(re.compile(f"#/activity\\?account={acme}$"))
        await expect(operation).to_have_text(["createAccount"])
        await expect(target.nth(0)).to_have_text(f"account Acme Ltd {acme}")
        await expect(who.nth(0)).to_contain_text(f"admin (account {default} {operator})")
        await page.get_by_label("Account", exact=True).select_option(operator)
        await expect(page).to_have_url(re.compile("#/activity$"))
        await expect(rows).to_have_count(20)


async def test_a_tenants_activity_hides_the_operators_account_and_tokens(db_url, embedder):
    """A tenant reads its own account's activity: what the operator changed there is said to be
    the default account's, without the operator's account or tokens; no account to pick."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        acme = admin('mutation { createAccount(input: {name: "Acme Ltd"}) { accountId } }')
        acme = acme["createAccount"]["accountId"]
        tenant = [
            {"effect": "ALLOW", "actions": ["SELECT", "INSERT"], "resources": ["financial.*"]}
        ]
        admin(
            CREATE_CLIENT,
            i={"principal": "acme-bot", "name": "Acme bot", "policies": tenant, "accountId": acme},
        )
        issue = """mutation($a: UUID) { createClientToken(principal: "acme-bot", accountId: $a)
          { token tokenId } }"""
        t = admin(issue, a=acme)["createClientToken"]
        Api(url, t["token"])(
            CREATE_CLIENT, i={"principal": "acme-helper", "name": "Helper", "policies": READER}
        )
        operator = admin("{ viewer { accountId tokenId } }")["viewer"]

        await sign_in(page, url, t["token"])
        await page.get_by_role("link", name="Activity").click()
        rows = page.locator("table.activity tbody tr")
        await expect(rows.locator('td[data-label="Operation"]')).to_have_text(
            ["createClient", "createClientToken", "createClient", "createAccount"]
        )
        await expect(rows.locator('td[data-label="Who"]')).to_have_text(
            [f"acme-botvia token {t['tokenId']} only this token"] + ["default account"] * 3
        )
        await expect(rows.locator('td[data-label="Target"]').nth(3)).to_have_text(
            f"account Acme Ltd {acme}"
        )
        await expect(page.get_by_label("Account", exact=True)).to_have_count(0)
        main = page.locator("main")
        for unseen in [operator["accountId"], operator["tokenId"], "Other Co"]:
            await expect(main).not_to_contain_text(unseen)
        await page.screenshot(path=screenshot_path("console-activity-tenant.png"), full_page=True)
        # Another account named in the address: the server's refusal, said as the other pages
        # say it; an address the page does not take, said too.
        await page.evaluate(f"location.hash = '#/activity?account={operator['accountId']}'")
        await expect(page.get_by_role("alert")).to_contain_text("Not found: account")
        await expect(rows).to_have_count(0)
        await page.evaluate("location.hash = '#/activity?token=nope'")
        await expect(page.get_by_role("heading", name="Not found")).to_be_visible()
        await expect(main).to_contain_text("not “nope” as the token (a UUID is expected)")

        # A token whose grants do not read events: no Activity link; the address says why.
        await page.get_by_role("button", name="Sign out").click()
        await sign_in(page, url, seeded["reader"])
        await expect(page.get_by_role("link", name="Activity")).to_have_count(0)
        await page.evaluate("location.hash = '#/activity'")
        await expect(main.locator(".notice")).to_contain_text(
            "Your token's grants do not allow reading who changed accounts, clients and tokens"
        )
        await expect(page.locator("table.activity")).to_have_count(0)
