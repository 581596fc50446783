"""``run_plan``: the steps of a plan run as tool calls of the turn, as a dependency graph.

The plan call runs inline (like ``spawn_agent``), but each step is an ordinary tool call of
the same turn, made when the steps it refers to have ended ok: it meets the tool policy
(a step may wait for a human's decision, and the turn parks meanwhile), is dispatched to a
tool worker with its own time limit, and announces itself with the usual call events. The
plan runs as a dataflow: the steps ready together go out in one batch, and the moment any
running step ends (``server_calls.gather(until_first=True)``) the steps whose inputs are
now all ready go out, so a slow branch never holds back a dependent of a fast one.

Everything is in SQL (``shared/db/plans.py``): a runner that dies mid-plan leaves steps
``planned``, ``running`` (their call is gathered from the results stream, never sent again
unless idempotent) or ended; the next runner goes on from there, and a step that ended is
never run again. A step whose dependency did not end ok is ``skipped``; the rest goes on.
The model gets one result, every step's status and output, once every step has ended.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from signalbox.services.orchestrator import model_step, plan_graph, server_calls, store
from signalbox.services.orchestrator.model import ToolUse
from signalbox.services.orchestrator.transcript import OPEN_CALL_STATUSES
from signalbox.shared.db.models import ToolCall
from signalbox.shared.db.plans import PlanStep
from signalbox.shared.events import PlanFinished, PlannedStep, PlanStarted, PlanStepChanged
from signalbox.shared.ids import new_id
from signalbox.shared.statuses import CallState, PlanStepState

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

log = logging.getLogger(__name__)

# A step's call sits in its plan call's message after every call the model made there.
STEP_POSITION_BASE = 10_000
ENDED = frozenset({PlanStepState.OK, PlanStepState.ERROR, PlanStepState.TIMEOUT})
FINAL = ENDED | {PlanStepState.SKIPPED}


def step_status(call_status: str) -> PlanStepState:
    """A step's end from its call's: a timeout is told apart, every other failure is an error
    (denied, cancelled, lost: the call's own event says which)."""
    if call_status == CallState.OK:
        return PlanStepState.OK
    if call_status == CallState.TIMEOUT:
        return PlanStepState.TIMEOUT
    return PlanStepState.ERROR


def run(runner: TurnRunner, call: ToolCall) -> str | None:
    """Run (or resume) the plan of ``call`` until every step ended, or a step waits on a
    human (None, the call still open: the turn parks), or the turn is cancelled."""
    sessions = runner.rt.sessions
    if _create_steps(runner, call):
        steps = _steps(sessions, call.id)
        runner.emit(
            "plan_started",
            PlanStarted(
                call_id=call.id,
                steps=[
                    PlannedStep(
                        save_as=s.save_as,
                        tool=s.tool,
                        depends_on=[str(d) for d in s.depends_on],
                        level=s.level,
                    )
                    for s in steps
                ],
            ),
        )
    offered = model_step.offers(runner)
    while True:
        runner.lease.check()
        if runner.cancelled():
            return "cancelled"
        _note_ended(runner, call)
        _skip_blocked(runner, call)
        _start_ready(runner, call, offered)
        steps = _steps(sessions, call.id)
        if all(s.status in FINAL for s in steps):
            _finish(runner, call, steps)
            return None
        open_calls = _open_step_calls(sessions, call.id)
        pending = [c for c in open_calls if c.status == CallState.PENDING]
        if pending:
            server_calls.dispatch(runner, pending)
            open_calls = _open_step_calls(sessions, call.id)
        running = [c for c in open_calls if c.status == CallState.RUNNING]
        if running:
            if server_calls.gather(runner, running, until_first=True) == "cancelled":
                return "cancelled"
            continue
        # What is left waits on a decision: the turn's own loop applies it, or parks.
        return None


# -- the plan's state in SQL ----------------------------------------------------------------


def _changed(s: Session, statement: Any) -> bool:
    """Run a conditional ``UPDATE``; True if it changed exactly one row."""
    return cast(CursorResult[Any], s.execute(statement)).rowcount == 1


def _create_steps(runner: TurnRunner, call: ToolCall) -> bool:
    """The plan's step rows, written once; True if this pass wrote them."""
    # The tools were checked when the model's step was stored: now only the graph matters
    # (a tool whose workers left since ends its own call ``error``, like any call).
    graph = plan_graph.check(call.input, None)
    with runner.rt.sessions() as s, s.begin():
        if s.scalar(select(PlanStep.id).where(PlanStep.plan_call_id == call.id).limit(1)):
            return False
        for position, step in enumerate(graph):
            s.add(
                PlanStep(
                    id=new_id("step"),
                    plan_call_id=call.id,
                    position=position,
                    save_as=step.save_as,
                    tool=step.tool,
                    input=step.input,
                    depends_on=list(step.depends_on),
                    level=step.level,
                    status=PlanStepState.PLANNED,
                )
            )
    return True


def _steps(sessions: store.Sessions, plan_call_id: str) -> list[PlanStep]:
    with sessions() as s:
        return list(
            s.scalars(
                select(PlanStep)
                .where(PlanStep.plan_call_id == plan_call_id)
                .order_by(PlanStep.position)
            )
        )


def _step_calls(sessions: store.Sessions, plan_call_id: str) -> dict[str, ToolCall]:
    with sessions() as s:
        rows = s.scalars(select(ToolCall).where(ToolCall.plan_call_id == plan_call_id))
        return {c.id: c for c in rows}


def _open_step_calls(sessions: store.Sessions, plan_call_id: str) -> list[ToolCall]:
    return sorted(
        (c for c in _step_calls(sessions, plan_call_id).values() if c.status in OPEN_CALL_STATUSES),
        key=lambda c: c.position,
    )


def _move(
    runner: TurnRunner,
    plan_call_id: str,
    step: PlanStep,
    status: PlanStepState,
    error: str | None = None,
    call_id: str | None = None,
) -> None:
    """One step's move from the status it was read with, announced once (a move another
    pass made first is not announced again)."""
    with runner.rt.sessions() as s, s.begin():
        moved = _changed(
            s,
            update(PlanStep)
            .where(PlanStep.id == step.id, PlanStep.status == step.status)
            .values(status=status, error=error, call_id=call_id or step.call_id),
        )
    if moved:
        _announce(runner, plan_call_id, step.save_as, status, call_id or step.call_id, error)


def _announce(
    runner: TurnRunner,
    plan_call_id: str,
    save_as: str,
    status: PlanStepState,
    step_call_id: str | None,
    error: str | None,
) -> None:
    runner.emit(
        "plan_step",
        PlanStepChanged(
            call_id=plan_call_id,
            save_as=save_as,
            status=status.value,
            step_call_id=step_call_id,
            error=error,
        ),
    )


# -- the moves --------------------------------------------------------------------------------


def _note_ended(runner: TurnRunner, call: ToolCall) -> None:
    """Running steps whose call ended take its end."""
    calls = _step_calls(runner.rt.sessions, call.id)
    for step in _steps(runner.rt.sessions, call.id):
        done = calls.get(step.call_id or "")
        running = step.status == PlanStepState.RUNNING
        if running and done is not None and done.status not in OPEN_CALL_STATUSES:
            _move(runner, call.id, step, step_status(done.status), done.error)


def _skip_blocked(runner: TurnRunner, call: ToolCall) -> None:
    """Planned steps that depend on a step that did not end ok are skipped (in the plan's
    runnable order, so a skip reaches the steps after it in the same pass)."""
    status: dict[str, str] = {}
    for step in _steps(runner.rt.sessions, call.id):
        status[step.save_as] = step.status
        if step.status != PlanStepState.PLANNED:
            continue
        failed = [str(d) for d in step.depends_on if status.get(str(d)) in FINAL - {"ok"}]
        if failed:
            why = f"skipped: step {failed[0]!r} ended {status[failed[0]]}"
            _move(runner, call.id, step, PlanStepState.SKIPPED, why)
            status[step.save_as] = PlanStepState.SKIPPED


def _start_ready(runner: TurnRunner, call: ToolCall, offered: Mapping[str, Any]) -> None:
    """Planned steps whose dependencies all ended ok become calls of the turn, each planned
    against the offers and the tool policy like a call the model made itself."""
    sessions = runner.rt.sessions
    steps = _steps(sessions, call.id)
    calls = _step_calls(sessions, call.id)
    by_name = {s.save_as: s for s in steps}
    made: list[ToolCall] = []
    for step in steps:
        deps = [by_name[str(d)] for d in step.depends_on]
        if step.status != PlanStepState.PLANNED or any(d.status != "ok" for d in deps):
            continue
        outputs = {d.save_as: calls[d.call_id or ""].output or "" for d in deps}
        try:
            tool_input = plan_graph.resolve(step.input, outputs)
        except plan_graph.BadReference as exc:
            _move(runner, call.id, step, PlanStepState.ERROR, str(exc))
            continue
        use = ToolUse(f"{call.tool_use_id}.{step.save_as}"[:100], step.tool, tool_input)
        planned = model_step.plan(runner, use, dict(offered))
        made_call = _store_step_call(sessions, call, step, planned)
        if made_call is not None:
            made.append(made_call)
            _announce(runner, call.id, step.save_as, PlanStepState.RUNNING, made_call.id, None)
    model_step.announce(runner, made)


def _store_step_call(
    sessions: store.Sessions, call: ToolCall, step: PlanStep, planned: store.PlannedCall
) -> ToolCall | None:
    """The step's call and its move to ``running``, in one transaction (None: another pass
    started it first)."""
    now = store.utcnow()
    final = planned.status not in OPEN_CALL_STATUSES
    made = ToolCall(
        id=new_id("call"),
        turn_id=call.turn_id,
        message_id=call.message_id,
        position=(call.position + 1) * STEP_POSITION_BASE + step.position,
        tool_use_id=planned.use.id,
        tool=planned.use.name,
        input=planned.use.input,
        status=planned.status,
        executor=planned.executor,
        timeout_s=planned.timeout_s,
        error=planned.error,
        output="",
        expires_at=now + timedelta(seconds=planned.decision_ttl_s)
        if planned.status == CallState.NEEDS_DECISION
        else None,
        finished_at=now if final else None,
        duration_ms=0 if final else None,
        plan_call_id=call.id,
    )
    with sessions() as s, s.begin():
        if not _changed(
            s,
            update(PlanStep)
            .where(PlanStep.id == step.id, PlanStep.status == PlanStepState.PLANNED)
            .values(status=PlanStepState.RUNNING, call_id=made.id),
        ):
            return None
        s.add(made)
    return made


def _finish(runner: TurnRunner, call: ToolCall, steps: Sequence[PlanStep]) -> None:
    """Every step ended: ``plan_finished``, then the plan call's one result."""
    calls = _step_calls(runner.rt.sessions, call.id)
    result: list[dict[str, Any]] = []
    for step in steps:
        done = calls.get(step.call_id or "")
        entry: dict[str, Any] = {"save_as": step.save_as, "tool": step.tool, "status": step.status}
        if done is not None and step.status == PlanStepState.OK:
            entry["output"] = done.output or ""
        error = step.error or (done.error if done is not None else None)
        if step.status != PlanStepState.OK:
            entry["error"] = error or f"the call ended {done.status if done else step.status}"
        result.append(entry)
    counts = Counter(str(s.status) for s in steps)
    # Announced before the call ends: a runner that dies between the two says it again
    # (the call not ended yet), rather than never.
    runner.emit("plan_finished", PlanFinished(call_id=call.id, steps=dict(counts)))
    runner.record(call, CallState.OK, json.dumps({"steps": result}, ensure_ascii=False), None)


def close(runner: TurnRunner, call: ToolCall, status: str) -> None:
    """The turn ends (``status``: cancelled, timed out, …) with the plan call still open: no
    step row stays ``planned`` or ``running``, and the plan is announced finished.

    Runs before the turn's open calls are recorded ``cancelled``: a step whose call already
    ended takes that end, one still running is ``cancelled``, one never started ``skipped``.
    A runner that dies here leaves the plan call open, and the next ``finish`` closes it again
    (the steps already moved are not announced twice).
    """
    calls = _step_calls(runner.rt.sessions, call.id)
    why = f"the turn ended ({status})"
    for step in _steps(runner.rt.sessions, call.id):
        if step.status == PlanStepState.PLANNED:
            _move(runner, call.id, step, PlanStepState.SKIPPED, f"skipped: {why}")
        elif step.status == PlanStepState.RUNNING:
            done = calls.get(step.call_id or "")
            if done is not None and done.status not in OPEN_CALL_STATUSES:
                _move(runner, call.id, step, step_status(done.status), done.error)
            else:
                _move(runner, call.id, step, PlanStepState.CANCELLED, why)
    steps = _steps(runner.rt.sessions, call.id)
    if steps:  # a plan that never started (refused, or not reached) has no steps to report
        counts = Counter(str(s.status) for s in steps)
        runner.emit("plan_finished", PlanFinished(call_id=call.id, steps=dict(counts)))
