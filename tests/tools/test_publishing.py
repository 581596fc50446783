"""A result published while Redis is away: retried until Redis is back, within a bound.

Each test owns a ``redis-server`` (append-only, so a restart on the same port is a blip that
keeps every key) and stops it for real.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from signalbox.processes import wait_until
from signalbox.redis_server import RedisServer, start_redis
from signalbox.services.tools.publishing import publish_retrying
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import ToolResult

KEYS = RedisKeys("publishing-test:")
DEADLINE_S = 30.0


def _publish_in_background(
    client: redis.Redis, result: ToolResult, retry_s: float
) -> tuple[threading.Thread, list[bool]]:
    outcome: list[bool] = []
    thread = threading.Thread(
        target=lambda: outcome.append(publish_retrying(client, KEYS, "t1", result, retry_s))
    )
    thread.start()
    return thread, outcome


def test_a_result_published_during_a_restart_arrives_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis(tmp_path, persistent=True)
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    try:
        server.stop()
        caplog.set_level(logging.WARNING, logger="signalbox.services.tools.publishing")
        result = ToolResult(call_id="c1", status="ok", output="42")
        thread, outcome = _publish_in_background(client, result, retry_s=DEADLINE_S)
        wait_until(lambda: "could not publish the result of call c1" in caplog.text, DEADLINE_S)
        server = start_redis(tmp_path, persistent=True, port=server.port)
        thread.join(DEADLINE_S)

        assert outcome == [True]
        entries: Any = client.xrange(KEYS.tool_results("t1"))
        assert [ToolResult.model_validate_json(f[b"r"]) for _id, f in entries] == [result]
    finally:
        client.close()
        server.stop()


def test_a_result_redis_never_takes_is_given_up_after_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server: RedisServer = start_redis(tmp_path, persistent=False)
    server.stop()
    client = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
    started = time.monotonic()
    thread, outcome = _publish_in_background(client, ToolResult(call_id="c2", status="ok"), 1.0)
    thread.join(DEADLINE_S)

    assert outcome == [False], "it gives up rather than holding the worker slot"
    assert time.monotonic() - started >= 1.0, "it tried for the whole bound"
    assert "result of call c2 not published" in caplog.text
    client.close()
