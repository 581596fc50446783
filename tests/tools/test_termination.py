"""A pool process told to stop its call (SIGTERM, as a cancelled turn's revoke sends it):
the call stops at once, everything it started is torn down, and the process lives on."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.tools import termination
from services.tools.cgroups import RUN_PREFIX
from services.tools.sandbox import SANDBOX_UID_BASE, SANDBOX_UID_SPAN, Limits, run_sandboxed
from signalbox.processes import wait_until

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
def sigterm_stops_calls() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    termination.install()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def _terminate_when(check: Callable[[], object]) -> threading.Thread:
    """SIGTERM this process (as Celery's main process signals its pool child) once ``check``."""

    def run() -> None:
        wait_until(check, timeout_s=20, what="the call to be running")
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("sigterm_stops_calls")
def test_sigterm_stops_a_running_call_once() -> None:
    with pytest.raises(termination.CallTerminated), termination.running_call():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # never reached: the handler raises at the next bytecode
    with termination.running_call():
        pass  # a new call starts unstopped


@pytest.mark.usefixtures("sandbox_ready", "sigterm_stops_calls")
def test_a_stopped_sandbox_run_leaves_no_process_and_no_cgroup() -> None:
    assert _sandboxed() == []
    thread = _terminate_when(_sandboxed)
    started = time.monotonic()
    with pytest.raises(termination.CallTerminated), termination.running_call():
        run_sandboxed("import time\ntime.sleep(60)\n", LIMITS)
    thread.join()
    assert time.monotonic() - started < 10
    assert _sandboxed() == []
    runs = [p for p in Path("/sys/fs/cgroup").rglob(f"{RUN_PREFIX}{os.getpid()}-*") if p.is_dir()]
    assert runs == []


def test_an_exception_group_holding_the_stop_counts_as_stopped() -> None:
    group = BaseExceptionGroup("task group", [termination.CallTerminated(), ValueError("x")])
    assert termination.stopped(group) and termination.stopped(termination.CallTerminated())
    assert not termination.stopped(ExceptionGroup("g", [ValueError("x")]))
