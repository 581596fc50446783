"""TEST-ONLY tools, registered only when ``SIGNALBOX_TEST_TOOLS=1`` (never in a deployment).

``sleep`` lets tests hold a worker slot past the soft (or, ignoring it, the hard) time
limit; ``block`` blocks inside C (``time.sleep``, ``select``, a socket ``recv``), optionally
with every signal blocked, as a C extension that never returns to Python would;
``count_calls`` increments a Redis counter so tests can count how often a call really ran
(redelivery, claims), and can then stay busy (``hold_s``) so a non-idempotent call is in
flight when a test kills something; ``count_quick`` is the same as a quick tool (a step's
calls of it share one task); ``sleep`` counts too when given ``count_key``;
``propose_later`` proposes a file after a wait it cannot be stopped in (a late write).
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import time
from typing import Literal

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel, Field

from signalbox.services.tools.proposals_client import FileChange, propose
from signalbox.services.tools.registry import Registry, ToolContext, ToolOutput
from signalbox.shared.call_cancel import CANCEL_SIGNAL
from signalbox.shared.redis_keys import RedisKeys

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
    count_key: str | None = Field(
        None, max_length=200, description="also count this run under the counter of that name"
    )


@registry.tool(
    name="sleep",
    description="TEST ONLY: sleep for the given number of seconds.",
    timeout_s=5,
    idempotent=True,
)
def sleep(args: SleepInput, ctx: ToolContext) -> str:
    """Sleep ``args.seconds`` (interrupted by the soft time limit unless told to ignore it)."""
    if args.count_key is not None:
        ctx.redis.incr(counter_key(ctx.keys, args.count_key))
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
    hold_s: float = Field(
        0, ge=0, le=600, description="then stay busy this long (a non-idempotent call in flight)"
    )


@registry.tool(
    name="count_calls",
    description="TEST ONLY: count one execution under the given key; returns the new count.",
    timeout_s=5,
    idempotent=False,
)
def count_calls(args: CountCallsInput, ctx: ToolContext) -> str:
    """Increment the counter ``args.key``, hold for ``args.hold_s``, return the count."""
    count = ctx.redis.incr(counter_key(ctx.keys, args.key))
    time.sleep(args.hold_s)  # the soft time limit interrupts it
    return str(count)


# The same tool declared quick: a step's calls of it share one task (batches).
registry.tool(
    name="count_quick",
    description="TEST ONLY: count_calls declared quick: a step's calls of it share one task.",
    timeout_s=5,
    idempotent=False,
    quick=True,
)(count_calls)


class BlockInput(BaseModel):
    """Input of ``block``."""

    how: Literal["sleep", "select", "recv"] = Field(description="the blocking C call")
    seconds: float = Field(30, ge=0, le=600, description="how long the call blocks")
    block_signals: bool = Field(
        False, description="block every signal first, so no soft time limit can interrupt"
    )


@registry.tool(
    name="block",
    description="TEST ONLY: block inside a C call (time.sleep, select or a socket recv).",
    timeout_s=5,
    idempotent=True,
)
def block(args: BlockInput, ctx: ToolContext) -> str:
    """Block in ``args.how`` for ``args.seconds``."""
    if args.block_signals:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    if args.how == "sleep":
        time.sleep(args.seconds)
    elif args.how == "select":
        select.select([], [], [], args.seconds)
    else:
        left, right = socket.socketpair()
        with left, right:
            left.settimeout(args.seconds)
            with contextlib.suppress(TimeoutError):
                left.recv(1)  # nothing is ever sent
    return f"blocked {args.seconds:g} s in {args.how}"


class ProposeLaterInput(BaseModel):
    """Input of ``propose_later``."""

    path: str = Field(max_length=200)
    content: str = Field(max_length=10_000)
    seconds: float = Field(ge=0, le=60, description="how long to wait before proposing")
    started_key: str = Field(
        max_length=200, description="a counter: 1 once it waits, 2 once it tried to propose"
    )


@registry.tool(
    name="propose_later",
    description=(
        "TEST ONLY: with the stop signals blocked (a call that cannot be stopped at once), "
        "wait, then propose writing a file, as a write_file in flight when its turn is cancelled."
    ),
    timeout_s=20,
    side_effect="propose",
)
def propose_later(args: ProposeLaterInput, ctx: ToolContext) -> str | ToolOutput:
    """Wait ``args.seconds`` deaf to SIGTERM and the cancel signal, then propose ``args.path``."""
    deaf = {signal.SIGTERM, signal.Signals[CANCEL_SIGNAL]}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, deaf)
    try:
        ctx.redis.incr(counter_key(ctx.keys, args.started_key))
        time.sleep(args.seconds)
        change = FileChange(
            path=args.path, operation="create", after=args.content, before_sha256=None
        )
        try:
            return propose(ctx, f"create {args.path}", [change])
        finally:
            ctx.redis.incr(counter_key(ctx.keys, args.started_key))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
