"""Proposal decisions in the orchestrator: the approvals feed (``approvals.py``) and what the
model is told (``transcript.py``).

Real Redis pub/sub and SQL; the real proposals service (in process) creates, decides and
publishes through its outbox; the real ``anthropic`` SDK talks to the fake Messages API,
whose recorded requests show what the model saw.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.orchestrator import model_step
from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.approvals import ApprovalFeed, Resolution
from signalbox.services.orchestrator.transcript import (
    ProposalNote,
    build_messages,
    load_proposal_notes,
)
from signalbox.services.proposals.app import create_app
from signalbox.shared.db.models import Proposal, now
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ProposalsSettings
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult
from tests.fake_anthropic import FakeAnthropic, Stall, text, tool_use

from .support import Harness, make_conversation, make_turn, ok, spec, wait_for


@dataclass
class Heard:
    """What a feed's listener was told, in order."""

    items: list[tuple[str, int, str]] = field(default_factory=list)

    def __call__(self, resolution: Resolution, source: str) -> None:
        self.items.append((resolution.proposal_id, resolution.version, source))

    def of(self, proposal_id: str) -> list[tuple[str, int, str]]:
        return [item for item in self.items if item[0] == proposal_id]


@dataclass
class Feed:
    feed: ApprovalFeed
    heard: Heard
    name: str  # the feed connection's CLIENT SETNAME


@pytest.fixture
def make_feed(
    redis_url: str, test_keys: RedisKeys, db_sessions: sessionmaker[Session]
) -> Iterator[Callable[[], Feed]]:
    """A factory of started, live feeds on this test's approvals channel; stopped at teardown."""
    made: list[ApprovalFeed] = []

    def make() -> Feed:
        name = f"approvals-test-{uuid.uuid4().hex[:8]}"
        client = redis.Redis.from_url(redis_url, client_name=name)
        heard = Heard()
        feed = ApprovalFeed(client, test_keys.approvals_channel, db_sessions, heard)
        made.append(feed)
        feed.start()
        wait_for(lambda: feed.live, what="the feed to subscribe")
        return Feed(feed, heard, name)

    yield make
    for feed in made:
        feed.stop()


def _publish(client: redis.Redis, keys: RedisKeys, proposal_id: str, version: int) -> None:
    payload = {
        "proposal_id": proposal_id,
        "conversation_id": "conv_x",
        "user_id": "user_x",
        "status": "applied",
        "version": version,
        "turn_id": None,
    }
    client.publish(keys.approvals_channel, json.dumps(payload))


