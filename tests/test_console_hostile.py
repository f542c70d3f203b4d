"""Hostile data in every field the console shows, in a real browser (issue 17): markup,
`javascript:` addresses, closing script tags, bidi overrides and zero-width characters in an
agent's name and instructions, a record's summary, content, labels and metadata, a session's ID,
a turn's input, the model's reply and a tool's error, a client's name and an address's part
echoed back in an error. Nothing of it runs or becomes an element; it shows as text. And what
would mislead an operator or break a page: session IDs that differ only in what does not show,
a right-to-left client name, a session called "agent", long IDs and principals, addresses edited
by hand, a token revoked while a page is open."""

from urllib.parse import quote

from browser import screenshot_path
from helpers import stored_earlier
from test_console_browser import ADD, ADMIN, READER, Api, console, sign_in

PWN = "window.pwned"
MARKUP = (
    '<img src=x onerror="window.pwned=1"><svg onload="window.pwned=2"></svg>'
    '</script><script>window.pwned=3</script><a href="javascript:window.pwned=4">go</a>'
)
TRICKS = "\u202eevil\u202c\u200b\u2066x\u2069 \x01\x7f \\u0000 %00 &lt;b&gt;"
HOSTILE = MARKUP + " " + TRICKS
ONE_LINE = MARKUP + " %2e%2F..#x"  # a name or a session ID: one line, no disguising characters
SUMMARY = MARKUP + " \u202eevil\u202c\u200b"  # one line
SHOWN_CONTROLS = "U+202Eevil"  # how the console shows the override: its code point

ELEMENTS = (
    "() => document.querySelectorAll('main img, main svg, main script, main iframe, "
    'main a[href^="javascript"], #confirm img, #confirm script\').length'
)


