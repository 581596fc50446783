"""Calls the orchestrator runs itself rather than sending to a tool worker.

- a client tool: announced with a single-use token; the call waits (``waiting``) for the
  client's ``tool_result`` frame, and the turn parks meanwhile;
- ``ask_user``: the question goes out and the call waits for the human's ``answer``;
- ``spawn_agent``: a read-only child turn run inline, under this turn's lease, its events
  tagged with ``parent_call_id``; its final answer is the call's result.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.builtin_tools import ASK_USER, AskUserInput, SpawnAgentInput
from signalbox.services.orchestrator.lease import LeaseLost
from signalbox.shared.auth import hash_token
from signalbox.shared.db.models import ToolCall
from signalbox.shared.events import tool_call_started

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

log = logging.getLogger(__name__)


def offer_to_client(runner: TurnRunner, call: ToolCall) -> None:
    """A client tool: announced with a single-use token (only its hash is stored)."""
    token = secrets.token_urlsafe(32)
    waiting = store.start_waiting(runner.rt.sessions, call.id, call.timeout_s, hash_token(token))
    if waiting is not None:
        runner.emit("tool_call_started", tool_call_started(call, "client", token))


def start_inline(runner: TurnRunner, call: ToolCall) -> None:
    """Start a built-in call: ``ask_user`` asks; anything else (``spawn_agent``) runs."""
    if call.tool == ASK_USER:
        _ask(runner, call)
        return
    for started in store.mark_running(runner.rt.sessions, [call]):
        runner.emit("tool_call_started", tool_call_started(started))


def _ask(runner: TurnRunner, call: ToolCall) -> None:
    """ask_user: the question goes out and the call waits for the ``answer`` frame."""
    waiting = store.start_waiting(runner.rt.sessions, call.id, call.timeout_s)
    if waiting is not None:
        question = AskUserInput.model_validate(call.input)
        runner.emit(
            "question",
            {"question_id": call.id, "text": question.question, "options": question.options},
        )


def run_child(runner: TurnRunner, call: ToolCall) -> str | None:
    """spawn_agent: run (or resume) the child turn here; its final answer is the result."""
    sessions = runner.rt.sessions
    task = SpawnAgentInput.model_validate(call.input).task
    child_id = store.child_turn(sessions, runner.info, call.id, task)
    info = store.load_turn(sessions, child_id)
    assert info is not None
    child_runner = runner.child_runner(info)
    try:
        child_runner.run()
    except LeaseLost:
        raise
    except Exception as exc:
        log.exception("sub-agent turn %s failed", child_id)
        child_runner.finish("failed", error=f"{type(exc).__name__}: {exc}")
    child = store.get_turn(sessions, child_id)
    if child.status == "cancelled" and runner.cancelled(force=True):
        return "cancelled"
    answer = store.final_text(sessions, child_id)
    if child.status == "completed":
        runner.record(call, "ok", answer or "(the sub-agent gave no answer)", None)
    else:
        why = f"the sub-agent ended {child.status}" + (f": {child.error}" if child.error else "")
        runner.record(call, "error", answer, why)
    return None
