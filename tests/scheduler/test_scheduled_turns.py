"""A turn the scheduler starts waits for its conversation's running turn, then is admitted.

The scheduler sends ``run_turn`` at once; the orchestrator finds an earlier turn of the
conversation unfinished and leaves the new one queued, for the admission pass that follows
the earlier turn's end. That pass sees only its own deployment's turns: a scheduled turn
stored without a deployment was never admitted and stayed ``queued`` for good (found when
the stack's services started together: tests/scheduler/test_alarm_restart.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.scheduler.ticks import fire_alarm, run_schedule_tick
from signalbox.shared.admission import Limits, admit, anyone_waiting
from signalbox.shared.celery_app import RUN_TURN_TASK
from signalbox.shared.db import Alarm, Conversation, Schedule, Turn
from signalbox.shared.db.models import now
from signalbox.shared.event_stream import EventStream
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.statuses import TurnState


class SentTasks:
    """Celery's ``send_task``, recorded (the orchestrator is not what is tested here)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any]]] = []

    def send_task(
        self, name: str, args: list[Any], queue: str, ignore_result: bool = False
    ) -> None:
        self.sent.append((name, args))


@dataclass(frozen=True)
class Scene:
    """A user's conversation whose turn is running, on a deployment of the test's own (no
    other test's turns in its admission passes), and what the scheduler's calls are given."""

    sessions: sessionmaker[Session]
    deployment: str
    user_id: str
    conversation_id: str
    earlier_id: str  # the running turn
    events: EventStream
    celery: SentTasks

    def add(self, row: Alarm | Schedule) -> None:
        with self.sessions() as s, s.begin():
            s.add(row)

    def the_earlier_turn_ends_and_admission_runs(self) -> list[str]:
        with self.sessions() as s, s.begin():
            s.execute(
                update(Turn)
                .where(Turn.id == self.earlier_id)
                .values(status=TurnState.COMPLETED, finished_at=now())
            )
        with self.sessions() as s, s.begin():
            return admit(s, Limits(per_user=1, deployment=0), self.deployment)


@pytest.fixture
def scene(
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
    redis_client: redis.Redis,
) -> Scene:
    deployment = f"sbtest-{uuid.uuid4().hex[:8]}:"
    user_id, _token = make_user()
    conversation = Conversation(id=new_id("conv"), user_id=user_id, workspace="default")
    running = Turn(
        id=new_id("turn"),
        conversation_id=conversation.id,
        user_id=user_id,
        seq=1,
        text="a long task",
        status=TurnState.RUNNING,
        deployment=deployment,
        admitted_at=now(),
        started_at=now(),
    )
    with db_sessions() as s, s.begin():
        s.add(conversation)
        s.flush()
        s.add(running)
    events = EventStream(redis_client, RedisKeys(deployment))
    return Scene(db_sessions, deployment, user_id, conversation.id, running.id, events, SentTasks())


def test_an_alarm_fired_behind_a_running_turn_is_admitted_when_that_turn_ends(
    scene: Scene,
) -> None:
    alarm_id = new_id("alarm")
    scene.add(
        Alarm(
            id=alarm_id,
            user_id=scene.user_id,
            conversation_id=scene.conversation_id,
            wake_at=now(),
            note="check the build",
        )
    )

    outcome = fire_alarm(
        scene.sessions,
        scene.events,
        scene.celery,  # type: ignore[arg-type]
        alarm_id,
        scene.deployment,
    )

    assert outcome == "fired"
    with scene.sessions() as s:
        alarm_turn = s.scalars(select(Turn).where(Turn.client_turn_id == f"alarm:{alarm_id}")).one()
        assert alarm_turn.deployment == scene.deployment
        assert alarm_turn.status == TurnState.QUEUED
        assert anyone_waiting(s, scene.deployment)
    assert scene.celery.sent == [(RUN_TURN_TASK, [alarm_turn.id])]
    assert scene.the_earlier_turn_ends_and_admission_runs() == [alarm_turn.id]


def test_a_schedule_tick_behind_a_running_turn_is_admitted_when_that_turn_ends(
    scene: Scene,
) -> None:
    schedule_id = new_id("sched")
    scene.add(
        Schedule(
            id=schedule_id,
            user_id=scene.user_id,
            conversation_id=scene.conversation_id,
            prompt="the morning report",
            kind="interval",
            interval_s=3600,
        )
    )
    tick_at = now().replace(microsecond=0) - timedelta(seconds=1)

    outcome = run_schedule_tick(
        scene.sessions,
        scene.events,
        scene.celery,  # type: ignore[arg-type]
        schedule_id,
        tick_at,
        lambda _row: None,
        scene.deployment,
    )

    assert outcome == "started"
    with scene.sessions() as s:
        tick_turn = s.scalars(
            select(Turn).where(
                Turn.conversation_id == scene.conversation_id, Turn.id != scene.earlier_id
            )
        ).one()
        assert tick_turn.deployment == scene.deployment
    assert scene.celery.sent == [(RUN_TURN_TASK, [tick_turn.id])]
    assert scene.the_earlier_turn_ends_and_admission_runs() == [tick_turn.id]
