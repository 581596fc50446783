"""The objects a service made while it started are moved out of the garbage collector's way.

A service imports its libraries (the anthropic SDK, SQLAlchemy, pydantic, Celery...) and
builds its app once: some 100,000 to 300,000 objects that live as long as the process.
CPython's collector scans every one of them at each full (oldest-generation) collection,
which a busy process runs every few seconds: an orchestrator's took 0.15-0.2 s of CPU each,
4% to 9% of its CPU in the ``load`` benchmark (docs/benchmarks.md). ``gc.freeze()`` moves
what exists now to a permanent generation that collections skip; what the service makes
from then on is collected as before. In a prefork tool worker, frozen before the pool
forks, the children copy fewer of the pages they share with the parent (a collection no
longer writes to those objects; their reference counts still change).

The cycle collector never frees a frozen object: anything garbage at that moment is
collected first (reference counting still frees what is no longer referenced).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from celery import Celery
from celery.utils.dispatch import Signal

log = logging.getLogger(__name__)


def freeze_startup_objects() -> int:
    """Collect the start-up's garbage, then freeze what is left; returns how many objects
    the collector will no longer scan."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("%d objects of the start-up frozen out of garbage collection", frozen)
    return frozen


def freeze_when_started(signal: Signal, app: Celery) -> None:
    """Freeze once ``signal`` (``worker_init`` or ``worker_ready``) comes from a worker of
    ``app``: a process that imports a worker module without running that worker (a test,
    another app's worker) freezes nothing."""

    def freeze(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            freeze_startup_objects()

    signal.connect(freeze, weak=False)
