"""The SSE stream's credentials: a bearer header, or a single-use ticket whose only second
use is its own EventSource reconnecting (``Last-Event-ID``) to the same conversation."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import redis

from signalbox.shared.event_stream import EventStream
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer

Users = Callable[[], tuple[str, str]]


def _ticket(gateway: LiveGateway, token: str) -> str:
    reply = http_calls.post(f"{gateway.url}/api/ws-tickets", headers=bearer(token))
    assert reply.status_code == 200, reply.text
    ticket: str = reply.json()["ticket"]
    return ticket


@contextmanager
def _stream(
    gateway: LiveGateway, conversation_id: str, headers: dict[str, str], **params: str
) -> Iterator[httpx.Response]:
    url = f"{gateway.url}/api/conversations/{conversation_id}/stream"
    with http_calls.stream("GET", url, headers=headers, params=params) as r:
        yield r


def _first_event_id(response: httpx.Response) -> str:
    for line in response.iter_lines():
        if line.startswith("data: "):
            event_id: str = json.loads(line[6:])["id"]
            return event_id
    raise AssertionError("the stream ended before an event")


def test_a_ticket_opens_the_stream_once_and_then_only_its_own_reconnects(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    other_conversation = conversation_of(user_id)
    stream = EventStream(redis_client, gateway.keys)
    ids = [stream.append(conversation_id, "text_delta", {"text": t}, "turn_x") for t in "abc"]
    ticket = _ticket(gateway, token)

    with _stream(gateway, conversation_id, {}, ticket=ticket) as first:
        assert first.status_code == 200
        assert first.headers["content-type"].startswith("text/event-stream")
        assert _first_event_id(first) == ids[0]

    # The ticket is consumed: a plain second use, or one for /ws, is refused.
    with _stream(gateway, conversation_id, {}, ticket=ticket) as again:
        assert again.status_code == 401
    # Its EventSource reconnecting (same URL, Last-Event-ID) resumes after that id.
    with _stream(gateway, conversation_id, {"Last-Event-ID": ids[0]}, ticket=ticket) as resumed:
        assert resumed.status_code == 200
        assert _first_event_id(resumed) == ids[1]
    # The grant is for that conversation only.
    with _stream(gateway, other_conversation, {"Last-Event-ID": ids[0]}, ticket=ticket) as other:
        assert other.status_code == 401


def test_a_bad_ticket_is_401_and_another_users_conversation_is_404(
    gateway: LiveGateway, make_user: Users, conversation_of: Callable[[str], str]
) -> None:
    owner_id, owner_token = make_user()
    _, stranger_token = make_user()
    conversation_id = conversation_of(owner_id)
    for ticket in ("nope", "x" * 200):
        with _stream(gateway, conversation_id, {"Last-Event-ID": "1-0"}, ticket=ticket) as r:
            assert r.status_code == 401
    with _stream(gateway, conversation_id, {}, ticket="x" * 201) as too_long:
        assert too_long.status_code == 422
    with _stream(gateway, conversation_id, {}) as anonymous:
        assert anonymous.status_code == 401
    stranger_ticket = _ticket(gateway, stranger_token)
    with _stream(gateway, conversation_id, {}, ticket=stranger_ticket) as foreign:
        assert foreign.status_code == 404
    # A foreign conversation leaves the stranger no grant to resume with.
    with _stream(
        gateway, conversation_id, {"Last-Event-ID": "1-0"}, ticket=stranger_ticket
    ) as retried:
        assert retried.status_code == 401
    with _stream(gateway, conversation_id, bearer(owner_token)) as owner:
        assert owner.status_code == 200
