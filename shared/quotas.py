"""What a user holds of the quotas two services enforce, and the user's own limits.

The gateway enforces the quotas of what it stores (``services/gateway/quotas.py``); the
proposals service those of what it stores and writes (``services/proposals/quotas.py``):
pending proposals, and the bytes of the user's workspaces. Both read a user's own limit
here (``user_limits.quotas``, set by an admin), over the deployment's ``SIGNALBOX_QUOTA_*``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from signalbox.shared.db import Proposal
from signalbox.shared.db.tenancy import own_limits


def own_quota(session: Session, user_id: str, name: str) -> int | None:
    """The limit an admin set for ``user_id``'s quota ``name``; None: the deployment's."""
    limits = own_limits(session, user_id)
    value = (limits.quotas or {}).get(name) if limits is not None else None
    return value if isinstance(value, int) else None


def pending_proposals(session: Session, user_id: str) -> int:
    """``user_id``'s proposals waiting for a decision."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(Proposal)
            .where(Proposal.user_id == user_id, Proposal.status == "pending")
        )
        or 0
    )


def workspace_bytes(root: Path, user_id: str) -> int:
    """Bytes of the regular files in all of ``user_id``'s workspaces (links not followed)."""
    total = 0
    top = root / user_id
    for folder, _dirs, files in os.walk(top):
        for name in files:
            try:
                found = os.lstat(os.path.join(folder, name))
            except OSError:
                continue  # removed while walking
            if stat.S_ISREG(found.st_mode):
                total += found.st_size
    return total
