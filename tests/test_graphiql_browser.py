"""GraphiQL in a real browser (issue 16, item 2): headless Chromium, driven by Playwright, loads
`GET /graphql` from the service on loopback with every other host refused (offline), takes a
token in the page's header field, runs a query and shows its result. It writes a screenshot
(the path is printed; ENGRAM_SCREENSHOT_DIR chooses the directory).

Under CI (CI=true) a missing browser fails the run; elsewhere the test is skipped, saying how to
get one: `apt-get install chromium` (Debian) and `pip install -e '.[test]'` (Playwright)."""

from browser import chromium, offline_browser, screenshot_path
from helpers import db_settings
from servers import serving

TOKEN = "graphiql-browser-test-admin-token"
QUERY = "{ viewer { principal } }"


async def test_graphiql_runs_a_query_with_a_token_entered_in_the_page_offline(db_url, embedder):
    chromium()  # without a browser, skipped before the service starts
    from playwright.async_api import expect

    expect.set_options(timeout=20_000)  # a loaded CI machine parses 3.5 MB of GraphiQL slowly

    settings = db_settings(db_url, bootstrap_token=TOKEN)
    with serving(settings, embedder) as url:
        async with offline_browser(url) as browser:
            page = await browser.page(height=760)
            sent: list[dict[str, str]] = []
            page.on(
                "request",
                lambda r: sent.append(r.headers) if r.method == "POST" else None,
            )
            blocked: list[str] = []  # what the page's Content-Security-Policy refused
            page.on(
                "console",
                lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else 0,
            )
            await page.goto(url + "/graphql")

            # Without a token the page says what to do, where a person looks first.
            status = page.get_by_role("status")
            await expect(status).to_contain_text("No token")
            await expect(page.locator(".graphiql-query-editor .CodeMirror")).to_be_visible()
            await page.screenshot(path=str(screenshot_path("graphiql-no-token.png")))

            await page.get_by_label("API token").fill(TOKEN)
            before = len(sent)  # the schema request sent without a token (refused)
            await page.get_by_role("button", name="Use token").click()
            await expect(status).to_contain_text("Token in use")

            # GraphiQL mounted again with the token: it loads the schema and runs a query.
            editor = page.locator(".graphiql-query-editor .CodeMirror")
            await expect(editor).to_be_visible()
            await editor.evaluate("(e, q) => e.CodeMirror.setValue(q)", QUERY)
            await page.locator(".graphiql-execute-button").click()
            response = page.locator(".graphiql-response")
            await expect(response).to_contain_text('"principal": "admin"')
            # Nothing outlives the tab: GraphiQL's history (which would hold headers typed
            # in its editor) is kept in session storage, not localStorage.
            kept = await page.evaluate("() => Object.keys(localStorage)")
            assert kept == [], kept
            history = await page.evaluate("() => sessionStorage.getItem('graphiql:queries')")
            assert history and "viewer" in history
            # The schema came through the token too: the docs explorer lists Query's fields.
            await page.get_by_role("button", name="Show Documentation Explorer").click()
            await expect(page.locator(".graphiql-doc-explorer")).to_contain_text("Query")

            shot = screenshot_path("graphiql.png")
            await page.screenshot(path=str(shot))
            print(f"GraphiQL screenshot: {shot}")

            # Another site cannot frame the page a token is pasted into (clickjacking).
            framing = await browser.page()
            await framing.set_content(f'<iframe src="{url}/graphql"></iframe>')
            framed = await (await framing.query_selector("iframe")).content_frame()
            await framed.wait_for_load_state("load")
            assert await framed.locator("#engram-token").count() == 0
            assert await page.locator("#engram-token").count() == 1  # (not framed: shown)

    assert browser.elsewhere == [], f"the page reached beyond the service: {browser.elsewhere}"
    assert blocked == [], f"the page's own policy refused its parts: {blocked}"
    assert not any("authorization" in h for h in sent[:before])
    after = sent[before:]
    # The schema and the query, both with the token.
    assert len(after) >= 2 and all(h.get("authorization") == f"Bearer {TOKEN}" for h in after)
    assert shot.stat().st_size > 10_000


