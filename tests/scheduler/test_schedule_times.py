"""Next cron fire in a time zone, inside active hours; bad input named."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from signalbox.shared.schedule_times import BadSchedule, check_cron, next_cron_fire, zone


def test_an_hourly_cron_in_paris_waits_for_the_active_hours() -> None:
    after = datetime(2026, 1, 1, 3, 30, tzinfo=UTC)  # 04:30 in Paris (winter, UTC+1)
    assert next_cron_fire("0 * * * *", "Europe/Paris", after, 9, 17) == datetime(
        2026, 1, 1, 8, 0, tzinfo=UTC
    )


def test_a_window_that_wraps_midnight_and_summer_time() -> None:
    after = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)  # 08:00 in New York (UTC-4)
    assert next_cron_fire("30 * * * *", "America/New_York", after, 22, 6) == datetime(
        2026, 7, 2, 2, 30, tzinfo=UTC
    )


def test_bad_cron_and_bad_zone_are_named() -> None:
    with pytest.raises(BadSchedule, match="cron"):
        check_cron("61 * * * *")
    with pytest.raises(BadSchedule, match="Mars/Olympus"):
        zone("Mars/Olympus")