def _decided_proposal(
    sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> tuple[str, str]:
    """A proposal the proposals service decided (committed), in a conversation with a live
    turn; returns (proposal id, conversation id)."""
    user_id, _token = make_user()
    conversation_id = make_conversation(sessions, user_id)
    make_turn(sessions, conversation_id, user_id, "still going", 1)
    proposal_id = new_id("prop")
    with sessions() as s, s.begin():
        s.add(
            Proposal(
                id=proposal_id,
                user_id=user_id,
                conversation_id=conversation_id,
                workspace="default",
                status="rejected",
                version=2,
                decided_at=now(),
            )
        )
    return proposal_id, conversation_id


def test_a_decision_published_twice_is_handled_once(
    make_feed: Callable[[], Feed], redis_client: redis.Redis, test_keys: RedisKeys
) -> None:
    f = make_feed()
    stamp = f.feed.stamp("conv_x")

    _publish(redis_client, test_keys, "prop_twice", 2)
    _publish(redis_client, test_keys, "prop_twice", 2)  # the outbox relay published it again
    _publish(redis_client, test_keys, "prop_twice", 1)  # older than what is known
    _publish(redis_client, test_keys, "prop_later", 2)
    # Pub/sub keeps the order: once the last is handled, the three before it were read.
    wait_for(lambda: bool(f.heard.of("prop_later")), what="the last message to be handled")

    assert f.heard.of("prop_twice") == [("prop_twice", 2, "pubsub")]
    assert f.feed.stamp("conv_x") != stamp  # what the loop checks before reusing proposals
    _publish(redis_client, test_keys, "prop_twice", 3)  # a newer decision of the same one
    wait_for(lambda: len(f.heard.of("prop_twice")) == 2, what="the newer version")


def test_a_decision_made_while_the_feed_was_stopped_is_reconciled_from_sql(
    make_feed: Callable[[], Feed],
    redis_client: redis.Redis,
    test_keys: RedisKeys,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    f = make_feed()
    f.feed.stop()
    assert f.feed.stamp("conv_x") is None  # not live: a runner reads SQL every step

    proposal_id, conversation_id = _decided_proposal(db_sessions, make_user)
    _publish(redis_client, test_keys, proposal_id, 2)  # nobody listens: dropped
    assert f.heard.of(proposal_id) == []

    f.feed.start()
    wait_for(lambda: bool(f.heard.of(proposal_id)), what="the reconcile to find the decision")
    assert f.heard.of(proposal_id) == [(proposal_id, 2, "sql")]
    assert f.feed.subscriptions == 2
    wait_for(lambda: f.feed.live, what="the feed to be live again")
    assert f.feed.stamp(conversation_id) is not None


def test_a_killed_subscriber_connection_resubscribes_and_reconciles(
    make_feed: Callable[[], Feed],
    redis_client: redis.Redis,
    test_keys: RedisKeys,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    f = make_feed()
    # Committed after the feed subscribed, and its publish lost: only a reconcile can find it.
    proposal_id, conversation_id = _decided_proposal(db_sessions, make_user)
    _publish(redis_client, test_keys, "prop_marker", 2)
    wait_for(lambda: bool(f.heard.of("prop_marker")), what="the marker")
    assert f.heard.of(proposal_id) == []
    stamp = f.feed.stamp(conversation_id)

    [connection] = [c for c in redis_client.client_list(_type="pubsub") if c["name"] == f.name]
    assert redis_client.client_kill_filter(_id=connection["id"]) == 1

    wait_for(lambda: bool(f.heard.of(proposal_id)), what="the decision after the reconnect")
    assert f.heard.of(proposal_id) == [(proposal_id, 2, "sql")]
    wait_for(lambda: f.feed.live, what="the feed to be live again")
    assert f.feed.subscriptions >= 2
    assert f.feed.stamp(conversation_id) != stamp
    _publish(redis_client, test_keys, "prop_after", 2)  # and it still hears new ones
    wait_for(lambda: bool(f.heard.of("prop_after")), what="a decision after the reconnect")


def test_each_outcome_is_told_with_the_call_that_proposed_it() -> None:
    @dataclass
    class Row:
        id: str
        role: str = "assistant"
        content: list[Any] = field(default_factory=list)

    @dataclass
    class Call:
        id: str
        tool_use_id: str
        message_id: str = "m1"
        position: int = 0
        tool: str = "write_file"
        status: str = "ok"
        output: str | None = "proposed, awaiting approval (proposal_id prop_a)"
        error: str | None = None
        timeout_s: float = 5.0

    uses = [{"type": "tool_use", "id": f"tu{i}", "name": "write_file", "input": {}} for i in "12"]
    calls = [Call("call_1", "tu1"), Call("call_2", "tu2", position=1)]
    notes = {
        "call_1": [
            ProposalNote("prop_b", "applied", split_from="prop_a"),
            ProposalNote("prop_a", "conflict", "a.txt changed since it was proposed"),
        ],
        "call_2": [
            ProposalNote("prop_c", "rejected", "not that file"),
            ProposalNote("prop_d", "cancelled"),
        ],
    }

    messages = build_messages([Row("m1", content=uses)], {"m1": calls}, notes)

    first, second = messages[1]["content"]
    assert first["content"] == (
        "proposed, awaiting approval (proposal_id prop_a)\n"
        "proposal prop_b (the approved part of proposal prop_a) was applied by the human\n"
        "proposal prop_a was approved but could not be applied (conflict: a.txt changed since "
        "it was proposed); nothing was written"
    )
    assert second["content"].endswith(
        "proposal prop_c was rejected by the human: not that file; nothing was written\n"
        "proposal prop_d was withdrawn because its turn was cancelled; nothing was written"
    )
    assert build_messages([Row("m1", content=uses)], {"m1": calls})[1]["content"][1]["content"] == (
        "proposed, awaiting approval (proposal_id prop_a)"
    )


def _tool_results(body: dict[str, Any]) -> list[str]:
    return [
        str(block.get("content"))
        for message in body["messages"]
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def test_the_next_model_step_sees_a_proposal_the_human_approved_meanwhile(
    harness: Harness,
    fake_anthropic: FakeAnthropic,
    make_feed: Callable[[], Feed],
    orch_settings: Any,
    internal_token: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, fake = harness, fake_anthropic
    f = make_feed()
    h.runtime.approvals = f.feed
    h.runtime.model = AnthropicModel("sk-test", fake.url, "claude-test")
    reads: list[str] = []

    def counted(session: Session, conversation_id: str) -> Any:
        reads.append(conversation_id)
        return load_proposal_notes(session, conversation_id)

    monkeypatch.setattr(model_step, "load_proposal_notes", counted)
    settings = ProposalsSettings(
        redis_url=orch_settings.redis_url,
        redis_prefix=h.runtime.keys.prefix,
        database_url=orch_settings.database_url,
        internal_token=internal_token,
        workspaces_root=tmp_path / "workspaces",
    )
    proposed: list[str] = []
    with TestClient(create_app(settings)) as proposals:

        def write_file(req: ToolCallRequest) -> ToolResult:
            answer = proposals.post(
                "/internal/proposals",
                headers={"X-Signalbox-Internal-Token": internal_token},
                json={
                    "user_id": req.user_id,
                    "conversation_id": req.conversation_id,
                    "turn_id": req.turn_id,
                    "call_id": req.call_id,
                    "workspace": req.workspace,
                    "summary": "add a.txt",
                    "files": [
                        {"path": "a.txt", "operation": "create", "after": "hi\n"},
                    ],
                },
            )
            assert answer.status_code == 201, answer.text
            proposed.append(answer.json()["proposal_id"])
            return ToolResult(
                call_id=req.call_id,
                status="ok",
                output=f"proposed, awaiting approval (proposal_id {proposed[-1]})",
                extra={"proposal_id": proposed[-1]},
            )

        h.catalogue(spec("write_file", side_effect="propose"), spec("look"))
        h.dispatcher.tools.update(write_file=write_file, look=ok("looked"))
        meanwhile = Stall(timeout_s=20)
        fake.script(
            [
                [text("Writing."), tool_use("write_file", {"path": "a.txt"})],
                [text("Waiting for you."), meanwhile, tool_use("look", {})],
                [text("Done.")],
            ]
        )
        turn_id = h.turn("write a.txt")
        outcome: list[str] = []
        runner = threading.Thread(target=lambda: outcome.append(h.run(turn_id)), daemon=True)
        runner.start()

        # The human approves while the model is still answering its second step.
        assert meanwhile.reached.wait(20), "the second step never started"
        [proposal_id] = proposed
        approved = proposals.post(
            f"/api/proposals/{proposal_id}/approve",
            headers={"Authorization": f"Bearer {h.token}"},
        )
        assert approved.json()["status"] == "applied", approved.text
        wait_for(lambda: bool(f.heard.of(proposal_id)), what="the feed to hear the approval")
        meanwhile.release.set()
        runner.join(20)

    assert outcome == ["completed"]
    assert fake.violations == []
    steps = [r.body for r in fake.requests]
    assert len(steps) == 3
    told = f"proposal {proposal_id} was applied by the human"
    assert not any(told in result for result in _tool_results(steps[1]))
    [write_result, _look] = _tool_results(steps[2])
    assert write_result == (f"proposed, awaiting approval (proposal_id {proposal_id})\n{told}")
    # Step 2 reused step 1's read (nothing decided in between); the approval made step 3 read.
    assert reads == [h.conversation_id, h.conversation_id]
    assert f.heard.of(proposal_id) == [(proposal_id, 2, "pubsub")]
