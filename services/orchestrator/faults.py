"""TEST-ONLY fault hook: kill this orchestrator process while it runs a chosen turn.

Off unless ``SIGNALBOX_TEST_FAULT`` is set (never in a deployment). The value
``kill_orchestrator_on_turn:<marker>`` makes every run of a turn whose text contains
``<marker>`` SIGKILL its own process right after the turn is (re)started: a poison message
that kills whichever worker takes it, which the delivery bound (``deliveries.py``) must end.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

ENV_VAR = "SIGNALBOX_TEST_FAULT"
KILL_ON_TURN = "kill_orchestrator_on_turn"


def _marker() -> str | None:
    value = os.environ.get(ENV_VAR, "").strip()
    point, sep, marker = value.partition(":")
    if point != KILL_ON_TURN or not sep or not marker:
        return None
    return marker


def maybe_kill_on_turn(turn_text: str) -> None:
    """SIGKILL this process if the test fault names a marker found in ``turn_text``."""
    marker = _marker()
    if marker is None or marker not in turn_text:
        return
    sys.stderr.write(f"{ENV_VAR}: killing orchestrator {os.getpid()} on a turn with {marker!r}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
