"""Webhook deliveries of the loop's own events commit with the step that makes them: the
turn's start (``store.open_turn``), the step's calls (``store.store_step``), their results
(``store.record_results``) and the turn's end (``store.finish_turn``) run on a bare
connection, and a delivery due joins its transaction."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.model import ToolUse
from signalbox.shared.db.models import Message, ToolCall
from signalbox.shared.db.webhooks import Webhook, WebhookDelivery, enqueue
from signalbox.shared.ids import new_id

from .support import Harness, ok, say, spec, use

KINDS = ["turn_started", "tool_call_finished", "turn_finished"]


def _webhook_and_a_tool(h: Harness, kinds: list[str]) -> str:
    """A webhook of the harness's user for ``kinds`` (its id), and a ``read_file`` tool."""
    webhook_id = new_id("wh")
    with h.sessions() as s, s.begin():
        hook = Webhook(id=webhook_id, user_id=h.user_id, url="https://example.com/h", secret="x")
        hook.kinds = kinds
        s.add(hook)
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("hello")
    return webhook_id


def _deliveries(h: Harness, webhook_id: str) -> list[tuple[str, dict[str, object]]]:
    with h.sessions() as s:
        rows = s.execute(
            select(WebhookDelivery.kind, WebhookDelivery.body).where(
                WebhookDelivery.webhook_id == webhook_id
            )
        ).all()
    return [(kind, json.loads(body)) for kind, body in rows]


def test_a_steps_calls_and_results_queue_their_webhook_deliveries(harness: Harness) -> None:
    h = harness
    webhook_id = _webhook_and_a_tool(h, KINDS)
    # read_file ends with its result (record_results); a tool nobody serves ends in the
    # step itself (store_step).
    h.model.steps = [say("Two.", use("read_file", path="a"), use("no_such_tool")), say("Done.")]

    turn_id = h.turn("go")
    assert h.run(turn_id) == "completed"

    calls = {c.tool: c for c in h.calls(turn_id)}
    assert calls["read_file"].status == "ok" and calls["no_such_tool"].status != "ok"
    queued = _deliveries(h, webhook_id)
    finished = sorted(
        (str(body["data"]["call_id"]), body["data"]["status"])  # type: ignore[index]
        for kind, body in queued
        if kind == "tool_call_finished"
    )
    assert finished == sorted((c.id, c.status) for c in (calls["read_file"], calls["no_such_tool"]))
    kinds = [kind for kind, _ in queued]
    assert kinds.count("turn_started") == 1 and kinds.count("turn_finished") == 1
    assert {body["turn_id"] for _, body in queued} == {turn_id}


def test_no_delivery_is_queued_for_kinds_nobody_subscribed(harness: Harness) -> None:
    h = harness
    webhook_id = _webhook_and_a_tool(h, [])
    h.model.steps = [say("One.", use("read_file", path="a")), say("Done.")]

    assert h.run(h.turn("go")) == "completed"

    assert _deliveries(h, webhook_id) == []


def test_a_step_that_fails_after_queueing_a_delivery_leaves_neither(harness: Harness) -> None:
    """The delivery is written in the step's transaction: a failure later in it (here, in
    ``then`` itself) rolls back the step, its calls and the delivery together."""
    h = harness
    webhook_id = _webhook_and_a_tool(h, KINDS)
    info = store.load_turn(h.sessions, h.turn("go"))
    assert info is not None
    store.open_turn(h.sessions, info, "test-model")
    planned = [store.PlannedCall(ToolUse("toolu_x", "read_file", {}), 5.0, "pending")]

    def queue_then_fail(conn: Connection, calls: Sequence[ToolCall]) -> None:
        with Session(bind=conn, join_transaction_mode="rollback_only") as session:
            data = {"call_id": calls[0].id, "status": "error"}
            assert (
                enqueue(session, h.user_id, info.conversation_id, "tool_call_finished", data) == 1
            )
        raise RuntimeError("the step's transaction fails after the delivery")

    with pytest.raises(RuntimeError, match="after the delivery"):
        store.store_step(h.sessions, info, "calling", planned, 3, 2, then=queue_then_fail)

    assert _deliveries(h, webhook_id) == []
    with h.sessions() as s:
        assert s.scalars(select(ToolCall).where(ToolCall.turn_id == info.turn_id)).all() == []
        assistant = select(Message).where(
            Message.turn_id == info.turn_id, Message.role == "assistant"
        )
        assert s.scalars(assistant).all() == []
