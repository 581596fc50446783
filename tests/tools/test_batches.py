"""A step's quick calls as one task (``services/tools/batches.py``), on a real prefork tools
worker: every per-call guarantee of a task of its own holds for each call of a batch.

Each test sends a batch the way the orchestrator does (``CeleryDispatcher.send``) and reads
the results from the turn's result stream; ``count_quick`` counts its real executions, so a
call that did not start, or did not start twice, shows.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from signalbox.processes import Child, wait_until
from signalbox.services.orchestrator.dispatch import HARD_LIMIT_EXTRA_S, CeleryDispatcher
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.celery_app import RUN_BATCH_TASK, make_celery
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings, load
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult, read_catalogue
from tests.tools.conftest import one_slot_worker

DEADLINE_S = 30.0  # a deadline to wait for, not a performance assertion
HEARTBEAT_TTL_S = 0.6  # the worker's call heartbeat, short so a renewal shows quickly


@pytest.fixture
def worker(service_env: dict[str, str], tmp_path: Path) -> Iterator[Child]:
    """A tools worker with ONE pool process: a batch's calls, and the next batch, share it."""
    heartbeat = {
        "SIGNALBOX_CALL_HEARTBEAT_S": "0.2",
        "SIGNALBOX_CALL_HEARTBEAT_TTL_S": str(HEARTBEAT_TTL_S),
    }
    with one_slot_worker(tmp_path, heartbeat) as child:
        yield child


@pytest.fixture
def app(service_env: dict[str, str]) -> Iterator[Celery]:
    celery = make_celery("batches-test", load(ToolsSettings))
    yield celery
    celery.close()


