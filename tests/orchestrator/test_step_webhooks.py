"""Webhook deliveries of the loop's own events commit with the step that makes them: the
step's calls (``store.store_step``) and their results (``store.record_results``) run on a
bare connection, and a delivery due joins its transaction."""

from __future__ import annotations

import json

from sqlalchemy import select

from signalbox.shared.db.webhooks import Webhook, WebhookDelivery
from signalbox.shared.ids import new_id

from .support import Harness, ok, say, spec, use

KINDS = ["tool_call_finished", "turn_finished"]


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
    webhook_id = new_id("wh")
    with h.sessions() as s, s.begin():
        s.add(
            Webhook(
                id=webhook_id,
                user_id=h.user_id,
                url="https://example.com/h",
                kinds=KINDS,
                secret="x",
            )
        )
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("hello")
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
    assert [kind for kind, _ in queued].count("turn_finished") == 1
    assert {body["turn_id"] for _, body in queued} == {turn_id}


def test_no_delivery_is_queued_for_kinds_nobody_subscribed(harness: Harness) -> None:
    h = harness
    webhook_id = new_id("wh")
    with h.sessions() as s, s.begin():
        s.add(
            Webhook(
                id=webhook_id, user_id=h.user_id, url="https://example.com/h", kinds=[], secret="x"
            )
        )
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("hello")
    h.model.steps = [say("One.", use("read_file", path="a")), say("Done.")]

    assert h.run(h.turn("go")) == "completed"

    assert _deliveries(h, webhook_id) == []
