"""The gateway's small exception family: each error knows its protocol code and HTTP status.

Logic modules raise these; HTTP routes turn them into ``{"detail", "code"}`` responses and
the WebSocket session into ``error`` frames, so a rule is written once for both.
"""

from __future__ import annotations

from typing import ClassVar

from shared.protocol import ErrorCode


class GatewayError(Exception):
    """A request that cannot be done; ``code`` is the protocol's error code."""

    code: ClassVar[ErrorCode] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
    """The user sent more than the per-minute limit."""

    code = "rate_limited"
    http_status = 429


class ReplayGapError(GatewayError):
    """The requested event id is older than what the stream still keeps."""

    code = "replay_gap"
    http_status = 410
