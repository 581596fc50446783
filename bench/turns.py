"""Benchmarks of whole turns through the real stack: first event, and a multi-step turn.

The client is a real WebSocket (``tests.wsclient.WsClient``) on a real gateway; turns run
on a real orchestrator worker whose model is the fake Messages API
(``tests.fake_anthropic``) over HTTP, streaming in the real SSE format with no delay.
The ``turn`` baseline runs the same loop (``signalbox.services.orchestrator.loop.run_turn``) in
this process, on the same Redis and SQL, with the model and the tools called directly.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis

from bench.environment import DUMMY_API_KEY, PREFIX, BenchEnv
from bench.stats import Result, Series
from bench.tool_calls import bare_parallel
from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.approvals import ApprovalFeed
from signalbox.services.orchestrator.loop import Runtime, run_turn
from signalbox.services.orchestrator.model import (
    ModelEvent,
    ModelRequest,
    StepEnd,
    TextDelta,
    ToolDef,
    ToolUse,
)
from signalbox.services.tools import test_tools
from signalbox.services.tools.execution import Deps, context_for, execute
from signalbox.shared.db.models import Conversation, Turn, now
from signalbox.shared.event_stream import EventStream
from signalbox.shared.events import EventKind
from signalbox.shared.ids import new_id
from signalbox.shared.settings import OrchestratorSettings, ToolsSettings
from signalbox.shared.tool_contract import ToolCallRequest, ToolSpec, publish_result
from tests.fake_anthropic import Scripted, text, tool_use
from tests.wsclient import Frame, WsClient

TURN_TIMEOUT_S = 60.0
TOOL_STEPS = 3
TOOLS_PER_STEP = 4
MODEL_STEPS = TOOL_STEPS + 1  # the tool steps, then the answer
INSTANT_INPUT = {"seconds": 0}
# The turn of ``turn_quick``: the same instant calls of a tool declared quick, so a step's
# four go to the tool worker as one task (services/tools/batches.py).
QUICK_TOOL, QUICK_INPUT = "count_quick", {"key": "bench-turn-quick"}


def _ts(frame: Frame) -> float:
    """An event's server timestamp, in seconds since the epoch (millisecond resolution)."""
    return datetime.fromisoformat(str(frame["ts"]).replace("Z", "+00:00")).timestamp()


def _redis_round_trip(client: redis.Redis) -> float:
    started = time.perf_counter()
    client.ping()
    return time.perf_counter() - started


def _event(kind: str, turn_id: str | None = None) -> Any:
    def match(frame: Frame) -> bool:
        if frame.get("type") != "event" or frame.get("kind") != kind:
            return False
        return turn_id is None or frame.get("turn_id") == turn_id

    return match


def first_event(env: BenchEnv, rounds: int, warmup: int) -> list[Result]:
    """``user_turn`` sent → ``turn_started`` received, turns of one conversation back to back."""
    env.gateway()
    env.orchestrator()
    _user_id, token = env.user()
    client = WsClient(env.stack.gateway_url, token)
    latencies: list[float] = []
    acks: list[float] = []
    queued_to_started: list[float] = []
    pings: list[float] = []
    conversation_id: str | None = None
    try:
        for i in range(warmup + rounds):
            env.fake.script([[text("ok", chunks=1)]])
            started = time.perf_counter()
            req = client.send(
                {"type": "user_turn", "conversation_id": conversation_id, "text": f"hi {i}"}
            )
            seen: dict[str, float] = {}
            frames: dict[str, Frame] = {}
            while "ack" not in seen or "turn_started" not in seen:
                frame = client.recv(time.monotonic() + TURN_TIMEOUT_S)
                now = time.perf_counter() - started
                if frame.get("req") == req and frame.get("type") in ("ack", "error"):
                    if frame["type"] == "error":
                        raise RuntimeError(f"user_turn refused: {frame}")
                    seen["ack"], frames["ack"] = now, frame
                elif frame.get("type") == "event" and frame["kind"] in (
                    "turn_queued",
                    "turn_started",
                ):
                    seen.setdefault(frame["kind"], now)
                    frames.setdefault(frame["kind"], frame)
            turn_id = frames["ack"]["turn_id"]
            conversation_id = frames["ack"]["conversation_id"]
            # A fast turn may end before its ack arrives: its turn_finished was read above.
            done = _event("turn_finished", turn_id)
            finished = next((f for f in client.events if done(f)), None) or client.wait_for(
                done, TURN_TIMEOUT_S
            )
            if finished["data"]["status"] != "completed":
                raise RuntimeError(f"first_event: the turn did not complete: {finished}")
            ping = _redis_round_trip(env.redis)
            if i >= warmup:
                latencies.append(seen["turn_started"] * 1000)
                acks.append(seen["ack"] * 1000)
                pings.append(ping * 1000)
                if "turn_queued" in frames:
                    queued_to_started.append(
                        (_ts(frames["turn_started"]) - _ts(frames["turn_queued"])) * 1000
                    )
    finally:
        client.close()
    measured = Series("user_turn → turn_started", latencies)
    return [
        Result(
            id="first_event",
            what="`user_turn` sent → `turn_started` received on the same WebSocket; turns "
            "of one conversation back to back (the next sent after the last finished)",
            measured=measured,
            baseline=Series("redis PING round trip", pings),
            target="p50 ≤ 20 ms",
            met=measured.median <= 20,
            extra={
                "ack_ms_median": round(statistics.median(acks), 3),
                "queued_to_started_ms_median": round(statistics.median(queued_to_started), 3)
                if queued_to_started
                else None,
            },
        )
    ]


# -- the turn benchmark ----------------------------------------------------------------


def _script(tool: str = "sleep", tool_input: dict[str, Any] = INSTANT_INPUT) -> list[Scripted]:
    steps: list[Scripted] = [
        [text(f"step {n}", chunks=1)] + [tool_use(tool, tool_input) for _ in range(TOOLS_PER_STEP)]
        for n in range(1, TOOL_STEPS + 1)
    ]
    steps.append([text("done", chunks=1)])
    return steps


class InProcessModel:
    """The same steps as the fake server's script, yielded directly (no HTTP, no SSE)."""

    def __init__(self, tool: str = "sleep", tool_input: dict[str, Any] = INSTANT_INPUT) -> None:
        self.calls = 0
        self.tool = tool
        self.tool_input = tool_input

    @property
    def name(self) -> str:
        """Reported in ``turn_started``."""
        return "in-process-instant"

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        """Step ``n`` of the turn: text and four tool calls, or the final answer."""
        step = sum(1 for m in request.messages if m["role"] == "assistant") + 1
        if step <= TOOL_STEPS:
            yield TextDelta(f"step {step}")
            for _ in range(TOOLS_PER_STEP):
                yield ToolUse(new_id("toolu"), self.tool, dict(self.tool_input))
            yield StepEnd("tool_use", 11, 7)
        else:
            yield TextDelta("done")
            yield StepEnd("end_turn", 11, 7)


