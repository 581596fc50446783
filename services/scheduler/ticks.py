"""What a tick does: claim (schedule, tick time) in SQL, then start the turn.

Plain functions over a session factory, Redis events and a Celery app, so they run in the
scheduler worker's task and in tests alike. The claim is the ``schedule_runs`` row: its
unique (schedule_id, tick_at) means a duplicate tick — a second beat that lost its lock,
a redelivered message — finds the row and starts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from celery import Celery
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.scheduler.turns import CannotStart, StartedTurn, store_turn
from signalbox.shared.celery_app import send_run_turn
from signalbox.shared.db import Alarm, Schedule, ScheduleRun
from signalbox.shared.db.models import now
from signalbox.shared.event_stream import EventStream
from signalbox.shared.ids import new_id
from signalbox.shared.schedule_times import in_active_hours, zone

log = logging.getLogger(__name__)


def _announce(events: EventStream, celery: Celery, started: StartedTurn, text: str) -> None:
    conversation = started.conversation
    if started.new_conversation:
        data: dict[str, object] = {"workspace": conversation.workspace, "title": conversation.title}
        if conversation.agent_name is not None:
            data.update(agent=conversation.agent_name, agent_version=conversation.agent_version)
        events.append(conversation.id, "conversation_created", data)
    events.append(
        conversation.id,
        "turn_queued",
        {"text": text, "client_turn_id": started.client_turn_id},
        started.turn_id,
    )
    send_run_turn(celery, started.turn_id)


def run_schedule_tick(
    sessions: sessionmaker[Session],
    events: EventStream,
    celery: Celery,
    schedule_id: str,
    tick_at: datetime,
    resync: Callable[[Schedule | None], None],
    deployment: str,
) -> str:
    """Run one tick once: ``started`` | ``duplicate`` | ``skipped`` | ``failed`` | ``gone``.
    ``deployment``: the Redis prefix whose queues run its turn."""
    with sessions() as session:
        row = session.get(Schedule, schedule_id)
        if row is None or row.paused:
            return "gone"
        run = ScheduleRun(
            id=new_id("srun"), schedule_id=schedule_id, tick_at=tick_at, status="started"
        )
        session.add(run)
        try:
            session.flush()
        except IntegrityError:
            return "duplicate"
        row.last_tick_at = tick_at
        started: StartedTurn | None = None
        if not in_active_hours(
            tick_at, zone(row.timezone), row.active_from_hour, row.active_until_hour
        ):
            run.status = "skipped"
        else:
            try:
                with session.begin_nested():
                    started = store_turn(
                        session,
                        row.user_id,
                        row.conversation_id,
                        row.prompt,
                        f"schedule:{schedule_id}:{tick_at.isoformat()}",
                        deployment=deployment,
                        workspace=row.workspace,
                        agent=row.agent,
                    )
                run.conversation_id = started.conversation.id
                run.turn_id = started.turn_id
            except CannotStart as exc:
                run.status, run.error = "failed", str(exc)
        session.commit()
        if row.kind != "interval":
            resync(row)  # a cron's next time; an ``at`` is over
    if started is not None and started.created:
        _announce(events, celery, started, row.prompt)
    return run.status


def fire_alarm(
    sessions: sessionmaker[Session],
    events: EventStream,
    celery: Celery,
    alarm_id: str,
    deployment: str,
) -> str:
    """Start the alarm's turn once: ``fired`` | ``not_pending`` | ``failed``.
    ``deployment``: the Redis prefix whose queues run its turn."""
    with sessions() as session:
        claimed = session.execute(
            update(Alarm)
            .where(Alarm.id == alarm_id, Alarm.status == "pending")
            .values(status="fired", fired_at=now())
        ).rowcount  # type: ignore[attr-defined]
        if not claimed:
            return "not_pending"
        alarm = session.scalars(select(Alarm).where(Alarm.id == alarm_id)).one()
        text = f"[alarm] {alarm.note}"
        try:
            started = store_turn(
                session,
                alarm.user_id,
                alarm.conversation_id,
                text,
                f"alarm:{alarm_id}",
                deployment=deployment,
            )
        except CannotStart as exc:
            log.warning("alarm %s cannot start its turn: %s", alarm_id, exc)
            alarm.status = "failed"
            session.commit()
            return "failed"
        alarm.turn_id = started.turn_id
        session.commit()
    if started.created:
        _announce(events, celery, started, text)
    return "fired"
