"""The web UI in a real browser against every service as a real process (offline demo model).

A turn with parallel tools streams in, each tool call's badge goes running → ok with its
duration, the proposal is approved from the "Pending changes" panel and the file appears
on disk, and a dropped connection resumes without losing or repeating an event.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Conversation, Message, ToolCall, Turn
from signalbox.shared.event_stream import EventStream
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.workspace_paths import workspace_dir
from signalbox.stack import Stack
from tests import http_calls
from tests.browser.conftest import screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

UI_TIMEOUT_MS = 20_000
TURN_TEXT = "look around, then create hello.txt"


def stream_ids(client: redis.Redis, stack: Stack, conversation_id: str) -> list[str]:
    entries: Any = client.xrange(RedisKeys(stack.config.redis_prefix).events(conversation_id))
    return [eid.decode() for eid, _ in entries]


def rendered_ids(page: Page) -> list[str]:
    ids: list[str] = page.eval_on_selector_all(
        "#events li", "items => items.map(li => li.dataset.eventId)"
    )
    return ids


def wait_for_turn_finished(
    client: redis.Redis, stack: Stack, conversation_id: str, turn_id: str, timeout_s: float
) -> None:
    """Block on the stream (XREAD) until ``turn_id`` has its ``turn_finished``."""
    key = RedisKeys(stack.config.redis_prefix).events(conversation_id)
    last = "0-0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply: Any = client.xread({key: last}, block=1000)
        for _key, entries in reply or []:
            for eid, fields in entries:
                last = eid.decode()
                body = fields[b"e"].decode()
                if '"kind":"turn_finished"' in body and turn_id in body:
                    return
    raise TimeoutError(f"turn {turn_id!r} did not finish within {timeout_s} s")


def test_turn_timeline_approval_and_resume_in_a_real_browser(
    stack: Stack,
    page: Page,
    make_stack_user: Callable[[], tuple[str, str]],
    redis_client: redis.Redis,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_TIMEOUT_MS)
    user_id, token = make_stack_user()
    page.goto(f"{stack.gateway_url}/#token={token}")
    expect(page.locator("#conn")).to_have_text("online")
    assert "token" not in page.url  # taken from the fragment, then out of the address bar

    # -- a turn with parallel tools streams in ----------------------------------------------
    page.fill("#text", TURN_TEXT)
    page.click("#composer button[type=submit]")
    turn = page.locator("section.turn").first
    expect(turn.locator(".msg.user")).to_have_text(TURN_TEXT)
    expect(turn).to_have_attribute("data-status", "completed")
    # The demo model is named once, in the header, not in every bubble.
    expect(page.locator("#model-label")).to_have_text("demo model")
    expect(turn.locator(".msg.assistant").first).to_contain_text("Let me look around")
    expect(turn.locator(".msg.assistant", has_text="[offline demo model")).to_have_count(0)

    tools = turn.locator("details.tool")
    expect(tools).to_have_count(3)
    names = tools.locator("summary b").all_inner_texts()
    assert names == ["list_dir", "search_files", "write_file"]
    for i in range(3):
        tool = tools.nth(i)
        assert tool.get_attribute("data-statuses") == "running ok"
        expect(tool.locator(".duration")).to_have_text(re.compile(r"^\d+ ms$"))
    # Parallel: both look-around calls started before either finished.
    kinds: list[str] = page.eval_on_selector_all(
        "#events li", "items => items.map(li => li.dataset.kind)"
    )
    first_finish = kinds.index("tool_call_finished")
    assert kinds[:first_finish].count("tool_call_started") == 2
    # Expandable: input and output of a call.
    tools.nth(0).locator("summary").click()
    expect(tools.nth(0).locator("pre.io.input")).to_contain_text('"path": "."')
    expect(tools.nth(0).locator("pre.io.output")).to_be_visible()
    summary = turn.locator(".turn-summary")
    expect(summary).to_contain_text("3 tools: list_dir, search_files, write_file")
    expect(summary).to_contain_text(re.compile(r"\d+\.\d s · \d+ tokens"))
    screenshot(page, "01-turn-timeline")

    # -- approve from the Pending changes panel; the file is written ------------------------
    proposal = page.locator(".proposal").first
    expect(proposal).to_have_attribute("data-status", "pending")
    expect(proposal.locator("table.diff")).to_contain_text("+Written by the Signalbox")
    expect(page.locator("#pending-count")).to_have_text("1")
    screenshot(page.locator("aside"), "02-pending-changes")
    target = workspace_dir(stack.config.workspaces_root, user_id, "default") / "hello.txt"
    assert not target.exists()
    proposal.locator("button.approve").click()
    expect(proposal).to_have_attribute("data-status", "applied")
    assert target.read_text() == "Written by the Signalbox offline demo model.\n"
    expect(page.locator('#events li[data-kind="proposal_resolved"]')).to_have_count(1)
    screenshot(page, "03-approved")

    conversation_id = page.evaluate("window.signalbox.state.conversationId")
    assert rendered_ids(page) == stream_ids(redis_client, stack, conversation_id)

    # -- the connection drops; a turn runs meanwhile; the page resumes by id ---------------
    page.route("**/api/ws-tickets", lambda route: route.abort())  # no way back in for now
    page.context.set_offline(True)
    page.evaluate("window.signalbox.drop()")
    expect(page.locator("#conn")).to_have_text("reconnecting")
    seen_before = len(rendered_ids(page))
    response = http_calls.post(
        f"{stack.gateway_url}/api/conversations/{conversation_id}/turns",
        headers={"Authorization": f"Bearer {token}"},
        json={"text": "look around"},
    )
    assert response.status_code == 202
    wait_for_turn_finished(
        redis_client, stack, conversation_id, response.json()["turn_id"], timeout_s=30.0
    )
    assert len(rendered_ids(page)) == seen_before  # nothing reached the page while it was away
    screenshot(page, "04-reconnecting")

    page.unroute("**/api/ws-tickets")
    page.context.set_offline(False)
    expect(page.locator("#conn")).to_have_text("online")
    expect(page.locator('section.turn[data-status="completed"]')).to_have_count(2)
    second = page.locator("section.turn").nth(1)
    expect(second.locator("details.tool")).to_have_count(2)
    stored = stream_ids(redis_client, stack, conversation_id)
    expect(page.locator("#events li")).to_have_count(len(stored))
    assert rendered_ids(page) == stored  # every event once, in order: none lost, none repeated
    screenshot(page, "05-resumed")

    # The page's tickets (two handshakes at least) never reached the gateway's log.
    log = stack.children["gateway"].log_path.read_text(errors="replace")
    assert "ticket=[redacted]" in log
    assert not re.search(r"ticket=(?!\[redacted\])", log)
    assert token not in log


def test_the_page_asks_for_a_token_when_it_has_none(stack: Stack, page: Page) -> None:
    from playwright.sync_api import expect

    page.goto(stack.gateway_url)
    expect(page.locator("#token-form")).to_be_visible(timeout=UI_TIMEOUT_MS)


def test_every_status_badge_has_a_colour() -> None:
    """Every status the UI can show as a badge has a colour in the stylesheet."""
    from signalbox.services.gateway.routes.ui import STATIC_DIR

    css = (STATIC_DIR / "style.css").read_text()
    statuses = ["running", "ok", "error", "timeout", "denied", "cancelled", "lost"]
    statuses += ["needs_decision", "allowed", "completed", "failed", "step_limit"]
    statuses += ["online", "reconnecting", "offline", "pending", "applied", "rejected", "conflict"]
    for status in statuses:
        assert f".badge.{status}" in css, status


def test_inline_tool_decision_and_question_answer(
    stack: Stack,
    page: Page,
    make_stack_user: Callable[[], tuple[str, str]],
    redis_client: redis.Redis,
    stack_sessions: sessionmaker[Session],
) -> None:
    """A call waiting for a decision gets Allow/Deny in the timeline; a question gets answers."""
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_TIMEOUT_MS)
    user_id, token = make_stack_user()
    # A finished turn stands in for a parked one, so no orchestrator picks it up to resume.
    with stack_sessions() as session:
        conversation = Conversation(id=new_id("conv"), user_id=user_id, workspace="default")
        turn = Turn(
            id=new_id("turn"),
            conversation_id=conversation.id,
            user_id=user_id,
            seq=1,
            text="run it",
            status="completed",
        )
        session.add_all([conversation, turn])
        session.flush()
        message = Message(
            id=new_id("msg"),
            conversation_id=conversation.id,
            turn_id=turn.id,
            seq=1,
            role="assistant",
            content=[],
        )
        session.add(message)
        session.flush()
        decide = ToolCall(
            id=new_id("call"),
            turn_id=turn.id,
            message_id=message.id,
            position=0,
            tool_use_id="tu-1",
            tool="run_python",
            input={"code": "print(2 + 2)"},
            status="needs_decision",
        )
        ask = ToolCall(
            id=new_id("call"),
            turn_id=turn.id,
            message_id=message.id,
            position=1,
            tool_use_id="tu-2",
            tool="ask_user",
            input={"question": "Which colour?"},
            executor="inline",
            status="waiting",
        )
        session.add_all([decide, ask])
        session.commit()
        conversation_id, turn_id, call_id, question_id = (
            conversation.id, turn.id, decide.id, ask.id
        )  # fmt: skip
    events = EventStream(redis_client, RedisKeys(stack.config.redis_prefix))
    events.append(conversation_id, "conversation_created", {"workspace": "default", "title": "t"})
    events.append(conversation_id, "turn_queued", {"text": "run it"}, turn_id)
    events.append(conversation_id, "turn_started", {"model": "demo"}, turn_id)
    events.append(
        conversation_id,
        "tool_call_needs_decision",
        {
            "call_id": call_id,
            "tool": "run_python",
            "input": {"code": "print(2 + 2)"},
            "expires_at": "2999-01-01T00:00:00Z",
        },
        turn_id,
    )
    events.append(
        conversation_id,
        "question",
        {"question_id": question_id, "text": "Which colour?", "options": ["red", "blue"]},
        turn_id,
    )

    page.goto(f"{stack.gateway_url}/#token={token}")
    item = page.locator(f'#conversations li[data-conversation-id="{conversation_id}"]')
    # The list says what waits on the user: a decision and a question.
    expect(item.locator(".wait")).to_have_text("2 waiting")
    item.click()
    tool = page.locator(f'details.tool[data-call-id="{call_id}"]')
    expect(tool).to_have_attribute("data-status", "needs_decision")
    question = page.locator(f"#question-{question_id}")
    expect(question).to_contain_text("Which colour?")
    screenshot(page, "06-decision-and-question")

    tool.locator("button.decide.allow").click()
    expect(tool).to_have_attribute("data-status", "allowed")
    expect(tool.locator("button.decide")).to_have_count(0)
    # How long it waited for the decision is shown apart from how long it runs.
    expect(tool.locator(".waited")).to_have_text(re.compile(r"^waited \d+\.\d s$"))
    question.locator("button.option", has_text="blue").click()
    expect(question).to_have_class(re.compile(r"answered"))
    with stack_sessions() as session:
        decided = session.get(ToolCall, call_id)
        answered = session.get(ToolCall, question_id)
        assert decided is not None and answered is not None
        assert decided.decision == "allow"
        assert (answered.status, answered.output) == ("ok", "blue")
