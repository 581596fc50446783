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
from datetime import timedelta
from typing import Any

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

    def send_task(self, name: str, args: list[Any], queue: str) -> None:
        self.sent.append((name, args))


def _conversation_with_a_running_turn(
    sessions: sessionmaker[Session], user_id: str, deployment: str
) -> tuple[str, str]:
    with sessions() as s, s.begin():
        conversation = Conversation(id=new_id("conv"), user_id=user_id, workspace="default")
        s.add(conversation)
        s.flush()
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
        s.add(running)
        return conversation.id, running.id


def _the_earlier_turn_ends_and_admission_runs(
    sessions: sessionmaker[Session], earlier_id: str, deployment: str
) -> list[str]:
    with sessions() as s, s.begin():
        s.execute(
            update(Turn)
            .where(Turn.id == earlier_id)
            .values(status=TurnState.COMPLETED, finished_at=now())
        )
    with sessions() as s, s.begin():
        return admit(s, Limits(per_user=1, deployment=0), deployment)


def test_an_alarm_fired_behind_a_running_turn_is_admitted_when_that_turn_ends(
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
    redis_client: redis.Redis,
) -> None:
    deployment = f"sbtest-{uuid.uuid4().hex[:8]}:"  # no other test's turns in its passes
    user_id, _token = make_user()
    conversation_id, earlier_id = _conversation_with_a_running_turn(
        db_sessions, user_id, deployment
    )
    alarm_id = new_id("alarm")
    with db_sessions() as s, s.begin():
        s.add(
            Alarm(
                id=alarm_id,
                user_id=user_id,
                conversation_id=conversation_id,
                wake_at=now(),
                note="check the build",
            )
        )
    celery = SentTasks()
    events = EventStream(redis_client, RedisKeys(deployment))

    outcome = fire_alarm(db_sessions, events, celery, alarm_id, deployment)  # type: ignore[arg-type]

    assert outcome == "fired"
    with db_sessions() as s:
        alarm_turn = s.scalars(select(Turn).where(Turn.client_turn_id == f"alarm:{alarm_id}")).one()
        assert alarm_turn.deployment == deployment
        assert alarm_turn.status == TurnState.QUEUED
        assert anyone_waiting(s, deployment)
    assert celery.sent == [(RUN_TURN_TASK, [alarm_turn.id])]
    assert _the_earlier_turn_ends_and_admission_runs(db_sessions, earlier_id, deployment) == [
        alarm_turn.id
    ]


def test_a_schedule_tick_behind_a_running_turn_is_admitted_when_that_turn_ends(
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
    redis_client: redis.Redis,
) -> None:
    deployment = f"sbtest-{uuid.uuid4().hex[:8]}:"
    user_id, _token = make_user()
    conversation_id, earlier_id = _conversation_with_a_running_turn(
        db_sessions, user_id, deployment
    )
    schedule_id = new_id("sched")
    tick_at = now().replace(microsecond=0) - timedelta(seconds=1)
    with db_sessions() as s, s.begin():
        s.add(
            Schedule(
                id=schedule_id,
                user_id=user_id,
                conversation_id=conversation_id,
                prompt="the morning report",
                kind="interval",
                interval_s=3600,
            )
        )
    celery = SentTasks()
    events = EventStream(redis_client, RedisKeys(deployment))

    outcome = run_schedule_tick(
        db_sessions,
        events,
        celery,  # type: ignore[arg-type]
        schedule_id,
        tick_at,
        lambda _row: None,
        deployment,
    )

    assert outcome == "started"
    with db_sessions() as s:
        tick_turn = s.scalars(
            select(Turn).where(Turn.conversation_id == conversation_id, Turn.id != earlier_id)
        ).one()
        assert tick_turn.deployment == deployment
    assert _the_earlier_turn_ends_and_admission_runs(db_sessions, earlier_id, deployment) == [
        tick_turn.id
    ]
