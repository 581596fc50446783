"""``alarm``: the agent asks to be woken later in its conversation.

The call stores an ``alarms`` row (SQL is the truth), then asks the scheduler to load it
into its beat store; at ``wake_at`` the scheduler starts a turn of this conversation with
the note as its text (services/scheduler/ticks.py). The alarm's id is derived from the
call's, so a turn resumed after a crash between storing and recording finds the alarm it
already set instead of setting a second one.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator.builtin_tools import ALARM_MAX_AHEAD_S, AlarmInput
from signalbox.services.orchestrator.store import TurnInfo
from signalbox.shared.db import Alarm
from signalbox.shared.db.models import ToolCall, as_utc
from signalbox.shared.ids import ID_MAX_CHARS
from signalbox.shared.statuses import CallState
from signalbox.shared.timestamps import rfc3339

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

log = logging.getLogger(__name__)

# Per owner: an agent in a loop cannot fill the beat store with wake-ups.
MAX_PENDING_ALARMS = 50


class AlarmRefused(ValueError):
    """The alarm cannot be set; the message is the call's error, for the model."""


def alarm_id_for(call_id: str) -> str:
    """The id of the alarm call ``call_id`` sets (stable across a resumed turn)."""
    return f"alarm_{call_id.split('_', 1)[-1]}"[:ID_MAX_CHARS]


def wake_time(spec: AlarmInput, now: datetime) -> datetime:
    """When the alarm rings, in UTC, whole seconds (the beat's resolution)."""
    if spec.at is not None:
        wake = spec.at.astimezone(UTC)
    else:
        assert spec.in_minutes is not None  # AlarmInput holds exactly one of the two
        wake = now + timedelta(minutes=spec.in_minutes)
    return wake.replace(microsecond=0)


def store_alarm(
    sessions: sessionmaker[Session], info: TurnInfo, call_id: str, spec: AlarmInput, now: datetime
) -> Alarm:
    """The call's alarm row, stored now or found from before a crash; ``AlarmRefused``
    for a time in the past, too far ahead, or an owner with too many alarms pending."""
    alarm_id = alarm_id_for(call_id)
    with sessions() as session:
        existing = session.get(Alarm, alarm_id)
        if existing is not None:
            return existing
        wake = wake_time(spec, now)
        if wake < now.replace(microsecond=0):
            raise AlarmRefused(f"the time {rfc3339(wake)} has passed (it is {rfc3339(now)})")
        if wake > now + timedelta(seconds=ALARM_MAX_AHEAD_S):
            raise AlarmRefused(f"an alarm can be at most {ALARM_MAX_AHEAD_S // 86_400} days ahead")
        pending = session.scalar(
            select(func.count())
            .select_from(Alarm)
            .where(Alarm.user_id == info.user_id, Alarm.status == "pending")
        )
        if (pending or 0) >= MAX_PENDING_ALARMS:
            raise AlarmRefused(f"{MAX_PENDING_ALARMS} alarms are already pending: cancel one first")
        alarm = Alarm(
            id=alarm_id,
            user_id=info.user_id,
            conversation_id=info.conversation_id,
            wake_at=wake,
            note=spec.note,
            status="pending",
            set_by_turn_id=info.turn_id,
            created_at=now,
        )
        session.add(alarm)
        session.commit()
        return alarm


def run(runner: TurnRunner, call: ToolCall) -> str | None:
    """Set the alarm and tell the model when it will be woken."""
    spec = AlarmInput.model_validate(call.input)
    now = datetime.now(UTC)
    try:
        alarm = store_alarm(runner.rt.sessions, runner.info, call.id, spec, now)
    except AlarmRefused as exc:
        runner.record(call, CallState.ERROR, "", str(exc))
        return None
    try:
        runner.rt.sync_alarm(alarm.id)
    except Exception as exc:  # stored: the scheduler's start-up sync loads it
        log.warning("could not ask the scheduler to load alarm %s: %s", alarm.id, exc)
    wake = as_utc(alarm.wake_at)
    output = (
        f"Alarm {alarm.id} set: you will be woken in this conversation at {rfc3339(wake)} "
        f"(now: {rfc3339(now)}) with your note as the message."
    )
    runner.record(call, CallState.OK, output, None)
    return None
