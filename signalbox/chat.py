"""``signalbox chat``: a terminal client of the gateway, on the Python SDK.

The socket is ``signalbox.client.AsyncWebSocket``: it reconnects with backoff, subscribes
again after the last event it delivered (so nothing is shown twice or lost), and resends
every request that had no reply yet (``resend=True``; turns carry a ``client_turn_id``,
deciding twice is harmless). Proposals are read with ``AsyncClient``. Rendering lives in
``chat_render`` (pure); this module is only the prompts and the I/O around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from pydantic import BaseModel

from signalbox.chat_render import Renderer, render_proposal
from signalbox.client import (
    AsyncClient,
    AsyncWebSocket,
    ConnectionLost,
    ConnectionState,
    ProposalAck,
    ReplayGap,
    SignalboxError,
    StateChange,
    TurnAck,
)
from signalbox.shared.events import Event
from signalbox.shared.protocol import Answer, Cancel, DecideProposal, DecideTool, UserTurn
from signalbox.shared.statuses import TurnState

Frame = dict[str, Any]
Policy = Literal["ask", "approve", "reject", "leave"]
Reply = BaseModel | SignalboxError  # what a request got back: its ack, or why not

RESOLVED_GRACE_S = 10.0  # after an approval's ack, how long --once waits for its event
DEFAULT_ONCE_TIMEOUT_S = 600.0
HELP = "type a message; /cancel stops the running turn, /quit leaves"
# An open prompt is printed again once other output has stopped for this long, so it is
# never left buried under later lines; a prompt resolved within it is never shown at all
# (a replayed conversation asks nothing it already decided).
PROMPT_SETTLE_S = 0.3
DONE = {"approve": "approved", "reject": "rejected"}
PROPOSAL_ANSWERS = {"y": "approve", "yes": "approve", "a": "approve", "approve": "approve",
                    "n": "reject", "no": "reject", "r": "reject", "reject": "reject"}  # fmt: skip
TOOL_ANSWERS = {"a": "allow", "allow": "allow", "y": "allow", "yes": "allow",
                "d": "deny", "deny": "deny", "n": "deny", "no": "deny"}  # fmt: skip


def frame_of(model: BaseModel) -> Frame:
    """A client frame of ``shared/protocol.py`` as the dict the chat remembers it by."""
    return model.model_dump(mode="json", exclude_none=True)


class ChatError(RuntimeError):
    """The chat cannot go on (e.g. the token is refused); the message says why."""


@dataclass(frozen=True)
class ChatOptions:
    """What the user chose on the command line."""

    url: str
    token: str
    conversation_id: str | None = None
    workspace: str | None = None
    policy: Policy = "ask"
    timeout_s: float = DEFAULT_ONCE_TIMEOUT_S


@dataclass
class Prompt:
    """A question to the human, answered by the next line typed."""

    kind: Literal["proposal", "tool", "question"]
    target_id: str
    text: str
    shown_after: int | None = None  # how many lines had been typed when it was first shown

    def takes(self, line: str) -> bool:
        """True when ``line`` is an answer to this prompt (any text is, to a question)."""
        word = line.strip().lower()
        if self.kind == "proposal":
            return word in PROPOSAL_ANSWERS
        if self.kind == "tool":
            return word in TOOL_ANSWERS
        return True


@dataclass
class _State:
    """What the chat knows about the conversation and its own requests."""

    conversation_id: str | None = None
    inflight: dict[int, Frame] = field(default_factory=dict)  # requests awaiting a reply
    client_turn_id: str | None = None
    turn_id: str | None = None
    turn_status: str | None = None
    undecided: set[str] = field(default_factory=set)  # proposals --once still has to decide
    approved: set[str] = field(default_factory=set)
    resolved: set[str] = field(default_factory=set)
    decision_failed: bool = False


class ChatClient:
    """One chat session: the SDK's WebSocket and HTTP client, a renderer, the prompts."""

    def __init__(
        self,
        options: ChatOptions,
        out: TextIO,
        on_event: Callable[[Frame], None] | None = None,
    ) -> None:
        self.options = options
        self.out = out
        self.ws = AsyncWebSocket(options.url, options.token, resend=True, on_state=self._on_state)
        self.api = AsyncClient(options.url, options.token)
        self.on_event = on_event  # tests watch accepted events through this
        self.renderer = Renderer()
        self.state = _State(conversation_id=options.conversation_id)
        self.prompts: deque[Prompt] = deque()
        self._requests = 0
        self._changed = asyncio.Event()
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()  # requests, proposals being fetched...
        self._request_tasks: set[asyncio.Task[None]] = set()  # ... of which requests
        self.typed = 0  # lines typed so far (a prompt answers only lines typed after it)
        self.held = 0  # messages typed while a prompt was open, waiting for their turn
        self._prompt_shown = False  # the head prompt is the last thing printed
        self._prompt_timer: asyncio.TimerHandle | None = None

    @property
    def connections(self) -> int:
        """How many times the socket connected (1 + reconnects)."""
        return self.ws.connections

    # -- output ----------------------------------------------------------------------------

    def emit(self, text: str) -> None:
        """Write ``text`` to the terminal now (an open prompt is shown again after it)."""
        if text:
            self.out.write(text)
            self.out.flush()
            self._prompt_shown = False
            self._settle_prompt()

    def _settle_prompt(self) -> None:
        if not self.prompts:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: shown on the next output
            loop = asyncio.get_running_loop()
            if self._prompt_timer is not None:
                self._prompt_timer.cancel()
            self._prompt_timer = loop.call_later(PROMPT_SETTLE_S, self._show_prompt)

    def _show_prompt(self) -> None:
        """Print the oldest open prompt, unless it is already the last thing printed."""
        self._prompt_timer = None
        if not self.prompts or self._prompt_shown or self.renderer.in_text:
            if self.prompts and self.renderer.in_text:
                self._settle_prompt()  # mid-way through streamed text: after its line ends
            return
        prompt = self.prompts[0]
        if prompt.shown_after is None:
            prompt.shown_after = self.typed
        self.emit(self.renderer.lines([f"? {prompt.text}"]))
        self._prompt_shown = True

    def say(self, *lines: str) -> None:
        """Print whole lines (after any half-printed streamed text)."""
        self.emit(self.renderer.lines(lines))

    def _changed_now(self) -> None:
        self._changed.set()

    async def _until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            self._changed.clear()
            await self._changed.wait()

    # -- sending ---------------------------------------------------------------------------

    def send(self, request: BaseModel) -> None:
        """Send ``request`` (a ``signalbox.shared.protocol`` frame) in the background; the SDK
        sends it again after a reconnect until it is answered. ``_replied`` shows its reply."""
        self._requests += 1
        key = self._requests
        sent = frame_of(request)
        self.state.inflight[key] = sent
        self._spawn(self._exchange(key, sent, request), request=True)

    async def _exchange(self, key: int, sent: Frame, request: BaseModel) -> None:
        reply: Reply
        try:
            reply = await self._request(request)
        except SignalboxError as exc:
            reply = exc
        finally:
            self.state.inflight.pop(key, None)
        await self._replied(sent, reply)

    async def _request(self, request: BaseModel) -> BaseModel:
        ws = self.ws
        match request:
            case UserTurn():
                return await ws.start_turn(
                    request.text,
                    request.conversation_id,
                    request.client_turn_id,
                    request.workspace,
                )
            case DecideProposal():
                return await ws.decide_proposal(request.proposal_id, request.decision)
            case _:
                return await ws.request(request)

    def send_turn(self, text: str) -> None:
        """Send one user turn (idempotent through its ``client_turn_id``)."""
        self.state.client_turn_id = uuid.uuid4().hex
        self.state.turn_id = None
        self.state.turn_status = None
        new = self.state.conversation_id is None
        turn = UserTurn(
            type="user_turn",
            conversation_id=self.state.conversation_id,
            text=text,
            client_turn_id=self.state.client_turn_id,
            workspace=self.options.workspace if new and self.options.workspace else None,
        )
        self.send(turn)

    # -- the connection --------------------------------------------------------------------

    def _on_state(self, change: StateChange) -> None:
        """What the SDK's connection does, as one line each (the SDK does the work)."""
        match change.state:
            case ConnectionState.CONNECTED if change.connections > 1:
                self.say("(reconnected; resuming where the stream left off)")
            case ConnectionState.DROPPED:
                self.say(f"(connection lost: {change.detail}; reconnecting)")
            case ConnectionState.RETRYING:
                self.say(f"({change.detail}; retrying in {change.retry_in_s or 0:.1f} s)")
            case ConnectionState.GAVE_UP:
                self.say(f"(gave up reconnecting: {change.detail})")

    async def _follow(self) -> None:
        """Show every event of the followed conversations, once each, until stopped."""
        while True:
            try:
                event = await self.ws.next_event()
            except ReplayGap as exc:
                conversation_id = str(exc.body.get("conversation_id"))
                self.say(
                    f"(events of {conversation_id} missed while disconnected are no longer "
                    "kept; showing what the server still has)"
                )
                self._spawn(self._subscribe_from_start(conversation_id))
                continue
            except SignalboxError as exc:  # gave up reconnecting
                raise ChatError(str(exc)) from None
            await self._handle(event)

    async def _subscribe_from_start(self, conversation_id: str) -> None:
        try:
            await self.ws.subscribe(conversation_id, None)
        except SignalboxError as exc:
            self._show_error(exc)

    # -- receiving -------------------------------------------------------------------------

    async def _handle(self, event: Event) -> None:
        frame = event.model_dump(mode="json")
        self.emit(self.renderer.render(frame))
        await self._react(frame)
        if self.on_event is not None:
            self.on_event(frame)
        self._changed_now()

    async def _react(self, event: Frame) -> None:
        state, data, kind = self.state, event.get("data") or {}, event.get("kind")
        if kind == "turn_queued" and data.get("client_turn_id") == state.client_turn_id:
            state.turn_id = event.get("turn_id")
        if kind == "proposal_created":
            proposal_id = str(data.get("proposal_id"))
            if self.options.policy in ("approve", "reject"):
                state.undecided.add(proposal_id)
            self._spawn(self._show_proposal(proposal_id))
        elif kind == "proposal_resolved":
            state.resolved.add(str(data.get("proposal_id")))
            self.close_prompt("proposal", str(data.get("proposal_id")))
        elif kind == "tool_call_needs_decision":
            self._tool_decision(str(data.get("call_id")), str(data.get("tool")))
        elif kind == "tool_call_decided":
            self.close_prompt("tool", str(data.get("call_id")))
        elif kind == "question":
            self._question(str(data.get("question_id")))
        elif kind == "question_answered":
            self.close_prompt("question", str(data.get("question_id")))
        elif kind == "tool_call_finished":  # a question that timed out, a call cancelled
            self.close_prompt("tool", str(data.get("call_id")))
            self.close_prompt("question", str(data.get("call_id")))
        elif kind == "turn_finished" and event.get("turn_id") == state.turn_id:
            state.turn_status = str(data.get("status"))

    def _show_error(self, exc: SignalboxError) -> None:
        if isinstance(exc, ConnectionLost) and self._stopping:
            return  # the chat is leaving: nothing was refused
        frame = {"type": "error", "code": exc.code or type(exc).__name__, "message": exc.message}
        self.emit(self.renderer.render_frame(frame))

    async def _replied(self, sent: Frame, reply: Reply) -> None:
        """Show what the reply to ``sent`` means, and note what it changes."""
        state = self.state
        match sent["type"], reply:
            case "user_turn", TurnAck():
                state.conversation_id = reply.conversation_id
                state.turn_id = reply.turn_id
            case "user_turn", SignalboxError():
                state.turn_status = f"refused ({reply.code})"
                self._show_error(reply)
            case "decide_proposal", _:
                proposal_id = str(sent["proposal_id"])
                state.undecided.discard(proposal_id)
                if isinstance(reply, ProposalAck):
                    if reply.status == "applied":
                        state.approved.add(proposal_id)
                    done = DONE.get(str(sent["decision"]), str(sent["decision"]))
                    self.say(f"** proposal {proposal_id} {done}: now {reply.status}")
                elif isinstance(reply, SignalboxError):
                    state.decision_failed = True
                    self._show_error(reply)
            case _, SignalboxError():
                self._show_error(reply)
        self._changed_now()

    # -- decisions -------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], request: bool = False) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        if request:
            self._request_tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._request_tasks.discard(task)
        self._changed_now()

    async def _show_proposal(self, proposal_id: str) -> None:
        status = "pending"
        try:
            proposal = await self.api.proposal(proposal_id)
        except SignalboxError as exc:
            self.say(f"error: cannot show proposal {proposal_id}: {exc}")
        else:
            self.say(*render_proposal(proposal.model_dump(mode="json")))
            status = str(proposal.status)
        policy = self.options.policy
        if status != "pending" or proposal_id in self.state.resolved:
            # Decided already (a conversation shown again from its start): nothing to ask.
            self.state.undecided.discard(proposal_id)
        elif policy in ("approve", "reject"):
            decide = DecideProposal(
                type="decide_proposal", proposal_id=proposal_id, decision=policy
            )
            self.send(decide)
        elif policy == "ask":
            self.open_prompt(
                Prompt("proposal", proposal_id, f"approve proposal {proposal_id}? [y/n]")
            )
        else:
            self.say(f"   (left pending: `signalbox proposals approve {proposal_id}`)")
        self._changed_now()

    def _tool_decision(self, call_id: str, tool: str) -> None:
        policy = self.options.policy
        if policy in ("approve", "reject"):
            decision: Literal["allow", "deny"] = "allow" if policy == "approve" else "deny"
            self.send(DecideTool(type="decide_tool", call_id=call_id, decision=decision))
        elif policy == "ask":
            self.open_prompt(
                Prompt("tool", call_id, f"allow {tool} (call {call_id})? [a]llow/[d]eny"),
                settle=True,
            )
        else:
            self.say("   (waiting for a decision from another client)")

    def _question(self, question_id: str) -> None:
        if self.options.policy == "ask":
            self.open_prompt(Prompt("question", question_id, "your answer:"), settle=True)
        else:
            self.say("   (waiting for an answer from another client)")

    def open_prompt(self, prompt: Prompt, settle: bool = False) -> None:
        """Queue ``prompt``; it is shown when the prompts before it are answered.

        ``settle``: show it only once output has settled, so a prompt that a replayed
        event resolves right after (``tool_call_decided``...) is never shown.
        """
        self.prompts.append(prompt)
        if len(self.prompts) == 1:
            if settle and _has_loop():
                self._settle_prompt()
            else:
                self._show_prompt()

    def close_prompt(self, kind: str, target_id: str) -> None:
        """Drop the prompt for ``target_id``: it was decided elsewhere (or before)."""
        head = self.prompts[0] if self.prompts else None
        kept = [p for p in self.prompts if not (p.kind == kind and p.target_id == target_id)]
        if len(kept) == len(self.prompts):
            return
        self.prompts = deque(kept)
        if head is not None and (not self.prompts or self.prompts[0] is not head):
            self._prompt_shown = False
            self._settle_prompt()

    def _reprompt(self) -> None:
        self._prompt_shown = False
        self._show_prompt()

    async def answer(self, line: str) -> None:
        """Use ``line`` as the answer to the oldest open prompt."""
        prompt = self.prompts[0]
        word = line.strip().lower()
        frame: BaseModel
        if prompt.kind == "question":
            frame = Answer(type="answer", question_id=prompt.target_id, text=line)
        elif prompt.kind == "proposal" and word in PROPOSAL_ANSWERS:
            frame = DecideProposal(
                type="decide_proposal",
                proposal_id=prompt.target_id,
                decision="approve" if PROPOSAL_ANSWERS[word] == "approve" else "reject",
            )
        elif prompt.kind == "tool" and word in TOOL_ANSWERS:
            frame = DecideTool(
                type="decide_tool",
                call_id=prompt.target_id,
                decision="allow" if TOOL_ANSWERS[word] == "allow" else "deny",
            )
        else:
            self._reprompt()
            return
        self.prompts.popleft()
        self.send(frame)
        if self.prompts:
            self._reprompt()

    # -- the two ways to run ---------------------------------------------------------------

    async def _run_with_connection(
        self, body: Coroutine[Any, Any, int], timeout_s: float | None, replay: bool = False
    ) -> int:
        try:
            await self._connect(replay)
        except BaseException:
            body.close()
            await self.api.aclose()
            raise
        connection = asyncio.create_task(self._follow(), name="chat-follow")
        work: asyncio.Task[int] = asyncio.create_task(body)
        try:
            done, _ = await asyncio.wait(
                {connection, work}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if work in done:
                return work.result()
            if connection in done:
                connection.result()  # raises ChatError
                return 1
            self.say(f"signalbox chat: gave up after {timeout_s:.0f} s")
            return 1
        finally:
            self._stopping = True
            for task in (work, connection, *self._tasks):
                task.cancel()
            await asyncio.gather(work, connection, *self._tasks, return_exceptions=True)
            await self.ws.close()
            await self.api.aclose()

    async def _connect(self, replay: bool) -> None:
        """Connect (and with ``replay``, follow the conversation continued from its start);
        a refused token or an unknown conversation is a ``ChatError`` that says so."""
        try:
            await self.ws.connect()
            if replay and self.options.conversation_id is not None:
                await self.ws.subscribe(self.options.conversation_id, None)
        except SignalboxError as exc:
            await self.ws.close()
            raise ChatError(str(exc)) from None

    def _settled(self) -> bool:
        """Every request answered, every approval's ``proposal_resolved`` seen."""
        state = self.state
        return not state.inflight and not self._tasks and state.approved <= state.resolved

    async def run_once(self, text: str) -> int:
        """Send one turn, show it to its end (deciding proposals if asked); 0 if completed."""
        return await self._run_with_connection(self._once(text), self.options.timeout_s)

    async def _once(self, text: str) -> int:
        state = self.state
        self.send_turn(text)
        await self._until(lambda: state.turn_status is not None)
        # Proposals announced at the very end may still be fetching or awaiting their ack.
        await self._until(lambda: not state.undecided and not self._tasks)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._until(self._settled), RESOLVED_GRACE_S)
        if state.turn_status != TurnState.COMPLETED:
            return 1
        return 1 if state.decision_failed else 0

    async def run_interactive(self, lines: AsyncIterator[str]) -> int:
        """Chat with lines from ``lines`` until ``/quit`` or their end (a conversation
        continued with ``--conversation`` is shown from its start, then live)."""
        return await self._run_with_connection(self._interactive(lines), None, replay=True)

    def ready_for_input(self) -> bool:
        """True when the next typed line can be used: a prompt is open, or no turn runs."""
        if self.prompts:
            return True
        state = self.state
        awaiting_ack = any(f["type"] == "user_turn" for f in state.inflight.values())
        turn_running = state.client_turn_id is not None and state.turn_status is None
        # A decision still awaiting its ack holds nothing up; a proposal being fetched
        # does (its prompt is about to open).
        fetching = self._tasks - self._request_tasks
        return not awaiting_ack and not turn_running and not fetching

    async def _interactive(self, lines: AsyncIterator[str]) -> int:
        self.say(HELP)
        typed: asyncio.Queue[tuple[str, int] | None] = asyncio.Queue()
        messages: asyncio.Queue[str | None] = asyncio.Queue()
        consumer = asyncio.create_task(self._use_typed_lines(typed, messages))
        sender = asyncio.create_task(self._send_messages(messages))
        try:
            async for raw in lines:
                line = raw.strip()
                self.typed += 1
                # Commands act at once, even mid-turn; text waits for its turn (or prompt).
                if line == "/quit":
                    return 0
                if line == "/cancel":
                    await self._cancel()
                elif line in ("/help", "/?"):
                    self.say(HELP)
                else:
                    typed.put_nowait((raw.rstrip("\n"), self.typed))
            # End of input (a pipe): use what was typed, let the last turn finish, leave.
            typed.put_nowait(None)
            await consumer
            messages.put_nowait(None)
            await sender
            state = self.state
            await self._until(lambda: state.client_turn_id is None or bool(state.turn_status))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._until(self._settled), RESOLVED_GRACE_S)
            return 0
        finally:
            consumer.cancel()
            sender.cancel()
            await asyncio.gather(consumer, sender, return_exceptions=True)

    async def _use_typed_lines(
        self, typed: asyncio.Queue[tuple[str, int] | None], messages: asyncio.Queue[str | None]
    ) -> None:
        """Each typed line answers the open prompt if it is an answer to it, else it is a
        message, kept for when no turn runs: a line typed meanwhile is never lost."""
        while (item := await typed.get()) is not None:
            line, number = item
            await self._until(self.ready_for_input)
            prompt = self.prompts[0] if self.prompts else None
            # A question takes any text, so only a line typed after it was shown; y/n and
            # allow/deny take a line typed ahead (a script piping its answers).
            shown_after = prompt.shown_after if prompt is not None else None
            typed_after = shown_after is not None and number > shown_after
            if (
                prompt is not None
                and prompt.takes(line)
                and (prompt.kind != "question" or typed_after)
            ):
                await self.answer(line)
                continue
            if not line.strip():
                continue
            if prompt is None and not self.held:
                self.send_turn(line.strip())
                continue
            self.held += 1
            messages.put_nowait(line.strip())
            if prompt is not None:
                self.say(f"(kept as your next message: {line.strip()[:60]})")
                self._reprompt()

    def ready_for_turn(self) -> bool:
        """True when a message can go out as a new turn: no prompt open, no turn running."""
        return not self.prompts and self.ready_for_input()

    async def _send_messages(self, messages: asyncio.Queue[str | None]) -> None:
        while (text := await messages.get()) is not None:
            await self._until(self.ready_for_turn)
            self.send_turn(text)
            self.held -= 1

    async def _cancel(self) -> None:
        state = self.state
        if state.turn_id is None or state.turn_status is not None:
            self.say("(no running turn to cancel)")
            return
        self.send(Cancel(type="cancel", turn_id=state.turn_id))


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def stdin_lines() -> AsyncIterator[str]:
    """Lines typed on stdin, read by a thread so the socket keeps flowing meanwhile."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def put(item: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the chat has ended
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def read() -> None:
        for line in sys.stdin:
            put(line)
        put(None)

    threading.Thread(target=read, name="chat-stdin", daemon=True).start()
    while (line := await queue.get()) is not None:
        yield line


def run_chat(options: ChatOptions, once: str | None = None, out: TextIO | None = None) -> int:
    """Run ``signalbox chat``; the exit status."""
    client = ChatClient(options, out or sys.stdout)
    try:
        if once is not None:
            return asyncio.run(client.run_once(once))
        return asyncio.run(client.run_interactive(stdin_lines()))
    except KeyboardInterrupt:
        return 130
