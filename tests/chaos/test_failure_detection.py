"""Failure detection by heartbeat, and results that ride out a Redis blip (issue 21).

Its own deployment (the module's ``deployment``): gateway, proposals, 2 orchestrators and 2
tool workers as real processes, with the DEFAULT lease, renewal, sweep and heartbeat
settings (the figures these tests report are the defaults'), tool limits of 60 s, and a
private ``redis-server`` with an append-only file, so that stopping it and starting it
again on the same port is a blip: nothing is lost but the seconds it was away.

Each test kills something for real (SIGKILL to an orchestrator's group, to a tool worker's
pool process, to a whole tool worker), or stops Redis while a call finishes, and measures
from outside how long the system took to notice. Deadlines in the asserts are generous
(a loaded 2-core machine); the measured figures are printed (``-s``) and recorded
(``record_property``) for docs/operations.md, "Failure detection".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import select

from signalbox.redis_server import start_redis
from signalbox.services.orchestrator.lease import holder_pid
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.event_stream import EventStream
from signalbox.shared.events import Event
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import OrchestratorSettings
from signalbox.stack import Stack, StackConfig
from tests.databases import database_for
from tests.fake_anthropic import FakeAnthropic, stall, text, tool_use

from .conftest import Chaos, Client, event, wait_for

TOOL_LIMIT_S = 60.0  # far beyond any detection: "before the limit" is unambiguous
DETECT_DEADLINE_S = 15.0  # generous for a loaded machine; the targets are 5 s
Figures = Callable[[str, object], None]


@pytest.fixture(scope="module")
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, internal_token: str
) -> Iterator[Chaos]:
    var = tmp_path_factory.mktemp("detection")
    redis_dir = var / "redis"
    server = start_redis(redis_dir, persistent=True)
    database_url = database_for(request, var, "detection")
    engine = make_engine(database_url)
    fake = FakeAnthropic().start()
    config = StackConfig(
        var_dir=var,
        redis_url=server.url,
        database_url=database_url,
        internal_token=internal_token,
        orchestrators=2,
        tools_workers=2,
        extra_env={
            "ANTHROPIC_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": fake.url,
            "SIGNALBOX_TEST_TOOLS": "1",
            "SIGNALBOX_CATALOGUE_REFRESH_S": "1",
            "SIGNALBOX_TOOL_TIMEOUTS": json.dumps(
                {"sleep": TOOL_LIMIT_S, "count_calls": TOOL_LIMIT_S}
            ),
            "SIGNALBOX_RATE_LIMIT_PER_MINUTE": "100000",
            "SIGNALBOX_RATE_LIMIT_TURNS": "100000/minute",
        },
    )
    stack = Stack(config)
    config.workspaces_root.mkdir(parents=True, exist_ok=True)
    deployed = Chaos(
        stack=stack,
        redis_server=server,
        redis_dir=redis_dir,
        sessions=make_session_factory(engine),
        fake=fake,
        keys=RedisKeys(config.redis_prefix),
        redis=redis.Redis.from_url(server.url, socket_timeout=5),
    )
    try:
        deployed.start("proposals", "gateway", "tools1", "tools2", "orchestrator1", "orchestrator2")
        yield deployed
    finally:
        deployed.stop()
        deployed.redis.close()
        fake.stop()
        deployed.redis_server.stop()
        engine.dispose()


@pytest.fixture
def user(deployment: Chaos) -> Iterator[Client]:
    deployment.ensure_up()
    _user_id, token = deployment.new_user()
    client = Client(deployment, token)
    yield client
    client.close()


@pytest.fixture
def figure(record_property: Callable[[str, object], None]) -> Figures:
    """Report a measured figure: printed (``-s``) and kept in the JUnit properties."""

    def report(name: str, value: object) -> None:
        print(f"\nFIGURE {name}: {value}")
        record_property(name, value)

    return report


def _start_turn(client: Client, marker: str) -> str:
    ack = client.request({"type": "user_turn", "text": f"please work on {marker}"})
    assert ack["type"] == "ack", ack
    return str(ack["turn_id"])


def _events(d: Chaos, turn_id: str) -> list[Event]:
    """The turn's events as its conversation's stream holds them (read from Redis)."""
    with d.sessions() as s:
        conversation_id = s.scalar(select(Turn.conversation_id).where(Turn.id == turn_id))
    assert conversation_id is not None
    return [
        e
        for e in EventStream(d.redis, d.keys).read_after(conversation_id, None)
        if e.turn_id == turn_id
    ]


def _count(d: Chaos, key: str) -> int:
    return int(d.redis.get(counter_key(d.keys, key)) or 0)


def _call(d: Chaos, turn_id: str) -> ToolCall:
    with d.sessions() as s:
        calls = list(s.scalars(select(ToolCall).where(ToolCall.turn_id == turn_id)))
    assert len(calls) == 1, calls
    return calls[0]


def _requests_with(d: Chaos, marker: str) -> list[dict[str, Any]]:
    return [r.body for r in d.fake.requests if marker in json.dumps(r.body.get("messages"))]


def _tool_results(d: Chaos, marker: str) -> list[Any]:
    final = _requests_with(d, marker)[-1]["messages"][-1]["content"]
    return [b["content"] for b in final if b["type"] == "tool_result"]


def _holder_of_call(d: Chaos, call_id: str) -> int:
    """The pid of the pool process running ``call_id`` (its claim is ``host:pid``)."""
    raw = wait_for(lambda: d.redis.get(d.keys.call_claim(call_id)), what="the call's claim")
    return int(raw.decode().rsplit(":", 1)[1])


def _running_call(d: Chaos, client: Client, turn_id: str, key: str) -> str:
    """Wait until the turn's one ``count_calls`` call runs; its id."""
    started = client.wait(event("tool_call_started", turn_id), what="the call to start")
    wait_for(lambda: _count(d, key) == 1, what="the call to run")
    return str(started["data"]["call_id"])


