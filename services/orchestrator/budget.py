"""Token budgets inside a running turn: warn once past the soft threshold, stop past the limit.

Checked before each model step and before a step's calls are started, so a turn that
crosses its user's budget finishes the step that crossed it (its answer and its calls are
in the transcript) and then ends ``budget_exceeded``, its open calls ended the way a cancel
ends them. The budgets and the usage are in SQL (``shared/db/budgets.py``), so every
orchestrator process sees the same figures; "now" is ``Runtime.clock``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.exc import IntegrityError

from signalbox.shared.db.budgets import BudgetState, budget_states
from signalbox.shared.db.tenancy import BudgetWarning
from signalbox.shared.events import BudgetWarningData
from signalbox.shared.timestamps import rfc3339

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner


def exhausted(runner: TurnRunner, has_budget: bool = True) -> BudgetState | None:
    """The budget of the turn's user that is used up, or None; warns on the way.
    ``has_budget`` False: the loop's read found the user has none (nothing to read)."""
    if not has_budget:
        return None
    rt = runner.rt
    with rt.sessions() as s:
        states = budget_states(s, runner.info.user_id, rt.clock())
    fraction = rt.settings.budget_warn_fraction
    for state in states:
        if state.used_tokens >= state.limit_tokens * fraction:
            _warn_once(runner, state, fraction)
    return next((s for s in states if s.exceeded), None)


def _warn_once(runner: TurnRunner, state: BudgetState, fraction: float) -> None:
    # The row's key is (user, period, period start): the first orchestrator to insert it
    # sends the warning; every other one (or a later step) finds it there and stays quiet.
    try:
        with runner.rt.sessions() as s, s.begin():
            s.add(
                BudgetWarning(
                    user_id=runner.info.user_id,
                    period=state.period,
                    period_start=state.period_start,
                )
            )
    except IntegrityError:
        return
    runner.emit(
        "budget_warning",
        BudgetWarningData(
            period=state.period,
            limit_tokens=state.limit_tokens,
            used_tokens=state.used_tokens,
            threshold=fraction,
            resets_at=rfc3339(state.resets_at),
        ),
    )
