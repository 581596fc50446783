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
  the calls before it ran ends ``timeout`` without starting, and is claimed as never run so
  that no redelivery runs it after all. The batch's hard limit (the kill, for a call deaf to
  its soft limit) is its latest deadline plus the usual extra; the worker's main process then
  reports ``timeout`` for every call of the batch, and the orchestrator keeps the first
  result of each (those that had ended keep theirs). A call deaf to a limit shorter than the
  batch's latest by more than the orchestrator's ``tool_grace_s`` may be judged ``lost`` at
  its own deadline before the kill's report comes.
- **Failure.** A call that fails in the worker itself (Redis away past the retries, a bug)
  is reported ``error`` on its own; the calls after it still run.
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
  when idempotent), and the rest run. The main process renews the heartbeat of every call
  of the batch whose claim its pool process holds (``heartbeat.py``): the running one, and
  those that ended, until the batch ends (they have their results; nobody waits on them).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery.worker import state as worker_state
from celery.worker.control import control_command

from signalbox.services.tools.execution import Deps, parse_request, report
from signalbox.shared.call_cancel import CANCEL_SIGNAL, STOP_BATCHED_CALLS
from signalbox.shared.celery_app import RUN_BATCH_TASK
from signalbox.shared.tool_contract import claim_unstarted

log = logging.getLogger(__name__)

# One call of a batch: (the request, the soft limit left to it) -> its status.
RunOne = Callable[[Mapping[str, Any], float], str]


def run_batch(
    raws: Sequence[Mapping[str, Any]], deps: Deps, run_one: RunOne, started: float
) -> list[str]:
    """Run the calls of a batch in order, each within what is left of its own time limit
    since ``started`` (``time.monotonic()`` at the batch's start); their statuses
    (``unstarted`` for a call whose limit passed first, ``failed`` for one the worker
    failed to run).

    ``run_one`` runs and reports one call (``tasks.py``: claim, metrics, the cancel signal)
    and returns its status, ``terminated`` when a signal stopped it.
    """
    statuses: list[str] = []
    for raw in raws:
        left = _time_limit(raw) - (time.monotonic() - started)
        if left <= 0:
            statuses.append(report_unstarted(raw, deps))
            continue
        try:
            statuses.append(run_one(raw, left))
        except Exception as exc:  # this call's failure is its own: the rest still run
            log.exception("call %s of a batch failed in its worker", raw.get("call_id"))
            statuses.append(report_failed(raw, deps, exc))
    return statuses


def _time_limit(raw: Mapping[str, Any]) -> float:
    limit = raw.get("timeout_s")
    # A bad request gets its full error report from run_call, which validates it.
    return float(limit) if isinstance(limit, int | float) else 1.0


def report_unstarted(raw: Mapping[str, Any], deps: Deps) -> str:
    """Claim as never run, and report ``timeout``, a call whose limit passed while the calls
    before it ran; ``unstarted``, or ``skipped`` if an earlier delivery had claimed it."""
    request = parse_request(raw)
    if request is None:
        return "skipped"  # run_call reports a bad request; this one never ran
    if not claim_unstarted(deps.redis, deps.keys, request.call_id):
        return "skipped"  # an earlier delivery of the batch ran it, and reported
    error = (
        f"{request.tool} did not start: the calls before it in its batch took its whole "
        f"time limit of {request.timeout_s:g} s"
    )
    log.warning("call %s (%s): %s", request.call_id, request.tool, error)
    report(request, deps, "timeout", error)
    return "unstarted"


def report_failed(raw: Mapping[str, Any], deps: Deps, exc: Exception) -> str:
    """Report ``error`` for a call the worker failed to run (as far as Redis lets it)."""
    request = parse_request(raw)
    if request is None:
        return "failed"
    error = (
        f"{request.tool} failed in its tool worker ({type(exc).__name__}: {exc}); "
        "it may or may not have taken effect"
    )
    try:
        report(request, deps, "error", error)
    except Exception:  # nowhere to report it: the orchestrator's deadline calls it lost
        log.exception("could not report the failure of call %s", request.call_id)
    return "failed"


def report_batch_killed(raws: Sequence[Mapping[str, Any]], deps: Deps, limit_s: float) -> None:
    """Publish ``timeout`` for every call of a batch killed at its hard time limit (in the
    worker's main process: the pool process is gone). The calls that had ended already
    reported; the orchestrator keeps the first result of a call and ignores this one.

    Through a Redis blip, all of them share one retry budget: the main process's loop must
    not stall for a budget per call.
    """
    deadline = time.monotonic() + deps.settings.result_publish_retry_s
    for raw in raws:
        request = parse_request(raw)
        if request is None:
            continue
        error = (
            f"{request.tool} was stopped at its batch's hard time limit of {limit_s:g} s "
            "(a call of the batch did not stop at its own limit); it may not have run"
        )
        left = max(0.0, deadline - time.monotonic())
        report(request, deps, "timeout", error, int(limit_s * 1000), retry_s=left)


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
    the process look whether the call it runs now is one of them).

    Celery's ``Request.terminate`` also lets the request go (the main process no longer
    counts it running), so the heartbeats of the batch's later calls stop: sound because a
    cancel names every open call of its turn, and a batch holds only one turn's calls, all of
    which the claim then refuses.
    """
    wanted = set(call_ids)
    signum = signal.Signals[CANCEL_SIGNAL]
    signalled = []
    for request in list(worker_state.active_requests):  # copied: the consumer mutates it
        if request.name == RUN_BATCH_TASK and wanted.intersection(batch_call_ids(request.kwargs)):
            request.terminate(state.consumer.pool, signal=signum)
            signalled.append(request.id)
    return {"ok": f"signalled {len(signalled)} batch(es)"}
