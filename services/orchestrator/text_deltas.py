"""Text deltas coalesced into short windows: one event per ~50 ms instead of one per token."""

from __future__ import annotations

import time
from collections.abc import Callable

DELTA_WINDOW_S = 0.05  # fast enough to read as live, few enough events for a busy stream


class DeltaBuffer:
    """Collects text and hands it to ``emit`` at most once per window (and on ``flush``)."""

    def __init__(
        self,
        emit: Callable[[str], object],
        window_s: float = DELTA_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self._window_s = window_s
        self._clock = clock
        self._parts: list[str] = []
        self._since = 0.0

    def add(self, text: str) -> None:
        """Buffer ``text``; emit the buffer if its window is over."""
        if not text:
            return
        if not self._parts:
            self._since = self._clock()
        self._parts.append(text)
        if self._clock() - self._since >= self._window_s:
            self.flush()

    def take(self) -> str:
        """Whatever is buffered, handed to the caller instead of emitted (it goes out in
        the caller's batch)."""
        text = "".join(self._parts)
        self._parts.clear()
        return text

    def flush(self) -> None:
        """Emit whatever is buffered."""
        if self._parts:
            text = "".join(self._parts)
            self._parts.clear()
            self._emit(text)
