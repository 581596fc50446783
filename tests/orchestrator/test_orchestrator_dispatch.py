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
from signalbox.shared.celery_app import RUN_BATCH_TASK, RUN_TOOL_TASK, make_celery
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


def _quick(queue: str, name: str = "count_quick") -> ToolSpec:
    return ToolSpec(
        name=name, description="", input_schema={}, timeout_s=5, queue=queue, quick=True
    )


def test_a_steps_quick_calls_to_one_queue_go_out_as_batches_of_batch_max(
    app: Celery, redis_client: redis.Redis, redis_prefix: str
) -> None:
    queue, other = (f"tools.test-{uuid.uuid4().hex[:8]}" for _ in range(2))
    turn_id = new_id("turn")
    # In the model's order: quick, slow, quick, quick (other queue), then three quick.
    calls = [
        (_request(turn_id, 1.0), _quick(queue)),
        (_request(turn_id, 9.0), _spec(queue)),
        (_request(turn_id, 2.0), _quick(queue)),
        (_request(turn_id, 5.0), _quick(other)),
        (_request(turn_id, 3.0), _quick(queue)),
        (_request(turn_id, 4.0), _quick(queue)),
        (_request(turn_id, 4.0), _quick(queue)),
    ]

    CeleryDispatcher(app, redis_client, RedisKeys(redis_prefix), batch_max=3).send(calls)

    messages = _queued(redis_client, f"{redis_prefix}{queue}")
    elsewhere = _queued(redis_client, f"{redis_prefix}{other}")
    ids = [r.call_id for r, _ in calls]
    # The first three quick calls to ``queue`` share a task named by its first call; the
    # next two share the next; the slow call and the lone call to ``other`` go alone.
    assert [(m["headers"]["task"], m["headers"]["id"]) for m in messages] == [
        (RUN_BATCH_TASK, ids[0]),
        (RUN_TOOL_TASK, ids[1]),
        (RUN_BATCH_TASK, ids[5]),
    ]
    assert [(m["headers"]["task"], m["headers"]["id"]) for m in elsewhere] == [
        (RUN_TOOL_TASK, ids[3])
    ]
    batched = [m["decoded_body"][1]["requests"] for m in (messages[0], messages[2])]
    assert [[r["call_id"] for r in b] for b in batched] == [
        [ids[0], ids[2], ids[4]],
        [ids[5], ids[6]],
    ]
    # A batch has no Celery soft limit (each call's is kept by the worker), and its kill
    # comes after its latest call's limit.
    assert messages[0]["headers"]["timelimit"] == [3.0 + HARD_LIMIT_EXTRA_S, None]
    assert len({m["headers"]["group"] for m in messages + elsewhere}) == 1, "one group per step"
    redis_client.delete(f"{redis_prefix}{queue}", f"{redis_prefix}{other}")


def test_batch_max_1_sends_every_call_as_a_task_of_its_own(
    app: Celery, redis_client: redis.Redis, redis_prefix: str
) -> None:
    queue = f"tools.test-{uuid.uuid4().hex[:8]}"
    calls = [(_request(new_id("turn"), 1.0), _quick(queue)) for _ in range(3)]

    CeleryDispatcher(app, redis_client, RedisKeys(redis_prefix), batch_max=1).send(calls)

    messages = _queued(redis_client, f"{redis_prefix}{queue}")
    assert [m["headers"]["task"] for m in messages] == [RUN_TOOL_TASK] * 3
    assert [m["headers"]["id"] for m in messages] == [r.call_id for r, _ in calls]
    redis_client.delete(f"{redis_prefix}{queue}")
