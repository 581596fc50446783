"""Wake turns nobody works on: a running turn with no lease (its runner died), a parked
turn with something to do (a decision or client tool past its ``expires_at``, a cancel, or
an answer whose wake-up was lost), and a queued turn whose message is gone.

Celery would redeliver the dead runner's message only after the visibility timeout (an hour
by default), and nothing at all happens for a parked turn on its own. Instead each
orchestrator looks every ``interval_s`` for such turns and enqueues them again; a duplicate
enqueue is harmless (the lease lets one runner in, the rest return). Running turns whose
runner died are looked for far more often (``orphans_s``, one SQL query and one pipeline of
``EXISTS``), by one orchestrator of the deployment per interval (the sweep key): a dead
runner's turn resumes within seconds of its lease running out.

Redis losing its data (a restart without persistence, a flush) takes the queued messages,
the leases and the event streams with it, while SQL still holds every turn. The reconciler
notices through the deployment epoch key (set once, gone after a loss) and then adopts every
unfinished turn of the database, whether or not its event stream still exists.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import redis
from sqlalchemy import select

from signalbox.services.orchestrator.store import (
    FINISHED_TURN_STATUSES,
    Sessions,
    parked_turns,
    ready_to_continue,
    utcnow,
)
from signalbox.shared.db.models import Turn, as_utc
from signalbox.shared.redis_keys import RedisKeys

log = logging.getLogger(__name__)

# One re-enqueue of an orphan per this, however many orchestrators sweep: its message may
# wait for a free orchestrator, and more copies would not make that sooner.
ORPHAN_REENQUEUE_S = 5.0
# The sweep key lives this share of the orphan interval: gone by the holder's next round.
SWEEP_HOLD_SHARE = 0.9


def orphaned_turns(
    sessions: Sessions, client: redis.Redis, keys: RedisKeys, adopt: bool = False
) -> list[str]:
    """Running turns of this deployment whose lease is gone (their runner stopped).

    "Of this deployment": the conversation has an event stream under this Redis prefix
    (the gateway appends ``turn_queued`` for every turn), so deployments that share a
    database but not a prefix (test runs, staging) never take each other's turns.
    ``adopt``: Redis lost its data, so every running turn of the database counts as ours.
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
    unleased = [turn_id for turn_id, _conv in _ours_unleased(client, keys, list(running), adopt)]
    if not unleased:
        return []
    # Read again: a turn that finished or parked between the read above and the lease check
    # gave its lease up in between (a busy deployment saw a few such false orphans a minute,
    # each an extra delivery). Only a turn still running has lost its runner.
    with sessions() as s:
        still = set(
            s.scalars(select(Turn.id).where(Turn.id.in_(unleased), Turn.status == "running"))
        )
    return [turn_id for turn_id in unleased if turn_id in still]


def _ours_unleased(
    client: redis.Redis, keys: RedisKeys, turns: list[tuple[str, str]], adopt: bool = False
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
        if (mine or adopt) and not lease
    ]


def stalled_parked_turns(
    sessions: Sessions, client: redis.Redis, keys: RedisKeys, adopt: bool = False
) -> list[str]:
    """Parked turns of this deployment, not being run, that have something to do now."""
    candidates = _ours_unleased(client, keys, parked_turns(sessions), adopt)
    return [turn_id for turn_id, _conv in candidates if ready_to_continue(sessions, turn_id)]


def stale_queued_turns(
    sessions: Sessions,
    client: redis.Redis,
    keys: RedisKeys,
    stale_s: float,
    adopt: bool = False,
) -> list[str]:
    """Admitted queued turns next in line in their conversation, admitted longer than
    ``stale_s`` ago (a turn still waiting for a slot has no message: admission sends it).

    Their message may be gone (Redis lost it, its delivery failed on a Redis error, or the
    process that admitted them died before sending it).
    At most one re-enqueue per turn per ``stale_s`` across all orchestrators, so a long
    backlog is not flooded with duplicates; ``adopt`` (after a data loss) skips both waits.
    """
    cutoff = utcnow() - timedelta(seconds=stale_s)
    with sessions() as s:
        rows = s.execute(
            select(Turn.id, Turn.conversation_id, Turn.status, Turn.admitted_at)
            .where(
                Turn.status.not_in(FINISHED_TURN_STATUSES),
                Turn.parent_call_id.is_(None),
            )
            .order_by(Turn.conversation_id, Turn.seq)
        ).all()
    heads: dict[str, tuple[str, str, Any]] = {}
    for turn_id, conversation_id, status, admitted_at in rows:
        heads.setdefault(conversation_id, (turn_id, status, admitted_at))
    candidates = [
        (turn_id, conversation_id)
        for conversation_id, (turn_id, status, admitted_at) in heads.items()
        if status == "queued"
        and admitted_at is not None
        and (adopt or as_utc(admitted_at) <= cutoff)
    ]
    ttl_ms = max(1, int(stale_s * 1000))
    found = []
    for turn_id, _conv in _ours_unleased(client, keys, candidates, adopt):
        if adopt or client.set(keys.turn_requeued(turn_id), "1", nx=True, px=ttl_ms):
            found.append(turn_id)
    return found


