"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from sqlalchemy import text

from signalbox.services.gateway.deps import GatewayDep
from signalbox.services.gateway.metrics import CONTENT_TYPE

router = APIRouter()
log = logging.getLogger(__name__)

READY_TIMEOUT_S = 2.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gateway: GatewayDep) -> JSONResponse:
    """200 when Redis and SQL both answer, else 503 naming which did not."""
    checks: dict[str, str] = {}
    try:
        await asyncio.wait_for(gateway.redis.ping(), READY_TIMEOUT_S)
        checks["redis"] = "ok"
    except Exception as exc:
        log.warning("readyz: redis: %r", exc)
        checks["redis"] = "unavailable"
    try:
        await asyncio.wait_for(
            gateway.db(lambda s: s.execute(text("SELECT 1")).scalar_one()), READY_TIMEOUT_S
        )
        checks["sql"] = "ok"
    except Exception as exc:
        log.warning("readyz: sql: %r", exc)
        checks["sql"] = "unavailable"
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", **checks}, 200 if ok else 503)


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    """Prometheus text format; turn counts are read from SQL at each scrape."""
    try:
        prefix = gateway.settings.redis_prefix
        await gateway.db(lambda s: gateway.metrics.refresh_turns(s, prefix))
    except Exception as exc:
        # A scrape during an SQL outage still reports the process's own metrics.
        log.warning("metrics: turn counts unavailable: %r", exc)
    return Response(gateway.metrics.render(), media_type=CONTENT_TYPE)
