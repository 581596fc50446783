"""A turn's wall-clock limit: at its ``deadline_at`` the runner is told, once, from a timer.

The deadline is in SQL (``turns.deadline_at``, set when the turn starts from the agent's
``turn_timeout_s``), so it outlives the runner: a turn parked on a human is woken by the
reconciler once it passes (``store.ready_to_continue``), and a resumed turn arms what is
left of it. Telling the runner sets its cancel flag, so the model stream, tool gathering and
sub-agents stop exactly as they do for a cancel; ``TurnRunner.finish`` names it ``timed_out``.
The timer is the process's one timer thread (``timers.py``): a turn starts no thread for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType

from signalbox.services.orchestrator.timers import TIMERS, Timer, Timers


class TurnDeadline:
    """Calls ``on_deadline`` when ``deadline_at`` passes, while the ``with`` block runs."""

    def __init__(
        self,
        deadline_at: datetime | None,
        on_deadline: Callable[[], None],
        *,
        timers: Timers = TIMERS,
    ) -> None:
        self._deadline_at = deadline_at
        self._on_deadline = on_deadline
        self._timers = timers
        self._timer: Timer | None = None

    def __enter__(self) -> TurnDeadline:
        if self._deadline_at is None:
            return self
        left_s = (self._deadline_at - datetime.now(UTC)).total_seconds()
        if left_s <= 0:
            self._on_deadline()  # already past (a parked turn woken by it): at once
            return self
        self._timer = self._timers.call_at(time.monotonic() + left_s, self._on_deadline)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
