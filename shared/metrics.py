"""Prometheus plumbing every service shares: bounded labels, Celery queue depth, and the
``/metrics`` server of a Celery worker (prefork-safe).

The HTTP services serve ``/metrics`` on their own app (each app its own registry). A Celery
worker has no app: ``serve_worker_metrics`` starts prometheus_client's HTTP server in the
worker's main process when ``SIGNALBOX_METRICS_PORT`` is set. A prefork worker (the tool
workers) counts in its pool children, so it runs prometheus_client's multiprocess mode:
each process writes its values to files in ``PROMETHEUS_MULTIPROC_DIR``, which the main
process sums at scrape time. The directory is emptied when the worker starts (values of a
previous run would otherwise be added in) and a child's live gauges are dropped when it
exits — or, killed at a hard time limit, at the next scrape.

Labels are bounded sets: user classes, never user ids; tool and model names through a
``LabelCap``, so names a model invents or an MCP server lists by the thousand cannot
multiply the series.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_init, worker_process_shutdown, worker_shutdown
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess, start_http_server, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from signalbox.shared.celery_app import (
    ORCHESTRATOR_QUEUE,
    SANDBOX_QUEUE,
    SCHEDULER_QUEUE,
    TOOLS_QUEUE,
)
from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings

log = logging.getLogger(__name__)

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own variable
OTHER = "other"  # the label of every value past a cap
# The queues every deployment has; a tool worker adds the ones it consumes (SIGNALBOX_TOOL_QUEUES).
DEPLOYMENT_QUEUES = (ORCHESTRATOR_QUEUE, TOOLS_QUEUE, SANDBOX_QUEUE, SCHEDULER_QUEUE)
# kombu's Redis transport keeps one list per priority step (its default steps).
PRIORITY_STEPS = (0, 3, 6, 9)
SCRAPE_REDIS_TIMEOUT_S = 2.0  # a scrape must not hang on a dead Redis
_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w+?_(\d+)\.db$")


def user_class(is_admin: bool) -> str:
    """The label of a user in per-class metrics: a bounded set, never the user's id."""
    return "admin" if is_admin else "user"


class LabelCap:
    """Label values from a set that may grow (tools, models), capped at ``limit`` distinct
    values: a known value is its own label, anything else ``other``.

    ``allow`` adds names the service itself vouches for (its registry, the live catalogue),
    so a tool name a model made up never becomes a label; ``admit`` takes the first
    ``limit`` names as they come (models: configured by admins, a few per deployment).
    """

    def __init__(self, limit: int, allowed: Iterable[str] = ()) -> None:
        self.limit = limit
        self._known: set[str] = set()
        self._lock = threading.Lock()
        self.allow(allowed)

    def allow(self, names: Iterable[str]) -> None:
        """Vouch for ``names``; those past the limit stay ``other``."""
        with self._lock:
            for name in names:
                if len(self._known) >= self.limit:
                    return
                self._known.add(name)

    def admit(self, name: str) -> str:
        """``name``'s label, vouching for it first if the cap has room."""
        if name not in self._known:
            self.allow([name])
        return self(name)

    def __call__(self, name: str) -> str:
        """``name`` if it was vouched for, else ``other``."""
        return name if name in self._known else OTHER


class CeleryQueues(Collector):
    """``signalbox_celery_queue_length{queue}`` (messages waiting, every priority) and
    ``signalbox_celery_unacked`` (delivered, not yet acknowledged), read from Redis at each
    scrape in one round trip. Every worker reports the same numbers: take ``max``."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, queues: Iterable[str]) -> None:
        self.client = client
        self.keys = keys
        self.queues = sorted(set(queues))

    def collect(self) -> Iterator[Metric]:
        """One pipeline of LLENs and an HLEN; nothing (and a warning) if Redis is down."""
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            for step in PRIORITY_STEPS:
                pipe.llen(self.keys.celery_queue(queue, step))
        pipe.hlen(self.keys.celery_unacked())
        try:
            replies: list[Any] = pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics: Celery queue lengths unavailable: %r", exc)
            return
        lengths = GaugeMetricFamily(
            "signalbox_celery_queue_length",
            "Messages waiting in a Celery queue (all priorities), read from Redis at scrape time",
            labels=["queue"],
        )
        per_queue = len(PRIORITY_STEPS)
        for i, queue in enumerate(self.queues):
            per_priority = replies[i * per_queue : (i + 1) * per_queue]
            lengths.add_metric([queue], sum(int(n) for n in per_priority))
        yield lengths
        yield GaugeMetricFamily(
            "signalbox_celery_unacked",
            "Celery messages delivered to a worker and not yet acknowledged (every queue)",
            value=int(replies[-1]),
        )


def enable_multiprocess(path: str | None = None) -> str:
    """Switch this process (and the pool children it forks later) to multiprocess mode.

    Call in the worker's main process before any metric is created and before the pool
    forks. ``path`` (default: ``$PROMETHEUS_MULTIPROC_DIR``, else a new temporary directory)
    is emptied: it must belong to this worker alone. Returns the directory.
    """
    path = path or os.environ.get(MULTIPROC_DIR_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="signalbox-metrics-")
    os.makedirs(path, exist_ok=True)
    for stale in glob.glob(os.path.join(path, "*.db")):
        os.remove(stale)
    os.environ[MULTIPROC_DIR_ENV] = path
    # prometheus_client picks its value class when imported; metrics made from now on
    # write to files in ``path`` instead of the process's memory.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return path


def multiprocess_enabled() -> bool:
    """Whether this process's metrics are written to files (``enable_multiprocess``)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_dead(pid: int, path: str | None = None) -> None:
    """Drop the live gauges of a pool process that ended (its counters stay counted)."""
    multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


