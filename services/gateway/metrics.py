"""Prometheus metrics of one gateway process, served as text at ``GET /metrics``.

Each app gets its own registry (tests run several gateways in one process). Counters are
per process; Prometheus sums them over the gateways. Turns by status are not counted
here but read from SQL at scrape time, so every gateway reports the same, true numbers
rather than each counting the ``turn_finished`` events it happened to relay.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from signalbox.shared.db import Turn, User
from signalbox.shared.metrics import user_class as user_class  # its one definition, re-exported
from signalbox.shared.protocol import CLIENT_FRAME_TYPES
from signalbox.shared.statuses import TurnState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Relay latency is milliseconds on one machine, tens of ms across a loaded deployment.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Labels come from client input; anything outside the protocol's types is one label value.
_OTHER_FRAME = "invalid"


class _TurnsBySql(Collector):
    """``signalbox_turns{status}``: the number of turns in each status, counted in SQL."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "signalbox_turns", "Turns in each status (SQL count at scrape time)", labels=["status"]
        )
        for status, count in sorted(self.counts.items()):
            family.add_metric([status], count)
        yield family


class GatewayMetrics:
    """The gateway's metrics; the relay and the sessions update them as things happen."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.connections = Gauge(
            "signalbox_gateway_connections",
            "Open client connections",
            ["transport"],
            registry=r,
        )
        self.events_relayed = Counter(
            "signalbox_gateway_events_relayed",
            "Events sent to clients (replayed or live)",
            ["kind"],
            registry=r,
        )
        self.relay_latency = Histogram(
            "signalbox_gateway_relay_latency_seconds",
            "From an event's ts to its send on a socket (live events only, not replays)",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.frames = Counter(
            "signalbox_gateway_frames",
            "Client WebSocket frames received, by type",
            ["type"],
            registry=r,
        )
        self.errors = Counter(
            "signalbox_gateway_errors",
            "Error replies (WebSocket error frames and HTTP errors), by protocol code",
            ["code"],
            registry=r,
        )
        self.closes = Counter(
            "signalbox_gateway_ws_closes",
            "WebSockets closed by the gateway, by close code",
            ["code"],
            registry=r,
        )
        # Tenancy (added): labelled by user class ("admin" | "user"), never by user id, so
        # the number of series stays bounded however many users a deployment has.
        self.turns_queued = Counter(
            "signalbox_gateway_turns_queued",
            "Turns accepted and queued, by user class",
            ["user_class"],
            registry=r,
        )
        self.budget_refusals = Counter(
            "signalbox_gateway_budget_refusals",
            "Turns refused because the user's token budget was used up, by user class",
            ["user_class", "period"],
            registry=r,
        )
        self.rate_limited = Counter(
            "signalbox_gateway_rate_limited",
            "Requests and frames refused by a rate limit, by user class and action class",
            ["user_class", "action"],
            registry=r,
        )
        self.quota_refusals = Counter(
            "signalbox_gateway_quota_refusals",
            "Creations refused by a quota, by user class and quota",
            ["user_class", "quota"],
            registry=r,
        )
        self.turns_waiting = Gauge(
            "signalbox_turns_waiting",
            "Turns waiting for a slot of their user's fair share, by user class (SQL count)",
            ["user_class"],
            registry=r,
        )
        self._turns = _TurnsBySql()
        r.register(self._turns)
        for transport in ("ws", "sse"):
            self.connections.labels(transport)  # exported at 0 before the first connection

    def frame(self, frame_type: object) -> None:
        """Count one client frame (unknown types under one label)."""
        label = frame_type if frame_type in CLIENT_FRAME_TYPES else _OTHER_FRAME
        self.frames.labels(str(label)).inc()

    def refresh_turns(self, session: Session, deployment: str) -> None:
        """Read the turn counts from SQL (call in a worker thread before ``render``);
        ``deployment``: the Redis prefix whose waiting turns are counted."""
        rows = session.execute(select(Turn.status, func.count()).group_by(Turn.status)).all()
        self._turns.counts = {str(status): int(count) for status, count in rows}
        waiting = session.execute(
            select(User.is_admin, func.count())
            .select_from(Turn)
            .join(User, User.id == Turn.user_id)
            .where(
                Turn.deployment == deployment,
                Turn.status == TurnState.QUEUED,
                Turn.admitted_at.is_(None),
            )
            .group_by(User.is_admin)
        ).all()
        by_class = {user_class(bool(is_admin)): int(count) for is_admin, count in waiting}
        for label in ("admin", "user"):
            self.turns_waiting.labels(label).set(by_class.get(label, 0))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
