"""A real tools worker refuses to serve ``tools.sandbox`` where the sandbox cannot hold, and
``SIGNALBOX_SANDBOX=off`` is the one explicit way past that: run_python is then not offered."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from signalbox.processes import Child, ServiceCommands, StartError, child_env, log_contains
from signalbox.shared.redis_keys import RedisKeys


def _worker(tmp_path: Path, queues: str, env: dict[str, str]) -> Child:
    name = f"tools-{uuid.uuid4().hex[:8]}"
    return Child(
        name=name,
        args=ServiceCommands(tools_concurrency=1).tools(f"{name}@%h", queues=queues),
        log_path=tmp_path / f"{name}.log",
        env=child_env(os.environ, env),
    )


def _published(client: redis.Redis, keys: RedisKeys, worker: Child) -> list[str]:
    members: Any = client.zrange(keys.tool_catalogue(), 0, -1)
    for member in (m.decode() for m in members):
        if member.startswith(f"{worker.name}@"):
            body: Any = client.get(keys.tool_worker(member))
            return sorted(spec["name"] for spec in json.loads(body or "[]"))
    return []


def test_a_worker_without_a_working_sandbox_refuses_the_sandbox_queue(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    worker = _worker(
        tmp_path, "tools,tools.sandbox", {"SIGNALBOX_SANDBOX_BWRAP": "/nonexistent/bwrap"}
    )
    worker.start()
    try:
        with pytest.raises(StartError) as refused:
            worker.wait_ready(log_contains(worker, " ready."))
        assert "refusing to consume 'tools.sandbox'" in str(refused.value)
        assert "'/nonexistent/bwrap' is not installed" in str(refused.value)
        assert worker.process is not None and worker.process.wait() == 1
    finally:
        worker.stop()


def test_sandbox_off_starts_the_worker_without_run_python(
    service_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, keys: RedisKeys
) -> None:
    worker = _worker(
        tmp_path,
        "tools,tools.sandbox",
        {"SIGNALBOX_SANDBOX": "off", "SIGNALBOX_SANDBOX_BWRAP": "/nonexistent/bwrap"},
    )
    worker.start()
    try:
        worker.wait_ready(log_contains(worker, " ready."))
        served = _published(redis_client, keys, worker)
        assert "read_file" in served and "run_python" not in served
        assert "run_python is off (SIGNALBOX_SANDBOX=off)" in worker.log_tail(200)
    finally:
        worker.stop()
