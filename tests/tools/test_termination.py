"""A pool process told to stop its call (the cancel signal for a call marked cancelled, or
SIGTERM): the call stops at once, everything it started is torn down, and the process lives
on; a cancel signal meant for another call, or landing between calls, changes nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from signalbox.processes import wait_until
from signalbox.services.tools import termination
from signalbox.services.tools.cgroups import RUN_PREFIX
from signalbox.services.tools.sandbox import (
    SANDBOX_UID_BASE,
    SANDBOX_UID_SPAN,
    Limits,
    run_sandboxed,
)
from signalbox.shared.call_cancel import CANCEL_SIGNAL

CANCEL = signal.Signals[CANCEL_SIGNAL]

LIMITS = Limits(
    cpu_s=30,
    memory_bytes=256 * 1024 * 1024,
    file_bytes=1024 * 1024,
    open_files=32,
    processes=8,
    output_bytes=4096,
    wall_s=30.0,
)


@pytest.fixture
def handlers_installed() -> Iterator[None]:
    """The pool process's handlers, here; the test's own restored after, whatever happens.

    Signals go to this thread only with ``pthread_kill`` while the handlers are installed,
    so none can land after they are gone (which would end the whole test session)."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, CANCEL)}
    termination.install(lambda call_id: call_id == "cancelled")
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _signal_me(signum: int) -> None:
    """Signal this thread; its handler runs at the next bytecode."""
    signal.pthread_kill(threading.get_ident(), signum)


def _mine(pid: int) -> bool:
    """True if ``pid`` descends from this (test) process."""
    for _ in range(64):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if pid == os.getpid():
            return True
        if pid <= 1:
            return False
    return False


def _sandboxed() -> list[int]:
    """Live processes of this process's sandbox runs (a sandbox uid)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        uid = int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1])
        if SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_SPAN and _mine(int(name)):
            found.append(int(name))
    return found


@pytest.mark.usefixtures("handlers_installed")
def test_sigterm_stops_a_running_call_once() -> None:
    with pytest.raises(termination.CallTerminated), termination.running_call("any"):
        _signal_me(signal.SIGTERM)
        time.sleep(5)  # never reached: the handler raises at the next bytecode
    with termination.running_call("next"):
        pass  # a new call starts unstopped


@pytest.mark.usefixtures("handlers_installed")
def test_the_cancel_signal_stops_only_a_call_that_was_cancelled() -> None:
    _signal_me(CANCEL)  # idle: nothing happens, the process lives on
    with termination.running_call("another-tenants"):
        _signal_me(CANCEL)  # meant for the call before: ignored
        time.sleep(0.01)
    with pytest.raises(termination.CallTerminated), termination.running_call("cancelled"):
        _signal_me(CANCEL)
        time.sleep(5)  # never reached


def _run_in_child(code: str) -> int:
    """Fork a process that runs ``code`` sandboxed as a call marked cancelled; its pid."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        status = 3
        try:
            termination.install(lambda call_id: call_id == "cancelled")
            with termination.running_call("cancelled"):
                run_sandboxed(code, LIMITS)
            status = 1
        except termination.CallTerminated:
            status = 0
        except BaseException:
            status = 2
        finally:
            os._exit(status)
    return pid


def _exit_status(pid: int, timeout_s: float) -> int:
    statuses: list[int] = []

    def reaped() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            statuses.append(os.waitstatus_to_exitcode(status))
        return bool(done)

    wait_until(reaped, timeout_s=timeout_s, what=f"process {pid} to end")
    return statuses[0]


@pytest.mark.usefixtures("sandbox_ready")
def test_a_stopped_sandbox_run_leaves_no_process_and_no_cgroup() -> None:
    """A pool process (a child here, so no signal ever reaches pytest) gets the cancel signal
    for the call it runs: the call stops, its run's processes and cgroup are gone."""
    assert _sandboxed() == []
    child = _run_in_child("import time\ntime.sleep(60)\n")
    status: int | None = None
    try:
        wait_until(_sandboxed, timeout_s=20, what="the sandboxed program to run")
        started = time.monotonic()
        os.kill(child, CANCEL)
        status = _exit_status(child, timeout_s=20)
    finally:
        if status is None:  # not reaped yet, so the pid is still the child's
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    assert status == 0  # it raised CallTerminated
    assert time.monotonic() - started < 15  # a deadline on a loaded machine, not a benchmark
    assert _sandboxed() == []
    runs = [p for p in Path("/sys/fs/cgroup").rglob(f"{RUN_PREFIX}{child}-*") if p.is_dir()]
    assert runs == []


def test_an_exception_group_holding_the_stop_counts_as_stopped() -> None:
    group = BaseExceptionGroup("task group", [termination.CallTerminated(), ValueError("x")])
    assert termination.stopped(group) and termination.stopped(termination.CallTerminated())
    assert not termination.stopped(ExceptionGroup("g", [ValueError("x")]))
