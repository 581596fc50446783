"""Attaching a file in the web UI: the 📎 button uploads it and shows its chip, the turn
carries it (the chip moves onto the user's message), and the model receives the image."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from signalbox.stack import Stack
from tests.browser.conftest import console_errors, new_user, screenshot
from tests.fake_anthropic import FakeAnthropic, attachment_blocks, text
from tests.gateway.test_uploads import EXE, png_bytes

if TYPE_CHECKING:
    from playwright.sync_api import Page

UI_TIMEOUT_MS = 20_000
MODEL_TIMEOUT_S = 20.0


def _wait_for_request(fake: FakeAnthropic, before: int) -> None:
    deadline = time.monotonic() + MODEL_TIMEOUT_S
    while len(fake.requests) <= before:
        if time.monotonic() > deadline:
            raise AssertionError("the model was never asked")
        time.sleep(0.05)  # the orchestrator is another process: polled, with a deadline


def test_attach_an_image_see_its_chip_and_the_model_gets_it(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    from playwright.sync_api import expect

    stack, fake, sessions = fake_stack
    expect.set_options(timeout=UI_TIMEOUT_MS)
    errors = console_errors(page)
    _, token = new_user(sessions)
    fake.script([[text("A single green dot.")]])
    before = len(fake.requests)
    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")

    page.set_input_files(
        "#attach-input", {"name": "dot.png", "mimeType": "image/png", "buffer": png_bytes()}
    )
    pending = page.locator("#chips .chip.image")
    expect(pending).to_contain_text("dot.png")
    screenshot(page.locator("#composer"), "attach-chip")
    page.fill("#text", "what is in this picture?")
    page.click("#composer button[type=submit]")

    sent_chip = page.locator(".msg.user .chips .chip.image")
    expect(sent_chip).to_contain_text("dot.png")
    expect(page.locator("#chips")).to_be_hidden()  # the composer's chips went with the turn
    expect(page.locator(".msg.assistant").last).to_contain_text("A single green dot.")
    _wait_for_request(fake, before)
    blocks = attachment_blocks(fake.requests[before].body)
    assert [b["type"] for b in blocks] == ["image"]
    assert blocks[0]["source"]["media_type"] == "image/png"
    assert errors == []


def test_a_refused_attachment_says_why_and_makes_no_chip(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    from playwright.sync_api import expect

    stack, _fake, sessions = fake_stack
    expect.set_options(timeout=UI_TIMEOUT_MS)
    _, token = new_user(sessions)
    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")

    page.set_input_files(
        "#attach-input", {"name": "cat.png", "mimeType": "image/png", "buffer": EXE}
    )

    expect(page.locator(".msg.note").last).to_contain_text("could not attach cat.png")
    expect(page.locator("#chips .chip")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()
