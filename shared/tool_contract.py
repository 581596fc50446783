"""What crosses between the orchestrator and the tool workers: a call, its result, the catalogue.

The orchestrator never imports the tool registry. Tool workers publish ``ToolSpec``s to
Redis (``publish_catalogue``) and refresh them while alive; the orchestrator reads the
live union (``read_catalogue``) and sends each call to its tool's queue.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import redis
from pydantic import BaseModel, Field

from signalbox.shared.redis_keys import RedisKeys

ApprovalMode = Literal["auto", "confirm", "deny"]
SideEffect = Literal["read", "propose", "execute"]
ResultStatus = Literal["ok", "error", "timeout"]


class ToolSpec(BaseModel):
    """A tool as the model and the orchestrator see it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    timeout_s: float
    queue: str = "tools"
    mode: ApprovalMode = "auto"
    side_effect: SideEffect = "read"
    idempotent: bool = False


class ToolCallRequest(BaseModel):
    """One call sent to a tool worker (the kwargs of ``tools.run_tool``)."""

    call_id: str
    turn_id: str
    conversation_id: str
    user_id: str
    workspace: str
    tool: str
    input: dict[str, Any]
    timeout_s: float


class ToolResult(BaseModel):
    """What a tool worker reports for one call."""

    call_id: str
    status: ResultStatus
    output: str = ""
    error: str | None = None
    duration_ms: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)


def publish_result(client: redis.Redis, keys: RedisKeys, turn_id: str, result: ToolResult) -> None:
    """Put a result on the turn's result stream (read by the orchestrator, replayable)."""
    key = keys.tool_results(turn_id)
    pipe = client.pipeline()
    pipe.xadd(key, {"r": result.model_dump_json()})
    pipe.expire(key, 24 * 3600)
    pipe.execute()


def publish_catalogue(
    client: redis.Redis, keys: RedisKeys, worker_id: str, specs: list[ToolSpec], ttl_s: float
) -> None:
    """Announce (or refresh) what one worker serves, valid for ``ttl_s``."""
    body = json.dumps([s.model_dump(mode="json") for s in specs])
    expires = time.time() + ttl_s
    pipe = client.pipeline()
    pipe.set(keys.tool_worker(worker_id), body, px=int(ttl_s * 1000))
    pipe.zadd(keys.tool_catalogue(), {worker_id: expires})
    pipe.execute()


def withdraw_catalogue(client: redis.Redis, keys: RedisKeys, worker_id: str) -> None:
    """Remove a worker's catalogue when it stops."""
    pipe = client.pipeline()
    pipe.delete(keys.tool_worker(worker_id))
    pipe.zrem(keys.tool_catalogue(), worker_id)
    pipe.execute()


def read_catalogue(client: redis.Redis, keys: RedisKeys) -> dict[str, ToolSpec]:
    """The tools some live worker serves, by name."""
    now = time.time()
    client.zremrangebyscore(keys.tool_catalogue(), "-inf", now)
    workers: Any = client.zrange(keys.tool_catalogue(), 0, -1)
    if not workers:
        return {}
    names = [w.decode() if isinstance(w, bytes) else w for w in workers]
    bodies: Any = client.mget([keys.tool_worker(w) for w in names])
    tools: dict[str, ToolSpec] = {}
    for body in bodies:
        if body is None:
            continue
        for raw in json.loads(body):
            spec = ToolSpec.model_validate(raw)
            tools.setdefault(spec.name, spec)
    return tools
