"""``signalbox chat``: a terminal client of the gateway's WebSocket.

The socket may drop at any moment; the client then reconnects with backoff, subscribes
again with the last event id it saw (``EventTracker``) and resends every frame that had
no reply yet. Every frame it resends is idempotent: turns carry a ``client_turn_id``,
approving twice is harmless. Rendering lives in ``chat_render`` (pure); this module is
only the I/O around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from shared.event_stream import id_after
from shared.protocol import Answer, Cancel, DecideProposal, DecideTool, Subscribe, UserTurn
from signalbox.chat_render import Renderer, render_proposal
from signalbox.gateway_api import ApiError, ProposalsApi, ws_url

Frame = dict[str, Any]
Policy = Literal["ask", "approve", "reject", "leave"]

RECONNECT_FIRST_S = 0.25  # first retry soon: most drops are a restarted gateway or a blip
RECONNECT_MAX_S = 5.0
OPEN_TIMEOUT_S = 10.0
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
    """A client frame of ``shared/protocol.py`` as the dict the chat sends and remembers."""
    return model.model_dump(mode="json", exclude_none=True)


class ChatError(RuntimeError):
    """The chat cannot go on (e.g. the token is refused); the message says why."""


class EventTracker:
    """The resume point of each conversation; drops events already seen.

    Event ids increase within a conversation, so an event at or before the last id seen
    is a repeat (a replay overlapping what arrived live before a drop).
    """

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def accept(self, event: Mapping[str, Any]) -> bool:
        """True (and remember it) when ``event`` is new; False for a repeat."""
        conversation_id, event_id = str(event["conversation_id"]), str(event["id"])
        previous = self.last.get(conversation_id)
        if previous is not None and not id_after(event_id, previous):
            return False
        self.last[conversation_id] = event_id
        return True

    def resume_after(self, conversation_id: str) -> str | None:
        """The ``after`` of a subscribe that replays exactly what was missed."""
        return self.last.get(conversation_id)


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
    following: set[str] = field(default_factory=set)
    inflight: dict[str, Frame] = field(default_factory=dict)  # req -> frame awaiting a reply
    resent: set[str] = field(default_factory=set)
    client_turn_id: str | None = None
    turn_id: str | None = None
    turn_status: str | None = None
    undecided: set[str] = field(default_factory=set)  # proposals --once still has to decide
    approved: set[str] = field(default_factory=set)
    resolved: set[str] = field(default_factory=set)
    decision_failed: bool = False


class ChatClient:
    """One chat session: a WebSocket that survives drops, a renderer, the human's prompts."""

    def __init__(
        self,
        options: ChatOptions,
        out: TextIO,
        api: ProposalsApi | None = None,
        on_event: Callable[[Frame], None] | None = None,
    ) -> None:
        self.options = options
        self.out = out
        self.api = api or ProposalsApi(options.url, options.token)
        self.on_event = on_event  # tests watch accepted events through this
        self.url = ws_url(options.url)
        self.tracker = EventTracker()
        self.renderer = Renderer()
        self.state = _State(conversation_id=options.conversation_id)
        self.prompts: deque[Prompt] = deque()
        self.connection: ClientConnection | None = None
        self.connections = 0
        self._req = 0
        self._changed = asyncio.Event()
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.typed = 0  # lines typed so far (a prompt answers only lines typed after it)
        self.held = 0  # messages typed while a prompt was open, waiting for their turn
        self._prompt_shown = False  # the head prompt is the last thing printed
        self._prompt_timer: asyncio.TimerHandle | None = None

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

    async def send(self, frame: Frame) -> str:
        """Send ``frame`` with a fresh ``req``; it is resent after a reconnect until answered."""
        self._req += 1
        req = f"c{self._req}"
        frame = {**frame, "req": req}
        self.state.inflight[req] = frame
        await self._transmit(frame)
        return req

    async def _transmit(self, frame: Frame) -> None:
        conn = self.connection
        if conn is None:
            return  # sent by the next connection
        with contextlib.suppress(ConnectionClosed):
            await conn.send(json.dumps(frame))

    async def _subscribe(self, conversation_id: str, after: str | None) -> None:
        self.state.following.add(conversation_id)
        subscribe = Subscribe(type="subscribe", conversation_id=conversation_id, after=after)
        await self.send({**frame_of(subscribe), "after": after})

    async def send_turn(self, text: str) -> None:
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
        await self.send(frame_of(turn))

    # -- the connection --------------------------------------------------------------------

    async def connection_loop(self) -> None:
        """Stay connected until stopped: reconnect with backoff, resume every subscription."""
        delay = RECONNECT_FIRST_S
        while not self._stopping:
            try:
                async with connect(
                    self.url,
                    additional_headers={"Authorization": f"Bearer {self.options.token}"},
                    open_timeout=OPEN_TIMEOUT_S,
                ) as conn:
                    self.connection = conn
                    delay = RECONNECT_FIRST_S
                    await self._on_connected()
                    async for raw in conn:
                        await self._handle(json.loads(raw))
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403):
                    raise ChatError(
                        f"the gateway at {self.options.url} refused the token ({status})"
                    ) from None
                self.say(f"(the gateway answered {status}; retrying in {delay:.1f} s)")
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake) as exc:
                if not self._stopping:
                    what = "lost" if self.connections else "not possible"
                    self.say(
                        f"(connection {what}: {type(exc).__name__}; retrying in {delay:.1f} s)"
                    )
            finally:
                self.connection = None
            if self._stopping:
                return
            # Backoff between attempts to reach another process: a wait, not synchronisation.
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def _on_connected(self) -> None:
        self.connections += 1
        state = self.state
        if self.connections > 1:
            self.say("(reconnected; resuming where the stream left off)")
        # Subscriptions of the old socket died with it; its replies will never come. The
        # rest is resent, in the order first sent; frames sent from here on go out directly.
        unanswered = [(r, f) for r, f in state.inflight.items() if f["type"] != "subscribe"]
        state.inflight = dict(unanswered)
        for conversation_id in sorted(state.following):
            await self._subscribe(conversation_id, self.tracker.resume_after(conversation_id))
        for req, frame in unanswered:
            if self.connections > 1:
                state.resent.add(req)
            await self._transmit(frame)

    # -- receiving -------------------------------------------------------------------------

    async def _handle(self, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "event":
            if self.tracker.accept(frame):
                self.emit(self.renderer.render(frame))
                await self._react(frame)
                if self.on_event is not None:
                    self.on_event(frame)
        elif kind in ("ack", "error"):
            await self._reply(frame)
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
            await self._tool_decision(str(data.get("call_id")), str(data.get("tool")))
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

    async def _reply(self, frame: Frame) -> None:
        state = self.state
        req = frame.get("req")
        sent = state.inflight.pop(str(req), None) if req is not None else None
        ok = frame["type"] == "ack"
        if sent is None:
            self.emit(self.renderer.render_frame(frame))
            return
        match sent["type"]:
            case "user_turn" if ok:
                conversation_id = str(frame["conversation_id"])
                state.conversation_id = conversation_id
                state.turn_id = str(frame["turn_id"])
                state.following.add(conversation_id)
                if req in state.resent:
                    # The gateway resumes a repeated turn from "now"; we want from our last id.
                    await self._subscribe(
                        conversation_id, self.tracker.resume_after(conversation_id)
                    )
            case "user_turn":
                state.turn_status = f"refused ({frame.get('code')})"
                self.emit(self.renderer.render_frame(frame))
            case "subscribe" if not ok and frame.get("code") == "replay_gap":
                conversation_id = str(sent["conversation_id"])
                self.say(
                    f"(events of {conversation_id} after {sent.get('after')} are no longer "
                    "kept; showing what the server still has)"
                )
                await self._subscribe(conversation_id, None)
            case "decide_proposal":
                proposal_id = str(sent["proposal_id"])
                state.undecided.discard(proposal_id)
                if ok:
                    status = frame.get("status")
                    if status == "applied":
                        state.approved.add(proposal_id)
                    done = DONE.get(str(sent["decision"]), str(sent["decision"]))
                    self.say(f"** proposal {proposal_id} {done}: now {status}")
                else:
                    state.decision_failed = True
                    self.emit(self.renderer.render_frame(frame))
            case _:
                if not ok:
                    self.emit(self.renderer.render_frame(frame))

    # -- decisions -------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._changed_now()

    async def _show_proposal(self, proposal_id: str) -> None:
        status = "pending"
        try:
            proposal = await asyncio.to_thread(self.api.get, proposal_id)
        except ApiError as exc:
            self.say(f"error: cannot show proposal {proposal_id}: {exc}")
        else:
            self.say(*render_proposal(proposal))
            status = str(proposal.get("status"))
        policy = self.options.policy
        if status != "pending" or proposal_id in self.state.resolved:
            # Decided already (a conversation shown again from its start): nothing to ask.
            self.state.undecided.discard(proposal_id)
        elif policy in ("approve", "reject"):
            decide = DecideProposal(
                type="decide_proposal", proposal_id=proposal_id, decision=policy
            )
            await self.send(frame_of(decide))
        elif policy == "ask":
            self.open_prompt(
                Prompt("proposal", proposal_id, f"approve proposal {proposal_id}? [y/n]")
            )
        else:
            self.say(f"   (left pending: `signalbox proposals approve {proposal_id}`)")
        self._changed_now()

    async def _tool_decision(self, call_id: str, tool: str) -> None:
        policy = self.options.policy
        if policy in ("approve", "reject"):
            decision: Literal["allow", "deny"] = "allow" if policy == "approve" else "deny"
            await self.send(
                frame_of(DecideTool(type="decide_tool", call_id=call_id, decision=decision))
            )
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
        await self.send(frame_of(frame))
        if self.prompts:
            self._reprompt()

    # -- the two ways to run ---------------------------------------------------------------

    async def _run_with_connection(
        self, body: Coroutine[Any, Any, int], timeout_s: float | None
    ) -> int:
        connection = asyncio.create_task(self.connection_loop())
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
            if self.connection is not None:
                await self.connection.close()
            self.api.close()

    def _settled(self) -> bool:
        """Every request answered, every approval's ``proposal_resolved`` seen."""
        state = self.state
        unanswered = [f for f in state.inflight.values() if f["type"] != "subscribe"]
        return not unanswered and not self._tasks and state.approved <= state.resolved

    async def run_once(self, text: str) -> int:
        """Send one turn, show it to its end (deciding proposals if asked); 0 if completed."""
        return await self._run_with_connection(self._once(text), self.options.timeout_s)

    async def _once(self, text: str) -> int:
        state = self.state
        await self.send_turn(text)
        await self._until(lambda: state.turn_status is not None)
        # Proposals announced at the very end may still be fetching or awaiting their ack.
        await self._until(lambda: not state.undecided and not self._tasks)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._until(self._settled), RESOLVED_GRACE_S)
        if state.turn_status != "completed":
            return 1
        return 1 if state.decision_failed else 0

    async def run_interactive(self, lines: AsyncIterator[str]) -> int:
        """Chat with lines from ``lines`` until ``/quit`` or their end."""
        if self.state.conversation_id is not None:
            # An existing conversation: show it from its start, then live.
            self.state.following.add(self.state.conversation_id)
        return await self._run_with_connection(self._interactive(lines), None)

    def ready_for_input(self) -> bool:
        """True when the next typed line can be used: a prompt is open, or no turn runs."""
        if self.prompts:
            return True
        state = self.state
        awaiting_ack = any(f["type"] == "user_turn" for f in state.inflight.values())
        turn_running = state.client_turn_id is not None and state.turn_status is None
        return not awaiting_ack and not turn_running and not self._tasks

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
                await self.send_turn(line.strip())
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
            await self.send_turn(text)
            self.held -= 1

    async def _cancel(self) -> None:
        state = self.state
        if state.turn_id is None or state.turn_status is not None:
            self.say("(no running turn to cancel)")
            return
        await self.send(frame_of(Cancel(type="cancel", turn_id=state.turn_id)))


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
