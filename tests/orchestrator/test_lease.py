"""A runner cut off from Redis longer than its lease knows the lease is gone (issue 21).

Found by tests/chaos/test_partitions.py: an orchestrator host partitioned from Redis kept
treating every failed renewal as "a blip" and logged it as a renewal, so its runner could
go on (writing to SQL, which it still reached) after its turn had resumed elsewhere.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from signalbox.processes import wait_until
from signalbox.redis_server import start_redis
from signalbox.services.orchestrator.lease import LeaseLost, TurnLease

LEASE_S = 1.0


def test_a_lease_unrenewable_for_longer_than_itself_is_lost(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis", persistent=False)
    client = redis.Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    lease = TurnLease(client, "test:lease", LEASE_S, renew_s=0.2)
    try:
        assert lease.acquire()
        with lease:
            wait_until(lambda: lease.longest_gap_s > 0, 10, "a first renewal")
            server.stop()  # Redis unreachable from here on
            stopped_at = time.monotonic()
            wait_until(lease.lost.is_set, 10, "the lease to be given up")
            given_up_after_s = time.monotonic() - stopped_at
            try:
                lease.check()
            except LeaseLost:
                pass
            else:
                raise AssertionError("check() let a runner without a lease go on")
        # Not before it could have expired: a blip shorter than the lease is ridden out.
        assert given_up_after_s >= LEASE_S - 0.3, given_up_after_s
    finally:
        client.close()
        server.stop()


def test_a_blip_shorter_than_the_lease_keeps_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis(tmp_path / "redis", persistent=False)
    port = server.port
    client = redis.Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    lease = TurnLease(client, "test:lease", 4.0, renew_s=0.2)
    try:
        assert lease.acquire()
        with lease:
            server.stop()
            wait_until(lambda: "could not refresh lease" in caplog.text, 10, "a renewal to fail")
            server = start_redis(tmp_path / "redis", persistent=False, port=port)
            client.set("test:lease", lease.token)  # the restarted Redis is empty
            before = lease.longest_gap_s
            wait_until(lambda: lease.longest_gap_s > before, 10, "a renewal after the blip")
            assert not lease.lost.is_set()
    finally:
        client.close()
        server.stop()
