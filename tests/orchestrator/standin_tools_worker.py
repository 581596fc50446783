"""A stand-in tools worker for the orchestrator's process tests (the real one lives in
services/tools and has its own tests). It serves ``tools.run_tool`` with the same contract:
claims the call, keeps its heartbeat while it runs, publishes a ``ToolResult`` on the
turn's result stream, announces its catalogue when ready and withdraws it at shutdown.

A test can hold every call of a turn open: set ``gate_key(keys, turn_id)`` before the turn,
then push one item per call onto ``latch_key(keys, turn_id)`` to let them finish.

Run: ``celery -A tests.orchestrator.standin_tools_worker:app worker -Q tools --pool prefork``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown

from signalbox.services.tools.heartbeat import CallHeartbeat
from signalbox.shared.celery_app import RUN_TOOL_TASK, make_celery
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings, load
from signalbox.shared.tool_contract import (
    ToolCallRequest,
    ToolResult,
    ToolSpec,
    claim_call,
    publish_catalogue,
    publish_result,
    withdraw_catalogue,
)

LATCH_TIMEOUT_S = 45  # a forgotten latch must not hang the suite
# Above the latch wait: a call held at the gate must outlive a killed orchestrator's
# successor starting up, which took over 12 s on a loaded 2-core CI machine (at 10 s the
# held calls ended `error` by their soft time limit before the test let them go).
CALL_TIMEOUT_S = 60
CATALOGUE_TTL_S = 300
HEARTBEAT_S, HEARTBEAT_TTL_S = 0.5, 2.0  # the real worker's defaults

settings = load(CommonSettings)
keys = RedisKeys(settings.redis_prefix)
app = make_celery("standin-tools", settings)

SPECS = {
    spec.name: spec
    for spec in [
        ToolSpec(
            name="list_dir",
            description="lists the workspace",
            input_schema={"type": "object", "properties": {"path": {"type": "string"}}},
            timeout_s=CALL_TIMEOUT_S,
            idempotent=True,
        ),
        ToolSpec(
            name="search_files",
            description="regex search",
            input_schema={"type": "object", "properties": {"pattern": {"type": "string"}}},
            timeout_s=CALL_TIMEOUT_S,
            idempotent=True,
        ),
    ]
}


def gate_key(keys: RedisKeys, turn_id: str) -> str:
    """While this key exists, calls of the turn wait for the latch."""
    return f"{keys.prefix}standin:gate:{turn_id}"


def latch_key(keys: RedisKeys, turn_id: str) -> str:
    """One item pushed here releases one waiting call."""
    return f"{keys.prefix}standin:latch:{turn_id}"


_client: tuple[int, redis.Redis] | None = None


def client() -> redis.Redis:
    """A connection of this (forked) process."""
    global _client
    if _client is None or _client[0] != os.getpid():
        # redis-py 8 times sockets out after 5 s by default; the latch wait blocks longer.
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=LATCH_TIMEOUT_S + 5)
        _client = (os.getpid(), client)
    return _client[1]


@app.task(name=RUN_TOOL_TASK)
def run_tool(request: dict[str, Any]) -> str:
    """Claim, (maybe) wait at the gate, answer."""
    req = ToolCallRequest.model_validate(request)
    r = client()
    spec = SPECS.get(req.tool)
    idempotent = spec is not None and spec.idempotent
    claim = claim_call(r, keys, req.call_id, HEARTBEAT_TTL_S, rerun=idempotent)
    if claim == "cancelled" or (claim == "taken" and not idempotent):
        return "skipped"
    started = time.monotonic()
    result = ToolResult(call_id=req.call_id, status="error", error="the stand-in tool failed")
    try:  # like the real worker: a result is always reported
        if r.exists(gate_key(keys, req.turn_id)):
            r.blpop([latch_key(keys, req.turn_id)], timeout=LATCH_TIMEOUT_S)
        if spec is None:
            result = ToolResult(call_id=req.call_id, status="error", error=f"no tool {req.tool!r}")
        else:
            result = ToolResult(
                call_id=req.call_id,
                status="ok",
                output=f"{req.tool} ran in {os.getpid()} with {req.input}",
                duration_ms=int((time.monotonic() - started) * 1000),
            )
    finally:
        publish_result(r, keys, req.turn_id, result)
    return result.status


@worker_ready.connect
def _announce(sender: Any, **_: Any) -> None:
    publish_catalogue(client(), keys, str(sender.hostname), list(SPECS.values()), CATALOGUE_TTL_S)
    CallHeartbeat(client(), keys, HEARTBEAT_S, HEARTBEAT_TTL_S).start()


@worker_shutdown.connect
def _withdraw(sender: Any, **_: Any) -> None:
    withdraw_catalogue(client(), keys, str(sender.hostname))
