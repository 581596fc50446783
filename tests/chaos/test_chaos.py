"""Durability under faults, with real processes (ARCHITECTURE.md, "Delivery guarantees").

One deployment for the module (``conftest.chaos``): gateway, proposals, 2 orchestrators,
2 tool workers, a private Redis, a private SQLite database and the fake Messages API.
Each test breaks something for real (SIGKILL to a process group, a Redis restart that
loses every key) at a chosen point, then holds the system to its guarantees. Tests run in
file order; each starts by restarting whatever the previous one left dead.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from signalbox.services.orchestrator.lease import holder_pid
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.db.models import Conversation, Message, ToolCall, now
from signalbox.shared.db.models import Turn as TurnRow
from signalbox.shared.ids import new_id
from tests import http_calls
from tests.fake_anthropic import stall, text, tool_use

from .conftest import (
    GRACE_S,
    LEASE_S,
    MAX_TURN_DELIVERIES,
    POISON,
    TOOL_LIMIT_S,
    Chaos,
    Client,
    event,
    wait_for,
)

# Kill → turn_resumed: the lease runs out (LEASE_S), then an orphan sweep (every 0.5 s)
# or Celery's redelivery enqueues it; plus a second of scheduling on a busy 2-core machine.
PICK_UP_S = 2 * LEASE_S + 2.0
# Timed on the test's clock, which also holds the event's way to the client: what a
# saturated 2-core machine adds to that (as test_failure_detection.py allows), never more.
LOADED_ALLOWANCE_S = 5.0
WAIT_STALL_S = 20.0


@pytest.fixture
def user(chaos: Chaos) -> Iterator[Client]:
    chaos.ensure_up()
    _user_id, token = chaos.new_user()
    client = Client(chaos, token)
    yield client
    client.close()


def _start_turn(client: Client, marker: str, conversation_id: str | None = None) -> tuple[str, str]:
    frame: dict[str, Any] = {"type": "user_turn", "text": f"please work on {marker}"}
    if conversation_id is not None:
        frame["conversation_id"] = conversation_id
    ack = client.request(frame)
    assert ack["type"] == "ack", ack
    return ack["conversation_id"], ack["turn_id"]


def _lease_holder(chaos: Chaos, turn_id: str) -> str:
    """The orchestrator running ``turn_id`` now, by the pid in its lease."""
    pid = wait_for(
        lambda: holder_pid(chaos.redis.get(chaos.keys.turn_lease(turn_id))), what="a lease holder"
    )
    return chaos.child_of_pid(pid)


def _count(chaos: Chaos, key: str) -> int:
    return int(chaos.redis.get(counter_key(chaos.keys, key)) or 0)


def _calls(chaos: Chaos, turn_id: str) -> list[ToolCall]:
    with chaos.sessions() as s:
        return list(
            s.scalars(select(ToolCall).where(ToolCall.turn_id == turn_id).order_by(ToolCall.id))
        )


def _requests_with(chaos: Chaos, marker: str) -> list[dict[str, Any]]:
    return [r.body for r in chaos.fake.requests if marker in json.dumps(r.body.get("messages"))]


def _unique_ids(client: Client, turn_id: str) -> None:
    ids = [e["id"] for e in client.of(turn_id)]
    assert len(ids) == len(set(ids)), "an event reached the client twice"


def test_orchestrator_killed_while_streaming_the_model(chaos: Chaos, user: Client) -> None:
    marker = f"stream-{uuid.uuid4().hex[:8]}"
    hang = stall()
    chaos.fake.script_for(
        marker,
        [
            # A short stall paces the stream, so "Let me think" goes out as a text_delta.
            [text("Let me think", chunks=2), stall(timeout_s=0.2), text(" and"), hang],
            [text("Resumed answer.")],
        ],
    )
    _conv, turn_id = _start_turn(user, marker)
    user.wait(event("text_delta", turn_id), what="a text delta before the stall")
    assert hang.reached.wait(WAIT_STALL_S)
    runner = _lease_holder(chaos, turn_id)

    chaos.kill(runner)
    killed_at = time.monotonic()
    hang.release.set()  # the fake's handler finds the socket gone

    user.wait(event("turn_resumed", turn_id), timeout_s=PICK_UP_S + 30, what="turn_resumed")
    picked_up_s = time.monotonic() - killed_at
    done = user.wait(event("turn_finished", turn_id), what="turn_finished")

    assert picked_up_s < PICK_UP_S + LOADED_ALLOWANCE_S, f"picked up after {picked_up_s:.1f} s"
    assert done["data"]["status"] == "completed", done
    kinds = user.kinds(turn_id)
    assert kinds.count("turn_started") == 1 and kinds.count("turn_resumed") == 1
    resumed = next(e for e in user.of(turn_id) if e["kind"] == "turn_resumed")
    assert resumed["data"] == {"step": 0}, "the interrupted step was never committed"
    answers = [e["data"]["text"] for e in user.of(turn_id) if e["kind"] == "assistant_message"]
    assert answers == ["Resumed answer."]
    with chaos.sessions() as s:
        roles = s.scalars(
            select(Message.role).where(Message.turn_id == turn_id).order_by(Message.seq)
        ).all()
    assert roles == ["user", "assistant"], "the user message is written once"
    assert len(_requests_with(chaos, marker)) == 2
    _unique_ids(user, turn_id)


def test_orchestrator_killed_while_waiting_on_a_tool_batch(chaos: Chaos, user: Client) -> None:
    marker = f"batch-{uuid.uuid4().hex[:8]}"
    quick, slow = uuid.uuid4().hex, uuid.uuid4().hex
    chaos.fake.script_for(
        marker,
        [
            [
                text("Two calls."),
                tool_use("count_calls", {"key": quick}),
                tool_use("count_calls", {"key": slow, "hold_s": 2.0}),  # in flight at the kill
            ],
            [text("Both done.")],
        ],
    )
    _conv, turn_id = _start_turn(user, marker)
    started = {
        e["data"]["input"]["key"]: e["data"]["call_id"]
        for e in [
            user.wait(event("tool_call_started", turn_id, input={"key": quick})),
            user.wait(event("tool_call_started", turn_id, input={"key": slow, "hold_s": 2.0})),
        ]
    }
    user.wait(event("tool_call_finished", turn_id, call_id=started[quick]), what="quick call")
    wait_for(lambda: _count(chaos, slow) == 1, what="the slow call to run")
    runner = _lease_holder(chaos, turn_id)

    chaos.kill(runner)
    killed_at = time.monotonic()

    user.wait(event("turn_resumed", turn_id), timeout_s=PICK_UP_S + 30, what="turn_resumed")
    assert time.monotonic() - killed_at < PICK_UP_S + LOADED_ALLOWANCE_S
    done = user.wait(event("turn_finished", turn_id), what="turn_finished")

    assert done["data"]["status"] == "completed", done
    assert _count(chaos, quick) == 1, "a committed call ran again"
    assert _count(chaos, slow) == 1, "the in-flight non-idempotent call ran again"
    calls = _calls(chaos, turn_id)
    assert sorted((c.status, c.attempts) for c in calls) == [("ok", 1), ("ok", 1)]
    assert user.kinds(turn_id).count("tool_call_started") == 2, "nothing was sent twice"
    assert user.kinds(turn_id).count("tool_call_finished") == 2
    final = _requests_with(chaos, marker)[-1]["messages"][-1]["content"]
    assert sorted(b["content"] for b in final if b["type"] == "tool_result") == ["1", "1"]
    _unique_ids(user, turn_id)


def test_orchestrator_killed_while_a_turn_is_parked(chaos: Chaos, user: Client) -> None:
    marker = f"parked-{uuid.uuid4().hex[:8]}"
    chaos.fake.script_for(
        marker,
        [
            [text("A question."), tool_use("ask_user", {"question": "Which colour?"})],
            [text("Blue it is.")],
        ],
    )
    _conv, turn_id = _start_turn(user, marker)
    question = user.wait(event("question", turn_id), what="the question")
    wait_for(lambda: chaos.turn(turn_id).status == "parked", what="the turn to park")

    chaos.kill("orchestrator1")  # a parked turn has no runner: any orchestrator may go
    ack = user.request(
        {"type": "answer", "question_id": question["data"]["question_id"], "text": "blue"}
    )
    assert ack["type"] == "ack", ack
    done = user.wait(event("turn_finished", turn_id), what="turn_finished")

    assert done["data"]["status"] == "completed", done
    final = _requests_with(chaos, marker)[-1]["messages"][-1]["content"]
    assert [b["content"] for b in final if b["type"] == "tool_result"] == ["blue"]
    _unique_ids(user, turn_id)


def test_a_turn_longer_than_the_visibility_timeout_runs_once(chaos: Chaos, user: Client) -> None:
    marker = f"long-{uuid.uuid4().hex[:8]}"
    hang = stall()
    chaos.fake.script_for(marker, [[text("Slow", chunks=1), hang, text(" answer.", chunks=1)]])
    _conv, turn_id = _start_turn(user, marker)
    assert hang.reached.wait(WAIT_STALL_S)
    redelivered = f"run_turn({turn_id}): another runner holds the lease"

    def a_second_delivery_did_nothing() -> bool:
        names = [n for n in chaos.children if n.startswith("orchestrator")]
        return any(redelivered in chaos.log_text(n) for n in names)

    # Redis hands the unacknowledged message out again after VISIBILITY_TIMEOUT_S.
    wait_for(a_second_delivery_did_nothing, what="Redis to redeliver the running turn")
    hang.release.set()
    done = user.wait(event("turn_finished", turn_id), what="turn_finished")

    assert done["data"]["status"] == "completed", done
    assert user.kinds(turn_id) == [
        "turn_queued",
        "turn_started",
        *["text_delta"] * user.kinds(turn_id).count("text_delta"),
        "assistant_message",
        "turn_finished",
    ]
    deltas = "".join(e["data"]["text"] for e in user.of(turn_id) if e["kind"] == "text_delta")
    assert deltas == "Slow answer."
    assert len(_requests_with(chaos, marker)) == 1, "the model was called once"
    _unique_ids(user, turn_id)


def test_a_tools_worker_killed_mid_call(chaos: Chaos, user: Client) -> None:
    marker = f"toolkill-{uuid.uuid4().hex[:8]}"
    again, once = uuid.uuid4().hex, uuid.uuid4().hex
    chaos.fake.script_for(
        marker,
        [
            [
                text("Three."),
                # Idempotent; 3 s, under TOOL_LIMIT_S, leaves the kill below time to land
                # while it runs on a loaded machine (1.5 s did not always).
                tool_use("sleep", {"seconds": 3.0, "count_key": again}),
                tool_use("count_calls", {"key": once, "hold_s": 60}),  # not idempotent
                tool_use("list_dir", {"path": "."}),
            ],
            [text("Noted.")],
        ],
    )
    _conv, turn_id = _start_turn(user, marker)
    user.wait(event("tool_call_finished", turn_id, tool="list_dir"), what="list_dir")
    call_ids = {c.tool: c.id for c in _calls(chaos, turn_id) if c.tool != "list_dir"}

    def claimed_by() -> set[str] | None:
        """The tool workers running both slow calls, once both run (claims name host:pid)."""
        holders = [chaos.redis.get(chaos.keys.call_claim(call_ids[t])) for t in call_ids]
        if _count(chaos, once) != 1 or _count(chaos, again) != 1:
            return None
        pids = [int(str(h, "utf-8").rsplit(":", 1)[1]) for h in holders if isinstance(h, bytes)]
        return {chaos.child_of_pid(pid) for pid in pids}

    victims = wait_for(claimed_by, what="both slow calls to be running")
    for name in victims:  # one worker, or both if the calls landed on different ones
        chaos.kill(name)
    chaos.start(*victims, wait=False)  # back soon, as a supervisor would restart them

    done = user.wait(event("turn_finished", turn_id), timeout_s=45, what="turn_finished")

    assert done["data"]["status"] == "completed", done
    finished = {
        e["data"]["tool"]: e["data"] for e in user.of(turn_id) if e["kind"] == "tool_call_finished"
    }
    assert finished["list_dir"]["status"] == "ok"
    assert finished["sleep"]["status"] == "ok", "an idempotent call is run again"
    assert _count(chaos, again) >= 2
    lost = finished["count_calls"]
    assert lost["status"] == "lost", lost
    assert _count(chaos, once) == 1, "a non-idempotent call is never run twice"
    # Ended by its heartbeat (tests/chaos/test_failure_detection.py), at the latest by its
    # deadline.
    assert lost["duration_ms"] < (TOOL_LIMIT_S + GRACE_S) * 1000 + 3000
    final = json.dumps(_requests_with(chaos, marker)[-1]["messages"][-1])
    assert "may or may not have taken effect" in final, "the model is told what lost means"
    assert chaos.fake.violations == []
    chaos.wait_ready(*victims)


def test_a_poison_turn_is_given_up_after_its_delivery_limit(chaos: Chaos, user: Client) -> None:
    orchestrators = ["orchestrator1", "orchestrator2"]
    _conv, turn_id = _start_turn(user, f"{POISON} {uuid.uuid4().hex[:8]}")

    # Each delivery kills the orchestrator that takes it; MAX_TURN_DELIVERIES of them die.
    user.wait(event("turn_resumed", turn_id), timeout_s=PICK_UP_S + 5, what="a 2nd delivery")
    wait_for(
        lambda: not any(chaos.children[n].alive() for n in orchestrators),
        timeout_s=PICK_UP_S,
        what="the poison turn to kill both orchestrators",
    )
    assert user.kinds(turn_id).count("turn_resumed") == MAX_TURN_DELIVERIES - 1
    chaos.start(*orchestrators)
    done = user.wait(event("turn_finished", turn_id), timeout_s=PICK_UP_S + 10)

    assert done["data"]["status"] == "failed"
    assert f"given up after {MAX_TURN_DELIVERIES} deliveries" in done["data"]["error"]
    assert chaos.turn(turn_id).status == "failed"
    assert all(chaos.children[n].alive() for n in orchestrators), "the next delivery survived"
    assert _requests_with(chaos, POISON) == []


def test_redis_restart_with_data_lost(chaos: Chaos, user: Client) -> None:
    running, waiting, after = (f"redis-{i}-{uuid.uuid4().hex[:8]}" for i in range(3))
    chaos.fake.script_for(
        running,
        [[text("Working."), tool_use("sleep", {"seconds": 1.5})], [text("Running turn done.")]],
    )
    chaos.fake.script_for(waiting, [[text("Queued turn done.")]])
    lost_turn = _queued_turn_whose_message_is_lost(chaos, user, waiting)
    chaos.fake.script_for(after, [[text("New turn done.")]])
    conv_id, turn_id = _start_turn(user, running)
    user.wait(event("tool_call_started", turn_id), what="the call in flight")
    last_seen = user.events[-1]["id"]

    chaos.restart_redis_empty()  # every key is gone: queues, leases, streams, catalogue

    # Orchestrators adopt the unfinished turns from SQL; a fresh socket resubscribes from
    # the last id it saw (those ids are gone; what the stream holds now comes after them).
    wait_for(lambda: _ready(chaos), what="the gateway to reach Redis again")
    fresh = Client(chaos, user.token)
    try:
        reply = fresh.request({"type": "subscribe", "conversation_id": conv_id, "after": last_seen})
        assert reply["type"] == "ack", reply
        done = fresh.wait(event("turn_finished", turn_id), what="the running turn to finish")
        assert done["data"]["status"] == "completed", done
        assert "turn_resumed" in fresh.kinds(turn_id)
        _unique_ids(fresh, turn_id)

        wait_for(lambda: chaos.turn(lost_turn).status == "completed", what="the queued turn")

        _conv2, new_turn = _start_turn(fresh, after)
        finished = fresh.wait(event("turn_finished", new_turn), what="a new turn to finish")
        assert finished["data"]["status"] == "completed"
    finally:
        fresh.close()

    call = _calls(chaos, turn_id)[0]
    assert call.status in ("ok", "lost"), "the call in flight resumed or failed visibly"
    with chaos.sessions() as s:
        texts = [
            json.dumps(content)
            for content in s.scalars(
                select(Message.content).where(Message.turn_id == turn_id).order_by(Message.seq)
            )
        ]
    assert running in texts[0] and "Working." in texts[1] and "Running turn done." in texts[2]
    body = http_calls.get(
        f"{chaos.stack.gateway_url}/api/conversations/{conv_id}",
        headers={"Authorization": f"Bearer {user.token}"},
    )
    assert body.status_code == 200 and "Running turn done." in body.text


def _ready(chaos: Chaos) -> bool:
    try:
        return http_calls.get(f"{chaos.stack.gateway_url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _queued_turn_whose_message_is_lost(chaos: Chaos, user: Client, marker: str) -> str:
    """A turn stored and admitted as the gateway does it, whose Celery message the Redis
    restart takes (it is never sent here: what is left after a loss is the SQL row alone)."""
    created = http_calls.post(
        f"{chaos.stack.gateway_url}/api/conversations",
        json={"workspace": "default", "title": marker},
        headers={"Authorization": f"Bearer {user.token}"},
    )
    assert created.status_code == 201, created.text
    conversation_id = created.json()["conversation_id"]
    with chaos.sessions() as s, s.begin():
        conversation = s.get(Conversation, conversation_id)
        assert conversation is not None
        turn = TurnRow(
            id=new_id("turn"),
            conversation_id=conversation_id,
            user_id=conversation.user_id,
            seq=1,
            text=f"please work on {marker}",
            status="queued",
            deployment=chaos.keys.prefix,
            admitted_at=now(),
        )
        s.add(turn)
    return turn.id


def test_no_turn_is_left_unfinished(chaos: Chaos) -> None:
    wait_for(lambda: not chaos.unfinished_turns(), what="every turn to finish")
    for name, child in chaos.children.items():
        if name.startswith("orchestrator"):
            assert child.alive(), f"{name} died:\n{child.log_tail()}"
