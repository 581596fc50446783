"""The beat: RedBeat's scheduler (a Redis store holding a lock, so one beat runs ticks),
rebuilt from SQL when it starts, and naming each tick's time in the message it sends."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from redbeat import RedBeatScheduler
from sqlalchemy import select

from signalbox.services.scheduler.entries import nominal_tick, sync_alarm, sync_schedule
from signalbox.services.scheduler.state import scheduler_state
from signalbox.shared.db import Alarm, Schedule

log = logging.getLogger(__name__)


class SignalboxBeat(RedBeatScheduler):  # type: ignore[misc]
    """RedBeat, plus: SQL → store at start-up, and ``tick_at`` on every sent tick."""

    def setup_schedule(self) -> None:
        """Load the store from SQL (Redis may have lost it) before the first tick."""
        super().setup_schedule()
        sync_everything(self.app)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Send the tick with its nominal time: the SQL idempotency key (schedule, tick)."""
        tick_at = nominal_tick(entry, datetime.now(UTC))
        entry.kwargs = {**(entry.kwargs or {}), "tick_at": tick_at.isoformat()}
        return super().apply_async(entry, producer=producer, advance=advance, **kwargs)


def sync_everything(app: Any) -> None:
    """Every live schedule and pending alarm into the store; a missed one is due now."""
    state = scheduler_state()
    now = datetime.now(UTC)
    with state.sessions() as session:
        schedules = session.scalars(select(Schedule)).all()
        alarms = session.scalars(select(Alarm).where(Alarm.status == "pending")).all()
    for row in schedules:
        try:
            sync_schedule(app, row, row.id, now)
        except Exception:  # one bad row must not keep every other schedule out of beat
            log.exception("could not sync schedule %s", row.id)
    for alarm in alarms:
        sync_alarm(app, alarm, alarm.id)
    log.info("beat store synced: %d schedules, %d alarms", len(schedules), len(alarms))
