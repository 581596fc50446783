"""Subscriptions: replay after an id, live events once and in order, ownership, replay gaps."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from signalbox.services.gateway.relay import Subscription, frame_prefix, relay_frame
from signalbox.services.gateway.state import Gateway
from signalbox.shared.event_stream import EventStream, decode, encode
from signalbox.shared.events import Event, EventKind, utc_now
from tests import http_calls
from tests.gateway.conftest import (
    LiveGateway,
    bearer,
    connect,
    events_until,
    recv,
    request,
)

Users = Callable[[], tuple[str, str]]


def _deltas(stream: EventStream, conversation_id: str, texts: list[str]) -> list[str]:
    return [stream.append(conversation_id, "text_delta", {"text": t}, "turn_x") for t in texts]


def _hub_of(gateway: LiveGateway) -> Gateway:
    state: Gateway = gateway.app.state.gateway
    return state


@pytest.mark.anyio
async def test_subscribe_after_replays_exactly_the_later_events_then_live_once(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    stream = EventStream(redis_client, gateway.keys)
    ids = _deltas(stream, conversation_id, ["a", "b", "c", "d", "e"])
    async with await connect(gateway, token) as ws:
        frame = {"type": "subscribe", "conversation_id": conversation_id, "after": ids[1]}
        assert (await request(ws, frame))["type"] == "ack"
        replayed = await events_until(ws, lambda es: len(es) >= 3)
        assert [e["id"] for e in replayed] == ids[2:]
        assert [e["data"]["text"] for e in replayed] == ["c", "d", "e"]
        live_ids = _deltas(stream, conversation_id, ["f", "g"])
        live = await events_until(ws, lambda es: len(es) >= 2)
        assert [e["id"] for e in live] == live_ids
        await ws.send(json.dumps({"type": "ping", "req": "end"}))
        assert await recv(ws) == {"type": "pong", "req": "end"}  # no duplicate was queued


@pytest.mark.anyio
async def test_events_appended_while_joining_arrive_once_in_order(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    stream = EventStream(redis_client, gateway.keys)
    total = 400
    _deltas(stream, conversation_id, ["early"] * 50)
    started = threading.Event()

    def writer() -> None:
        client = redis.Redis.from_url(redis_url)
        mine = EventStream(client, gateway.keys)
        started.set()
        for i in range(total - 50):
            mine.append(conversation_id, "text_delta", {"text": str(i)}, "turn_x")
        client.close()

    thread = threading.Thread(target=writer)
    thread.start()
    started.wait(5)
    # Two sockets join at different moments of the write burst; each must see every event.
    async with await connect(gateway, token) as one, await connect(gateway, token) as two:
        frame = {"type": "subscribe", "conversation_id": conversation_id, "after": None}
        assert (await request(one, frame))["type"] == "ack"
        assert (await request(two, frame))["type"] == "ack"
        got_one = await events_until(one, lambda es: len(es) >= total)
        got_two = await events_until(two, lambda es: len(es) >= total)
    thread.join(10)
    expected = [e.id for e in stream.read_after(conversation_id, None)]
    assert len(expected) == total
    assert [e["id"] for e in got_one] == expected
    assert [e["id"] for e in got_two] == expected


@pytest.mark.anyio
async def test_follower_stops_with_its_last_subscriber(
    gateway: LiveGateway, make_user: Users, conversation_of: Callable[[str], str]
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    hub = _hub_of(gateway).hub
    async with await connect(gateway, token) as ws:
        frame = {"type": "subscribe", "conversation_id": conversation_id, "after": None}
        assert (await request(ws, frame))["type"] == "ack"
        assert conversation_id in hub.followed
        frame = {"type": "unsubscribe", "conversation_id": conversation_id}
        assert (await request(ws, frame))["type"] == "ack"
        assert conversation_id not in hub.followed


@pytest.mark.anyio
async def test_another_users_conversation_is_not_found(
    gateway: LiveGateway, make_user: Users, conversation_of: Callable[[str], str]
) -> None:
    owner_id, _ = make_user()
    _, token = make_user()
    conversation_id = conversation_of(owner_id)
    async with await connect(gateway, token) as ws:
        frame = {"type": "subscribe", "conversation_id": conversation_id, "after": None}
        reply = await request(ws, frame)
        assert (reply["type"], reply["code"]) == ("error", "not_found")
        frame = {"type": "user_turn", "conversation_id": conversation_id, "text": "hi"}
        reply = await request(ws, frame)
        assert (reply["type"], reply["code"]) == ("error", "not_found")
    async with http_calls.AsyncClient(base_url=gateway.url, headers=bearer(token)) as http:
        for path in ("", "/events", "/stream"):
            response = await http.get(f"/api/conversations/{conversation_id}{path}")
            assert response.status_code == 404, path
        missing = await http.get("/api/conversations/conv_nope")
        assert missing.status_code == 404
        assert missing.json()["detail"] == response.json()["detail"].replace(
            conversation_id, "conv_nope"
        )


@pytest.mark.anyio
async def test_subscribe_after_a_trimmed_id_is_replay_gap(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    stream = EventStream(redis_client, gateway.keys)
    ids = _deltas(stream, conversation_id, [str(i) for i in range(10)])
    redis_client.xtrim(gateway.keys.events(conversation_id), maxlen=3, approximate=False)
    async with await connect(gateway, token) as ws:
        frame = {"type": "subscribe", "conversation_id": conversation_id, "after": ids[1]}
        reply = await request(ws, frame)
        assert (reply["type"], reply["code"]) == ("error", "replay_gap")
        frame["after"] = ids[7]
        assert (await request(ws, frame))["type"] == "ack"
        assert [e["id"] for e in await events_until(ws, lambda es: len(es) >= 2)] == ids[8:]
    async with http_calls.AsyncClient(base_url=gateway.url, headers=bearer(token)) as http:
        url = f"/api/conversations/{conversation_id}/events"
        assert (await http.get(url, params={"after": ids[1]})).status_code == 410
        later = await http.get(url, params={"after": ids[7]})
        assert [e["id"] for e in later.json()] == ids[8:]


@pytest.mark.anyio
async def test_sse_resumes_from_last_event_id_and_follows_live(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    stream = EventStream(redis_client, gateway.keys)
    ids = _deltas(stream, conversation_id, ["a", "b", "c"])
    headers = {**bearer(token), "Last-Event-ID": ids[0]}
    url = f"{gateway.url}/api/conversations/{conversation_id}/stream"
    seen: list[str] = []
    async with (
        http_calls.AsyncClient() as http,
        http.stream("GET", url, headers=headers) as r,
    ):
        assert r.status_code == 200
        lines = r.aiter_lines()

        async def next_event() -> tuple[str, dict[str, Any]]:
            event_id = ""
            async for line in lines:
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("data: "):
                    return event_id, json.loads(line[6:])
            raise AssertionError("stream ended")

        for _ in range(2):
            event_id, data = await asyncio.wait_for(next_event(), 30)
            assert data["id"] == event_id
            seen.append(event_id)
        live = _deltas(stream, conversation_id, ["d"])
        event_id, _ = await asyncio.wait_for(next_event(), 5)
        seen.append(event_id)
    assert seen == [*ids[1:], *live]


def _event(event_id: str) -> Event:
    return Event(
        conversation_id="c", id=event_id, turn_id=None, ts=utc_now(), kind="text_delta",
        data={"text": event_id},
    )  # fmt: skip


def test_a_live_subscription_that_overflows_is_closed_not_waited_for() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue(maxsize=2)
    overflowed: list[bool] = []
    subscription = Subscription(
        "c", None, lambda _e, text: queue.put_nowait(text), lambda: overflowed.append(True), 10
    )

    async def go_live() -> None:
        async for _ in subscription.catch_up([], stream=None):  # type: ignore[arg-type]
            pass

    asyncio.run(go_live())
    for n in range(1, 5):
        event = _event(f"1-{n}")
        subscription.offer(event, event.id)
    assert overflowed == [True]
    assert [queue.get_nowait() for _ in range(queue.qsize())] == ["1-1", "1-2"]


def test_catch_up_skips_what_the_replay_already_sent() -> None:
    sent: list[str] = []
    subscription = Subscription("c", "1-1", lambda _e, text: sent.append(text), lambda: None, 10)
    # Buffered while replaying: 1-3 (also in the replay) and 1-4 (only live).
    for n in (3, 4):
        event = _event(f"1-{n}")
        subscription.offer(event, event.id)

    async def replay() -> list[str]:
        page = [_event("1-1"), _event("1-2"), _event("1-3")]
        return [e.id async for e, _ in subscription.catch_up(page, stream=None)]  # type: ignore[arg-type]

    assert asyncio.run(replay()) == ["1-2", "1-3", "1-4"]
    assert subscription.live
    subscription.offer(_event("1-4"), "1-4")
    subscription.offer(_event("1-5"), "1-5")
    assert sent == ["1-5"]


# -- frames relayed as stored ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "data", "turn_id"),
    [
        ("text_delta", {"text": "plain"}, "turn_x"),
        ("text_delta", {"text": 'quotes " \\ and ünïcode ✓'}, "turn_x"),
        ("conversation_created", {"workspace": "default", "title": "t"}, None),
        (
            "tool_call_finished",
            {"call_id": "c", "tool": "t", "status": "ok", "output": "1e-07", "duration_ms": 1},
            "turn_y",
        ),
    ],
)
def test_a_stream_entry_is_relayed_as_the_frame_a_decode_would_have_sent(
    kind: EventKind, data: dict[str, Any], turn_id: str | None
) -> None:
    raw = encode(kind, data, turn_id)["e"]
    relayed = relay_frame(frame_prefix('conv_"odd"'), "1700000000000-3", raw)
    assert relayed is not None
    head, text = relayed
    event = decode('conv_"odd"', "1700000000000-3", {"e": raw})
    assert (head.id, head.kind, head.ts) == (event.id, event.kind, event.ts)
    assert list(json.loads(text).items()) == list(json.loads(event.model_dump_json()).items())


def test_an_entry_in_another_shape_is_left_to_a_full_decode() -> None:
    body = {"kind": "text_delta", "turn_id": None, "ts": utc_now(), "data": {"text": "x"}}
    assert relay_frame(frame_prefix("c"), "1-1", json.dumps(body)) is None  # key order
    unknown = json.dumps({"turn_id": None, "ts": utc_now(), "kind": "not_a_kind", "data": {}})
    assert relay_frame(frame_prefix("c"), "1-1", unknown) is None
