"""Two real tool workers: time limits of calls that block in C, the sandbox queue, a deployment's
queue, and a SIGKILLed worker whose tools leave the catalogue while the other's stay."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from signalbox.processes import Child, ServiceCommands, child_env, log_contains, stop_together
from signalbox.shared.celery_app import RUN_TOOL_TASK, make_celery
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings, load
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult, read_catalogue
from tests.tools.test_sandbox_isolation import FORK_AND_ALLOCATE

DEADLINE_S = 60.0  # for the results to arrive: generous for a loaded machine
# Catalogue TTL is 3 refreshes: 6 s. Long enough that a live worker's entry outlives a stall of
# its refresh thread on a loaded machine; short enough that a killed worker's leaves soon.
REFRESH_S = 2.0
HARD_LIMIT_S = 3.0  # timeout_s + 2, where the pool kills the child


def _worker(tmp_path: Path, queues: str, concurrency: int, env: dict[str, str]) -> Child:
    name = f"tools-{uuid.uuid4().hex[:8]}"
    return Child(
        name=name,
        args=ServiceCommands(tools_concurrency=concurrency).tools(f"{name}@%h", queues=queues),
        log_path=tmp_path / f"{name}.log",
        env=child_env(
            os.environ,
            {"SIGNALBOX_CATALOGUE_REFRESH_S": str(REFRESH_S), "SIGNALBOX_TEST_TOOLS": "1", **env},
        ),
    )


def _results(
    client: redis.Redis, keys: RedisKeys, turn_id: str, count: int
) -> Iterator[tuple[float, ToolResult]]:
    """(arrival time, result) for each result of ``turn_id``, until ``count`` or the deadline."""
    last, seen = "0-0", 0
    deadline = time.monotonic() + DEADLINE_S
    while seen < count and time.monotonic() < deadline:
        reply: Any = client.xread({keys.tool_results(turn_id): last}, block=200)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last, seen = entry_id, seen + 1
                yield time.monotonic(), ToolResult.model_validate_json(fields[b"r"])


def _published(client: redis.Redis, keys: RedisKeys, worker: Child) -> list[str]:
    members: Any = client.zrange(keys.tool_catalogue(), 0, -1)
    for member in (m.decode() for m in members):
        if member.startswith(f"{worker.name}@"):
            body: Any = client.get(keys.tool_worker(member))
            return sorted(spec["name"] for spec in json.loads(body or "[]"))
    return []


@pytest.fixture
def workers(
    service_env: dict[str, str], tmp_path: Path, sandbox_ready: None
) -> Iterator[tuple[Child, Child]]:
    """Worker A on ``tools,tools.sandbox``; worker B on ``tools.extra`` with a deployment tool."""
    a = _worker(tmp_path, "tools,tools.sandbox", 4, {"SIGNALBOX_SANDBOX_PROCESSES": "16"})
    b = _worker(
        tmp_path,
        "tools.extra",
        1,
        {
            "SIGNALBOX_TOOL_MODULES": json.dumps(["tests.tools.deploy_tools"]),
            "SIGNALBOX_TOOL_QUEUES": json.dumps({"shout": "tools.extra"}),
        },
    )
    a.start()
    b.start()
    try:
        a.wait_ready(log_contains(a, " ready."))
        b.wait_ready(log_contains(b, " ready."))
        yield a, b
    finally:
        stop_together([a, b])


def test_two_workers_limits_in_c_the_sandbox_queue_and_a_killed_worker(
    workers: tuple[Child, Child], redis_client: redis.Redis, keys: RedisKeys
) -> None:
    a, b = workers
    settings = load(ToolsSettings)
    client = make_celery("tools-scale-test-client", settings)
    turn_id, user_id = new_id("turn"), new_id("user")

    def send(tool: str, timeout_s: float, **tool_input: Any) -> ToolCallRequest:
        request = ToolCallRequest(
            call_id=new_id("call"),
            turn_id=turn_id,
            conversation_id=new_id("conv"),
            user_id=user_id,
            workspace="proj",
            tool=tool,
            input=tool_input,
            timeout_s=timeout_s,
        )
        client.send_task(
            RUN_TOOL_TASK,
            kwargs={"request": request.model_dump(mode="json")},
            queue=catalogue[tool].queue,
            soft_time_limit=int(timeout_s),
            time_limit=int(timeout_s) + 2,
        )
        return request

    try:
        catalogue = read_catalogue(redis_client, keys)
        assert _published(redis_client, keys, b) == ["shout"]  # only its queue's tools
        on_a = _published(redis_client, keys, a)
        assert {"run_python", "block", "read_file"} <= set(on_a) and "shout" not in on_a

        # Calls blocked inside C end at their limit: soft for sleep, select and recv; with every
        # signal blocked (a C extension that never returns to Python), at the hard limit.
        # Each would block 30 s otherwise. What ended each call is told by its result, not by
        # when it arrived (a loaded machine delays any of them): "exceeded its time limit" is
        # said only when the soft limit's exception interrupted the call, "stopped at its hard
        # time limit" only when the pool killed the child.
        started = time.monotonic()
        calls = [
            send("block", 1, how="sleep"),
            send("block", 1, how="select"),
            send("block", 1, how="recv"),
            send("block", 1, how="select", block_signals=True),
        ]
        arrived = {r.call_id: (t - started, r) for t, r in _results(redis_client, keys, turn_id, 4)}
        assert len(arrived) == 4, a.log_tail()
        for call in calls[:3]:
            result = arrived[call.call_id][1]
            assert result.status == "timeout", (call.input, result)
            assert "block exceeded its time limit of 1 s" in (result.error or ""), call.input
        after, result = arrived[calls[3].call_id]
        assert result.status == "timeout", result
        assert "block was stopped at its hard time limit of 3 s" in (result.error or "")
        assert after > HARD_LIMIT_S - 0.5, after  # a lower bound: the kill comes at 3 s, not 1

        # The sandbox queue: a fork bomb and a fork-and-allocate run (6 x 400 MiB against 512
        # MB for the whole run) fail clearly, the worker lives on, the next program runs.
        bomb = send("run_python", 5, code="import os\nwhile True:\n    os.fork()\n")
        hog = send("run_python", 10, code=FORK_AND_ALLOCATE)
        calm = send("run_python", 5, code="print(6 * 7)")
        shout = send("shout", 5, text="hi")
        got = {r.call_id: r for _t, r in _results(redis_client, keys, turn_id, 8)}
        assert got[bomb.call_id].status == "error"
        assert "processes are limited to 16" in (got[bomb.call_id].error or "")
        assert got[hog.call_id].status == "error"
        assert "more than its memory limit of 512 MB" in (got[hog.call_id].error or "")
        assert a.alive()
        assert (got[calm.call_id].status, got[calm.call_id].output) == ("ok", "42\n")
        assert (got[shout.call_id].status, got[shout.call_id].output) == ("ok", "HI")

        # B dies without withdrawing: its tool leaves the catalogue after the TTL, A's stay.
        b.signal_group(signal.SIGKILL)
        killed = time.monotonic()
        while "shout" in read_catalogue(redis_client, keys):
            # A deadline, generous for a loaded machine; it still proves the TTL ends it.
            assert time.monotonic() - killed < 3 * REFRESH_S + 30, "shout outlived its TTL"
            time.sleep(0.05)  # the TTL runs out in Redis: polled with a deadline
        remaining = read_catalogue(redis_client, keys)
        assert {"run_python", "block", "read_file"} <= set(remaining)
        assert _published(redis_client, keys, a) == on_a
    finally:
        client.close()
