"""The SDK's small exception family: each error carries the gateway's words and code."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class SignalboxError(RuntimeError):
    """A request the gateway refused or could not do; ``code`` is the protocol's error code."""

    def __init__(
        self, message: str, code: str | None = None, body: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.body: dict[str, Any] = dict(body or {})


class Unreachable(SignalboxError):
    """No gateway answered at that URL."""


class Unauthorized(SignalboxError):
    """The token (or ticket) was refused: 401, or a WebSocket handshake answered 403."""


class NotFound(SignalboxError):
    """No such object of this user (another user's object reads the same)."""


class Conflict(SignalboxError):
    """The object's state forbids it (decided already, expired, a file changed, busy)."""


class BadRequest(SignalboxError):
    """The request was malformed or over a limit (422, or ``bad_frame``)."""


class ReplayGap(SignalboxError):
    """The resume point is older than the stream keeps: reload the conversation."""


class ConnectionLost(SignalboxError):
    """The WebSocket dropped before a request got its reply; resending is safe (idempotent)."""


_BY_CODE: dict[str, type[SignalboxError]] = {
    "not_found": NotFound,
    "conflict": Conflict,
    "turn_busy": Conflict,
    "bad_frame": BadRequest,
    "unknown_type": BadRequest,
    "replay_gap": ReplayGap,
}
_BY_STATUS: dict[int, type[SignalboxError]] = {
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    410: ReplayGap,
    413: BadRequest,
    422: BadRequest,
}


def from_code(code: str, message: str) -> SignalboxError:
    """The error of a WebSocket ``error`` frame."""
    return _BY_CODE.get(code, SignalboxError)(message, code)


def from_status(status: int, message: str, body: dict[str, Any]) -> SignalboxError:
    """The error of an HTTP answer ``status``."""
    code = body.get("code") if isinstance(body.get("code"), str) else None
    return _BY_STATUS.get(status, SignalboxError)(message, code, body)


def frame(model: type[M], **fields: Any) -> M:
    """A frame (or body) of ``shared/protocol.py`` checked here, before it is sent: a value
    over its limit is ``BadRequest`` naming the field, as the gateway would answer."""
    try:
        return model(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or model.__name__
        raise BadRequest(f"{fields.get('type', model.__name__)}: {where}: {first['msg']}") from None
