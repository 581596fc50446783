"""The orchestrator process's one timer thread (``timers.py``): leases and deadlines.

Where a test schedules several timers, it first holds the timer thread in a callback of its
own (``_held``): nothing scheduled meanwhile can run until the test lets go, however long a
loaded machine takes between two ``call_at`` calls, and then everything runs in time order.
"""

from __future__ import annotations

import threading
import time

from signalbox.services.orchestrator.timers import Timers

from .support import wait_for

WAIT_S = 30.0  # a deadline to wait for, generous for a loaded machine


def _held(timers: Timers) -> threading.Event:
    """Hold ``timers``' thread inside a callback until the returned event is set."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        release.wait(WAIT_S)

    timers.call_at(time.monotonic(), hold)
    assert holding.wait(WAIT_S), "the timer thread never ran the holding callback"
    return release


def test_one_shots_run_once_in_time_order_whatever_order_they_came_in() -> None:
    timers = Timers("test-timers")
    ran: list[str] = []
    done = threading.Event()

    def late() -> None:
        ran.append("late")
        done.set()

    release = _held(timers)
    now = time.monotonic()
    timers.call_at(now + 0.15, late)
    timers.call_at(now + 0.05, lambda: ran.append("early"))
    timers.call_at(now + 0.10, lambda: ran.append("middle"))
    release.set()
    assert done.wait(WAIT_S)
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
    wait_for(lambda: len(counted) == 3 and len(beats) >= 3, WAIT_S, "three runs of each")
    beating.cancel()
    after_cancel = len(beats)
    # A timer scheduled later than both still runs, and neither ran again before it.
    fence = threading.Event()
    timers.call_at(time.monotonic() + 0.05, fence.set)
    assert fence.wait(WAIT_S)
    assert len(counted) == 3
    assert len(beats) <= after_cancel + 1  # at most the run under way when cancelled


def test_a_cancelled_one_shot_never_runs_and_a_failing_one_stops_nothing() -> None:
    timers = Timers("test-timers")
    ran: list[str] = []
    release = _held(timers)
    # Due at once, but the thread is held until it was cancelled; uncancelled, it would run
    # before ``done``, which is due after it.
    timers.call_at(time.monotonic(), lambda: ran.append("cancelled")).cancel()

    def fails() -> None:
        raise RuntimeError("a broken callback")

    timers.call_at(time.monotonic(), fails)
    done = threading.Event()
    timers.call_at(time.monotonic() + 0.05, done.set)
    release.set()
    assert done.wait(WAIT_S), "the thread outlived the failing callback"
    assert ran == []


def test_an_earlier_timer_wakes_a_thread_waiting_for_a_later_one() -> None:
    timers = Timers("test-timers")
    timers.call_at(time.monotonic() + 60, lambda: None)  # the thread now waits a minute
    done = threading.Event()
    timers.call_at(time.monotonic() + 0.01, done.set)
    assert done.wait(WAIT_S)  # well before the minute is up
