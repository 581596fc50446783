"""Test-only crash points, so tests can kill the real process exactly where a crash hurts most.

Off unless ``SIGNALBOX_TEST_FAULT`` is set (never in a deployment). Its value names a point,
optionally with the occurrence to crash at: ``crash_after_commit`` (a decision is committed,
not yet published), ``crash_before_rename`` (a file's new content is fsynced in its temp
file, not yet renamed over the target), ``crash_before_rename@2`` (at the second rename).
At that point the process ends at once with ``os._exit(137)``, as a SIGKILL would: no
``finally`` blocks, no rollbacks, no flushing.
"""

from __future__ import annotations

import os
import sys
import threading

ENV_VAR = "SIGNALBOX_TEST_FAULT"
CRASH_AFTER_COMMIT = "crash_after_commit"
CRASH_BEFORE_RENAME = "crash_before_rename"
EXIT_CODE = 137  # what a shell reports for a process ended by SIGKILL

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _armed() -> tuple[str, int] | None:
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return None
    point, _, nth = value.partition("@")
    return point, int(nth) if nth else 1


def crash_point(point: str) -> None:
    """End the process here if ``SIGNALBOX_TEST_FAULT`` names ``point`` (and its occurrence)."""
    armed = _armed()
    if armed is None or armed[0] != point:
        return
    with _lock:
        _hits[point] = _hits.get(point, 0) + 1
        if _hits[point] != armed[1]:
            return
        sys.stderr.write(f"{ENV_VAR}: crashing at {point!r}\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
