"""A step's quick calls to one queue, run as ONE task, each at its own deadline.

A Celery task costs the stack about 2 ms of CPU (the orchestrator's publish, Redis, the
worker's main process and its pool process), more than a quick tool itself (``read_file``,
``current_time``: under a millisecond). So the orchestrator sends a step's calls of tools
declared ``quick`` (``ToolSpec.quick``) to one queue as one ``tools.run_batch`` task
(``services/orchestrator/dispatch.py``), and one pool process runs them one after another.
Every per-call guarantee of a task of its own holds for each call of a batch:

- **Status.** Each call is claimed, run and published on its own (``execution.run_call``):
  its result reaches the orchestrator as soon as it ends, not with the batch.
- **Time limit.** Each call keeps the deadline a task of its own started with the batch
  would have: its time limit counted from the batch's start. A call runs with what is left
  of it (its own soft limit, ``execution.soft_time_limit``); one whose deadline passed while
  the calls before it ran ends ``timeout`` without starting. The batch's hard limit (the
  kill, for a call deaf to its soft limit) is its latest deadline plus the usual extra; the
  worker's main process then reports ``timeout`` for every call of the batch, and the
  orchestrator keeps the first result of each (those that had ended keep theirs).
- **Cancel.** A cancelled call is not claimed, so not started (``claim_call``); a running
  one is stopped by the cancel signal as any call is (``termination.py``). Celery's revoke
  finds a task by its id, a batch's being its first call's, which may have ended before the
  cancel; so the orchestrator also broadcasts ``stop_batched_calls`` with the calls' ids,
  and the worker's main process signals the pool process of every batch holding one.
- **Exactly once.** A redelivered batch claims each call again: a non-idempotent call that
  ran is skipped, one that never started runs now.
- **Crash.** A pool process that dies mid-batch has its batch delivered again at once
  (``task_reject_on_worker_lost``): the calls that ended are skipped or run again by the
  claim rule above, the one it died in is ``lost`` when its heartbeat stops (or run again
  when idempotent), and the rest run. The main process renews the heartbeat of whichever
  call of a batch its pool process holds (``heartbeat.py``).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery.worker import state as worker_state
from celery.worker.control import control_command
from pydantic import ValidationError

from signalbox.services.tools import termination
from signalbox.services.tools.execution import Deps, publish
from signalbox.shared.call_cancel import CANCEL_SIGNAL, STOP_BATCHED_CALLS
from signalbox.shared.celery_app import RUN_BATCH_TASK
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult

log = logging.getLogger(__name__)

# One call of a batch: (the request, the soft limit left to it) -> its status.
RunOne = Callable[[Mapping[str, Any], float], str]


def run_batch(
    raws: Sequence[Mapping[str, Any]], deps: Deps, run_one: RunOne, started: float
) -> list[str]:
    """Run the calls of a batch in order, each within what is left of its own time limit
    since ``started`` (``time.monotonic()`` at the batch's start); their statuses.

    ``run_one`` runs and reports one call (``tasks.py``: claim, metrics, the cancel signal)
    and returns its status, ``terminated`` when a signal stopped it.
    """
    statuses: list[str] = []
    for index, raw in enumerate(raws):
        if termination.exiting():  # the pool is stopping this process: start nothing more
            statuses += [report_unstarted(r, deps, "its worker is stopping") for r in raws[index:]]
            break
        left = _time_limit(raw) - (time.monotonic() - started)
        if left <= 0:
            statuses.append(report_unstarted(raw, deps, "deadline"))
            continue
        statuses.append(run_one(raw, left))
    return statuses


def _time_limit(raw: Mapping[str, Any]) -> float:
    limit = raw.get("timeout_s")
    # A bad request gets its full error report from run_call, which validates it.
    return float(limit) if isinstance(limit, int | float) else 1.0


def report_unstarted(raw: Mapping[str, Any], deps: Deps, why: str) -> str:
    """Publish the result of a call of a batch that will not start; its status."""
    try:
        request = ToolCallRequest.model_validate(raw)
    except ValidationError:
        return "skipped"  # run_call reports a bad request; here it never ran
    if why == "deadline":
        result = ToolResult(
            call_id=request.call_id,
            status="timeout",
            error=(
                f"{request.tool} did not start: the calls before it in its batch took its whole "
                f"time limit of {request.timeout_s:g} s"
            ),
        )
    else:
        result = ToolResult(
            call_id=request.call_id,
            status="error",
            error=f"{request.tool} did not start: {why}",
        )
    log.warning("call %s (%s): %s", request.call_id, request.tool, result.error)
    publish(deps, request.turn_id, result)
    return result.status


def report_batch_killed(raws: Sequence[Mapping[str, Any]], deps: Deps, limit_s: float) -> None:
    """Publish ``timeout`` for every call of a batch killed at its hard time limit (in the
    worker's main process: the pool process is gone). The calls that had ended already
    reported; the orchestrator keeps the first result of a call and ignores this one."""
    for raw in raws:
        try:
            request = ToolCallRequest.model_validate(raw)
        except ValidationError:
            continue
        result = ToolResult(
            call_id=request.call_id,
            status="timeout",
            error=(
                f"{request.tool} was stopped at its batch's hard time limit of {limit_s:g} s "
                "(a call of the batch did not stop at its own limit); it may not have run"
            ),
            duration_ms=int(limit_s * 1000),
        )
        publish(deps, request.turn_id, result)


def batch_call_ids(kwargs: object) -> list[str]:
    """The call ids of a ``tools.run_batch`` task's kwargs, in order ([] if malformed)."""
    requests = kwargs.get("requests") if isinstance(kwargs, dict) else None
    if not isinstance(requests, list):
        return []
    calls = [r.get("call_id") for r in requests if isinstance(r, dict)]
    return [c for c in calls if isinstance(c, str)]


@control_command(
    args=[("call_ids", list)], signature="<call_id> [<call_id> ...]", name=STOP_BATCHED_CALLS
)
def stop_batched_calls(state: Any, call_ids: list[str]) -> dict[str, Any]:
    """In a tool worker's main process: send the cancel signal to the pool process running
    each batch that holds one of ``call_ids`` (marked cancelled first: the signal only makes
    the process look whether the call it runs now is one of them)."""
    wanted = set(call_ids)
    signum = signal.Signals[CANCEL_SIGNAL]
    signalled = []
    for request in list(worker_state.active_requests):  # copied: the consumer mutates it
        if request.name == RUN_BATCH_TASK and wanted.intersection(batch_call_ids(request.kwargs)):
            request.terminate(state.consumer.pool, signal=signum)
            signalled.append(request.id)
    return {"ok": f"signalled {len(signalled)} batch(es)"}
