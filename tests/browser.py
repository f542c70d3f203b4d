"""A headless browser for the browser tests: Debian's Chromium driven by Playwright.

Under CI (CI=true) a missing browser fails the run; elsewhere the test is skipped, saying how to
get one."""

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

HOW = (
    "install Debian's chromium (apt-get install chromium, or set ENGRAM_CHROMIUM to a Chromium "
    "binary) and Playwright (pip install -e '.[test]')"
)


def chromium() -> str:
    """The browser binary, or a skip (a failure under CI) saying how to get one."""
    path = os.environ.get("ENGRAM_CHROMIUM") or shutil.which("chromium")
    if path is not None and not Path(path).is_file():
        path = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI runs the browser tests, but no browser was found: {HOW}")
        pytest.skip(f"no headless browser for the browser tests: {HOW}")
    return path


def screenshot_path(name: str) -> Path:
    """Where a test writes a screenshot (ENGRAM_SCREENSHOT_DIR, else /tmp/engram-screens)."""
    directory = Path(os.environ.get("ENGRAM_SCREENSHOT_DIR", "/tmp/engram-screens"))
    directory.mkdir(parents=True, exist_ok=True)
    return directory / name


class Offline:
    """A headless Chromium whose pages reach only the service at `url`: a request to any other
    host is refused, and listed in `elsewhere`. Each page is in a context of its own (no
    cookies or storage shared), closed with this."""

    def __init__(self, browser: Any, url: str) -> None:
        self.browser, self.url = browser, url
        self.elsewhere: list[str] = []
        self.pages: list[Any] = []

    async def page(self, height: int | None = None) -> Any:
        """A new page, 1280 pixels wide and `height` high (None: the browser's own size)."""
        size = {"viewport": {"width": 1280, "height": height}} if height else {}
        page = await self.browser.new_page(**size)
        self.pages.append(page)
        await page.route("**/*", self._offline)
        return page

    async def _offline(self, route: Any) -> None:
        if route.request.url.startswith(self.url + "/"):
            await route.continue_()
        else:
            self.elsewhere.append(route.request.url)
            await route.abort()

    async def close(self) -> None:
        for page in self.pages:
            await page.context.close()


# One Chromium for this process's browser tests (they all run on the session's event loop):
# launched with its Playwright driver it took ~1 s of each test. Stopped at the session's end
# (conftest.py), or by the process's exit.
_SHARED: dict[str, Any] = {}


async def _browser(executable: str) -> Any:
    """The shared Chromium, launched at first (or again, if it is gone)."""
    browser = _SHARED.get("browser")
    if browser is not None and browser.is_connected():
        return browser
    await stop_shared_browser()
    from playwright.async_api import async_playwright

    playwright = await async_playwright().start()
    _SHARED["playwright"] = playwright
    _SHARED["browser"] = await playwright.chromium.launch(
        executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
    )
    return _SHARED["browser"]


async def stop_shared_browser() -> None:
    """Closes the shared Chromium and its driver, if started."""
    browser, playwright = _SHARED.pop("browser", None), _SHARED.pop("playwright", None)
    try:
        if browser is not None:
            await browser.close()
    finally:
        if playwright is not None:
            await playwright.stop()


@asynccontextmanager
async def offline_browser(url: str) -> AsyncIterator[Offline]:
    """Headless Chromium (a skip, or under CI a failure, without one) reaching only `url`; its
    pages closed at the end."""
    offline = Offline(await _browser(chromium()), url)
    try:
        yield offline
    finally:
        await offline.close()
