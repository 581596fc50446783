"""A real Chromium (Debian's, never a downloaded one) driven by Playwright.

Skipped, with the reason, when ``/usr/bin/chromium`` or the ``playwright`` package is
missing: install them with ``apt-get install -y chromium`` and ``pip install playwright``.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.users import create_user
from signalbox.stack import Stack, StackConfig
from tests.databases import database_for
from tests.fake_anthropic import FakeAnthropic

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


# A Chromium per module: Playwright's sync API runs an event loop in this thread while it is
# open, and asyncio.run in a later test module would refuse to start beside it.
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
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    yield page
    context.close()


def screenshot(what: Page | Locator, name: str) -> None:
    """Save a page (or one part) as ``docs/screenshots/{name}.png`` if SIGNALBOX_SCREENSHOTS=1."""
    if os.environ.get("SIGNALBOX_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        what.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


# One fake-model stack for the whole browser suite (its start takes 5 to 20 s): every test
# makes users of its own, and scripts its model replies under a marker of its own.
@pytest.fixture(scope="session")
def fake_stack(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    run_id: str,
    internal_token: str,
) -> Iterator[tuple[Stack, FakeAnthropic, sessionmaker[Session]]]:
    """Every service as a real process, the model being the fake Messages API (scripted)."""
    var = tmp_path_factory.mktemp("fake-stack")
    database_url = database_for(request, var, "browser")
    engine = make_engine(database_url)
    fake = FakeAnthropic().start()
    config = StackConfig(
        var_dir=var,
        redis_url=redis_url,
        database_url=database_url,
        internal_token=internal_token,
        redis_prefix=f"sbtest-{run_id}:fake-{uuid.uuid4().hex[:6]}:",  # one per instance
        extra_env={"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": fake.url},
    )
    stack = Stack(config)
    stack.start()
    try:
        yield stack, fake, make_session_factory(engine)
    finally:
        stack.stop()
        fake.stop()
        engine.dispose()


def new_user(sessions: sessionmaker[Session]) -> tuple[str, str]:
    """A user of that stack: ``(user_id, token)``."""
    with sessions() as session:
        user, token = create_user(session, f"user-{uuid.uuid4().hex[:8]}")
        session.commit()
        return user.id, token


def console_errors(page: Page) -> list[str]:
    """A list that fills with the page's console errors and uncaught exceptions."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors
