"""Test doubles for the orchestrator's edges (never for its own code): a scripted ``Model``
and a ``Dispatcher`` whose "workers" are threads publishing on the real result stream."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator.loop import Runtime, run_turn
from signalbox.services.orchestrator.model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    StepEnd,
    TextDelta,
    ToolUse,
)
from signalbox.shared.db.models import Conversation, ToolCall, Turn
from signalbox.shared.events import Event
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import (
    ToolCallRequest,
    ToolResult,
    ToolSpec,
    publish_catalogue,
    publish_result,
)

Step = Sequence[ModelEvent] | Callable[[ModelRequest], Iterable[ModelEvent]] | Exception


class ScriptedModel:
    """A ``Model`` that plays scripted steps in order and records every request."""

    def __init__(self, steps: Sequence[Step] = ()) -> None:
        self.steps: list[Step] = list(steps)
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        return "scripted-model"

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        self.requests.append(request)
        if not self.steps:
            raise ModelError("script exhausted")
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        ended = False
        for event in step(request) if callable(step) else step:
            ended = ended or isinstance(event, StepEnd)
            yield event
        if not ended:
            yield StepEnd("end_turn", 3, 2)


def say(text: str, *calls: ToolUse) -> list[ModelEvent]:
    """A step: ``text`` in two deltas, then ``calls``."""
    half = len(text) // 2
    events: list[ModelEvent] = [TextDelta(text[:half]), TextDelta(text[half:])]
    events.extend(calls)
    events.append(StepEnd("tool_use" if calls else "end_turn", 10, 5))
    return events


def use(name: str, **input: object) -> ToolUse:
    """A tool_use with a fresh id."""
    return ToolUse(f"toolu_{uuid.uuid4().hex[:10]}", name, dict(input))


Behaviour = Callable[[ToolCallRequest], ToolResult | None]


def ok(output: str = "fine") -> Behaviour:
    """A tool that answers ``output`` at once."""
    return lambda req: ToolResult(call_id=req.call_id, status="ok", output=output, duration_ms=1)


def silent() -> Behaviour:
    """A tool whose worker vanishes: it never reports."""
    return lambda req: None


@dataclass
class ThreadDispatcher:
    """Runs each call in a thread and publishes its result like a tool worker does."""

    client: redis.Redis
    keys: RedisKeys
    tools: dict[str, Behaviour]
    sent: list[ToolCallRequest] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    sends: int = 0
    runs: list[str] = field(default_factory=list)
    die_after_send: bool = False
    _claimed: set[str] = field(default_factory=set)

    def send(self, calls: Sequence[tuple[ToolCallRequest, ToolSpec]]) -> None:
        self.sends += 1
        threads = []
        for request, tool_spec in calls:
            self.sent.append(request)
            if request.call_id in self._claimed and not tool_spec.idempotent:
                continue  # a redelivered call: the worker's claim skips it, publishing nothing
            self._claimed.add(request.call_id)
            threads.append(threading.Thread(target=self._run, args=(request,), daemon=True))
        for thread in threads:
            thread.start()
        if self.die_after_send:
            self.die_after_send = False
            for thread in threads:
                thread.join()  # the workers finish while no orchestrator listens
            raise RunnerDied()

    def _run(self, request: ToolCallRequest) -> None:
        self.runs.append(request.call_id)
        result = self.tools[request.tool](request)
        if result is not None:
            publish_result(self.client, self.keys, request.turn_id, result)

    def revoke(self, call_ids: Sequence[str]) -> None:
        self.revoked.extend(call_ids)


class RunnerDied(BaseException):
    """Stands for the orchestrator process dying mid-turn (escapes ``except Exception``)."""


def spec(name: str, timeout_s: float = 5.0, **kw: object) -> ToolSpec:
    """A catalogue entry."""
    return ToolSpec(
        name=name,
        description=f"the {name} tool",
        input_schema={"type": "object"},
        timeout_s=timeout_s,
        **kw,
    )


def make_conversation(sessions: sessionmaker[Session], user_id: str) -> str:
    """A conversation row of ``user_id``."""
    with sessions() as s, s.begin():
        conv = Conversation(id=new_id("conv"), user_id=user_id, workspace="default", title="t")
        s.add(conv)
    return conv.id


def make_turn(
    sessions: sessionmaker[Session],
    conversation_id: str,
    user_id: str,
    text: str,
    seq: int,
    deployment: str | None = None,
) -> str:
    """A queued turn row, as the gateway stores it (``deployment``: its Redis prefix; None:
    adopted by the deployment whose queue first delivers it)."""
    with sessions() as s, s.begin():
        turn = Turn(
            id=new_id("turn"),
            conversation_id=conversation_id,
            user_id=user_id,
            seq=seq,
            text=text,
            status="queued",
            deployment=deployment,
        )
        s.add(turn)
    return turn.id


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``check`` (state in another thread or process) until it holds, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class Harness:
    """One in-process orchestrator on real Redis and SQL, with scripted model and tools."""

    runtime: Runtime
    model: ScriptedModel
    dispatcher: ThreadDispatcher
    enqueued: list[str]
    user_id: str
    conversation_id: str
    token: str = ""  # the user's API token, for driving a gateway

    @property
    def sessions(self) -> sessionmaker[Session]:
        return self.runtime.sessions

    def catalogue(self, *specs: ToolSpec) -> None:
        """Publish ``specs`` as one live worker's catalogue."""
        publish_catalogue(self.runtime.redis, self.runtime.keys, "test-worker", list(specs), 60)

    def turn(
        self, text: str, seq: int = 1, client_tools: list[dict[str, object]] | None = None
    ) -> str:
        """A queued turn in the harness conversation."""
        prefix = self.runtime.settings.redis_prefix
        turn_id = make_turn(self.sessions, self.conversation_id, self.user_id, text, seq, prefix)
        if client_tools is not None:
            with self.sessions() as s, s.begin():
                turn = s.get(Turn, turn_id)
                assert turn is not None
                turn.client_tools = list(client_tools)
        return turn_id

    def run(self, turn_id: str) -> str:
        return run_turn(self.runtime, turn_id)

    def events(self) -> list[Event]:
        return self.runtime.events.read_after(self.conversation_id, None)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events()]

    def data(self, kind: str) -> list[dict[str, Any]]:
        """The data of the harness conversation's events of ``kind``, in order."""
        return [e.data for e in self.events() if e.kind == kind]

    def calls(self, turn_id: str) -> list[ToolCall]:
        """The tool call rows of ``turn_id``, in model order."""
        with self.sessions() as s:
            return list(
                s.scalars(
                    select(ToolCall)
                    .where(ToolCall.turn_id == turn_id)
                    .order_by(ToolCall.message_id, ToolCall.position)
                )
            )
