"""Settling the apply journals a killed process left behind (``journal.py``).

A journal is settled only by whoever holds its proposal's row lock, so it never races the
apply still writing it: that apply holds the lock from its winning claim to its commit.
Settling asks SQL whether the apply committed, i.e. whether the row it decided (the
proposal, or the child a partial approval split off) is ``applied``:

- yes: the files are as they should be; the journal is just dropped;
- no: every file is rolled back to its old content, its temp files removed, the journal
  dropped. The proposal stays pending, so a later approval applies everything and a
  rejection leaves everything old.

It runs at start-up, on every sweep, and inside every decision right after its claim.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from signalbox.services.proposals import apply, journal
from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Proposal

log = logging.getLogger(__name__)

_reported: set[str] = set()  # journals of proposals SQL does not know (another database?)


def _settle(ctx: ServiceContext, session: Session, directory: Path) -> None:
    record = journal.read(directory)
    if record is None:
        journal.remove(directory)  # it stopped before its first write: nothing to undo
        return
    status = session.scalars(
        select(Proposal.status).where(Proposal.id == record.decided_id)
    ).one_or_none()
    if status == "applied":
        record.discard()
        return
    restored = apply.roll_back(record, ctx.settings.workspaces_root)
    record.discard()
    log.warning(
        "proposal %s: an apply that never committed was rolled back (%d file(s) restored)",
        record.proposal_id,
        len(restored),
    )


def settle_locked(ctx: ServiceContext, session: Session, proposal_id: str) -> int:
    """Settle ``proposal_id``'s journals; ``session`` must hold that proposal's row lock."""
    found = journal.find(ctx.journal_root, proposal_id)
    for directory in found:
        _settle(ctx, session, directory)
    return len(found)


def recover(ctx: ServiceContext) -> int:
    """Settle every journal there is (start-up, sweep); how many were settled."""
    settled = 0
    for proposal_id in sorted({journal.proposal_of(d) for d in journal.find(ctx.journal_root)}):
        try:
            with ctx.sessions() as session:
                # A write that changes nothing, for its lock: it waits for an apply in flight.
                locked = session.execute(
                    update(Proposal)
                    .where(Proposal.id == proposal_id)
                    .values(version=Proposal.version)
                )
                if locked.rowcount != 1:  # type: ignore[attr-defined]
                    if proposal_id not in _reported:  # once, not on every sweep
                        _reported.add(proposal_id)
                        log.warning("journal of unknown proposal %r left alone", proposal_id)
                    continue
                settled += settle_locked(ctx, session, proposal_id)
                session.rollback()  # only the lock was wanted
        except Exception:
            log.exception("settling the journal of proposal %s failed; retried later", proposal_id)
    return settled
