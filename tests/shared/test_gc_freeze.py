"""``freeze_startup_objects``: what exists at the end of a start-up leaves the collector's
scans, garbage of the start-up is collected first, and what comes later is collected as
before. Run in a child interpreter: freezing the test process would keep every object
of the suite made so far alive to its end."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, weakref
from signalbox.shared.gc_freeze import freeze_startup_objects

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

kept = Node()
start_garbage = cycle()  # unreachable, but only a collection frees a cycle
frozen = freeze_startup_objects()
tracked_after = len(gc.get_objects())
later_garbage = cycle()
gc.collect()
print(json.dumps({
    "frozen": frozen,
    "kept_frozen": gc.is_tracked(kept) and not any(o is kept for o in gc.get_objects()),
    "start_garbage_freed": start_garbage() is None,
    "later_garbage_freed": later_garbage() is None,
    "tracked_after": tracked_after,
}))
"""


def test_the_start_up_is_frozen_its_garbage_freed_and_later_garbage_still_collected() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)

    assert seen["start_garbage_freed"], "a start-up cycle is collected, not frozen for good"
    assert seen["kept_frozen"], "a live start-up object is no longer among those scanned"
    assert seen["frozen"] > seen["tracked_after"], "most objects are frozen, few left to scan"
    assert seen["later_garbage_freed"], "what is made after the freeze is collected as before"


SIGNALLED = """
import gc, json
from celery import Celery
from celery.signals import worker_ready
from signalbox.shared.gc_freeze import freeze_when_started

class Consumer:  # what sends worker_ready: a worker's consumer, with its app
    def __init__(self, app):
        self.app = app

ours, other = Celery("ours"), Celery("other")
freeze_when_started(worker_ready, ours)
worker_ready.send(sender=Consumer(other))
after_other = gc.get_freeze_count()
worker_ready.send(sender=Consumer(ours))
print(json.dumps({"after_other": after_other, "after_ours": gc.get_freeze_count()}))
"""


def test_a_worker_freezes_on_its_own_apps_signal_only() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SIGNALLED], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)

    assert seen["after_other"] == 0, "another app's worker started: nothing frozen here"
    assert seen["after_ours"] > 0, "this app's worker started: its start-up is frozen"
