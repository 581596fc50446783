"""Entry point: ``uvicorn services.proposals.app:create_app --factory``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from services.proposals import outbox, recovery
from services.proposals.context import ServiceContext
from services.proposals.errors import ProposalError
from services.proposals.routes import router
from services.proposals.sweeper import Sweeper
from shared.settings import ProposalsSettings, load

log = logging.getLogger(__name__)


async def _proposal_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProposalError)
    return JSONResponse(exc.body(), status_code=exc.status_code)


def create_app(settings: ProposalsSettings | None = None) -> FastAPI:
    """The proposals service, on ``settings`` (default: read from ``SIGNALBOX_*``)."""
    ctx = ServiceContext.from_settings(settings or load(ProposalsSettings))

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

    app = FastAPI(title="Signalbox proposals", lifespan=lifespan)
    app.state.context = ctx
    app.add_exception_handler(ProposalError, _proposal_error)
    app.include_router(router)
    return app
