"""A headless browser for the browser tests: Debian's Chromium driven by Playwright.

Under CI (CI=true) a missing browser fails the run; elsewhere the test is skipped, saying how to
get one."""

import os
import shutil
from pathlib import Path

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
