"""Webhooks an owner registers: checked URLs, secrets shown once, and what was delivered.

The URL must be ``http``/``https`` without credentials, and its host must resolve to public
addresses only, unless the deployment sets ``webhook_allow_private`` (checked again at
every delivery: ``webhook_deliverer.py``). Deliveries are queued where the events are
emitted (``shared/db/webhooks.py``).
"""

from __future__ import annotations

import secrets

import httpx
from sqlalchemy import delete as sql_delete
from sqlalchemy import select
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import BadInput, NotFound
from signalbox.shared.db.webhooks import WEBHOOK_EVENT_KINDS, Webhook, WebhookDelivery
from signalbox.shared.ids import new_id
from signalbox.shared.public_address import AddressRefused, resolve_checked
from signalbox.shared.timestamps import rfc3339, rfc3339_or_none
from signalbox.shared.webhooks_api import (
    DeliveryView,
    EventKindName,
    NewWebhook,
    WebhookCreated,
    WebhookDetail,
    WebhookView,
)

__all__ = [
    "DeliveryView",
    "NewWebhook",
    "WebhookCreated",
    "WebhookDetail",
    "WebhookView",
    "check_url",
    "create",
    "delete",
    "list_webhooks",
    "owned_webhook",
    "show",
]

MAX_WEBHOOKS_PER_USER = 20
RECENT_DELIVERIES = 20
assert set(EventKindName.__args__) == set(WEBHOOK_EVENT_KINDS)  # type: ignore[attr-defined]


def check_url(url: str, allow_private: bool) -> str:
    """``url`` if a webhook may be sent there, else ``BadInput`` naming why (resolves DNS)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise BadInput(f"not a usable URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise BadInput(f"a webhook URL is http or https, got {parsed.scheme!r}")
    if parsed.userinfo:
        raise BadInput("a webhook URL carries no user name or password")
    host = parsed.raw_host.decode("ascii", "replace")
    if not host:
        raise BadInput("the webhook URL has no host")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        resolve_checked(host, port, allow_private)
    except AddressRefused as exc:
        raise BadInput(f"refusing webhook URL {url!r}: {exc}") from None
    return url


def _delivery_view(row: WebhookDelivery) -> DeliveryView:
    return DeliveryView(
        id=row.id,
        kind=row.kind,
        event_key=row.event_key,
        status=row.status,
        attempts=row.attempts,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
        created_at=rfc3339(row.created_at),
        delivered_at=rfc3339_or_none(row.delivered_at),
    )


def _recent(session: Session, webhook_id: str, limit: int) -> list[DeliveryView]:
    rows = session.scalars(
        select(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == webhook_id)
        .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id)
        .limit(limit)
    )
    return [_delivery_view(r) for r in rows]


def _view(session: Session, hook: Webhook) -> WebhookView:
    recent = _recent(session, hook.id, 1)
    return WebhookView(
        id=hook.id,
        url=hook.url,
        kinds=list(hook.kinds),
        created_at=rfc3339(hook.created_at),
        last_delivery=recent[0] if recent else None,
    )


def owned_webhook(session: Session, user_id: str, webhook_id: str) -> Webhook:
    """``user_id``'s webhook ``webhook_id``, else ``NotFound`` (another user's too)."""
    hook = session.get(Webhook, webhook_id)
    if hook is None or hook.user_id != user_id:
        raise NotFound(f"webhook {webhook_id!r} not found")
    return hook


def create(session: Session, user_id: str, body: NewWebhook) -> WebhookCreated:
    """Register a webhook (its URL already checked) and show its secret once."""
    count = len(session.scalars(select(Webhook.id).where(Webhook.user_id == user_id)).all())
    if count >= MAX_WEBHOOKS_PER_USER:
        raise BadInput(f"at most {MAX_WEBHOOKS_PER_USER} webhooks per user")
    hook = Webhook(
        id=new_id("wh"),
        user_id=user_id,
        url=body.url,
        kinds=sorted(set(body.kinds)),
        secret="whsec_" + secrets.token_hex(24),
    )
    session.add(hook)
    session.flush()
    return WebhookCreated(**_view(session, hook).model_dump(), secret=hook.secret)


def list_webhooks(session: Session, user_id: str) -> list[WebhookView]:
    """``user_id``'s webhooks, oldest first."""
    hooks = session.scalars(
        select(Webhook).where(Webhook.user_id == user_id).order_by(Webhook.created_at, Webhook.id)
    )
    return [_view(session, h) for h in hooks]


def show(session: Session, user_id: str, webhook_id: str) -> WebhookDetail:
    """One of ``user_id``'s webhooks with its recent deliveries."""
    hook = owned_webhook(session, user_id, webhook_id)
    return WebhookDetail(
        **_view(session, hook).model_dump(),
        deliveries=_recent(session, hook.id, RECENT_DELIVERIES),
    )


def delete(session: Session, user_id: str, webhook_id: str) -> WebhookView:
    """Remove one of ``user_id``'s webhooks and its queued deliveries."""
    hook = owned_webhook(session, user_id, webhook_id)
    view = _view(session, hook)
    # One statement, not row by row: the deliverer may be updating a row meanwhile.
    session.execute(sql_delete(WebhookDelivery).where(WebhookDelivery.webhook_id == hook.id))
    session.delete(hook)
    return view