async def test_hostile_text_in_every_field_shows_as_text_and_runs_nothing(db_url, embedder):
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, model = Api(url, ADMIN), seeded["model"]
        harness = admin("query($a: UUID!) { action(actionId: $a) { harness } }", a=seeded["agent"])
        agent = admin(
            "mutation($i: ActionInput!) { createAction(input: $i) { actionId } }",
            i={"name": ONE_LINE, "instructions": HOSTILE, **harness["action"]},
        )["createAction"]["actionId"]
        record = admin(
            ADD,
            a=agent,
            i={
                "summary": SUMMARY,
                "content": HOSTILE,
                "kind": "fact",
                "labels": [{"name": "customer_id", "value": HOSTILE}],
                "metadata": {HOSTILE: HOSTILE},
                "sessionId": ONE_LINE,
            },
        )["addAgentMemory"]["memoryId"]
        model.call_tools(("read_memory", {"id": HOSTILE}))  # refused: its error echoes the id
        model.say(HOSTILE)
        turn = admin(
            "mutation($i: ExecuteActionInput!) { executeAction(input: $i) { status } }",
            i={"actionId": agent, "sessionId": ONE_LINE, "input": HOSTILE},
        )["executeAction"]
        assert turn["status"] == "SUCCEEDED", turn
        # A client's MCP tool call and a conversation handed in, each holding it: their input
        # is loaded when opened on the session's page.
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "search_memory", "arguments": {"query": HOSTILE, HOSTILE: 1}},
        }
        admin.client.post(
            f"/mcp/{agent}?session={quote(ONE_LINE, safe='')}",
            json=call,
            headers={"accept": "application/json, text/event-stream"},
        ).raise_for_status()
        handed = admin(
            """mutation($a: UUID!, $s: String!, $m: [ConversationMessageInput!]!) {
              rememberConversation(input: {actionId: $a, sessionId: $s, messages: $m})
              { status } }""",
            a=agent,
            s=ONE_LINE,
            m=[{"role": "user", "content": HOSTILE}, {"role": "assistant", "content": MARKUP}],
        )["rememberConversation"]
        assert handed["status"] == "SUCCEEDED", handed
        admin(
            "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
            i={"principal": "hostile", "name": ONE_LINE, "policies": READER},
        )
        await sign_in(page, url, ADMIN)
        # The token is kept in the tab's session storage only: in no address, cookie or
        # long-lived storage.
        kept = await page.evaluate(
            "[location.href, document.cookie, JSON.stringify(localStorage),"
            " JSON.stringify(sessionStorage)]"
        )
        assert ADMIN not in kept[0] + kept[1] + kept[2] and ADMIN in kept[3]
        session = quote(ONE_LINE, safe="")  # as the console's links encode it

        pages = [
            "#/",
            f"#/agents/{agent}",
            f"#/agents/{agent}/memories",
            f"#/agents/{agent}/memories?session={session}",  # the memories of that session
            f"#/agents/{agent}/memories/{record}",
            f"#/agents/{agent}/sessions",
            f"#/agents/{agent}/sessions/{session}",
            "#/clients",
            f"#/agents/{quote(MARKUP, safe='')}",  # not an ID: the server's error echoes it
            f"#/agents/{agent}/memories/{quote(MARKUP, safe='')}",
        ]
        for path in pages:
            await page.goto(f"{url}/console/{path}")
            await expect(page.locator("main h1")).to_be_visible()
            await expect(page.locator("main[aria-busy]")).to_have_count(0)
            assert await page.evaluate(ELEMENTS) == 0, path
            assert await page.evaluate(PWN) is None, path
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width == 1280, (path, width)
        # What the agent's pages show, as text.
        await page.goto(f"{url}/console/#/agents/{agent}/memories/{record}")
        await expect(page.locator("main h1")).to_contain_text(
            '<img src=x onerror="window.pwned=1">'
        )
        await expect(page.locator("main h1")).to_contain_text(SHOWN_CONTROLS)
        main = await page.locator("main").inner_text()
        assert "</script><script>window.pwned=3</script>" in main
        assert not set("\u202e\u202c\u200b\u2066\u2069\x01\x7f") & set(main)
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/{session}")
        await expect(page.locator("main h1")).to_have_text(f"Session {ONE_LINE}")
        await expect(page.locator("main")).to_contain_text("U+202Eevil")  # the turn's input
        assert await page.evaluate(ELEMENTS) == 0
        for opened in ["Tool and arguments", "Messages handed in"]:
            await page.get_by_text(opened).click()
        tool = page.locator("details.handed-in", has_text="Tool and arguments")
        messages = page.locator("details.handed-in", has_text="Messages handed in")
        await expect(tool.locator("pre")).to_contain_text('"<img src=x onerror=')
        await expect(messages.locator("li.event")).to_have_count(2)
        await expect(messages).to_contain_text("</script><script>window.pwned=3</script>")
        await expect(messages).to_contain_text(SHOWN_CONTROLS)
        assert await page.evaluate(ELEMENTS) == 0
        # Its history searched: the results, the turn's words, are text too.
        await page.get_by_label("Search this session's history").fill(MARKUP)
        await page.get_by_role("button", name="Search history").click()
        await expect(page.locator("main")).to_contain_text("turn 1, user")
        assert await page.evaluate(ELEMENTS) == 0
        await page.screenshot(path=screenshot_path("console-hostile-session.png"), full_page=True)
        # The confirmation typed to erase the session names it as text too.
        erase = page.get_by_role("button", name="Erase this session…")
        if await erase.count():
            await erase.click()
            dialog = page.get_by_role("dialog")
            await expect(dialog).to_be_visible()
            assert await page.evaluate(ELEMENTS) == 0
            await dialog.get_by_role("button", name="Cancel").click()
        assert await page.evaluate(PWN) is None


# Session IDs that differ from another only in what does not show: a space at an end or beside
# another, a left-to-right mark, a soft hyphen, a no-break space; and one whose right-to-left mark
# reorders its digits to read as "34 12", another session's ID.
LOOKALIKES = {
    "s-1 ": "s-1U+0020",
    " s-1": "U+0020s-1",
    "a  b": "aU+0020U+0020b",
    "s-1\u200e": "s-1U+200E",
    "s\u00ad-1": "sU+00AD-1",
    "a\u00a0b": "aU+00A0b",
    "\u200f12 34": "U+200F12 34",
    "34 12": "34 12",
    "a b": "a b",
}


