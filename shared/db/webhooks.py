"""Webhooks in SQL: the URLs an owner registered, and the outbox of their deliveries.

A delivery row is written where the event is emitted, right before it goes on the
conversation's stream (``enqueue``), so every event a webhook subscribes to has its
delivery committed by the time anyone can see the event; the gateway's deliverer
(``services/gateway/webhook_deliverer.py``) sends the rows with retries. The unique key
``(webhook_id, event_key)`` makes a second enqueue of the same event (a resumed runner
emitting it again) a no-op, so a receiver sees one delivery per event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from signalbox.shared.db.models import Base, now
from signalbox.shared.ids import new_id

# The event kinds an owner may subscribe a webhook to: what someone outside waits for, not
# the deltas of a live answer (one delivery per token would be a flood).
WEBHOOK_EVENT_KINDS: tuple[str, ...] = (
    "turn_started",
    "turn_finished",
    "tool_call_needs_decision",
    "tool_call_decided",
    "tool_call_finished",
    "proposal_created",
    "proposal_resolved",
)


class Webhook(Base):
    """A URL an owner registered for some event kinds, with the secret its bodies are
    signed with (shown to the owner once, at creation)."""

    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    kinds: Mapped[list[Any]] = mapped_column()
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=now)


class WebhookDelivery(Base):
    """One event to deliver to one webhook: ``pending`` → ``delivered`` | ``failed``."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (UniqueConstraint("webhook_id", "event_key"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), index=True
    )
    # Names the event for deduplication: its kind and what it is about (a turn, a call, a
    # proposal), stable across a runner that emits it again after a crash.
    event_key: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(40))
    body: Mapped[str] = mapped_column(Text)  # the exact JSON that is signed and sent
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=now, index=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=now)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)


def event_key(kind: str, data: Mapping[str, Any], turn_id: str | None) -> str:
    """What makes an event the same event when emitted twice: its kind and its subject."""
    subject = data.get("call_id") or data.get("proposal_id") or turn_id or ""
    if kind == "proposal_resolved":
        subject = f"{subject}:{data.get('status', '')}"
    return f"{kind}:{subject}"


def enqueue(
    session: Session,
    user_id: str,
    conversation_id: str,
    kind: str,
    data: Mapping[str, Any],
    turn_id: str | None = None,
) -> int:
    """Queue ``kind`` for every webhook of ``user_id`` subscribed to it (in the caller's
    transaction); how many deliveries were queued (an event queued before: none)."""
    if kind not in WEBHOOK_EVENT_KINDS:
        return 0
    hooks = session.scalars(select(Webhook).where(Webhook.user_id == user_id)).all()
    key = event_key(kind, data, turn_id)
    queued = 0
    for hook in hooks:
        if kind not in hook.kinds:
            continue
        delivery_id = new_id("whd")
        body = {
            "delivery_id": delivery_id,
            "event_key": key,
            "webhook_id": hook.id,
            "kind": kind,
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "data": dict(data),
        }
        row = WebhookDelivery(
            id=delivery_id,
            webhook_id=hook.id,
            event_key=key,
            kind=kind,
            body=json.dumps(body, separators=(",", ":"), default=str),
        )
        try:
            with session.begin_nested():  # a duplicate leaves the rest of the transaction
                session.add(row)
        except IntegrityError:
            continue
        queued += 1
    return queued
