"""The orchestrator process's one timer thread (``timers.py``): leases and deadlines."""

from __future__ import annotations

import threading
import time

from signalbox.services.orchestrator.timers import Timers

from .support import wait_for


def test_one_shots_run_once_in_time_order_whatever_order_they_came_in() -> None:
    timers = Timers("test-timers")
    ran: list[str] = []
    done = threading.Event()
    now = time.monotonic()

    def late() -> None:
        ran.append("late")
        done.set()

    timers.call_at(now + 0.15, late)
    timers.call_at(now + 0.05, lambda: ran.append("early"))
    timers.call_at(now + 0.10, lambda: ran.append("middle"))
    assert done.wait(5)
    assert ran == ["early", "middle", "late"]


def test_a_repeating_timer_runs_until_it_says_no_more_or_is_cancelled() -> None:
    timers = Timers("test-timers")
    counted: list[int] = []

    def three_times() -> bool:
        counted.append(1)
        return len(counted) < 3

    timers.call_every(0.01, three_times)
    beats: list[int] = []
    beating = timers.call_every(0.01, lambda: beats.append(1))
    wait_for(lambda: len(counted) == 3 and len(beats) >= 3, what="three runs of each")
    beating.cancel()
    after_cancel = len(beats)
    # A timer scheduled later than both still runs, and neither ran again before it.
    fence = threading.Event()
    timers.call_at(time.monotonic() + 0.05, fence.set)
    assert fence.wait(5)
    assert len(counted) == 3
    assert len(beats) <= after_cancel + 1  # at most the run under way when cancelled


def test_a_cancelled_one_shot_never_runs_and_a_failing_one_stops_nothing() -> None:
    timers = Timers("test-timers")
    ran: list[str] = []
    timers.call_at(time.monotonic() + 0.02, lambda: ran.append("cancelled")).cancel()

    def fails() -> None:
        raise RuntimeError("a broken callback")

    timers.call_at(time.monotonic() + 0.01, fails)
    done = threading.Event()
    timers.call_at(time.monotonic() + 0.05, done.set)
    assert done.wait(5), "the thread outlived the failing callback"
    assert ran == []


def test_an_earlier_timer_wakes_a_thread_waiting_for_a_later_one() -> None:
    timers = Timers("test-timers")
    timers.call_at(time.monotonic() + 60, lambda: None)  # the thread now waits a minute
    done = threading.Event()
    timers.call_at(time.monotonic() + 0.01, done.set)
    assert done.wait(5)
