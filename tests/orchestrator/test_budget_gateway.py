"""A budget end to end: turns submitted to a real gateway (HTTP and WebSocket), run by the
in-process loop on real Redis and SQL. The turn that crosses the budget ends
``budget_exceeded``; the next is refused ``budget_exceeded`` with nothing stored until the
period resets on the clock the test moves; then it runs, on a valid transcript."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from websockets.sync.client import connect

from signalbox.shared.db import Conversation, Turn, UserLimits
from signalbox.shared.settings import GatewaySettings
from tests import http_calls
from tests.fake_anthropic import transcript_problems
from tests.gateway.conftest import LiveGateway

from .support import Harness, ok, say, spec, use


class Clock:
    """The one "now" of the gateway and the loop, moved by the test."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gateway(
    harness: Harness, internal_token: str, tmp_path: Path, clock: Clock
) -> Iterator[LiveGateway]:
    settings = GatewaySettings(
        redis_url=harness.runtime.settings.redis_url,
        redis_prefix=harness.runtime.keys.prefix,
        database_url=harness.runtime.settings.database_url,
        internal_token=internal_token,
        workspaces_root=tmp_path,
    )
    live = LiveGateway(settings)
    live.start()
    live.app.state.gateway.clock = clock
    harness.runtime.clock = clock
    try:
        yield live
    finally:
        live.stop()


def _counts(h: Harness) -> tuple[int, int]:
    with h.sessions() as s:
        turns = s.scalar(select(func.count()).select_from(Turn).where(Turn.user_id == h.user_id))
        conversations = s.scalar(
            select(func.count()).select_from(Conversation).where(Conversation.user_id == h.user_id)
        )
    return int(turns or 0), int(conversations or 0)


def test_a_budget_crossed_mid_turn_refuses_the_next_turn_until_the_period_resets(
    harness: Harness, gateway: LiveGateway, clock: Clock
) -> None:
    h = harness
    with h.sessions() as s, s.begin():
        s.add(UserLimits(user_id=h.user_id, day_tokens=35))  # each step bills 15
    h.catalogue(spec("read_file"))
    h.dispatcher.tools.update({"read_file": ok("contents")})
    h.model.steps = [
        say("One.", use("read_file", path="a")),
        say("Two.", use("read_file", path="b")),
        say("Three.", use("read_file", path="c")),
    ]
    headers = {"Authorization": f"Bearer {h.token}"}
    turns_url = f"/api/conversations/{h.conversation_id}/turns"
    with http_calls.Client(base_url=gateway.url, headers=headers) as http:
        accepted = http.post(turns_url, json={"text": "read three files"})
        assert accepted.status_code == 202, accepted.text
        assert h.run(accepted.json()["turn_id"]) == "budget_exceeded"
        [finished] = h.data("turn_finished")
        assert finished["status"] == "budget_exceeded"
        assert finished["usage"]["input_tokens"] == 30 and finished["usage"]["output_tokens"] == 15

        before = _counts(h)
        refused = http.post(turns_url, json={"text": "more"})
        assert refused.status_code == 402, refused.text
        assert refused.json()["code"] == "budget_exceeded"
        assert "daily token budget of 35" in refused.json()["detail"]
        with connect(gateway.ws_url, additional_headers=headers) as ws:
            for frame in (
                {"type": "user_turn", "req": "r1", "conversation_id": h.conversation_id},
                {"type": "user_turn", "req": "r2"},  # a new conversation: not created either
            ):
                ws.send(json.dumps({**frame, "text": "more"}))
                reply = json.loads(ws.recv(timeout=30))
                assert (reply["type"], reply["code"]) == ("error", "budget_exceeded"), reply
        assert _counts(h) == before, "a refused turn stored nothing"

        budget = http.get("/api/me/budget").json()
        [day] = budget["budgets"]
        assert (day["period"], day["limit_tokens"], day["used_tokens"]) == ("day", 35, 45)
        assert day["exceeded"] and day["remaining_tokens"] == 0

        clock.now += timedelta(days=1)
        [day] = http.get("/api/me/budget").json()["budgets"]
        assert (day["used_tokens"], day["exceeded"]) == (0, False)
        h.model.steps = [say("A new day.")]
        accepted = http.post(turns_url, json={"text": "and now?"})
        assert accepted.status_code == 202, accepted.text
        assert h.run(accepted.json()["turn_id"]) == "completed"
        assert transcript_problems(h.model.requests[-1].messages) == []

        metrics = http.get("/metrics").text
        assert 'signalbox_gateway_budget_refusals_total{period="day",user_class="user"} 3.0' in (
            metrics
        )