class InProcessDispatcher:
    """Runs each call's tool function in a thread of this process and publishes its result
    on the turn's result stream, as a tool worker would."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def send(self, calls: Sequence[tuple[ToolCallRequest, ToolSpec]]) -> None:
        """Run every call at once."""
        for request, _spec in calls:
            threading.Thread(target=self._run, args=(request,), daemon=True).start()

    def _run(self, request: ToolCallRequest) -> None:
        result = execute(request, context_for(request, self.deps), self.deps.registry)
        publish_result(self.deps.redis, self.deps.keys, request.turn_id, result)

    def revoke(self, call_ids: Sequence[str]) -> None:
        """Nothing to revoke: calls finish at once."""


class TimedEvents(EventStream):
    """The event stream, noting when ``turn_finished`` was appended (the turn's real end:
    ``run_turn`` returns later, after its lease and cancel watch are released)."""

    finished_at: float | None = None

    def append(
        self,
        conversation_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        turn_id: str | None = None,
    ) -> str:
        """Append, and time ``turn_finished``."""
        event_id = super().append(conversation_id, kind, data, turn_id)
        if kind == "turn_finished":
            self.finished_at = time.perf_counter()
        return event_id

    def append_many(
        self,
        conversation_id: str,
        events: Sequence[tuple[EventKind, Mapping[str, Any]]],
        turn_id: str | None = None,
    ) -> list[str]:
        """Append in one round trip, and time ``turn_finished`` among them."""
        if len(events) == 1:
            kind, data = events[0]
            return [self.append(conversation_id, kind, data, turn_id)]
        event_ids = super().append_many(conversation_id, events, turn_id)
        if any(kind == "turn_finished" for kind, _data in events):
            self.finished_at = time.perf_counter()
        return event_ids


@dataclass
class TimedRuntime(Runtime):
    """A ``Runtime`` whose event stream times ``turn_finished``."""

    timed: TimedEvents | None = None

    @property
    def events(self) -> EventStream:
        """One timed stream for the whole run."""
        if self.timed is None:
            self.timed = TimedEvents(self.redis, self.keys)
        return self.timed


def in_process_runtime(env: BenchEnv, model: InProcessModel | None = None) -> TimedRuntime:
    """The loop's dependencies with the model and the tools in this process; the rest as an
    orchestrator process has them (its approvals feed started: ``stop_runtime`` stops it)."""
    kwargs = env.settings_kwargs()
    tools_settings = ToolsSettings(internal_token=env.stack.config.internal_token, **kwargs)
    deps = Deps.create(tools_settings, test_tools.registry)
    approvals = ApprovalFeed(env.redis, env.keys.approvals_channel, env.sessions)
    approvals.start()
    return TimedRuntime(
        settings=OrchestratorSettings(**kwargs),
        sessions=env.sessions,
        redis=env.redis,
        keys=env.keys,
        model=model or InProcessModel(),
        dispatcher=InProcessDispatcher(deps),
        enqueue_turn=lambda _turn_id: None,
        approvals=approvals,
    )


def stop_runtime(runtime: Runtime) -> None:
    """Stop what ``in_process_runtime`` started."""
    if runtime.approvals is not None:
        runtime.approvals.stop()


def queued_turn(env: BenchEnv, user_id: str) -> str:
    """A new conversation with one queued turn, as the gateway leaves it when it sends
    ``run_turn``: stored, and given its slot by the admission pass in the insert's transaction
    (``shared/admission.py``; the user runs one turn at a time, so a slot is free). Stored
    admitted in one transaction: a pass of the stack sharing this database (the ``turn``
    benchmark's) must not admit and send it to its own orchestrator meanwhile."""
    with env.sessions() as s, s.begin():
        conv = Conversation(id=new_id("conv"), user_id=user_id, workspace="default", title="b")
        s.add(conv)
        s.flush()
        turn = Turn(
            id=new_id("turn"),
            conversation_id=conv.id,
            user_id=user_id,
            seq=1,
            text="run the tools",
            status="queued",
            deployment=PREFIX,
            admitted_at=now(),
        )
        s.add(turn)
        return turn.id


def _step_gaps_ms(events: list[Frame]) -> list[float]:
    """Per model step: the last event of the step before → its ``assistant_message``.

    The first step counts from ``turn_started``; later ones from the last
    ``tool_call_finished`` of the step before, so tool run time is left out.
    """
    gaps = []
    since: float | None = None
    for event in events:
        kind = event["kind"]
        if kind in ("turn_started", "tool_call_finished"):
            since = _ts(event)
        elif kind == "assistant_message" and since is not None:
            gaps.append((_ts(event) - since) * 1000)
            since = None
    return gaps


def _unmarked(value: Any) -> Any:
    """``value`` without its ``cache_control`` markers (the model marks a request again)."""
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def as_sent(body: Mapping[str, Any]) -> ModelRequest:
    """The request whose Messages-API body is ``body`` (the fake's record of what the
    stack sent), for the model to send again."""
    system = body.get("system") or ""
    if isinstance(system, list):
        system = "".join(str(block.get("text", "")) for block in system)
    thinking = body.get("thinking")
    return ModelRequest(
        system=system,
        messages=_unmarked(body.get("messages") or []),
        tools=[
            ToolDef(t["name"], t.get("description", ""), _unmarked(t["input_schema"]))
            for t in body.get("tools") or []
        ],
        max_tokens=int(body.get("max_tokens") or 100),
        model=str(body.get("model") or ""),
        thinking_budget_tokens=thinking.get("budget_tokens")
        if isinstance(thinking, dict)
        else None,
    )


def _model_step_over_http(
    env: BenchEnv, model: AnthropicModel, request: ModelRequest | None = None
) -> float:
    """Seconds for one tool step from the fake server through the SDK, in this process:
    of a one-line request, or of ``request``."""
    env.fake.script([_script()[0]])
    if request is None:
        request = ModelRequest(
            system="bench", messages=[{"role": "user", "content": "go"}], max_tokens=100
        )
    started = time.perf_counter()
    events = list(model.stream(request))
    if not isinstance(events[-1], StepEnd):
        raise RuntimeError(f"turn: the fake model step did not end: {events[-3:]}")
    return time.perf_counter() - started


def turn(env: BenchEnv, rounds: int, warmup: int, quick: bool = False) -> list[Result]:
    """A 3-step turn of 4 tools per step: the real stack vs the same loop in-process.

    ``quick``: the tool is declared quick (a step's calls go as one task): ``turn@quick``.
    """
    tool, tool_input = (QUICK_TOOL, QUICK_INPUT) if quick else ("sleep", INSTANT_INPUT)
    env.tools(1, TOOLS_PER_STEP)
    env.noop_workers(1, TOOLS_PER_STEP)
    bare = env.celery("bench-bare")
    env.gateway()
    env.orchestrator()
    user_id, token = env.user()
    client = WsClient(env.stack.gateway_url, token)
    runtime = in_process_runtime(env, InProcessModel(tool, tool_input))
    http_model = AnthropicModel(DUMMY_API_KEY, env.fake.url, "bench")
    ours: list[float] = []
    base: list[float] = []
    gaps: list[float] = []
    model_steps: list[float] = []
    sent_steps: list[float] = []
    celery_steps: list[float] = []
    try:
        for i in range(warmup + rounds):
            env.fake.script(_script(tool, tool_input))
            started = time.perf_counter()
            ack = client.request(
                {"type": "user_turn", "conversation_id": None, "text": "run the tools"},
                timeout_s=TURN_TIMEOUT_S,
            )
            if ack.get("type") != "ack":
                raise RuntimeError(f"user_turn refused: {ack}")
            finished = client.wait_for(_event("turn_finished", ack["turn_id"]), TURN_TIMEOUT_S)
            wall = time.perf_counter() - started
            data = finished["data"]
            if data["status"] != "completed" or data["steps"] != MODEL_STEPS:
                raise RuntimeError(f"turn: expected a completed {MODEL_STEPS}-step turn: {data}")
            turn_events = [e for e in client.events if e.get("turn_id") == ack["turn_id"]]
            last_sent = env.fake.requests[-1].body  # the turn's last model request

            turn_id = queued_turn(env, user_id)
            timed = runtime.events
            assert isinstance(timed, TimedEvents)
            timed.finished_at = None
            in_started = time.perf_counter()
            outcome = run_turn(runtime, turn_id)
            if outcome != "completed" or timed.finished_at is None:
                raise RuntimeError(f"turn: the in-process turn ended {outcome!r}")
            in_wall = timed.finished_at - in_started
            model_s = _model_step_over_http(env, http_model)
            # The stack's last request again (its tools, its whole transcript): what one
            # model step of the turn costs the SDK and the fake, outside the stack.
            sent_s = _model_step_over_http(env, http_model, as_sent(last_sent))
            celery_s = bare_parallel(bare, TOOLS_PER_STEP)
            if i >= warmup:
                celery_steps.append(celery_s * 1000)
                ours.append(wall * 1000)
                base.append(in_wall * 1000)
                model_steps.append(model_s * 1000)
                sent_steps.append(sent_s * 1000)
                gaps.extend(_step_gaps_ms(turn_events))
            client.events.clear()
    finally:
        client.close()
        http_model.client.close()
        stop_runtime(runtime)
        env.stop_noop()
    measured = Series("turn over the stack", ours)
    baseline = Series("same loop in-process", base)
    added_per_step = (measured.median - baseline.median) / MODEL_STEPS
    # What Celery itself costs a turn: a bare round trip of each tool step's 4 tasks,
    # spread over the model steps (the last step calls no tools).
    celery_group_ms = statistics.median(celery_steps)
    celery_floor_per_step = celery_group_ms * TOOL_STEPS / MODEL_STEPS
    return [
        Result(
            id="turn",
            variant="quick" if quick else "",
            what=f"a turn of {TOOL_STEPS} tool steps x {TOOLS_PER_STEP} instant `{tool}` calls"
            + (" (declared quick: a step's calls as one task)" if quick else "")
            + ", then an "
            f"answer ({MODEL_STEPS} model steps), instant fake model over HTTP: `user_turn` → "
            "`turn_finished` on the WebSocket",
            measured=measured,
            baseline=baseline,
            target="≤ 10 ms added per model step (median)",
            met=added_per_step <= 10,
            extra={
                "model_steps": MODEL_STEPS,
                "added_ms_per_step": round(added_per_step, 3),
                "step_gap_ms_median": round(statistics.median(gaps), 3) if gaps else None,
                "http_model_step_ms_median": round(statistics.median(model_steps), 3),
                "http_model_step_as_sent_ms_median": round(statistics.median(sent_steps), 3),
                "in_process_ms_per_step": round(baseline.median / MODEL_STEPS, 3),
                "bare_celery_4_tasks_ms_median": round(celery_group_ms, 3),
                "celery_floor_ms_per_step": round(celery_floor_per_step, 3),
                "added_beyond_celery_ms_per_step": round(added_per_step - celery_floor_per_step, 3),
            },
            notes=[
                "The baseline is Signalbox's own loop with its SQL and Redis writes, the "
                "model and the tools called in-process; the difference is what the HTTP "
                "model, Celery dispatch, tool workers and the gateway relay add.",
                f"`celery_floor_ms_per_step`: {TOOLS_PER_STEP} bare Celery no-op tasks sent at "
                f"once on a bare prefork worker of {TOOLS_PER_STEP} slots, each result awaited "
                f"(`bench.tool_calls.bare_parallel`), x {TOOL_STEPS} tool steps / "
                f"{MODEL_STEPS} model steps: what Celery alone adds to a model step here. "
                "`added_beyond_celery_ms_per_step` is the rest.",
                "`http_model_step_ms_median`: one tool step of a one-line request through the "
                "SDK from the fake server, in the bench process; "
                "`http_model_step_as_sent_ms_median`: the same with the turn's last request as "
                "the stack sent it (its tools and transcript).",
            ],
        )
    ]
