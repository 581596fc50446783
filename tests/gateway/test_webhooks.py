"""Webhooks end to end: registered over the real gateway, queued by a real turn of the
orchestrator loop (real Redis and SQL, scripted model), delivered by the gateway's
deliverer thread to a real HTTP receiver in this test; and the refusals, written as the
attacks they stop."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.gateway.webhook_deliverer import deliver_due
from signalbox.services.orchestrator.loop import Runtime, run_turn
from signalbox.services.orchestrator.model import ModelEvent
from signalbox.services.tools.catalogue import load_tools
from signalbox.services.tools.execution import Deps, context_for, execute
from signalbox.services.tools.proposals_client import make_client
from signalbox.shared.db.webhooks import enqueue
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import OrchestratorSettings, ToolsSettings
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult, ToolSpec, publish_catalogue
from tests import http_calls
from tests.orchestrator.support import (
    Behaviour,
    ScriptedModel,
    ThreadDispatcher,
    make_conversation,
    make_turn,
    say,
    use,
    wait_for,
)

from .conftest import LiveGateway, ServerThread


@dataclass
class Receiver:
    """A webhook receiver that answers 500 to its first ``failures`` requests, then 200."""

    failures: int
    requests: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = 500 if len(receiver.requests) < receiver.failures else 200
                receiver.requests.append((dict(self.headers.items()), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(failures=2).start()
    yield r
    r.stop()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _run_a_turn(
    sessions: sessionmaker[Session],
    client: redis.Redis,
    redis_url: str,
    db_url: str,
    user: str,
    steps: list[list[ModelEvent]] | None = None,
    tools: dict[str, tuple[ToolSpec, Behaviour]] | None = None,
) -> str:
    """One real turn of the orchestrator loop for ``user``: the scripted ``steps`` (by default
    a one-step answer), ``tools`` offered by one live worker and run in threads."""
    keys = RedisKeys(f"sb-test-webhooks-{user}:")
    settings = OrchestratorSettings(
        redis_url=redis_url, redis_prefix=keys.prefix, database_url=db_url
    )
    tools = tools or {}
    publish_catalogue(client, keys, "test-worker", [spec for spec, _ in tools.values()], 60)
    runtime = Runtime(
        settings=settings,
        sessions=sessions,
        redis=client,
        keys=keys,
        model=ScriptedModel(steps or [say("Done here.")]),
        dispatcher=ThreadDispatcher(client, keys, {name: run for name, (_, run) in tools.items()}),
        enqueue_turn=lambda _turn_id: None,
    )
    conversation_id = make_conversation(sessions, user)
    turn_id = make_turn(sessions, conversation_id, user, "hello", 1)
    assert run_turn(runtime, turn_id) == "completed"
    return turn_id


def test_a_receiver_that_fails_twice_gets_one_signed_delivery_on_the_third_attempt(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
    redis_url: str,
    database_url: str,
    receiver: Receiver,
) -> None:
    gateway = start_gateway(webhook_allow_private=True, webhook_backoff_s=0.2, webhook_poll_s=0.05)
    user_id, token = make_user()
    created = http_calls.post(
        f"{gateway.url}/api/webhooks",
        json={"url": receiver.url, "kinds": ["turn_finished"]},
        headers=_auth(token),
    )
    assert created.status_code == 201, created.text
    webhook = created.json()
    secret = webhook["secret"]
    assert secret.startswith("whsec_")

    turn_id = _run_a_turn(db_sessions, redis_client, redis_url, database_url, user_id)

    def shown() -> dict[str, Any]:
        answer = http_calls.get(
            f"{gateway.url}/api/webhooks/{webhook['id']}",
            headers=_auth(token),
        )
        assert answer.status_code == 200
        body: dict[str, Any] = answer.json()
        return body

    wait_for(
        lambda: (shown()["last_delivery"] or {}).get("status") == "delivered",
        timeout_s=15,
        what="the delivery to succeed",
    )
    detail = shown()
    assert "secret" not in detail
    [delivery] = detail["deliveries"]
    assert delivery["attempts"] == 3 and delivery["last_status_code"] == 200
    assert [status for _h, _b, status in receiver.requests] == [500, 500, 200]
    bodies = {body for _h, body, _s in receiver.requests}
    assert len(bodies) == 1, "every attempt sends the same body"
    headers, body, _status = receiver.requests[-1]
    event = json.loads(body)
    assert event["kind"] == "turn_finished" and event["turn_id"] == turn_id
    assert event["data"]["status"] == "completed"
    assert headers["X-Signalbox-Delivery"] == delivery["id"]
    parts = dict(p.split("=", 1) for p in headers["X-Signalbox-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
    assert hmac.compare_digest(parts["v1"], expected.hexdigest())

    # The same event emitted again (a runner resumed after a crash) queues nothing new.
    with db_sessions() as s, s.begin():
        data = {"status": "completed"}
        assert enqueue(s, user_id, event["conversation_id"], "turn_finished", data, turn_id) == 0
    assert len(shown()["deliveries"]) == 1


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",  # loopback: Redis, the database, the proposals service
        "http://localhost/hook",  # a name resolving to loopback
        "http://169.254.169.254/latest/meta-data/",  # link-local: cloud metadata
        "http://10.0.0.5/hook",  # private
        "http://[::ffff:127.0.0.1]/hook",  # loopback inside an IPv6 form
        "http://user:pw@example.com/hook",  # credentials in the URL
        "file:///etc/passwd",  # not http(s)
    ],
)
def test_a_webhook_url_inside_the_deployment_is_refused(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    url: str,
) -> None:
    gateway = start_gateway()
    _user_id, token = make_user()

    answer = http_calls.post(
        f"{gateway.url}/api/webhooks",
        json={"url": url, "kinds": ["turn_finished"]},
        headers=_auth(token),
    )

    assert answer.status_code == 422, answer.text
    assert http_calls.get(f"{gateway.url}/api/webhooks", headers=_auth(token)).json() == []


def test_a_delivery_whose_host_now_resolves_inside_is_refused_at_send_time(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    receiver: Receiver,
) -> None:
    # Registered while allowed; the deployment then forbids private targets (as a host
    # that rebinds to 127.0.0.1 after its check would be): nothing reaches the receiver.
    allowing = start_gateway(webhook_allow_private=True, webhook_poll_s=3600)
    strict = allowing.settings.model_copy(update={"webhook_allow_private": False})
    user_id, token = make_user()
    created = http_calls.post(
        f"{allowing.url}/api/webhooks",
        json={"url": receiver.url, "kinds": ["proposal_created"]},
        headers=_auth(token),
    ).json()
    sessions = allowing.app.state.gateway.sessions
    with sessions() as s, s.begin():
        assert enqueue(s, user_id, "conv_x", "proposal_created", {"proposal_id": "p1"}) == 1

    assert deliver_due(sessions, strict) == 1

    detail = http_calls.get(
        f"{allowing.url}/api/webhooks/{created['id']}", headers=_auth(token)
    ).json()
    [delivery] = detail["deliveries"]
    assert delivery["status"] == "pending" and delivery["attempts"] == 1
    assert "loopback" in delivery["last_error"]
    assert receiver.requests == []


def test_another_users_webhook_is_not_found(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    gateway = start_gateway(webhook_allow_private=True)
    _owner, owner_token = make_user()
    _intruder, intruder_token = make_user()
    created = http_calls.post(
        f"{gateway.url}/api/webhooks",
        json={"url": "http://127.0.0.1:9/hook", "kinds": ["turn_finished"]},
        headers=_auth(owner_token),
    ).json()
    path = f"{gateway.url}/api/webhooks/{created['id']}"

    assert http_calls.get(path, headers=_auth(intruder_token)).status_code == 404
    assert http_calls.delete(path, headers=_auth(intruder_token)).status_code == 404
    assert http_calls.get(f"{gateway.url}/api/webhooks", headers=_auth(intruder_token)).json() == []
    assert http_calls.get(path, headers=_auth(owner_token)).status_code == 200
    assert http_calls.delete(path, headers=_auth(owner_token)).status_code == 200
    assert http_calls.get(path, headers=_auth(owner_token)).status_code == 404
    assert http_calls.get(
        f"{gateway.url}/api/webhooks/..%2f..", headers=_auth(owner_token)
    ).status_code in (
        404,
        422,
    )


def _real_tool(name: str, deps: Deps) -> tuple[ToolSpec, Behaviour]:
    """Signalbox's own tool ``name``, run as a tool worker runs it (against ``deps``)."""
    tool = deps.registry.get(name)
    assert tool is not None

    def run(request: ToolCallRequest) -> ToolResult:
        return execute(request, context_for(request, deps), deps.registry)

    return tool.spec, run


