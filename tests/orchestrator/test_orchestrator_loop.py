"""The turn state machine in-process, on real Redis and SQL: scripted model, threads as tools."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, select, update

from signalbox.processes import wait_until
from signalbox.services.orchestrator import loop, recovery, store
from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.cancel_watch import CancelWatch
from signalbox.services.orchestrator.lease import TurnLease
from signalbox.services.orchestrator.model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    StepEnd,
    TextDelta,
)
from signalbox.services.orchestrator.recovery import Reconciler
from signalbox.shared.db.models import Message, ToolCall, Turn, now
from signalbox.shared.tool_contract import ToolResult, publish_result
from tests.fake_anthropic import FakeAnthropic, stream_error, text, tool_use, transcript_problems

from .support import Harness, RunnerDied, ok, say, silent, spec, use, wait_for

WAIT_S = 30.0  # a deadline to wait for, generous for a loaded machine


def _turn(h: Harness, turn_id: str) -> Turn:
    with h.sessions() as s:
        turn = s.get(Turn, turn_id)
        assert turn is not None
        return turn


def test_parallel_calls_then_answer_completes_the_turn(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("list_dir"), spec("read_file"))
    h.dispatcher.tools.update({"list_dir": ok("a.txt\nb.txt"), "read_file": ok("hello")})
    first, second = use("list_dir", path="."), use("read_file", path="a.txt")
    h.model.steps = [say("Looking around.", first, second), say("All done.")]
    turn_id = h.turn("look around")

    assert h.run(turn_id) == "completed"

    kinds = h.kinds()
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_finished"
    assert kinds.count("tool_call_started") == 2
    last_start = max(i for i, k in enumerate(kinds) if k == "tool_call_started")
    first_finish = kinds.index("tool_call_finished")
    assert last_start < first_finish, "both calls start before either finishes"
    assert h.dispatcher.sends == 1, "one group per step"
    texts = "".join(d["text"] for d in h.data("text_delta"))
    assert texts == "Looking around.All done."
    assert [d["text"] for d in h.data("assistant_message")] == ["Looking around.", "All done."]
    finished = h.data("turn_finished")[0]
    assert finished["status"] == "completed" and finished["steps"] == 2
    assert finished["usage"] == {
        "input_tokens": 20,
        "output_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cost_usd": 0.00014,  # 20 input at $2, 10 output at $10 per million (the default model)
    }
    turn = _turn(h, turn_id)
    assert (turn.status, turn.step, turn.input_tokens) == ("completed", 2, 20)
    assert [c.status for c in h.calls(turn_id)] == ["ok", "ok"]

    # The second step saw both results, in order, as a valid transcript.
    messages = h.model.requests[1].messages
    assert transcript_problems(messages) == []
    results = [b for b in messages[-1]["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [first.id, second.id]
    assert [r["content"] for r in results] == ["a.txt\nb.txt", "hello"]
    offered = {t.name for t in h.model.requests[0].tools}
    assert offered == {"list_dir", "read_file", "ask_user", "spawn_agent", "run_plan", "alarm"}


def test_a_call_without_result_is_lost_at_its_deadline_and_the_others_keep_theirs(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("fast"), spec("vanishing", timeout_s=0.3))
    h.dispatcher.tools.update({"fast": ok("quick"), "vanishing": silent()})
    h.model.steps = [say("Two calls.", use("fast"), use("vanishing")), say("Noted.")]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "completed"

    statuses = {d["tool"]: d["status"] for d in h.data("tool_call_finished")}
    assert statuses == {"fast": "ok", "vanishing": "lost"}
    results = h.model.requests[1].messages[-1]["content"]
    lost = next(b for b in results if b.get("is_error"))
    assert "vanished" in lost["content"]
    assert transcript_problems(h.model.requests[1].messages) == []


def test_an_unknown_tool_gets_an_error_result_and_is_not_dispatched(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("list_dir"))
    h.model.steps = [say("Trying.", use("nope", x=1)), say("That tool does not exist.")]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "completed"

    [finished] = h.data("tool_call_finished")
    assert (finished["status"], finished["error"]) == ("error", "unknown tool 'nope'")
    assert h.dispatcher.sent == []
    assert "unknown tool 'nope'" in json.dumps(h.model.requests[1].messages[-1])


def test_the_step_limit_ends_a_turn_that_keeps_calling_tools(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("list_dir"))
    h.dispatcher.tools["list_dir"] = ok()
    h.model.steps = [say("again", use("list_dir")) for _ in range(10)]
    turn_id = h.turn("loop forever")

    assert h.run(turn_id) == "step_limit"

    finished = h.data("turn_finished")[0]
    assert (finished["status"], finished["steps"]) == ("step_limit", 4)
    assert len(h.model.requests) == 4


def test_a_model_error_fails_the_turn_with_the_error(harness: Harness) -> None:
    harness.model.steps = [ModelError("model API answered 400: bad request")]
    turn_id = harness.turn("hi")

    assert harness.run(turn_id) == "failed"

    finished = harness.data("turn_finished")[0]
    assert finished["status"] == "failed"
    assert "400" in finished["error"]
    assert _turn(harness, turn_id).status == "failed"


def test_an_unexpected_exception_is_recorded_as_failed(harness: Harness) -> None:
    harness.model.steps = [RuntimeError("boom")]
    turn_id = harness.turn("hi")

    assert harness.run(turn_id) == "failed"

    assert harness.data("turn_finished")[0]["error"] == "RuntimeError: boom"


def test_cancel_while_tools_run_cancels_the_calls_and_revokes_them(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("slow", timeout_s=30))
    h.dispatcher.tools["slow"] = silent()
    h.model.steps = [say("Working.", use("slow"))]
    turn_id = h.turn("go")
    outcome: list[str] = []
    runner = threading.Thread(target=lambda: outcome.append(h.run(turn_id)))
    runner.start()
    wait_for(lambda: "tool_call_started" in h.kinds(), what="the call to start")

    with h.sessions() as s, s.begin():
        s.get(Turn, turn_id).cancel_requested = True  # type: ignore[union-attr]
    h.runtime.redis.publish(
        h.runtime.keys.control_channel, json.dumps({"type": "cancel", "turn_id": turn_id})
    )
    runner.join(timeout=10)

    assert outcome == ["cancelled"]
    [call] = h.calls(turn_id)
    assert call.status == "cancelled"
    assert h.dispatcher.revoked == [call.id]
    assert h.data("turn_finished")[0]["status"] == "cancelled"
    assert h.data("assistant_message")[0]["text"] == "Working."


def test_cancel_mid_stream_keeps_the_partial_text(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    watches: list[CancelWatch] = []

    class RecordedWatch(CancelWatch):
        def __enter__(self) -> CancelWatch:
            watches.append(self)
            return super().__enter__()

    monkeypatch.setattr(loop, "CancelWatch", RecordedWatch)
    turn_id = h.turn("go")

    def streaming(request: ModelRequest) -> Iterator[ModelEvent]:
        yield TextDelta("Half an ans")
        h.runtime.redis.publish(
            h.runtime.keys.control_channel, json.dumps({"type": "cancel", "turn_id": turn_id})
        )
        wait_for(lambda: watches[0].is_set(), what="the cancel to be heard")
        yield TextDelta("wer")
        yield StepEnd(None, 1, 1)

    h.model.steps = [streaming]

    assert h.run(turn_id) == "cancelled"

    assert h.data("assistant_message") == [{"text": "Half an ans"}]
    with h.sessions() as s:
        stored = s.scalars(
            select(Message).where(Message.turn_id == turn_id).order_by(Message.seq)
        ).all()
    assert [m.role for m in stored] == ["user", "assistant"]


def test_a_resumed_turn_awaits_its_running_calls_without_dispatching_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    h.catalogue(spec("write_file"))
    h.dispatcher.tools["write_file"] = silent()
    h.model.steps = [say("Writing.", use("write_file", path="a")), say("Proposed.")]
    turn_id = h.turn("write a")
    original_emit_many = loop.TurnRunner.emit_many

    def dies_announcing_calls(self: loop.TurnRunner, events: list[tuple[Any, Any]]) -> None:
        if any(kind == "tool_call_started" for kind, _data in events):
            raise RunnerDied()  # the process dies after the calls were sent and marked running
        original_emit_many(self, events)

    # A step's calls are announced together (TurnRunner.emit_many), after they were marked.
    monkeypatch.setattr(loop.TurnRunner, "emit_many", dies_announcing_calls)
    with pytest.raises(RunnerDied):
        h.run(turn_id)
    monkeypatch.setattr(loop.TurnRunner, "emit_many", original_emit_many)
    [call] = h.calls(turn_id)
    assert call.status == "running"
    # The worker did run it and published while no orchestrator listened.
    publish_result(
        h.runtime.redis,
        h.runtime.keys,
        turn_id,
        ToolResult(call_id=call.id, status="ok", output="proposed (proposal_id prop_1)"),
    )

    assert h.run(turn_id) == "completed"

    kinds = h.kinds()
    assert kinds.count("turn_started") == 1
    assert h.data("turn_resumed") == [{"step": 1}]
    assert h.dispatcher.sends == 1, "a running call is awaited, never sent again"
    assert [c.status for c in h.calls(turn_id)] == ["ok"]
    assert "prop_1" in json.dumps(h.model.requests[-1].messages)


def test_a_runner_dying_right_after_sending_loses_nothing(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("write_file"))
    h.dispatcher.tools["write_file"] = ok("proposed, awaiting approval (proposal_id prop_9)")
    h.dispatcher.die_after_send = True
    h.model.steps = [say("Writing.", use("write_file", path="a")), say("Proposed.")]
    turn_id = h.turn("write a")
    with pytest.raises(RunnerDied):
        h.run(turn_id)
    assert [c.status for c in h.calls(turn_id)] == ["pending"]

    assert h.run(turn_id) == "completed"

    [call] = h.calls(turn_id)
    assert (call.status, call.attempts) == ("ok", 1)
    assert h.dispatcher.runs == [call.id], "the tool ran once"
    assert h.dispatcher.sends == 2, "sent again; the worker's claim skipped the duplicate"
    assert "prop_9" in (call.output or "")


def test_a_second_delivery_while_leased_does_nothing(harness: Harness) -> None:
    h = harness
    turn_id = h.turn("hi")
    other = TurnLease(h.runtime.redis, h.runtime.keys.turn_lease(turn_id), 5)
    assert other.acquire()

    assert h.run(turn_id) == "leased"

    assert h.kinds() == []
    assert _turn(h, turn_id).status == "queued"
    other.release()


def test_turns_of_a_conversation_run_in_order(harness: Harness) -> None:
    h = harness
    h.model.steps = [say("first answer"), say("second answer")]
    first, second = h.turn("one", seq=1), h.turn("two", seq=2)

    assert h.run(second) == "waiting"
    assert h.run(first) == "completed"
    assert h.enqueued == [second], "a finished turn enqueues the next queued one"
    assert h.run(second) == "completed"

    messages = h.model.requests[1].messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert transcript_problems(messages) == []


def test_a_turn_read_behind_under_its_lease_runs_once_the_earlier_ends_meanwhile(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery takes the lease before it reads the turn. If the turn may not run yet (an
    earlier one is unfinished), it gives the lease back; the earlier turn ending meanwhile
    sent it again, and that delivery found the lease taken and did nothing: the first one
    must then run the turn, not leave it for the reconciler."""
    h = harness
    h.model.steps = [say("first answer"), say("second answer")]
    first, second = h.turn("one", seq=1), h.turn("two", seq=2)
    read_turn = store.read_turn
    meanwhile: list[str] = []

    def read_then_race(conn: Connection, turn_id: str) -> store.TurnInfo | None:
        info = read_turn(conn, turn_id)
        if turn_id == second and not meanwhile:
            assert info is not None and info.behind
            meanwhile.append(h.run(first))  # ends, and sends the second again
            meanwhile.append(h.run(second))  # that delivery, while this one holds the lease
        return info

    monkeypatch.setattr(store, "read_turn", read_then_race)

    assert h.run(second) == "completed"

    assert meanwhile == ["completed", "leased"]
    assert _turn(h, second).status == "completed"
    assert len(h.model.requests) == 2, "each turn reached the model once"


