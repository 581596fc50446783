"""The baseline: a bare Celery app (a no-op task, and a sleep for the fan-out), built by the
same factory as Signalbox's.

Its worker runs with the same pool and concurrency as the tool workers it is compared
with (``celery -A bench.noop_app:app worker -Q bench.noop --pool prefork -c N``), so the
difference measured is what Signalbox adds on top of Celery, not a different set-up.
"""

from __future__ import annotations

import time

from signalbox.shared.celery_app import make_celery
from signalbox.shared.settings import CommonSettings, load

NOOP_TASK = "bench.noop"
SLEEP_TASK = "bench.sleep"
NOOP_QUEUE = "bench.noop"

settings = load(CommonSettings)
app = make_celery("bench-noop", settings)


@app.task(name=NOOP_TASK)
def noop() -> None:
    """Do nothing: the cheapest task Celery can run."""


@app.task(name=SLEEP_TASK)
def sleep(seconds: float) -> None:
    """Sleep: the bare counterpart of the ``sleep`` test tool (fan-out baselines)."""
    time.sleep(seconds)
