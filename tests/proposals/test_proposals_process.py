"""The service's real entry point, as ``signalbox up`` and docker-compose start it."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from signalbox.processes import Child, ServiceCommands, child_env, http_ok
from signalbox.redis_server import free_port


def test_uvicorn_entry_point_serves_health_and_readiness(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    child = Child(
        name="proposals",
        args=ServiceCommands().proposals(port),
        log_path=tmp_path / "proposals.log",
        env=child_env(os.environ, service_env),
    )
    child.start()
    try:
        child.wait_ready(http_ok(f"http://127.0.0.1:{port}/healthz"), timeout_s=30)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 200, child.log_tail()
        anonymous = httpx.get(f"http://127.0.0.1:{port}/api/proposals/pending", timeout=5)
        assert anonymous.status_code == 401
    finally:
        child.stop()
