"""Per-call heartbeats, kept by a tool worker's main process while its pool runs the calls.

Every ``interval_s`` the main process renews ``keys.call_alive`` (valid ``ttl_s``) of each
call a pool process of its runs now. When that process dies (SIGKILL, the OOM killer) the
pool drops its request and the renewals stop; when the whole worker dies they stop too. The
orchestrator then ends the call ``lost`` within seconds (``server_calls.Heartbeats``)
instead of at its time limit plus grace.

Renewed from the main process, not by a thread beside the tool: a tool holding the GIL in
a long C call (a regex, a parser) would starve that thread, and a live call would look dead.
The main process runs no tool code. Only the run holding the call's claim is renewed
(``shared/tool_contract.renew_heartbeats``): a redelivery that the claim skips must not
make a dead run look alive.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import redis
from celery.worker import state

from signalbox.services.tools.batches import batch_call_ids
from signalbox.shared.celery_app import RUN_BATCH_TASK, RUN_TOOL_TASK
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import claim_holder, renew_heartbeats

log = logging.getLogger(__name__)
_PROC_STAT = Path("/proc/self/stat")


def running_calls() -> list[tuple[str, str]]:
    """``(call_id, claim holder)`` of each call this worker's pool runs now.

    A call's id is its Celery task id (``dispatch.py``); ``worker_pid`` is set once a pool
    process accepted the task. Read in the main process, where the pool's requests live.
    A batch (``batches.py``) names every call of it: which one runs now only its pool
    process knows, and the renewal touches only the calls whose claim that process holds.
    """
    running = []
    for request in list(state.active_requests):  # copied at once: the consumer mutates it
        if not (request.worker_pid and _alive(request.worker_pid)):
            continue
        if request.name == RUN_TOOL_TASK:
            running.append((request.id, claim_holder(request.worker_pid)))
        elif request.name == RUN_BATCH_TASK:
            holder = claim_holder(request.worker_pid)
            running += [(call_id, holder) for call_id in batch_call_ids(request.kwargs)]
    return running


def _alive(pid: int) -> bool:
    """False once ``pid`` exited, even before the pool reaps it and drops its request (which
    can take seconds on a loaded machine): a zombie runs no call."""
    if not _PROC_STAT.exists():  # no /proc here (not Linux): the pool's own notice has to do
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


class CallHeartbeat:
    """A daemon thread renewing the heartbeat of every running call every ``interval_s``."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        interval_s: float,
        ttl_s: float,
        calls: Callable[[], list[tuple[str, str]]] = running_calls,
    ) -> None:
        self.client = client
        self.keys = keys
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.calls = calls
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="call-heartbeat", daemon=True)

    def beat(self) -> int:
        """Renew once; returns how many heartbeats were renewed."""
        return renew_heartbeats(self.client, self.keys, self.calls(), self.ttl_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except redis.RedisError as exc:  # Redis away: keep beating, it may come back
                log.warning("call heartbeat failed: %s", exc)

    def start(self) -> None:
        """Renew every ``interval_s`` from now on."""
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the heartbeats run out after ``ttl_s``)."""
        self._stop.set()
