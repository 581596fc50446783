"""One timestamp format everywhere: RFC 3339, UTC, milliseconds, ``Z``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from signalbox.shared.events import utc_now
from signalbox.shared.timestamps import rfc3339, rfc3339_or_none

FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def test_every_moment_is_written_in_utc_with_milliseconds() -> None:
    moment = datetime(2026, 11, 23, 20, 27, 5, 123456, tzinfo=UTC)
    assert rfc3339(moment) == "2026-11-23T20:27:05.123Z"
    assert rfc3339(moment.replace(tzinfo=None)) == "2026-11-23T20:27:05.123Z"  # SQLite's naive
    paris = moment.astimezone(timezone(timedelta(hours=1)))
    assert rfc3339(paris) == "2026-11-23T20:27:05.123Z"
    assert rfc3339(moment.replace(microsecond=0)) == "2026-11-23T20:27:05.000Z"
    assert rfc3339_or_none(None) is None


def test_events_use_the_same_format() -> None:
    assert FORMAT.match(utc_now())
    assert FORMAT.match(rfc3339(datetime.now(UTC)))
