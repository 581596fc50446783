"""A time missed while every scheduler was down: on start-up, a ``catch_up`` schedule runs it
once now, another goes on from its next time (an ``at`` is then over). ``first_fire`` is
what the beat's start-up sync (``beat.sync_everything``) stores for each row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from signalbox.services.scheduler.entries import first_fire
from signalbox.shared.db import Schedule

NOW = datetime(2030, 6, 3, 12, 0, 30, tzinfo=UTC)  # a Monday


def _row(kind: str, catch_up: bool, **fields: object) -> Schedule:
    return Schedule(
        id="sched_x", user_id="u", kind=kind, timezone="UTC", prompt="p", catch_up=catch_up,
        paused=False, created_at=NOW - timedelta(days=1), **fields,
    )  # fmt: skip


def test_a_missed_at_runs_once_on_start_when_catching_up_and_never_when_skipping() -> None:
    missed = NOW - timedelta(hours=1)
    assert first_fire(_row("at", True, at=missed), NOW) == missed
    assert first_fire(_row("at", False, at=missed), NOW) is None
    # Once it ran (its tick is recorded), a restart does not run it again.
    assert first_fire(_row("at", True, at=missed, last_tick_at=missed), NOW) is None


def test_a_missed_cron_tick_runs_now_or_waits_for_the_next_one() -> None:
    last = NOW - timedelta(hours=3)  # ticked at 09:00:30; 10:00 and 11:00, 12:00 were missed
    caught = first_fire(_row("cron", True, cron="0 * * * *", last_tick_at=last), NOW)
    skipped = first_fire(_row("cron", False, cron="0 * * * *", last_tick_at=last), NOW)
    assert caught == datetime(2030, 6, 3, 12, 0, tzinfo=UTC)  # one run (the latest), at once
    assert skipped == datetime(2030, 6, 3, 13, 0, tzinfo=UTC)  # the next, after now
    # That run recorded, the next is the next hour: the missed ones do not run one by one.
    ran = _row("cron", True, cron="0 * * * *", last_tick_at=caught)
    assert first_fire(ran, NOW) == datetime(2030, 6, 3, 13, 0, tzinfo=UTC)


def test_a_future_time_is_kept_either_way() -> None:
    later = NOW + timedelta(minutes=5)
    assert first_fire(_row("at", False, at=later), NOW) == later
    assert first_fire(_row("at", True, at=later), NOW) == later
