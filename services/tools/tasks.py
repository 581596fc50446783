"""The Celery tasks of the tool workers: one call (``tools.run_tool``), or a step's quick calls
(``tools.run_batch``, ``batches.py``); they only decode and delegate to ``execution``."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from celery import Task
from celery.exceptions import TimeLimitExceeded
from celery.signals import worker_process_init, worker_ready

from signalbox.services.tools import termination
from signalbox.services.tools.batches import report_batch_killed, run_batch
from signalbox.services.tools.execution import Deps, report_killed, report_stopped, run_call
from signalbox.services.tools.metrics import run_metrics
from signalbox.services.tools.worker import app, registry, settings
from signalbox.shared.call_cancel import checker_client, is_cancelled
from signalbox.shared.celery_app import RUN_BATCH_TASK, RUN_TOOL_TASK
from signalbox.shared.log_context import CONTEXT_FIELDS, bind_log_context
from signalbox.shared.redis_keys import RedisKeys

log = logging.getLogger(__name__)
_deps: tuple[int, Deps] | None = None


def deps() -> Deps:
    """This process's connections, made after fork (prefork children must not share them)."""
    global _deps
    if _deps is None or _deps[0] != os.getpid():
        _deps = (os.getpid(), Deps.create(settings, registry))
    return _deps[1]


@worker_process_init.connect
def _connect(**_: Any) -> None:
    # Connect before the first task: its time limit should not pay for the set-up.
    deps()
    checker = checker_client(settings.redis_url)
    termination.install(partial(is_cancelled, checker, RedisKeys(settings.redis_prefix)))


@worker_ready.connect
def _connect_main(**_: Any) -> None:
    # The main process reports calls killed at their hard limit (``ToolTask.on_failure``);
    # connecting at the first kill would delay that report by the set-up (~80 ms).
    deps()


class ToolTask(Task):  # type: ignore[type-arg]
    """Reports a call killed at its hard time limit (the child cannot: it is gone)."""

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Called in the main process after a hard time-limit kill, and in a child otherwise."""
        if isinstance(exc, TimeLimitExceeded) and isinstance(kwargs, dict):
            limit = exc.args[0] if exc.args and isinstance(exc.args[0], int | float) else 0.0
            requests = kwargs.get("requests")
            if isinstance(requests, list):  # a batch: each call is reported
                calls = [r for r in requests if isinstance(r, dict)]
                report_batch_killed(calls, deps(), float(limit))
                # One run was killed (which, only the pool process knew; the calls before it
                # were counted as they ended): named by the batch's tool when it has one.
                tools = {_tool(c) for c in calls}
                run_metrics(registry).ran(tools.pop() if len(tools) == 1 else "", "killed")
                return
            request = kwargs.get("request", {})
            report_killed(request, deps(), float(limit))
            run_metrics(registry).ran(_tool(request), "killed", int(limit * 1000))


def _tool(request: Any) -> str:
    tool = request.get("tool") if isinstance(request, dict) else None
    return tool if isinstance(tool, str) else ""


@app.task(name=RUN_TOOL_TASK, base=ToolTask)
def run_tool(request: dict[str, Any]) -> str:
    """Run one tool call and publish its result; returns the status, "skipped" for a
    redelivery, or "terminated" when its turn's cancel stopped it (``termination``)."""
    return _run_one(request)


@app.task(name=RUN_BATCH_TASK, base=ToolTask)
def run_batch_task(requests: list[dict[str, Any]]) -> list[str]:
    """Run a step's quick calls one after another, each at its own deadline (``batches``);
    returns their statuses, in order."""
    started = time.monotonic()
    statuses = run_batch(requests, deps(), _run_one, started)
    metrics = run_metrics(registry)
    for request, status in zip(requests, statuses, strict=False):
        if status in ("unstarted", "failed"):  # run_one counted the others
            metrics.ran(_tool(request), status)
    return statuses


def _run_one(request: Mapping[str, Any], limit_s: float | None = None) -> str:
    # Until the task ends (task_postrun clears it), Celery's own line about it included.
    bind_log_context(**{field: _text(request.get(field)) for field in CONTEXT_FIELDS})
    metrics = run_metrics(registry)
    metrics.running.inc()
    try:
        call_id = request.get("call_id")
        with termination.running_call(call_id if isinstance(call_id, str) else ""):
            result = run_call(request, deps(), limit_s)
    except BaseException as exc:
        if not termination.stopped(exc):
            raise
        report_stopped(request, deps())
        metrics.ran(_tool(request), "terminated")
        return "terminated"  # acknowledged: a stopped call is not delivered again
    finally:
        metrics.running.dec()
    if result is None:
        metrics.ran(_tool(request), "skipped")
        return "skipped"
    log.info(
        "call %s: %s %s in %d ms", result.call_id, _tool(request), result.status, result.duration_ms
    )
    metrics.ran(_tool(request), result.status, result.duration_ms)
    return result.status


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