def test_a_result_published_while_redis_is_away_is_delivered_once(
    deployment: Chaos, user: Client, figure: Figures
) -> None:
    d = deployment
    marker, key = f"blip-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    d.fake.script_for(
        marker,
        [
            [text("Counting."), tool_use("count_calls", {"key": key, "hold_s": 1.5})],
            [text("Counted.")],
        ],
    )
    turn_id = _start_turn(user, marker)
    call_id = _running_call(d, user, turn_id, key)
    port = d.redis_server.port

    d.redis_server.stop()  # SIGTERM: the append-only file keeps every key
    stopped_at = time.monotonic()
    retrying = f"could not publish the result of call {call_id}"
    tools = [n for n in d.children if n.startswith("tools")]
    wait_for(
        lambda: any(retrying in d.log_text(n) for n in tools),
        what="the finished call's publish to meet the outage",
    )
    d.redis_server = start_redis(d.redis_dir, persistent=True, port=port)
    figure("redis_blip_s", round(time.monotonic() - stopped_at, 1))

    wait_for(lambda: d.turn(turn_id).status == "completed", timeout_s=60, what="the turn")

    call = _call(d, turn_id)
    assert (call.status, call.output) == ("ok", "1"), "the real result, not lost"
    assert _count(d, key) == 1, "the call ran once"
    assert _tool_results(d, marker) == ["1"]
    assert any(f"published the result of call {call_id} at attempt" in d.log_text(n) for n in tools)
    finished = [e.data["status"] for e in _events(d, turn_id) if e.kind == "tool_call_finished"]
    assert finished == ["ok"], "the result is recorded once"


def test_a_killed_orchestrator_s_turn_resumes_within_seconds(
    deployment: Chaos, user: Client, figure: Figures
) -> None:
    d = deployment
    marker = f"resume-{uuid.uuid4().hex[:8]}"
    hang = stall()
    d.fake.script_for(marker, [[text("Thinking", chunks=1), hang], [text("Resumed.")]])
    turn_id = _start_turn(user, marker)
    assert hang.reached.wait(30)
    pid = wait_for(lambda: holder_pid(d.redis.get(d.keys.turn_lease(turn_id))), what="a lease")
    runner = d.child_of_pid(pid)

    d.kill(runner)
    killed_at = time.monotonic()
    hang.release.set()

    user.wait(event("turn_resumed", turn_id), timeout_s=DETECT_DEADLINE_S, what="turn_resumed")
    resumed_after_s = time.monotonic() - killed_at
    done = user.wait(event("turn_finished", turn_id), what="turn_finished")
    figure("orchestrator_resume_s", round(resumed_after_s, 2))
    figure("lease_s", OrchestratorSettings.model_fields["lease_s"].default)

    assert done["data"]["status"] == "completed", done
    assert not d.children[runner].alive(), "the other orchestrator resumed it"
    assert user.kinds(turn_id).count("turn_resumed") == 1
    assert len(_requests_with(d, marker)) == 2


