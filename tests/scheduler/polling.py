"""Waiting on what another process does: poll a check until it holds, within a deadline.

The scheduler, the orchestrator and the gateway are separate processes here, so what the
tests wait on (a row in SQL, a key in Redis) has no event to block on in this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.05


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Return once ``check()`` is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)
