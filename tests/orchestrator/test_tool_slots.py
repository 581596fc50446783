"""The per-user limit on tool calls in flight (services/orchestrator/tool_slots.py): a
step's calls past the limit wait, pending, and go out as slots free; slots are shared by
all of a user's turns, and a dead runner's slots end at their calls' deadlines."""

from __future__ import annotations

import threading
import time
from datetime import datetime

from signalbox.services.orchestrator.tool_slots import ToolSlots
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult

from .support import Harness, say, spec, use

HOLD_S = 0.1  # each call's own work
WAIT_S = 30.0  # a deadline to wait for, generous for a loaded machine


def test_a_steps_calls_past_the_limit_wait_for_a_slot(harness: Harness) -> None:
    h = harness
    rt = h.runtime
    rt.tool_slots = ToolSlots(rt.redis, rt.keys, limit=2)
    lock = threading.Lock()
    running = peak = arrived = 0
    # The first two calls to arrive wait for each other inside their work: two in flight at
    # once, however slow the machine, and a third sent past the limit would find both busy.
    first_two = threading.Barrier(2)

    def work(req: ToolCallRequest) -> ToolResult:
        nonlocal running, peak, arrived
        with lock:
            running += 1
            peak = max(peak, running)
            arrived += 1
            meets = arrived <= 2
        if meets:
            first_two.wait(WAIT_S)
        threading.Event().wait(HOLD_S)  # the tool's own work, not a synchronisation
        with lock:
            running -= 1
        return ToolResult(call_id=req.call_id, status="ok", output="done", duration_ms=1)

    h.catalogue(spec("work", timeout_s=WAIT_S))
    h.dispatcher.tools["work"] = work
    h.model.steps = [say("Five at once.", *(use("work") for _ in range(5))), say("Done.")]

    assert h.run(h.turn("go")) == "completed"

    assert peak == 2, "never more than the user's two calls in flight"
    finished = [e.data for e in h.events() if e.kind == "tool_call_finished"]
    assert [f["status"] for f in finished] == ["ok"] * 5
    assert h.dispatcher.sends >= 3, "the held calls went out as slots freed"
    assert not rt.redis.exists(rt.keys.user_tool_slots(h.user_id)), "every slot given back"


def test_slots_are_shared_by_a_users_turns_and_a_dead_runners_run_out(
    harness: Harness,
) -> None:
    h = harness
    rt = h.runtime
    slots = rt.tool_slots = ToolSlots(rt.redis, rt.keys, limit=1)
    # Another turn of the user holds the one slot; its runner died, so the slot is freed
    # only at that call's deadline: far off while the test checks that it holds the slot,
    # then moved to half a second from now (in Redis, the slot's score).
    dead = "call_of_a_dead_runner"
    assert slots.take(h.user_id, [(dead, time.time() + 600)]) == {dead}
    assert slots.take(h.user_id, [("call_next", time.time() + 600)]) == set()
    other_deadline = time.time() + 0.5
    slots_key = rt.keys.user_tool_slots(h.user_id)
    assert rt.redis.zadd(slots_key, {dead: other_deadline}, xx=True, ch=True) == 1
    h.catalogue(spec("fast"))
    h.dispatcher.tools["fast"] = lambda req: ToolResult(
        call_id=req.call_id, status="ok", output="x", duration_ms=1
    )
    h.model.steps = [say("One.", use("fast")), say("Done.")]

    assert h.run(h.turn("go")) == "completed"

    started = [
        datetime.fromisoformat(e.ts.replace("Z", "+00:00"))
        for e in h.events()
        if e.kind == "tool_call_started"
    ]
    assert len(started) == 1
    assert started[0].timestamp() >= other_deadline - 0.01, "it waited for the slot"
    # Another user is not limited by this one's slots.
    assert slots.take("user_someone_else", [("call_x", time.time() + 5)]) == {"call_x"}
