"""Prometheus metrics of a tool worker: each run of a tool, as the worker saw it.

The worker runs prefork, so runs are counted in pool children: the metrics are made on
first use in each process, after the main process switched prometheus_client to
multiprocess mode (``shared/metrics.py``, at ``worker_init``), and the main process's
``/metrics`` sums every child's. A call's end-to-end outcome (``lost`` included) is the
orchestrator's ``signalbox_tool_calls_total``; this is the worker's side of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from signalbox.services.tools.registry import Registry
from signalbox.shared.metrics import LabelCap

# Built-in tools are a dozen; a deployment's and MCP servers' may be many: past this, "other".
MAX_TOOL_LABELS = 500
RUN_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ToolRunMetrics:
    """The series of one worker process (not registered: served from the multiprocess
    files, or, without a metrics port, nowhere)."""

    def __init__(self, tool_names: Iterable[str]) -> None:
        self.tools = LabelCap(MAX_TOOL_LABELS, tool_names)
        self.runs = Counter(
            "signalbox_tool_runs",
            "Tool runs in the tool workers, by tool and status (ok, error, timeout, killed, "
            "terminated, skipped; unstarted and failed: a call of a batch that did not start "
            "before its limit, or that its worker failed to run)",
            ["tool", "status"],
            registry=None,
        )
        self.seconds = Histogram(
            "signalbox_tool_run_seconds",
            "How long a tool ran in its worker (the result's duration_ms)",
            ["tool"],
            buckets=RUN_SECONDS_BUCKETS,
            registry=None,
        )
        self.running = Gauge(
            "signalbox_tool_runs_in_progress",
            "Tool runs going on now, summed over the worker's pool processes",
            registry=None,
            multiprocess_mode="livesum",
        )

    def ran(self, tool: str, status: str, duration_ms: int | None = None) -> None:
        """Count one run that ended with ``status``."""
        label = self.tools(tool)
        self.runs.labels(label, status).inc()
        if duration_ms is not None:
            self.seconds.labels(label).observe(duration_ms / 1000)


_made: tuple[int, ToolRunMetrics] | None = None


def run_metrics(registry: Registry) -> ToolRunMetrics:
    """This process's metrics, made on first use after a fork (so in multiprocess mode each
    pool child writes its own files); ``registry``'s tools are the labels."""
    global _made
    if _made is None or _made[0] != os.getpid():
        _made = (os.getpid(), ToolRunMetrics(registry.names()))
    return _made[1]
