"""Bodies of ``/api/webhooks``: what the gateway answers and what ``signalbox.client`` reads,
defined once (the routes are ``services/gateway/routes/webhooks.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# The event kinds a webhook may subscribe to (``shared/db/webhooks.py`` keeps the same
# tuple for the SQL side; the gateway checks they agree).
EventKindName = Literal[
    "turn_started",
    "turn_finished",
    "tool_call_needs_decision",
    "tool_call_decided",
    "tool_call_finished",
    "proposal_created",
    "proposal_resolved",
]
MAX_KINDS = len(EventKindName.__args__)  # type: ignore[attr-defined]


class NewWebhook(BaseModel):
    """Body of ``POST /api/webhooks``."""

    url: str = Field(min_length=1, max_length=2048)
    kinds: list[EventKindName] = Field(min_length=1, max_length=MAX_KINDS)


class DeliveryView(BaseModel):
    """One delivery of a webhook: its event and how its last attempt went."""

    id: str
    kind: str
    event_key: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: str
    delivered_at: str | None


class WebhookView(BaseModel):
    """A registered webhook (never its secret), with its latest delivery."""

    id: str
    url: str
    kinds: list[str]
    created_at: str
    last_delivery: DeliveryView | None = None


class WebhookDetail(WebhookView):
    """A webhook with its most recent deliveries, newest first."""

    deliveries: list[DeliveryView] = []


class WebhookCreated(WebhookView):
    """The answer to ``POST /api/webhooks``: the signing secret, shown this once."""

    secret: str
