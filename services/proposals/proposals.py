"""Proposals: creating them from a tool's request, loading them for their owner, their JSON."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from signalbox.services.proposals import outbox, quotas
from signalbox.services.proposals.apply import PathRefused, read_current, resolve, sha256_bytes
from signalbox.services.proposals.context import ServiceContext
from signalbox.services.proposals.diffs import unified_diff
from signalbox.services.proposals.errors import BadProposal, Conflict, NotFound
from signalbox.services.proposals.ownership import owned_conversation
from signalbox.shared.db import Conversation, Outbox, Proposal, ProposalFile
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.events import ProposalStatus
from signalbox.shared.ids import new_id
from signalbox.shared.proposals_api import CreateProposal, ProposalPublic
from signalbox.shared.timestamps import rfc3339_or_none
from signalbox.shared.tracing import Attributes, tracer


def proposal_public(proposal: Proposal) -> ProposalPublic:
    """A proposal as clients see it (docs/protocol.md), each file with its unified diff."""
    return ProposalPublic.model_validate(
        {
            "proposal_id": proposal.id,
            "conversation_id": proposal.conversation_id,
            "turn_id": proposal.turn_id,
            "call_id": proposal.call_id,
            "workspace": proposal.workspace,
            "summary": proposal.summary,
            "created_at": rfc3339_or_none(proposal.created_at),
            "status": proposal.status,
            "version": proposal.version,
            "decided_at": rfc3339_or_none(proposal.decided_at),
            "decided_by": proposal.decided_by,
            "reason": proposal.reason,
            "parent_id": proposal.parent_id,
            "reverts": proposal.reverts,
            "files": [
                {
                    "path": f.path,
                    "operation": f.operation,
                    "before": f.before,
                    "after": f.after,
                    "before_sha256": f.before_sha256,
                    "diff": unified_diff(f.path, f.before, f.after),
                }
                for f in proposal.files
            ],
        }
    )


def load(session: Session, proposal_id: str) -> Proposal | None:
    """The proposal with its files, read fresh from SQL."""
    return session.execute(
        select(Proposal)
        .where(Proposal.id == proposal_id)
        .options(selectinload(Proposal.files))
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def owned(ctx: ServiceContext, user_id: str, proposal_id: str) -> Proposal:
    """The proposal if ``user_id`` owns it; anyone else's is ``NotFound``, exactly like none."""
    with ctx.sessions() as session:
        proposal = load(session, proposal_id)
    if proposal is None or proposal.user_id != user_id:
        raise NotFound(f"no proposal {proposal_id!r}")
    return proposal


def pending_of(ctx: ServiceContext, user_id: str) -> list[Proposal]:
    """``user_id``'s pending proposals, oldest first."""
    with ctx.sessions() as session:
        return list(
            session.scalars(
                select(Proposal)
                .where(Proposal.user_id == user_id, Proposal.status == "pending")
                .options(selectinload(Proposal.files))
                .order_by(Proposal.created_at, Proposal.id)
            )
        )


DECIDED_STATUSES = tuple(s for s in get_args(ProposalStatus) if s != "pending")


def decided_of(ctx: ServiceContext, user_id: str, limit: int) -> list[Proposal]:
    """``user_id``'s ``limit`` most recently decided proposals, newest first."""
    with ctx.sessions() as session:
        return list(
            session.scalars(
                select(Proposal)
                .where(
                    Proposal.user_id == user_id,
                    Proposal.status.in_(DECIDED_STATUSES),
                )
                .options(selectinload(Proposal.files))
                .order_by(Proposal.decided_at.desc().nulls_last(), Proposal.id.desc())
                .limit(limit)
            )
        )


