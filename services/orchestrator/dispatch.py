"""Sending tool calls to the tool workers, and taking them back.

All calls of a step go out as ONE Celery group, each to its tool's queue with its own time
limits (enforced by the prefork tool workers). Results are not read from Celery: workers
publish them on the turn's result stream, which ``gather`` reads. A call's id is also its
Celery task id, so a resumed runner can still revoke it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from celery import Celery, group

from shared.celery_app import RUN_TOOL_TASK
from shared.tool_contract import ToolCallRequest, ToolSpec

HARD_LIMIT_EXTRA_S = 2  # the hard kill comes this long after the soft limit asked nicely


class Dispatcher(Protocol):
    """Where tool calls go."""

    def send(self, calls: Sequence[tuple[ToolCallRequest, ToolSpec]]) -> None:
        """Start every call, in parallel."""
        ...

    def revoke(self, call_ids: Sequence[str]) -> None:
        """Stop calls that are no longer wanted (best effort)."""
        ...


class CeleryDispatcher:
    """``Dispatcher`` on the Celery ``tools*`` queues."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def send(self, calls: Sequence[tuple[ToolCallRequest, ToolSpec]]) -> None:
        """One group of ``tools.run_tool`` signatures, applied once; results are ignored."""
        if not calls:
            return
        signatures = [
            self.app.signature(
                RUN_TOOL_TASK,
                kwargs={"request": request.model_dump(mode="json")},
                queue=spec.queue,
                soft_time_limit=request.timeout_s,
                time_limit=request.timeout_s + HARD_LIMIT_EXTRA_S,
                task_id=request.call_id,
                ignore_result=True,
            )
            for request, spec in calls
        ]
        group(signatures, app=self.app).apply_async()

    def revoke(self, call_ids: Sequence[str]) -> None:
        """Revoke calls not yet started; a running one ends by its own time limit."""
        if call_ids:
            self.app.control.revoke(list(call_ids))
