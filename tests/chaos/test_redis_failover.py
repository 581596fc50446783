"""Redis failover drill: the master is SIGKILLed under load and Sentinel promotes the replica.

The whole deployment (gateway, proposals, 2 orchestrators, 2 tool workers) runs on a
``redis+sentinel://`` URL (tests/sentinel_cluster.py: a master, a replica, three sentinels),
with the chaos suite's short leases and the fake Messages API. Clients run turns with a tool
call back to back in several conversations; mid-load the master is killed. Then: the
services continue on the promoted replica, every turn finishes (completed, or failed with
a status, never stuck), no client gets an event twice, and the figures are printed
(``pytest -s``): seconds until the promotion, until the first event and the first turn
after it, and the events clients had received that the new master no longer holds.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from websockets.exceptions import ConnectionClosed

from signalbox.processes import wait_until
from signalbox.redis_server import RedisServer
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.models import ToolCall
from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.statuses import UNFINISHED_TURNS, CallState, TurnState
from signalbox.stack import Stack, StackConfig
from tests.databases import database_for
from tests.fake_anthropic import FakeAnthropic, text, tool_use
from tests.sentinel_cluster import SentinelCluster, start_sentinel_cluster

from .conftest import Chaos, Client, stack_env

CONVERSATIONS = 4  # concurrent clients, each running turns back to back
LOAD_AFTER_KILL_S = 10.0  # new turns keep coming this long after the kill
TURN_WAIT_S = 60.0  # a turn not finished within this (from its submission) is stuck
RETRY_S = 0.5  # a client's back-off before submitting again after `unavailable`
FAILOVER_WAIT_S = 60.0
FINISHED = set(TurnState) - set(UNFINISHED_TURNS)
OPEN_CALLS = (CallState.PENDING, CallState.NEEDS_DECISION, CallState.RUNNING, CallState.WAITING)


@dataclass
class Drill:
    chaos: Chaos
    cluster: SentinelCluster
    var: Path


@pytest.fixture(scope="module")
def drill(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, internal_token: str
) -> Iterator[Drill]:
    var = tmp_path_factory.mktemp("failover")
    cluster = start_sentinel_cluster(var / "redis")
    database_url = database_for(request, var, "failover")
    engine = make_engine(database_url)
    fake = FakeAnthropic().start()
    config = StackConfig(
        var_dir=var,
        redis_url=cluster.url,
        database_url=database_url,
        internal_token=internal_token,
        orchestrators=2,
        tools_workers=2,
        extra_env=stack_env(fake),
    )
    config.workspaces_root.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(
        stack=Stack(config),
        redis_server=RedisServer(url=cluster.url),
        redis_dir=var / "redis",
        sessions=make_session_factory(engine),
        fake=fake,
        keys=RedisKeys(config.redis_prefix),
        redis=sync_client(cluster.url, socket_timeout=5),
    )
    try:
        chaos.start("proposals", "gateway", "tools1", "tools2", "orchestrator1", "orchestrator2")
        yield Drill(chaos, cluster, var)
    finally:
        chaos.stop()
        chaos.redis.close()
        fake.stop()
        cluster.stop()
        engine.dispose()


@dataclass
class Load:
    """One client running turns in one conversation until told to stop; keeps every event
    it receives (over every socket it had to open) and the fate of every turn."""

    chaos: Chaos
    token: str
    name: str
    conversation_id: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    submitted: dict[str, float] = field(default_factory=dict)  # turn id -> when (monotonic)
    finished: dict[str, tuple[str, float]] = field(default_factory=dict)  # -> status, when
    stuck: list[str] = field(default_factory=list)
    unavailable: int = 0  # submissions answered `unavailable` (retried)
    reconnects: int = 0
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = Client(self.chaos, self.token)

    def _reconnect(self) -> None:
        self.events.extend(self.client.events)
        self.client.events.clear()
        self.reconnects += 1
        with contextlib.suppress(Exception):  # the socket is already broken
            self.client.close()
        deadline = time.monotonic() + TURN_WAIT_S
        while True:
            try:
                self.client = Client(self.chaos, self.token)
                if self.conversation_id is not None:
                    after = self.events[-1]["id"] if self.events else None
                    frame: dict[str, Any] = {
                        "type": "subscribe",
                        "conversation_id": self.conversation_id,
                    }
                    if after:
                        frame["after"] = after
                    reply = self.client.request(frame)
                    if reply["type"] != "ack":
                        raise ConnectionError(reply)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(RETRY_S)

    def _submit(self, marker: str) -> str:
        frame: dict[str, Any] = {"type": "user_turn", "text": f"please work on {marker}"}
        frame["client_turn_id"] = marker  # a retried submission makes one turn
        if self.conversation_id is not None:
            frame["conversation_id"] = self.conversation_id
        deadline = time.monotonic() + TURN_WAIT_S
        while True:
            try:
                reply = self.client.request(frame)
            except (ConnectionClosed, AssertionError, TimeoutError, OSError):
                self._reconnect()
                continue
            if reply["type"] == "ack":
                self.conversation_id = reply["conversation_id"]
                return str(reply["turn_id"])
            if reply.get("code") != "unavailable" or time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: submission refused: {reply}")
            self.unavailable += 1
            time.sleep(RETRY_S)  # a client's back-off, as a real one would

    def _all_events(self) -> list[dict[str, Any]]:
        return [*self.events, *self.client.events]

    def _wait_finished(self, turn_id: str) -> None:
        deadline = self.submitted[turn_id] + TURN_WAIT_S
        while True:
            for e in self._all_events():
                if e["kind"] == "turn_finished" and e["turn_id"] == turn_id:
                    self.finished[turn_id] = (e["data"]["status"], time.monotonic())
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                self.stuck.append(turn_id)
                return
            try:
                self.client.wait(
                    lambda e: e["kind"] == "turn_finished" and e["turn_id"] == turn_id,
                    timeout_s=left,
                )
            except AssertionError:
                continue  # the deadline: checked above
            except (ConnectionClosed, TimeoutError, OSError):
                self._reconnect()

    def run(self, stop: threading.Event) -> None:
        try:
            i = 0
            while not stop.is_set():
                marker = f"{self.name}-{i}-{uuid.uuid4().hex[:6]}"
                self.chaos.fake.script_for(
                    marker,
                    [
                        [text("Working."), tool_use("sleep", {"seconds": 0.3})],
                        [text(f"Done with {marker}.")],
                    ],
                )
                submitted = time.monotonic()
                turn_id = self._submit(marker)
                self.submitted[turn_id] = submitted
                self._wait_finished(turn_id)
                i += 1
        except Exception as exc:
            self.problems.append(f"{type(exc).__name__}: {exc}")
        finally:
            self.events.extend(self.client.events)
            self.client.events.clear()
            self.client.close()


def _stream_ids(drill: Drill, conversation_id: str) -> set[str]:
    entries: Any = drill.chaos.redis.xrange(drill.chaos.keys.events(conversation_id))
    return {eid.decode() if isinstance(eid, bytes) else str(eid) for eid, _ in entries}


@pytest.mark.timeout(420)
def test_services_continue_on_the_promoted_replica_when_the_master_is_killed(
    drill: Drill,
) -> None:
    chaos, cluster = drill.chaos, drill.cluster
    loads = [Load(chaos, chaos.new_user()[1], f"load{i}") for i in range(CONVERSATIONS)]
    stop = threading.Event()
    threads = [threading.Thread(target=load.run, args=(stop,), daemon=True) for load in loads]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: all(load.finished for load in loads), FAILOVER_WAIT_S, "a turn in each")
        old = cluster.master_port()
        assert old == cluster.master.port
        killed_at = time.monotonic()
        cluster.master.kill()
        new_port = wait_until(lambda: cluster.promoted(old), FAILOVER_WAIT_S, "a promotion")
        promoted_s = time.monotonic() - killed_at
        assert new_port == cluster.replica.port

        def first_turn_after_kill() -> float:
            times = [
                at - killed_at
                for load in loads
                for turn_id, (status, at) in list(load.finished.items())
                if load.submitted[turn_id] > killed_at + promoted_s and status == "completed"
            ]
            return min(times) if times else 0.0  # 0.0: none yet (a turn takes longer)

        turn_after_s: float = wait_until(
            first_turn_after_kill, TURN_WAIT_S, "a turn after the failover"
        )
        wait_until(
            lambda: time.monotonic() > killed_at + LOAD_AFTER_KILL_S,
            LOAD_AFTER_KILL_S + 1,
            "the load to run on",
            interval_s=0.2,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=TURN_WAIT_S + 10)
    assert not any(t.is_alive() for t in threads), "a client is stuck"

    # Every turn of the database ended, every turn a client submitted ended for that client.
    wait_until(lambda: not chaos.unfinished_turns(), TURN_WAIT_S, "every turn to finish")
    for load in loads:
        assert not load.problems, (load.name, load.problems)
        assert not load.stuck, (load.name, load.stuck, [chaos.turn(t).status for t in load.stuck])
        assert set(load.finished) == set(load.submitted), load.name
        for turn_id, (status, _at) in load.finished.items():
            assert status in FINISHED, (turn_id, status)
            assert chaos.turn(turn_id).status == status, turn_id
    with chaos.sessions() as s:
        open_calls = s.scalars(select(ToolCall).where(ToolCall.status.in_(OPEN_CALLS))).all()
    assert not open_calls, [(c.id, c.status) for c in open_calls]

    # No event reached a client twice (over every socket it opened); ids only increase.
    for load in loads:
        ids = [e["id"] for e in load.events]
        assert len(ids) == len(set(ids)), f"{load.name}: an event reached the client twice"

    for name, child in chaos.children.items():
        assert child.alive(), f"{name} died:\n{child.log_tail()}"

    # What the failover took away: events clients had received that the new master lacks.
    lost = {
        load.name: sorted({e["id"] for e in load.events} - _stream_ids(drill, load.conversation_id))
        for load in loads
        if load.conversation_id is not None
    }
    statuses = [status for load in loads for status, _at in load.finished.values()]
    figures = {
        "promoted_s": round(promoted_s, 2),
        "first_turn_after_failover_s": round(turn_after_s, 2),
        "turns": len(statuses),
        "completed": statuses.count("completed"),
        "failed": statuses.count("failed"),
        "submissions_unavailable": sum(load.unavailable for load in loads),
        "reconnects": sum(load.reconnects for load in loads),
        "events_received": sum(len(load.events) for load in loads),
        "events_lost_from_redis": sum(len(ids) for ids in lost.values()),
        "calls_lost": _calls_with(chaos, CallState.LOST),
        "slowest_turn_s": round(
            max(at - load.submitted[t] for load in loads for t, (_s, at) in load.finished.items()),
            2,
        ),
        # Turns whose Celery message or runner the failover took, re-enqueued from SQL.
        "turns_repaired_by_reconciler": sum(
            chaos.log_text(name).count(line)
            for name in chaos.children
            if name.startswith("orchestrator")
            for line in ("may have lost its message", "is running without a runner")
        ),
    }
    (drill.var / "failover.json").write_text(json.dumps(figures, indent=2))
    print(f"\nREDIS FAILOVER DRILL: {json.dumps(figures)}")
    assert figures["completed"] > 0


def _calls_with(chaos: Chaos, status: str) -> int:
    with chaos.sessions() as s:
        return len(s.scalars(select(ToolCall.id).where(ToolCall.status == status)).all())
