"""Wake turns nobody works on: a running turn with no lease (its runner died), and a parked
turn with something to do (a decision or client tool past its ``expires_at``, a cancel, or
an answer whose wake-up was lost).

Celery would redeliver the dead runner's message only after the visibility timeout (an hour
by default), and nothing at all happens for a parked turn on its own. Instead each
orchestrator looks every ``interval_s`` for such turns and enqueues them again; a duplicate
enqueue is harmless (the lease lets one runner in, the rest return).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis
from sqlalchemy import select

from services.orchestrator.store import Sessions, parked_turns, ready_to_continue
from shared.db.models import Turn
from shared.redis_keys import RedisKeys

log = logging.getLogger(__name__)


def orphaned_turns(sessions: Sessions, client: redis.Redis, keys: RedisKeys) -> list[str]:
    """Running turns of this deployment whose lease is gone (their runner stopped).

    "Of this deployment": the conversation has an event stream under this Redis prefix
    (the gateway appends ``turn_queued`` for every turn), so deployments that share a
    database but not a prefix (test runs, staging) never take each other's turns.
    """
    with sessions() as s:
        running = list(
            s.execute(
                select(Turn.id, Turn.conversation_id).where(
                    Turn.status == "running",
                    Turn.parent_call_id.is_(None),  # a child runs under its parent's lease
                )
            )
        )
    return [turn_id for turn_id, _conv in _ours_unleased(client, keys, list(running))]


def _ours_unleased(
    client: redis.Redis, keys: RedisKeys, turns: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    if not turns:
        return []
    pipe = client.pipeline()
    for turn_id, conversation_id in turns:
        pipe.exists(keys.turn_lease(turn_id))
        pipe.exists(keys.events(conversation_id))
    found: list[Any] = pipe.execute()
    return [
        t
        for t, lease, mine in zip(turns, found[0::2], found[1::2], strict=True)
        if mine and not lease
    ]


def stalled_parked_turns(sessions: Sessions, client: redis.Redis, keys: RedisKeys) -> list[str]:
    """Parked turns of this deployment, not being run, that have something to do now."""
    candidates = _ours_unleased(client, keys, parked_turns(sessions))
    return [turn_id for turn_id, _conv in candidates if ready_to_continue(sessions, turn_id)]


class Reconciler:
    """A daemon thread that re-enqueues orphaned turns every ``interval_s``."""

    def __init__(
        self,
        sessions: Sessions,
        client: redis.Redis,
        keys: RedisKeys,
        enqueue_turn: Callable[[str], object],
        interval_s: float,
    ) -> None:
        self.sessions = sessions
        self.client = client
        self.keys = keys
        self.enqueue_turn = enqueue_turn
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turn-reconciler", daemon=True)

    def sweep(self) -> list[str]:
        """One pass; returns the turns it enqueued."""
        found = orphaned_turns(self.sessions, self.client, self.keys)
        for turn_id in found:
            log.warning("turn %s is running without a runner; enqueueing it again", turn_id)
            self.enqueue_turn(turn_id)
        woken = stalled_parked_turns(self.sessions, self.client, self.keys)
        for turn_id in woken:
            log.info("parked turn %s has something to do (expiry, cancel); enqueueing it", turn_id)
            self.enqueue_turn(turn_id)
        return found + woken

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
            except Exception:  # SQL or Redis away for a moment: try again next round
                log.warning("turn reconciler pass failed", exc_info=True)

    def start(self) -> None:
        """Start sweeping."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sweeping."""
        self._stop.set()
