"""Durability rules of the orchestrator in-process (tests/chaos proves them with real
processes): idempotent calls sent again, the poison-message bound, the reconciler after
Redis lost its data, and stale queued turns."""

from __future__ import annotations

from datetime import timedelta

from signalbox.services.orchestrator import deliveries
from signalbox.services.orchestrator.lease import holder_pid
from signalbox.services.orchestrator.recovery import Reconciler
from signalbox.services.orchestrator.store import utcnow
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult

from .support import Harness, ok, say, spec, use


def test_an_idempotent_call_whose_worker_vanished_is_sent_again(harness: Harness) -> None:
    h = harness
    attempts: list[str] = []

    def flaky(req: ToolCallRequest) -> ToolResult | None:
        attempts.append(req.call_id)
        if len(attempts) == 1:
            return None  # the first worker dies without a word
        return ToolResult(call_id=req.call_id, status="ok", output="second time", duration_ms=1)

    # The first attempt is lost at its deadline (3 s + 0.2 s grace), the one sent again has
    # as long to answer: seconds to spare for a result published at once, however loaded.
    h.catalogue(spec("lookup", timeout_s=3.0, idempotent=True), spec("fast"))
    h.dispatcher.tools.update({"lookup": flaky, "fast": ok()})
    h.model.steps = [say("Look.", use("lookup"), use("fast")), say("Done.")]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "completed"

    assert len(attempts) == 2 and attempts[0] == attempts[1], "the same call, sent twice"
    finished = {e.data["tool"]: e.data for e in h.events() if e.kind == "tool_call_finished"}
    assert finished["lookup"]["status"] == "ok" and finished["lookup"]["output"] == "second time"
    with h.sessions() as s:
        call = s.query(ToolCall).filter_by(turn_id=turn_id, tool="lookup").one()
        assert call.attempts == 2


def test_a_turn_whose_runs_kept_dying_is_failed_not_run(harness: Harness) -> None:
    h = harness
    rt = h.runtime
    turn_id = h.turn("poison")
    limit = rt.settings.max_turn_deliveries
    for _ in range(limit):  # runs that took the lease and never came back
        deliveries.count_start(rt.redis, rt.keys, turn_id)

    assert h.run(turn_id) == "failed"

    assert h.model.requests == [], "the poison turn never reached the model again"
    done = [e.data for e in h.events() if e.kind == "turn_finished"]
    assert done[0]["status"] == "failed"
    assert f"given up after {limit} deliveries" in done[0]["error"]
    assert not rt.redis.exists(rt.keys.turn_deliveries(turn_id))


def test_a_run_that_returns_clears_its_delivery_count(harness: Harness) -> None:
    h = harness
    rt = h.runtime
    turn_id = h.turn("fine")
    deliveries.count_start(rt.redis, rt.keys, turn_id)  # one earlier run died
    h.model.steps = [say("Hello.")]

    assert h.run(turn_id) == "completed"

    assert not rt.redis.exists(rt.keys.turn_deliveries(turn_id))


def test_the_lease_names_its_holder() -> None:
    assert holder_pid("vm:1234:abcdef") == 1234
    assert holder_pid(b"host:99:x") == 99
    assert holder_pid("garbage") is None and holder_pid(None) is None


def test_after_redis_lost_its_data_the_reconciler_adopts_unfinished_turns(
    harness: Harness,
) -> None:
    h = harness
    rt = h.runtime
    running, queued = h.turn("a", seq=1), h.turn("b", seq=2)
    with h.sessions() as s, s.begin():
        turn = s.get(Turn, running)
        assert turn is not None
        turn.status = "running"
    enqueued: list[str] = []
    reconciler = Reconciler(h.sessions, rt.redis, rt.keys, enqueued.append, 60)
    reconciler.start()
    reconciler.stop()
    assert reconciler.sweep() == [], "no stream under this prefix: not this deployment's"

    rt.redis.delete(rt.keys.deployment_epoch())  # what a restart without data looks like
    found = reconciler.sweep()

    assert running in found, "a running turn without a lease is adopted"
    assert queued not in found, "a queued turn behind an unfinished one waits its turn"
    assert running not in reconciler.sweep(), "adopted once, on the loss"
    with h.sessions() as s, s.begin():  # other tests share the database: leave no orphans
        for turn_id in (running, queued):
            row = s.get(Turn, turn_id)
            assert row is not None
            row.status = "failed"


def test_a_stale_queued_turn_is_enqueued_again_once_per_period(harness: Harness) -> None:
    h = harness
    rt = h.runtime
    turn_id = h.turn("lost message")
    rt.events.append(h.conversation_id, "turn_queued", {"text": "lost message"}, turn_id)
    enqueued: list[str] = []
    reconciler = Reconciler(h.sessions, rt.redis, rt.keys, enqueued.append, 60, 30)
    with h.sessions() as s, s.begin():
        row = s.get(Turn, turn_id)
        assert row is not None
        row.created_at = utcnow() - timedelta(seconds=60)
    assert turn_id not in reconciler.sweep(), "not admitted: it has no message to lose"
    with h.sessions() as s, s.begin():
        row = s.get(Turn, turn_id)
        assert row is not None
        row.admitted_at = utcnow()
    assert turn_id not in reconciler.sweep(), "admitted a moment ago: its message is on its way"
    with h.sessions() as s, s.begin():
        row = s.get(Turn, turn_id)
        assert row is not None
        row.admitted_at = utcnow() - timedelta(seconds=60)

    assert turn_id in reconciler.sweep()
    assert turn_id not in reconciler.sweep(), "one re-enqueue per period"
    with h.sessions() as s, s.begin():
        row = s.get(Turn, turn_id)
        assert row is not None
        row.status = "failed"


def test_the_reconciler_admits_a_turn_whose_admission_was_lost(harness: Harness) -> None:
    """A gateway that stored a turn and died before its admission pass (or an orchestrator
    that freed a slot and died before its pass): the next sweep admits and enqueues it."""
    h = harness
    rt = h.runtime
    h.model.steps = [say("Done.")]
    turn_id = h.turn("stored, never admitted")
    enqueued: list[str] = []
    rt.enqueue_turn = enqueued.append
    reconciler = Reconciler(
        h.sessions, rt.redis, rt.keys, enqueued.append, 60, admit=rt.admit_waiting_turns
    )
    assert turn_id in reconciler.sweep()
    assert enqueued == [turn_id]
    assert h.run(turn_id) == "completed"