async def test_session_ids_that_look_alike_show_apart(db_url, embedder):
    """Session IDs the API takes, or an earlier release stored, that would show as another's (a
    space at an end or doubled, an invisible mark, a right-to-left mark reordering digits) show
    what they hold, as code points: in the list of sessions, a session's title, the memory list
    and a record's page, and in the text typed to erase one, which then matches what is shown.
    A session ID holding a NUL (none can) typed into the address is not found, not "Something
    went wrong"."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        records = {}
        for n, session in enumerate(LOOKALIKES):
            # Under another ID first: a new session's may not hold the marks an earlier
            # release stored.
            records[session] = admin(
                ADD, a=agent, i={"summary": f"Record {n}.", "kind": "fact", "sessionId": f"_{n}"}
            )["addAgentMemory"]["memoryId"]
            await stored_earlier(db_url, f"_{n}", session)
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/sessions")
        cells = page.locator("td[data-label=Session]")
        await expect(cells).to_have_count(len(LOOKALIKES) + 1)  # and the seed's s-1
        shown = await cells.all_inner_texts()
        assert sorted(shown) == sorted([*LOOKALIKES.values(), "s-1"]), shown
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        listing = page.locator("table", has=page.locator("caption", has_text="newest first"))
        for n, seen in enumerate(LOOKALIKES.values()):
            row = listing.locator("tbody tr").filter(has_text=f"Record {n}.")
            await expect(row.locator("td[data-label=Session]")).to_have_text(seen)
        # Each session's title, and a record's page, say which it is; bidi stays inside the ID.
        for session, seen in LOOKALIKES.items():
            await page.goto(f"{url}/console/#/agents/{agent}/sessions/{quote(session, safe='')}")
            await expect(page.locator("main h1")).to_have_text(f"Session {seen}")
            await expect(page.locator("main h1 bdi")).to_have_count(1)
            await page.goto(f"{url}/console/#/agents/{agent}/memories/{records[session]}")
            facts = page.locator("dl.facts").last
            await expect(facts).to_contain_text(seen)
        # Erasing "s-1 ": what is shown to type says its space; typed so, it confirms.
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/{quote('s-1 ', safe='')}")
        await page.get_by_role("button", name="Erase this session…").click()
        dialog = page.get_by_role("dialog")
        await expect(dialog.locator("h2")).to_have_text("Erase session s-1U+0020 for good?")
        await expect(dialog.locator("label")).to_have_text("Type s-1U+0020 to confirm")
        typed = dialog.get_by_role("textbox")
        await typed.fill("s-1")
        await expect(dialog.get_by_role("button", name="Erase session")).to_be_disabled()
        await typed.fill("s-1 ")
        await expect(dialog.get_by_role("button", name="Erase session")).to_be_enabled()
        await dialog.get_by_role("button", name="Cancel").click()
        # The agent's ID typed in capitals: the session's turns still show (the console names
        # the session by the agent's ID as the API returned it, the one spelling node(id) takes).
        await page.goto(f"{url}/console/#/agents/{agent.upper()}/sessions/s-1")
        await expect(page.locator("main h1")).to_have_text("Session s-1")
        await expect(page.locator("main section.turn")).not_to_have_count(0)
        # A NUL in the address: no such session, said so.
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/a%00b")
        await expect(page.locator("main h1")).to_have_text("Not found")
        await expect(page.locator("main")).to_contain_text(
            f"No session aU+0000b of agent {agent} was found."
        )


async def test_a_session_called_agent_is_not_read_as_agent_scope(db_url, embedder):
    """The memory list's Session column: a record of a session called "agent" does not read as
    one of agent scope, which showed as the word "agent" too."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        admin(
            ADD, a=agent, i={"summary": "In session agent.", "kind": "fact", "sessionId": "agent"}
        )
        admin(ADD, a=agent, i={"summary": "For every session.", "kind": "fact", "scope": "AGENT"})
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/memories")
        rows = page.locator("table", has=page.locator("caption", has_text="newest first"))
        session = rows.locator("tr", has_text="In session agent.").locator("td[data-label=Session]")
        every = rows.locator("tr", has_text="For every session.").locator("td[data-label=Session]")
        await expect(session).to_have_text("agent")
        await expect(every).not_to_have_text("agent")
        await expect(every.locator(".badge")).to_have_count(1)
        await expect(session.locator(".badge")).to_have_count(0)


