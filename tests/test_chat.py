"""``signalbox chat``: rendering (pure), resuming after a drop, and real turns on a real stack."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from signalbox.chat import ChatClient, ChatOptions, Prompt
from signalbox.chat_render import Renderer, render_proposal, short_input
from signalbox.client import ws_url
from signalbox.gateway_api import ApiError, resolve_token
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from signalbox.stack import Stack

CHAT_TIMEOUT_S = 90


def event(
    kind: str, event_id: str, data: dict[str, Any], turn_id: str | None = "turn_1", **extra: Any
) -> dict[str, Any]:
    return {
        "type": "event",
        "conversation_id": "conv_1",
        "id": event_id,
        "turn_id": turn_id,
        "ts": extra.get("ts", "2030-01-01T00:00:00.000Z"),
        "kind": kind,
        "data": data,
    }


def a_turn() -> list[dict[str, Any]]:
    """The events of one turn that proposes a file, in order."""
    return [
        event("conversation_created", "1-0", {"workspace": "default", "title": "t"}, None),
        event("turn_queued", "2-0", {"text": "create hello.txt", "client_turn_id": "c"}),
        event("turn_started", "3-0", {"model": "demo"}, ts="2030-01-01T00:00:01.000Z"),
        event("text_delta", "4-0", {"text": "I will "}),
        event("text_delta", "5-0", {"text": "write it."}),
        event(
            "tool_call_started",
            "6-0",
            {"call_id": "call_1", "tool": "write_file", "input": {"path": "hello.txt"}},
        ),
        event(
            "proposal_created",
            "7-0",
            {
                "proposal_id": "prop_1",
                "summary": "create hello.txt",
                "files": [{"path": "hello.txt", "operation": "create"}],
            },
        ),
        event(
            "tool_call_finished",
            "8-0",
            {
                "call_id": "call_1",
                "tool": "write_file",
                "status": "ok",
                "output": "proposed, awaiting approval (proposal_id prop_1)",
                "error": None,
                "duration_ms": 42,
            },
        ),
        event("assistant_message", "9-0", {"text": "I will write it."}),
        event(
            "turn_finished",
            "10-0",
            {
                "status": "completed",
                "steps": 2,
                "usage": {"input_tokens": 300, "output_tokens": 40},
                "error": None,
            },
            ts="2030-01-01T00:00:03.500Z",
        ),
    ]


# -- rendering -------------------------------------------------------------------------------


def test_a_turn_renders_as_streamed_text_tool_lines_and_a_summary() -> None:
    renderer = Renderer()
    text = "".join(renderer.render(e) for e in a_turn())
    assert text.splitlines() == [
        "== conversation conv_1 (workspace 'default')",
        "you: create hello.txt",
        "-- turn started (model demo)",
        "I will write it.",  # the deltas joined on one line, ended before the tool line
        '-> write_file(path="hello.txt")',
        "** proposal prop_1: create hello.txt [+hello.txt]",
        "ok write_file ok in 42 ms: proposed, awaiting approval (proposal_id prop_1)",
        "== turn completed: 2 step(s); 1 tool call(s): write_file; 2.5 s; tokens 300 in / 40 out",
    ]


def test_streamed_text_is_ended_before_any_other_line() -> None:
    renderer = Renderer()
    assert renderer.render(event("text_delta", "1-0", {"text": "half a line"})) == "half a line"
    out = renderer.render(event("proposal_resolved", "2-0", {"proposal_id": "p", "status": "x"}))
    assert out == "\n** proposal p: x\n"
    assert renderer.lines(["next"]) == "next\n"


def test_failures_decisions_and_unknown_kinds_are_shown() -> None:
    renderer = Renderer()
    renderer.render(
        event(
            "tool_call_started",
            "1-0",
            {"call_id": "c9", "tool": "run_python", "input": {"code": "x" * 500}},
        )
    )
    finished = renderer.render(
        event(
            "tool_call_finished",
            "2-0",
            {
                "call_id": "c9",
                "tool": "run_python",
                "status": "timeout",
                "output": "",
                "error": "no result within 30 s",
                "duration_ms": 30_250,
            },
        )
    )
    assert finished == "!! run_python timeout in 30.2 s: no result within 30 s\n"
    decided = renderer.render(
        event("tool_call_decided", "3-0", {"call_id": "c9", "decision": "deny"})
    )
    assert decided == "-- run_python c9: deny\n"
    new_kind = renderer.render(event("weather_report", "4-0", {"sky": "blue"}))
    assert new_kind == '-- weather_report: {"sky": "blue"}\n'
    error = renderer.render_frame({"type": "error", "code": "not_found", "message": "no turn"})
    assert error == "error (not_found): no turn\n"


def test_long_inputs_stay_on_one_line() -> None:
    line = short_input({"path": "a.txt", "content": "line\n" * 100})
    assert len(line) == 80 and line.endswith("...") and "\n" not in line


def test_a_proposal_is_shown_with_its_diff() -> None:
    lines = render_proposal(
        {
            "proposal_id": "prop_1",
            "status": "pending",
            "summary": "create hello.txt",
            "files": [
                {
                    "path": "hello.txt",
                    "operation": "create",
                    "diff": "--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+Hello\n",
                }
            ],
        }
    )
    assert lines == [
        "proposal prop_1 [pending]: create hello.txt",
        "  + hello.txt (create)",
        "    --- /dev/null",
        "    +++ b/hello.txt",
        "    @@ -0,0 +1 @@",
        "    +Hello",
    ]


def test_token_and_url_resolution(tmp_path: Path) -> None:
    saved = tmp_path / "admin-token"
    saved.write_text("from-file\n")
    assert resolve_token("given", {"SIGNALBOX_TOKEN": "env"}, saved) == "given"
    assert resolve_token(None, {"SIGNALBOX_TOKEN": "env"}, saved) == "env"
    assert resolve_token(None, {}, saved) == "from-file"
    with pytest.raises(ApiError, match="no API token"):
        resolve_token(None, {}, tmp_path / "missing")
    assert ws_url("https://sb.example.com/") == "wss://sb.example.com/ws"
    assert ws_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws"


# -- resuming --------------------------------------------------------------------------------


class ScriptedGateway:
    """A WebSocket server that drops the first connection mid-turn and overlaps the replay;
    over plain HTTP it answers the proposal the chat fetches to show its diff."""

    def __init__(self) -> None:
        self.frames: list[list[dict[str, Any]]] = []  # what the client sent, per connection

    def http(self, _connection: ServerConnection, request: Request) -> Response | None:
        if not request.path.startswith("/api/proposals/"):
            return None  # the WebSocket handshake
        proposal_id = request.path.rsplit("/", 1)[-1]
        body = {
            "proposal_id": proposal_id,
            "conversation_id": "conv_1",
            "turn_id": "turn_1",
            "call_id": "call_1",
            "workspace": "default",
            "summary": "create hello.txt",
            "created_at": "2030-01-01T00:00:00Z",
            "status": "pending",
            "version": 1,
            "decided_at": None,
            "decided_by": None,
            "reason": None,
            "parent_id": None,
            "files": [],
        }
        headers = Headers({"Content-Type": "application/json"})
        return Response(200, "OK", headers, json.dumps(body).encode())

    async def handler(self, ws: ServerConnection) -> None:
        received: list[dict[str, Any]] = []
        self.frames.append(received)
        events = a_turn()
        async for raw in ws:
            frame = json.loads(raw)
            received.append(frame)
            if frame["type"] == "user_turn" and len(self.frames) == 1:
                await ws.send(
                    json.dumps(
                        {
                            "type": "ack",
                            "req": frame["req"],
                            "conversation_id": "conv_1",
                            "turn_id": "turn_1",
                        }
                    )
                )
                for e in events[:5]:
                    await ws.send(json.dumps(e))
                ws.transport.abort()  # a drop without a close handshake
                return
            if frame["type"] == "subscribe":
                await ws.send(json.dumps({"type": "ack", "req": frame["req"]}))
                # Replays from before the client's resume point, as a buggy server might.
                for e in events[3:]:
                    await ws.send(json.dumps(e))


def test_client_reconnects_resubscribes_from_its_last_id_and_prints_each_event_once() -> None:
    server = ScriptedGateway()

    async def scenario() -> tuple[int, str]:
        async with serve(server.handler, "127.0.0.1", 0, process_request=server.http) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            url = f"http://127.0.0.1:{port}"
            out = io.StringIO()
            options = ChatOptions(url=url, token="t", policy="leave", timeout_s=20)
            client = ChatClient(options, out)
            code = await client.run_once("create hello.txt")
            return code, out.getvalue()

    code, output = asyncio.run(scenario())
    assert code == 0, output
    first, second = server.frames[0], server.frames[1]
    assert [f["type"] for f in first] == ["user_turn"]
    subscribe = next(f for f in second if f["type"] == "subscribe")
    assert subscribe == {**subscribe, "conversation_id": "conv_1", "after": "5-0"}
    # The unanswered-at-drop turn was acked, so it is not resent.
    assert not [f for f in second if f["type"] == "user_turn"]
    assert "(reconnected" in output and "(connection lost" in output
    assert "proposal prop_1 [pending]: create hello.txt" in output  # fetched over HTTP
    for line in ("you: create hello.txt", "I will write it.", "-> write_file", "== turn completed"):
        assert output.count(line) == 1, output


def test_typed_lines_answer_open_prompts_in_order() -> None:
    async def scenario() -> tuple[list[dict[str, Any]], str]:
        out = io.StringIO()
        client = ChatClient(ChatOptions(url="http://127.0.0.1:9", token="t"), out)
        assert client.ready_for_input()
        client.open_prompt(Prompt("proposal", "prop_1", "approve proposal prop_1? [y/n]"))
        client.open_prompt(Prompt("tool", "call_1", "allow run_python? [a]llow/[d]eny"))
        client.open_prompt(Prompt("question", "q_1", "your answer:"))
        for line in ("maybe", "y", "deny", "blue, please"):
            await client.answer(line)  # no socket: requests wait in ``inflight`` to be sent
        sent = list(client.state.inflight.values())
        return sent, out.getvalue()

    sent, output = asyncio.run(scenario())
    assert sent == [
        {"type": "decide_proposal", "proposal_id": "prop_1", "decision": "approve"},
        {"type": "decide_tool", "call_id": "call_1", "decision": "deny"},
        {"type": "answer", "question_id": "q_1", "text": "blue, please"},
    ]
    # "maybe" is no answer: the same prompt again, then each next one as the last is answered.
    assert output.splitlines() == [
        "? approve proposal prop_1? [y/n]",
        "? approve proposal prop_1? [y/n]",
        "? allow run_python? [a]llow/[d]eny",
        "? your answer:",
    ]


# -- against the real stack ------------------------------------------------------------------


@pytest.fixture
def user(make_stack_user: Callable[[], tuple[str, str]], stack: Stack) -> tuple[str, str]:
    user_id, token = make_stack_user()
    (stack.config.workspaces_root / user_id / "default").mkdir(parents=True)
    return user_id, token


def signalbox_cli(*args: str, token: str) -> subprocess.CompletedProcess[str]:
    """The installed ``signalbox`` command as a user runs it, token from the environment."""
    script = Path(sys.executable).with_name("signalbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "signalbox.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env["SIGNALBOX_TOKEN"] = token
    return subprocess.run(
        [*command, *args], env=env, capture_output=True, text=True, timeout=CHAT_TIMEOUT_S
    )


def test_chat_once_streams_a_turn_and_approves_its_proposal(
    stack: Stack, user: tuple[str, str]
) -> None:
    result = signalbox_cli(
        "chat", "--url", stack.gateway_url, "--once", "create hello.txt", "--approve-all",
        token=user[1],
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "you: create hello.txt" in out
    assert "[offline demo model" in out  # streamed text
    assert '-> write_file(path="hello.txt"' in out  # the call as it starts
    assert "ok write_file ok in " in out  # ... and as it finishes
    assert "  + hello.txt (create)" in out and "    +++ b/hello.txt" in out  # the diff
    assert "approved: now applied" in out
    assert "== turn completed:" in out
    proposal_lines = [line for line in out.splitlines() if line.startswith("** proposal")]
    assert any(line.endswith(": applied") for line in proposal_lines), out
    hello = stack.config.workspaces_root / user[0] / "default" / "hello.txt"
    assert hello.read_text() == "Written by the Signalbox offline demo model.\n"


def test_chat_once_with_a_bad_token_exits_1(stack: Stack) -> None:
    result = signalbox_cli("chat", "--url", stack.gateway_url, "--once", "hello", token="sbt_wrong")
    assert result.returncode == 1
    assert "refused the token (403)" in result.stderr


def test_a_socket_killed_mid_turn_resumes_without_losing_or_repeating_events(
    stack: Stack, user: tuple[str, str], redis_url: str
) -> None:
    accepted: list[dict[str, Any]] = []
    out = io.StringIO()
    options = ChatOptions(url=stack.gateway_url, token=user[1], policy="leave", timeout_s=60)
    client = ChatClient(options, out)

    def watch(frame: dict[str, Any]) -> None:
        accepted.append(frame)
        if frame["kind"] == "tool_call_started" and client.connections == 1:
            client.ws.abort()  # the network drops: no close frame

    client.on_event = watch
    code = asyncio.run(client.run_once("look around"))
    output = out.getvalue()
    assert code == 0, output
    assert client.connections == 2 and "(reconnected" in output

    conversation_id = accepted[0]["conversation_id"]
    r = redis.Redis.from_url(redis_url)
    try:
        stored = EventStream(r, RedisKeys(stack.config.redis_prefix)).read_after(
            conversation_id, None
        )
    finally:
        r.close()
    assert [e["id"] for e in accepted] == [e.id for e in stored]
    assert output.count("== turn completed") == 1


def test_interactive_chat_answers_the_approval_prompt_from_stdin(
    stack: Stack, user: tuple[str, str]
) -> None:
    script = Path(sys.executable).with_name("signalbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "signalbox.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    result = subprocess.run(
        [*command, "chat", "--url", stack.gateway_url, "--token", user[1]],
        input="create typed.txt with typed in\ny\n",
        env=env, capture_output=True, text=True, timeout=CHAT_TIMEOUT_S,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    # "y" answered the prompt: it was not sent as a turn of its own.
    assert out.count("you: ") == 1 and "? approve proposal prop_" in out
    assert "approved: now applied" in out
    typed = stack.config.workspaces_root / user[0] / "default" / "typed.txt"
    assert typed.read_text() == "typed in\n"


def test_the_summary_counts_the_whole_prompt_cached_or_not() -> None:
    """``input_tokens`` is only what the cache neither read nor wrote: the prompt is all three."""
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 3000,
        "output_tokens": 40,
    }
    events = [
        {**e, "data": {**e["data"], "usage": usage}} if e["kind"] == "turn_finished" else e
        for e in a_turn()
    ]
    text = "".join(Renderer().render(e) for e in events)
    assert text.splitlines()[-1].endswith("tokens 3210 in (3000 cached) / 40 out")
