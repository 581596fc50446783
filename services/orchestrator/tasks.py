"""The orchestrator's one task: ``orchestrator.run_turn(turn_id)``. It only builds the
dependencies (once per process) and calls the loop; the logic is in ``loop.py``. At worker
start it also starts the process's background threads: the turn reconciler
(``recovery.py``) and the approvals feed (``approvals.py``); both stop at shutdown."""

from __future__ import annotations

import logging
import threading
from functools import cache
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from signalbox.services.orchestrator.anthropic_model import AnthropicModel, unset_if_empty
from signalbox.services.orchestrator.approvals import ApprovalFeed
from signalbox.services.orchestrator.demo_model import DemoModel
from signalbox.services.orchestrator.dispatch import CeleryDispatcher
from signalbox.services.orchestrator.loop import Runtime
from signalbox.services.orchestrator.loop import run_turn as run_turn_loop
from signalbox.services.orchestrator.model import Model
from signalbox.services.orchestrator.pricing import PriceTable
from signalbox.services.orchestrator.recovery import Reconciler
from signalbox.services.orchestrator.token_count import ApiTokenCounter, TokenCounter
from signalbox.services.orchestrator.tool_slots import ToolSlots
from signalbox.services.orchestrator.worker import app, hooks, policy, settings
from signalbox.shared.celery_app import (
    RUN_TURN_TASK,
    SCHEDULER_QUEUE,
    SYNC_ALARM_TASK,
    send_run_turn,
)
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.events import turn_finished
from signalbox.shared.log_context import bind_log_context
from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import OrchestratorSettings
from signalbox.shared.statuses import TurnState

log = logging.getLogger(__name__)
_build_lock = threading.Lock()  # the threads pool may start several turns at once
APPROVALS_CLIENT_NAME = "signalbox-orchestrator-approvals"


def make_model(settings: OrchestratorSettings) -> Model:
    """The real model when an API key is set, else the clearly labelled offline demo."""
    api_key = unset_if_empty(settings.anthropic_api_key)
    if api_key is None:
        log.warning("ANTHROPIC_API_KEY is not set: using the offline demo model")
        return DemoModel(cache_ttl=settings.prompt_cache_ttl)
    return AnthropicModel(
        api_key, settings.anthropic_base_url, settings.model, cache_ttl=settings.prompt_cache_ttl
    )


def make_counter(settings: OrchestratorSettings, model: Model) -> TokenCounter | None:
    """The API's token counting for the real model (unless turned off); None estimates."""
    if settings.token_counting == "api" and isinstance(model, AnthropicModel):
        return ApiTokenCounter(model.client, settings.model)
    return None


@cache
def _runtime() -> Runtime:
    sessions = make_session_factory(make_engine(settings.database_url))
    keys = RedisKeys(settings.redis_prefix)
    # Its own connection pool, named so an operator can tell it apart in CLIENT LIST.
    feed_client = sync_client(settings.redis_url, client_name=APPROVALS_CLIENT_NAME)
    model = make_model(settings)
    client = sync_client(settings.redis_url)
    return Runtime(
        settings=settings,
        sessions=sessions,
        redis=client,
        keys=keys,
        model=model,
        dispatcher=CeleryDispatcher(app, client, keys, settings.tool_batch_max),
        enqueue_turn=lambda turn_id: send_run_turn(app, turn_id),
        sync_alarm=lambda alarm_id: app.send_task(
            SYNC_ALARM_TASK, args=[alarm_id], queue=SCHEDULER_QUEUE
        ),
        policy=policy,
        approvals=ApprovalFeed(feed_client, keys.approvals_channel, sessions),
        prices=PriceTable.load(settings.price_file),
        tokens=make_counter(settings, model),
        hooks=hooks,
        tool_slots=(
            ToolSlots(client, keys, settings.max_tool_calls_per_user)
            if settings.max_tool_calls_per_user
            else None
        ),
    )


def runtime() -> Runtime:
    """This process's dependencies, built on first use."""
    with _build_lock:
        return _runtime()


_reconciler: Reconciler | None = None


@worker_ready.connect
def _start_background(**_: Any) -> None:
    global _reconciler
    rt = runtime()
    # Orphans (a dead runner's turn) every orphan_sweep_s, the rest every reconcile_s.
    _reconciler = Reconciler(
        rt.sessions,
        rt.redis,
        rt.keys,
        rt.enqueue_turn,
        settings.reconcile_s,
        orphans_s=settings.orphan_sweep_s,
        admit=rt.admit_waiting_turns,
    )
    _reconciler.start()
    if rt.approvals is not None:
        rt.approvals.start()


@worker_shutdown.connect
def _stop_background(**_: Any) -> None:
    if _reconciler is not None:
        _reconciler.stop()
    rt = _runtime() if _runtime.cache_info().currsize else None
    if rt is not None and rt.approvals is not None:
        rt.approvals.stop()


@app.task(name=RUN_TURN_TASK, bind=True)
def run_turn(self: Any, turn_id: str) -> str:
    """Run, resume or continue one turn; returns its outcome (see ``loop.run_turn``)."""
    rt = runtime()
    # The turn's own id, until the task ends: the message's (restored from its header) may
    # be the turn that enqueued this one. The loop adds the conversation and user.
    bind_log_context(turn_id=turn_id)
    try:
        return run_turn_loop(rt, turn_id)
    except Exception:
        # The loop records failures itself; this is the net under it (e.g. SQL was down).
        log.exception("run_turn(%s) escaped the loop", turn_id)
        _record_failure(rt, turn_id)
        return TurnState.FAILED


def _record_failure(rt: Runtime, turn_id: str) -> None:
    from signalbox.services.orchestrator import store, usage

    try:
        info = store.load_turn(rt.sessions, turn_id)
        turn = store.finish_turn(
            rt.sessions, turn_id, TurnState.FAILED, "internal error in the orchestrator"
        )
        if info is not None and turn is not None:
            finished = turn_finished(
                TurnState.FAILED, turn.step, usage.turn_usage(rt.sessions, turn), turn.error
            )
            rt.events.append(
                info.conversation_id, "turn_finished", finished.model_dump(mode="json"), turn_id
            )
        rt.admit_waiting_turns()  # its slot is free
    except Exception:
        log.exception("could not record turn %s as failed", turn_id)