def _file_rows(
    ctx: ServiceContext, request: CreateProposal, conv: Conversation
) -> list[ProposalFile]:
    workspace = ctx.workspace(conv.user_id, conv.workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    seen: set[Path] = set()
    rows: list[ProposalFile] = []
    for position, file in enumerate(request.files):
        try:
            target = resolve(workspace, file.path)
            current = read_current(workspace, file.path)  # through dir fds, O_NOFOLLOW
        except PathRefused as exc:
            raise BadProposal(str(exc)) from None
        if target in seen:
            raise BadProposal(f"expected each file once, got {file.path!r} twice")
        seen.add(target)
        if file.operation != "delete" and file.after is None:
            raise BadProposal(f"expected 'after' content to {file.operation} {file.path!r}")
        before_sha = None if current is None else sha256_bytes(current)
        if file.operation == "create" and current is not None:
            raise Conflict(f"cannot create {file.path!r}: it exists", path=file.path)
        if file.operation != "create":
            if current is None:
                raise Conflict(
                    f"cannot {file.operation} {file.path!r}: no such file", path=file.path
                )
            if file.before_sha256 is not None and file.before_sha256 != before_sha:
                raise Conflict(
                    f"{file.path!r} changed: expected sha256 {file.before_sha256!r}, "
                    f"got {before_sha!r}",
                    path=file.path,
                    current_sha256=before_sha,
                )
        rows.append(
            ProposalFile(
                id=new_id("pfile"),
                position=position,
                path=file.path,
                operation=file.operation,
                before=None if current is None else current.decode("utf-8", errors="replace"),
                after=None if file.operation == "delete" else file.after,
                before_sha256=before_sha,
            )
        )
    return rows


MAX_TURN_DEPTH = 8  # spawn_agent children nest; deeper than this is not a real turn


def _refuse_if_cancelled(session: Session, turn_id: str | None) -> None:
    """``Conflict`` (reason ``turn_cancelled``) when the proposing turn, or the turn that
    spawned it, was cancelled: nothing a cancelled turn started may be proposed after.

    The turn row is read ``FOR UPDATE`` (PostgreSQL): a cancel committed while this proposal
    commits waits for it, so the orchestrator, which withdraws the turn's pending proposals
    after the cancel, sees this one. SQLite serialises writers anyway.
    """
    for _ in range(MAX_TURN_DEPTH):
        if turn_id is None:
            return
        turn = session.scalars(select(Turn).where(Turn.id == turn_id).with_for_update()).first()
        if turn is None:
            return
        if turn.cancel_requested or turn.status == "cancelled":
            raise Conflict(
                f"turn {turn_id!r} was cancelled; nothing is proposed for it",
                reason="turn_cancelled",
            )
        if turn.parent_call_id is None:
            return
        turn_id = session.scalar(select(ToolCall.turn_id).where(ToolCall.id == turn.parent_call_id))


def _added_bytes(files: list[ProposalFile]) -> int:
    """What writing ``files`` adds to the workspace, in bytes (negative: it shrinks)."""
    after = sum(len(f.after.encode()) for f in files if f.after is not None)
    before = sum(len(f.before.encode()) for f in files if f.before is not None)
    return after - before


def create(
    ctx: ServiceContext, request: CreateProposal, reverts: list[str] | None = None
) -> Proposal:
    """Store a new pending proposal and queue its ``proposal_created`` event.

    ``reverts``: the applied proposals a revert proposal undoes (``revert.py``).
    Traced as ``proposal.create`` (under the tool call's HTTP request, so in its turn's trace).
    """
    attributes: Attributes = {
        "signalbox.conversation.id": request.conversation_id,
        "signalbox.turn.id": request.turn_id or "",
        "signalbox.tool.call_id": request.call_id or "",
        "signalbox.files": len(request.files),
    }
    with tracer.start_as_current_span("proposal.create", attributes=attributes) as span:
        proposal = _create(ctx, request, reverts)
        span.set_attribute("signalbox.proposal.id", proposal.id)
        return proposal


def _create(ctx: ServiceContext, request: CreateProposal, reverts: list[str] | None) -> Proposal:
    with ctx.sessions() as session:
        conv = owned_conversation(
            session, request.user_id, request.conversation_id, request.workspace
        )
        _refuse_if_cancelled(session, request.turn_id)
        if request.call_id is not None:
            # A redelivered tool call gets the proposal it already made, not a second one.
            existing = session.scalars(
                select(Proposal.id).where(
                    Proposal.call_id == request.call_id, Proposal.user_id == request.user_id
                )
            ).first()
            if existing is not None:
                found = load(session, existing)
                assert found is not None
                return found
        files = _file_rows(ctx, request, conv)
        quotas.reserve(session, ctx.settings, conv.user_id, _added_bytes(files))
        proposal = Proposal(
            id=new_id("prop"),
            user_id=conv.user_id,
            conversation_id=conv.id,
            turn_id=request.turn_id,
            call_id=request.call_id,
            workspace=conv.workspace,
            summary=request.summary,
            status="pending",
            version=1,
            reverts=reverts,
            files=files,
        )
        session.add(proposal)
        session.flush()
        session.add(Outbox(topic=outbox.PROPOSAL_CREATED, payload=outbox.created_payload(proposal)))
        session.commit()
    outbox.relay(ctx)
    return proposal
