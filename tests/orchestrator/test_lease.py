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

LEASE_S = 3.0
# The lease's last renewal before Redis stops is at most a renewal period old, more if the
# timer thread was held up just then on a loaded machine: this much is allowed for that.
RENEWAL_AGE_S = 1.0
BLIP_LEASE_S = 60.0  # far longer than stopping and restarting Redis takes, however loaded
WAIT_S = 30.0  # a deadline to wait for, generous for a loaded machine


def test_a_lease_unrenewable_for_longer_than_itself_is_lost(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis", persistent=False)
    client = redis.Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    lease = TurnLease(client, "test:lease", LEASE_S, renew_s=0.2)
    try:
        assert lease.acquire()
        with lease:
            wait_until(lambda: lease.longest_gap_s > 0, WAIT_S, "a first renewal")
            stopped_at = time.monotonic()  # before: stopping Redis takes a moment
            server.stop()  # Redis unreachable from here on
            wait_until(lease.lost.is_set, WAIT_S, "the lease to be given up")
            given_up_after_s = time.monotonic() - stopped_at
            try:
                lease.check()
            except LeaseLost:
                pass
            else:
                raise AssertionError("check() let a runner without a lease go on")
        # Not before it could have expired (not at the first failed renewal, 0.2 s after the
        # stop): a blip shorter than the lease is ridden out. A lower bound only.
        assert given_up_after_s >= LEASE_S - RENEWAL_AGE_S, given_up_after_s
    finally:
        client.close()
        server.stop()


def test_a_blip_shorter_than_the_lease_keeps_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis(tmp_path / "redis", persistent=False)
    port = server.port
    client = redis.Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    lease = TurnLease(client, "test:lease", BLIP_LEASE_S, renew_s=0.2)
    try:
        assert lease.acquire()
        with lease:
            server.stop()
            wait_until(
                lambda: "could not refresh lease" in caplog.text, WAIT_S, "a renewal to fail"
            )
            server = start_redis(tmp_path / "redis", persistent=False, port=port)
            client.set("test:lease", lease.token)  # the restarted Redis is empty
            before = lease.longest_gap_s
            wait_until(lambda: lease.longest_gap_s > before, WAIT_S, "a renewal after the blip")
            assert not lease.lost.is_set()
    finally:
        client.close()
        server.stop()


def test_a_lease_given_back_undoes_only_its_own_runs_count(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    key, count_key = f"{redis_prefix}lease:given-back", f"{redis_prefix}deliveries:given-back"
    redis_client.set(count_key, 2)  # two earlier runs that never came back
    lease = TurnLease(redis_client, key, LEASE_S)
    assert lease.acquire_counted(count_key, 60) == 3

    lease.give_back()  # this run did nothing under it

    assert redis_client.get(key) is None, "the lease is free"
    assert int(redis_client.get(count_key) or 0) == 2, "the earlier runs still count"
    alone = TurnLease(redis_client, key, LEASE_S)
    assert alone.acquire_counted(count_key + "-alone", 60) == 1
    alone.give_back()
    assert not redis_client.exists(count_key + "-alone"), "a count of none is gone"


def test_a_lease_given_back_after_it_ran_out_still_undoes_its_runs_count(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    key, count_key = f"{redis_prefix}lease:ran-out", f"{redis_prefix}deliveries:ran-out"
    redis_client.set(count_key, 1)  # an earlier run that never came back
    lease = TurnLease(redis_client, key, LEASE_S)
    assert lease.acquire_counted(count_key, 60) == 2
    redis_client.delete(key)  # it ran out while the run read its turn...
    later = TurnLease(redis_client, key, LEASE_S)
    assert later.acquire_counted(count_key, 60) == 3  # ...and another runner took it

    lease.give_back()

    assert redis_client.get(key) == later.token.encode(), "the other runner's lease stays"
    assert int(redis_client.get(count_key) or 0) == 2, "its run and the earlier one count"