async def test_the_memory_lists_address_says_the_session_it_lists(db_url, embedder):
    """The memory list opened for a session (…/memories?session=ID) keeps its address in step
    with the Session filter applied, so a reload or a shared address lists what the page listed
    (it kept naming the session it was opened with); an address it cannot read says why."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        other = "a&b #2 100%?"
        admin(ADD, a=agent, i={"summary": "In the other.", "kind": "fact", "sessionId": other})
        await sign_in(page, url, ADMIN)
        base = f"{url}/console/#/agents/{agent}/memories"
        await page.goto(f"{base}?session=s-1")
        listing = page.locator("table", has=page.locator("caption", has_text="newest first"))
        sessions = listing.locator("td[data-label=Session]")
        await expect(sessions.first).to_have_text("s-1")
        await page.get_by_label("Session").fill(other)
        await page.get_by_role("button", name="Apply filters").click()
        await expect(sessions).to_have_text([other])
        assert page.url == f"{base}?session={quote(other, safe='')}", page.url
        await page.reload()
        await expect(page.get_by_label("Session")).to_have_value(other)
        await expect(sessions).to_have_text([other])
        # Emptied, the filter and the address list every session's records.
        await page.get_by_label("Session").fill("")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(listing.get_by_text("s-1").first).to_be_visible()
        assert page.url == base, page.url
        # Addresses edited by hand: what is wrong with each is said.
        for query in ["?session=%", "?session=%ED%A0%80", "?session=50%%"]:
            await page.goto(f"{base}{query}")
            await expect(page.locator("main h1")).to_have_text("Not found")
            await expect(page.locator("main")).to_contain_text("is not well-formed: each “%”")
        # A NUL, which no session ID holds: the refusal names the API's argument, sessionId.
        await page.goto(f"{base}?session=a%00b")
        await expect(page.locator("main .error")).to_contain_text(
            "variables.sessionId contains a NUL character at position 1"
        )
        for query in ["?session=a&b", "?sessionId=s-1", "?"]:
            await page.goto(f"{base}{query}")
            await expect(page.locator("main h1")).to_have_text("Not found")
            await expect(page.locator("main")).to_contain_text(
                "The memory list's address takes one parameter"
            )
            await page.get_by_role("link", name="List every record of the agent").click()
            await expect(sessions.first).to_be_visible()


async def test_a_right_to_left_client_name_keeps_to_itself_in_its_card(db_url, embedder):
    """A client's card titles it by name, then principal: a right-to-left name drew the
    principal's leading digit to its left ("1 אבx" for name "אב", principal "1x"), so the
    principal read as "x". The principal now shows whole, after the name."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin = Api(url, ADMIN)
        admin(
            "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
            i={"principal": "1x", "name": "אב", "policies": READER},
        )
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/clients")
        heading = page.locator("section.client h2").filter(has_text="1x")
        await expect(heading).to_be_visible()
        # Where the name ends and the principal begins, on the screen.
        name_right, principal_left = await heading.evaluate(
            """(h) => { const r = document.createRange(); r.selectNode(h.firstChild);
              return [r.getBoundingClientRect().right,
                      h.querySelector('.mono').getBoundingClientRect().left]; }"""
        )
        assert principal_left >= name_right, (name_right, principal_left)


async def test_show_more_with_a_token_revoked_meanwhile_says_so(db_url, embedder):
    """ "Show older turns" (and the other lists' "Show more" that did not catch) with a token
    revoked since the page loaded: the console says the token was refused and offers to sign
    in again, where the click did nothing and threw in the page."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        everything = [{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.*"]}]
        admin(
            "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
            i={"principal": "watcher", "name": "Watcher", "policies": everything},
        )
        made = admin('mutation { createClientToken(principal: "watcher") { token tokenId } }')
        for n in range(8):  # the seed's four executions and these: more than a page of ten
            admin(ADD, a=agent, i={"summary": f"Note {n}.", "kind": "fact", "sessionId": "s-1"})
        await sign_in(page, url, made["createClientToken"]["token"])
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/s-1")
        await expect(page.locator("section.turn")).to_have_count(10)
        admin(
            'mutation($t: UUID!) { revokeClientToken(principal: "watcher", tokenId: $t) '
            "{ tokenId } }",
            t=made["createClientToken"]["tokenId"],
        )
        await page.get_by_role("button", name="Show older turns").click()
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await expect(page.locator("main")).to_contain_text("The server did not accept this token")


async def test_the_erase_dialog_wraps_a_long_session_id(db_url, embedder):
    """The dialog that erases a session names it, in its title and in the text to type: a
    200-character ID, unbroken or of marks shown as code points, wraps inside the dialog, where
    it ran past its edge and the dialog scrolled sideways (on a phone and on a desktop)."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        sessions = ["s" * 200, "x" + "\u200e" * 198 + "x"]
        for n, session in enumerate(sessions):
            admin(ADD, a=agent, i={"summary": "Here.", "kind": "fact", "sessionId": f"_{n}"})
            await stored_earlier(db_url, f"_{n}", session)  # as an earlier release took it
        await sign_in(page, url, ADMIN)
        for width in (1280, 375):
            await page.set_viewport_size({"width": width, "height": 800})
            for session in sessions:
                await page.goto(
                    f"{url}/console/#/agents/{agent}/sessions/{quote(session, safe='')}"
                )
                await page.get_by_role("button", name="Erase this session…").click()
                dialog = page.get_by_role("dialog")
                await expect(dialog).to_be_visible()
                scroll, client = await dialog.evaluate("(d) => [d.scrollWidth, d.clientWidth]")
                assert scroll <= client, (width, session[:3], scroll, client)
                await dialog.get_by_role("button", name="Cancel").click()
                await expect(dialog).to_be_hidden()


