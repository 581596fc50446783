"""Schedules and alarms as an owner sees them: validate, store in SQL (the truth), then ask
the scheduler to sync its beat store (``scheduler.sync_*``; its start-up sync catches any
message lost on the way)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import anyio
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import BadInput
from signalbox.services.gateway.ownership import (
    owned_alarm,
    owned_conversation,
    owned_schedule,
    visible_agent,
)
from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.workspaces import (
    checked_workspace,
    ensure_workspace,
    make_workspace_dir,
)
from signalbox.shared.agents import DEFAULT_AGENT
from signalbox.shared.celery_app import SCHEDULER_QUEUE, SYNC_ALARM_TASK, SYNC_SCHEDULE_TASK
from signalbox.shared.db import Alarm, Schedule, ScheduleRun, User
from signalbox.shared.db.models import as_utc
from signalbox.shared.ids import new_id
from signalbox.shared.schedule_times import BadSchedule, check_cron, check_hours, zone
from signalbox.shared.schedules_api import (
    AlarmOut,
    ScheduleIn,
    ScheduleOut,
    SchedulePatch,
    ScheduleRunOut,
)

log = logging.getLogger(__name__)

RUNS_SHOWN = 50


def schedule_out(row: Schedule) -> ScheduleOut:
    """The wire form of a schedule row."""
    return ScheduleOut(
        id=row.id, name=row.name, kind=row.kind,
        interval_s=row.interval_s, at=as_utc(row.at) if row.at else None, cron=row.cron,
        timezone=row.timezone, active_from_hour=row.active_from_hour,
        active_until_hour=row.active_until_hour, prompt=row.prompt,
        conversation_id=row.conversation_id, workspace=row.workspace, agent=row.agent,
        catch_up=row.catch_up, paused=row.paused, created_at=as_utc(row.created_at),
        last_tick_at=as_utc(row.last_tick_at) if row.last_tick_at else None,
    )  # fmt: skip


def alarm_out(row: Alarm) -> AlarmOut:
    """The wire form of an alarm row."""
    return AlarmOut(
        id=row.id, conversation_id=row.conversation_id, wake_at=as_utc(row.wake_at),
        note=row.note, status=row.status, turn_id=row.turn_id,
        created_at=as_utc(row.created_at),
        fired_at=as_utc(row.fired_at) if row.fired_at else None,
    )  # fmt: skip


def _checked(spec: ScheduleIn) -> None:
    try:
        zone(spec.timezone)
        check_hours(spec.active_from_hour, spec.active_until_hour)
        if spec.kind == "cron":
            check_cron(spec.cron or "")
    except BadSchedule as exc:
        raise BadInput(str(exc)) from exc
    if spec.kind == "interval" and spec.interval_s is None:
        raise BadInput("an interval schedule needs interval_s")
    if spec.kind == "at" and spec.at is None:
        raise BadInput("an at schedule needs at (RFC 3339)")
    if spec.at is not None and spec.at.tzinfo is None:
        raise BadInput("at needs a time zone offset (RFC 3339)")


def _insert(session: Session, user_id: str, spec: ScheduleIn) -> Schedule:
    _checked(spec)
    workspace = None
    if spec.conversation_id is not None:
        owned_conversation(session, user_id, spec.conversation_id)
    else:
        user = session.get(User, user_id)
        workspace = checked_workspace(spec.workspace or (user.selected_workspace if user else ""))
        ensure_workspace(session, user_id, workspace)
        if spec.agent is not None and spec.agent != DEFAULT_AGENT:
            visible_agent(session, user_id, spec.agent)  # unknown: refused now, not at a tick
    row = Schedule(
        id=new_id("sched"), user_id=user_id, name=spec.name, kind=spec.kind,
        interval_s=spec.interval_s if spec.kind == "interval" else None,
        at=spec.at.astimezone(UTC) if spec.kind == "at" and spec.at else None,
        cron=spec.cron if spec.kind == "cron" else None, timezone=spec.timezone,
        active_from_hour=spec.active_from_hour, active_until_hour=spec.active_until_hour,
        prompt=spec.prompt, conversation_id=spec.conversation_id, workspace=workspace,
        agent=spec.agent, catch_up=spec.catch_up, paused=False, created_at=datetime.now(UTC),
    )  # fmt: skip
    session.add(row)
    session.flush()
    return row


async def _sync(gateway: Gateway, task: str, row_id: str) -> None:
    def send() -> None:
        # Nobody reads the task's result: flagged so, the scheduler's worker stores none.
        gateway.celery.send_task(task, args=[row_id], queue=SCHEDULER_QUEUE, ignore_result=True)

    try:
        await anyio.to_thread.run_sync(send)
    except Exception as exc:  # SQL holds it: the beat's start-up sync brings it in
        log.error("could not ask the scheduler to sync %s: %s", row_id, exc)


async def create_schedule(gateway: Gateway, user_id: str, spec: ScheduleIn) -> ScheduleOut:
    """Store a schedule and have the beat pick it up."""
    row = await gateway.db(lambda s: _insert(s, user_id, spec))
    if row.workspace is not None:
        make_workspace_dir(gateway.settings.workspaces_root, user_id, row.workspace)
    await _sync(gateway, SYNC_SCHEDULE_TASK, row.id)
    return schedule_out(row)


async def list_schedules(gateway: Gateway, user_id: str) -> list[ScheduleOut]:
    """The owner's schedules, newest first."""

    def run(session: Session) -> list[ScheduleOut]:
        rows = session.scalars(
            select(Schedule).where(Schedule.user_id == user_id).order_by(Schedule.created_at.desc())
        ).all()
        return [schedule_out(r) for r in rows]

    return await gateway.db(run)


