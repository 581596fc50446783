"""Reverting a turn's applied changes from the web UI, and decided proposals after a reload.

Real Chromium against the real stack (demo model): the turn proposes a new file, the user
approves it, presses the turn's "Revert changes", approves the revert proposal that appears
in the Changes inbox, and the file is gone. A fresh page with no conversation open (so no
event replays them) lists both decided proposals, newest first, with their outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from signalbox.shared.workspace_paths import workspace_dir
from signalbox.stack import Stack
from tests.browser.conftest import console_errors, screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

UI_TIMEOUT_MS = 30_000


def test_revert_a_turns_applied_change_then_see_both_decided_after_a_reload(
    stack: Stack, page: Page, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_TIMEOUT_MS)
    errors = console_errors(page)
    user_id, token = make_stack_user()
    made = workspace_dir(stack.config.workspaces_root, user_id, "default") / "undo-me.txt"
    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")
    page.fill("#text", "create undo-me.txt with Short-lived")
    page.press("#text", "Enter")
    turn = page.locator("#transcript > section.turn").first
    expect(turn).to_have_attribute("data-status", "completed")
    revert_turn = turn.locator("button.revert-turn")
    expect(revert_turn).to_be_hidden()  # nothing applied yet

    page.click("#tab-changes")
    original = page.locator('#proposals .proposal[data-status="pending"]')
    expect(original).to_have_count(1)
    original_id = original.get_attribute("id")
    original.locator("button.approve").click()
    expect(page.locator('#decided .proposal[data-status="applied"]')).to_have_count(1)
    assert made.read_text().startswith("Short-lived")

    expect(revert_turn).to_be_visible()
    expect(revert_turn).to_have_accessible_name("Propose undoing the changes this turn applied")
    screenshot(page, "19-revert-changes")
    revert_turn.click()
    revert = page.locator('#proposals .proposal[data-status="pending"]')
    expect(revert).to_have_count(1)
    expect(revert.locator(".proposal-meta")).to_contain_text("reverts prop_")
    expect(revert.locator('details.file[data-path="undo-me.txt"] .op')).to_have_text("delete")
    expect(revert_turn).to_be_hidden()  # a revert waits: offering another would only conflict
    expect(page.locator("#transcript .msg.note").last).to_contain_text("revert proposed")
    assert made.exists()  # proposed, never written directly
    screenshot(page.locator("#side"), "20-revert-proposed")

    revert.locator("button.approve").click()
    expect(page.locator('#decided .proposal[data-status="applied"]')).to_have_count(2)
    assert not made.exists()

    conversation_url = page.url
    # A fresh page with no conversation open: no event replays a proposal, only the listing.
    page.goto("about:blank")
    page.goto(f"{stack.gateway_url}/")
    expect(page.locator("#conn")).to_have_text("online")
    expect(page.locator("#transcript > section.turn")).to_have_count(0)
    decided = page.locator("#decided .proposal")
    expect(decided).to_have_count(2)
    # Newest first, each with its outcome; the revert names what it reverted.
    expect(decided.first.locator(".badge")).to_have_text("applied")
    expect(decided.first.locator(".proposal-meta")).to_contain_text("reverts prop_")
    expect(decided.nth(1)).to_have_attribute("id", original_id or "")
    expect(decided.nth(1).locator(".badge")).to_have_text("applied")
    expect(decided.first.locator("button.revert")).to_have_text("Undo revert")
    expect(decided.nth(1).locator("button.revert")).to_have_count(0)  # reverted already
    screenshot(page.locator("#side"), "21-decided-after-reload")

    page.goto(conversation_url)
    page.reload()
    expect(page.locator("#conn")).to_have_text("online")
    expect(page.locator("#transcript > section.turn").first).to_have_attribute(
        "data-status", "completed"
    )
    expect(page.locator("#transcript button.revert-turn").first).to_be_hidden()
    expect(page.locator("#decided .proposal")).to_have_count(2)
    assert errors == []