def test_a_proposal_of_a_real_turn_is_delivered_to_its_proposal_created_webhook(
    start_gateway: Callable[..., LiveGateway],
    proposals: ServerThread,
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
    redis_url: str,
    database_url: str,
    service_env: dict[str, str],
    internal_token: str,
) -> None:
    # The proposals service announces proposal_created from its outbox relay, not the
    # orchestrator: the delivery is queued there, in the transaction that marks it sent.
    receiver = Receiver(failures=0).start()
    try:
        workspaces = Path(service_env["SIGNALBOX_WORKSPACES_ROOT"])
        gateway = start_gateway(
            webhook_allow_private=True,
            webhook_poll_s=0.05,
            proposals_url=proposals.url,
            workspaces_root=workspaces,
        )
        user_id, token = make_user()
        (workspaces / user_id / "default").mkdir(parents=True)
        created = http_calls.post(
            f"{gateway.url}/api/webhooks",
            json={"url": receiver.url, "kinds": ["proposal_created", "proposal_resolved"]},
            headers=_auth(token),
        )
        assert created.status_code == 201, created.text
        webhook = created.json()
        tools_settings = ToolsSettings(
            redis_url=redis_url,
            database_url=database_url,
            workspaces_root=workspaces,
            proposals_url=proposals.url,
            internal_token=internal_token,
        )
        deps = Deps(
            settings=tools_settings,
            redis=redis_client,
            keys=RedisKeys(tools_settings.redis_prefix),
            proposals=make_client(proposals.url, internal_token),
            registry=load_tools({}, with_sandbox=False),
        )
        steps = [
            say("Writing it.", use("write_file", path="hello.txt", content="hi\n")),
            say("Proposed."),
        ]
        tools = {"write_file": _real_tool("write_file", deps)}

        turn_id = _run_a_turn(
            db_sessions, redis_client, redis_url, database_url, user_id, steps, tools
        )

        wait_for(lambda: len(receiver.requests) >= 1, timeout_s=15, what="a delivery")
        [(headers, body, status)] = receiver.requests
        event = json.loads(body)
        assert status == 200 and event["kind"] == "proposal_created"
        assert event["turn_id"] == turn_id
        assert event["data"]["files"] == [{"path": "hello.txt", "operation": "create"}]
        parts = dict(p.split("=", 1) for p in headers["X-Signalbox-Signature"].split(","))
        mac = hmac.new(webhook["secret"].encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
        assert hmac.compare_digest(parts["v1"], mac.hexdigest())

        # Resolving it is the relay's other event: delivered too, once.
        proposal_id = event["data"]["proposal_id"]
        approved = http_calls.post(
            f"{gateway.url}/api/proposals/{proposal_id}/approve",
            headers=_auth(token),
        )
        assert approved.status_code == 200, approved.text
        wait_for(lambda: len(receiver.requests) >= 2, timeout_s=15, what="the second delivery")
        resolved = json.loads(receiver.requests[1][1])
        assert resolved["kind"] == "proposal_resolved"
        assert resolved["data"] == {"proposal_id": proposal_id, "status": "applied"}

        def statuses() -> list[str]:
            detail = http_calls.get(
                f"{gateway.url}/api/webhooks/{webhook['id']}", headers=_auth(token)
            )
            return [d["status"] for d in detail.json()["deliveries"]]

        # The receiver records a request before it answers, and the deliverer marks the
        # delivery after the answer: wait for the mark.
        wait_for(lambda: "pending" not in statuses(), timeout_s=15, what="both deliveries marked")
        assert statuses() == ["delivered", "delivered"]
    finally:
        receiver.stop()
