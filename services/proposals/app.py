"""The proposals service's entry point:
``python -m signalbox.services.proposals.app --host H --port P``.

Like the gateway's, ``main`` sets what the server must enforce itself: a body limit checked
while reading (``shared/body_limit.py``), no access log, and a umask of 077, so the
temporary files and directories an apply creates in a workspace are the service user's
alone. ``create_app`` stays the factory the tests serve.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from signalbox.services.proposals import metrics, outbox, recovery
from signalbox.services.proposals.context import ServiceContext
from signalbox.services.proposals.errors import ProposalError
from signalbox.services.proposals.routes import router
from signalbox.services.proposals.sweeper import Sweeper
from signalbox.shared.body_limit import BodyLimit
from signalbox.shared.file_modes import keep_new_files_private
from signalbox.shared.gc_freeze import freeze_startup_objects
from signalbox.shared.log_config import configure_logging
from signalbox.shared.settings import ProposalsSettings, SettingsError, load
from signalbox.shared.tracing import configure_tracing, fastapi_telemetry, shutdown_tracing

log = logging.getLogger(__name__)


async def _proposal_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProposalError)
    return JSONResponse(exc.body(), status_code=exc.status_code)


def create_app(settings: ProposalsSettings | None = None) -> FastAPI:
    """The proposals service, on ``settings`` (default: read from ``SIGNALBOX_*``)."""
    settings = settings or load(ProposalsSettings)
    ctx = ServiceContext.from_settings(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Files of an apply killed half-way go back to their old state before we serve.
        try:
            await run_in_threadpool(recovery.recover, ctx)
        except Exception:
            log.exception("apply journal recovery at start-up failed; the sweep retries it")
        # Decisions committed before a crash but never announced go out now.
        try:
            sent = await run_in_threadpool(outbox.relay, ctx)
            if sent:
                log.info("outbox relay at start-up sent %d message(s)", sent)
        except Exception:
            log.exception("outbox relay at start-up failed; the sweep retries it")
        sweeper = Sweeper(ctx, ctx.settings.outbox_sweep_s)
        sweeper.start()
        try:
            yield
        finally:
            await run_in_threadpool(sweeper.stop)
            ctx.close()

    app = FastAPI(title="Signalbox proposals", lifespan=lifespan, telemetry=fastapi_telemetry())
    app.state.context = ctx
    app.state.metrics = metrics.ProposalsMetrics(ctx.sessions)
    app.add_exception_handler(ProposalError, _proposal_error)
    app.include_router(router)
    app.include_router(metrics.router)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.proposals_max_body_bytes,
        setting="SIGNALBOX_PROPOSALS_MAX_BODY_BYTES",
    )
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the proposals service until stopped; 1 with a message on bad settings."""
    parser = argparse.ArgumentParser(
        prog="python -m signalbox.services.proposals.app",
        description="Serve the proposals service.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="port (default 8001)")
    args = parser.parse_args(argv)
    keep_new_files_private()
    try:
        settings = load(ProposalsSettings)
    except SettingsError as exc:
        print(f"proposals: {exc}", file=sys.stderr)
        return 1
    configure_logging("proposals", settings.log_level, settings.log_format)
    configure_tracing("signalbox-proposals")  # before the app: its clients are instrumented
    try:
        app = create_app(settings)
        freeze_startup_objects()  # built: what exists now lives as long as the process
        # log_config=None: uvicorn leaves logging as configure_logging set it.
        uvicorn.run(
            app, host=args.host, port=args.port, access_log=False, lifespan="on", log_config=None
        )
    finally:
        shutdown_tracing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
