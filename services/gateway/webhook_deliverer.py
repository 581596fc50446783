"""The webhook deliverer: sends the queued deliveries (``shared/db/webhooks.py``), signed,
with retries and an exponential backoff, from SQL.

Runs as a daemon thread in every gateway process. A due row is claimed by a conditional
``UPDATE`` that pushes its ``next_attempt_at`` past the send's time limit, so two gateways
never send the same row at once, and a gateway that dies mid-send leaves a row another
one sends again once the claim runs out (at least once: a receiver deduplicates on the
``X-Signalbox-Delivery`` header, one id per event and webhook).

Each attempt resolves the URL's host again and refuses a private, loopback or link-local
answer (DNS rebinding) unless ``webhook_allow_private``; it connects to the address it
checked, keeping the name in ``Host`` and TLS SNI, with no proxy and no redirects.

The signature: ``X-Signalbox-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
"<t>.<body>" under the webhook's secret>``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db.models import now
from signalbox.shared.db.webhooks import Webhook, WebhookDelivery
from signalbox.shared.public_address import AddressRefused, resolve_checked
from signalbox.shared.settings import GatewaySettings

log = logging.getLogger(__name__)

BATCH = 50  # deliveries looked at per pass
MAX_BACKOFF_S = 3600.0  # a receiver down for long is tried at least hourly
CLAIM_MARGIN_S = 5.0  # beyond the send's own time limit before another gateway may retry
ERROR_MAX_CHARS = 500
SIGNATURE_HEADER = "X-Signalbox-Signature"


def signature(secret: str, body: str, timestamp: int) -> str:
    """The ``X-Signalbox-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


@dataclass(frozen=True)
class Attempt:
    """What one send came to: delivered, or why not (and the HTTP status if there was one)."""

    delivered: bool
    status_code: int | None = None
    error: str | None = None


def send(url: str, body: str, headers: dict[str, str], settings: GatewaySettings) -> Attempt:
    """POST ``body`` to ``url`` at the address checked now; a 2xx is delivered."""
    try:
        target = httpx.URL(url)
        host = target.raw_host.decode("ascii")
        port = target.port or (443 if target.scheme == "https" else 80)
        address = resolve_checked(host, port, settings.webhook_allow_private)
    except (AddressRefused, httpx.InvalidURL, UnicodeError) as exc:
        return Attempt(False, None, f"refused: {exc}")
    pinned = target.copy_with(host=str(address))
    extensions = {"sni_hostname": host} if target.scheme == "https" else {}
    host_header = host if target.port is None else f"{host}:{target.port}"
    try:
        with httpx.Client(
            trust_env=False, follow_redirects=False, timeout=settings.webhook_timeout_s
        ) as client:
            response = client.post(
                pinned,
                content=body.encode(),
                headers={**headers, "Host": host_header, "Content-Type": "application/json"},
                extensions=extensions,
            )
    except httpx.HTTPError as exc:
        return Attempt(False, None, f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS])
    if 200 <= response.status_code < 300:
        return Attempt(True, response.status_code)
    return Attempt(False, response.status_code, f"the receiver answered {response.status_code}")


def backoff_s(attempts: int, settings: GatewaySettings) -> float:
    """How long after its ``attempts``-th failed try a delivery is tried again."""
    return float(min(settings.webhook_backoff_s * 2 ** max(attempts - 1, 0), MAX_BACKOFF_S))


def _claim(sessions: sessionmaker[Session], delivery_id: str, lease_s: float) -> bool:
    """Take a due delivery for this process alone, for ``lease_s``."""
    at = now()
    with sessions() as s, s.begin():
        claimed = s.execute(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= at,
            )
            .values(next_attempt_at=at + timedelta(seconds=lease_s))
        )
        return bool(getattr(claimed, "rowcount", 0) == 1)


def _record(
    sessions: sessionmaker[Session], delivery_id: str, attempt: Attempt, settings: GatewaySettings
) -> None:
    with sessions() as s, s.begin():
        row = s.get(WebhookDelivery, delivery_id, with_for_update=True)
        if row is None or row.status != "pending":
            return
        row.attempts += 1
        row.last_status_code = attempt.status_code
        row.last_error = attempt.error
        if attempt.delivered:
            row.status = "delivered"
            row.delivered_at = now()
        elif row.attempts >= settings.webhook_max_attempts:
            row.status = "failed"
        else:
            row.next_attempt_at = now() + timedelta(seconds=backoff_s(row.attempts, settings))


def deliver_due(sessions: sessionmaker[Session], settings: GatewaySettings) -> int:
    """Send every delivery that is due now (each claimed first); how many were tried."""
    with sessions() as s:
        due = s.execute(
            select(WebhookDelivery.id, Webhook.url, Webhook.secret, WebhookDelivery.body)
            .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
            .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now())
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(BATCH)
        ).all()
    tried = 0
    lease_s = settings.webhook_timeout_s + CLAIM_MARGIN_S
    for delivery_id, url, secret, body in due:
        if not _claim(sessions, delivery_id, lease_s):
            continue  # another gateway has it
        headers = {
            SIGNATURE_HEADER: signature(secret, body, int(time.time())),
            "X-Signalbox-Delivery": delivery_id,
            "User-Agent": "Signalbox-webhooks/1",
        }
        attempt = send(url, body, headers, settings)
        _record(sessions, delivery_id, attempt, settings)
        tried += 1
    return tried


class WebhookDeliverer:
    """The thread that runs ``deliver_due`` every ``webhook_poll_s`` until stopped."""

    def __init__(self, sessions: sessionmaker[Session], settings: GatewaySettings) -> None:
        self.sessions = sessions
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhook-deliverer", daemon=True)

    def start(self) -> None:
        """Start delivering."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current pass."""
        self._stop.set()
        self._thread.join(timeout=self.settings.webhook_timeout_s + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = deliver_due(self.sessions, self.settings) > 0
            except Exception:  # SQL down, say: the rows wait; the next pass tries again
                log.exception("webhook delivery pass failed")
                busy = False
            if not busy:
                self._stop.wait(self.settings.webhook_poll_s)