@pytest.mark.parametrize("victim", ["pool process", "whole worker"])
def test_a_call_whose_tool_worker_died_ends_lost_within_seconds(
    deployment: Chaos, user: Client, figure: Figures, victim: str
) -> None:
    d = deployment
    marker, key = f"toolkill-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    d.fake.script_for(
        marker,
        [
            [text("Counting."), tool_use("count_calls", {"key": key, "hold_s": 50})],
            [text("It was lost.")],
        ],
    )
    turn_id = _start_turn(user, marker)
    call_id = _running_call(d, user, turn_id, key)
    pid = _holder_of_call(d, call_id)
    worker = d.child_of_pid(pid)

    if victim == "pool process":
        os.kill(pid, signal.SIGKILL)  # the main process lives on, and redelivers the task
    else:
        d.kill(worker)
    killed_at = time.monotonic()

    finished = user.wait(
        event("tool_call_finished", turn_id, call_id=call_id),
        timeout_s=DETECT_DEADLINE_S,
        what="the call to end",
    )
    lost_after_s = time.monotonic() - killed_at
    done = user.wait(event("turn_finished", turn_id), what="turn_finished")
    figure(f"tool_lost_after_{victim.replace(' ', '_')}_kill_s", round(lost_after_s, 2))

    assert finished["data"]["status"] == "lost", finished
    assert finished["data"]["duration_ms"] < TOOL_LIMIT_S * 1000, "before its time limit"
    assert "heartbeat" in (_call(d, turn_id).error or "")
    assert done["data"]["status"] == "completed", done
    assert "may or may not have taken effect" in json.dumps(_tool_results(d, marker))
    if victim == "pool process":
        # Celery delivers the task again (task_reject_on_worker_lost); the claim skips it.
        skipped = f"call {call_id} (count_calls) was already claimed"
        tools = [n for n in d.children if n.startswith("tools")]
        wait_for(
            lambda: any(skipped in d.log_text(n) for n in tools),
            what="the redelivered call to be skipped",
        )
    assert _count(d, key) == 1, "a non-idempotent call never runs twice"


def _spinner() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_a_busy_runner_on_loaded_cores_keeps_its_lease(
    deployment: Chaos, user: Client, figure: Figures
) -> None:
    d = deployment
    turns = 4  # streaming at once, on 2 orchestrators, beside 2 processes spinning
    ticks = 100  # a 200 ms pause after each: every turn streams for 20 s and more
    chunk = "word " * 400
    markers = [f"busy-{i}-{uuid.uuid4().hex[:8]}" for i in range(turns)]
    for marker in markers:
        steps: list[Any] = []
        for _ in range(ticks):
            steps += [text(chunk, chunks=1), stall(timeout_s=0.2)]
        d.fake.script_for(marker, [[*steps, text("Done.", chunks=1)]])
    spinners = [_spinner() for _ in range(2)]
    try:
        started_at = time.monotonic()
        turn_ids = [_start_turn(user, marker) for marker in markers]
        for turn_id in turn_ids:
            user.wait(event("turn_finished", turn_id), timeout_s=120, what="turn_finished")
        took_s = time.monotonic() - started_at
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    figure("busy_turns_s", round(took_s, 1))
    late = [
        line
        for name in d.children
        if name.startswith("orchestrator")
        for line in d.log_text(name).splitlines()
        if " renewed " in line and "after the last renewal" in line
    ]
    figure("late_lease_renewals", late[-5:] or "none")

    for turn_id, marker in zip(turn_ids, markers, strict=True):
        kinds = user.kinds(turn_id)
        assert user.of(turn_id)[-1]["data"]["status"] == "completed"
        assert "turn_resumed" not in kinds, "no second runner took the turn over"
        assert kinds.count("turn_started") == 1
        assert len(_requests_with(d, marker)) == 1, "the model saw the step once"
    for name in d.children:
        if name.startswith("orchestrator"):
            assert "was taken over" not in d.log_text(name)
