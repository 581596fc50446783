"""What crosses between the orchestrator and the tool workers: a call, its result, the catalogue.

The orchestrator never imports the tool registry. Tool workers publish ``ToolSpec``s to
Redis (``publish_catalogue``) and refresh them while alive; the orchestrator reads the
live union (``read_catalogue``) and sends each call to its tool's queue.

A worker that starts a call claims it (``claim_call``: the claim names the process running
it, a redelivery of a non-idempotent call finds it taken, and a call its turn's cancel
marked is not started at all) and keeps a heartbeat key
alive while it runs (``renew_heartbeats``); the orchestrator ends a started call whose
heartbeat stopped ``lost`` at once instead of at its deadline.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
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
    # Returns in milliseconds: a step's quick calls to one queue may share one task, run one
    # after another, each at its own time limit (``services/tools/batches.py``).
    quick: bool = False


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
    # No MULTI/EXEC: one round trip either way, and a retry (publishing.py) redoes both.
    pipe = client.pipeline(transaction=False)
    pipe.xadd(key, {"r": result.model_dump_json()})
    pipe.expire(key, 24 * 3600)
    pipe.execute()


CLAIM_TTL_S = 24 * 3600  # longer than any redelivery (the visibility timeout is 1 h)

# The first claim wins; a rerun (an idempotent call delivered again) takes the claim over,
# so the heartbeat follows the process running the call now. Either way the heartbeat
# starts with the run, not at the main process's next renewal. A call marked cancelled
# (``shared/call_cancel.py``) is not claimed: -1.
_CLAIM = """
if redis.call('exists', KEYS[3]) == 1 then return -1 end
local won = redis.call('set', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
if won or ARGV[4] == '1' then
  if not won then redis.call('set', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
  redis.call('set', KEYS[2], '1', 'PX', ARGV[3])
end
if won then return 1 end
return 0
"""
_CLAIM_SHA = hashlib.sha1(_CLAIM.encode()).hexdigest()
# KEYS: claim, heartbeat pairs; ARGV: ttl_ms, then the holder each claim must name.
_RENEW = """
local renewed = 0
for i = 1, #KEYS, 2 do
  if redis.call('get', KEYS[i]) == ARGV[(i + 1) / 2 + 1] then
    redis.call('set', KEYS[i + 1], '1', 'PX', ARGV[1])
    renewed = renewed + 1
  end
end
return renewed
"""


def claim_holder(pid: int | None = None) -> str:
    """How a claim names the process running a call: ``host:pid``."""
    return f"{socket.gethostname()}:{pid if pid is not None else os.getpid()}"


Claim = Literal["won", "taken", "cancelled"]


def claim_call(
    client: redis.Redis, keys: RedisKeys, call_id: str, heartbeat_ttl_s: float, rerun: bool
) -> Claim:
    """``won`` for the first claim of ``call_id``, ``taken`` when a run already claimed it
    (a ``rerun`` takes the claim over all the same), ``cancelled`` when its turn's cancel
    marked it: then nothing is claimed, and the call must not start.

    Whoever runs the call (the first claim, or a rerun) also starts its heartbeat.
    """
    args = (
        keys.call_claim(call_id),
        keys.call_alive(call_id),
        keys.call_cancelled(call_id),
        claim_holder(),
        str(CLAIM_TTL_S),
        str(max(1, int(heartbeat_ttl_s * 1000))),
        "1" if rerun else "0",
    )
    try:  # by its digest: the script is not sent (and hashed by Redis) on every call
        won = client.evalsha(_CLAIM_SHA, 3, *args)
    except redis.exceptions.NoScriptError:  # a fresh or flushed Redis: EVAL caches it
        won = client.eval(_CLAIM, 3, *args)
    if won == -1:
        return "cancelled"
    return "won" if won else "taken"


def claim_unstarted(client: redis.Redis, keys: RedisKeys, call_id: str) -> bool:
    """Claim ``call_id`` as never run (a call of a batch whose limit passed before its turn,
    reported so): a redelivery then skips it as it skips a call that ran, instead of running
    it after its result said it did not. False if a run claimed it first. The holder it names
    is no process's, so no heartbeat is renewed for it."""
    return bool(
        client.set(keys.call_claim(call_id), f"{claim_holder()}:unstarted", nx=True, ex=CLAIM_TTL_S)
    )


def renew_heartbeats(
    client: redis.Redis, keys: RedisKeys, running: list[tuple[str, str]], ttl_s: float
) -> int:
    """Renew the heartbeat of each ``(call_id, holder)`` whose claim ``holder`` still holds
    (a redelivery skipped by the claim is not the run the orchestrator waits on)."""
    if not running:
        return 0
    names: list[str] = []
    holders: list[str] = []
    for call_id, holder in running:
        names += [keys.call_claim(call_id), keys.call_alive(call_id)]
        holders.append(holder)
    ttl_ms = str(max(1, int(ttl_s * 1000)))
    return int(client.eval(_RENEW, len(names), *names, ttl_ms, *holders))


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


# KEYS: the catalogue's sorted set; ARGV: now, the prefix of a worker's catalogue key. The
# expired workers dropped, the live ones' catalogues read: one round trip (it was two). The
# worker keys are built here, not passed in KEYS: fine on one Redis or under Sentinel (what
# Signalbox supports), not on Redis Cluster.
_READ_CATALOGUE = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
local workers = redis.call('zrange', KEYS[1], 0, -1)
if #workers == 0 then return {} end
local names = {}
for i, worker in ipairs(workers) do names[i] = ARGV[2] .. worker end
return redis.call('mget', unpack(names))
"""
_READ_CATALOGUE_SHA = hashlib.sha1(_READ_CATALOGUE.encode()).hexdigest()


def read_catalogue(client: redis.Redis, keys: RedisKeys) -> dict[str, ToolSpec]:
    """The tools some live worker serves, by name (the first worker's spec of a name)."""
    args = (keys.tool_catalogue(), repr(time.time()), keys.tool_worker(""))
    try:
        bodies: Any = client.evalsha(_READ_CATALOGUE_SHA, 1, *args)
    except redis.exceptions.NoScriptError:
        bodies = client.eval(_READ_CATALOGUE, 1, *args)
    tools: dict[str, ToolSpec] = {}
    for body in bodies:
        if body is None:  # expired between its worker's entry and now
            continue
        for spec in _specs(body):
            tools.setdefault(spec.name, spec)
    return tools


@functools.lru_cache(maxsize=64)
def _specs(body: bytes | str) -> tuple[ToolSpec, ...]:
    """A worker's published catalogue, parsed once per distinct body (read every step)."""
    return tuple(ToolSpec.model_validate(raw) for raw in json.loads(body))
