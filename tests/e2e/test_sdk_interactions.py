"""An HTTP-only client (``signalbox.client.AsyncClient``) through a whole parked turn: it
declares a client tool on the turn, answers ``ask_user``, returns the client tool's result,
all over HTTP while it follows the SSE stream. Every service is a real process; the model
is the scripted fake Messages API."""

from __future__ import annotations

import asyncio

from sqlalchemy.orm import Session, sessionmaker

from signalbox.client import AsyncClient, Conflict, NotFound
from signalbox.shared.events import Event
from signalbox.shared.protocol import ClientToolSpec
from signalbox.stack import Stack
from tests.browser.conftest import fake_stack, new_user  # noqa: F401  (the fixture, reused)
from tests.fake_anthropic import FakeAnthropic, text, tool_use

TURN_TIMEOUT_S = 60.0
EDITOR = ClientToolSpec(name="editor_selection", description="the selected text", timeout_s=30)


def test_an_http_only_client_answers_a_question_and_runs_a_client_tool(
    fake_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]],  # noqa: F811
) -> None:
    stack, fake, sessions = fake_stack
    fake.script_for(
        "sdk-parity",
        [
            [text("Asking."), tool_use("ask_user", {"question": "Tabs or spaces?"})],
            [text("Checking."), tool_use("editor_selection", {})],
            [text("Spaces, and you selected foo().")],
        ],
    )
    _user_id, token = new_user(sessions)

    async def scenario() -> list[Event]:
        async with AsyncClient(stack.gateway_url, token) as sb:
            conversation_id = (await sb.create_conversation()).conversation_id
            turn = await sb.start_turn(conversation_id, "sdk-parity check", client_tools=[EDITOR])
            seen: list[Event] = []
            async for event in sb.stream(conversation_id):
                seen.append(event)
                if event.kind == "question":
                    question_id = event.data["question_id"]
                    answered = await sb.answer(question_id, "spaces")
                    assert answered.turn_id == turn.turn_id
                    try:
                        await sb.answer(question_id, "tabs")
                        raise AssertionError("a second answer was taken")
                    except Conflict:
                        pass
                elif event.kind == "tool_call_started" and event.data["executor"] == "client":
                    call_id, token_ = event.data["call_id"], event.data["token"]
                    try:
                        await sb.tool_result(call_id, token_ + "x", "wrong")
                        raise AssertionError("a wrong token was taken")
                    except NotFound:
                        pass
                    await sb.tool_result(call_id, token_, "foo()")
                elif event.kind == "turn_finished" and event.turn_id == turn.turn_id:
                    return seen
        raise AssertionError("the stream ended")

    seen = asyncio.run(asyncio.wait_for(scenario(), TURN_TIMEOUT_S))
    kinds = [e.kind for e in seen]
    assert kinds.index("question") < kinds.index("question_answered")
    finished = {e.data["tool"]: e.data for e in seen if e.kind == "tool_call_finished"}
    assert (finished["editor_selection"]["status"], finished["editor_selection"]["output"]) == (
        "ok",
        "foo()",
    )
    assert seen[-1].data["status"] == "completed"
