"""A real tools worker process (prefork): parallel calls, a real soft time limit, the catalogue,
and a redelivered call that is not run twice."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from signalbox.processes import Child, ServiceCommands, child_env, log_contains, wait_until
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.call_cancel import CANCEL_SIGNAL, mark_cancelled
from signalbox.shared.celery_app import RUN_TOOL_TASK, make_celery
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings, load
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult, read_catalogue
from signalbox.shared.workspace_paths import workspace_dir

RESULTS_DEADLINE_S = 60.0  # a deadline to wait for, generous for a loaded machine


def _wait_results(
    client: redis.Redis, keys: RedisKeys, turn_id: str, count: int
) -> dict[str, ToolResult]:
    """Results of ``turn_id`` by call id in arrival order, blocking until ``count`` arrived."""
    results: dict[str, ToolResult] = {}
    last = "0-0"
    deadline = time.monotonic() + RESULTS_DEADLINE_S
    while len(results) < count and time.monotonic() < deadline:
        reply: Any = client.xread({keys.tool_results(turn_id): last}, block=500)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last = entry_id
                result = ToolResult.model_validate_json(fields[b"r"])
                results[result.call_id] = result
    return results


def _catalogue_workers(client: redis.Redis, keys: RedisKeys) -> list[str]:
    members: Any = client.zrange(keys.tool_catalogue(), 0, -1)
    return [m.decode() for m in members]


def test_a_real_worker_runs_calls_in_parallel_under_real_time_limits(
    service_env: dict[str, str], redis_client: redis.Redis, keys: RedisKeys, tmp_path: Path
) -> None:
    settings = load(ToolsSettings)
    user_id, turn_id, conversation_id = new_id("user"), new_id("turn"), new_id("conv")
    workspace = workspace_dir(settings.workspaces_root, user_id, "proj")
    workspace.mkdir(parents=True)
    (workspace / "a.txt").write_text("alpha\n")

    name = f"tools-{uuid.uuid4().hex[:8]}"
    worker = Child(
        name=name,
        args=ServiceCommands(tools_concurrency=6).tools(f"{name}@%h"),
        log_path=tmp_path / f"{name}.log",
        env=child_env(os.environ, {"SIGNALBOX_TEST_TOOLS": "1"}),
    )
    client_app = make_celery("tools-test-client", settings)
    worker.start()
    try:
        worker.wait_ready(log_contains(worker, " ready."))
        catalogue = read_catalogue(redis_client, keys)
        assert {"sleep", "count_calls", "read_file", "write_file"} <= set(catalogue)
        assert any(w.startswith(f"{name}@") for w in _catalogue_workers(redis_client, keys))

        def call(tool: str, timeout_s: float, **tool_input: Any) -> ToolCallRequest:
            return ToolCallRequest(
                call_id=new_id("call"),
                turn_id=turn_id,
                conversation_id=conversation_id,
                user_id=user_id,
                workspace="proj",
                tool=tool,
                input=tool_input,
                timeout_s=timeout_s,
            )

        def send(c: ToolCallRequest) -> Any:
            return client_app.send_task(
                RUN_TOOL_TASK,
                kwargs={"request": c.model_dump(mode="json")},
                queue=catalogue[c.tool].queue,
                soft_time_limit=int(c.timeout_s),
                time_limit=int(c.timeout_s) + 2,
            )

        # A call that holds its pool process for 300 s (its limits are later still) and is
        # seen running before the others are sent: they can only finish beside it, not after.
        started_key = new_id("held")
        held = call("sleep", 300, seconds=300, count_key=started_key)
        held_task = send(held)
        wait_until(
            lambda: redis_client.get(counter_key(keys, started_key)) == b"1",
            RESULTS_DEADLINE_S,
            "the held call to start",
        )

        counter = new_id("counter")
        calls = [
            call("sleep", 1, seconds=30, ignore_soft_limit=True),  # only the hard limit ends it
            call("sleep", 1, seconds=5),
            call("read_file", 5, path="a.txt"),
            call("list_dir", 5),
            call("count_calls", 5, key=counter),
        ]
        started = time.monotonic()
        sent = {c.call_id: send(c) for c in calls}
        results = _wait_results(redis_client, keys, turn_id, len(calls))
        elapsed = time.monotonic() - started
        assert len(results) == 5, worker.log_tail()
        statuses = [results[c.call_id].status for c in calls]
        assert statuses == ["timeout", "timeout", "ok", "ok", "ok"]
        killed, slept = results[calls[0].call_id], results[calls[1].call_id]
        assert "hard time limit of 3 s" in (killed.error or "")
        # Lower bounds only (no limit fires early; nothing bounds how late a loaded machine is).
        assert "time limit of 1 s" in (slept.error or "") and slept.duration_ms >= 500
        assert elapsed >= 3.0  # the hard limit killed its call 3 s after it started
        # All five ran and reported while the held call still ran (it cannot end for 300 s):
        # the others ran beside it, not after it.
        assert held.call_id not in results
        assert results[calls[2].call_id].output == "alpha\n"
        got = [sent[c.call_id].get(timeout=RESULTS_DEADLINE_S, propagate=False) for c in calls[1:]]
        assert got == statuses[1:]

        # A redelivery of the non-idempotent call finds its claim taken and does not run it.
        again = client_app.send_task(
            RUN_TOOL_TASK, kwargs={"request": calls[4].model_dump(mode="json")}, queue="tools"
        )
        assert again.get(timeout=RESULTS_DEADLINE_S) == "skipped"
        assert redis_client.get(counter_key(keys, counter)) == b"1"
        assert redis_client.xlen(keys.tool_results(turn_id)) == 5

        # The held call ran all along; cancelled (as its turn's cancel does), it stops now.
        mark_cancelled(redis_client, keys, [held.call_id])
        client_app.control.revoke(held_task.id, terminate=True, signal=CANCEL_SIGNAL)
        stopped = _wait_results(redis_client, keys, turn_id, 6).get(held.call_id)
        assert stopped is not None, worker.log_tail()
        assert stopped.status == "error" and "was stopped" in (stopped.error or ""), stopped
    finally:
        worker.stop()
        client_app.close()
    assert not any(w.startswith(f"{name}@") for w in _catalogue_workers(redis_client, keys))