def _admitted(h: Harness, turn_id: str) -> str:
    """``turn_id``, given a slot as the gateway's admission pass gives it (so its delivery
    reads and starts it under the lease in one go)."""
    with h.sessions() as s, s.begin():
        s.execute(update(Turn).where(Turn.id == turn_id).values(admitted_at=now()))
    return turn_id


def test_a_turn_whose_start_waits_keeps_its_lease_meanwhile(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is taken before the turn is read and started, and that transaction may wait
    (SQLite's write lock, a pooled connection): the lease is renewed meanwhile, so a wait
    longer than the lease lets no second delivery in to run the turn as well."""
    h = harness
    lease_s = 1.0
    settings = h.runtime.settings.model_copy(update={"lease_s": lease_s, "lease_renew_s": 0.2})
    h.runtime = dataclasses.replace(h.runtime, settings=settings)
    rt = h.runtime
    h.model.steps = [say("hello")]
    turn_id = _admitted(h, h.turn("hi"))
    key = rt.keys.turn_lease(turn_id)
    start_turn = store.start_turn
    meanwhile: list[str] = []

    def start_after_a_wait(conn: Connection, *args: Any, **kwargs: Any) -> store.Opened:
        holder, entered = rt.redis.get(key), time.monotonic()
        assert holder is not None, "the lease is taken before the start"
        # Waits past the lease's own length: it must have been renewed to still be held.
        wait_until(
            lambda: time.monotonic() - entered > 1.5 * lease_s and rt.redis.get(key) == holder,
            WAIT_S,
            "the lease still held, one and a half leases into the start's wait",
        )
        meanwhile.append(h.run(turn_id))  # a duplicate delivery, or the reconciler's
        return start_turn(conn, *args, **kwargs)

    monkeypatch.setattr(store, "start_turn", start_after_a_wait)

    assert h.run(turn_id) == "completed"

    assert meanwhile == ["leased"]
    assert len(h.model.requests) == 1, "the turn ran once"
    assert h.kinds().count("turn_started") == 1 and "turn_resumed" not in h.kinds()


def test_a_start_whose_lease_was_taken_over_meanwhile_is_rolled_back(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals failed while the read-and-start transaction waited (another runner holds
    the lease now): the start is not committed, and nothing is announced."""
    h = harness
    settings = h.runtime.settings.model_copy(update={"lease_s": 1.0, "lease_renew_s": 0.2})
    h.runtime = dataclasses.replace(h.runtime, settings=settings)
    rt = h.runtime
    h.model.steps = [say("hello")]
    turn_id = _admitted(h, h.turn("hi"))
    leases: list[TurnLease] = []
    keep_alive, start_turn = TurnLease.keep_alive, store.start_turn

    def kept_alive(lease: TurnLease) -> None:
        leases.append(lease)
        keep_alive(lease)

    def start_then_taken_over(conn: Connection, *args: Any, **kwargs: Any) -> store.Opened:
        opened = start_turn(conn, *args, **kwargs)
        rt.redis.set(rt.keys.turn_lease(turn_id), "another-runner")
        wait_until(leases[0].lost.is_set, WAIT_S, "the heartbeat to find the lease taken")
        return opened

    monkeypatch.setattr(TurnLease, "keep_alive", kept_alive)
    monkeypatch.setattr(store, "start_turn", start_then_taken_over)

    assert h.run(turn_id) == "lease_lost"

    assert _turn(h, turn_id).status == "queued", "its start was rolled back"
    assert h.kinds() == [] and h.model.requests == []


def test_a_start_that_fails_under_the_lease_fails_the_turn(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in the transaction that reads and starts a turn (a webhook's delivery row,
    SQL) ends the turn ``failed`` with that error, by its runner under the lease."""
    h = harness
    turn_id = _admitted(h, h.turn("hi"))

    def failing_start(*_args: Any, **_kwargs: Any) -> store.Opened:
        raise RuntimeError("the start's statement failed")

    monkeypatch.setattr(store, "start_turn", failing_start)

    assert h.run(turn_id) == "failed"

    turn = _turn(h, turn_id)
    assert turn.status == "failed" and "the start's statement failed" in (turn.error or "")
    [finished] = h.data("turn_finished")
    assert finished["status"] == "failed"
    assert h.model.requests == []
    assert not h.runtime.redis.exists(h.runtime.keys.turn_lease(turn_id)), "released"


def test_a_confirm_tool_parks_the_turn_until_a_decision(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.dispatcher.tools["run_python"] = ok("42")
    h.model.steps = [say("Running code.", use("run_python", code="print(42)")), say("It is 42.")]
    turn_id = h.turn("compute")

    assert h.run(turn_id) == "parked"
    assert _turn(h, turn_id).status == "parked"
    [asked] = h.data("tool_call_needs_decision")
    assert h.dispatcher.sent == []

    with h.sessions() as s, s.begin():
        s.get(ToolCall, asked["call_id"]).decision = "allow"  # type: ignore[union-attr]
    assert h.run(turn_id) == "completed"
    assert [c.status for c in h.calls(turn_id)] == ["ok"]


def test_a_cancelled_queued_turn_never_reaches_the_model(harness: Harness) -> None:
    h = harness
    turn_id = h.turn("never mind")
    with h.sessions() as s, s.begin():
        s.get(Turn, turn_id).cancel_requested = True  # type: ignore[union-attr]

    assert h.run(turn_id) == "cancelled"

    assert h.model.requests == []
    assert h.kinds() == ["turn_finished"]


def test_the_reconciler_enqueues_running_turns_whose_lease_is_gone(harness: Harness) -> None:
    h = harness
    orphan, alive, queued = h.turn("a", seq=1), h.turn("b", seq=2), h.turn("c", seq=3)
    with h.sessions() as s, s.begin():
        for turn_id in (orphan, alive):
            s.get(Turn, turn_id).status = "running"  # type: ignore[union-attr]
    held = TurnLease(h.runtime.redis, h.runtime.keys.turn_lease(alive), 5)
    assert held.acquire()
    enqueued: list[str] = []
    assert (
        Reconciler(h.sessions, h.runtime.redis, h.runtime.keys, enqueued.append, 60).sweep() == []
    )
    # Turns are this deployment's once their conversation has a stream under its prefix.
    h.runtime.events.append(h.conversation_id, "turn_queued", {"text": "a"}, orphan)
    reconciler = Reconciler(h.sessions, h.runtime.redis, h.runtime.keys, enqueued.append, 60)

    found = reconciler.sweep()

    assert orphan in found and enqueued == found
    assert alive not in found and queued not in found
    held.release()
    with h.sessions() as s, s.begin():  # other tests share the database: leave no orphans
        for turn_id in (orphan, alive):
            s.get(Turn, turn_id).status = "failed"  # type: ignore[union-attr]


def test_one_orchestrator_per_interval_sweeps_for_orphans(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two orchestrators' reconcilers, on the same interval: one reads the running turns,
    # the other skips the SQL read and the lease checks; once the interval is over, the
    # other may (a sweeper that died passes its turn on).
    h = harness
    orphan = h.turn("a")
    with h.sessions() as s, s.begin():
        s.get(Turn, orphan).status = "running"  # type: ignore[union-attr]
    h.runtime.events.append(h.conversation_id, "turn_queued", {"text": "a"}, orphan)
    reads: list[str] = []
    read_running = recovery.orphaned_turns

    def counted(*args: Any, **kwargs: Any) -> list[str]:
        reads.append("read")
        return read_running(*args, **kwargs)

    monkeypatch.setattr(recovery, "orphaned_turns", counted)
    enqueued: list[str] = []
    first, second = (
        Reconciler(h.sessions, h.runtime.redis, h.runtime.keys, enqueued.append, 60, orphans_s=0.3)
        for _ in range(2)
    )

    assert first.sweep_orphans() == [orphan]
    assert second.sweep_orphans() == [] and reads == ["read"]
    sweep_key = h.runtime.keys.orphan_sweep()
    wait_for(lambda: not h.runtime.redis.exists(sweep_key), 5.0, "the sweep key to expire")
    assert second.sweep_orphans() == []  # it swept; the orphan was enqueued moments ago
    assert reads == ["read", "read"] and enqueued == [orphan]
    with h.sessions() as s, s.begin():  # other tests share the database: leave no orphans
        s.get(Turn, orphan).status = "failed"  # type: ignore[union-attr]


def test_a_turn_that_ends_during_the_sweep_is_not_taken_for_an_orphan(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep reads the running turns, then their leases: a turn that finished in between
    released its lease in between, and was enqueued again (seen under load)."""
    h = harness
    turn_id = h.turn("a")
    with h.sessions() as s, s.begin():
        s.get(Turn, turn_id).status = "running"  # type: ignore[union-attr]
    h.runtime.events.append(h.conversation_id, "turn_queued", {"text": "a"}, turn_id)
    check_leases = recovery._ours_unleased

    def finished_meanwhile(*args: Any, **kwargs: Any) -> Any:
        with h.sessions() as s, s.begin():  # its runner ends it and lets the lease go
            s.get(Turn, turn_id).status = "completed"  # type: ignore[union-attr]
        return check_leases(*args, **kwargs)

    monkeypatch.setattr(recovery, "_ours_unleased", finished_meanwhile)
    enqueued: list[str] = []

    assert (
        Reconciler(h.sessions, h.runtime.redis, h.runtime.keys, enqueued.append, 60).sweep_orphans()
        == []
    )
    assert enqueued == []


def test_the_loop_on_the_real_sdk_sends_valid_transcripts(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    h.runtime.model = AnthropicModel(
        "sk-test", fake_anthropic.url, "claude-test", retry_backoff_s=0
    )
    h.catalogue(spec("read_file"), spec("list_dir"))
    h.dispatcher.tools.update({"read_file": ok("contents"), "list_dir": ok("a.txt")})
    fake_anthropic.script(
        [
            [
                text("Reading."),
                tool_use("list_dir", {"path": "."}),
                tool_use("read_file", {"path": "a.txt"}),
            ],
            [text("partial"), stream_error()],  # the step is retried as a whole
            [text("It says: contents.")],
            [text("Second turn answer.")],
        ]
    )
    first, second = h.turn("what is in a.txt?", seq=1), h.turn("thanks", seq=2)

    assert h.run(first) == "completed"
    assert h.run(second) == "completed"

    assert fake_anthropic.violations == []
    assert fake_anthropic.remaining == 0
    last = fake_anthropic.requests[-1].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert [d["text"] for d in h.data("assistant_message")] == [
        "Reading.",
        "It says: contents.",
        "Second turn answer.",
    ]
    finished = [d for d in h.data("turn_finished")]
    # Every request of the turn as the API reported it: the two steps that finished and the
    # broken attempt as far as it went (its message_start: the prompt, 1 output token).
    every = [fake_anthropic.requests[i].usage for i in (0, 1, 2)]
    usage = finished[0]["usage"]
    assert usage["output_tokens"] == 14 + 1
    for field in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        assert usage[field] == sum(u[field] for u in every)


def test_a_turn_starts_no_thread_of_its_own(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lease's heartbeat, its deadline and its cancel watch run on the process's shared
    threads (``timers.py``, ``cancel_watch.py``): starting a thread per turn cost every
    turn's first event a wait for the new thread to get the GIL."""
    h = harness
    h.model.steps = [say("Warmed up."), say("Hello.")]
    assert h.run(h.turn("warm up")) == "completed"  # the shared threads start here, once
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    turn_id = h.turn("hello")
    assert h.run(turn_id) == "completed"
    assert _turn(h, turn_id).deadline_at is not None, "the turn armed its deadline"
    assert started == []
