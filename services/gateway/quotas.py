"""Per-user quotas on stored things: conversations, workspaces, uploads and their bytes;
and, enforced by the proposals service but reported and set here, pending proposals and the
bytes of the user's workspaces (``signalbox.shared.quotas``).

A quota is checked in the transaction that inserts, after locking the user's row
(``signalbox.shared.db.concurrency.lock_row``): two creations racing for the user's last slot
serialise on it, the second counts the first, and a refused one has written nothing. The
limit is the user's own (``user_limits.quotas``, set by an admin) over the deployment's
``SIGNALBOX_QUOTA_*``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import QuotaExceeded
from signalbox.services.gateway.metrics import GatewayMetrics, user_class
from signalbox.shared.db import Conversation, Upload, User, Workspace
from signalbox.shared.db.concurrency import lock_row
from signalbox.shared.db.session import core
from signalbox.shared.db.tenancy import own_limits
from signalbox.shared.quotas import pending_proposals, workspace_bytes
from signalbox.shared.settings import GatewaySettings

QuotaName = Literal[
    "conversations",
    "workspaces",
    "uploads",
    "upload_bytes",
    "pending_proposals",
    "workspace_bytes",
]
QUOTA_NAMES: tuple[QuotaName, ...] = get_args(QuotaName)

_UNITS: dict[QuotaName, str] = {
    "conversations": "conversations (not archived)",
    "workspaces": "workspaces",
    "uploads": "uploads",
    "upload_bytes": "bytes of uploads",
    "pending_proposals": "pending proposals",
    "workspace_bytes": "bytes of workspaces",
}


# Built once, the user bound; run as Core on the session's connection (``core``).
_CONVERSATIONS = (
    select(func.count())
    .select_from(Conversation)
    .where(Conversation.user_id == bindparam("user_id"), Conversation.archived_at.is_(None))
)
_WORKSPACES = (
    select(func.count()).select_from(Workspace).where(Workspace.user_id == bindparam("user_id"))
)
_UPLOADS = select(func.count()).select_from(Upload).where(Upload.user_id == bindparam("user_id"))
_UPLOAD_BYTES = select(func.coalesce(func.sum(Upload.size), 0)).where(
    Upload.user_id == bindparam("user_id")
)
_WORKSPACE_NAMED = select(Workspace.id).where(
    Workspace.user_id == bindparam("user_id"), Workspace.name == bindparam("name")
)


def _counter(statement: Select[Any]) -> Callable[[Session, str], int]:
    def count(session: Session, user_id: str) -> int:
        return int(core(session).scalar(statement, {"user_id": user_id}) or 0)

    return count


# What a user holds, counted in SQL; ``workspace_bytes`` is counted on disk (usage_of).
HELD: dict[QuotaName, Callable[[Session, str], int]] = {
    "conversations": _counter(_CONVERSATIONS),
    "workspaces": _counter(_WORKSPACES),
    "uploads": _counter(_UPLOADS),
    "upload_bytes": _counter(_UPLOAD_BYTES),
    "pending_proposals": pending_proposals,
}


def deployment_limits(settings: GatewaySettings) -> dict[QuotaName, int]:
    """The deployment's quotas (``SIGNALBOX_QUOTA_*``)."""
    return {
        "conversations": settings.quota_conversations,
        "workspaces": settings.quota_workspaces,
        "uploads": settings.quota_uploads,
        "upload_bytes": settings.quota_upload_bytes,
        "pending_proposals": settings.quota_pending_proposals,
        "workspace_bytes": settings.quota_workspace_bytes,
    }


@dataclass(frozen=True)
class Quotas:
    """The quotas of one gateway: the deployment's limits, the metrics refusals go to."""

    settings: GatewaySettings
    metrics: GatewayMetrics

    def limits_of(self, session: Session, user_id: str) -> dict[QuotaName, int]:
        """``user_id``'s quotas: their own where an admin set one, else the deployment's."""
        limits = deployment_limits(self.settings)
        own = own_limits(session, user_id)
        for name, value in ((own.quotas or {}) if own is not None else {}).items():
            if name in limits and isinstance(value, int):
                limits[name] = value
        return limits

    def usage_of(self, session: Session, user_id: str) -> dict[QuotaName, int]:
        """What ``user_id`` holds now, per quota."""
        held = {name: count(session, user_id) for name, count in HELD.items()}
        held["workspace_bytes"] = workspace_bytes(self.settings.workspaces_root, user_id)
        return held

    def reserve(self, session: Session, user_id: str, name: QuotaName, adding: int = 1) -> None:
        """Refuse (``QuotaExceeded``) unless ``user_id`` may hold ``adding`` more of ``name``;
        the user's row stays locked until the caller's transaction (with its insert) ends."""
        lock_row(session, User, user_id)
        limit = self.limits_of(session, user_id)[name]
        held = HELD[name](session, user_id)
        if held + adding <= limit:
            return
        user = session.get(User, user_id)
        self.metrics.quota_refusals.labels(user_class(bool(user and user.is_admin)), name).inc()
        raise QuotaExceeded(
            f"quota of {limit} {_UNITS[name]} reached ({held} held, {adding} more asked); "
            "delete some or ask an admin to raise it",
            name,
        )

    def reserve_workspace(self, session: Session, user_id: str, name: str) -> None:
        """Refuse a workspace the user does not have yet once they hold their quota of them."""
        exists = core(session).scalar(_WORKSPACE_NAMED, {"user_id": user_id, "name": name})
        if exists is None:
            self.reserve(session, user_id, "workspaces")
