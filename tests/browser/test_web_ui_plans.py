"""The web UI shows a ``run_plan`` plan as a live checklist, in a real Chromium against the
real stack (demo model, whose answer to "plan" is a 3-step plan: two independent steps,
then one that uses both outputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from signalbox.stack import Stack
from tests.browser.conftest import console_errors, screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

UI_TIMEOUT_MS = 30_000

# Every change of a step row's status, as the page made it (so the test sees the live
# moves, not only the end state).
RECORD_MOVES = """() => {
  window.__planMoves = [];
  new MutationObserver((records) => {
    for (const r of records) {
      const li = r.target;
      if (li.classList && li.classList.contains("plan-step"))
        window.__planMoves.push([li.dataset.saveAs, li.dataset.status]);
    }
  }).observe(document.querySelector("#transcript"),
             { subtree: true, attributes: true, attributeFilter: ["data-status"] });
}"""


def test_a_plan_is_a_live_checklist_that_ticks_each_step_as_it_ends(
    stack: Stack, page: Page, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_TIMEOUT_MS)
    errors = console_errors(page)
    _user_id, token = make_stack_user()
    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")
    page.evaluate(RECORD_MOVES)

    page.fill("#text", "make a plan for this workspace")
    page.press("#text", "Enter")

    turn = page.locator("#transcript > section.turn").first
    plan = turn.locator(".msg.plan")
    expect(plan.locator(".plan-head")).to_have_text("Plan finished: 3 ok")
    expect(turn).to_have_attribute("data-status", "completed")
    rows = plan.locator("li.plan-step")
    expect(rows).to_have_count(3)
    for name in ("ls", "todos", "notes"):
        row = plan.locator(f'li.plan-step[data-save-as="{name}"]')
        expect(row).to_have_attribute("data-status", "ok")
        expect(row.locator(".plan-mark")).to_have_text("✓")
    expect(plan.locator('li[data-save-as="notes"]')).to_contain_text("(after ls, todos)")
    screenshot(page, "22-plan-checklist")

    moves: list[list[str]] = page.evaluate("window.__planMoves")
    for name in ("ls", "todos", "notes"):
        mine = [status for step, status in moves if step == name]
        assert mine == ["running", "ok"], f"{name} moved {mine}"
    # The dependent started only once both of its inputs were there.
    assert moves.index(["notes", "running"]) > max(
        moves.index(["ls", "ok"]), moves.index(["todos", "ok"])
    )
    assert errors == []
