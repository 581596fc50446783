"""The gateway's entry point: ``uvicorn services.gateway.app:create_app --factory``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from services.gateway import redaction, ws
from services.gateway.errors import GatewayError
from services.gateway.routes import (
    conversations,
    health,
    proposals,
    tickets,
    turns,
    ui,
    workspaces,
)
from services.gateway.state import Gateway
from shared.settings import GatewaySettings, load


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway app; settings are read from ``SIGNALBOX_*`` once, here."""
    settings = settings or load(GatewaySettings)
    logging.getLogger("services.gateway").setLevel(settings.log_level)
    redaction.install()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway = Gateway.build(settings)
        app.state.gateway = gateway
        try:
            yield
        finally:
            await gateway.aclose()

    app = FastAPI(title="Signalbox gateway", lifespan=lifespan)

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        request.app.state.gateway.metrics.errors.labels(exc.code).inc()
        return JSONResponse({"detail": exc.message, "code": exc.code}, exc.http_status)

    for router in (
        health.router,
        tickets.router,
        conversations.router,
        turns.router,
        workspaces.router,
        proposals.router,
        ws.router,
        ui.router,
    ):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=ui.STATIC_DIR), name="static")
    return app
