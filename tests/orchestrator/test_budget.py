"""A user's token budget inside the loop: a turn that crosses it finishes the step that
crossed it and ends ``budget_exceeded`` (transcript valid, open calls ended), a warning goes
out once per period at the soft threshold, and the next period starts afresh — on a clock
the test moves, never by sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from signalbox.shared.db import UserLimits
from tests.fake_anthropic import transcript_problems

from .support import Harness, ok, say, spec, use

# Each scripted step bills 15 tokens (10 in, 5 out): 35 lets two steps through, warns at
# 28 (80 %) after the second, and is crossed by the third.
BUDGET = 35


def _set_budget(h: Harness, day_tokens: int | None, month_tokens: int | None = None) -> None:
    with h.sessions() as s, s.begin():
        s.merge(UserLimits(user_id=h.user_id, day_tokens=day_tokens, month_tokens=month_tokens))


def test_a_turn_crossing_the_budget_ends_budget_exceeded_and_the_next_period_starts_afresh(
    harness: Harness,
) -> None:
    h = harness
    now = datetime.now(UTC)
    h.runtime.clock = lambda: now
    _set_budget(h, BUDGET)
    h.catalogue(spec("read_file"))
    h.dispatcher.tools.update({"read_file": ok("contents")})
    h.model.steps = [
        say("One.", use("read_file", path="a")),
        say("Two.", use("read_file", path="b")),
        say("Three.", use("read_file", path="c")),
        say("Never asked."),
    ]
    first = h.turn("read three files", seq=1)

    assert h.run(first) == "budget_exceeded"

    assert len(h.model.requests) == 3, "the step that crossed the budget was the last"
    [finished] = h.data("turn_finished")
    assert finished["status"] == "budget_exceeded"
    assert "daily token budget of 35" in finished["error"]
    calls = {c.input["path"]: c for c in h.calls(first)}
    assert {p: c.status for p, c in calls.items()} == {"a": "ok", "b": "ok", "c": "cancelled"}
    assert calls["c"].error == "the turn ended (budget_exceeded)"
    [warning] = h.data("budget_warning")
    assert warning["period"] == "day" and warning["limit_tokens"] == BUDGET
    assert warning["used_tokens"] == 30 and warning["threshold"] == 0.8

    # Still the same day: the next turn ends before asking the model at all.
    second = h.turn("again", seq=2)
    assert h.run(second) == "budget_exceeded"
    assert len(h.model.requests) == 3
    assert len(h.data("budget_warning")) == 1, "one warning per period"

    # The next day: a budget of its own, and a transcript the API accepts.
    now = now + timedelta(days=1)
    h.model.steps = [say("Fresh day.")]
    third = h.turn("and now?", seq=3)
    assert h.run(third) == "completed"
    assert transcript_problems(h.model.requests[-1].messages) == []


def test_a_monthly_budget_counts_the_whole_month_and_no_budget_limits_nothing(
    harness: Harness,
) -> None:
    h = harness
    now = datetime.now(UTC)
    h.runtime.clock = lambda: now
    h.model.steps = [say("Free."), say("Still free."), say("Over.")]
    assert h.run(h.turn("one", seq=1)) == "completed"
    assert h.run(h.turn("two", seq=2)) == "completed"
    assert not h.data("budget_warning"), "no budget set: no warning"

    _set_budget(h, day_tokens=None, month_tokens=30)
    third = h.turn("three", seq=3)
    assert h.run(third) == "budget_exceeded"
    assert len(h.model.requests) == 2
    [warning] = h.data("budget_warning")
    assert warning["period"] == "month"
