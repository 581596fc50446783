"""``CeleryDispatcher``: what a step's calls look like on the broker (real Redis, no worker).

The messages are read back from the queue's Redis list as kombu stored them, so the test
sees what a tool worker would receive: one message per call, all of one group, each with
its own time limits, and nothing waiting on Celery's result backend.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from signalbox.services.orchestrator.dispatch import HARD_LIMIT_EXTRA_S, CeleryDispatcher
from signalbox.shared.celery_app import RUN_TOOL_TASK, make_celery
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings
from signalbox.shared.tool_contract import ToolCallRequest, ToolSpec


@pytest.fixture
def app(redis_url: str, redis_prefix: str) -> Iterator[Celery]:
    celery = make_celery(
        "dispatch-test", CommonSettings(redis_url=redis_url, redis_prefix=redis_prefix)
    )
    yield celery
    celery.close()


def _spec(queue: str) -> ToolSpec:
    return ToolSpec(
        name="sleep", description="", input_schema={"type": "object"}, timeout_s=5, queue=queue
    )


def _request(turn_id: str, timeout_s: float) -> ToolCallRequest:
    return ToolCallRequest(
        call_id=new_id("call"),
        turn_id=turn_id,
        conversation_id="conv_x",
        user_id="user_x",
        workspace="default",
        tool="sleep",
        input={"seconds": 0},
        timeout_s=timeout_s,
    )


def _queued(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    """The kombu envelopes in a queue, oldest first (kombu LPUSHes, workers BRPOP)."""
    raw: Any = client.lrange(key, 0, -1)
    envelopes = [json.loads(item) for item in reversed(raw)]
    for envelope in envelopes:
        envelope["decoded_body"] = json.loads(base64.b64decode(envelope["body"]))
    return envelopes


def test_a_steps_calls_go_out_as_one_group_with_their_own_time_limits(
    app: Celery, redis_client: redis.Redis, redis_prefix: str
) -> None:
    queue = f"tools.test-{uuid.uuid4().hex[:8]}"
    turn_id = new_id("turn")
    calls = [(_request(turn_id, limit), _spec(queue)) for limit in (1.0, 2.5, 30.0)]

    CeleryDispatcher(app, redis_client, RedisKeys(redis_prefix)).send(calls)

    messages = _queued(redis_client, f"{redis_prefix}{queue}")
    assert [m["headers"]["id"] for m in messages] == [r.call_id for r, _ in calls]
    assert {m["headers"]["task"] for m in messages} == {RUN_TOOL_TASK}
    groups = {m["headers"]["group"] for m in messages}
    assert len(groups) == 1 and None not in groups, "one group per step"
    assert [m["headers"]["group_index"] for m in messages] == [0, 1, 2]
    assert [m["headers"]["timelimit"] for m in messages] == [
        [limit + HARD_LIMIT_EXTRA_S, limit] for limit in (1.0, 2.5, 30.0)
    ]
    assert all(m["headers"]["ignore_result"] for m in messages)
    args, kwargs, _embed = messages[0]["decoded_body"]
    assert args == [] and kwargs["request"] == calls[0][0].model_dump(mode="json")
    # Results come on the turn's result stream: nothing may wait on the result backend
    # (a group's barrier would SUBSCRIBE to every call's result key).
    assert not app.backend._pending_results.concrete  # type: ignore[attr-defined]
    assert getattr(app.backend.result_consumer, "_pubsub", None) is None  # type: ignore[attr-defined]
    redis_client.delete(f"{redis_prefix}{queue}")
