"""Proposal decisions, heard on Redis pub/sub and reconciled from SQL.

The proposals service publishes every decision on ``keys.approvals_channel`` as JSON
``{"proposal_id", "conversation_id", "user_id", "status", "version", "turn_id"}``, at least
once (its SQL outbox may publish a row again after a crash). Pub/sub in turn drops whatever
is published while a subscriber is away. So this subscriber:

- de-duplicates by ``(proposal_id, version)``: a proposal's version grows with every
  decision, so a message whose version is not newer than the one already known is ignored;
- reconciles from SQL whenever it (re)subscribes: once Redis confirms the subscription (a
  confirmation also arrives when redis-py reconnects and resubscribes by itself), it reads
  the decided proposals of every conversation with an unfinished turn and handles them like
  messages. Subscribed first, read second: a decision committed in between is heard, read,
  or both (and then de-duplicated), never neither.

What it is for: SQL stays the source of truth for the model's context. Each model step
shows every decided proposal next to the call that created it (``transcript.py``). While
this feed is live, ``stamp(conversation_id)`` changes whenever a new decision of the
conversation is heard or reconciled, so a runner whose previous step read the proposals
under the same stamp may skip reading them again (``model_step.py``). It wakes nothing: a
write tool never waits for its proposal, the next model step simply sees the outcome.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import select

from signalbox.services.orchestrator.store import FINISHED_TURN_STATUSES, Sessions
from signalbox.services.orchestrator.transcript import DECIDED_PROPOSAL_STATUSES
from signalbox.shared.db.models import Proposal, Turn

log = logging.getLogger(__name__)

POLL_S = 0.5  # longest wait for a message: bounds how late a stop is noticed
RETRY_S = 0.5  # pause after a failed (re)subscribe or reconcile before the next attempt
MAX_REMEMBERED = 100_000  # proposals (and conversations) remembered; oldest forgotten first

Stamp = tuple[int, int]  # (epoch: bumped on every resubscribe, decisions of the conversation)


@dataclass(frozen=True)
class Resolution:
    """A proposal decision as the approvals channel announces it."""

    proposal_id: str
    conversation_id: str
    status: str
    version: int

    @classmethod
    def from_message(cls, data: Any) -> Resolution:
        """Parse one channel message; ``ValueError`` names what is wrong with it."""
        try:
            body = json.loads(data)
            return cls(
                proposal_id=str(body["proposal_id"]),
                conversation_id=str(body["conversation_id"]),
                status=str(body["status"]),
                version=int(body["version"]),
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"expected an approvals message, got {data!r}") from exc


Listener = Callable[[Resolution, str], None]  # (the new resolution, "pubsub" | "sql")


def decided_in_live_conversations(sessions: Sessions) -> list[Resolution]:
    """Decided proposals of every conversation with an unfinished turn, as SQL has them."""
    live = select(Turn.conversation_id).where(Turn.status.not_in(FINISHED_TURN_STATUSES))
    with sessions() as s:
        rows = s.execute(
            select(Proposal.id, Proposal.conversation_id, Proposal.status, Proposal.version)
            .where(
                Proposal.conversation_id.in_(live),
                Proposal.status.in_(DECIDED_PROPOSAL_STATUSES),
            )
            .order_by(Proposal.decided_at, Proposal.id)
        ).all()
    return [Resolution(pid, conv, status, version) for pid, conv, status, version in rows]


class ApprovalFeed:
    """A daemon thread on the approvals channel of one orchestrator process."""

    def __init__(
        self,
        client: redis.Redis,
        channel: str,
        sessions: Sessions,
        listener: Listener | None = None,
    ) -> None:
        self.client = client
        self.channel = channel
        self.sessions = sessions
        self.listener = listener
        self._lock = threading.Lock()
        self._versions: OrderedDict[str, int] = OrderedDict()
        self._heard: dict[str, int] = {}  # conversation id -> new decisions handled
        self._subscription = 0  # bumped on every (re)subscribe
        self._epoch = 0  # part of every stamp: bumped when counts may have missed something
        self._live = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the loop reads -------------------------------------------------------------

    @property
    def live(self) -> bool:
        """True while subscribed, with SQL reconciled since the (re)subscription."""
        return self._live

    @property
    def subscriptions(self) -> int:
        """How many times the feed has (re)subscribed and reconciled."""
        return self._subscription

    def stamp(self, conversation_id: str) -> Stamp | None:
        """Changes whenever a new decision of the conversation is learned; None: not live
        (nothing can be vouched for, read SQL)."""
        with self._lock:
            if not self._live:
                return None
            return self._epoch, self._heard.get(conversation_id, 0)

    # -- what it learns ------------------------------------------------------------------

    def handle(self, resolution: Resolution, source: str) -> bool:
        """Learn one resolution; False for a duplicate (its version is already known)."""
        with self._lock:
            known = self._versions.get(resolution.proposal_id, 0)
            if resolution.version <= known:
                return False
            self._versions[resolution.proposal_id] = resolution.version
            self._versions.move_to_end(resolution.proposal_id)
            while len(self._versions) > MAX_REMEMBERED:
                self._versions.popitem(last=False)
            conv = resolution.conversation_id
            if conv not in self._heard and len(self._heard) >= MAX_REMEMBERED:
                # Forgetting the counts is safe: a new epoch changes every stamp.
                self._heard.clear()
                self._epoch += 1
            self._heard[conv] = self._heard.get(conv, 0) + 1
        log.debug(
            "proposal %s of conversation %s is %s (version %d, from %s)",
            resolution.proposal_id,
            conv,
            resolution.status,
            resolution.version,
            source,
        )
        if self.listener is not None:
            self.listener(resolution, source)
        return True

    def reconcile(self) -> int:
        """Handle what SQL holds (decisions missed while away); returns how many were new."""
        return sum(self.handle(r, "sql") for r in decided_in_live_conversations(self.sessions))

    # -- the thread ----------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe and listen from a daemon thread until ``stop()``."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="approvals-feed", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2 * POLL_S) -> None:
        """Stop listening (returns once the thread ended, or after ``timeout_s``)."""
        self._stop.set()
        with self._lock:
            self._live = False
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            client: Any = self.client  # redis-py leaves pubsub() untyped
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(self.channel)
                self._listen(pubsub)
            except Exception as exc:  # Redis or SQL away: not live until resubscribed
                with self._lock:
                    self._live = False
                if not self._stop.is_set():
                    log.warning("approvals feed interrupted (%s); resubscribing", exc)
                    self._stop.wait(RETRY_S)
            finally:
                with self._lock:
                    self._live = False
                with contextlib.suppress(Exception):  # the connection may be gone already
                    pubsub.close()

    def _listen(self, pubsub: Any) -> None:
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=POLL_S)
            if not message:
                continue
            if message.get("type") == "subscribe":
                self._resubscribed()
            elif message.get("type") == "message":
                try:
                    resolution = Resolution.from_message(message["data"])
                except ValueError as exc:
                    log.warning("approvals feed: %s", exc)
                    continue
                self.handle(resolution, "pubsub")

    def _resubscribed(self) -> None:
        # Whatever was published since the last subscription may be lost: not live until
        # SQL has been read, and a new epoch makes every stamp change.
        with self._lock:
            self._live = False
        new = self.reconcile()
        with self._lock:
            self._subscription += 1
            self._epoch += 1
            self._live = not self._stop.is_set()
        log.info(
            "approvals feed subscribed (#%d); %d decision(s) reconciled from SQL",
            self._subscription,
            new,
        )
