"""The orchestrator process on the real ``anthropic`` SDK (against the fake Messages API) with
the REAL tools worker (prefork, ``SIGNALBOX_TEST_TOOLS=1``): a call past its limit ends
``timeout`` alone, busy policies at the gateway, and a worker SIGKILLed mid-call → ``lost``.

The tests of this module share one deployment and run in file order; the last one kills
the tools worker.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from signalbox.processes import Child, ServiceCommands, child_env, log_contains, stop_together
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.celery_app import RUN_TURN_TASK, make_celery
from signalbox.shared.event_stream import EventStream
from signalbox.shared.events import Event
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings, GatewaySettings
from signalbox.shared.tool_contract import read_catalogue
from tests.fake_anthropic import FakeAnthropic, text, tool_use
from tests.gateway.conftest import LiveGateway
from tests.wsclient import Frame, WsClient

from .support import make_conversation, make_turn, wait_for

REPO = Path(__file__).resolve().parents[2]
SLEEP_LIMIT_S = 1.0  # the deployment's limit of the test tool ``sleep``
BLOCK_LIMIT_S = 3.0  # ... and of ``block``
HOLD_LIMIT_S = 120.0  # ... and of ``count_calls``, which can hold its process (``hold_s``)
GRACE_S = 1.0
HEARTBEAT_S = 0.2  # the test gateways' heartbeat: wakes a waiting socket to check its deadline
REPLY_TIMEOUT_S = 30.0  # deadlines to wait for, generous for a loaded machine
WAIT_S = 30.0


@dataclass
class Deployment:
    keys: RedisKeys
    client: Celery
    redis: redis.Redis
    fake: FakeAnthropic
    tools: Child
    settings: dict[str, Any]
    children: list[Child] = field(default_factory=list)

    def events(self, conversation_id: str) -> list[Event]:
        return EventStream(self.redis, self.keys).read_after(conversation_id, None)

    def kinds(self, conversation_id: str) -> list[str]:
        return [e.kind for e in self.events(conversation_id)]


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
) -> Iterator[Deployment]:
    prefix = f"{redis_prefix}realtools-{uuid.uuid4().hex[:6]}:"
    logs = tmp_path_factory.mktemp("orchestrator-real-tools")
    workspaces = tmp_path_factory.mktemp("real-tools-workspaces")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    common = {
        "SIGNALBOX_REDIS_URL": redis_url,
        "SIGNALBOX_REDIS_PREFIX": prefix,
        "SIGNALBOX_DATABASE_URL": database_url,
        "SIGNALBOX_INTERNAL_TOKEN": internal_token,
        "SIGNALBOX_WORKSPACES_ROOT": str(workspaces),
        "PYTHONPATH": str(REPO),
    }
    with FakeAnthropic() as fake:
        orchestrator_env = child_env(
            base,
            {
                **common,
                "ANTHROPIC_API_KEY": "sk-test",
                "ANTHROPIC_BASE_URL": fake.url,
                "SIGNALBOX_TOOL_GRACE_S": str(GRACE_S),
            },
        )
        tools_env = child_env(
            base,
            {
                **common,
                "SIGNALBOX_TEST_TOOLS": "1",
                "SIGNALBOX_TOOL_TIMEOUTS": json.dumps(
                    {"sleep": SLEEP_LIMIT_S, "block": BLOCK_LIMIT_S, "count_calls": HOLD_LIMIT_S}
                ),
            },
        )
        # 6 slots: cancelled turns of the busy-policy tests leave calls running to their limit.
        commands = ServiceCommands(tools_concurrency=6, orchestrator_concurrency=4)
        orchestrator = Child(
            "orchestrator",
            commands.orchestrator("orch-real@%h"),
            logs / "orchestrator.log",
            orchestrator_env,
        )
        tools = Child("tools", commands.tools("tools-real@%h"), logs / "tools.log", tools_env)
        keys = RedisKeys(prefix)
        client = redis.Redis.from_url(redis_url)
        app = make_celery(
            "real-tools-test-client",
            CommonSettings(redis_url=redis_url, redis_prefix=prefix, database_url=database_url),
        )
        children = [orchestrator, tools]
        try:
            for child in children:
                child.start()
            for child in children:
                child.wait_ready(log_contains(child, " ready."))
            wait_for(lambda: "block" in read_catalogue(client, keys), what="the tool catalogue")
            settings = {
                "redis_url": redis_url,
                "redis_prefix": prefix,
                "database_url": database_url,
                "internal_token": internal_token,
                "workspaces_root": workspaces,
            }
            yield Deployment(keys, app, client, fake, tools, settings, children)
        finally:
            stop_together(children)
            client.close()
            app.close()


def _finished(events: list[Event]) -> dict[str, dict[str, Any]]:
    """tool_call_finished data by tool name."""
    return {e.data["tool"]: e.data for e in events if e.kind == "tool_call_finished"}


def test_four_parallel_calls_one_past_its_limit_ends_timeout_alone(
    deployment: Deployment,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    d = deployment
    d.fake.script(
        [
            [
                text("Four at once."),
                tool_use("sleep", {"seconds": 30}),
                tool_use("block", {"how": "select", "seconds": 0.2}),
                tool_use("count_calls", {"key": uuid.uuid4().hex}),
                tool_use("list_dir", {"path": "."}),
            ],
            [text("Three worked; the sleep timed out.")],
        ]
    )
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    turn_id = make_turn(db_sessions, conversation_id, user_id, "go", seq=1)

    assert d.client.send_task(RUN_TURN_TASK, args=[turn_id]).get(timeout=60) == "completed"

    events = d.events(conversation_id)
    finished = _finished(events)
    assert {tool: f["status"] for tool, f in finished.items()} == {
        "sleep": "timeout",
        "block": "ok",
        "count_calls": "ok",
        "list_dir": "ok",
    }, finished
    # Its limit ended it, not its 30 s sleep (a lower bound: the limit does not fire early;
    # how late a loaded machine reports it is not this test's business).
    sleep = finished["sleep"]
    assert "exceeded its time limit of 1 s" in (sleep["error"] or ""), sleep
    assert sleep["duration_ms"] >= SLEEP_LIMIT_S * 1000 * 0.5, sleep
    kinds = [e.kind for e in events]
    starts = [i for i, k in enumerate(kinds) if k == "tool_call_started"]
    assert len(starts) == 4 and max(starts) < kinds.index("tool_call_finished")
    assert events[-1].kind == "turn_finished" and events[-1].data["status"] == "completed"
    last = d.fake.requests[-1].body["messages"][-1]["content"]
    assert len([b for b in last if b["type"] == "tool_result"]) == 4
    assert d.fake.violations == []


@contextmanager
def _gateway_socket(d: Deployment, token: str, **overrides: Any) -> Iterator[WsClient]:
    """A real gateway (uvicorn on a real port) with ``overrides``, and one socket to it.

    Starlette's in-process ``TestClient`` was used here once; its portal cancelled the app's
    background relay at exit now and then (``CancelledError`` in teardown), so these tests
    drive the gateway the way a client does.
    """
    gateway = LiveGateway(GatewaySettings(**d.settings, heartbeat_s=HEARTBEAT_S, **overrides))
    gateway.start()
    try:
        client = WsClient(gateway.url, token)
        try:
            yield client
        finally:
            client.close()
    finally:
        gateway.stop()


def _is(kind: str, turn_id: str) -> Callable[[Frame], bool]:
    return lambda f: f.get("type") == "event" and f["kind"] == kind and f["turn_id"] == turn_id


def _until(ws: WsClient, done: Callable[[Frame], bool], timeout_s: float = 30) -> Frame:
    """The first event seen so far, or still to come, that satisfies ``done``."""
    for event in ws.events:
        if done(event):
            return event
    return ws.wait_for(done, timeout_s)


def test_busy_policy_interrupt_cancels_the_running_turn_then_runs_the_new_one(
    deployment: Deployment, make_user: Callable[[], tuple[str, str]]
) -> None:
    d = deployment
    d.fake.script(
        [
            [text("Waiting."), tool_use("block", {"how": "sleep", "seconds": 30})],
            [text("Second answer.")],
        ]
    )
    _, token = make_user()
    with _gateway_socket(d, token, busy_policy="interrupt") as ws:
        first = ws.request({"type": "user_turn", "text": "first"}, REPLY_TIMEOUT_S)
        assert first["type"] == "ack", first
        _until(ws, _is("tool_call_started", first["turn_id"]))

        second = ws.request(
            {"type": "user_turn", "conversation_id": first["conversation_id"], "text": "second"},
            REPLY_TIMEOUT_S,
        )
        assert second["type"] == "ack", second
        done = _until(ws, _is("turn_finished", second["turn_id"]))

    assert done["data"]["status"] == "completed"
    order = [(e["kind"], e["turn_id"]) for e in ws.events]
    cancelled = order.index(("turn_finished", first["turn_id"]))
    assert ws.events[cancelled]["data"]["status"] == "cancelled"
    assert cancelled < order.index(("turn_started", second["turn_id"]))
    assert ("tool_call_finished", first["turn_id"]) in order


def test_busy_policy_reject_answers_turn_busy(
    deployment: Deployment, make_user: Callable[[], tuple[str, str]]
) -> None:
    d = deployment
    d.fake.script([[text("Waiting."), tool_use("block", {"how": "sleep", "seconds": 30})]])
    _, token = make_user()
    with _gateway_socket(d, token, busy_policy="reject") as ws:
        first = ws.request({"type": "user_turn", "text": "first"}, REPLY_TIMEOUT_S)
        _until(ws, _is("tool_call_started", first["turn_id"]))

        refused = ws.request(
            {"type": "user_turn", "conversation_id": first["conversation_id"], "text": "again"},
            REPLY_TIMEOUT_S,
        )

        assert (refused["type"], refused["code"]) == ("error", "turn_busy")
        assert ws.request({"type": "cancel", "turn_id": first["turn_id"]})["type"] == "ack"
        done = _until(ws, _is("turn_finished", first["turn_id"]))
    assert done["data"]["status"] == "cancelled"


def test_a_tools_worker_killed_mid_call_is_lost_while_the_rest_of_the_batch_goes_on(
    deployment: Deployment,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    d = deployment
    # The call the kill interrupts holds its pool process for 60 s under a 120 s limit, so
    # nothing but the kill can end it, however slow the machine. It is not idempotent (it is
    # never sent again): its worker's heartbeat stops with the kill, and that makes it lost.
    started_key = uuid.uuid4().hex
    d.fake.script(
        [
            [
                text("Three."),
                tool_use("count_calls", {"key": started_key, "hold_s": 60}),
                tool_use("block", {"how": "select", "seconds": 0.2}),
                tool_use("list_dir", {"path": "."}),
            ],
            [text("One was lost.")],
        ]
    )
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    turn_id = make_turn(db_sessions, conversation_id, user_id, "go", seq=1)
    result = d.client.send_task(RUN_TURN_TASK, args=[turn_id])

    def holding_and_quick_ones_done() -> bool:
        # count_calls counts its run as it starts: from then on it holds inside its call.
        holding = d.redis.get(counter_key(d.keys, started_key)) == b"1"
        finished = _finished(d.events(conversation_id))
        return holding and {"block", "list_dir"} <= set(finished)

    wait_for(holding_and_quick_ones_done, WAIT_S, "the quick calls to finish beside the held one")
    d.tools.signal_group(signal.SIGKILL)  # the worker and its pool children, mid-call
    assert d.tools.process is not None
    d.tools.process.wait(timeout=WAIT_S)

    assert result.get(timeout=60) == "completed"

    finished = _finished(d.events(conversation_id))
    held = finished["count_calls"]
    assert held["status"] == "lost", held
    assert "tool worker stopped while running it" in (held["error"] or ""), held
    assert held["duration_ms"] < HOLD_LIMIT_S * 1000  # its heartbeat told, not its deadline
    assert finished["block"]["status"] == finished["list_dir"]["status"] == "ok"
    assert d.events(conversation_id)[-1].data["status"] == "completed"
    assert d.fake.violations == []