class _MultiProcessCollector(Collector):
    """Sums every process's files; first drops the live gauges of children that died
    without a word (killed at a hard time limit: no shutdown signal ran in them)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.files = multiprocess.MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        for name in glob.glob(os.path.join(self.path, "gauge_live*.db")):
            found = _LIVE_GAUGE_FILE.search(os.path.basename(name))
            if found and not _alive(int(found.group(1))):
                mark_dead(int(found.group(1)), self.path)
        metrics: Iterable[Metric] = self.files.collect()  # type: ignore[no-untyped-call]
        return metrics


def worker_registry(multiproc_dir: str | None) -> CollectorRegistry:
    """What a worker's ``/metrics`` serves: every process's files summed (multiprocess), or
    this process's default registry."""
    if multiproc_dir is None:
        return REGISTRY
    registry = CollectorRegistry()
    registry.register(_MultiProcessCollector(multiproc_dir))
    return registry


@dataclass
class WorkerMetrics:
    """The metrics server of one Celery worker (main process)."""

    port: int
    registry: CollectorRegistry
    stop: Callable[[], None]
    temporary_dir: str | None = None  # a multiprocess directory it made, removed at the end


def serve(port: int, host: str, registry: CollectorRegistry) -> tuple[int, Callable[[], None]]:
    """Start the HTTP server in a daemon thread; the bound port (``0``: any free one) and a
    function that stops it."""
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return int(server.server_port), stop


def serve_worker_metrics(
    app: Celery,
    settings: CommonSettings,
    queues: Iterable[str] = (),
    multiprocess_pool: bool = False,
) -> None:
    """Serve ``/metrics`` from ``app``'s worker on ``SIGNALBOX_METRICS_PORT`` (unset: not at
    all), with the deployment's Celery queue lengths. ``multiprocess_pool``: the pool forks
    (prefork), so its children's metrics are summed from files.

    Wired to the worker's own signals, so importing the app elsewhere (``celery inspect``,
    a client) starts nothing and empties no directory.
    """
    if settings.metrics_port is None:
        return
    port = settings.metrics_port
    served: list[WorkerMetrics] = []

    @worker_init.connect(weak=False)
    def _start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is not app:
            return  # another app's worker in this process (tests)
        given = os.environ.get(MULTIPROC_DIR_ENV)
        path = enable_multiprocess(given) if multiprocess_pool else None
        registry = worker_registry(path)
        client = sync_client(
            settings.redis_url,
            socket_connect_timeout=SCRAPE_REDIS_TIMEOUT_S,
            socket_timeout=SCRAPE_REDIS_TIMEOUT_S,
        )
        registry.register(
            CeleryQueues(client, RedisKeys(settings.redis_prefix), [*DEPLOYMENT_QUEUES, *queues])
        )
        try:
            bound, stop = serve(port, settings.metrics_host, registry)
        except OSError as exc:
            # Raised as SystemExit: Celery's signal dispatch swallows an Exception, and a
            # worker asked for metrics that it cannot serve should say so by not starting.
            raise SystemExit(
                f"signalbox worker: cannot serve metrics on {settings.metrics_host}:{port} "
                f"(SIGNALBOX_METRICS_PORT): {exc}"
            ) from None
        served.append(WorkerMetrics(bound, registry, stop, None if given else path))
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, bound)

    @worker_process_shutdown.connect(weak=False)
    def _child_exits(pid: int | None = None, **_: Any) -> None:
        if multiprocess_pool and multiprocess_enabled():
            mark_dead(pid or os.getpid())

    @worker_shutdown.connect(weak=False)
    def _stop(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is not app:
            return
        while served:
            worker = served.pop()
            worker.stop()
            if worker.temporary_dir is not None:
                shutil.rmtree(worker.temporary_dir, ignore_errors=True)
