"""Choosing an agent in the web UI: the picker lists the user's agents and the deployment's,
a new conversation started with one is bound to it (its header says which), and the model
is asked as that agent: its system prompt, no tools in chat mode, its thinking shown folded."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from signalbox.stack import Stack
from tests import http_calls
from tests.browser.conftest import console_errors, new_user, screenshot
from tests.fake_anthropic import FakeAnthropic, text, thinking

if TYPE_CHECKING:
    from playwright.sync_api import Page

UI_TIMEOUT_MS = 20_000
MODEL_TIMEOUT_S = 20.0
PROMPT = "You are Haiku, who answers in three short lines."


def _request_after(fake: FakeAnthropic, before: int) -> dict[str, Any]:
    deadline = time.monotonic() + MODEL_TIMEOUT_S
    while len(fake.requests) <= before:
        if time.monotonic() > deadline:
            raise AssertionError("the model was never asked")
        time.sleep(0.05)  # the orchestrator is another process: polled, with a deadline
    return fake.requests[before].body


def test_a_new_conversation_runs_as_the_agent_picked(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    from playwright.sync_api import expect

    stack, fake, sessions = fake_stack
    expect.set_options(timeout=UI_TIMEOUT_MS)
    errors = console_errors(page)
    _, token = new_user(sessions)
    made = http_calls.post(
        f"{stack.gateway_url}/api/agents",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "name": "haiku",
            "mode": "chat",
            "system_prompt": PROMPT,
            "thinking_budget_tokens": 1024,
        },
    )
    assert made.status_code == 201, made.text
    fake.script([[thinking("Five, seven, five."), text("Autumn moonlight")]])
    before = len(fake.requests)

    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")
    expect(page.locator("#agent option[value=haiku]")).to_have_text("haiku (chat) · mine")
    page.select_option("#agent", "haiku")
    expect(page.locator("#conv-workspace")).to_contain_text("agent haiku")
    page.fill("#text", "a poem about the moon")
    page.click("#composer button[type=submit]")

    expect(page.locator(".msg.assistant").last).to_contain_text("Autumn moonlight")
    expect(page.locator("#conv-workspace")).to_contain_text("agent haiku v1")
    folded = page.locator("details.thinking").first
    expect(folded).to_be_visible()
    expect(folded).not_to_have_attribute("open", "")
    screenshot(page, "agent-picked")

    body = _request_after(fake, before)
    system = body["system"]
    sent = system if isinstance(system, str) else "".join(b["text"] for b in system)
    assert sent == PROMPT
    assert not body.get("tools"), "a chat-mode agent is offered no tools"
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert errors == []
