"""A browser's native ``EventSource`` on the SSE stream: a single-use ticket, a drop mid-turn,
and the browser's own reconnect with ``Last-Event-ID`` losing and repeating nothing.

Chromium reaches the real gateway (every service a real process, the model the scripted
fake) through a TCP forwarder the test cuts: a dead connection, as a network drop is.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.redis_keys import RedisKeys
from signalbox.stack import Stack
from tests import http_calls
from tests.browser.conftest import new_user
from tests.fake_anthropic import FakeAnthropic, Stall, text
from tests.proposals.tcp_proxy import Proxy

if TYPE_CHECKING:
    from playwright.sync_api import Page, Request

TIMEOUT_MS = 20_000

OPEN_STREAM = """async ([conversationId, token]) => {
  const reply = await fetch('/api/ws-tickets', {
    method: 'POST', headers: {Authorization: 'Bearer ' + token}});
  const {ticket} = await reply.json();
  window.got = []; window.opens = 0; window.errors = 0;
  const es = new EventSource(
    `/api/conversations/${conversationId}/stream?ticket=${encodeURIComponent(ticket)}`);
  es.onopen = () => { window.opens += 1; };
  es.onerror = () => { window.errors += 1; };
  es.onmessage = (e) => { window.got.push({id: e.lastEventId, event: JSON.parse(e.data)}); };
  window.es = es;
  return ticket;
}"""


def _stream_ids(client: redis.Redis, stack: Stack, conversation_id: str) -> list[str]:
    entries: Any = client.xrange(RedisKeys(stack.config.redis_prefix).events(conversation_id))
    return [eid.decode() for eid, _ in entries]


def _wait_for_kind(
    client: redis.Redis, stack: Stack, conversation_id: str, kind: str, timeout_s: float
) -> None:
    """Block on the stream (XREAD) until an event of ``kind`` is stored."""
    key = RedisKeys(stack.config.redis_prefix).events(conversation_id)
    last = "0-0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply: Any = client.xread({key: last}, block=500)
        for _key, entries in reply or []:
            for eid, fields in entries:
                last = eid.decode()
                if f'"kind":"{kind}"' in fields[b"e"].decode():
                    return
    raise TimeoutError(f"no {kind} in {conversation_id!r} within {timeout_s} s")


def test_native_event_source_resumes_after_a_drop_mid_turn_with_nothing_lost_or_repeated(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]],
    page: Page,
    redis_client: redis.Redis,
) -> None:
    stack, fake, sessions = fake_stack
    stall = Stall(timeout_s=60)
    fake.script_for(
        "sse-drop-check",
        [[text("before the drop, ", chunks=2), stall, text("and after it.", chunks=3)]],
    )
    _user_id, token = new_user(sessions)
    headers = {"Authorization": f"Bearer {token}"}
    created = http_calls.post(f"{stack.gateway_url}/api/conversations", headers=headers, json={})
    assert created.status_code == 201, created.text
    conversation_id = created.json()["conversation_id"]

    proxy = Proxy(("127.0.0.1", stack.gateway_port))
    proxy.start()
    stream_requests: list[Request] = []
    page.on("request", lambda r: stream_requests.append(r) if "/stream" in r.url else None)
    try:
        page.goto(f"http://127.0.0.1:{proxy.port}/healthz")
        ticket = page.evaluate(OPEN_STREAM, [conversation_id, token])
        page.wait_for_function("window.opens === 1", timeout=TIMEOUT_MS)

        turn = http_calls.post(
            f"{stack.gateway_url}/api/conversations/{conversation_id}/turns",
            headers=headers,
            json={"text": "sse-drop-check please"},
        )
        assert turn.status_code == 202, turn.text
        assert stall.reached.wait(TIMEOUT_MS / 1000)
        page.wait_for_function(
            "window.got.some(e => e.event.kind === 'turn_started')", timeout=TIMEOUT_MS
        )
        before_drop = page.evaluate("window.got.map(e => e.id)")

        # -- the connection dies mid-turn; the turn goes on and ends meanwhile ------------
        proxy.stop()
        page.wait_for_function("window.errors >= 1", timeout=TIMEOUT_MS)
        stall.release.set()
        _wait_for_kind(redis_client, stack, conversation_id, "turn_finished", 30)
        proxy.start()

        # -- the same EventSource reconnects by itself and gets exactly what it missed -------
        page.wait_for_function(
            "window.got.some(e => e.event.kind === 'turn_finished')", timeout=TIMEOUT_MS
        )
        got: list[dict[str, Any]] = page.evaluate("window.got")
        assert page.evaluate("window.es.readyState") == 1  # OPEN: never gave up
        assert page.evaluate("window.opens") >= 2
    finally:
        proxy.stop()

    ids = [e["id"] for e in got]
    assert ids == _stream_ids(redis_client, stack, conversation_id)  # none lost, none twice
    assert [e["event"]["id"] for e in got] == ids
    assert len(ids) >= len(before_drop) + 3  # text, assistant_message, turn_finished
    kinds = [e["event"]["kind"] for e in got]
    assert kinds[-1] == "turn_finished" and kinds.count("turn_finished") == 1
    assert "".join(e["event"]["data"]["text"] for e in got if e["event"]["kind"] == "text_delta")

    # The reconnect was the browser's own: same URL (same, consumed ticket) + Last-Event-ID.
    assert len(stream_requests) >= 2
    assert len({r.url for r in stream_requests}) == 1
    resumed = [r.all_headers().get("last-event-id") for r in stream_requests[1:]]
    assert resumed and set(resumed) == {before_drop[-1]}

    # The ticket is single-use everywhere else, and never reaches the gateway's log.
    again = http_calls.get(
        f"{stack.gateway_url}/api/conversations/{conversation_id}/stream",
        params={"ticket": ticket},
    )
    assert again.status_code == 401
    log = stack.children["gateway"].log_path.read_text(errors="replace")
    assert ticket not in log
    assert not re.search(r"ticket=(?!\[redacted\])", log)
