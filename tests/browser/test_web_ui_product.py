"""The web UI as a product, in a real Chromium against real stacks (issue 13).

Layout and keyboard over ten turns, a URL per conversation (reload, back, forward), a
phone-width viewport, identity, the Changes inbox with per-file approval, Markdown with a
model's XSS payload left inert, the live turn with a sub-agent, Cancel aimed at the root
turn, and /docs and /redoc with no network beyond the gateway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Turn
from signalbox.shared.workspace_paths import workspace_dir
from signalbox.stack import Stack
from tests import http_calls
from tests.browser.conftest import console_errors, new_user, screenshot
from tests.fake_anthropic import FakeAnthropic, stall, text, tool_use

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, ViewportSize

UI_TIMEOUT_MS = 30_000
PHONE_W, PHONE_H = 360, 740


def _expect_timeout() -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_TIMEOUT_MS)


def _open(page: Page, stack: Stack, token: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")


def _conversation_in_url(page: Page) -> str:
    match = re.search(r"#/c/(conv_\w+)$", page.url)
    assert match, page.url
    return match.group(1)


def _stays_in_viewport(page: Page, width: int, height: int) -> None:
    header = page.locator("#topbar").bounding_box()
    composer = page.locator("#composer").bounding_box()
    assert header is not None and composer is not None
    assert header["y"] >= 0
    assert composer["y"] + composer["height"] <= height + 0.5
    sizes = page.evaluate(
        "({h: document.documentElement.scrollHeight, w: document.documentElement.scrollWidth})"
    )
    assert sizes["h"] <= height, "the page itself scrolls"
    assert sizes["w"] <= width, "the page scrolls sideways"


def test_ten_turns_keyboard_urls_and_a_phone(
    stack: Stack, page: Page, browser: Browser, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    from playwright.sync_api import expect

    _expect_timeout()
    errors = console_errors(page)
    _user_id, token = make_stack_user()
    _open(page, stack, token)
    expect(page.locator("#who")).to_have_text(re.compile(r"^user-"))
    # Every control has a name a screen reader (and this test) can find it by.
    expect(page.get_by_label("Message to the agent")).to_be_visible()
    expect(page.get_by_label("Workspace", exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="Send")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel turn")).to_be_disabled()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    expect(page.get_by_role("tab", name="Files")).to_be_visible()
    # The new-workspace field checks names as the server does (its pattern compiles).
    page.fill("#workspace-name", "no spaces allowed")
    assert not page.eval_on_selector("#workspace-name", "e => e.checkValidity()")
    page.fill("#workspace-name", "")

    # Shift+Enter is a new line; Enter sends.
    page.click("#text")
    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    assert page.input_value("#text") == "first line\nsecond line"
    page.fill("#text", "")

    turns = page.locator("#transcript > section.turn")
    for i in range(10):
        page.fill("#text", f"hello number {i}")
        page.press("#text", "Enter")
        expect(turns.nth(i)).to_have_attribute("data-status", "completed")
        expect(page.locator("#cancel")).to_be_disabled()
    first = _conversation_in_url(page)
    _stays_in_viewport(page, 1360, 860)
    # The transcript followed the output: the last turn's summary is on screen.
    expect(turns.nth(9).locator(".turn-summary")).to_be_in_viewport()
    expect(turns.nth(0).locator(".turn-summary")).not_to_be_in_viewport()
    item = page.locator(f'#conversations li[data-conversation-id="{first}"]')
    expect(item.locator(".conv-title")).to_have_text("hello number 0")
    expect(item.locator(".conv-meta")).to_contain_text(
        re.compile(r"default · (just now|\d+ min ago)")
    )
    screenshot(page, "10-ten-turns")

    # A second conversation, then back, forward and reload land where they should.
    page.click("#new-conv")
    expect(turns).to_have_count(0)
    page.fill("#text", "another subject")
    page.press("#text", "Enter")
    expect(turns.first).to_have_attribute("data-status", "completed")
    expect(page).not_to_have_url(re.compile(first))
    second = _conversation_in_url(page)
    page.go_back()  # the empty "new conversation" page
    expect(turns).to_have_count(0)
    page.go_back()
    expect(page).to_have_url(re.compile(f"#/c/{first}$"))
    expect(turns).to_have_count(10)
    page.go_forward()
    page.go_forward()
    expect(page).to_have_url(re.compile(f"#/c/{second}$"))
    expect(turns).to_have_count(1)
    page.reload()
    expect(page.locator("#conn")).to_have_text("online")
    expect(turns).to_have_count(1)
    expect(turns.first.locator(".msg.user")).to_have_text("another subject")
    expect(page.locator(f'#conversations li[data-conversation-id="{second}"]')).to_have_class(
        re.compile("active")
    )
    assert errors == []

    # 360 px wide: nothing scrolls sideways, the panels are drawers.
    viewport: ViewportSize = {"width": PHONE_W, "height": PHONE_H}
    phone = browser.new_context(viewport=viewport, reduced_motion="reduce")
    try:
        small = phone.new_page()
        _open(small, stack, token)
        small.goto(f"{stack.gateway_url}/#/c/{first}")
        expect(small.locator("#transcript > section.turn")).to_have_count(10)
        expect(small.locator("#conversations")).not_to_be_visible()
        _stays_in_viewport(small, PHONE_W, PHONE_H)
        screenshot(small, "11-phone")
        small.click("#toggle-nav")
        expect(small.locator(f'#conversations li[data-conversation-id="{second}"]')).to_be_visible()
        screenshot(small, "12-phone-conversations")
        small.keyboard.press("Escape")
        expect(small.locator("#conversations")).not_to_be_visible()
        small.click("#toggle-side")
        expect(small.locator("#side")).to_be_visible()
        _stays_in_viewport(small, PHONE_W, PHONE_H)
    finally:
        phone.close()


def test_a_rejected_token_is_not_offline_and_log_out_forgets_it(
    stack: Stack, page: Page, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    from playwright.sync_api import expect

    _expect_timeout()
    page.goto(f"{stack.gateway_url}/#token=sbt_not-a-real-token")
    expect(page.locator("#conn")).to_have_text("token rejected")
    expect(page.locator("#token-form")).to_be_visible()
    expect(page.locator("#auth-message")).to_contain_text("rejected")

    _user_id, token = make_stack_user()
    _open(page, stack, token)
    expect(page.locator("#auth")).to_be_hidden()
    page.click("#logout")
    expect(page.locator("#token-form")).to_be_visible()
    assert page.evaluate("localStorage.getItem('signalbox-token')") is None


def test_per_file_approval_from_the_changes_inbox(
    stack: Stack,
    page: Page,
    make_stack_user: Callable[[], tuple[str, str]],
    internal_token: str,
) -> None:
    """A two-file proposal from another conversation: approving one file writes only it."""
    from playwright.sync_api import expect

    _expect_timeout()
    user_id, token = make_stack_user()
    auth = {"Authorization": f"Bearer {token}"}
    conversation = http_calls.post(
        f"{stack.gateway_url}/api/conversations", headers=auth, json={"title": "two files"}
    ).json()
    created = http_calls.post(
        f"{stack.proposals_url}/internal/proposals",
        headers={"X-Signalbox-Internal-Token": internal_token},
        json={
            "user_id": user_id,
            "conversation_id": conversation["conversation_id"],
            "workspace": "default",
            "summary": "create a.txt and b.txt",
            "files": [
                {"path": "a.txt", "operation": "create", "after": "alpha\n"},
                {"path": "b.txt", "operation": "create", "after": "beta\n"},
            ],
        },
    )
    assert created.status_code == 201, created.text
    proposal_id = created.json()["proposal_id"]
    root = workspace_dir(stack.config.workspaces_root, user_id, "default")

    _open(page, stack, token)  # a new conversation is open: the inbox still shows it
    expect(page.locator("#pending-count")).to_have_text("1")
    box = page.locator(f"#proposal-{proposal_id}")
    expect(box.locator("details.file")).to_have_count(2)
    expect(
        box.locator('details.file[data-path="a.txt"] table.diff tr.add td.ln').nth(1)
    ).to_have_text("1")
    expect(box.locator("a")).to_have_text("two files")
    screenshot(page.locator("#side"), "13-changes-inbox")

    page.check("#split-diffs")  # side by side: old | new
    expect(box.locator("table.diff.split")).to_have_count(2)
    expect(box.locator("table.diff.split td.code.add").first).to_have_text("+alpha")
    page.uncheck("#split-diffs")
    expect(box.locator("table.diff.split")).to_have_count(0)
    box.locator('details.file[data-path="a.txt"] button.approve-file').click()
    expect(box.locator("details.file")).to_have_count(1)
    expect(box.locator("details.file")).to_have_attribute("data-path", "b.txt")
    expect(box).to_have_attribute("data-status", "pending")
    applied = page.locator('#decided .proposal[data-status="applied"]')
    expect(applied).to_have_count(1)
    expect(applied.locator("details.file")).to_have_attribute("data-path", "a.txt")
    assert (root / "a.txt").read_text() == "alpha\n"
    assert not (root / "b.txt").exists()

    # b.txt appears on disk meanwhile: approving it is a conflict that shows what is there.
    (root / "b.txt").write_text("written by hand\n")
    box.locator("button.approve").click()
    expect(page.locator("#pending-count")).to_have_text("0")
    conflict = page.locator('#decided .proposal[data-status="conflict"]')
    expect(conflict.locator("div.conflict")).to_contain_text("b.txt")
    expect(conflict.locator(".conflict table.diff")).to_contain_text("written by hand")
    screenshot(page.locator("#side"), "18-conflict")
    assert (root / "b.txt").read_text() == "written by hand\n"
    # The link goes to the proposal's conversation.
    applied.locator("a").click()
    expect(page).to_have_url(re.compile(f"#/c/{conversation['conversation_id']}$"))


XSS_ANSWER = """# Report xss-check

