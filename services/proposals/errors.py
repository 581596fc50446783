"""The service's small error family; each maps to one HTTP status in ``app.py``."""

from __future__ import annotations

from typing import Any


class ProposalError(Exception):
    """Base of every error a route turns into an HTTP answer."""

    status_code = 500

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer: ``detail`` plus any extra fields."""
        return {"detail": self.detail, **self.extra}


class NotFound(ProposalError):
    """No such proposal for this user (another user's proposal is not found, never forbidden)."""

    status_code = 404


class BadProposal(ProposalError):
    """A create request that can never succeed: bad path, unknown conversation, bad files."""

    status_code = 422


class Conflict(ProposalError):
    """The workspace or the proposal's status does not allow what was asked."""

    status_code = 409


class QuotaExceeded(ProposalError):
    """The user holds as many pending proposals (or workspace bytes) as allowed."""

    status_code = 403

    def __init__(self, detail: str, quota: str) -> None:
        super().__init__(detail, code="quota_exceeded", quota=quota)
