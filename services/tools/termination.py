"""Stopping the call a pool process runs, when its turn is cancelled.

A cancelled turn's calls are marked cancelled in Redis and then revoked with
``terminate=True`` and ``SIGUSR2`` (``shared/call_cancel.py``): Celery's main process sends
the signal to the pool process it last saw running the call. That view can be a moment old:
the process may have finished the call and started another tenant's. So here the signal only
means "look": the handler stops the call running NOW if, and only if, that call is marked
cancelled; otherwise (another call, or no call at all) it does nothing. Stopping means raising
``CallTerminated`` in the call, so every ``finally`` on the way out runs: the sandbox kills
its run's cgroup and removes it, the workspace copy is deleted, an MCP session closes its
server. The process then serves the next call.

Why the check is a Redis read inside the handler, and why that is safe: CPython runs a
Python signal handler in the main thread, between two bytecodes of whatever it interrupted,
not in async-signal context; so it may do I/O, as long as it cannot hang or corrupt what it
interrupted. It uses a client of its own (the call may be in the middle of a command on the
process's other client), with a 0.5 s socket timeout and no retries (a Redis that does not
answer counts as "not cancelled": the call runs on to its time limit rather than risk stopping
the wrong one), and it never runs nested (a second signal during the check is dropped: the
first check answers for it). The call id it checks is set before a call starts and cleared
after it ends, by plain assignments the handler cannot observe half-done. A watcher thread
keeping a local flag would avoid the read, but adds a thread per process and its own race
(the flag for which call?); one read per cancel signal is cheaper than that.

``SIGTERM`` keeps its meaning for the pool: the pool sends it to stop its processes (a cold
shutdown). It stops a running call the same way (so its sandbox is torn down); an idle
process exits. A call that blocks signals runs on to its own time limit, where the hard kill
(SIGKILL) ends it; bwrap's ``--die-with-parent`` then takes the sandbox down with the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from types import FrameType

from signalbox.shared.call_cancel import CANCEL_SIGNAL


class CallTerminated(BaseException):
    """The pool process was told to stop its call (a BaseException: no ``except Exception``
    in a tool may swallow it)."""


_call_id: str | None = None  # the call running now, None between calls
_raised = False
_checking = False
_cancelled: Callable[[str], bool] = lambda _call_id: False  # noqa: E731


def _stop() -> None:
    global _raised
    if _raised:  # once per call: the cleanup it starts must not be interrupted again
        return
    _raised = True
    raise CallTerminated()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _call_id is None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _stop()


def _on_cancel(signum: int, frame: FrameType | None) -> None:
    global _checking
    call_id = _call_id
    if call_id is None or _raised or _checking:
        return  # idle, already stopping, or a check already under way
    _checking = True
    try:
        cancelled = _cancelled(call_id)
    finally:
        _checking = False
    if cancelled:
        _stop()


def stopped(exc: BaseException) -> bool:
    """True if ``exc`` is, or groups (an MCP call's task group), a ``CallTerminated``."""
    if isinstance(exc, CallTerminated):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(CallTerminated) is not None


def install(cancelled: Callable[[str], bool]) -> None:
    """Make SIGTERM stop the running call, and the cancel signal stop it if ``cancelled``
    says its id was cancelled (call in each pool process, after fork)."""
    global _cancelled
    _cancelled = cancelled
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.Signals[CANCEL_SIGNAL], _on_cancel)


@contextlib.contextmanager
def running_call(call_id: str) -> Iterator[None]:
    """Mark ``call_id`` as running: a signal meanwhile may raise ``CallTerminated`` in it."""
    global _call_id, _raised
    _call_id, _raised = call_id, False
    try:
        yield
    finally:
        _call_id = None
