"""A turn's wall-clock limit (the agent's ``turn_timeout_s``): it ends ``timed_out`` with its
open calls ended and a valid transcript, whether it was streaming, gathering or parked."""

from __future__ import annotations

import time

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.recovery import Reconciler
from signalbox.shared.db.models import Turn
from tests.fake_anthropic import transcript_problems

from .bound_agents import bind_agent
from .support import Harness, ok, say, silent, spec, use, wait_for


def _turn(h: Harness, turn_id: str) -> Turn:
    with h.sessions() as s:
        turn = s.get(Turn, turn_id)
        assert turn is not None
        return turn


def test_a_turn_past_its_limit_while_a_tool_runs_ends_timed_out_with_a_valid_transcript(
    harness: Harness,
) -> None:
    h = harness
    bind_agent(h, turn_timeout_s=0.5)
    h.catalogue(spec("slow_tool", timeout_s=30.0), spec("read_file"))
    h.dispatcher.tools.update({"slow_tool": silent(), "read_file": ok("fine")})
    h.model.steps = [
        say("Working.", use("read_file", path="a"), use("slow_tool")),
        say("Next turn answer."),
    ]
    first = h.turn("do the slow thing", seq=1)

    started = time.monotonic()
    assert h.run(first) == "timed_out"
    took = time.monotonic() - started

    assert took < 5.0, f"the limit of 0.5 s stopped the turn only after {took:.1f} s"
    turn = _turn(h, first)
    assert turn.status == "timed_out" and turn.deadline_at is not None
    [finished] = h.data("turn_finished")
    assert finished["status"] == "timed_out"
    assert "time limit" in finished["error"]
    statuses = {c.tool: c.status for c in h.calls(first)}
    assert statuses == {"read_file": "ok", "slow_tool": "cancelled"}
    assert len(h.dispatcher.revoked) == 1, "the running call is revoked"

    second = h.turn("and now?", seq=2)
    assert h.run(second) == "completed"
    assert transcript_problems(h.model.requests[-1].messages) == []


def test_the_deadline_wakes_a_turn_parked_on_a_decision_and_ends_it(harness: Harness) -> None:
    h = harness
    bind_agent(h, turn_timeout_s=0.3)
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running code.", use("run_python", code="1"))]
    turn_id = h.turn("compute")

    assert h.run(turn_id) == "parked"
    assert not h.data("turn_finished")
    wait_for(lambda: store.ready_to_continue(h.sessions, turn_id), 5.0, "the deadline to pass")
    enqueued: list[str] = []
    reconciler = Reconciler(h.sessions, h.runtime.redis, h.runtime.keys, enqueued.append, 60)
    assert turn_id in reconciler.sweep()

    assert h.run(turn_id) == "timed_out"

    [call] = h.calls(turn_id)
    assert call.status == "cancelled" and call.error == "the turn ended (timed_out)"
    assert [d["status"] for d in h.data("turn_finished")] == ["timed_out"]
    assert h.model.steps == [], "the model was not asked again"


def test_a_turn_within_its_limit_is_untouched(harness: Harness) -> None:
    h = harness
    bind_agent(h, turn_timeout_s=60)
    h.model.steps = [say("Hello.")]
    turn_id = h.turn("hi")

    assert h.run(turn_id) == "completed"
    turn = _turn(h, turn_id)
    assert turn.deadline_at is not None and turn.started_at is not None
    assert abs((turn.deadline_at - turn.started_at).total_seconds() - 60) < 1e-3
