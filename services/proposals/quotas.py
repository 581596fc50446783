"""The proposals service's quotas: pending proposals per user, and the bytes of a user's
workspaces once a proposal's files would be written.

Checked when a proposal is created, in its transaction and after locking the user's row,
so two proposals racing for the last slot serialise and the refused one stores nothing.
The bytes are those on disk now plus what this proposal adds (its files' new sizes minus
their current ones); a proposal that shrinks the workspace is never refused for bytes.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from signalbox.services.proposals.errors import QuotaExceeded
from signalbox.shared.db import User
from signalbox.shared.db.concurrency import lock_row
from signalbox.shared.quotas import own_quota, pending_proposals, workspace_bytes
from signalbox.shared.settings import ProposalsSettings


def reserve(session: Session, settings: ProposalsSettings, user_id: str, adding_bytes: int) -> None:
    """Refuse (``QuotaExceeded``) a new proposal of ``user_id`` past either quota."""
    lock_row(session, User, user_id)
    limit = own_quota(session, user_id, "pending_proposals")
    limit = settings.quota_pending_proposals if limit is None else limit
    held = pending_proposals(session, user_id)
    if held + 1 > limit:
        raise QuotaExceeded(
            f"quota of {limit} pending proposals reached; decide some before proposing more",
            "pending_proposals",
        )
    if adding_bytes <= 0:
        return
    limit = own_quota(session, user_id, "workspace_bytes")
    limit = settings.quota_workspace_bytes if limit is None else limit
    held = workspace_bytes(settings.workspaces_root, user_id)
    if held + adding_bytes > limit:
        raise QuotaExceeded(
            f"quota of {limit} bytes of workspaces reached ({held} held, this change adds "
            f"{adding_bytes}); delete files or ask an admin to raise it",
            "workspace_bytes",
        )
