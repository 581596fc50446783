"""The terminal client's prompts and where it finds the gateway: a decided proposal is never
asked again, an open prompt is shown again when output buries it, a line typed meanwhile is
kept as a message, "rejected" is spelled right, the URL of `up` is used, and `users list`
away from `up` says what to do."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from signalbox.chat import ChatClient, ChatOptions, Prompt
from signalbox.client import ProposalAck
from signalbox.gateway_api import DEFAULT_GATEWAY_URL, resolve_url
from signalbox.redis_server import free_port
from signalbox.stack import Stack
from tests import http_calls
from tests.test_chat import signalbox_cli

DEADLINE_S = 5.0
UP_TIMEOUT_S = 90.0


def _offline_client(out: io.StringIO) -> ChatClient:
    return ChatClient(ChatOptions(url="http://127.0.0.1:9", token="t"), out)


async def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # polling the client's own timer, with a deadline


def _sent(client: ChatClient) -> list[dict[str, object]]:
    return list(client.state.inflight.values())  # requests awaiting their reply


def test_a_line_typed_while_a_turn_runs_is_kept_as_a_message_not_taken_as_an_answer() -> None:
    async def scenario() -> tuple[list[dict[str, object]], str]:
        out = io.StringIO()
        client = _offline_client(out)
        typed: asyncio.Queue[tuple[str, int] | None] = asyncio.Queue()
        messages: asyncio.Queue[str | None] = asyncio.Queue()
        client.typed = 1  # typed while the turn ran, before any prompt
        client.open_prompt(Prompt("proposal", "prop_1", "approve proposal prop_1? [y/n]"))
        typed.put_nowait(("also add a README", 1))
        typed.put_nowait(("y", 2))
        typed.put_nowait(None)
        await client._use_typed_lines(typed, messages)
        assert client.held == 1 and messages.qsize() == 1
        messages.put_nowait(None)
        await client._send_messages(messages)  # no prompt, no turn: it goes out now
        return _sent(client), out.getvalue()

    sent, output = asyncio.run(scenario())
    assert sent[0] == {"type": "decide_proposal", "proposal_id": "prop_1", "decision": "approve"}
    assert sent[1]["type"] == "user_turn" and sent[1]["text"] == "also add a README"
    assert "(kept as your next message: also add a README)" in output


def test_a_question_takes_only_lines_typed_after_it_was_shown() -> None:
    async def scenario() -> list[dict[str, object]]:
        client = _offline_client(io.StringIO())
        typed: asyncio.Queue[tuple[str, int] | None] = asyncio.Queue()
        messages: asyncio.Queue[str | None] = asyncio.Queue()
        client.typed = 1
        client.open_prompt(Prompt("question", "call_q", "your answer:"))
        for item in (("what I typed before", 1), ("blue", 2), None):
            typed.put_nowait(item)
        await client._use_typed_lines(typed, messages)
        assert messages.get_nowait() == "what I typed before"
        return _sent(client)

    assert asyncio.run(scenario()) == [{"type": "answer", "question_id": "call_q", "text": "blue"}]


def test_an_open_prompt_is_shown_again_below_later_output_and_dropped_once_decided() -> None:
    async def scenario() -> str:
        out = io.StringIO()
        client = _offline_client(out)
        prompt = "? approve proposal prop_1? [y/n]\n"
        client.open_prompt(Prompt("proposal", "prop_1", prompt[2:-1]))
        client.open_prompt(Prompt("tool", "call_1", "allow run_python? [a]llow/[d]eny"))
        client.say("ok list_dir ok in 3 ms")
        await _until(lambda: out.getvalue().endswith(prompt), "the prompt shown again")
        client.close_prompt("proposal", "prop_1")  # decided in the web UI meanwhile
        await _until(lambda: out.getvalue().endswith("[a]llow/[d]eny\n"), "the next prompt")
        return out.getvalue()

    output = asyncio.run(scenario())
    assert output.count("? approve proposal prop_1? [y/n]") == 2


def test_a_rejection_is_spelled_rejected() -> None:
    async def scenario() -> str:
        out = io.StringIO()
        client = _offline_client(out)
        sent = {"type": "decide_proposal", "proposal_id": "prop_1", "decision": "reject"}
        await client._replied(sent, ProposalAck(proposal_id="prop_1", status="rejected"))
        return out.getvalue()

    assert asyncio.run(scenario()) == "** proposal prop_1 rejected: now rejected\n"


@pytest.fixture
def user(make_stack_user: Callable[[], tuple[str, str]], stack: Stack) -> tuple[str, str]:
    user_id, token = make_stack_user()
    (stack.config.workspaces_root / user_id / "default").mkdir(parents=True)
    return user_id, token


def _conversation_of(output: str) -> str:
    found = re.search(r"== conversation (conv_\w+)", output)
    assert found, output
    return found.group(1)


def test_continuing_a_conversation_never_asks_again_what_was_decided(
    stack: Stack, user: tuple[str, str]
) -> None:
    _, token = user
    first = signalbox_cli(
        "chat", "--url", stack.gateway_url, "--once", "create one.txt", "--reject-all",
        token=token,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    assert " rejected: now rejected" in first.stdout and "rejectd" not in first.stdout
    conversation_id = _conversation_of(first.stdout)
    rejected = re.findall(r"\*\* proposal (prop_\w+) rejected", first.stdout)
    # A second turn leaves its proposal pending: that one is still to be asked.
    second = signalbox_cli(
        "chat", "--url", stack.gateway_url, "--conversation", conversation_id,
        "--once", "create two.txt", token=token,
    )  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr

    resumed = subprocess.Popen(
        [*_command(), "chat", "--url", stack.gateway_url, "--conversation", conversation_id],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(token), text=True,
    )  # fmt: skip
    watchdog = threading.Timer(90, resumed.kill)  # a hung chat fails the test, not the run
    watchdog.start()
    lines: list[str] = []
    try:
        assert resumed.stdin is not None and resumed.stdout is not None
        for line in resumed.stdout:  # the replay, up to the one prompt there is to answer
            lines.append(line)
            if line.startswith("? approve proposal"):
                break
        resumed.stdin.write("n\n")
        resumed.stdin.close()
        lines += resumed.stdout.readlines()
        assert resumed.wait() == 0
    finally:
        watchdog.cancel()
    out = "".join(lines)
    asked = re.findall(r"\? approve proposal (prop_\w+)", out)
    assert asked and len(set(asked)) == 1, out  # only the pending one, not the rejected one
    assert rejected and asked[0] not in rejected and f"proposal {rejected[0]}" in out
    assert f"** proposal {asked[0]} rejected: now rejected" in out
    assert out.count("you: ") == 2, out  # the two turns replayed; "n" was no message


def _command() -> list[str]:
    script = Path(sys.executable).with_name("signalbox")
    return [str(script)] if script.exists() else [sys.executable, "-m", "signalbox.cli"]


def _env(token: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    if token:
        env["SIGNALBOX_TOKEN"] = token
    env.update(extra)
    return env


def test_the_gateway_url_comes_from_the_flag_the_environment_or_up(tmp_path: Path) -> None:
    saved = tmp_path / "gateway-url"
    assert resolve_url(None, {}, saved) == DEFAULT_GATEWAY_URL
    saved.write_text("http://127.0.0.1:9123\n")
    assert resolve_url(None, {}, saved) == "http://127.0.0.1:9123"
    env = {"SIGNALBOX_GATEWAY_URL": "http://gw:1"}
    assert resolve_url(None, env, saved) == "http://gw:1"
    assert resolve_url("http://given:2", env, saved) == "http://given:2"


def test_users_list_away_from_up_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [*_command(), "users", "list"], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "signalbox up" in result.stderr and "SIGNALBOX_DATABASE_URL" in result.stderr
    assert not (tmp_path / "var").exists()


def test_up_pins_both_ports_and_chat_and_proposals_find_its_url(
    tmp_path: Path, redis_url: str, run_id: str
) -> None:
    gateway_port, proposals_port = free_port(), free_port()
    env = _env(
        SIGNALBOX_REDIS_URL=redis_url,
        SIGNALBOX_REDIS_PREFIX=f"sbtest-{run_id}:up:",
        ANTHROPIC_API_KEY="",
    )
    up = subprocess.Popen(
        [*_command(), "up", "--port", str(gateway_port), "--proposals-port", str(proposals_port)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + UP_TIMEOUT_S
        for line in up.stdout:  # the banner comes once every service is ready
            if "Signalbox is running." in line or time.monotonic() > deadline:
                break
        url_file = tmp_path / "var" / "gateway-url"
        assert url_file.read_text().strip() == f"http://127.0.0.1:{gateway_port}"
        assert http_calls.get(f"http://127.0.0.1:{proposals_port}/healthz").status_code == 200
        listed = subprocess.run(
            [*_command(), "proposals", "list"], cwd=tmp_path, env=_env(),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.strip() == "no pending proposals"
    finally:
        os.killpg(up.pid, signal.SIGTERM)  # `up` stops its own children on SIGTERM
        up.wait(timeout=60)
