"""Sending tool calls to the tool workers, and taking them back.

All calls of a step go out as ONE Celery group, published in one Redis pipeline (kombu's
publish batch), each to its tool's queue with its own time limits (enforced by the prefork
tool workers). Results are not read from Celery: workers publish them on the turn's result
stream, which ``gather`` reads. A call's id is also its Celery task id, so a resumed runner
can still revoke it.

The step's calls of ``quick`` tools to one queue go as one ``tools.run_batch`` task (up to
``batch_max`` calls each; ``services/tools/batches.py`` says how every per-call guarantee
holds in it): its task id is its first call's id, and the calls of a cancelled turn are
refused at their claim, so a revoke reaches a batch as it reaches a call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import redis
from celery import Celery
from kombu.utils.uuid import uuid

from signalbox.shared.call_cancel import CANCEL_SIGNAL, STOP_BATCHED_CALLS, mark_cancelled
from signalbox.shared.celery_app import RUN_BATCH_TASK, RUN_TOOL_TASK
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import ToolCallRequest, ToolSpec

# The hard kill comes this long after the soft limit asked nicely. Short, because a call
# that ignores its soft limit is reported (by the worker's main process) only at the kill:
# a tool that does honour SoftTimeLimitExceeded needs only moments to return its result.
HARD_LIMIT_EXTRA_S = 0.1
PUBLISH_BATCH_MAX = 1000  # Redis commands per pipeline round trip; a step is far below
BATCH_MAX = 8  # quick calls per task by default: more tasks would spread them over more slots

Call = tuple[ToolCallRequest, ToolSpec]


def tasks_for(calls: Sequence[Call], batch_max: int) -> list[list[Call]]:
    """The tasks a step's calls go out as, in the calls' order: each call alone, except the
    calls of ``quick`` tools to one queue, which go ``batch_max`` at most to a task."""
    tasks: list[list[Call]] = []
    open_batch: dict[str, list[Call]] = {}
    for call in calls:
        spec = call[1]
        if batch_max < 2 or not spec.quick:
            tasks.append([call])
            continue
        batch = open_batch.get(spec.queue)
        if batch is None or len(batch) >= batch_max:
            batch = open_batch[spec.queue] = []
            tasks.append(batch)
        batch.append(call)
    return tasks


def time_limits(timeout_s: float) -> dict[str, Any]:
    """The per-call Celery options: the soft limit at ``timeout_s``, the kill just after.

    Seconds as floats: the prefork pool's timers take them (Celery's stubs say int).
    """
    return {"soft_time_limit": timeout_s, "time_limit": timeout_s + HARD_LIMIT_EXTRA_S}


class Dispatcher(Protocol):
    """Where tool calls go."""

    def send(self, calls: Sequence[Call]) -> None:
        """Start every call, in parallel."""
        ...

    def revoke(self, call_ids: Sequence[str]) -> None:
        """Stop calls that are no longer wanted (best effort)."""
        ...


class CeleryDispatcher:
    """``Dispatcher`` on the Celery ``tools*`` queues."""

    def __init__(
        self, app: Celery, client: redis.Redis, keys: RedisKeys, batch_max: int = BATCH_MAX
    ) -> None:
        self.app = app
        self.client = client
        self.keys = keys
        self.batch_max = batch_max  # 1: every call a task of its own

    def send(self, calls: Sequence[Call]) -> None:
        """Publish the step's ``tools.run_tool`` messages as one group, in one round trip.

        Every message carries the same ``group_id`` (what ``celery.group`` would give
        them) and goes out inside one kombu publish batch, so they leave in one Redis
        pipeline rather than one ``LPUSH`` each (64 calls: ~40 ms instead of ~200 ms on
        the benchmark machine). ``group.apply_async`` itself is not used: it joins every
        result to a barrier, which SUBSCRIBEs to each call's result key on the result
        backend (a round trip per call, and an UNSUBSCRIBE each later) for results that
        never come there (they come on the turn's result stream).
        """
        if not calls:
            return
        group_id = uuid()
        with self.app.producer_or_acquire() as producer, producer.batch(PUBLISH_BATCH_MAX):
            for index, task in enumerate(tasks_for(calls, self.batch_max)):
                first, spec = task[0]
                if len(task) == 1:
                    name = RUN_TOOL_TASK
                    kwargs: dict[str, Any] = {"request": first.model_dump(mode="json")}
                    # A short repr for monitoring: Celery's own walks the whole input.
                    shown = (
                        f"{{'request': {{'call_id': {first.call_id!r}, 'tool': {first.tool!r}}}}}"
                    )
                    limits = time_limits(first.timeout_s)
                else:
                    name = RUN_BATCH_TASK
                    kwargs = {"requests": [r.model_dump(mode="json") for r, _ in task]}
                    shown = f"{{'requests': {[r.call_id for r, _ in task]!r}}}"
                    # Each call's soft limit is the batch's to keep; the kill comes after all.
                    latest = max(r.timeout_s for r, _ in task)
                    limits = {"time_limit": latest + HARD_LIMIT_EXTRA_S}
                self.app.send_task(
                    name,
                    kwargs=kwargs,
                    kwargsrepr=shown,
                    queue=spec.queue,
                    task_id=first.call_id,
                    group_id=group_id,
                    group_index=index,
                    ignore_result=True,
                    producer=producer,
                    add_to_parent=False,
                    **limits,
                )

    def revoke(self, call_ids: Sequence[str]) -> None:
        """Revoke calls not yet started, and stop running ones: the worker's main process
        signals the pool process running each, which stops the call and tears its sandbox
        down (``services/tools/termination.py``) if that call is still the one it runs.

        The calls are marked cancelled first (``shared/call_cancel.py``): the signal goes to
        a process, which may have moved on to another tenant's call when it lands. A call of
        a batch is reached by ``stop_batched_calls`` (``services/tools/batches.py``); one
        not started yet is refused at its claim.
        """
        if call_ids:
            mark_cancelled(self.client, self.keys, call_ids)
            self.app.control.revoke(list(call_ids), terminate=True, signal=CANCEL_SIGNAL)
            if self.batch_max > 1:
                self.app.control.broadcast(
                    STOP_BATCHED_CALLS, arguments={"call_ids": list(call_ids)}
                )
