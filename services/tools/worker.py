"""Entry point of the tool workers:
``celery -A signalbox.services.tools.worker:app worker --pool prefork``.

Prefork, because only that pool enforces the per-call time limits. The tools (built-in,
the deployment's, MCP servers') are found once, here at import in the main process, so the
pool's children inherit them. The main process announces the tools of the queues it
consumes when it is ready and withdraws them when it stops.

A worker that consumes ``tools.sandbox`` first proves the sandbox holds on this host (a
trial run under bubblewrap and a per-run cgroup) and exits with the reason if it does not,
before the pool starts: ``run_python`` never runs unconfined. ``SIGNALBOX_SANDBOX=off`` is
the explicit way out, and it removes ``run_python`` from what the worker serves.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_init, worker_ready, worker_shutdown

from signalbox.services.tools.catalogue import CatalogueRefresher, served, worker_tools
from signalbox.services.tools.heartbeat import CallHeartbeat
from signalbox.services.tools.sandbox import protect_worker, unavailable
from signalbox.services.tools.task_events import BatchedTaskEvents
from signalbox.shared.celery_app import SANDBOX_QUEUE, make_celery
from signalbox.shared.gc_freeze import freeze_when_started
from signalbox.shared.log_config import celery_logging
from signalbox.shared.metrics import serve_worker_metrics
from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings, load
from signalbox.shared.tracing import trace_celery_worker

log = logging.getLogger(__name__)

protect_worker()  # before any secret is read: no other process of our user may read our environ
settings = load(ToolsSettings)
celery_logging("tools", settings.log_level, settings.log_format)
app = make_celery("signalbox-tools", settings, include=["signalbox.services.tools.tasks"])
trace_celery_worker("signalbox-tools")
app.steps["consumer"].add(BatchedTaskEvents)  # task events in batches (task_events.py)
registry = worker_tools(settings)
# At worker_init, before the pool forks: its processes inherit the frozen objects.
freeze_when_started(worker_init, app)
# Prefork: the pool children's runs are summed from files (prometheus_client multiprocess).
serve_worker_metrics(
    app,
    settings,
    queues=[*settings.tool_queues.values(), *(s.queue for s in settings.mcp_servers.values())],
    multiprocess_pool=True,
)

_refresher: CatalogueRefresher | None = None
_heartbeat: CallHeartbeat | None = None


def _consumed_queues(consumer: Any) -> list[str] | None:
    try:
        return list(consumer.app.amqp.queues.consume_from)
    except AttributeError:  # not a Celery consumer (e.g. a test's sender): announce all
        return None


@worker_init.connect
def _refuse_an_unconfined_sandbox(sender: Any, **_: Any) -> None:
    """Exit before the pool starts if this worker would serve run_python and cannot confine it."""
    queues = _consumed_queues(sender)
    if queues is not None and SANDBOX_QUEUE not in queues:
        return
    if settings.sandbox == "off":
        log.warning("run_python is off (SIGNALBOX_SANDBOX=off): this worker does not serve it")
        return
    reason = unavailable(settings.sandbox_bwrap)
    if reason is not None:
        message = (
            f"signalbox tools worker: refusing to consume {SANDBOX_QUEUE!r}, the run_python "
            f"sandbox cannot hold on this host: {reason}. Install bubblewrap and run this "
            "worker as root (docs/tools.md), consume other queues only (-Q tools), or set "
            "SIGNALBOX_SANDBOX=off to serve no run_python at all."
        )
        raise SystemExit(message)  # celery's signal dispatch swallows Exceptions, not this


@worker_ready.connect
def _announce(sender: Any, **_: Any) -> None:
    global _refresher
    _refresher = CatalogueRefresher(
        client=sync_client(settings.redis_url),
        keys=RedisKeys(settings.redis_prefix),
        worker_id=str(sender.hostname),
        specs=served(registry.specs(), _consumed_queues(sender)),
        refresh_s=settings.catalogue_refresh_s,
    )
    _refresher.start()


@worker_ready.connect
def _start_heartbeat(**_: Any) -> None:
    # In the main process: it outlives a pool process that dies, and runs no tool code.
    global _heartbeat
    _heartbeat = CallHeartbeat(
        client=sync_client(settings.redis_url),
        keys=RedisKeys(settings.redis_prefix),
        interval_s=settings.call_heartbeat_s,
        ttl_s=settings.call_heartbeat_ttl_s,
    )
    _heartbeat.start()


@worker_shutdown.connect
def _withdraw(**_: Any) -> None:
    if _refresher is not None:
        _refresher.stop()
    if _heartbeat is not None:
        _heartbeat.stop()
