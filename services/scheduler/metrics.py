"""Prometheus metrics of the scheduler: what each tick and alarm did, and how late it ran.

One process (the threads pool; the embedded beat only sends ticks), so the metrics live in
the default registry, served by ``shared/metrics.py``'s worker server.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import Counter, Histogram

TICK_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
# What run_schedule_tick and fire_alarm return (services/scheduler/ticks.py).
TICK_OUTCOMES = ("started", "duplicate", "skipped", "failed", "gone")
ALARM_OUTCOMES = ("fired", "not_pending", "failed")

SCHEDULE_TICKS = Counter(
    "signalbox_schedule_ticks",
    "Schedule ticks run, by outcome (started, duplicate, skipped, failed, gone)",
    ["outcome"],
)
SCHEDULE_TICK_LAG = Histogram(
    "signalbox_schedule_tick_lag_seconds",
    "From a tick's due time to its task starting (beat and queue delay)",
    buckets=TICK_LAG_BUCKETS,
)
ALARMS = Counter(
    "signalbox_alarms",
    "Alarms whose time came, by outcome (fired, not_pending, failed)",
    ["outcome"],
)
for _outcome in TICK_OUTCOMES:
    SCHEDULE_TICKS.labels(_outcome)  # exported at 0 before the first tick
for _outcome in ALARM_OUTCOMES:
    ALARMS.labels(_outcome)


def tick_started(tick_at: datetime) -> None:
    """Observe how late a tick's task started."""
    due = tick_at if tick_at.tzinfo is not None else tick_at.replace(tzinfo=UTC)
    SCHEDULE_TICK_LAG.observe(max(0.0, (datetime.now(UTC) - due).total_seconds()))
