"""One turn through real processes with tracing on, its spans read by an OTLP receiver the
test starts: one trace from the gateway's ``user_turn`` through the orchestrator's run, its
model requests and the tool workers' calls to the proposal they made; then the approval's
own trace, where the apply is under the decision and the announcement follows it.

Every service is a real process exporting OTLP/HTTP (protobuf) to the receiver; the model
is the scripted fake Messages API through the real ``anthropic`` SDK.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from signalbox.client import Client
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.users import create_user
from signalbox.shared.events import Event
from signalbox.stack import Stack, StackConfig
from tests.databases import database_for
from tests.fake_anthropic import FakeAnthropic, text, tool_use
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

TURN_TIMEOUT_S = 60.0
SPANS_TIMEOUT_S = 30.0  # the batch processors export every 200 ms here; processes are slow
MARKER = "trace-this-turn"


@pytest.fixture(scope="module")
def traced(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    run_id: str,
    internal_token: str,
) -> Iterator[tuple[Stack, FakeAnthropic, OtlpReceiver, sessionmaker[Session]]]:
    """A stack whose every process exports its spans to ``OtlpReceiver``."""
    var = tmp_path_factory.mktemp("traced-stack")
    database_url = database_for(request, var, "traced")
    engine = make_engine(database_url)
    fake = FakeAnthropic().start()
    receiver = OtlpReceiver().start()
    config = StackConfig(
        var_dir=var,
        redis_url=redis_url,
        database_url=database_url,
        internal_token=internal_token,
        redis_prefix=f"sbtest-{run_id}:traced:",
        tools_concurrency=2,
        extra_env={
            "ANTHROPIC_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": fake.url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "SIGNALBOX_TRACE_REDIS": "true",  # off by default; its spans are checked below
        },
    )
    stack = Stack(config)
    stack.start()
    try:
        yield stack, fake, receiver, make_session_factory(engine)
    finally:
        stack.stop()
        receiver.stop()
        fake.stop()
        engine.dispose()


def _token(sessions: sessionmaker[Session]) -> str:
    with sessions() as session:
        _user, token = create_user(session, f"user-{uuid.uuid4().hex[:8]}")
        session.commit()
        return token


def _until_finished(client: Client, conversation_id: str, turn_id: str) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + TURN_TIMEOUT_S
    for event in client.stream(conversation_id):
        seen.append(event)
        if event.kind == "turn_finished" and event.turn_id == turn_id:
            return seen
        assert time.monotonic() < deadline, f"turn {turn_id} did not finish"
    raise AssertionError("the stream ended")


def _ancestors(span: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> list[ReceivedSpan]:
    """The span's parent, its parent's parent, ... as far as they were received."""
    chain: list[ReceivedSpan] = []
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        chain.append(span)
    return chain


def _one(spans: list[ReceivedSpan], name: str, **attributes: object) -> ReceivedSpan | None:
    found = [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]
    return found[0] if len(found) == 1 else None


def test_a_turn_is_one_trace_from_the_gateway_to_the_tool_workers_and_its_approval_another(
    traced: tuple[Stack, FakeAnthropic, OtlpReceiver, sessionmaker[Session]],
) -> None:
    stack, fake, receiver, sessions = traced
    fake.script_for(
        MARKER,
        [
            [
                text("Looking, then writing."),
                tool_use("list_dir", {"path": "."}),
                tool_use("write_file", {"path": "traced.txt", "content": "hello"}),
            ],
            [text("Proposed traced.txt.")],
        ],
    )
    with Client(stack.gateway_url, _token(sessions)) as sb:
        conversation_id = sb.create_conversation().conversation_id
        turn_id = sb.start_turn(conversation_id, f"{MARKER}: write traced.txt").turn_id
        events = _until_finished(sb, conversation_id, turn_id)
        assert events[-1].data["status"] == "completed", events[-1].data
        [created] = [e for e in events if e.kind == "proposal_created"]
        proposal_id = created.data["proposal_id"]
        assert sb.approve(proposal_id).status == "applied"

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = [s.name for s in spans]
        return (
            _one(spans, "turn.run", **{"signalbox.turn.id": turn_id}) is not None
            and names.count("tool.call") >= 2
            and _one(spans, "proposal.apply", **{"signalbox.proposal.id": proposal_id}) is not None
            # The decision ends after the apply and the announcement under it, so it can come
            # in a later export than they do (it did once, in CI): waited on as well.
            and _one(spans, "proposal.decide", **{"signalbox.proposal.id": proposal_id}) is not None
            and any(
                s.name == "outbox.publish"
                and s.attributes.get("signalbox.outbox.topic") == "proposal_resolved"
                for s in spans
            )
        )

    receiver.wait_for(complete, SPANS_TIMEOUT_S, "the turn's and the approval's spans")
    spans = receiver.received()
    by_id = {s.span_id: s for s in spans}

    # One trace for the turn, rooted at the gateway's HTTP request and its user_turn.
    user_turn = _one(spans, "user_turn", **{"signalbox.turn.id": turn_id})
    assert user_turn is not None and user_turn.service == "signalbox-gateway"
    assert user_turn.attributes["signalbox.conversation.id"] == conversation_id
    trace_id = user_turn.trace_id
    in_trace = [s for s in spans if s.trace_id == trace_id]
    [root] = [s for s in in_trace if not s.parent_id]
    assert root.service == "signalbox-gateway" and root.kind == 2  # SERVER: POST /api/...

    # The orchestrator's run under the gateway's user_turn (across the Celery message).
    run = _one(spans, "turn.run", **{"signalbox.turn.id": turn_id})
    assert run is not None and run.trace_id == trace_id
    assert run.service == "signalbox-orchestrator"
    assert run.attributes["signalbox.turn.outcome"] == "completed"
    assert run.attributes["signalbox.conversation.id"] == conversation_id
    assert user_turn in _ancestors(run, by_id)

    # Each model request a GenAI "chat" span, under its step, under the run.
    chats = [s for s in in_trace if s.attributes.get("gen_ai.operation.name") == "chat"]
    ours = [
        s for s in chats if s.service == "signalbox-orchestrator" and s.name.startswith("chat ")
    ]
    assert len(ours) == 2, [s.name for s in chats]
    # Once each: the SDK's own span (``anthropic.messages.create``), with the same usage
    # attributes, would have a backend that sums them count every request twice.
    assert chats == ours, [(s.service, s.name) for s in chats]
    for chat in ours:
        model = chat.attributes["gen_ai.request.model"]
        assert chat.name == f"chat {model}"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0
        step = by_id[chat.parent_id]
        assert step.name == "turn.step" and run in _ancestors(step, by_id)
    first_step = min(
        (by_id[c.parent_id] for c in ours), key=lambda s: s.attributes["signalbox.turn.step"]
    )
    finish_reasons = {
        by_id[c.parent_id].attributes["signalbox.turn.step"]: c.attributes[
            "gen_ai.response.finish_reasons"
        ]
        for c in ours
    }
    assert sorted(finish_reasons.values()) == [["end_turn"], ["tool_use"]], finish_reasons

    # Each tool call in the tool worker, under the step whose model request asked for it.
    calls = {s.attributes["signalbox.tool.name"]: s for s in in_trace if s.name == "tool.call"}
    assert set(calls) == {"list_dir", "write_file"}, calls
    for call in calls.values():
        assert call.service == "signalbox-tools"
        assert call.attributes["signalbox.tool.status"] == "ok"
        assert call.attributes["signalbox.tool.time_limit_s"] > 0
        assert "signalbox.tool.duration_ms" in call.attributes
        assert first_step in _ancestors(call, by_id)

    # The proposal the write made, under its tool call (over internal HTTP).
    create = _one(spans, "proposal.create", **{"signalbox.proposal.id": proposal_id})
    assert create is not None and create.service == "signalbox-proposals"
    assert calls["write_file"] in _ancestors(create, by_id)

    # The approval: a trace of its own; the apply under the decision, the announcement too.
    decide = _one(spans, "proposal.decide", **{"signalbox.proposal.id": proposal_id})
    assert decide is not None and decide.service == "signalbox-proposals"
    assert decide.attributes["signalbox.proposal.status"] == "applied"
    assert decide.attributes["signalbox.turn.id"] == turn_id
    apply = _one(spans, "proposal.apply", **{"signalbox.proposal.id": proposal_id})
    assert apply is not None and apply.parent_id == decide.span_id
    resolved = [
        s
        for s in spans
        if s.name == "outbox.publish"
        and s.attributes.get("signalbox.outbox.topic") == "proposal_resolved"
        and s.attributes.get("signalbox.proposal.id") == proposal_id
    ]
    assert [s.parent_id for s in resolved] == [decide.span_id]

    # Redis commands are traced inside a turn, never as traces of their own (polling).
    redis_spans = [
        s
        for s in spans
        if "redis" in (s.attributes.get("db.system"), s.attributes.get("db.system.name"))
    ]
    assert redis_spans and all(s.parent_id for s in redis_spans)
