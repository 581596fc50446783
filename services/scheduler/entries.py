"""SQL rows → RedBeat entries: the beat store is a cache of ``schedules`` and ``alarms``.

``interval`` schedules are celery ``schedule`` entries; ``at``, ``cron`` and alarms are
one-shot ``rrule`` entries at the next fire time (``shared/schedule_times.py``), re-written
after each cron tick. Entries are named ``schedule:<id>`` / ``alarm:<id>``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from celery.schedules import schedule as every
from redbeat import RedBeatSchedulerEntry
from redbeat.schedulers import ensure_conf
from redbeat.schedules import rrule

from signalbox.shared.db import Alarm, Schedule
from signalbox.shared.db.models import as_utc
from signalbox.shared.schedule_times import interval_tick, next_cron_fire

# How many missed cron times a start-up walks to find the latest (a week of minutes).
MAX_MISSED_WALK = 7 * 24 * 60
TICK_TASK = "scheduler.tick"
ALARM_TASK = "scheduler.alarm"


def schedule_entry_name(schedule_id: str) -> str:
    """The RedBeat entry name of a schedule."""
    return f"schedule:{schedule_id}"


def alarm_entry_name(alarm_id: str) -> str:
    """The RedBeat entry name of an alarm."""
    return f"alarm:{alarm_id}"


def _one_shot(at: datetime) -> Any:
    return rrule("SECONDLY", dtstart=as_utc(at).replace(microsecond=0), count=1)


def _delete(app: Celery, name: str) -> None:
    ensure_conf(app)  # outside the beat (a worker's sync task) RedBeat's config is not loaded
    try:
        RedBeatSchedulerEntry.from_key(RedBeatSchedulerEntry.generate_key(app, name), app=app)
    except KeyError:
        return
    RedBeatSchedulerEntry(name, app=app).delete()


def _save(app: Celery, name: str, task: str, args: list[str], sched: Any, last: datetime) -> None:
    entry = RedBeatSchedulerEntry(name, task, sched, args=args, app=app)
    entry.last_run_at = last
    entry.save()


def first_fire(row: Schedule, now: datetime) -> datetime | None:
    """When a (re)synced one-shot or cron schedule fires next; None: not any more.

    A time missed while everything was down fires once now when ``catch_up``, else the
    schedule goes on from its next time (an ``at`` is then over).
    """
    last = as_utc(row.last_tick_at) if row.last_tick_at else None
    if row.kind == "at" and row.at is not None:
        at = as_utc(row.at)
        if last is not None and last >= at.replace(microsecond=0):
            return None
        return at if at > now or row.catch_up else None
    if row.kind == "cron" and row.cron:
        base = last or as_utc(row.created_at)
        due = next_cron_fire(
            row.cron, row.timezone, base, row.active_from_hour, row.active_until_hour
        )
        if due > now:
            return due
        if not row.catch_up:
            return next_cron_fire(
                row.cron, row.timezone, now, row.active_from_hour, row.active_until_hour
            )
        # Caught up once, at the latest missed time: the next after it is in the future.
        for _ in range(MAX_MISSED_WALK):
            later = next_cron_fire(
                row.cron, row.timezone, due, row.active_from_hour, row.active_until_hour
            )
            if later > now:
                break
            due = later
        return due
    return None


def sync_schedule(app: Celery, row: Schedule | None, schedule_id: str, now: datetime) -> None:
    """Make the beat store hold exactly what ``row`` says (None or paused: nothing)."""
    name = schedule_entry_name(schedule_id)
    if row is None or row.paused:
        _delete(app, name)
        return
    if row.kind == "interval" and row.interval_s:
        interval = timedelta(seconds=row.interval_s)
        last = as_utc(row.last_tick_at) if row.last_tick_at else as_utc(row.created_at)
        if not row.catch_up and last + interval < now:
            last = now  # the missed ticks are skipped: the next is one interval from now
        _delete(app, name)  # a fresh meta: save() keeps an existing last_run_at
        _save(app, name, TICK_TASK, [schedule_id], every(interval), last)
        return
    due = first_fire(row, now)
    _delete(app, name)
    if due is not None:
        _save(app, name, TICK_TASK, [schedule_id], _one_shot(due), due - timedelta(days=1))


def sync_alarm(app: Celery, row: Alarm | None, alarm_id: str) -> None:
    """A pending alarm is a one-shot entry; any other is none (a missed one fires on start)."""
    name = alarm_entry_name(alarm_id)
    _delete(app, name)
    if row is not None and row.status == "pending":
        wake = as_utc(row.wake_at)
        _save(app, name, ALARM_TASK, [alarm_id], _one_shot(wake), wake - timedelta(days=1))


def nominal_tick(entry: RedBeatSchedulerEntry, now: datetime) -> datetime:
    """The tick time a due entry stands for: a one-shot's own time, an interval's previous
    run plus its interval. Both come from the shared store, so any beat names the same."""
    sched = entry.schedule
    if isinstance(sched, rrule):
        start: datetime = sched.dtstart  # RedBeat's own field (dateutil's is private)
        return as_utc(start).replace(microsecond=0)
    last = entry.last_run_at
    run_every: timedelta = sched.run_every
    return interval_tick(
        None if last is None else as_utc(last), int(run_every.total_seconds()), now
    )