async def update_schedule(
    gateway: Gateway, user_id: str, schedule_id: str, patch: SchedulePatch
) -> ScheduleOut:
    """Pause, resume, or change the prompt of one of the owner's schedules."""

    def run(session: Session) -> ScheduleOut:
        row = owned_schedule(session, user_id, schedule_id)
        if patch.paused is not None:
            row.paused = patch.paused
        if patch.prompt is not None:
            row.prompt = patch.prompt
        if patch.catch_up is not None:
            row.catch_up = patch.catch_up
        return schedule_out(row)

    out = await gateway.db(run)
    await _sync(gateway, SYNC_SCHEDULE_TASK, schedule_id)
    return out


async def delete_schedule(gateway: Gateway, user_id: str, schedule_id: str) -> None:
    """Delete one of the owner's schedules and its runs."""

    def run(session: Session) -> None:
        row = owned_schedule(session, user_id, schedule_id)
        session.execute(delete(ScheduleRun).where(ScheduleRun.schedule_id == row.id))
        session.delete(row)

    await gateway.db(run)
    await _sync(gateway, SYNC_SCHEDULE_TASK, schedule_id)


async def schedule_runs(gateway: Gateway, user_id: str, schedule_id: str) -> list[ScheduleRunOut]:
    """The schedule's last runs, newest first."""

    def run(session: Session) -> list[ScheduleRunOut]:
        owned_schedule(session, user_id, schedule_id)
        rows = session.scalars(
            select(ScheduleRun)
            .where(ScheduleRun.schedule_id == schedule_id)
            .order_by(ScheduleRun.tick_at.desc())
            .limit(RUNS_SHOWN)
        ).all()
        return [
            ScheduleRunOut(
                tick_at=as_utc(r.tick_at),
                status=r.status,
                conversation_id=r.conversation_id,
                turn_id=r.turn_id,
                error=r.error,
                created_at=as_utc(r.created_at),
            )
            for r in rows
        ]

    return await gateway.db(run)


async def list_alarms(gateway: Gateway, user_id: str) -> list[AlarmOut]:
    """The owner's alarms, soonest first."""

    def run(session: Session) -> list[AlarmOut]:
        rows = session.scalars(
            select(Alarm).where(Alarm.user_id == user_id).order_by(Alarm.wake_at)
        ).all()
        return [alarm_out(r) for r in rows]

    return await gateway.db(run)


async def cancel_alarm(gateway: Gateway, user_id: str, alarm_id: str) -> AlarmOut:
    """Cancel a pending alarm (one that fired or was cancelled stays as it is)."""

    def run(session: Session) -> AlarmOut:
        row = owned_alarm(session, user_id, alarm_id)
        if row.status == "pending":
            row.status = "cancelled"
        return alarm_out(row)

    out = await gateway.db(run)
    await _sync(gateway, SYNC_ALARM_TASK, alarm_id)
    return out
