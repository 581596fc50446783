"""A real Chromium (Debian's, never a downloaded one) driven by Playwright.

Skipped, with the reason, when ``/usr/bin/chromium`` or the ``playwright`` package is
missing: install them with ``apt-get install -y chromium`` and ``pip install playwright``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

CHROMIUM = Path(os.environ.get("SIGNALBOX_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def _missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright)"
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    reason = _missing()
    if reason:
        pytest.skip(f"browser tests need a real Chromium: {reason}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    page = context.new_page()
    yield page
    context.close()


def screenshot(what: Page | Locator, name: str) -> None:
    """Save a page (or one part) as ``docs/screenshots/{name}.png`` if SIGNALBOX_SCREENSHOTS=1."""
    if os.environ.get("SIGNALBOX_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        what.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
