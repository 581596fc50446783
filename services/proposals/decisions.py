"""Deciding a proposal: approve (apply), reject, expire. Exactly one decision ever wins.

Every decision starts with ``UPDATE proposals ... WHERE status = 'pending'``; the one
whose UPDATE changes the row wins, and holds the row's write lock until it commits, so a
concurrent decider waits and then finds the winner's status. An approval applies the files
while it holds that lock (journalled first, ``journal.py``) and commits the outcome with its
outbox row; if the commit fails the files are restored. A loser answers with the winner's
outcome. Every winner first settles any journal a killed apply of this proposal left
(``recovery.py``), so it decides on the workspace as it was before that approval.

Approving only some files (``files`` on approve) splits the proposal, under that same lock:
the chosen files move to a new child proposal (``parent_id`` = the original) that is born
decided (``applied``, or ``conflict`` with nothing written) and announced like any other
(``proposal_created`` then ``proposal_resolved``); the original keeps the other files and
goes back to ``pending`` with its version bumped. So every decision is still one winning
conditional UPDATE on one row, and a child, never pending, cannot be decided twice.

Traced: ``proposal.decide`` (approve, reject) with the outcome, and the approval's
``proposal.apply`` under it; the ``outbox.publish`` of the announcement follows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from signalbox.services.proposals import faults, git_info, outbox, recovery
from signalbox.services.proposals.apply import (
    FileChange,
    JournalSpec,
    PathRefused,
    StaleFiles,
    apply_changes,
    read_current,
    sha256_bytes,
)
from signalbox.services.proposals.context import ServiceContext
from signalbox.services.proposals.diffs import unified_diff
from signalbox.services.proposals.errors import BadProposal, Conflict, NotFound
from signalbox.services.proposals.proposals import load, pending_of
from signalbox.shared.db import Outbox, Proposal, ProposalFile
from signalbox.shared.db.models import as_utc, now
from signalbox.shared.events import FileOperation
from signalbox.shared.ids import new_id
from signalbox.shared.tracing import tracer

log = logging.getLogger(__name__)

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
            # An apply killed half-way is undone before the decision, so a rejection or
            # expiry leaves every file old, not the mix the crash left.
            recovery.settle_locked(ctx, session, proposal_id)
            _record(session, proposal_id)
        session.commit()
    if won:
        faults.crash_point(faults.CRASH_AFTER_COMMIT)
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
            data = read_current(workspace, f.path)
        except PathRefused as exc:
            entry.update(refused=str(exc), current_sha256=None, diff="")
        else:
            text = None if data is None else data.decode("utf-8", errors="replace")
            current_sha = None if data is None else sha256_bytes(data)
            entry.update(
                current_sha256=current_sha,
                changed=current_sha != f.before_sha256,
                diff=unified_diff(f.path, text, f.after),
            )
        files.append(entry)
    return files


def _refusal(ctx: ServiceContext, proposal: Proposal, why: str | None = None) -> Conflict:
    extra: dict[str, Any] = {"proposal_id": proposal.id, "status": proposal.status}
    if proposal.status == "conflict":
        extra["files"] = current_files(ctx, proposal)
    return Conflict(why or f"proposal {proposal.id!r} is {proposal.status}", **extra)


def _changes(files: Sequence[ProposalFile]) -> list[FileChange]:
    ops: dict[str, FileOperation] = {"create": "create", "update": "update", "delete": "delete"}
    return [FileChange(f.path, ops[f.operation], f.after, f.before_sha256) for f in files]


def _answer(ctx: ServiceContext, decided: Proposal, why: str | None = None) -> Proposal:
    """The approval's answer: the proposal if applied, else the refusal with its status."""
    if decided.status == "applied":
        return decided
    raise _refusal(ctx, decided, why)


