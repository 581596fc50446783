"""Prometheus metrics of the proposals service, served at ``GET /metrics``.

Both series are read from SQL at each scrape, like the gateway's turns: every instance
reports the same, true numbers (take ``max`` across instances, not ``sum``).

- ``signalbox_proposals{status}``: proposals in each status;
- ``signalbox_outbox_lag_seconds``: the age of the oldest outbox row not yet published
  (0 when none waits), with ``signalbox_outbox_unsent``, how many wait. A lag that grows
  means decisions are committed but nobody hears of them (Redis down, the relay stuck).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import get_args

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.proposals.outbox import TOPICS
from signalbox.shared.db import Outbox, Proposal
from signalbox.shared.db.models import as_utc, now
from signalbox.shared.events import ProposalStatus

log = logging.getLogger(__name__)

router = APIRouter()


class _FromSql(Collector):
    """The SQL-counted series, read when scraped."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        try:
            with self.sessions() as s:
                by_status = s.execute(
                    select(Proposal.status, func.count()).group_by(Proposal.status)
                ).all()
                unsent, oldest = s.execute(
                    select(func.count(), func.min(Outbox.created_at)).where(
                        Outbox.sent_at.is_(None), Outbox.topic.in_(TOPICS)
                    )
                ).one()
        except Exception as exc:
            # A scrape during an SQL outage still answers, without these series.
            log.warning("metrics: proposal counts unavailable: %r", exc)
            return
        proposals = GaugeMetricFamily(
            "signalbox_proposals",
            "Proposals in each status (SQL count at scrape time)",
            labels=["status"],
        )
        counts = dict.fromkeys(get_args(ProposalStatus), 0)  # each known status, even at 0
        counts.update({str(status): int(count) for status, count in by_status})
        for status, count in sorted(counts.items()):
            proposals.add_metric([status], count)
        yield proposals
        lag = 0.0 if oldest is None else max(0.0, (now() - as_utc(oldest)).total_seconds())
        yield GaugeMetricFamily(
            "signalbox_outbox_lag_seconds",
            "Age of the oldest outbox message not yet published (0: none waits)",
            value=lag,
        )
        yield GaugeMetricFamily(
            "signalbox_outbox_unsent", "Outbox messages not yet published", value=int(unsent)
        )


class ProposalsMetrics:
    """The metrics of one app (its own registry: tests run several apps in one process)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_FromSql(sessions))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus text format; counted in SQL at each scrape."""
    served: ProposalsMetrics = request.app.state.metrics
    return Response(served.render(), media_type=CONTENT_TYPE_LATEST)
