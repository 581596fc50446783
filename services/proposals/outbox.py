"""The outbox relay: announce what SQL already committed, on Redis, at least once.

A decision (or a new proposal) is committed together with an ``Outbox`` row. The relay
then claims each unsent row with a conditional UPDATE and, inside that same transaction,
publishes it; the commit marks it sent. A failed publish rolls the claim back, so the row
is tried again by the next relay (after the next decision, or at start-up). Because the
claim holds the row's write lock until commit, two relays never publish the same row.
The owner's webhook deliveries of the event are queued in that transaction too.

Traced: each payload keeps the trace context it was committed in (``TRACE_KEY``, only
when tracing is on), so its ``outbox.publish`` span joins the trace of the request that
made it, even when the sweeper relays it later; the key is never published.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import redis
from opentelemetry.trace import SpanKind
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Outbox, Proposal
from signalbox.shared.db.models import now
from signalbox.shared.db.webhooks import enqueue
from signalbox.shared.events import EventKind
from signalbox.shared.tracing import extract, inject, link_to_current, tracer

log = logging.getLogger(__name__)

PROPOSAL_CREATED: Final = "proposal_created"
PROPOSAL_RESOLVED: Final = "proposal_resolved"
TOPICS = (PROPOSAL_CREATED, PROPOSAL_RESOLVED)  # other services may keep their own topics here
BATCH = 100
TRACE_KEY = "trace"  # the W3C trace context of a payload's commit, stripped before publishing


def _traced(payload: dict[str, Any]) -> dict[str, Any]:
    carrier = inject()
    if carrier:
        payload[TRACE_KEY] = carrier
    return payload


def created_payload(proposal: Proposal) -> dict[str, Any]:
    """What ``proposal_created`` announces (with the trace context, when tracing)."""
    return _traced(
        {
            "proposal_id": proposal.id,
            "conversation_id": proposal.conversation_id,
            "user_id": proposal.user_id,
            "turn_id": proposal.turn_id,
            "summary": proposal.summary,
            "files": [{"path": f.path, "operation": f.operation} for f in proposal.files],
            "parent_id": proposal.parent_id,
            "reverts": proposal.reverts,
        }
    )


def resolved_payload(proposal: Proposal) -> dict[str, Any]:
    """What ``proposal_resolved`` announces (the approvals channel contract, plus turn_id;
    with the trace context, when tracing)."""
    return _traced(
        {
            "proposal_id": proposal.id,
            "conversation_id": proposal.conversation_id,
            "user_id": proposal.user_id,
            "status": proposal.status,
            "version": proposal.version,
            "turn_id": proposal.turn_id,
        }
    )


def event_data(topic: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The data of the conversation event an outbox message becomes (and its webhooks get)."""
    if topic == PROPOSAL_CREATED:
        data = {k: payload[k] for k in ("proposal_id", "summary", "files")}
        data["parent_id"] = payload.get("parent_id")  # rows written before it existed lack it
        data["reverts"] = payload.get("reverts")  # null except on a revert
        return data
    if topic == PROPOSAL_RESOLVED:
        return {"proposal_id": payload["proposal_id"], "status": payload["status"]}
    raise ValueError(f"expected an outbox topic of {TOPICS}, got {topic!r}")


def publish(ctx: ServiceContext, topic: str, payload: dict[str, Any]) -> None:
    """Send one outbox message where its readers look for it."""
    data = event_data(topic, payload)
    kind: EventKind = PROPOSAL_CREATED if topic == PROPOSAL_CREATED else PROPOSAL_RESOLVED
    if kind == PROPOSAL_RESOLVED:
        ctx.redis.publish(ctx.keys.approvals_channel, json.dumps(payload, separators=(",", ":")))
    ctx.events.append(payload["conversation_id"], kind, data, turn_id=payload.get("turn_id"))


def queue_webhooks(session: Session, topic: str, payload: dict[str, Any]) -> int:
    """Queue the owner's webhook deliveries of an outbox message in the caller's transaction
    (the one that marks the row sent); how many. Idempotent: a row relayed again after a
    failed commit queues nothing twice (``shared/db/webhooks.py``'s unique key)."""
    return enqueue(
        session,
        payload["user_id"],
        payload["conversation_id"],
        topic,
        event_data(topic, payload),
        payload.get("turn_id"),
    )


def relay(ctx: ServiceContext) -> int:
    """Publish every unsent row of this service's topics, oldest first; returns how many."""
    sent = 0
    while True:
        with ctx.sessions() as session:
            ids = list(
                session.scalars(
                    select(Outbox.id)
                    .where(Outbox.sent_at.is_(None), Outbox.topic.in_(TOPICS))
                    .order_by(Outbox.id)
                    .limit(BATCH)
                )
            )
        if not ids:
            return sent
        for row_id in ids:
            try:
                if _send_one(ctx, row_id):
                    sent += 1
            except redis.RedisError as exc:
                # Kept unsent; the next relay retries. The decision itself is already durable.
                log.warning("outbox relay stopped at row %s: %s", row_id, exc)
                return sent
            except Exception:
                log.exception("outbox relay stopped at row %s", row_id)
                return sent
        if len(ids) < BATCH:
            return sent


def _send_one(ctx: ServiceContext, row_id: int) -> bool:
    with ctx.sessions() as session:
        claimed = session.execute(
            update(Outbox)
            .where(Outbox.id == row_id, Outbox.sent_at.is_(None))
            .values(sent_at=now())
        )
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            session.rollback()
            return False  # another relay sent it
        row = session.get(Outbox, row_id)
        assert row is not None
        payload = dict(row.payload)
        committed_in = extract(payload.pop(TRACE_KEY, None))
        attributes = {
            "messaging.system": "redis",
            "messaging.operation.type": "send",
            "signalbox.outbox.topic": row.topic,
            "signalbox.proposal.id": str(payload.get("proposal_id")),
        }
        with tracer.start_as_current_span(
            "outbox.publish",
            context=committed_in,  # None: under the current span
            links=link_to_current() if committed_in is not None else (),
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        ):
            # Queued before the event is published, committed with the claim: an event anyone
            # saw has its deliveries queued, and a failed publish rolls both back.
            queue_webhooks(session, row.topic, payload)
            publish(ctx, row.topic, payload)
            session.commit()
        return True
