"""A ``run_plan`` plan survives its orchestrator's death, with real processes.

The chaos deployment (``conftest.chaos``: gateway, proposals, 2 orchestrators, 2 tool
workers, private Redis and SQLite, the fake Messages API). The model submits a plan of
``count_calls`` steps (each counts its real executions in Redis); the orchestrator running
it is SIGKILLed while one step is in flight and another has finished, a new orchestrator
process is started, and the plan finishes with every step run exactly once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from signalbox.services.orchestrator.lease import holder_pid
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.db.models import ToolCall
from signalbox.shared.db.plans import PlanStep
from tests.fake_anthropic import text, tool_use

from .conftest import LEASE_S, Chaos, Client, event, wait_for

# Kill → turn_resumed: the lease runs out, then a sweep or Celery's redelivery enqueues it.
PICK_UP_S = 2 * LEASE_S + 2.0


@pytest.fixture
def user(chaos: Chaos) -> Iterator[Client]:
    chaos.ensure_up()
    _user_id, token = chaos.new_user()
    client = Client(chaos, token)
    yield client
    client.close()


def _count(chaos: Chaos, key: str) -> int:
    return int(chaos.redis.get(counter_key(chaos.keys, key)) or 0)


def test_an_orchestrator_killed_mid_plan_resumes_it_without_running_a_step_twice(
    chaos: Chaos, user: Client
) -> None:
    marker = f"plan-{uuid.uuid4().hex[:8]}"
    quick, slow = uuid.uuid4().hex, uuid.uuid4().hex
    plan: list[dict[str, Any]] = [
        {"save_as": "quick", "tool": "count_calls", "input": {"key": quick}},
        # In flight at the kill: not idempotent, so it must never be sent again.
        {"save_as": "slow", "tool": "count_calls", "input": {"key": slow, "hold_s": 2.5}},
        # Counted under "<key>-<count>": the reference resolved to the dependency's output.
        {
            "save_as": "after_quick",
            "tool": "count_calls",
            "input": {"key": f"{quick}-$steps.quick.output"},
        },
        {
            "save_as": "after_slow",
            "tool": "count_calls",
            "input": {"key": f"{slow}-$steps.slow.output"},
        },
    ]
    chaos.fake.script_for(
        marker,
        [[text("A plan."), tool_use("run_plan", {"steps": plan})], [text("All done.")]],
    )
    ack = user.request({"type": "user_turn", "text": f"please work on {marker}"})
    assert ack["type"] == "ack", ack
    turn_id = ack["turn_id"]
    user.wait(event("plan_step", turn_id, save_as="after_quick", status="ok"), what="a step done")
    wait_for(lambda: _count(chaos, slow) == 1, what="the slow step to run")
    pid = wait_for(lambda: holder_pid(chaos.redis.get(chaos.keys.turn_lease(turn_id))))
    runner = chaos.child_of_pid(pid)

    chaos.kill(runner)
    chaos.start(runner)  # a new orchestrator process (the other one may take the turn first)

    user.wait(event("turn_resumed", turn_id), timeout_s=PICK_UP_S + 30, what="turn_resumed")
    done = user.wait(event("turn_finished", turn_id), what="turn_finished")

    assert done["data"]["status"] == "completed", done
    counts = {k: _count(chaos, k) for k in (quick, slow, f"{quick}-1", f"{slow}-1")}
    assert counts == dict.fromkeys(counts, 1), f"every step ran exactly once: {counts}"
    with chaos.sessions() as s:
        steps = {
            p.save_as: p.status
            for p in s.scalars(
                select(PlanStep)
                .join(ToolCall, ToolCall.id == PlanStep.plan_call_id)
                .where(ToolCall.turn_id == turn_id)
            )
        }
        calls = s.scalars(select(ToolCall).where(ToolCall.turn_id == turn_id)).all()
    assert steps == dict.fromkeys(["quick", "slow", "after_quick", "after_slow"], "ok")
    assert sorted((c.tool, c.status, c.attempts) for c in calls) == [
        *[("count_calls", "ok", 1)] * 4,
        ("run_plan", "ok", 1),
    ]
    kinds = user.kinds(turn_id)
    assert kinds.count("plan_started") == 1, "the plan was not started again"
    assert kinds.count("tool_call_started") == 5, "no step call was sent twice"
    [finished] = [e for e in user.of(turn_id) if e["kind"] == "plan_finished"]
    assert finished["data"]["steps"] == {"ok": 4}
    final = [r.body for r in chaos.fake.requests if marker in json.dumps(r.body["messages"])][-1]
    [result] = [b for b in final["messages"][-1]["content"] if b["type"] == "tool_result"]
    content = result["content"]
    body = content if isinstance(content, str) else "".join(c["text"] for c in content)
    assert [s["status"] for s in json.loads(body)["steps"]] == ["ok"] * 4
