"""``GET /metrics``: connections, relayed events, latency, frames, errors and turns."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Conversation, Turn
from signalbox.shared.event_stream import EventStream
from signalbox.shared.ids import new_id
from tests import http_calls
from tests.gateway.conftest import LiveGateway, connect, events_until, request

Users = Callable[[], tuple[str, str]]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(gateway: LiveGateway) -> Samples:
    """Every sample of ``/metrics`` by (name, sorted labels)."""
    response = http_calls.get(f"{gateway.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.anyio
async def test_metrics_after_a_turn_like_sequence(
    gateway: LiveGateway,
    make_user: Users,
    redis_client: redis.Redis,
    db_sessions: sessionmaker[Session],
) -> None:
    _, token = make_user()
    before = scrape(gateway)
    assert value(before, "signalbox_gateway_connections", transport="ws") == 0
    stream = EventStream(redis_client, gateway.keys)
    async with await connect(gateway, token) as ws:
        ack = await request(ws, {"type": "user_turn", "conversation_id": None, "text": "hi"})
        conversation_id, turn_id = ack["conversation_id"], ack["turn_id"]
        await ws.send(json.dumps({"type": "nonsense"}))  # one frame of an unknown type
        # Once turn_queued is here, the socket follows the conversation live: the six events
        # below are relayed live (and timed), not replayed with the subscription.
        seen = await events_until(ws, lambda es: any(e["kind"] == "turn_queued" for e in es))
        for kind, data in [
            ("turn_started", {"model": "demo"}),
            ("text_delta", {"text": "hel"}),
            ("text_delta", {"text": "lo"}),
            (
                "tool_call_started",
                {"call_id": "c1", "tool": "list_dir", "input": {}, "timeout_s": 5},
            ),
            (
                "tool_call_finished",
                {
                    "call_id": "c1",
                    "tool": "list_dir",
                    "status": "ok",
                    "output": "",
                    "duration_ms": 3,
                },
            ),
            ("turn_finished", {"status": "completed", "steps": 1, "usage": {}}),
        ]:
            stream.append(conversation_id, kind, data, turn_id)  # type: ignore[arg-type]
        events = seen + await events_until(
            ws, lambda es: bool(es) and es[-1]["kind"] == "turn_finished"
        )
        with db_sessions() as session:
            turn = session.get(Turn, turn_id)
            assert turn is not None
            turn.status = "completed"
            session.commit()
        during = scrape(gateway)
    assert [e["kind"] for e in events][:2] == ["conversation_created", "turn_queued"]

    assert value(during, "signalbox_gateway_connections", transport="ws") == 1
    relayed = "signalbox_gateway_events_relayed_total"
    assert (
        value(during, relayed, kind="text_delta") - value(before, relayed, kind="text_delta") == 2
    )
    assert (
        value(during, relayed, kind="turn_finished") - value(before, relayed, kind="turn_finished")
        == 1
    )
    # Six live events were timed; replayed ones (conversation_created...) are not.
    latency = "signalbox_gateway_relay_latency_seconds_count"
    assert value(during, latency) - value(before, latency) >= 6
    assert value(during, "signalbox_gateway_relay_latency_seconds_bucket", le="+Inf") >= 6
    frames = "signalbox_gateway_frames_total"
    assert value(during, frames, type="user_turn") - value(before, frames, type="user_turn") == 1
    assert value(during, frames, type="invalid") - value(before, frames, type="invalid") == 1
    errors = "signalbox_gateway_errors_total"
    assert (
        value(during, errors, code="unknown_type") - value(before, errors, code="unknown_type") == 1
    )
    assert (
        value(during, "signalbox_turns", status="completed")
        - value(before, "signalbox_turns", status="completed")
        == 1
    )

    after = scrape(gateway)  # the socket is closed now
    assert value(after, "signalbox_gateway_connections", transport="ws") == 0


def test_http_errors_are_counted_by_code(gateway: LiveGateway, make_user: Users) -> None:
    _, token = make_user()
    before = scrape(gateway)
    response = http_calls.get(
        f"{gateway.url}/api/conversations/conv-nope",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 404
    after = scrape(gateway)
    errors = "signalbox_gateway_errors_total"
    assert value(after, errors, code="not_found") - value(before, errors, code="not_found") == 1


def test_turns_waiting_for_a_slot_are_counted_by_user_class(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    user_id, _token = make_user()
    before = value(scrape(gateway), "signalbox_turns_waiting", user_class="user")
    with db_sessions() as session, session.begin():
        for _ in range(3):  # stored, not yet given a slot by admission
            conv = Conversation(id=new_id("conv"), user_id=user_id, workspace="default")
            session.add(conv)
            session.add(
                Turn(
                    id=new_id("turn"),
                    conversation_id=conv.id,
                    user_id=user_id,
                    seq=1,
                    text="wait",
                    status="queued",
                    deployment=gateway.keys.prefix,
                )
            )
    after = scrape(gateway)
    assert value(after, "signalbox_turns_waiting", user_class="user") - before == 3
    assert value(after, "signalbox_turns_waiting", user_class="admin") == 0
    with db_sessions() as session, session.begin():  # leave nothing waiting for others
        session.query(Turn).filter(Turn.user_id == user_id).update({"status": "cancelled"})
