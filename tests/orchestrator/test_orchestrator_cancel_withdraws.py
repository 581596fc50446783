"""A cancelled turn withdraws the proposals it made that still wait for approval: each ends
``cancelled``, announced by ``proposal_resolved`` before ``turn_finished``; one a human
already decided stays as decided."""

from __future__ import annotations

from sqlalchemy import update

from signalbox.services.orchestrator.transcript import load_proposal_notes, note_text
from signalbox.shared.db import Proposal
from signalbox.shared.db.models import Turn
from signalbox.shared.ids import new_id

from .support import Harness, say, spec, use


def _proposal(h: Harness, turn_id: str, status: str) -> str:
    proposal_id = new_id("prop")
    with h.sessions() as s, s.begin():
        s.add(
            Proposal(
                id=proposal_id,
                user_id=h.user_id,
                conversation_id=h.conversation_id,
                turn_id=turn_id,
                workspace="default",
                summary="create a.txt",
                status=status,
            )
        )
    return proposal_id


def test_a_cancelled_turn_withdraws_its_pending_proposals_before_it_ends(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running.", use("run_python", code="1"))]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    pending = _proposal(h, turn_id, "pending")
    applied = _proposal(h, turn_id, "applied")
    elsewhere = _proposal(h, h.turn("another", seq=2), "pending")
    with h.sessions() as s, s.begin():
        s.execute(update(Turn).where(Turn.id == turn_id).values(cancel_requested=True))

    assert h.run(turn_id) == "cancelled"

    with h.sessions() as s:
        status = {p: s.get(Proposal, p).status for p in (pending, applied, elsewhere)}  # type: ignore[union-attr]
    assert status == {pending: "cancelled", applied: "applied", elsewhere: "pending"}
    kinds = [(e.kind, e.data.get("proposal_id")) for e in h.events()]
    resolved = kinds.index(("proposal_resolved", pending))
    assert resolved < kinds.index(("turn_finished", None))
    assert [e.data for e in h.events() if e.kind == "proposal_resolved"] == [
        {"proposal_id": pending, "status": "cancelled"}
    ]


def test_the_model_is_told_a_proposal_was_withdrawn(harness: Harness) -> None:
    """The next turn's transcript says how a withdrawn proposal ended, as for any decision."""
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running.", use("run_python", code="1"))]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    [call] = h.calls(turn_id)
    pending = _proposal(h, turn_id, "pending")
    with h.sessions() as s, s.begin():
        s.execute(update(Proposal).where(Proposal.id == pending).values(call_id=call.id))
        s.execute(update(Turn).where(Turn.id == turn_id).values(cancel_requested=True))
    assert h.run(turn_id) == "cancelled"

    with h.sessions() as s:
        notes = load_proposal_notes(s, h.conversation_id)

    assert [note_text(n) for n in notes[call.id]] == [
        f"proposal {pending} was withdrawn because its turn was cancelled; nothing was written"
    ]
