"""When a schedule fires next: cron in a time zone, inside optional active hours (shared: the
gateway validates with it, the scheduler computes with it).

Pure functions (no Redis, no SQL), so the calendar rules are unit-tested on their own; the
beat store only ever holds the one next fire time they compute.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

# A cron whose active hours never meet it (``0 3 * * *`` active 9-17) must not loop forever.
MAX_CRON_CANDIDATES = 5000


class BadSchedule(ValueError):
    """A cron expression, time zone or active-hours window that cannot be used."""


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ``BadSchedule`` naming it otherwise."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise BadSchedule(f"unknown time zone {name!r}") from exc


def check_cron(expression: str) -> str:
    """``expression`` if it is a valid five-field cron, else ``BadSchedule``."""
    if len(expression.split()) != 5 or not croniter.is_valid(expression):
        raise BadSchedule(f"expected a five-field cron expression, got {expression!r}")
    return expression


def check_hours(start: int | None, end: int | None) -> None:
    """Active hours are both set or both unset, whole hours 0-24, and not empty."""
    if (start is None) != (end is None):
        raise BadSchedule("active hours need both active_from_hour and active_until_hour")
    if start is None or end is None:
        return
    if not (0 <= start <= 23 and 1 <= end <= 24) or start == end:
        raise BadSchedule(
            f"expected active hours 0 <= from <= 23, 1 <= until <= 24, got {start}-{end}"
        )


def in_active_hours(moment: datetime, tz: ZoneInfo, start: int | None, end: int | None) -> bool:
    """Whether ``moment`` falls in [start, end) local hours; a window may wrap midnight."""
    if start is None or end is None:
        return True
    hour = moment.astimezone(tz).hour
    return start <= hour < end if start < end else hour >= start or hour < end


def next_cron_fire(
    expression: str,
    tz_name: str,
    after: datetime,
    active_from_hour: int | None = None,
    active_until_hour: int | None = None,
) -> datetime:
    """The first fire strictly after ``after`` (aware), in UTC, that is inside active hours."""
    tz = zone(tz_name)
    check_cron(expression)
    # croniter walks local wall-clock time, so DST changes land where a person expects.
    it = croniter(expression, after.astimezone(tz))
    for _ in range(MAX_CRON_CANDIDATES):
        candidate: datetime = it.get_next(datetime)
        if in_active_hours(candidate, tz, active_from_hour, active_until_hour):
            return candidate.astimezone(UTC)
    raise BadSchedule(
        f"cron {expression!r} never fires inside active hours "
        f"{active_from_hour}-{active_until_hour} ({tz_name})"
    )


def interval_tick(last_run_at: datetime | None, interval_s: int, now: datetime) -> datetime:
    """The nominal time of an interval tick: the previous run plus the interval (``now`` for
    the first), whole seconds, so two beats reading the same store name the same tick."""
    tick = now if last_run_at is None else last_run_at + timedelta(seconds=interval_s)
    return tick.astimezone(UTC).replace(microsecond=0)
