"""The gateway's entry point: ``python -m signalbox.services.gateway.app --host H --port P``.

``main`` builds uvicorn's config from the gateway's settings (``server_config``), so the
limits the server must enforce while it reads (the WebSocket frame size) come from
``SIGNALBOX_*`` like every other setting, and no command line can leave one out.
``signalbox up``, docker-compose.yml and the tests all start the gateway through it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from signalbox.services.gateway import redaction, ws
from signalbox.services.gateway.errors import GatewayError
from signalbox.services.gateway.routes import (
    activity,
    admin,
    agents,
    agui,
    conversation_admin,
    conversations,
    files,
    health,
    interactions,
    me,
    proposals,
    schedules,
    tickets,
    turns,
    ui,
    uploads,
    usage,
    webhooks,
    workspaces,
)
from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.webhook_deliverer import WebhookDeliverer
from signalbox.shared.body_limit import BodyLimit
from signalbox.shared.file_modes import keep_new_files_private
from signalbox.shared.gc_freeze import freeze_startup_objects
from signalbox.shared.log_config import configure_logging
from signalbox.shared.settings import GatewaySettings, SettingsError, load
from signalbox.shared.tracing import configure_tracing, fastapi_telemetry, shutdown_tracing

# uvicorn's own protocol on the websockets library: its frame parser checks the length in
# each frame header (and the running total of a fragmented or compressed message) against
# ws_max_size before it reads the payload, and fails the connection with 1009.
WS_PROTOCOL = "websockets-sansio"


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway app; settings are read from ``SIGNALBOX_*`` once, here."""
    settings = settings or load(GatewaySettings)
    logging.getLogger("signalbox.services.gateway").setLevel(settings.log_level)
    redaction.install()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway = Gateway.build(settings)
        app.state.gateway = gateway
        deliverer = WebhookDeliverer(gateway.sessions, settings)  # webhooks, from SQL
        deliverer.start()
        try:
            yield
        finally:
            deliverer.stop()
            await gateway.aclose()

    # /docs and /redoc are served by ui.router from vendored assets (they work offline).
    app = FastAPI(
        title="Signalbox gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        telemetry=fastapi_telemetry(),  # its spans go nowhere unless tracing is configured
    )

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        request.app.state.gateway.metrics.errors.labels(exc.code).inc()
        return JSONResponse(
            {"detail": exc.message, "code": exc.code}, exc.http_status, headers=exc.headers()
        )

    for router in (
        health.router,
        agui.router,
        me.router,
        admin.router,
        activity.router,
        files.router,
        conversation_admin.router,
        tickets.router,
        conversations.router,
        turns.router,
        interactions.router,
        workspaces.router,
        proposals.router,
        ws.router,
        ui.router,
        usage.router,
        uploads.router,
        agents.router,
        webhooks.router,
        schedules.router,
    ):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=ui.STATIC_DIR), name="static")
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.http_max_body_bytes,
        setting="SIGNALBOX_HTTP_MAX_BODY_BYTES",
        paths={
            uploads.UPLOAD_PATH: (settings.upload_max_bytes, "SIGNALBOX_UPLOAD_MAX_BYTES"),
        },
    )
    return app


def server_config(
    app: FastAPI, settings: GatewaySettings, host: str, port: int, **options: Any
) -> uvicorn.Config:
    """uvicorn's config serving ``app`` built on ``settings``: the one place the server's
    limits are set.

    ``ws_max_size`` is the frame limit enforced while reading: a frame announcing more than
    ``SIGNALBOX_WS_MAX_FRAME_BYTES`` is refused from its header, before its payload is
    buffered (the session's check of each message, after, is then a second guard only).
    ``options`` are further ``uvicorn.Config`` arguments (tests pass ``log_level``).
    uvicorn leaves logging as ``configure_logging`` set it (``log_config=None``).
    """
    options.setdefault("log_config", None)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws=WS_PROTOCOL,
        ws_max_size=settings.ws_max_frame_bytes,
        ws_per_message_deflate=settings.ws_per_message_deflate,
        access_log=False,  # a ticket rides in the /ws query string; redaction covers the rest
        lifespan="on",
        **options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the gateway until stopped; 1 with a message naming the variable on bad settings."""
    parser = argparse.ArgumentParser(
        prog="python -m signalbox.services.gateway.app", description="Serve the Signalbox gateway."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    args = parser.parse_args(argv)
    keep_new_files_private()  # the workspace directories it creates
    try:
        settings = load(GatewaySettings)
    except SettingsError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    configure_logging("gateway", settings.log_level, settings.log_format)
    configure_tracing("signalbox-gateway")  # before the app: its clients are instrumented
    try:
        app = create_app(settings)
        freeze_startup_objects()  # built: what exists now lives as long as the process
        uvicorn.Server(server_config(app, settings, args.host, args.port)).run()
    finally:
        shutdown_tracing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
