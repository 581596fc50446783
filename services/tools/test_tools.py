"""TEST-ONLY tools, registered only when ``SIGNALBOX_TEST_TOOLS=1`` (never in a deployment).

``sleep`` lets tests hold a worker slot past the soft (or, ignoring it, the hard) time
limit; ``count_calls`` increments a Redis counter so tests can count how often a call
really ran (redelivery, claims).
"""

from __future__ import annotations

import time

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel, Field

from services.tools.registry import Registry, ToolContext
from shared.redis_keys import RedisKeys

registry = Registry()


def counter_key(keys: RedisKeys, name: str) -> str:
    """The Redis key ``count_calls`` increments for ``name`` (test-only, under the prefix)."""
    return f"{keys.prefix}test:count_calls:{name}"


class SleepInput(BaseModel):
    """Input of ``sleep``."""

    seconds: float = Field(ge=0, le=600, description="how long to sleep")
    ignore_soft_limit: bool = Field(
        False, description="keep sleeping past the soft limit, so only the hard limit ends it"
    )


@registry.tool(
    name="sleep",
    description="TEST ONLY: sleep for the given number of seconds.",
    timeout_s=5,
    idempotent=True,
)
def sleep(args: SleepInput, ctx: ToolContext) -> str:
    """Sleep ``args.seconds`` (interrupted by the soft time limit unless told to ignore it)."""
    deadline = time.monotonic() + args.seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            time.sleep(left)
        except SoftTimeLimitExceeded:
            if not args.ignore_soft_limit:
                raise
    return f"slept {args.seconds:g} s"


class CountCallsInput(BaseModel):
    """Input of ``count_calls``."""

    key: str = Field(min_length=1, max_length=200, description="name of the counter")


@registry.tool(
    name="count_calls",
    description="TEST ONLY: count one execution under the given key; returns the new count.",
    timeout_s=5,
    idempotent=False,
)
def count_calls(args: CountCallsInput, ctx: ToolContext) -> str:
    """Increment the counter ``args.key`` and return its value."""
    return str(ctx.redis.incr(counter_key(ctx.keys, args.key)))
