"""Every service's Prometheus metrics after real turns through real processes.

The shared stack runs each service as its own process, each Celery worker serving
``/metrics`` on a port of its own (``Stack.metrics_url``). One turn with tool calls and a
proposal, the proposal approved, then a turn that sets an alarm the scheduler fires: each
service is scraped before and after, and the series the turns imply have moved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from signalbox.client import Client, WebSocket
from signalbox.shared.events import Event
from signalbox.stack import Stack
from tests import http_calls
from tests.scheduler.polling import wait_for

TURN_TIMEOUT_S = 60.0
SERVICES = ("gateway", "proposals", "orchestrator1", "tools1", "scheduler")

Sample = tuple[str, frozenset[tuple[str, str]]]
Scrape = dict[Sample, float]


def scrape(url: str) -> Scrape:
    """Every sample of one ``/metrics`` page, by name and labels."""
    reply = http_calls.get(url)
    assert reply.status_code == 200, f"{url}: {reply.status_code} {reply.text[:200]}"
    assert reply.headers["content-type"].startswith("text/plain")
    samples: Scrape = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Scrape, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples carrying ``labels`` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)


def has(samples: Scrape, name: str, **labels: str) -> bool:
    wanted = set(labels.items())
    return any(n == name and wanted <= got for (n, got) in samples)


def scrape_all(stack: Stack) -> dict[str, Scrape]:
    return {name: scrape(stack.metrics_url(name)) for name in SERVICES}


@pytest.fixture
def user(stack: Stack, make_stack_user: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    user_id, token = make_stack_user()
    workspace: Path = stack.config.workspaces_root / user_id / "default"
    workspace.mkdir(parents=True)
    (workspace / "README.md").write_text("# metrics\n")
    return user_id, token


@pytest.fixture
def sdk(stack: Stack, user: tuple[str, str]) -> Iterator[tuple[WebSocket, Client]]:
    token = user[1]
    with WebSocket(stack.gateway_url, token) as socket, Client(stack.gateway_url, token) as http:
        yield socket, http


def turn_events(socket: WebSocket, turn_id: str) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while not (seen and seen[-1].kind == "turn_finished" and seen[-1].turn_id == turn_id):
        seen.append(socket.next_event(timeout_s=max(0.1, deadline - time.monotonic())))
    return [e for e in seen if e.turn_id == turn_id]


def grew(
    before: Mapping[str, Scrape], after: Mapping[str, Scrape], service: str
) -> Callable[..., float]:
    """How much a series of ``service`` grew between the two scrapes."""

    def by(name: str, **labels: str) -> float:
        return value(after[service], name, **labels) - value(before[service], name, **labels)

    return by


def test_every_service_serves_the_series_a_turn_with_tools_and_a_proposal_implies(
    stack: Stack, user: tuple[str, str], sdk: tuple[WebSocket, Client]
) -> None:
    socket, http = sdk
    before = scrape_all(stack)

    ack = socket.start_turn("look around, then create hello.txt")
    events = turn_events(socket, ack.turn_id)
    assert events[-1].data["status"] == "completed", events[-1]
    created = [e for e in events if e.kind == "proposal_created"]
    assert len(created) == 1
    assert http.approve(created[0].data["proposal_id"]).status == "applied"
    tools_ok = sum(1 for e in events if e.kind == "tool_call_finished" and e.data["status"] == "ok")
    assert tools_ok >= 3  # list_dir, search_files, write_file

    # The alarm's turn is started by the scheduler, a couple of seconds on.
    alarm = socket.start_turn("wake me in 1 seconds to check the metrics", ack.conversation_id)
    alarm_events = turn_events(socket, alarm.turn_id)
    assert alarm_events[-1].data["status"] == "completed"
    wait_for(
        lambda: (
            value(scrape(stack.metrics_url("scheduler")), "signalbox_alarms_total", outcome="fired")
            > value(before["scheduler"], "signalbox_alarms_total", outcome="fired")
        ),
        TURN_TIMEOUT_S,
        "the scheduler to fire the alarm",
    )
    after = scrape_all(stack)

    # The orchestrator: model requests, tokens, tool calls end to end, time queued.
    orch = grew(before, after, "orchestrator1")
    assert orch("signalbox_model_requests_total", purpose="step", outcome="ok") >= 3
    assert orch("signalbox_model_request_seconds_count", purpose="step") >= 3
    assert orch("signalbox_model_request_seconds_sum", purpose="step") > 0
    prompt = ("input", "cache_read", "cache_write")  # the demo model caches its prompts too
    assert sum(orch("signalbox_model_tokens_total", purpose="step", kind=k) for k in prompt) > 0
    assert orch("signalbox_model_tokens_total", purpose="step", kind="output") > 0
    for tool in ("list_dir", "search_files", "write_file", "alarm"):
        assert orch("signalbox_tool_calls_total", tool=tool, status="ok") >= 1, tool
    assert orch("signalbox_tool_call_seconds_count", tool="write_file", status="ok") >= 1
    assert orch("signalbox_turns_finished_total", status="completed") >= 2
    assert orch("signalbox_turn_queued_seconds_count", user_class="user") >= 2
    assert has(after["orchestrator1"], "signalbox_turn_parked_seconds_count")
    # No user, conversation, turn, call or proposal id is ever a label value.
    ids = {user[0], ack.conversation_id, ack.turn_id, alarm.turn_id}
    ids |= {
        str(e.data[k])
        for e in events + alarm_events
        for k in ("call_id", "proposal_id")
        if k in e.data
    }
    for service, samples in after.items():
        labels = {label for _name, pairs in samples for _key, label in pairs}
        assert not labels & ids, (service, labels & ids)

    # The tool worker (prefork): runs counted in pool children, summed by the main process.
    tools = grew(before, after, "tools1")
    for tool in ("list_dir", "search_files", "write_file"):
        assert tools("signalbox_tool_runs_total", tool=tool, status="ok") >= 1, tool
    assert tools("signalbox_tool_run_seconds_count", tool="write_file") >= 1
    assert value(after["tools1"], "signalbox_tool_runs_in_progress") == 0

    # The scheduler: the alarm fired, and the tick series are there.
    sched = grew(before, after, "scheduler")
    assert sched("signalbox_alarms_total", outcome="fired") >= 1
    assert has(after["scheduler"], "signalbox_schedule_ticks_total", outcome="started")

    # Every worker reads the Celery queue lengths at scrape time.
    for worker in ("orchestrator1", "tools1", "scheduler"):
        for queue in ("orchestrator", "tools", "tools.sandbox", "scheduler"):
            assert has(after[worker], "signalbox_celery_queue_length", queue=queue), (worker, queue)
            assert value(after[worker], "signalbox_celery_queue_length", queue=queue) >= 0
        assert has(after[worker], "signalbox_celery_unacked")

    # The proposals service counts in SQL: the approved proposal, and nothing left unsent.
    proposals = after["proposals"]
    assert value(proposals, "signalbox_proposals", status="applied") >= 1
    assert has(proposals, "signalbox_outbox_lag_seconds")
    assert has(proposals, "signalbox_outbox_unsent")

    # The gateway: turns by status from SQL, and the relay's latency for live events.
    gateway = grew(before, after, "gateway")
    assert value(after["gateway"], "signalbox_turns", status="completed") >= 2
    assert gateway("signalbox_gateway_relay_latency_seconds_count") > 0
    assert gateway("signalbox_gateway_turns_queued_total", user_class="user") >= 2
