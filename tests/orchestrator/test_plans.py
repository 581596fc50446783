"""``run_plan``: a plan of tool calls the orchestrator runs as a dependency graph, on real
Redis and SQL (scripted model, tool "workers" publishing on the real result stream).

Parallel branches go out together, and a step starts the moment its inputs are ready (a
slow branch does not hold back another); a step reads an earlier step's output through a
JSON path; a failed step skips what depends on it and the rest goes on; a bad plan is
refused before anything runs; a runner dying mid-plan is resumed without running a finished
step again; a cancel ends every step row; a step the policy holds for a human parks the
turn, which goes on after the decision.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from signalbox.services.orchestrator import plan_graph
from signalbox.services.orchestrator.builtin_tools import RUN_PLAN_DEF
from signalbox.services.orchestrator.demo_model import DemoModel
from signalbox.services.orchestrator.model import ModelRequest, ToolDef, ToolUse
from signalbox.services.orchestrator.transcript import load_messages
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.db.plans import PlanStep
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult
from tests.fake_anthropic import transcript_problems

from .support import Harness, RunnerDied, ok, say, spec, use


def _failing(req: ToolCallRequest) -> ToolResult:
    return ToolResult(call_id=req.call_id, status="error", output="", error="boom", duration_ms=1)


def _echo(req: ToolCallRequest) -> ToolResult:
    return ToolResult(call_id=req.call_id, status="ok", output=json.dumps(req.input), duration_ms=1)


def _plan_result(h: Harness) -> dict[str, Any]:
    """The plan's one tool_result, as the model's next request carried it."""
    blocks = [
        b
        for m in h.model.requests[-1].messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert len(blocks) == 1, "the model sees one result for the whole plan"
    content = blocks[0]["content"]
    text = content if isinstance(content, str) else "".join(c["text"] for c in content)
    result: dict[str, Any] = json.loads(text)
    return result


def _steps(h: Harness, turn_id: str) -> dict[str, PlanStep]:
    [plan_call] = [c for c in h.calls(turn_id) if c.tool == "run_plan"]
    with h.sessions() as s:
        return {p.save_as: p for p in s.query(PlanStep).filter_by(plan_call_id=plan_call.id)}


def test_a_plan_runs_branches_in_parallel_and_skips_what_a_failure_blocks(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("list_dir"), spec("read_file"), spec("broken"))
    listing = json.dumps({"items": [{"path": "a.txt"}, {"path": "b.txt"}]})
    h.dispatcher.tools.update({"list_dir": ok(listing), "read_file": _echo, "broken": _failing})
    plan = [
        {"save_as": "ls", "tool": "list_dir", "input": {"path": "."}},
        {"save_as": "bad", "tool": "broken", "input": {}},
        {
            "save_as": "first",
            "tool": "read_file",
            "input": {"path": "$steps.ls.output.items[0].path"},
        },
        {"save_as": "after_bad", "tool": "read_file", "input": {"path": "$steps.bad.output"}},
        {"save_as": "chain", "tool": "read_file", "input": {"note": "saw $steps.after_bad.output"}},
        {"save_as": "both", "tool": "read_file", "input": {"a": "$steps.first.output", "n": 1}},
    ]
    h.model.steps = [say("Planning.", use("run_plan", steps=plan)), say("Done.")]
    turn_id = h.turn("plan it")

    assert h.run(turn_id) == "completed"

    assert len(h.model.requests) == 2, "the whole plan took one model step"
    first_batch = {r.tool for r in h.dispatcher.sent[:2]}
    assert first_batch == {"list_dir", "broken"}, "independent steps went out together"
    steps = {s["save_as"]: s for s in _plan_result(h)["steps"]}
    assert {k: v["status"] for k, v in steps.items()} == {
        "ls": "ok",
        "bad": "error",
        "first": "ok",
        "after_bad": "skipped",
        "chain": "skipped",
        "both": "ok",
    }
    assert json.loads(steps["first"]["output"]) == {"path": "a.txt"}, "the JSON path was read"
    assert json.loads(json.loads(steps["both"]["output"])["a"]) == {"path": "a.txt"}
    assert "boom" in steps["bad"]["error"]
    assert "'bad' ended error" in steps["after_bad"]["error"]

    [started] = h.data("plan_started")
    deps = {s["save_as"]: (s["depends_on"], s["level"]) for s in started["steps"]}
    assert deps["first"] == (["ls"], 1) and deps["chain"] == (["after_bad"], 2)
    moves = [(e["save_as"], e["status"]) for e in h.data("plan_step")]
    assert moves.index(("ls", "ok")) < moves.index(("first", "running"))
    assert ("after_bad", "skipped") in moves and ("chain", "skipped") in moves
    assert not any(s == "after_bad" and st == "running" for s, st in moves), "never ran"
    [finished] = h.data("plan_finished")
    assert finished["steps"] == {"ok": 3, "error": 1, "skipped": 2}
    # Each step was a real call of the turn, with its own events.
    step_calls = [c for c in h.calls(turn_id) if c.plan_call_id is not None]
    assert sorted(c.tool for c in step_calls) == ["broken", "list_dir", "read_file", "read_file"]
    ran = {e["call_id"] for e in h.data("tool_call_finished")}
    assert {c.id for c in step_calls} <= ran


@pytest.mark.parametrize(
    ("steps", "why"),
    [
        (
            [
                {"save_as": "a", "tool": "read_file", "input": {"p": "$steps.b.output"}},
                {"save_as": "b", "tool": "read_file", "input": {"p": "$steps.a.output"}},
            ],
            "cycle",
        ),
        ([{"save_as": "a", "tool": "read_file", "input": {"p": "$steps.z.output"}}], "no step"),
        ([{"save_as": "a", "tool": "rm_rf", "input": {}}], "'rm_rf', which a plan cannot run"),
        ([{"save_as": "a", "tool": "ask_user", "input": {}}], "which a plan cannot run"),
        (
            [
                {"save_as": "a", "tool": "read_file", "input": {}},
                {"save_as": "a", "tool": "read_file", "input": {}},
            ],
            "save_as used twice",
        ),
        ([{"save_as": "a", "tool": "read_file", "input": {"p": "$steps.a.outptu"}}], "bad ref"),
        ([{"save_as": f"s{i}", "tool": "read_file", "input": {}} for i in range(33)], "at most"),
    ],
)
def test_a_bad_plan_is_refused_before_anything_runs(
    harness: Harness, steps: list[dict[str, Any]], why: str
) -> None:
    h = harness
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok()
    h.model.steps = [say("Planning.", use("run_plan", steps=steps)), say("Sorry.")]
    turn_id = h.turn("plan it")

    assert h.run(turn_id) == "completed"

    [call] = h.calls(turn_id)
    assert call.tool == "run_plan" and call.status == "error"
    assert why in (call.error or "")
    assert h.dispatcher.sent == [], "nothing ran"
    assert h.data("plan_started") == []


def test_a_runner_dying_mid_plan_resumes_without_running_a_finished_step(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("fetch"), spec("digest"))

    send = h.dispatcher.send

    def send_then_die_at_the_second_level(calls: Any) -> None:
        h.dispatcher.die_after_send = h.dispatcher.sends == 1
        send(calls)

    h.dispatcher.send = send_then_die_at_the_second_level  # type: ignore[method-assign]
    h.dispatcher.tools.update({"fetch": ok("page"), "digest": _echo})
    plan = [
        {"save_as": "page", "tool": "fetch", "input": {"url": "u"}},
        {"save_as": "sum", "tool": "digest", "input": {"text": "$steps.page.output"}},
    ]
    h.model.steps = [say("Planning.", use("run_plan", steps=plan)), say("Done.")]
    turn_id = h.turn("plan it")
    with pytest.raises(RunnerDied):
        h.run(turn_id)
    assert {k: v.status for k, v in _steps(h, turn_id).items()} == {
        "page": "ok",
        "sum": "running",
    }

    assert h.run(turn_id) == "completed"

    fetched = [c for c in h.calls(turn_id) if c.tool == "fetch"]
    assert len(fetched) == 1 and h.dispatcher.runs.count(fetched[0].id) == 1, "ran once"
    result = {s["save_as"]: s for s in _plan_result(h)["steps"]}
    assert result["sum"]["status"] == "ok"
    assert json.loads(result["sum"]["output"]) == {"text": "page"}
    assert len(h.data("plan_started")) == 1


def test_a_step_the_policy_denies_skips_its_dependents(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("read_file"), spec("delete_all", mode="deny"))
    h.dispatcher.tools.update({"read_file": _echo, "delete_all": ok()})
    plan = [
        {"save_as": "rm", "tool": "delete_all", "input": {}},
        {"save_as": "then", "tool": "read_file", "input": {"x": "$steps.rm.output"}},
        {"save_as": "other", "tool": "read_file", "input": {"x": 1}},
    ]
    h.model.steps = [say("Planning.", use("run_plan", steps=plan)), say("Done.")]
    turn_id = h.turn("plan it")

    assert h.run(turn_id) == "completed"

    result = {s["save_as"]: s["status"] for s in _plan_result(h)["steps"]}
    assert result == {"rm": "error", "then": "skipped", "other": "ok"}
    assert "delete_all" not in {r.tool for r in h.dispatcher.sent}


def test_references_resolve_whole_values_and_inside_text() -> None:
    outputs = {"a": json.dumps({"n": 3, "xs": ["p", "q"]}), "t": "plain"}
    got = plan_graph.resolve(
        {"n": "$steps.a.output.n", "s": "x=$steps.a.output.xs[1] t=$steps.t.output"}, outputs
    )
    assert got == {"n": 3, "s": "x=q t=plain"}
    with pytest.raises(plan_graph.BadReference):
        plan_graph.resolve("$steps.t.output.key", outputs)
    with pytest.raises(plan_graph.BadReference):
        plan_graph.resolve("$steps.a.output.xs[5]", outputs)


def test_the_demo_model_answers_a_request_for_a_plan_with_a_valid_run_plan() -> None:
    tools = [ToolDef(n, n, {"type": "object"}) for n in ("list_dir", "search_files", "write_file")]
    request = ModelRequest(
        system="",
        messages=[{"role": "user", "content": "make a plan"}],
        tools=[*tools, RUN_PLAN_DEF],
    )
    [call] = [e for e in DemoModel().stream(request) if isinstance(e, ToolUse)]

    assert call.name == "run_plan"
    graph = plan_graph.check(call.input, ["list_dir", "search_files", "write_file"])
    assert [(s.save_as, s.level) for s in graph] == [("ls", 0), ("todos", 0), ("notes", 1)]


def test_a_dependent_of_a_fast_step_starts_while_a_slow_branch_still_runs(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("slow", timeout_s=30), spec("fast"), spec("mark"))
    dependent_ran = threading.Event()

    def slow(req: ToolCallRequest) -> ToolResult:
        # Ends only once the fast branch's dependent ran (or 10 s passed): a level-by-level
        # scheduler, which waits for this step before starting that one, fails the test.
        saw = dependent_ran.wait(timeout=10)
        return ToolResult(call_id=req.call_id, status="ok", output=f"saw={saw}", duration_ms=1)

    def mark(req: ToolCallRequest) -> ToolResult:
        if req.input.get("x") == "quick":
            dependent_ran.set()
        return _echo(req)

    h.dispatcher.tools.update({"slow": slow, "fast": ok("quick"), "mark": mark})
    plan = [
        {"save_as": "slow", "tool": "slow", "input": {}},
        {"save_as": "fast", "tool": "fast", "input": {}},
        {"save_as": "after_fast", "tool": "mark", "input": {"x": "$steps.fast.output"}},
        {"save_as": "after_slow", "tool": "mark", "input": {"x": "$steps.slow.output"}},
    ]
    h.model.steps = [say("Planning.", use("run_plan", steps=plan)), say("Done.")]
    turn_id = h.turn("plan it")

    assert h.run(turn_id) == "completed"

    steps = {s["save_as"]: s for s in _plan_result(h)["steps"]}
    assert {k: v["status"] for k, v in steps.items()} == dict.fromkeys(steps, "ok")
    assert steps["slow"]["output"] == "saw=True", "the dependent ran while the slow step ran"
    moves = [(e["save_as"], e["status"]) for e in h.data("plan_step")]
    assert moves.index(("after_fast", "running")) < moves.index(("slow", "ok"))
    assert moves.index(("slow", "ok")) < moves.index(("after_slow", "running"))


def test_a_cancel_mid_plan_ends_every_step_row_and_the_plan(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("hang", timeout_s=30), spec("mark"))
    started = threading.Event()

    def hang(req: ToolCallRequest) -> None:
        started.set()  # its worker never reports: only the cancel ends this call

    h.dispatcher.tools.update({"hang": hang, "mark": _echo})
    plan = [
        {"save_as": "wait", "tool": "hang", "input": {}},
        {"save_as": "then", "tool": "mark", "input": {"x": "$steps.wait.output"}},
    ]
    h.model.steps = [say("Planning.", use("run_plan", steps=plan)), say("unused")]
    turn_id = h.turn("plan it")

    def cancel_once_the_step_runs() -> None:
        assert started.wait(timeout=10), "the step never started"
        with h.sessions() as s, s.begin():
            s.get(Turn, turn_id).cancel_requested = True  # type: ignore[union-attr]

    canceller = threading.Thread(target=cancel_once_the_step_runs)
    canceller.start()
    assert h.run(turn_id) == "cancelled"
    canceller.join()

    assert {k: v.status for k, v in _steps(h, turn_id).items()} == {
        "wait": "cancelled",
        "then": "skipped",
    }
    [finished] = h.data("plan_finished")
    assert finished["steps"] == {"cancelled": 1, "skipped": 1}
    kinds = h.kinds()
    assert kinds.index("plan_finished") < kinds.index("turn_finished")
    assert {c.tool: c.status for c in h.calls(turn_id)} == {
        "run_plan": "cancelled",
        "hang": "cancelled",
    }
    # The transcript the model would see next is valid: one tool_use, its one result.
    with h.sessions() as s:
        messages = load_messages(s, h.conversation_id)
    assert transcript_problems(messages) == []
    [plan_use] = [b for m in messages for b in m["content"] if b.get("type") == "tool_use"]
    assert plan_use["name"] == "run_plan"


def test_a_step_the_policy_holds_parks_the_turn_until_a_human_decides(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("read_file"), spec("run_python", mode="confirm"))
    h.dispatcher.tools.update({"read_file": ok("print(1)"), "run_python": _echo})
    plan = [
        {"save_as": "src", "tool": "read_file", "input": {"path": "a.py"}},
        {"save_as": "run", "tool": "run_python", "input": {"code": "$steps.src.output"}},
        {"save_as": "log", "tool": "read_file", "input": {"path": "$steps.run.output.code"}},
    ]
    h.model.steps = [say("Planning.", use("run_plan", steps=plan)), say("Done.")]
    turn_id = h.turn("plan it")

    assert h.run(turn_id) == "parked"

    [asked] = h.data("tool_call_needs_decision")
    assert {k: v.status for k, v in _steps(h, turn_id).items()} == {
        "src": "ok",
        "run": "running",
        "log": "planned",
    }
    assert "run_python" not in {r.tool for r in h.dispatcher.sent}, "nothing ran undecided"
    with h.sessions() as s, s.begin():
        held = s.get(ToolCall, asked["call_id"])
        assert held is not None and held.input == {"code": "print(1)"}, "the input resolved"
        held.decision = "allow"

    assert h.run(turn_id) == "completed"

    result = {s["save_as"]: s for s in _plan_result(h)["steps"]}
    assert {k: v["status"] for k, v in result.items()} == {"src": "ok", "run": "ok", "log": "ok"}
    reads = [c for c in h.calls(turn_id) if c.tool == "read_file"]
    assert [h.dispatcher.runs.count(c.id) for c in reads] == [1, 1], "no step ran twice"
    assert len(h.data("plan_started")) == 1 and len(h.data("plan_finished")) == 1
