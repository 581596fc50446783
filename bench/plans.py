"""``run_plan`` against the same work as model steps: model requests saved and wall time.

The work: 12 tool calls in 3 levels of 4, each call of a level waiting for one of the
level before (its input refers to that output). As a plan it is one model step that calls
``run_plan`` and one that answers (2 requests); without a plan the model calls each level
in a step of its own and answers after (4 requests). Both run Signalbox's own loop
(``run_turn``) in this process on the same Redis and SQL, the tools (the test ``sleep``,
instant) run in threads publishing on the turn's result stream like tool workers
(``bench.turns.in_process_runtime``). The model is in-process too and takes
``MODEL_STEP_S`` per request: a stand-in for a real model's latency, which is what a plan
saves; the same comparison with an instant model shows what the plan's own bookkeeping
costs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from bench.environment import BenchEnv
from bench.stats import Result, Series
from bench.turns import TimedEvents, in_process_runtime, queued_turn, stop_runtime
from signalbox.services.orchestrator.loop import run_turn
from signalbox.services.orchestrator.model import (
    ModelEvent,
    ModelRequest,
    StepEnd,
    TextDelta,
    ToolUse,
)
from signalbox.shared.ids import new_id

LEVELS = 3
PER_LEVEL = 4
MODEL_STEP_S = 0.5  # a stand-in for one real model request (the API's are ~1-10 s)


def plan_steps() -> list[dict[str, Any]]:
    """The 12 steps: level n's step i refers to level n-1's step i."""
    steps = []
    for level in range(LEVELS):
        for i in range(PER_LEVEL):
            tool_input: dict[str, Any] = {"seconds": 0}
            if level:
                tool_input["count_key"] = f"$steps.l{level - 1}_{i}.output"
            steps.append({"save_as": f"l{level}_{i}", "tool": "sleep", "input": tool_input})
    return steps


class LatencyModel:
    """A scripted model taking ``step_s`` per request: the plan, or a level per step."""

    def __init__(self, use_plan: bool, step_s: float) -> None:
        self.use_plan = use_plan
        self.step_s = step_s
        self.requests = 0

    @property
    def name(self) -> str:
        """Reported in ``turn_started``."""
        return "bench-latency"

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        """The next step of the turn after ``step_s``."""
        self.requests += 1
        time.sleep(self.step_s)
        step = sum(1 for m in request.messages if m["role"] == "assistant")
        if self.use_plan and step == 0:
            yield TextDelta("plan")
            yield ToolUse(new_id("toolu"), "run_plan", {"steps": plan_steps()})
            yield StepEnd("tool_use", 11, 7)
        elif not self.use_plan and step < LEVELS:
            yield TextDelta(f"level {step}")
            for i in range(PER_LEVEL):
                tool_input: dict[str, Any] = {"seconds": 0}
                if step:
                    tool_input["count_key"] = f"level{step - 1}_{i}"  # the model copies it
                yield ToolUse(new_id("toolu"), "sleep", tool_input)
            yield StepEnd("tool_use", 11, 7)
        else:
            yield TextDelta("done")
            yield StepEnd("end_turn", 11, 7)


def _one(env: BenchEnv, user_id: str, use_plan: bool, step_s: float) -> tuple[float, int]:
    """One turn: wall seconds to ``turn_finished`` and model requests made."""
    runtime = in_process_runtime(env)
    model = LatencyModel(use_plan, step_s)
    runtime = replace(runtime, model=model)
    timed = runtime.events
    assert isinstance(timed, TimedEvents)
    turn_id = queued_turn(env, user_id)
    try:
        started = time.perf_counter()
        outcome = run_turn(runtime, turn_id)
    finally:  # its approvals feed's thread (it was left running: one per turn, to the end)
        stop_runtime(runtime)
    if outcome != "completed" or timed.finished_at is None:
        raise RuntimeError(f"plans: the turn ended {outcome!r}")
    return timed.finished_at - started, model.requests


def plans(env: BenchEnv, rounds: int, warmup: int) -> list[Result]:
    """The plan vs the same calls as model steps, with a model of ``MODEL_STEP_S``, then
    with an instant one."""
    user_id, _token = env.user()
    results: list[Result] = []
    for step_s, suffix in ((MODEL_STEP_S, ""), (0.0, "_instant_model")):
        planned: list[float] = []
        stepped: list[float] = []
        requests = {True: 0, False: 0}
        for i in range(warmup + rounds):
            plan_s, requests[True] = _one(env, user_id, True, step_s)
            steps_s, requests[False] = _one(env, user_id, False, step_s)
            if i >= warmup:
                planned.append(plan_s * 1000)
                stepped.append(steps_s * 1000)
        measured = Series("run_plan (12 calls, 3 levels)", planned)
        baseline = Series(f"{LEVELS} tool steps of {PER_LEVEL} calls", stepped)
        results.append(
            Result(
                id=f"plans{suffix}",
                what=f"{LEVELS * PER_LEVEL} instant calls in {LEVELS} dependent levels: one "
                f"run_plan vs a model step per level, model {step_s * 1000:g} ms per request",
                measured=measured,
                baseline=baseline,
                target="fewer model requests; less wall time when a request costs time",
                met=requests[True] < requests[False]
                and (step_s == 0 or measured.median < baseline.median),
                extra={
                    "model_requests_plan": requests[True],
                    "model_requests_steps": requests[False],
                    "model_requests_saved": requests[False] - requests[True],
                    "saved_ms_median": round(baseline.median - measured.median, 3),
                },
                notes=[
                    "In-process loop, real Redis and SQL; the tools run in threads and publish "
                    "on the result stream as tool workers do. The model's latency is a sleep.",
                ],
            )
        )
    return results
