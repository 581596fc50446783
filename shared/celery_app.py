"""The one Celery app factory every worker and client uses, so delivery settings never drift.

Choices (explained in docs/operations.md): JSON only; ``acks_late`` with
``task_reject_on_worker_lost`` so a task whose worker dies is delivered again; prefetch 1
so a long task does not hold others hostage; the visibility timeout set both where the
broker reads it and where the result backend reads it.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from signalbox.shared import broker_fixes
from signalbox.shared.log_context import propagate_over_celery
from signalbox.shared.redis_clients import celery_broker
from signalbox.shared.settings import CommonSettings

ORCHESTRATOR_QUEUE = "orchestrator"
TOOLS_QUEUE = "tools"
SANDBOX_QUEUE = "tools.sandbox"

RUN_TURN_TASK = "orchestrator.run_turn"
RUN_TOOL_TASK = "tools.run_tool"
RUN_BATCH_TASK = "tools.run_batch"  # a step's quick calls to one queue (services/tools/batches.py)
# The scheduler (services/scheduler/): gateway and orchestrator ask it to re-read a row.
SCHEDULER_QUEUE = "scheduler"
SYNC_SCHEDULE_TASK = "scheduler.sync_schedule"
SYNC_ALARM_TASK = "scheduler.sync_alarm"


# kombu looks for messages unacknowledged past the visibility timeout only every
# interval * throttle seconds (10 * 10 by default); a short timeout needs a sweep as short.
SHORT_VISIBILITY_TIMEOUT_S = 600
# A sweep holds a lock while it runs (milliseconds). A worker killed inside one leaves the lock
# until it expires: 300 s by kombu's default, during which no worker restores anything. Each
# restore is a transaction of its own, so two sweeps at once cannot deliver a message twice:
# the lock only saves work, and may expire soon.
UNACKED_MUTEX_EXPIRE_S = 5


def transport_options(settings: CommonSettings) -> dict[str, Any]:
    """Broker/backend options: the visibility timeout and this deployment's key prefix."""
    options: dict[str, Any] = {
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_mutex_expire": UNACKED_MUTEX_EXPIRE_S,
        "global_keyprefix": settings.redis_prefix,
        **celery_broker(settings.redis_url)[1],  # Sentinel: the master's name
    }
    if settings.visibility_timeout_s < SHORT_VISIBILITY_TIMEOUT_S:
        options["unacked_restore_interval"] = max(0.5, settings.visibility_timeout_s / 4)
        options["unacked_restore_throttle"] = 1
    return options


def make_celery(
    name: str,
    settings: CommonSettings,
    include: list[str] | None = None,
    *,
    results: bool = True,
) -> Celery:
    """A Celery app on the deployment's Redis with Signalbox's delivery settings.

    ``results=False``: an app that only sends tasks and reads no result (the gateway) has
    no result backend. Celery's Redis backend is per thread, so a sender in a pool of
    worker threads built one, with its own connection pool, in each thread it sent from.
    """
    broker_fixes.apply()
    propagate_over_celery()  # a task's log lines carry its sender's ids (turn, call...)
    url = celery_broker(settings.redis_url)[0]  # the same URL unless it is Sentinel's
    app = Celery(name, broker=url, backend=url if results else None, include=include or [])
    options = transport_options(settings)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=options,
        result_backend_transport_options=options,
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        # Off: a threads-pool orchestrator cannot cancel a turn anyway (its lease guards it),
        # and cancelling a tool call because Redis blinked would turn it into ``lost``; a
        # redelivered copy is skipped by the call's claim, or harmless when idempotent.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
        task_default_queue=TOOLS_QUEUE,
        task_routes={
            "orchestrator.*": {"queue": ORCHESTRATOR_QUEUE},
            "tools.run_sandboxed": {"queue": SANDBOX_QUEUE},
            "tools.*": {"queue": TOOLS_QUEUE},
        },
        timezone="UTC",
        enable_utc=True,
    )
    return app


def send_run_turn(app: Celery, turn_id: str) -> None:
    """Send ``orchestrator.run_turn(turn_id)``, its outcome not kept by Celery.

    A turn's outcome is in SQL and on its event stream, and no sender reads Celery's copy.
    Kept, it cost a subscription to the task's result channel in the sender, from the send
    until the result object was collected, and a write and a publish in the orchestrator,
    for every turn.
    """
    app.send_task(RUN_TURN_TASK, args=[turn_id], queue=ORCHESTRATOR_QUEUE, ignore_result=True)
