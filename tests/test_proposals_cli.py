"""``signalbox proposals ...`` against a real stack, on proposals made by real turns."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from signalbox.cli import main
from signalbox.redis_server import free_port
from signalbox.stack import Stack
from tests.wsclient import WsClient

TURN_TIMEOUT_S = 60.0


@pytest.fixture
def user(make_stack_user: Callable[[], tuple[str, str]], stack: Stack) -> tuple[str, str]:
    user_id, token = make_stack_user()
    (stack.config.workspaces_root / user_id / "default").mkdir(parents=True)
    return user_id, token


def propose(stack: Stack, token: str, text: str) -> str:
    """Run a turn that proposes a file; its proposal id."""
    client = WsClient(stack.gateway_url, token)
    try:
        ack = client.request({"type": "user_turn", "conversation_id": None, "text": text})
        assert ack["type"] == "ack", ack
        created = client.wait_event("proposal_created", timeout_s=TURN_TIMEOUT_S)
        client.wait_event("turn_finished", timeout_s=TURN_TIMEOUT_S)
        proposal_id: str = created["data"]["proposal_id"]
        return proposal_id
    finally:
        client.close()


def workspace_file(stack: Stack, user_id: str, name: str) -> Path:
    return stack.config.workspaces_root / user_id / "default" / name


def proposals(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stack: Stack,
    token: str,
    *args: str,
) -> tuple[int, str, str]:
    """``signalbox proposals args`` through ``main()`` in this process, token from the env."""
    monkeypatch.setenv("SIGNALBOX_TOKEN", token)
    code = main(["proposals", *args, "--url", stack.gateway_url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_show_and_approve_a_proposal_made_by_a_turn(
    stack: Stack,
    user: tuple[str, str],
    make_stack_user: Callable[[], tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    user_id, token = user
    proposal_id = propose(stack, token, "create hello.txt with Hello there")
    target = workspace_file(stack, user_id, "hello.txt")

    code, out, _ = proposals(monkeypatch, capsys, stack, token, "list")
    assert code == 0
    assert proposal_id in out and "create hello.txt" in out and "[+hello.txt]" in out

    code, out, _ = proposals(monkeypatch, capsys, stack, token, "show", proposal_id)
    assert code == 0
    assert f"proposal {proposal_id} [pending]: create hello.txt" in out
    assert "    +++ b/hello.txt" in out and "    +Hello there" in out

    # Someone else's proposal does not exist for them: not found, and nothing is written.
    _, stranger = make_stack_user()
    for action in ("show", "approve", "reject"):
        code, out, err = proposals(monkeypatch, capsys, stack, stranger, action, proposal_id)
        assert code == 1 and f"proposal {proposal_id!r} not found" in err, (action, err)
    code, out, _ = proposals(monkeypatch, capsys, stack, stranger, "list")
    assert code == 0 and out.strip() == "no pending proposals"
    assert not target.exists()

    # The command as an operator runs it: a real process.
    script = Path(sys.executable).with_name("signalbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "signalbox.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    result = subprocess.run(
        [*command, "proposals", "approve", proposal_id, "--url", stack.gateway_url,
         "--token", token],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"proposal {proposal_id}: applied"
    assert target.read_text() == "Hello there\n"

    code, out, _ = proposals(monkeypatch, capsys, stack, token, "approve", proposal_id)
    assert code == 0 and "applied" in out  # approving twice is harmless
    code, out, _ = proposals(monkeypatch, capsys, stack, token, "list")
    assert proposal_id not in out


def test_reject_with_a_reason_then_approve_is_a_conflict(
    stack: Stack,
    user: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    user_id, token = user
    proposal_id = propose(stack, token, "create rejected.txt")
    code, out, _ = proposals(
        monkeypatch, capsys, stack, token, "reject", proposal_id, "--reason", "not today"
    )
    assert code == 0 and out.strip() == f"proposal {proposal_id}: rejected"

    code, out, err = proposals(monkeypatch, capsys, stack, token, "approve", proposal_id)
    assert code == 1 and "conflict" in err and "rejected" in err
    assert not workspace_file(stack, user_id, "rejected.txt").exists()
    code, out, _ = proposals(monkeypatch, capsys, stack, token, "show", proposal_id)
    assert code == 0 and "[rejected]" in out


def test_a_stale_proposal_is_refused_with_the_diff_it_would_apply_now(
    stack: Stack,
    user: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    user_id, token = user
    proposal_id = propose(stack, token, "create stale.txt with from the agent")
    target = workspace_file(stack, user_id, "stale.txt")
    target.write_text("from a human\n")

    code, _, err = proposals(monkeypatch, capsys, stack, token, "approve", proposal_id)
    assert code == 1 and "conflict" in err
    assert "    -from a human" in err and "    +from the agent" in err
    assert target.read_text() == "from a human\n"


def test_bad_token_and_unreachable_gateway_are_named(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = proposals(monkeypatch, capsys, stack, "sbt_wrong", "list")
    assert code == 1 and "refused the token (401)" in err

    nowhere = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("SIGNALBOX_TOKEN", "sbt_any")
    code = main(["proposals", "list", "--url", nowhere])
    assert code == 1 and f"cannot reach the gateway at {nowhere}" in capsys.readouterr().err
