"""Entry point of the tool workers: ``celery -A services.tools.worker:app worker --pool prefork``.

Prefork, because only that pool enforces the per-call time limits. The main process
announces this worker's tools when it is ready and withdraws them when it stops.
"""

from __future__ import annotations

from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown

from services.tools.catalogue import CatalogueRefresher, load_tools
from shared.celery_app import make_celery
from shared.redis_keys import RedisKeys
from shared.settings import ToolsSettings, load

settings = load(ToolsSettings)
app = make_celery("signalbox-tools", settings, include=["services.tools.tasks"])

_refresher: CatalogueRefresher | None = None


@worker_ready.connect
def _announce(sender: Any, **_: Any) -> None:
    global _refresher
    _refresher = CatalogueRefresher(
        client=redis.Redis.from_url(settings.redis_url),
        keys=RedisKeys(settings.redis_prefix),
        worker_id=str(sender.hostname),
        specs=load_tools().specs(),
        refresh_s=settings.catalogue_refresh_s,
    )
    _refresher.start()


@worker_shutdown.connect
def _withdraw(**_: Any) -> None:
    if _refresher is not None:
        _refresher.stop()
