"""The one way Signalbox writes a moment: RFC 3339, UTC, milliseconds, ``Z``.

``2026-11-23T20:27:05.123Z`` in events, HTTP bodies and messages alike, so a client parses
one format and compares timestamps of the stream and of the API as text.
"""

from __future__ import annotations

from datetime import UTC, datetime

# What ``rfc3339`` writes, and so what every timestamp on the wire matches (the JSON Schema
# of the protocol carries it; tests hold events and HTTP answers to it).
RFC3339_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC with milliseconds; a naive one (SQLite hands those back) is UTC."""
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return aware.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def rfc3339_or_none(moment: datetime | None) -> str | None:
    """``rfc3339(moment)``, or None for no moment."""
    return None if moment is None else rfc3339(moment)
