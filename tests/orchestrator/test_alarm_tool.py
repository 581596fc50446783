"""The ``alarm`` built-in tool in the real loop (real Redis and SQL, scripted model): it stores
an owner-scoped alarm, asks the scheduler to load it and tells the model when it will be
woken; a time that has passed or a malformed input ends the call ``error``; an agent whose
allow-list leaves it out is not offered it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from signalbox.services.orchestrator.model import ModelEvent
from signalbox.shared.db import Alarm

from .bound_agents import bind_agent
from .support import Harness, say, use


def _script(h: Harness, *steps: list[ModelEvent]) -> None:
    h.model.steps.extend(steps)


def test_an_alarm_is_stored_for_this_conversation_and_the_model_is_told_when(
    harness: Harness,
) -> None:
    h = harness
    synced: list[str] = []
    h.runtime.sync_alarm = synced.append
    _script(
        h,
        say("Setting it.", use("alarm", in_minutes=30, note="check the nightly build")),
        say("I will look then."),
    )
    before = datetime.now(UTC)
    turn_id = h.turn("remind yourself")

    assert h.run(turn_id) == "completed"

    [call] = h.calls(turn_id)
    assert call.status == "ok", call.error
    with h.sessions() as s:
        [alarm] = s.scalars(select(Alarm).where(Alarm.conversation_id == h.conversation_id))
    assert alarm.user_id == h.user_id and alarm.status == "pending"
    assert alarm.note == "check the nightly build" and alarm.set_by_turn_id == turn_id
    wake = alarm.wake_at.replace(tzinfo=UTC) if alarm.wake_at.tzinfo is None else alarm.wake_at
    assert timedelta(minutes=29) < wake - before < timedelta(minutes=31)
    assert synced == [alarm.id]
    [finished] = [d for d in h.data("tool_call_finished") if d["call_id"] == call.id]
    assert wake.strftime("%Y-%m-%dT%H:%M:%S") in finished["output"]


def test_a_time_that_has_passed_or_two_times_end_the_call_error_and_store_nothing(
    harness: Harness,
) -> None:
    h = harness
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    _script(
        h,
        say(
            "Trying.",
            use("alarm", at=past, note="too late"),
            use("alarm", at="2030-01-01T09:00:00", note="no offset"),
            use("alarm", at="2030-01-01T09:00:00Z", in_minutes=5, note="both"),
        ),
        say("Understood."),
    )
    turn_id = h.turn("wake me")

    assert h.run(turn_id) == "completed"

    late, naive, both = h.calls(turn_id)
    assert late.status == "error" and "has passed" in (late.error or "")
    assert naive.status == "error" and "at" in (naive.error or "")
    assert both.status == "error" and "exactly one" in (both.error or "")
    with h.sessions() as s:
        assert s.scalars(select(Alarm).where(Alarm.user_id == h.user_id)).all() == []


def test_an_agent_whose_allow_list_leaves_out_alarm_is_not_offered_it(harness: Harness) -> None:
    h = harness
    bind_agent(h, tools=["ask_user"])
    _script(h, say("Fine."))
    assert h.run(h.turn("hello")) == "completed"
    offered = {t.name for t in h.model.requests[0].tools}
    assert offered == {"ask_user"}