def _earlier_split(ctx: ServiceContext, parent_id: str, paths: Sequence[str]) -> Proposal | None:
    """The child an earlier approval of exactly ``paths`` split off, so a retry is harmless."""
    wanted = set(paths)
    with ctx.sessions() as session:
        children = session.scalars(select(Proposal.id).where(Proposal.parent_id == parent_id))
        for child_id in list(children):
            child = load(session, child_id)
            if child is not None and {f.path for f in child.files} == wanted:
                return child
    return None


def _chosen(proposal: Proposal, paths: Sequence[str] | None) -> list[ProposalFile] | None:
    """The files ``paths`` names (None: every file, no split); ``BadProposal`` if unknown."""
    if paths is None:
        return None
    if not paths:
        raise BadProposal("expected at least one file to approve, got an empty list")
    wanted, have = set(paths), {f.path for f in proposal.files}
    unknown = sorted(wanted - have)
    if unknown:
        raise BadProposal(f"expected files of proposal {proposal.id!r}, got {unknown!r}")
    if wanted == have:
        return None
    return [f for f in proposal.files if f.path in wanted]


def _split(
    session: Session,
    child_id: str,
    parent: Proposal,
    files: list[ProposalFile],
    outcome: str,
    why: str | None,
    by: str,
) -> None:
    """Move ``files`` into a new child proposal ``child_id`` decided as ``outcome``."""
    child = Proposal(
        id=child_id,
        user_id=parent.user_id,
        conversation_id=parent.conversation_id,
        turn_id=parent.turn_id,
        workspace=parent.workspace,
        summary=parent.summary,
        status=outcome,
        version=2,  # as if created (1) and decided (2), like every other decided proposal
        decided_at=now(),
        decided_by=by,
        reason=why,
        parent_id=parent.id,
    )
    session.add(child)
    session.flush()
    session.execute(
        update(ProposalFile)
        .where(ProposalFile.id.in_([f.id for f in files]))
        .values(proposal_id=child.id)
    )
    # The parent stays undecided: only its version (bumped by the claim) says it changed.
    session.execute(
        update(Proposal)
        .where(Proposal.id == parent.id, Proposal.status == APPLYING)
        .values(status="pending", decided_at=None, decided_by=None)
    )
    session.expire_all()
    loaded = load(session, child.id)
    assert loaded is not None
    session.add(Outbox(topic=outbox.PROPOSAL_CREATED, payload=outbox.created_payload(loaded)))
    _record(session, child.id)


def _decision_span(proposal: Proposal, decision: str) -> Any:
    attributes = {
        "signalbox.proposal.id": proposal.id,
        "signalbox.proposal.decision": decision,
        "signalbox.conversation.id": proposal.conversation_id,
        "signalbox.turn.id": proposal.turn_id or "",
    }
    # A refusal (409) is an answer, not a failure of the service: the span's status stays.
    return tracer.start_as_current_span(
        "proposal.decide", attributes=attributes, set_status_on_exception=False
    )


def approve(
    ctx: ServiceContext, proposal: Proposal, user_id: str, paths: Sequence[str] | None = None
) -> Proposal:
    """Apply the proposal (or only ``paths`` of it); ``Conflict`` if stale or decided."""
    with _decision_span(proposal, "approve") as span:
        try:
            decided = _approve(ctx, proposal, user_id, paths)
        except Conflict as exc:
            span.set_attribute("signalbox.proposal.status", str(exc.extra.get("status", "")))
            raise
        span.set_attribute("signalbox.proposal.status", decided.status)
        return decided


