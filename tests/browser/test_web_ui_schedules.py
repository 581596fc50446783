"""The Schedules tab of the web UI: create a schedule from the form and see it listed, a bad
cron refused with a note, pause then resume, delete (armed by a first click), an ``at`` time
sent with the browser's offset, an alarm cancelled, and a tick's run shown with its link."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Alarm
from signalbox.shared.ids import new_id
from signalbox.stack import Stack
from tests import http_calls
from tests.browser.conftest import console_errors, new_user, screenshot
from tests.fake_anthropic import FakeAnthropic

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

UI_TIMEOUT_MS = 20_000


def _get(stack: Stack, token: str, path: str) -> Any:
    res = http_calls.get(f"{stack.gateway_url}{path}", headers={"Authorization": f"Bearer {token}"})
    assert res.status_code == 200, res.text
    return res.json()


def _open_schedules(page: Page, stack: Stack, token: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")
    page.click("#toggle-schedules")
    expect(page.locator("#panel-schedules")).to_be_visible()
    expect(page.locator("#tab-schedules")).to_have_attribute("aria-selected", "true")


def _row(page: Page, name: str) -> Locator:
    return page.locator("#schedules li.schedule").filter(has_text=name)


def _unexpected(errors: list[str]) -> list[str]:
    # Chromium logs every refused request itself ("Failed to load resource: ... 422"); the
    # page's own code must log nothing.
    return [e for e in errors if "Failed to load resource" not in e]


def test_create_list_refuse_pause_resume_and_delete(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    from playwright.sync_api import expect

    stack, _fake, sessions = fake_stack
    expect.set_options(timeout=UI_TIMEOUT_MS)
    errors = console_errors(page)
    _, token = new_user(sessions)
    _open_schedules(page, stack, token)
    expect(page.locator("#schedules-empty")).to_be_visible()

    page.select_option("#sched-kind", "interval")
    page.fill("#sched-interval", "3600")
    page.fill("#sched-prompt", "Check the build and tell me if it is red")
    page.fill("#sched-name", "build check")
    page.click("#sched-create")

    row = _row(page, "build check")
    expect(row).to_have_count(1)
    expect(row.locator(".sched-clock")).to_have_text("every 1 h")
    expect(row.locator(".sched-state")).to_have_text("active")
    expect(row.locator(".sched-prompt")).to_have_text("Check the build and tell me if it is red")
    expect(row.locator(".sched-meta")).to_contain_text("not ticked yet")
    expect(row.locator(".sched-meta")).to_contain_text("a new conversation each run")
    expect(page.locator("#schedules-empty")).to_be_hidden()
    expect(page.locator("#sched-prompt")).to_have_value("")  # the form is ready for another
    [made] = _get(stack, token, "/api/schedules")
    assert made["kind"] == "interval" and made["interval_s"] == 3600
    assert made["name"] == "build check" and made["conversation_id"] is None
    assert made["paused"] is False

    # A bad cron: the gateway's 422 is a note in the panel, and nothing is added.
    page.select_option("#sched-kind", "cron")
    expect(page.locator("#sched-cron")).to_be_visible()
    expect(page.locator("#sched-interval")).to_be_hidden()
    page.fill("#sched-cron", "every monday")
    page.fill("#sched-timezone", "UTC")
    page.fill("#sched-prompt", "never stored")
    page.click("#sched-create")
    note = page.locator("#sched-note")
    expect(note).to_be_visible()
    expect(note).to_contain_text("could not create the schedule")
    expect(note).to_contain_text("expected a five-field cron expression")
    expect(page.locator("#schedules li.schedule")).to_have_count(1)
    screenshot(page.locator("#side"), "schedules-bad-cron")

    # A bad time zone is refused the same way.
    page.fill("#sched-cron", "0 9 * * 1-5")
    page.fill("#sched-timezone", "Mars/Olympus")
    page.click("#sched-create")
    expect(note).to_contain_text("Mars/Olympus")
    expect(page.locator("#schedules li.schedule")).to_have_count(1)

    # Pause, then resume: the button and the badge follow, and so does the server.
    row.locator(".sched-pause").click()
    expect(row.locator(".sched-state")).to_have_text("paused")
    expect(row.locator(".sched-pause")).to_have_text("Resume")
    expect(note).to_be_hidden()  # a success clears the last error
    assert _get(stack, token, "/api/schedules")[0]["paused"] is True
    row.locator(".sched-pause").click()
    expect(row.locator(".sched-state")).to_have_text("active")
    expect(row.locator(".sched-pause")).to_have_text("Pause")
    assert _get(stack, token, "/api/schedules")[0]["paused"] is False

    # Its runs: none yet.
    row.locator(".sched-runs").click()
    expect(row.locator(".sched-runs")).to_have_attribute("aria-expanded", "true")
    expect(row.locator(".sched-run-list")).to_contain_text("no runs yet")
    screenshot(page.locator("#side"), "schedules")

    # Delete takes two clicks: the first only arms the button.
    delete = row.locator(".sched-delete")
    delete.click()
    expect(delete).to_have_text("Delete? Click again")
    expect(page.locator("#schedules li.schedule")).to_have_count(1)
    assert len(_get(stack, token, "/api/schedules")) == 1
    delete.click()
    expect(page.locator("#schedules li.schedule")).to_have_count(0)
    expect(page.locator("#schedules-empty")).to_be_visible()
    assert _get(stack, token, "/api/schedules") == []
    assert _unexpected(errors) == []


def test_an_at_time_is_sent_with_the_browsers_offset(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], browser: Browser
) -> None:
    from playwright.sync_api import expect

    stack, _fake, sessions = fake_stack
    expect.set_options(timeout=UI_TIMEOUT_MS)
    _, token = new_user(sessions)
    context = browser.new_context(
        viewport={"width": 1360, "height": 860}, timezone_id="Asia/Kolkata"
    )
    try:
        page = context.new_page()
        errors = console_errors(page)
        _open_schedules(page, stack, token)
        page.select_option("#sched-kind", "at")
        page.fill("#sched-at", "2031-01-31T09:00")
        page.fill("#sched-prompt", "Wish the team a good release")
        page.click("#sched-create")
        row = page.locator("#schedules li.schedule")
        expect(row).to_have_count(1)
        expect(row.locator(".sched-clock")).to_contain_text("once at")
        [made] = _get(stack, token, "/api/schedules")
        assert made["kind"] == "at"
        # 09:00 in Kolkata (+05:30) is 03:30 UTC.
        at = datetime.fromisoformat(made["at"].replace("Z", "+00:00"))
        assert at == datetime(2031, 1, 31, 3, 30, tzinfo=UTC)
        assert errors == []
    finally:
        context.close()


def test_a_pending_alarm_is_listed_and_cancelled(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    from playwright.sync_api import expect

    stack, _fake, sessions = fake_stack
    expect.set_options(timeout=UI_TIMEOUT_MS)
    errors = console_errors(page)
    user_id, token = new_user(sessions)
    made = http_calls.post(
        f"{stack.gateway_url}/api/conversations",
        headers={"Authorization": f"Bearer {token}"},
        json={"title": "deploy watch"},
    )
    assert made.status_code == 201, made.text
    conversation_id = made.json()["conversation_id"]
    alarm_id = new_id("alarm")
    with sessions() as session:  # as the alarm tool stores it; far off, so it never fires
        session.add(
            Alarm(
                id=alarm_id,
                user_id=user_id,
                conversation_id=conversation_id,
                wake_at=datetime(2099, 1, 1, tzinfo=UTC),
                note="check whether the deploy finished",
                status="pending",
            )
        )
        session.commit()

    _open_schedules(page, stack, token)
    expect(page.locator("#alarms-head")).to_be_visible()
    alarm = page.locator("#alarms li.alarm")
    expect(alarm).to_have_count(1)
    expect(alarm).to_contain_text("check whether the deploy finished")
    expect(alarm.locator("a")).to_have_attribute("href", f"#/c/{conversation_id}")
    alarm.locator(".alarm-cancel").click()
    expect(alarm).to_have_count(0)
    expect(page.locator("#alarms-head")).to_be_hidden()
    [row] = _get(stack, token, "/api/alarms")
    assert row["status"] == "cancelled"
    assert errors == []


def test_a_tick_shows_as_a_run_with_its_conversation(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], page: Page
) -> None:
    """The stack runs the scheduler: a two-second schedule ticks while the panel is open."""
    from playwright.sync_api import expect

    stack, _fake, sessions = fake_stack
    expect.set_options(timeout=UI_TIMEOUT_MS)
    _, token = new_user(sessions)
    _open_schedules(page, stack, token)
    page.select_option("#sched-kind", "interval")
    page.fill("#sched-interval", "2")
    page.fill("#sched-prompt", "tick")
    page.fill("#sched-name", "fast")
    page.click("#sched-create")
    row = _row(page, "fast")
    expect(row).to_have_count(1)
    row.locator(".sched-runs").click()

    # The open run list is polled while the tab is shown.
    run = row.locator(".sched-run[data-status=started]").first
    expect(run).to_be_visible()
    link = run.locator('a[href^="#/c/"]')
    expect(link).to_have_count(1)
    expect(row.locator(".sched-meta")).to_contain_text("last tick")
    row.locator(".sched-pause").click()
    expect(row.locator(".sched-state")).to_have_text("paused")

    link.click()  # the run's conversation opens in the page
    expect(page).to_have_url(re.compile(r"#/c/[\w-]+$"))
    expect(page.locator(".msg.user").first).to_have_text("tick")
    [made] = _get(stack, token, "/api/schedules")
    runs = _get(stack, token, f"/api/schedules/{made['id']}/runs")
    assert any(r["status"] == "started" and r["conversation_id"] for r in runs)
