"""The scheduler's Celery tasks: decode, delegate to ``ticks.py`` / ``entries.py``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy.orm import Session

from signalbox.services.scheduler import metrics
from signalbox.services.scheduler.entries import sync_alarm as store_alarm
from signalbox.services.scheduler.entries import sync_schedule as store_schedule
from signalbox.services.scheduler.state import scheduler_state
from signalbox.services.scheduler.ticks import fire_alarm, run_schedule_tick
from signalbox.services.scheduler.worker import app
from signalbox.shared.celery_app import SYNC_ALARM_TASK, SYNC_SCHEDULE_TASK
from signalbox.shared.db import Alarm, Schedule

RowT = TypeVar("RowT", Schedule, Alarm)


@app.task(name="scheduler.tick")
def tick(schedule_id: str, tick_at: str) -> str:
    """One beat tick of a schedule."""
    state = scheduler_state()
    due = datetime.fromisoformat(tick_at)
    metrics.tick_started(due)

    def resync(row: Schedule | None) -> None:
        store_schedule(app, row, schedule_id, datetime.now(UTC))

    deployment = state.settings.redis_prefix
    outcome = run_schedule_tick(
        state.sessions, state.events, app, schedule_id, due, resync, deployment
    )
    metrics.SCHEDULE_TICKS.labels(outcome).inc()
    return outcome


@app.task(name="scheduler.alarm")
def alarm(alarm_id: str, tick_at: str | None = None) -> str:
    """An alarm's time has come."""
    state = scheduler_state()
    outcome = fire_alarm(state.sessions, state.events, app, alarm_id, state.settings.redis_prefix)
    metrics.ALARMS.labels(outcome).inc()
    return outcome


def _load(model: type[RowT], row_id: str) -> RowT | None:
    session: Session
    with scheduler_state().sessions() as session:
        return session.get(model, row_id)


@app.task(name=SYNC_SCHEDULE_TASK)
def sync_schedule(schedule_id: str) -> None:
    """The gateway changed a schedule: make the beat store match its row."""
    store_schedule(app, _load(Schedule, schedule_id), schedule_id, datetime.now(UTC))


@app.task(name=SYNC_ALARM_TASK)
def sync_alarm(alarm_id: str) -> None:
    """An alarm was set or cancelled: make the beat store match its row."""
    store_alarm(app, _load(Alarm, alarm_id), alarm_id)
