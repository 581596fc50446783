"""Entry point of the tool workers: ``celery -A services.tools.worker:app worker --pool prefork``.

Prefork, because only that pool enforces the per-call time limits. The tools (built-in,
the deployment's, MCP servers') are found once, here at import in the main process, so the
pool's children inherit them. The main process announces the tools of the queues it
consumes when it is ready and withdraws them when it stops.
"""

from __future__ import annotations

from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown

from services.tools.catalogue import CatalogueRefresher, served, worker_tools
from services.tools.sandbox import protect_worker
from shared.celery_app import make_celery
from shared.redis_keys import RedisKeys
from shared.settings import ToolsSettings, load

protect_worker()  # before any secret is read: sandboxed code must not read our environ
settings = load(ToolsSettings)
app = make_celery("signalbox-tools", settings, include=["services.tools.tasks"])
registry = worker_tools(settings)

_refresher: CatalogueRefresher | None = None


def _consumed_queues(consumer: Any) -> list[str] | None:
    try:
        return list(consumer.app.amqp.queues.consume_from)
    except AttributeError:  # not a Celery consumer (e.g. a test's sender): announce all
        return None


@worker_ready.connect
def _announce(sender: Any, **_: Any) -> None:
    global _refresher
    _refresher = CatalogueRefresher(
        client=redis.Redis.from_url(settings.redis_url),
        keys=RedisKeys(settings.redis_prefix),
        worker_id=str(sender.hostname),
        specs=served(registry.specs(), _consumed_queues(sender)),
        refresh_s=settings.catalogue_refresh_s,
    )
    _refresher.start()


@worker_shutdown.connect
def _withdraw(**_: Any) -> None:
    if _refresher is not None:
        _refresher.stop()