class Batch:
    """Calls of one turn, sent as the orchestrator sends them."""

    def __init__(self, app: Celery, client: redis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys
        self.dispatcher = CeleryDispatcher(app, client, keys)
        self.turn_id = new_id("turn")
        self.catalogue = read_catalogue(client, keys)

    def call(self, tool: str, timeout_s: float, **tool_input: Any) -> ToolCallRequest:
        return ToolCallRequest(
            call_id=new_id("call"),
            turn_id=self.turn_id,
            conversation_id=new_id("conv"),
            user_id=new_id("user"),
            workspace="proj",
            tool=tool,
            input=tool_input,
            timeout_s=timeout_s,
        )

    def send(self, calls: list[ToolCallRequest], quick: bool = True) -> None:
        """Send ``calls`` in one step; ``quick`` declares every tool quick (as a tool that
        then does not keep its word would)."""
        specs = [self.catalogue[c.tool].model_copy(update={"quick": quick}) for c in calls]
        self.dispatcher.send(list(zip(calls, specs, strict=True)))

    def results(self, count: int) -> list[ToolResult]:
        """The first ``count`` results on the turn's stream, in arrival order."""
        found: list[ToolResult] = []
        last = "0-0"
        deadline = time.monotonic() + DEADLINE_S
        while len(found) < count and time.monotonic() < deadline:
            reply: Any = self.client.xread({self.keys.tool_results(self.turn_id): last}, block=200)
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    found.append(ToolResult.model_validate_json(fields[b"r"]))
        assert len(found) >= count, f"{len(found)} of {count} results within {DEADLINE_S} s"
        return found[:count]

    def count(self, key: str) -> int:
        return int(self.client.get(counter_key(self.keys, key)) or 0)


@pytest.fixture
def batch(
    worker: Child, app: Celery, redis_client: redis.Redis, keys: RedisKeys
) -> Iterator[Batch]:
    yield Batch(app, redis_client, keys)


def _log(worker: Child) -> str:
    return worker.log_path.read_text(errors="replace")


def _batch_ended(worker: Child, first_call_id: str, statuses: list[str]) -> None:
    """Wait for the worker's line saying the batch task ended with ``statuses``."""
    line = f"{RUN_BATCH_TASK}[{first_call_id}] succeeded"
    wait_until(lambda: line in _log(worker), DEADLINE_S, "the batch to end")
    ended = next(row for row in _log(worker).splitlines() if line in row)
    assert f": {statuses!r}" in ended, ended


def test_each_call_of_a_batch_reports_as_it_ends_within_its_own_time_limit(
    batch: Batch, worker: Child
) -> None:
    keys = [uuid.uuid4().hex for _ in range(4)]
    calls = [
        batch.call("count_quick", 5, key=keys[0]),
        batch.call("count_quick", 1, key=keys[1], hold_s=3),  # its 1 s limit stops it
        batch.call("count_quick", 0.5, key=keys[2]),  # its limit passes while it waits
        batch.call("count_quick", 5, key=keys[3]),
    ]

    batch.send(calls)

    results = batch.results(4)
    # One task, its calls in order, each result published as its call ended.
    assert [r.call_id for r in results] == [c.call_id for c in calls]
    assert [r.status for r in results] == ["ok", "timeout", "timeout", "ok"]
    assert results[0].output == "1" and results[3].output == "1"
    assert "exceeded its time limit of 1 s" in (results[1].error or "")
    assert results[1].duration_ms >= 500  # no limit fires early (nothing bounds how late)
    assert "did not start" in (results[2].error or "")
    assert [batch.count(k) for k in keys] == [1, 1, 0, 1], "the late call never ran"
    _batch_ended(worker, calls[0].call_id, ["ok", "timeout", "unstarted", "ok"])
    assert "tools.run_tool[" not in _log(worker), "the calls went as one batch"


def test_a_batch_killed_at_its_hard_limit_reports_each_call_once(
    batch: Batch, worker: Child
) -> None:
    done, after = uuid.uuid4().hex, uuid.uuid4().hex
    calls = [
        batch.call("count_quick", 1, key=done),
        # A "quick" tool that ignores its soft limit: only the batch's kill stops it.
        batch.call("sleep", 1, seconds=30, ignore_soft_limit=True),
        batch.call("count_quick", 1, key=after),
    ]

    batch.send(calls)

    # Each call's first result is the one the orchestrator keeps.
    first: dict[str, ToolResult] = {}
    for result in batch.results(4):  # the ok, then the kill's report for each of the three
        first.setdefault(result.call_id, result)
    assert [first[c.call_id].status for c in calls] == ["ok", "timeout", "timeout"]
    limit = f"batch's hard time limit of {1 + HARD_LIMIT_EXTRA_S:g} s"
    assert limit in (first[calls[1].call_id].error or "")
    assert limit in (first[calls[2].call_id].error or "")
    assert (batch.count(done), batch.count(after)) == (1, 0)


def test_a_cancel_stops_the_running_call_of_a_batch_and_starts_no_later_one(
    batch: Batch, worker: Child
) -> None:
    keys = [uuid.uuid4().hex for _ in range(3)]
    calls = [
        batch.call("count_quick", 5, key=keys[0]),  # ended before the cancel
        batch.call("count_quick", 20, key=keys[1], hold_s=20),  # running at the cancel
        batch.call("count_quick", 5, key=keys[2]),  # not started at the cancel
    ]
    batch.send(calls)
    wait_until(lambda: batch.count(keys[1]) == 1, DEADLINE_S, "the second call to start")

    # As the orchestrator does at a cancel: the calls still open. The batch's task id is
    # its first call's, which is no longer among them.
    batch.dispatcher.revoke([calls[1].call_id, calls[2].call_id])

    results = batch.results(2)
    assert [r.status for r in results] == ["ok", "error"]
    assert "stopped before it finished" in (results[1].error or "")
    _batch_ended(worker, calls[0].call_id, ["ok", "terminated", "skipped"])
    assert [batch.count(k) for k in keys] == [1, 1, 0]
    # The stop came at the cancel, not at the end of the 20 s hold (long, so that a loaded
    # machine's late revoke still lands inside it).
    assert results[1].duration_ms < 20_000


def test_a_batch_delivered_again_runs_no_call_twice(batch: Batch, worker: Child) -> None:
    keys = [uuid.uuid4().hex for _ in range(3)]
    calls = [batch.call("count_quick", 5, key=k) for k in keys]
    batch.send(calls)
    assert [r.status for r in batch.results(3)] == ["ok"] * 3
    _batch_ended(worker, calls[0].call_id, ["ok"] * 3)

    # The same message again, as a redelivery brings it (the same task id and calls).
    batch.dispatcher.app.send_task(
        RUN_BATCH_TASK,
        kwargs={"requests": [c.model_dump(mode="json") for c in calls]},
        queue="tools",
        task_id=f"{calls[0].call_id}-again",
    )

    _batch_ended(worker, f"{calls[0].call_id}-again", ["skipped"] * 3)
    assert [batch.count(k) for k in keys] == [1, 1, 1]
    assert batch.client.xlen(batch.keys.tool_results(batch.turn_id)) == 3


def test_a_batch_whose_process_dies_runs_the_rest_elsewhere_and_no_call_twice(
    batch: Batch, worker: Child
) -> None:
    keys = [uuid.uuid4().hex for _ in range(4)]
    calls = [
        batch.call("count_quick", 5, key=keys[0], hold_s=1.5),
        batch.call("count_quick", 1, key=keys[1]),  # its limit passes: reported, not run
        batch.call("count_quick", 5, key=keys[2], hold_s=5),  # the process dies in it
        batch.call("count_quick", 5, key=keys[3]),
    ]
    batch.send(calls)
    wait_until(lambda: batch.count(keys[2]) == 1, DEADLINE_S, "the third call to start")
    holder = batch.client.get(batch.keys.call_claim(calls[2].call_id))
    assert isinstance(holder, bytes)
    alive = batch.keys.call_alive(calls[2].call_id)
    # The main process renews the heartbeat of the batch's running call: its time to live
    # goes back up (left alone, it only runs down).
    seen = [int(batch.client.pttl(alive))]

    def renewed() -> bool:
        seen.append(int(batch.client.pttl(alive)))
        return seen[-1] > seen[-2] > 0

    wait_until(renewed, DEADLINE_S, "a renewal of the running call's heartbeat")

    os.kill(int(holder.decode().rsplit(":", 1)[1]), signal.SIGKILL)

    # Delivered again at once: the call that ended is not run again, nor the one reported
    # as not started (its result said so), nor the one the process died in (not
    # idempotent: its heartbeat runs out, and the orchestrator ends it lost); the one that
    # never started runs now.
    results = batch.results(3)
    assert [(r.call_id, r.status) for r in results] == [
        (calls[0].call_id, "ok"),
        (calls[1].call_id, "timeout"),
        (calls[3].call_id, "ok"),
    ]
    assert "did not start" in (results[1].error or "")
    _batch_ended(worker, calls[0].call_id, ["skipped", "skipped", "skipped", "ok"])
    assert [batch.count(k) for k in keys] == [1, 0, 1, 1]
    wait_until(lambda: not batch.client.exists(alive), DEADLINE_S, "the dead call's heartbeat")
