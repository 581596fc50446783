"""Task events (``-E``) of a real tools worker, flushed in batches (``task_events.py``): a
monitor (what Flower and ``celery events`` run) still sees every call received, started and
succeeded, in that order; and the step coalesces many events into one timed flush."""

from __future__ import annotations

import os
import threading
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from signalbox.processes import Child, ServiceCommands, child_env, log_contains
from signalbox.services.tools.task_events import FLUSH_S, BatchedTaskEvents
from signalbox.shared.celery_app import RUN_TOOL_TASK, make_celery
from signalbox.shared.ids import new_id
from signalbox.shared.settings import ToolsSettings, load
from signalbox.shared.tool_contract import ToolCallRequest

CALLS = 6
EVENTS_DEADLINE_S = 20.0
WANT = ["task-received", "task-started", "task-succeeded"]


def test_a_monitor_sees_every_call_received_started_and_succeeded(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    settings = load(ToolsSettings)
    app = make_celery("tools-events-test", settings)
    seen: dict[str, list[str]] = defaultdict(list)
    all_seen = threading.Event()
    call_ids = [new_id("call") for _ in range(CALLS)]

    def on_event(event: dict[str, Any]) -> None:
        if event.get("uuid") in call_ids:
            seen[event["uuid"]].append(event["type"])
            if all(WANT[-1] in seen[c] for c in call_ids):
                all_seen.set()

    name = f"tools-{uuid.uuid4().hex[:8]}"
    worker = Child(
        name=name,
        args=ServiceCommands(tools_concurrency=2).tools(f"{name}@%h", queues="tools"),
        log_path=tmp_path / f"{name}.log",
        env=child_env(os.environ, {"SIGNALBOX_TEST_TOOLS": "1"}),
    )
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": on_event})
        listening = threading.Thread(
            target=lambda: receiver.capture(limit=None, timeout=None, wakeup=False), daemon=True
        )
        listening.start()
        worker.start()
        try:
            worker.wait_ready(log_contains(worker, " ready."))
            for call_id in call_ids:
                request = ToolCallRequest(
                    call_id=call_id,
                    turn_id=new_id("turn"),
                    conversation_id=new_id("conv"),
                    user_id=new_id("user"),
                    workspace="proj",
                    tool="sleep",
                    input={"seconds": 0},
                    timeout_s=5,
                )
                app.send_task(
                    RUN_TOOL_TASK,
                    kwargs={"request": request.model_dump(mode="json")},
                    queue="tools",
                    task_id=call_id,
                    ignore_result=True,
                )
            assert all_seen.wait(EVENTS_DEADLINE_S), (dict(seen), worker.log_tail())
        finally:
            receiver.should_stop = True
            worker.stop()
        listening.join(timeout=5)
    for call_id in call_ids:
        assert [t for t in seen[call_id] if t in WANT] == WANT, seen[call_id]


class _Hub:
    """The part of kombu's event loop the step uses: timers, fired by the test."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []

    def call_later(self, delay: float, callback: Any) -> None:
        self.timers.append((delay, callback))

    def fire(self) -> None:
        due, self.timers = self.timers, []
        for _delay, callback in due:
            callback()


class _Dispatcher:
    def __init__(self) -> None:
        self.on_send_buffered: Any = lambda: None
        self.flushed = 0

    def flush(self) -> None:
        self.flushed += 1


class _Consumer:
    """Celery's consumer as the step sees it: its hub, dispatcher and flush."""

    def __init__(self) -> None:
        self.hub = _Hub()
        self.event_dispatcher = _Dispatcher()
        self.flushes = 0

    def _flush_events(self) -> None:
        self.flushes += 1


def test_many_buffered_events_leave_in_one_timed_flush() -> None:
    consumer = _Consumer()
    step = BatchedTaskEvents(consumer)
    step.start(consumer)
    for _ in range(5):  # five events buffered in one loop turn
        consumer.event_dispatcher.on_send_buffered()
    assert [d for d, _ in consumer.hub.timers] == [FLUSH_S]  # one flush asked for, not five
    consumer.hub.fire()
    assert consumer.flushes == 1
    consumer.event_dispatcher.on_send_buffered()  # a later event asks again
    assert len(consumer.hub.timers) == 1
    step.stop(consumer)  # what is still buffered goes out before the dispatcher closes
    assert consumer.event_dispatcher.flushed == 1


def test_a_worker_without_an_event_loop_keeps_celerys_own_flush() -> None:
    consumer = _Consumer()
    consumer.hub = None  # type: ignore[assignment]
    original = consumer.event_dispatcher.on_send_buffered
    BatchedTaskEvents(consumer).start(consumer)
    assert consumer.event_dispatcher.on_send_buffered is original
