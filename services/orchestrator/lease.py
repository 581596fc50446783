"""One runner per turn: a Redis lease with a token, kept alive by a heartbeat thread.

A second delivery of the same turn (a redelivered Celery message, a duplicate enqueue)
finds the lease held and returns at once. If the runner dies the lease expires after
``lease_s`` and the next delivery resumes the turn. A runner whose lease was taken over
(it stalled longer than ``lease_s``) notices through ``lost`` and stops writing.

The lease is short (seconds: how soon a dead runner's turn resumes) and renewed often
(``renew_s``) by the process's timer thread (``timers.py``, one for every lease of the
process, so a turn starts no thread of its own), which waits on Redis, not on the CPU, so a
busy runner keeps it. A renewal that comes late is logged with its gap: the margin an
operator watches.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from types import TracebackType

import redis

from signalbox.services.orchestrator.timers import TIMERS, Timer, Timers

log = logging.getLogger(__name__)

# Extend or delete the lease only while it is still ours.
_REFRESH = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
# The lease taken and the run counted (``deliveries.py``) in one round trip: the count
# only when the lease was taken, as two commands did it.
_ACQUIRE_COUNTED = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local count = redis.call('incr', KEYS[2])
  redis.call('expire', KEYS[2], ARGV[3])
  return count
end
return 0
"""
# Given up, and the run's count forgotten with it (the run came back).
_RELEASE_COUNTED = """
redis.call('del', KEYS[2])
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""

# Given back by a run that did nothing: the lease if still ours, and this run's count in
# any case (the run came back; earlier runs' count, and a later runner's, stay).
_GIVE_BACK = """
local released = 0
if redis.call('get', KEYS[1]) == ARGV[1] then
  released = redis.call('del', KEYS[1])
end
if redis.call('decr', KEYS[2]) <= 0 then
  redis.call('del', KEYS[2])
end
return released
"""


class LeaseLost(Exception):
    """Another runner holds the turn now; this one must stop without writing."""


def holder_pid(token: str | bytes | None) -> int | None:
    """The pid of the process holding a lease whose token is ``token`` (None if unreadable)."""
    if token is None:
        return None
    text = token.decode() if isinstance(token, bytes) else token
    parts = text.split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


class TurnLease:
    """``SET key token NX PX`` plus a heartbeat; use ``acquire()`` then ``with lease:``."""

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        lease_s: float,
        renew_s: float | None = None,
        *,
        timers: Timers = TIMERS,
    ) -> None:
        self.client = client
        self.key = key
        self.lease_ms = max(1, int(lease_s * 1000))
        self.renew_s = renew_s if renew_s is not None else lease_s / 3
        self.longest_gap_s = 0.0  # between two renewals, for operators and tests
        # Who holds it, readable by operators (and chaos tests): host, pid, then a nonce.
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self.lost = threading.Event()
        self._renewed_at = time.monotonic()  # of the last acquire or refresh Redis confirmed
        self._last_beat = self._renewed_at
        self._timers = timers
        self._heartbeat: Timer | None = None
        self.count_key: str | None = None  # a run count to forget with the lease

    def acquire(self) -> bool:
        """Take the lease if nobody holds it."""
        self._renewed_at = time.monotonic()  # before the SET: the expiry counts from it
        return bool(self.client.set(self.key, self.token, nx=True, px=self.lease_ms))

    def acquire_counted(self, count_key: str, count_ttl_s: int) -> int:
        """Take the lease if nobody holds it and, if taken, count this run at ``count_key``
        (``INCR``, kept ``count_ttl_s``), in ONE round trip: the count, or 0 if not taken.
        The count is forgotten when the lease is released (``release``)."""
        self._renewed_at = time.monotonic()
        count = int(
            self.client.eval(
                _ACQUIRE_COUNTED, 2, self.key, count_key, self.token, self.lease_ms, count_ttl_s
            )
        )
        if count:
            self.count_key = count_key
        return count

    def forget_count(self) -> None:
        """Forget the run's count now if releasing the lease did not (best effort)."""
        if self.count_key is None:
            return
        try:
            self.client.delete(self.count_key)
            self.count_key = None
        except redis.RedisError:
            # Redis away: the count stays, at worst one extra crash-free run is counted.
            log.warning("could not clear the run count %s", self.count_key)

    def refresh(self) -> bool:
        """Extend the lease; False (and ``lost`` set) if it is no longer ours."""
        asked_at = time.monotonic()
        try:
            ok = bool(self.client.eval(_REFRESH, 1, self.key, self.token, str(self.lease_ms)))
        except redis.RedisError:
            if time.monotonic() - self._renewed_at >= self.lease_ms / 1000:
                # Cut off from Redis longer than the lease: it has expired there whatever
                # comes next, and another runner may hold the turn. Stop before writing.
                log.error("lease %s expired while Redis was unreachable", self.key)
                self.lost.set()
                return False
            log.warning("could not refresh lease %s; will retry", self.key, exc_info=True)
            return True  # a blip; the lease may still hold until it expires
        if not ok:
            self.lost.set()
        else:
            self._renewed_at = asked_at
        return ok

    def check(self) -> None:
        """Raise ``LeaseLost`` if the lease was taken over."""
        if self.lost.is_set():
            raise LeaseLost(self.key)

    def release(self) -> None:
        """Give the lease up (only if still ours), and forget the run's count if any."""
        try:
            if self.count_key is not None:
                self.client.eval(_RELEASE_COUNTED, 2, self.key, self.count_key, self.token)
                self.count_key = None
            else:
                self.client.eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            log.warning("could not release lease %s; it will expire", self.key, exc_info=True)

    def give_back(self) -> None:
        """Release the lease of a run that did nothing under it (``acquire_counted``'s), its
        heartbeat stopped: its own count is undone, even if the lease ran out meanwhile; the
        count of earlier runs that never came back stays."""
        self._stop_heartbeat()
        if self.count_key is None:
            self.release()
            return
        try:
            self.client.eval(_GIVE_BACK, 2, self.key, self.count_key, self.token)
            self.count_key = None
        except redis.RedisError:
            log.warning("could not give lease %s back; it will expire", self.key, exc_info=True)

    def _beat(self) -> bool:
        """One heartbeat, on the timer thread: False once the lease is gone (no more)."""
        if not self.refresh():
            heartbeat = self._heartbeat  # read once: the runner's thread may stop it now
            if heartbeat is not None and not heartbeat.cancelled:
                log.error("lease %s was taken over; this runner stops", self.key)
            return False
        if self._renewed_at == self._last_beat:
            return True  # Redis did not answer: no renewal to time
        gap, self._last_beat = self._renewed_at - self._last_beat, self._renewed_at
        self.longest_gap_s = max(self.longest_gap_s, gap)
        if gap > 2 * self.renew_s:
            log.warning(
                "lease %s renewed %.2f s after the last renewal (every %g s, valid %g s)",
                self.key,
                gap,
                self.renew_s,
                self.lease_ms / 1000,
            )
        return True

    def keep_alive(self) -> None:
        """Start the heartbeat now (once), before ``with lease:`` if work under the lease
        comes first (``loop.py`` reads and starts the turn): it renews from the acquire on."""
        if self._heartbeat is None:
            self._last_beat = self._renewed_at
            self._heartbeat = self._timers.call_every(self.renew_s, self._beat)

    def _stop_heartbeat(self) -> None:
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.cancel()  # a renewal under way may still finish: harmless

    def __enter__(self) -> TurnLease:
        self.keep_alive()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_heartbeat()
        self.release()
