"""The orchestrator as it runs: a real Celery worker process (threads pool, demo model), a
tools worker process (prefork; the stand-in of ``standin_tools_worker``), Redis and SQL."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.processes import (
    Child,
    ServiceCommands,
    child_env,
    log_contains,
    python_module,
    stop_together,
)
from signalbox.services.orchestrator.demo_model import DEMO_LABEL
from signalbox.shared.celery_app import RUN_TURN_TASK, make_celery
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.event_stream import EventStream
from signalbox.shared.events import Event
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings
from signalbox.shared.tool_contract import read_catalogue

from .conftest import UNROUTABLE_BASE_URL
from .standin_tools_worker import gate_key, latch_key
from .support import make_conversation, make_turn, wait_for

REPO = Path(__file__).resolve().parents[2]
LEASE_S = 2.0  # a dead runner's turn is picked up again within about twice this


def _orchestrator(env: dict[str, str], logs: Path, name: str) -> Child:
    args = ServiceCommands(orchestrator_concurrency=4).orchestrator(f"{name}@%h")
    return Child(name, args, logs / f"{name}.log", env)


@dataclass
class Deployment:
    keys: RedisKeys
    client: Celery
    redis: redis.Redis
    children: list[Child]
    env: dict[str, str]
    logs: Path

    def events(self, conversation_id: str) -> list[Event]:
        return EventStream(self.redis, self.keys).read_after(conversation_id, None)


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, redis_prefix: str, database_url: str
) -> Iterator[Deployment]:
    prefix = f"{redis_prefix}orchproc:"
    logs = tmp_path_factory.mktemp("orchestrator-processes")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env = child_env(
        base,
        {
            "SIGNALBOX_REDIS_URL": redis_url,
            "SIGNALBOX_REDIS_PREFIX": prefix,
            "SIGNALBOX_DATABASE_URL": database_url,
            "ANTHROPIC_API_KEY": "",  # the offline demo model
            "ANTHROPIC_BASE_URL": UNROUTABLE_BASE_URL,
            "PYTHONPATH": str(REPO),
            "SIGNALBOX_LEASE_S": str(LEASE_S),
            # Renewed 4 times a lease: a runner stalled 1.5 s on loaded cores keeps it.
            "SIGNALBOX_LEASE_RENEW_S": str(LEASE_S / 4),
        },
    )
    orchestrator = _orchestrator(env, logs, "orchestrator1")
    tools_args = python_module(
        "celery", "-A", "tests.orchestrator.standin_tools_worker:app", "worker",
        "-Q", "tools", "--pool", "prefork", "-c", "2", "-n", "standin@%h",
        "--without-gossip", "--without-mingle", "--loglevel", "INFO",
    )  # fmt: skip
    tools = Child("standin-tools", tools_args, logs / "tools.log", env)
    children = [orchestrator, tools]
    keys = RedisKeys(prefix)
    client = redis.Redis.from_url(redis_url)
    try:
        for child in children:
            child.start()
        for child in children:
            child.wait_ready(log_contains(child, " ready."))
        wait_for(lambda: "list_dir" in read_catalogue(client, keys), what="the tool catalogue")
        app = make_celery(
            "orchestrator-test-client",
            CommonSettings(redis_url=redis_url, redis_prefix=prefix, database_url=database_url),
        )
        yield Deployment(keys, app, client, children, env, logs)
    finally:
        stop_together(children)
        client.close()


def test_a_turn_runs_across_processes_with_parallel_tools(
    deployment: Deployment,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    d = deployment
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    turn_id = make_turn(db_sessions, conversation_id, user_id, "please look around", seq=1)
    d.redis.set(gate_key(d.keys, turn_id), "1", ex=60)  # tools hold until the test lets go

    first = d.client.send_task(RUN_TURN_TASK, args=[turn_id])

    def started() -> int:
        return sum(e.kind == "tool_call_started" for e in d.events(conversation_id))

    wait_for(lambda: started() == 2, timeout_s=30, what="both tool calls to start")
    second = d.client.send_task(RUN_TURN_TASK, args=[turn_id])
    assert second.get(timeout=30) == "leased", "a second delivery while leased does nothing"

    d.redis.rpush(latch_key(d.keys, turn_id), "go", "go")
    assert first.get(timeout=30) == "completed"

    events = d.events(conversation_id)
    kinds = [e.kind for e in events]
    assert kinds.count("turn_started") == 1 and "turn_resumed" not in kinds
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_finished"
    assert kinds.index("text_delta") < kinds.index("assistant_message")
    starts = [i for i, k in enumerate(kinds) if k == "tool_call_started"]
    finishes = [i for i, k in enumerate(kinds) if k == "tool_call_finished"]
    assert len(starts) == 2 and len(finishes) == 2
    assert max(starts) < min(finishes), "both calls start before either finishes"
    finished = [e.data for e in events if e.kind == "tool_call_finished"]
    assert {(f["tool"], f["status"]) for f in finished} == {
        ("list_dir", "ok"),
        ("search_files", "ok"),
    }
    first_text = next(e.data["text"] for e in events if e.kind == "assistant_message")
    assert first_text.startswith(DEMO_LABEL)
    done = events[-1].data
    assert done["status"] == "completed" and done["steps"] == 2
    assert done["usage"]["input_tokens"] > 0
    assert all(e.turn_id == turn_id for e in events)
    with db_sessions() as s:
        turn = s.get(Turn, turn_id)
        assert turn is not None and turn.status == "completed"


def test_the_orchestrator_process_listens_for_approvals(deployment: Deployment) -> None:
    d = deployment

    def subscribers() -> int:
        counts: Any = d.redis.pubsub_numsub(d.keys.approvals_channel)  # [(channel, n)]
        return int(counts[0][1])

    # The approvals feed subscribes when the worker starts (tasks.py, worker_ready).
    wait_for(lambda: subscribers() == 1, what="the orchestrator's approvals feed")


def test_a_turn_resumes_on_another_orchestrator_after_its_runner_dies(
    deployment: Deployment,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    d = deployment
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    turn_id = make_turn(db_sessions, conversation_id, user_id, "look around", seq=1)
    d.redis.set(gate_key(d.keys, turn_id), "1", ex=60)
    d.client.send_task(RUN_TURN_TASK, args=[turn_id])

    def kinds() -> list[str]:
        return [e.kind for e in d.events(conversation_id)]

    wait_for(lambda: kinds().count("tool_call_started") == 2, timeout_s=30, what="calls to start")
    dying = next(c for c in d.children if c.name.startswith("orchestrator") and c.alive())
    dying.signal_group(signal.SIGKILL)
    assert dying.process is not None
    dying.process.wait(timeout=10)

    successor = _orchestrator(d.env, d.logs, f"orchestrator{len(d.children)}")
    d.children.append(successor)
    successor.start()
    successor.wait_ready(log_contains(successor, " ready."))
    wait_for(lambda: "turn_resumed" in kinds(), timeout_s=30, what="the turn to resume")
    d.redis.rpush(latch_key(d.keys, turn_id), "go", "go")
    wait_for(lambda: "turn_finished" in kinds(), timeout_s=30, what="the turn to finish")

    events = d.events(conversation_id)
    assert [e.data for e in events if e.kind == "turn_resumed"] == [{"step": 1}]
    assert kinds().count("tool_call_started") == 2, "running calls are awaited, not re-sent"
    assert sorted(e.data["status"] for e in events if e.kind == "tool_call_finished") == [
        "ok",
        "ok",
    ]
    assert events[-1].data["status"] == "completed"
    with db_sessions() as s:
        calls = s.scalars(select(ToolCall).where(ToolCall.turn_id == turn_id)).all()
        assert [c.attempts for c in calls] == [1, 1]
