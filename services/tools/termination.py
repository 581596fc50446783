"""Stopping the call a pool process runs, when its turn is cancelled.

The orchestrator revokes a cancelled turn's running calls with ``terminate=True`` and
``SIGTERM``: Celery's main process sends the signal to the pool process running the call.
Here that signal raises ``CallTerminated`` in the call, so every ``finally`` on the way out
runs: the sandbox kills its run's cgroup and removes it, the workspace copy is deleted, an MCP
session closes its server. The process then serves the next call. A SIGTERM while no call
runs (the pool stopping an idle process) keeps its default meaning: the process exits.

A call that blocks SIGTERM runs on to its own time limit, where the hard kill (SIGKILL) ends
it; bwrap's ``--die-with-parent`` then takes the sandbox down with the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType


class CallTerminated(BaseException):
    """The pool process was told to stop its call (a BaseException: no ``except Exception``
    in a tool may swallow it)."""


_running = False
_raised = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _raised
    if not _running:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if _raised:  # once per call: the cleanup it starts must not be interrupted again
        return
    _raised = True
    raise CallTerminated()


def stopped(exc: BaseException) -> bool:
    """True if ``exc`` is, or groups (an MCP call's task group), a ``CallTerminated``."""
    if isinstance(exc, CallTerminated):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(CallTerminated) is not None


def install() -> None:
    """Make SIGTERM stop the running call (call in each pool process, after fork)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def running_call() -> Iterator[None]:
    """Mark a call as running: a SIGTERM meanwhile raises ``CallTerminated`` in it."""
    global _running, _raised
    _running, _raised = True, False
    try:
        yield
    finally:
        _running = False