def _approve(
    ctx: ServiceContext, proposal: Proposal, user_id: str, paths: Sequence[str] | None
) -> Proposal:
    proposal = expire_if_stale(ctx, proposal)
    if paths:
        earlier = _earlier_split(ctx, proposal.id, paths)
        if earlier is not None:
            return _answer(ctx, earlier)  # a retry of a partial approval: nothing happens again
    if proposal.status == "applied":
        return proposal  # approving twice is harmless: nothing is written again
    if proposal.status != "pending":
        raise _refusal(ctx, proposal)
    workspace = ctx.workspace(proposal.user_id, proposal.workspace)
    why: str | None = None
    decided_id = proposal.id
    with ctx.sessions() as session:
        won = _claim(session, proposal.id, APPLYING, user_id, None)
        if not won:
            session.rollback()
            return _answer(ctx, _reload(ctx, proposal.id))
        # Read under the lock: an earlier partial approval may have taken files away.
        locked = load(session, proposal.id)
        assert locked is not None
        try:
            chosen = _chosen(locked, paths)
        except BadProposal:
            session.rollback()
            # A concurrent approval of the same files may have split them off just before us.
            earlier = _earlier_split(ctx, proposal.id, paths) if paths else None
            if earlier is not None:
                return _answer(ctx, earlier)
            raise
        # Before anything is written: undo what an apply killed half-way left behind.
        recovery.settle_locked(ctx, session, proposal.id)
        if chosen is not None:
            decided_id = new_id("prop")  # the child's id, known now so the journal can name it
        spec = JournalSpec(ctx.journal_root, proposal.id, decided_id)
        changes = _changes(locked.files if chosen is None else chosen)
        with tracer.start_as_current_span(
            "proposal.apply",
            attributes={"signalbox.proposal.id": decided_id, "signalbox.files": len(changes)},
        ) as span:
            try:
                applied = apply_changes(workspace, changes, spec)
                outcome = "applied"
            except (StaleFiles, PathRefused) as exc:
                # PathRefused includes a symlink met on the way (perhaps swapped in mid-apply):
                # the apply wrote nothing outside, undid what it wrote inside, and says 409.
                applied, outcome, why = None, "conflict", str(exc)
            span.set_attribute("signalbox.proposal.status", outcome)
        try:
            if chosen is None:
                session.execute(
                    update(Proposal)
                    .where(Proposal.id == proposal.id, Proposal.status == APPLYING)
                    .values(status=outcome, reason=why)
                )
                _record(session, proposal.id)
            else:
                _split(session, decided_id, locked, chosen, outcome, why, user_id)
            session.commit()
        except BaseException:
            if applied is not None:
                applied.undo()  # SQL says pending: the workspace must say so too
            raise
    faults.crash_point(faults.CRASH_AFTER_COMMIT)
    if applied is not None:
        applied.finish()  # committed: a crash before this line leaves a journal read as done
    outbox.relay(ctx)
    decided = _reload(ctx, decided_id)
    if decided.status == "applied" and ctx.settings.git_commit_on_apply:
        git_info.commit_applied(workspace, decided)
    return _answer(ctx, decided, why)


def reject(ctx: ServiceContext, proposal: Proposal, user_id: str, reason: str | None) -> Proposal:
    """Reject the proposal; ``Conflict`` if another decision came first (twice is fine)."""
    with _decision_span(proposal, "reject") as span:
        proposal = expire_if_stale(ctx, proposal)
        if proposal.status == "pending":
            _decide(ctx, proposal.id, "rejected", user_id, reason)
            proposal = _reload(ctx, proposal.id)
        span.set_attribute("signalbox.proposal.status", proposal.status)
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


EXPIRY_BATCH = 100


def expire_overdue(ctx: ServiceContext) -> int:
    """Expire (and announce) pending proposals past their time-to-live; how many."""
    cutoff = datetime.now(UTC) - timedelta(seconds=ctx.settings.proposal_ttl_s)
    with ctx.sessions() as session:
        overdue = list(
            session.scalars(
                select(Proposal.id)
                .where(Proposal.status == "pending", Proposal.created_at < cutoff)
                .order_by(Proposal.created_at)
                .limit(EXPIRY_BATCH)
            )
        )
    return sum(_decide(ctx, pid, "expired", None, "not decided in time") for pid in overdue)
