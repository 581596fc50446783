"""Deciding a proposal: approve (apply), reject, expire. Exactly one decision ever wins.

Every decision starts with ``UPDATE proposals ... WHERE status = 'pending'``; the one
whose UPDATE changes the row wins, and holds the row's write lock until it commits, so a
concurrent decider waits and then finds the winner's status. An approval applies the files
while it holds that lock and commits the outcome with its outbox row; if the commit fails
the files are restored. A loser answers with the winner's outcome.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from services.proposals import outbox
from services.proposals.apply import (
    FileChange,
    PathRefused,
    StaleFiles,
    apply_changes,
    read_bytes,
    resolve,
    sha256_bytes,
)
from services.proposals.context import ServiceContext
from services.proposals.diffs import unified_diff
from services.proposals.errors import Conflict, NotFound
from services.proposals.proposals import as_utc, load, pending_of
from shared.db import Outbox, Proposal
from shared.db.models import now
from shared.events import FileOperation

APPLYING = "applying"  # never committed: only seen inside the winning approval's transaction


def _claim(
    session: Session,
    proposal_id: str,
    status: str,
    decided_by: str | None,
    reason: str | None,
) -> bool:
    """Move a pending proposal to ``status``; True if this call won the decision."""
    result = session.execute(
        update(Proposal)
        .where(Proposal.id == proposal_id, Proposal.status == "pending")
        .values(
            status=status,
            version=Proposal.version + 1,
            decided_at=now(),
            decided_by=decided_by,
            reason=reason,
        )
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def _record(session: Session, proposal_id: str) -> None:
    """Queue the ``proposal_resolved`` announcement in the decision's transaction."""
    session.flush()
    proposal = load(session, proposal_id)
    assert proposal is not None
    session.add(Outbox(topic=outbox.PROPOSAL_RESOLVED, payload=outbox.resolved_payload(proposal)))


def _reload(ctx: ServiceContext, proposal_id: str) -> Proposal:
    with ctx.sessions() as session:
        proposal = load(session, proposal_id)
    if proposal is None:
        raise NotFound(f"no proposal {proposal_id!r}")
    return proposal


def is_stale(proposal: Proposal, ttl_s: float, at: datetime | None = None) -> bool:
    """True for a pending proposal older than the time-to-live."""
    moment = at or datetime.now(UTC)
    return proposal.status == "pending" and as_utc(proposal.created_at) < moment - timedelta(
        seconds=ttl_s
    )


def _decide(
    ctx: ServiceContext, proposal_id: str, status: str, by: str | None, reason: str | None
) -> bool:
    with ctx.sessions() as session:
        won = _claim(session, proposal_id, status, by, reason)
        if won:
            _record(session, proposal_id)
        session.commit()
    if won:
        outbox.relay(ctx)
    return won


def expire_if_stale(ctx: ServiceContext, proposal: Proposal) -> Proposal:
    """The proposal, expired first if it waited longer than ``proposal_ttl_s``."""
    if not is_stale(proposal, ctx.settings.proposal_ttl_s):
        return proposal
    _decide(ctx, proposal.id, "expired", None, "not decided in time")
    return _reload(ctx, proposal.id)


def pending(ctx: ServiceContext, user_id: str) -> list[Proposal]:
    """``user_id``'s pending proposals, expiring those past their time-to-live."""
    return [p for p in pending_of(ctx, user_id) if expire_if_stale(ctx, p).status == "pending"]


def current_files(ctx: ServiceContext, proposal: Proposal) -> list[dict[str, Any]]:
    """Each file as it is on disk now, with the diff approving it would apply."""
    workspace = ctx.workspace(proposal.user_id, proposal.workspace)
    files: list[dict[str, Any]] = []
    for f in proposal.files:
        entry: dict[str, Any] = {"path": f.path, "operation": f.operation}
        try:
            data = read_bytes(resolve(workspace, f.path))
        except PathRefused as exc:
            entry.update(refused=str(exc), current_sha256=None, diff="")
        else:
            text = None if data is None else data.decode("utf-8", errors="replace")
            entry.update(
                current_sha256=None if data is None else sha256_bytes(data),
                changed=(None if data is None else sha256_bytes(data)) != f.before_sha256,
                diff=unified_diff(f.path, text, f.after),
            )
        files.append(entry)
    return files


def _refusal(ctx: ServiceContext, proposal: Proposal, why: str | None = None) -> Conflict:
    extra: dict[str, Any] = {"proposal_id": proposal.id, "status": proposal.status}
    if proposal.status == "conflict":
        extra["files"] = current_files(ctx, proposal)
    return Conflict(why or f"proposal {proposal.id!r} is {proposal.status}", **extra)


def _changes(proposal: Proposal) -> list[FileChange]:
    ops: dict[str, FileOperation] = {"create": "create", "update": "update", "delete": "delete"}
    return [FileChange(f.path, ops[f.operation], f.after, f.before_sha256) for f in proposal.files]


def approve(ctx: ServiceContext, proposal: Proposal, user_id: str) -> Proposal:
    """Apply the proposal; ``Conflict`` (nothing written) if it is stale or already decided."""
    proposal = expire_if_stale(ctx, proposal)
    if proposal.status == "applied":
        return proposal  # approving twice is harmless: nothing is written again
    if proposal.status != "pending":
        raise _refusal(ctx, proposal)
    workspace = ctx.workspace(proposal.user_id, proposal.workspace)
    why: str | None = None
    with ctx.sessions() as session:
        won = _claim(session, proposal.id, APPLYING, user_id, None)
        if won:
            try:
                applied = apply_changes(workspace, _changes(proposal))
                outcome = "applied"
            except (StaleFiles, PathRefused) as exc:
                applied, outcome, why = None, "conflict", str(exc)
            session.execute(
                update(Proposal)
                .where(Proposal.id == proposal.id, Proposal.status == APPLYING)
                .values(status=outcome, reason=why)
            )
            _record(session, proposal.id)
            try:
                session.commit()
            except BaseException:
                if applied is not None:
                    applied.undo()  # SQL says pending: the workspace must say so too
                raise
        else:
            session.rollback()
    if won:
        outbox.relay(ctx)
    decided = _reload(ctx, proposal.id)
    if decided.status == "applied":
        return decided
    raise _refusal(ctx, decided, why)


def reject(ctx: ServiceContext, proposal: Proposal, user_id: str, reason: str | None) -> Proposal:
    """Reject the proposal; ``Conflict`` if another decision came first (twice is fine)."""
    proposal = expire_if_stale(ctx, proposal)
    if proposal.status == "pending":
        _decide(ctx, proposal.id, "rejected", user_id, reason)
        proposal = _reload(ctx, proposal.id)
    if proposal.status == "rejected":
        return proposal
    raise _refusal(ctx, proposal)


def reject_all(ctx: ServiceContext, user_id: str, reason: str | None) -> list[str]:
    """Reject every pending proposal of ``user_id``; the ids this call rejected."""
    rejected: list[str] = []
    for proposal in pending(ctx, user_id):
        if _decide(ctx, proposal.id, "rejected", user_id, reason):
            rejected.append(proposal.id)
    return rejected
