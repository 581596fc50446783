"""A cancel stops only the call it names: Celery signals the pool PROCESS that its main
process last saw running the call, and by the time the signal lands that process may be
running another tenant's call. A real worker with one pool process shows it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from signalbox.processes import Child, wait_until
from signalbox.services.orchestrator.dispatch import CeleryDispatcher
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared import call_cancel
from signalbox.shared.celery_app import make_celery
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings, load
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult, ToolSpec, read_catalogue
from tests.tools.conftest import one_slot_worker

DEADLINE_S = 15.0  # a deadline to wait for, not a performance assertion
CANCEL_SIGNAL = signal.Signals[call_cancel.CANCEL_SIGNAL]  # what the revoke sends


@pytest.fixture
def worker(service_env: dict[str, str], tmp_path: Path) -> Iterator[Child]:
    """A tools worker with ONE pool process, so consecutive calls share a pid."""
    with one_slot_worker(tmp_path) as child:
        yield child


def _result(client: redis.Redis, keys: RedisKeys, turn_id: str) -> ToolResult:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        reply: Any = client.xread({keys.tool_results(turn_id): "0-0"}, count=1, block=200)
        for _stream, entries in reply or []:
            return ToolResult.model_validate_json(entries[0][1][b"r"])
    raise AssertionError(f"no result for turn {turn_id} within {DEADLINE_S} s")


def _pool_pid(client: redis.Redis, keys: RedisKeys, call_id: str) -> int:
    """The pool process that claimed ``call_id`` (its claim names ``host:pid``)."""
    holder = wait_until(lambda: client.get(keys.call_claim(call_id)), timeout_s=DEADLINE_S)
    assert isinstance(holder, bytes)
    return int(holder.decode().rsplit(":", 1)[1])


def test_a_late_cancel_signal_leaves_the_next_tenants_call_alone(
    worker: Child, redis_client: redis.Redis, keys: RedisKeys
) -> None:
    settings = load(ToolsSettings)
    app = make_celery("cancel-isolation-test", settings)
    dispatcher = CeleryDispatcher(app, redis_client, keys)
    catalogue = read_catalogue(redis_client, keys)

    def call(seconds: float, count_key: str | None = None) -> tuple[ToolCallRequest, ToolSpec]:
        request = ToolCallRequest(
            call_id=new_id("call"),
            turn_id=new_id("turn"),
            conversation_id=new_id("conv"),
            user_id=new_id("user"),  # every call another tenant's
            workspace="proj",
            tool="sleep",
            input={"seconds": seconds, "count_key": count_key},
            timeout_s=30,
        )
        return request, catalogue["sleep"]

    try:
        # A runs and finishes on the pool process; then the same process runs B.
        a = call(0.1)
        dispatcher.send([a])
        assert _result(redis_client, keys, a[0].turn_id).status == "ok"
        b = call(2.0, count_key=new_id("b"))
        dispatcher.send([b])
        pid = _pool_pid(redis_client, keys, b[0].call_id)
        assert pid == _pool_pid(redis_client, keys, a[0].call_id)
        # A's turn is cancelled now, and the signal meant for A lands on B's process (what
        # Celery's main process sends when its view of who runs A is a moment old).
        dispatcher.revoke([a[0].call_id])
        os.kill(pid, CANCEL_SIGNAL)
        got = _result(redis_client, keys, b[0].turn_id)
        assert (got.status, got.output) == ("ok", "slept 2 s"), got.error
        os.kill(pid, 0)  # the same process finished it: B was neither stopped nor redelivered
        assert redis_client.get(counter_key(keys, str(b[0].input["count_key"]))) == b"1"
        # The same signal to the idle process: it ignores it and serves the next call.
        os.kill(pid, CANCEL_SIGNAL)
        c = call(0.1)
        dispatcher.send([c])
        assert _result(redis_client, keys, c[0].turn_id).status == "ok"
        assert _pool_pid(redis_client, keys, c[0].call_id) == pid
        # A real cancel of a running call still stops it, at once.
        d = call(25.0, count_key=new_id("started"))
        dispatcher.send([d])
        # The tool counts its run as it starts: from then on it runs inside its call.
        started_key = counter_key(keys, str(d[0].input["count_key"]))
        wait_until(lambda: redis_client.get(started_key) == b"1", timeout_s=DEADLINE_S)
        started = time.monotonic()
        dispatcher.revoke([d[0].call_id])
        stopped = _result(redis_client, keys, d[0].turn_id)
        assert stopped.status == "error" and "stopped" in (stopped.error or ""), stopped
        assert time.monotonic() - started < DEADLINE_S
        assert worker.alive(), worker.log_tail()
    finally:
        app.close()