async def test_graphiql_without_introspection_says_why_and_still_runs_queries(db_url, embedder):
    chromium()  # without a browser, skipped before the service starts
    from playwright.async_api import expect

    expect.set_options(timeout=20_000)  # a loaded CI machine parses 3.5 MB of GraphiQL slowly

    settings = db_settings(db_url, bootstrap_token=TOKEN, introspection=False)
    with serving(settings, embedder) as url:
        async with offline_browser(url) as browser:
            page = await browser.page(height=600)
            await page.goto(url + "/graphql")
            await expect(page.get_by_role("alert")).to_contain_text(
                "introspection is turned off on this server (ENGRAM_INTROSPECTION=false)"
            )
            await page.get_by_label("API token").fill(TOKEN)
            await page.get_by_role("button", name="Use token").click()
            editor = page.locator(".graphiql-query-editor .CodeMirror")
            await expect(editor).to_be_visible()
            await editor.evaluate("(e, q) => e.CodeMirror.setValue(q)", QUERY)
            await page.locator(".graphiql-execute-button").click()
            await expect(page.locator(".graphiql-response")).to_contain_text('"principal": "admin"')
            shot = screenshot_path("graphiql-introspection-off.png")
            await page.screenshot(path=str(shot))
            print(f"GraphiQL screenshot: {shot}")


async def test_graphiql_shows_markup_in_answers_and_errors_as_text(db_url, embedder):
    """A record's summary and an error that echoes what was sent, both markup: GraphiQL shows
    them in its editor as text; nothing of them becomes an element or runs."""
    import httpx

    chromium()
    from playwright.async_api import expect

    expect.set_options(timeout=20_000)
    markup = '<img src=x onerror="window.pwned=1"></script><script>window.pwned=2</script>'
    settings = db_settings(db_url, bootstrap_token=TOKEN)
    with serving(settings, embedder) as url:
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"})
        harness = {"memory": {"enabled": True, "scope": {"read": ["agent"], "write": ["agent"]}}}
        agent = api.post(
            "/graphql",
            json={
                "query": "mutation($i: ActionInput!) { createAction(input: $i) { actionId } }",
                "variables": {"i": {"name": "hostile", "harness": harness}},
            },
        ).json()["data"]["createAction"]["actionId"]
        added = api.post(
            "/graphql",
            json={
                "query": "mutation($a: UUID!, $i: AgentMemoryInput!) { addAgentMemory("
                "actionId: $a, input: $i) { memoryId } }",
                "variables": {"a": agent, "i": {"summary": markup, "kind": "fact"}},
            },
        ).json()
        assert "errors" not in added, added
        async with offline_browser(url) as browser:
            page = await browser.page(height=760)
            await page.goto(url + "/graphql")
            await page.get_by_label("API token").fill(TOKEN)
            await page.get_by_role("button", name="Use token").click()
            editor = page.locator(".graphiql-query-editor .CodeMirror")
            response = page.locator(".graphiql-response")
            for query, shown in [
                (
                    f'{{ action(actionId: "{agent}") {{ memories(first: 1) {{ nodes {{ summary }}'
                    " } } }",
                    "window.pwned=2",
                ),
                # Not an ID: the error says what was sent (a GraphQL string: no quotes in it).
                (f'{{ action(actionId: "{markup.replace(chr(34), "")}") {{ name }} }}', "onerror"),
            ]:
                await editor.evaluate("(e, q) => e.CodeMirror.setValue(q)", query)
                await page.locator(".graphiql-execute-button").click()
                await expect(response).to_contain_text(shown)
                elements = await page.evaluate(
                    "document.querySelectorAll('.graphiql-container img, "
                    ".graphiql-container script').length"
                )
                assert elements == 0
                assert await page.evaluate("window.pwned") is None
    assert browser.elsewhere == []
