"""The gateway's small exception family: each error knows its protocol code and HTTP status.

Logic modules raise these; HTTP routes turn them into ``{"detail", "code"}`` responses and
the WebSocket session into ``error`` frames, so a rule is written once for both.
"""

from __future__ import annotations

from typing import ClassVar

from signalbox.shared.protocol import ErrorCode


class GatewayError(Exception):
    """A request that cannot be done; ``code`` is the protocol's error code."""

    code: ClassVar[ErrorCode] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> dict[str, str] | None:
        """Headers of the HTTP answer (none but for a few codes)."""
        return None


class NotFound(GatewayError):
    """Absent, or owned by someone else (never told apart: another user's object is 404)."""

    code = "not_found"
    http_status = 404


class BadInput(GatewayError):
    """A field the request carries is not usable."""

    code = "bad_frame"
    http_status = 422


class Conflict(GatewayError):
    """The object is not in a state that allows the request."""

    code = "conflict"
    http_status = 409


class TurnBusy(GatewayError):
    """The conversation already has an unfinished turn and the busy policy is ``reject``."""

    code = "turn_busy"
    http_status = 409


class Unavailable(GatewayError):
    """A service the gateway depends on did not answer, or the feature is not there yet."""

    code = "unavailable"
    http_status = 503


class RateLimited(GatewayError):
    """The user sent more than the limit of a class of actions; ``retry_after_s``: when the
    next one would be allowed (HTTP answers it as ``Retry-After``)."""

    code = "rate_limited"
    http_status = 429

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str] | None:
        """``Retry-After``: whole seconds until the window lets the next one through."""
        return {"Retry-After": str(self.retry_after_s)}


class BudgetExceeded(GatewayError):
    """The user's token budget for the period is used up: a turn may not start."""

    code = "budget_exceeded"
    http_status = 402


class QuotaExceeded(GatewayError):
    """The user already holds as many of a stored thing (or bytes) as allowed."""

    code = "quota_exceeded"
    http_status = 403

    def __init__(self, message: str, quota: str) -> None:
        super().__init__(message)
        self.quota = quota


class Forbidden(GatewayError):
    """An admin-only request from a user who is not an admin."""

    code = "forbidden"
    http_status = 403


class ReplayGapError(GatewayError):
    """The requested event id is older than what the stream still keeps."""

    code = "replay_gap"
    http_status = 410
