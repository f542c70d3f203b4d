"""Hostile data in every field the console shows, in a real browser (issue 17): markup,
`javascript:` addresses, closing script tags, bidi overrides and zero-width characters in an
agent's name and instructions, a record's summary, content, labels and metadata, a session's ID,
a turn's input, the model's reply and a tool's error, a client's name and an address's part
echoed back in an error. Nothing of it runs or becomes an element; it shows as text."""

from urllib.parse import quote

from browser import screenshot_path
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