async def test_a_long_principal_wraps_in_the_header(db_url, embedder):
    """The header says who is signed in: a 200-character principal wraps there, where it
    widened the page past the window."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, principal = Api(url, ADMIN), "p" * 200
        admin(
            "mutation($i: ClientInput!) { createClient(input: $i) { principal } }",
            i={"principal": principal, "name": "Long", "policies": READER},
        )
        made = admin(
            "mutation($p: String!) { createClientToken(principal: $p) { token } }", p=principal
        )
        await sign_in(page, url, made["createClientToken"]["token"])
        await expect(page.locator("#nav .who")).to_contain_text(principal)
        for width in (1280, 375):
            await page.set_viewport_size({"width": width, "height": 800})
            scroll = await page.evaluate("document.documentElement.scrollWidth")
            assert scroll == width, (width, scroll)
            await page.screenshot(path=screenshot_path(f"console-long-principal-{width}.png"))


async def test_a_session_whose_id_holds_a_mark_can_be_erased_by_typing_what_is_shown(
    db_url, embedder
):
    """Erasing a session asks for its ID typed: one holding a U+200E (or a no-break space),
    which few keyboards type and which showed as nothing, is confirmed by typing it as the
    dialog shows it, "s-1U+200E", where the button could not be enabled."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        session = "s-1\u200e"  # stored by an earlier release: a new session's ID holds no mark
        admin(ADD, a=agent, i={"summary": "Marked.", "kind": "fact", "sessionId": "_"})
        await stored_earlier(db_url, "_", session)
        await sign_in(page, url, ADMIN)
        await page.goto(f"{url}/console/#/agents/{agent}/sessions/{quote(session, safe='')}")
        await page.get_by_role("button", name="Erase this session…").click()
        dialog = page.get_by_role("dialog")
        erase = dialog.get_by_role("button", name="Erase session")
        typed = dialog.get_by_role("textbox")
        await expect(dialog).to_contain_text("type a character shown as its code point")
        await typed.fill("s-1")
        await expect(erase).to_be_disabled()
        await typed.fill("s-1U+200E")
        await expect(erase).to_be_enabled()
        await typed.press("Enter")
        await expect(page.get_by_role("heading", name="Session erased")).to_be_visible()
        erased = admin(
            """query($a: UUID!) { action(actionId: $a) { executions(first: 1) {
              nodes { kind sessionId } } } }""",
            a=agent,
        )["action"]["executions"]["nodes"]
        assert erased == [{"kind": "ERASE", "sessionId": session}], erased


async def test_older_records_keep_the_session_filter(db_url, embedder):
    """The memory list opened for a session pages on within it: "Show older records" lists
    that session's older records, not every session's."""
    from playwright.async_api import expect

    async with console(db_url, embedder) as (url, page, seeded):
        admin, agent = Api(url, ADMIN), seeded["agent"]
        session = "p&q #1"
        for n in range(25):
            admin(ADD, a=agent, i={"summary": f"Page {n}.", "kind": "fact", "sessionId": session})
        await sign_in(page, url, ADMIN)
        await page.goto(
            f"{url}/console/#/agents/{agent}/memories?session={quote(session, safe='')}"
        )
        listing = page.locator("table", has=page.locator("caption", has_text="newest first"))
        sessions = listing.locator("td[data-label=Session]")
        await expect(sessions).to_have_count(20)
        await page.get_by_role("button", name="Show older records").click()
        await expect(sessions).to_have_count(25)
        await expect(sessions).to_have_text([session] * 25)
        await expect(page.get_by_role("button", name="Show older records")).to_be_hidden()
