"""Every Redis key and channel name Signalbox uses, in one place, under one deployment prefix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RedisKeys:
    """Key names for a deployment; ``prefix`` keeps parallel deployments (and test runs) apart."""

    prefix: str = "sb:"

    def events(self, conversation_id: str) -> str:
        """The conversation's event stream (Redis Stream, replayable by id)."""
        return f"{self.prefix}events:{conversation_id}"

    def events_bell(self, conversation_id: str) -> str:
        """Pub/sub channel published on after each append to the conversation's event stream
        (``shared/event_stream.py``): gateways read the stream when it rings."""
        return f"{self.prefix}bell:events:{conversation_id}"

    def tool_results(self, turn_id: str) -> str:
        """Stream of tool results of one turn, written by tool workers, read by the orchestrator."""
        return f"{self.prefix}results:{turn_id}"

    def call_claim(self, call_id: str) -> str:
        """Set by the first tool worker that starts a call; a redelivery sees it."""
        return f"{self.prefix}claim:call:{call_id}"

    def user_tool_slots(self, user_id: str) -> str:
        """The tool calls of one user in flight (services/orchestrator/tool_slots.py)."""
        return f"{self.prefix}slots:tools:{user_id}"

    def call_alive(self, call_id: str) -> str:
        """Renewed (short TTL) by the tool worker whose pool process runs the call right now."""
        return f"{self.prefix}alive:call:{call_id}"

    def call_cancelled(self, call_id: str) -> str:
        """Set (with a short TTL) by a cancel before it revokes the call (``call_cancel.py``)."""
        return f"{self.prefix}cancelled:call:{call_id}"

    def turn_lease(self, turn_id: str) -> str:
        """Who runs a turn right now (one runner per turn)."""
        return f"{self.prefix}lease:turn:{turn_id}"

    def turn_deliveries(self, turn_id: str) -> str:
        """How many runs of a turn started and never came back (their worker died)."""
        return f"{self.prefix}deliveries:turn:{turn_id}"

    def turn_requeued(self, turn_id: str) -> str:
        """Set while a stale queued turn was lately enqueued again (one re-enqueue per period)."""
        return f"{self.prefix}requeued:turn:{turn_id}"

    def turn_orphan_enqueued(self, turn_id: str) -> str:
        """Set while a turn found without a runner was lately enqueued again (recovery.py)."""
        return f"{self.prefix}orphan-enqueued:turn:{turn_id}"

    def orphan_sweep(self) -> str:
        """Held by the orchestrator process that sweeps for orphaned turns this interval."""
        return f"{self.prefix}orphan-sweep"

    def deployment_epoch(self) -> str:
        """A value set once per Redis lifetime; its disappearance means Redis lost its data."""
        return f"{self.prefix}epoch"

    def tool_catalogue(self) -> str:
        """Sorted set of live tool-worker catalogue keys, scored by expiry time."""
        return f"{self.prefix}tools:workers"

    def tool_worker(self, worker_id: str) -> str:
        """One tool worker's published catalogue (JSON), with a TTL refreshed while it lives."""
        return f"{self.prefix}tools:worker:{worker_id}"

    def ws_ticket(self, ticket: str) -> str:
        """A single-use WebSocket ticket."""
        return f"{self.prefix}ws-ticket:{ticket}"

    def sse_resume(self, ticket_hash: str) -> str:
        """What a consumed ticket still allows: its EventSource's own reconnects (gateway)."""
        return f"{self.prefix}sse-resume:{ticket_hash}"

    def rate(self, user_id: str, window: int) -> str:
        """Per-user frame counter for one rate-limit window."""
        return f"{self.prefix}rate:{user_id}:{window}"

    def turn_parked_at(self, turn_id: str) -> str:
        """When a turn last parked (epoch seconds), for ``signalbox_turn_parked_seconds``."""
        return f"{self.prefix}parked-at:turn:{turn_id}"

    def celery_queue(self, queue: str, priority: int = 0) -> str:
        """The Redis list of a Celery queue's messages at one priority step: kombu names the
        others ``<queue>\\x06\\x16<step>``, and Celery's ``global_keyprefix`` is this prefix."""
        return self.prefix + (f"{queue}\x06\x16{priority}" if priority else queue)

    def celery_unacked(self) -> str:
        """kombu's hash of messages delivered to a worker and not yet acknowledged."""
        return f"{self.prefix}unacked"

    @property
    def approvals_channel(self) -> str:
        """Pub/sub channel of proposal decisions."""
        return f"{self.prefix}approvals"

    @property
    def control_channel(self) -> str:
        """Pub/sub channel of turn control messages (cancel, decisions)."""
        return f"{self.prefix}control"