def redis_lost_data(client: redis.Redis, keys: RedisKeys, seen: str | None) -> tuple[bool, str]:
    """(whether Redis lost its data since the epoch ``seen`` was read, the epoch now)."""
    key = keys.deployment_epoch()
    client.set(key, uuid.uuid4().hex, nx=True)  # a no-op unless the key is gone
    raw: Any = client.get(key)
    now = raw.decode() if isinstance(raw, bytes) else str(raw)
    return seen is not None and now != seen, now


class Reconciler:
    """A daemon thread that re-enqueues turns nobody works on every ``interval_s``."""

    def __init__(
        self,
        sessions: Sessions,
        client: redis.Redis,
        keys: RedisKeys,
        enqueue_turn: Callable[[str], object],
        interval_s: float,
        stale_queued_s: float | None = None,
        orphans_s: float | None = None,
        admit: Callable[[], list[str]] | None = None,
    ) -> None:
        self.sessions = sessions
        self.client = client
        self.keys = keys
        self.enqueue_turn = enqueue_turn
        self.interval_s = interval_s
        # Longer than a turn normally waits in the queue for a free orchestrator.
        self.stale_queued_s = stale_queued_s if stale_queued_s is not None else 4 * interval_s
        self.orphans_s = min(orphans_s, interval_s) if orphans_s is not None else interval_s
        self.admit = admit  # an admission pass that enqueues what it admits
        self.epoch: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turn-reconciler", daemon=True)

    def sweep(self) -> list[str]:
        """One pass; returns the turns it enqueued."""
        adopt, self.epoch = redis_lost_data(self.client, self.keys, self.epoch)
        if adopt:
            log.warning("Redis lost its data: adopting every unfinished turn from SQL")
        found = orphaned_turns(self.sessions, self.client, self.keys, adopt)
        for turn_id in found:
            log.warning("turn %s is running without a runner; enqueueing it again", turn_id)
            self.enqueue_turn(turn_id)
        woken = stalled_parked_turns(self.sessions, self.client, self.keys, adopt)
        for turn_id in woken:
            log.info("parked turn %s has something to do (expiry, cancel); enqueueing it", turn_id)
            self.enqueue_turn(turn_id)
        queued = stale_queued_turns(
            self.sessions, self.client, self.keys, self.stale_queued_s, adopt
        )
        for turn_id in queued:
            log.warning("queued turn %s may have lost its message; enqueueing it again", turn_id)
            self.enqueue_turn(turn_id)
        # A slot freed by a process that died before its admission pass, a turn stored by a
        # gateway that died before its pass: nothing else would start them.
        admitted = self.admit() if self.admit is not None else []
        for turn_id in admitted:
            log.info("admitted waiting turn %s", turn_id)
        return found + woken + queued + admitted

    def sweep_orphans(self) -> list[str]:
        """The frequent pass: running turns whose runner died; returns those it enqueued.

        One process of the deployment sweeps per interval, whoever takes the sweep key
        first (it expires within the interval, so a dead sweeper's turn passes on at the
        next). Every process sweeping read every running turn from SQL and checked two keys
        of each in Redis, ``orphans_s`` apart per process: a cost that grew with the
        orchestrators as well as with the turns, for the same answer.
        """
        hold_ms = max(1, int(self.orphans_s * 1000 * SWEEP_HOLD_SHARE))
        if not self.client.set(self.keys.orphan_sweep(), "1", nx=True, px=hold_ms):
            return []
        found = []
        ttl_ms = int(ORPHAN_REENQUEUE_S * 1000)
        for turn_id in orphaned_turns(self.sessions, self.client, self.keys):
            if self.client.set(self.keys.turn_orphan_enqueued(turn_id), "1", nx=True, px=ttl_ms):
                log.warning("turn %s is running without a runner; enqueueing it again", turn_id)
                self.enqueue_turn(turn_id)
                found.append(turn_id)
        return found

    def _run(self) -> None:
        next_full = time.monotonic() + self.interval_s
        while not self._stop.wait(self.orphans_s):
            try:
                if time.monotonic() >= next_full:
                    next_full = time.monotonic() + self.interval_s
                    self.sweep()
                else:
                    self.sweep_orphans()
            except Exception:  # SQL or Redis away for a moment: try again next round
                log.warning("turn reconciler pass failed", exc_info=True)

    def start(self) -> None:
        """Note the deployment epoch now (a loss right after start-up must be seen), then
        sweep every ``interval_s``."""
        try:
            _lost, self.epoch = redis_lost_data(self.client, self.keys, None)
        except redis.RedisError:
            log.warning("could not read the deployment epoch; the first sweep will")
        self._thread.start()

    def stop(self) -> None:
        """Stop sweeping."""
        self._stop.set()
