"""The relay benchmark's producer, run as its own process: ``python -m bench.producer JSON``.

It appends one event per stream every ``period_s``, staggered evenly, each carrying its
send time (``time.monotonic()``: one clock for every process on Linux). ``raw`` writes a
bare ``XADD`` entry; otherwise the event goes through ``EventStream.append``, the code the
orchestrator appends with.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import redis

from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys


def produce(
    redis_url: str,
    prefix: str,
    streams: list[str],
    period_s: float,
    duration_s: float,
    start_at: float,
    raw: bool,
) -> int:
    """Append the events; returns how many were appended."""
    client = redis.Redis.from_url(redis_url)
    keys = RedisKeys(prefix)
    events = EventStream(client, keys)
    n = len(streams)
    ticks = int(duration_s / period_s)
    appended = 0
    while (wait := start_at - time.monotonic()) > 0:
        time.sleep(min(0.01, wait))  # the start time is agreed with the readers
    for tick in range(ticks):
        for j, stream in enumerate(streams):
            delay = start_at + tick * period_s + j * period_s / n - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing to a schedule, not waiting on another process
            sent = repr(time.monotonic())
            if raw:
                client.xadd(keys.events(stream), {"sent": sent})
            else:
                events.append(stream, "text_delta", {"text": ".", "sent": sent})
            appended += 1
    client.close()
    return appended


def main(argv: list[str]) -> int:
    """Run ``produce`` with the keyword arguments given as one JSON object."""
    if len(argv) != 1:
        print("usage: python -m bench.producer '{\"redis_url\": ..., ...}'", file=sys.stderr)
        return 2
    kwargs: dict[str, Any] = json.loads(argv[0])
    produce(**kwargs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
