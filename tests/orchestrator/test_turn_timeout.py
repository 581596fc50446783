"""A turn's wall-clock limit (the agent's ``turn_timeout_s``): it ends ``timed_out`` with its
open calls ended and a valid transcript, whether it was streaming, gathering or parked.

The limits here are long (600 s); the tests make them pass at the moment they choose, by
moving ``deadline_at`` into the past in SQL and, for a turn that is running, by calling the
runner's deadline callback as its timer would. No test races a short limit against a loaded
machine. (The timer thread itself: ``test_timers.py``.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from signalbox.services.orchestrator import store, turn_runner
from signalbox.services.orchestrator.recovery import Reconciler
from signalbox.services.orchestrator.turn_deadline import TurnDeadline
from signalbox.shared.db.models import Turn
from tests.fake_anthropic import transcript_problems

from .bound_agents import bind_agent
from .support import Harness, ok, say, silent, spec, use, wait_for

LIMIT_S = 600.0  # never reached by itself within a test
WAIT_S = 30.0  # a deadline to wait for, generous for a loaded machine


def _turn(h: Harness, turn_id: str) -> Turn:
    with h.sessions() as s:
        turn = s.get(Turn, turn_id)
        assert turn is not None
        return turn


def _limit_passes(h: Harness, turn_id: str) -> None:
    """The turn's ``deadline_at`` is now past, in SQL (what the reconciler and a resumed
    runner read)."""
    with h.sessions() as s, s.begin():
        s.execute(
            update(Turn)
            .where(Turn.id == turn_id)
            .values(deadline_at=store.utcnow() - timedelta(seconds=1))
        )


def test_a_turn_past_its_limit_while_a_tool_runs_ends_timed_out_with_a_valid_transcript(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    # The runner's real deadline, armed for LIMIT_S; the test also keeps its callback.
    on_deadline: list[Callable[[], None]] = []

    def kept(deadline_at: datetime | None, callback: Callable[[], None], **kw: Any) -> Any:
        on_deadline.append(callback)
        return TurnDeadline(deadline_at, callback, **kw)

    monkeypatch.setattr(turn_runner, "TurnDeadline", kept)
    bind_agent(h, turn_timeout_s=LIMIT_S)
    h.catalogue(spec("slow_tool", timeout_s=LIMIT_S), spec("read_file"))
    h.dispatcher.tools.update({"slow_tool": silent(), "read_file": ok("fine")})
    h.model.steps = [
        say("Working.", use("read_file", path="a"), use("slow_tool")),
        say("Next turn answer."),
    ]
    first = h.turn("do the slow thing", seq=1)

    def read_file_in_slow_tool_running() -> bool:
        statuses = {c.tool: c.status for c in h.calls(first)}
        return bool(on_deadline) and statuses == {"read_file": "ok", "slow_tool": "running"}

    def limit_passes_mid_call() -> None:
        # The limit passes while the turn gathers: read_file answered, slow_tool never will.
        try:
            wait_for(read_file_in_slow_tool_running, WAIT_S, "read_file's result")
        finally:  # whatever happened, the turn ends (a failed wait fails the asserts below)
            _limit_passes(h, first)
            for callback in on_deadline:
                callback()  # what the timer does at deadline_at

    passing = threading.Thread(target=limit_passes_mid_call, daemon=True)
    passing.start()
    assert h.run(first) == "timed_out"
    passing.join(WAIT_S)

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
    bind_agent(h, turn_timeout_s=LIMIT_S)
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running code.", use("run_python", code="1"))]
    turn_id = h.turn("compute")

    assert h.run(turn_id) == "parked"
    assert not h.data("turn_finished")
    enqueued: list[str] = []
    reconciler = Reconciler(h.sessions, h.runtime.redis, h.runtime.keys, enqueued.append, 60)
    assert not store.ready_to_continue(h.sessions, turn_id)
    assert turn_id not in reconciler.sweep(), "a parked turn within its limit sleeps on"

    _limit_passes(h, turn_id)
    assert store.ready_to_continue(h.sessions, turn_id)
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