| file | lines |
|---|---|
| main.py | 12 |

- first point
- second point

```python
def answer():
    return 42
```

<script>window.__xss = 1</script>
<img src=x onerror="window.__xss = 2">
[click me](javascript:window.__xss=3)
"""


def test_markdown_renders_and_model_xss_stays_text(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    from playwright.sync_api import expect

    _expect_timeout()
    stack, fake, sessions = fake_stack
    fake.script_for(
        "xss-check",
        [
            [text("Reading it."), tool_use("read_file", {"path": "missing.txt"})],
            [text(XSS_ANSWER, chunks=5)],
        ],
    )
    errors = console_errors(page)
    _user_id, token = new_user(sessions)
    response = page.goto(f"{stack.gateway_url}/#token={token}")
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    expect(page.locator("#conn")).to_have_text("online")
    page.fill("#text", "please do the xss-check")
    page.press("#text", "Enter")
    turn = page.locator("section.turn").first
    expect(turn).to_have_attribute("data-status", "completed")

    # A failed call opens its details by itself.
    failed = turn.locator('details.tool[data-tool="read_file"]')
    expect(failed).to_have_attribute("data-status", "error")
    expect(failed).to_have_attribute("open", "")
    expect(failed.locator("pre.io.error")).to_be_visible()

    answer = turn.locator(".msg.assistant .md").last
    expect(answer.locator("h1")).to_have_text("Report xss-check")
    expect(answer.locator("table td").first).to_have_text("main.py")
    expect(answer.locator("ul > li")).to_have_count(2)
    expect(answer.locator("pre code .hljs-keyword").first).to_have_text("def")
    expect(answer.locator("pre button.copy")).to_have_count(1)
    # The payloads are text: no element, no handler, no javascript: link.
    expect(answer).to_contain_text("<script>window.__xss = 1</script>")
    expect(answer).to_contain_text('<img src=x onerror="window.__xss = 2">')
    assert answer.locator("script, img, [onerror]").count() == 0
    assert page.locator('a[href^="javascript"]').count() == 0
    answer.get_by_text("click me").click()
    assert page.evaluate("window.__xss") is None
    # Copy the answer: its Markdown source reaches the clipboard.
    turn.locator(".msg.assistant").last.locator("button.copy").last.click()
    assert "Report xss-check" in page.evaluate("navigator.clipboard.readText()")
    screenshot(page, "14-markdown")
    assert errors == []


def test_cancel_during_a_sub_agent_cancels_the_root_turn(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    from playwright.sync_api import expect

    _expect_timeout()
    stack, fake, sessions = fake_stack
    fake.script_for(
        "delegate-it", [[text("Delegating."), tool_use("spawn_agent", {"task": "child-task"})]]
    )
    # The child streams slowly for half a minute (short stalls pace the deltas), as a model
    # thinking aloud does; a cancel is noticed between deltas.
    slow: list[Any] = [text("Child is thinking", chunks=1)]
    for _ in range(100):
        slow += [stall(timeout_s=0.3), text(".", chunks=1)]
    fake.script_for("child-task", [slow])
    _user_id, token = new_user(sessions)
    _open(page, stack, token)
    page.fill("#text", "please delegate-it")
    page.press("#text", "Enter")
    turn = page.locator("#transcript > section.turn").first
    spawn = turn.locator('details.tool[data-tool="spawn_agent"]')
    child = spawn.locator("section.turn.sub-agent")
    expect(child.locator(".msg.assistant")).to_contain_text("Child is thinking")
    # The parent's call shows its running time while it runs.
    expect(spawn.locator("summary .duration")).to_have_text(re.compile(r"^\d+\.\d s…$"))
    expect(page.locator("#cancel")).to_be_enabled()
    screenshot(page, "15-sub-agent-running")
    root_id = turn.get_attribute("data-turn-id")
    child_id = child.get_attribute("data-turn-id")
    assert root_id and child_id and root_id != child_id

    page.keyboard.press("Escape")  # Esc cancels, like the button
    expect(turn).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#cancel")).to_be_disabled()
    with sessions() as session:
        root = session.get(Turn, root_id)
        assert root is not None and root.cancel_requested and root.status == "cancelled"


def test_docs_and_redoc_render_with_no_network_but_the_gateway(stack: Stack, page: Page) -> None:
    from playwright.sync_api import Route, expect

    _expect_timeout()
    outside: list[str] = []

    def only_the_gateway(route: Route) -> None:
        if route.request.url.startswith(stack.gateway_url) or route.request.url.startswith(
            ("data:", "blob:")
        ):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_gateway)
    page.goto(f"{stack.gateway_url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Signalbox gateway")
    expect(page.locator(".opblock-summary-path", has_text="/api/me").first).to_be_visible()
    screenshot(page, "16-docs-offline")
    page.goto(f"{stack.gateway_url}/redoc")
    expect(page.locator("h1", has_text="Signalbox gateway")).to_be_visible()
    expect(page.get_by_text("/api/activity").first).to_be_attached()
    # ReDoc's "powered by" logo is the one thing it fetches from outside; offline it is
    # simply not shown (the page hides a logo that fails to load).
    assert set(outside) <= {"https://cdn.redoc.ly/redoc/logo-mini.svg"}


def test_the_file_browser_shows_a_file_once_its_proposal_is_approved(
    stack: Stack, page: Page, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    from playwright.sync_api import expect

    _expect_timeout()
    errors = console_errors(page)
    _user_id, token = make_stack_user()
    _open(page, stack, token)
    page.fill("#text", "create notes.txt with Hello from the agent")
    page.press("#text", "Enter")
    expect(page.locator("section.turn").first).to_have_attribute("data-status", "completed")
    page.click("#toggle-files")
    expect(page.locator("#files-workspace")).to_have_text("default")
    expect(page.locator("#files")).to_contain_text("empty")
    expect(page.locator('#files li[data-path="notes.txt"]')).to_have_count(0)

    page.click("#tab-changes")
    page.locator('.proposal[data-status="pending"] button.approve').click()
    expect(page.locator('#decided .proposal[data-status="applied"]')).to_have_count(1)
    page.click("#toggle-files")
    entry = page.locator('#files li[data-path="notes.txt"]')
    expect(entry).to_contain_text("notes.txt")
    entry.locator("button").click()
    expect(page.locator("#file-view")).to_contain_text("Hello from the agent")
    screenshot(page, "17-file-browser")
    page.locator("#files-path button.crumb").click()
    expect(entry).to_be_visible()
    assert errors == []


def test_rename_archive_and_retry(
    stack: Stack, page: Page, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    from playwright.sync_api import expect

    _expect_timeout()
    _user_id, token = make_stack_user()
    _open(page, stack, token)
    page.fill("#text", "hello there")
    page.press("#text", "Enter")
    turns = page.locator("#transcript > section.turn")
    expect(turns.first).to_have_attribute("data-status", "completed")
    conversation_id = _conversation_in_url(page)
    item = page.locator(f'#conversations li[data-conversation-id="{conversation_id}"]')

    # Retry re-runs the same text as a new turn.
    turns.first.locator("button.retry").click()
    expect(turns).to_have_count(2)
    expect(turns.nth(1).locator(".msg.user")).to_have_text("hello there")
    expect(turns.nth(1)).to_have_attribute("data-status", "completed")

    page.click("#rename")
    page.fill("#rename-input", "Greetings")
    page.press("#rename-input", "Enter")
    expect(page.locator("#conv-title")).to_have_text("Greetings")
    expect(item.locator(".conv-title")).to_have_text("Greetings")

    page.click("#archive")
    expect(page.locator("#archive")).to_have_text("Archive? Click again")
    page.click("#archive")
    expect(item).to_have_count(0)
    expect(turns).to_have_count(0)
    # Still readable by its URL, but it takes no new turns.
    page.go_back()
    expect(turns).to_have_count(2)
    page.fill("#text", "one more")
    page.press("#text", "Enter")
    expect(page.locator("#transcript .msg.note").last).to_contain_text("archived")
    expect(turns).to_have_count(2)
