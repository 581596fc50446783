"""Reverting applied proposals: a new pending proposal that undoes them, never a write.

A revert is proposed like any other change: a human approves it, ``decisions.approve``
checks each file still has the hash it was proposed against, and only then is anything
written. Its files go from what the workspace holds *now* to what it held before the
reverted proposals applied, so approving it after the file changed again is a 409 like any
stale proposal, and the diff a reviewer reads is the real one.

Reverting a turn (``scope="turn"``) reverts every applied proposal of that turn in one
proposal: a turn that wrote a file and then edited it made two proposals of the same file,
whose separate reverts could never both apply (the first changes the hash the second was
made against). Each path goes back to its content before the earliest of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from signalbox.services.proposals import proposals
from signalbox.services.proposals.apply import PathRefused, read_current, resolve, sha256_bytes
from signalbox.services.proposals.context import ServiceContext
from signalbox.services.proposals.errors import BadProposal, Conflict
from signalbox.shared.db import Proposal
from signalbox.shared.db.models import as_utc
from signalbox.shared.proposals_api import (
    MAX_FILES,
    MAX_SUMMARY_CHARS,
    CreateProposal,
    FileChange,
    RevertScope,
)


@dataclass(frozen=True)
class _Target:
    """A path and what it held before the earliest reverted proposal touched it."""

    path: str
    content: str | None  # None: the file did not exist


def _to_revert(ctx: ServiceContext, proposal: Proposal, scope: RevertScope) -> list[Proposal]:
    """The applied proposals to revert, in the order they were applied."""
    if proposal.status != "applied":
        raise Conflict(
            f"proposal {proposal.id!r} is {proposal.status}; only an applied one can be reverted",
            proposal_id=proposal.id,
            status=proposal.status,
        )
    if scope != "turn" or proposal.turn_id is None:
        return [proposal]
    with ctx.sessions() as session:
        found = list(
            session.scalars(
                select(Proposal)
                .where(
                    Proposal.user_id == proposal.user_id,
                    Proposal.conversation_id == proposal.conversation_id,
                    Proposal.turn_id == proposal.turn_id,
                    Proposal.status == "applied",
                )
                .options(selectinload(Proposal.files))
            )
        )
    return sorted(found, key=lambda p: (as_utc(p.decided_at or p.created_at), p.id))


def _targets(workspace: Path, applied: list[Proposal]) -> list[_Target]:
    """Per real path, its content before the first of ``applied`` changed it."""
    targets: dict[Path, _Target] = {}
    for proposal in applied:
        for f in proposal.files:
            try:
                key = resolve(workspace, f.path)
            except PathRefused as exc:
                why = f"cannot revert {f.path!r}: {exc}"
                raise Conflict(why, proposal_id=proposal.id) from None
            if key in targets:
                continue
            if f.before is not None and sha256_bytes(f.before.encode()) != f.before_sha256:
                # ``before`` is stored as text: bytes that were not UTF-8 cannot come back.
                raise Conflict(
                    f"cannot revert {f.path!r}: its earlier content was not UTF-8 text",
                    proposal_id=proposal.id,
                )
            targets[key] = _Target(f.path, f.before)
    return list(targets.values())


def _files(workspace: Path, targets: list[_Target]) -> list[FileChange]:
    """The revert's files: from each path's content now to its target; unchanged ones left out."""
    files: list[FileChange] = []
    for target in targets:
        try:
            current = read_current(workspace, target.path)
        except PathRefused as exc:
            raise Conflict(f"cannot revert {target.path!r}: {exc}") from None
        wanted = None if target.content is None else target.content.encode()
        if current == wanted:
            continue
        if current is None:
            files.append(FileChange(path=target.path, operation="create", after=target.content))
        else:
            files.append(
                FileChange(
                    path=target.path,
                    operation="delete" if target.content is None else "update",
                    after=target.content,
                    before_sha256=sha256_bytes(current),  # approval 409s if it changes again
                )
            )
    return files


def _pending_revert(ctx: ServiceContext, user_id: str, reverted: list[str]) -> Proposal | None:
    """A pending revert of exactly ``reverted`` already made, so asking twice is harmless."""
    for pending in proposals.pending_of(ctx, user_id):
        if pending.reverts is not None and sorted(pending.reverts) == sorted(reverted):
            return pending
    return None


def _summary(applied: list[Proposal]) -> str:
    text = "revert: " + "; ".join(p.summary or p.id for p in applied)
    return text if len(text) <= MAX_SUMMARY_CHARS else text[: MAX_SUMMARY_CHARS - 1] + "…"


def revert(ctx: ServiceContext, proposal: Proposal, scope: RevertScope = "proposal") -> Proposal:
    """A new pending proposal undoing ``proposal`` (or its whole turn's applied proposals).

    ``Conflict`` when it is not applied, or when the workspace already holds what it held
    before (nothing to revert). The caller has checked the caller owns ``proposal``; the
    turn's other proposals are selected by the same owner, conversation and turn.
    """
    applied = _to_revert(ctx, proposal, scope)
    reverted = [p.id for p in applied]
    existing = _pending_revert(ctx, proposal.user_id, reverted)
    if existing is not None:
        return existing
    workspace = ctx.workspace(proposal.user_id, proposal.workspace)
    files = _files(workspace, _targets(workspace, applied))
    if not files:
        raise Conflict(
            f"nothing to revert: the files of {', '.join(map(repr, reverted))} "
            "already hold what they held before",
            proposal_id=proposal.id,
            status=proposal.status,
        )
    if len(files) > MAX_FILES:
        raise BadProposal(f"expected at most {MAX_FILES} files to revert, got {len(files)}")
    request = CreateProposal(
        user_id=proposal.user_id,
        conversation_id=proposal.conversation_id,
        workspace=proposal.workspace,
        summary=_summary(applied),
        files=files,
    )
    return proposals.create(ctx, request, reverts=reverted)
