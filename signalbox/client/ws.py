"""The gateway's WebSocket: ``AsyncWebSocket`` (asyncio) and ``WebSocket`` (blocking).

Every frame is a model of ``shared/protocol.py``. A request waits for the reply carrying its
``req``; events go to ``events()``. When the socket drops, the session reconnects with
backoff and subscribes each conversation again after the last event it delivered, so
``events()`` yields every event once, in order. A request in flight at the drop raises
``ConnectionLost``, or, with ``resend=True``, is sent again on the next connection (every
client frame is safe to repeat: turns carry a ``client_turn_id``, deciding twice is refused
or harmless). ``on_state`` hears each connection change (``StateChange``), so a program
can say "reconnecting..." while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from signalbox.client.errors import (
    ConnectionLost,
    SignalboxError,
    Unauthorized,
    Unreachable,
    frame,
    from_code,
)
from signalbox.client.sse import parse_event
from signalbox.shared.event_stream import id_after
from signalbox.shared.events import Event
from signalbox.shared.protocol import (
    Ack,
    Answer,
    Cancel,
    ClientToolResult,
    ClientToolSpec,
    DecideProposal,
    DecideTool,
    Ping,
    Subscribe,
    Unsubscribe,
    UserTurn,
)

T = TypeVar("T")

OPEN_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 30.0
RECONNECT_FIRST_S = 0.25
RECONNECT_MAX_S = 5.0
RECONNECT_GIVE_UP_S = 60.0


class ConnectionState(StrEnum):
    """Where the session's connection stands, as ``on_state`` hears it."""

    CONNECTED = "connected"  # connected; ``connections`` > 1 means again, after a drop
    DROPPED = "dropped"  # the connection ended; reconnecting at once
    RETRYING = "retrying"  # an attempt to reconnect failed; the next in ``retry_in_s``
    GAVE_UP = "gave_up"  # no connection for ``give_up_s``: ``events()`` raises ``Unreachable``
    CLOSED = "closed"  # ``close()`` was called


@dataclass(frozen=True)
class StateChange:
    """One change of the connection: the new state, and why (``detail``) when it failed."""

    state: ConnectionState
    connections: int  # connections made so far, this one included
    detail: str | None = None
    retry_in_s: float | None = None


StateHook = Callable[[StateChange], None]


class TurnAck(BaseModel):
    """The ``ack`` of ``user_turn``: where the turn went."""

    model_config = ConfigDict(extra="allow")
    conversation_id: str
    turn_id: str


class ProposalAck(BaseModel):
    """The ``ack`` of ``decide_proposal``: the proposal's new status."""

    model_config = ConfigDict(extra="allow")
    proposal_id: str
    status: str


def ws_url(gateway_url: str) -> str:
    """The WebSocket URL of the gateway at ``gateway_url`` (``http(s)://host:port``)."""
    base = gateway_url.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if base.startswith(http):
            return ws + base.removeprefix(http) + "/ws"
    raise SignalboxError(f"expected a URL starting http:// or https://, got {gateway_url!r}")


class AsyncWebSocket:
    """One user's WebSocket session that survives drops. Use ``async with``.

    ``resend``: a request whose reply the drop lost is sent again on the next connection
    instead of raising ``ConnectionLost``. ``on_state``: called (on the event loop) with
    every ``StateChange``; it must not block.
    """

    def __init__(
        self,
        url: str,
        token: str,
        give_up_s: float = RECONNECT_GIVE_UP_S,
        *,
        resend: bool = False,
        on_state: StateHook | None = None,
    ) -> None:
        self.url = ws_url(url)
        self.token = token
        self.give_up_s = give_up_s
        self.resend = resend
        self.on_state = on_state
        self.state: ConnectionState | None = None
        self.connections = 0  # how many times it connected (1 + reconnects)
        self.resent = 0  # requests sent again after a drop
        self.last: dict[str, str] = {}  # conversation -> last event id delivered
        self._following: set[str] = set()
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._events: asyncio.Queue[Event | SignalboxError] = asyncio.Queue()
        self._conn: ClientConnection | None = None
        self._connected = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AsyncWebSocket:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect (``Unauthorized`` for a refused token) and keep connected until ``close``."""
        conn = await self._open()
        self._runner = asyncio.create_task(self._run(conn), name="signalbox-ws")

    async def close(self) -> None:
        """Close the socket and stop reconnecting."""
        if not self._closing:
            self._closing = True
            self._set_state(ConnectionState.CLOSED)
        if self._conn is not None:
            await self._conn.close()
        if self._runner is not None:
            self._runner.cancel()
            # A runner that gave up already told ``events()``; closing is not another error.
            with contextlib.suppress(asyncio.CancelledError, SignalboxError):
                await self._runner

    async def drop(self) -> None:
        """Close the current connection as a network failure would (tests, and retrying)."""
        if self._conn is not None:
            await self._conn.close(code=4000, reason="dropped by the client")

    def abort(self) -> None:
        """Cut the current connection without a close frame, as a network failure does."""
        if self._conn is not None:
            self._conn.transport.abort()

    def _set_state(
        self, state: ConnectionState, detail: str | None = None, retry_in_s: float | None = None
    ) -> None:
        self.state = state
        if self.on_state is not None:
            self.on_state(StateChange(state, self.connections, detail, retry_in_s))

    # -- the connection ----------------------------------------------------------------------

    async def _open(self) -> ClientConnection:
        try:
            conn = await connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                open_timeout=OPEN_TIMEOUT_S,
                max_size=None,
            )
        except InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                status = exc.response.status_code
                raise Unauthorized(
                    f"the gateway at {self.url} refused the token ({status})"
                ) from None
            raise Unreachable(f"handshake with {self.url} failed: {exc}") from None
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"cannot reach the gateway at {self.url}: {exc!r}") from None
        self.connections += 1
        self._conn = conn
        self._connected.set()
        self._set_state(ConnectionState.CONNECTED)
        return conn

    async def _run(self, conn: ClientConnection) -> None:
        while True:
            await self._read(conn)
            self._connected.clear()
            self._conn = None
            for future in self._replies.values():
                if not future.done():
                    future.set_exception(ConnectionLost("the socket dropped before the reply"))
            self._replies.clear()
            if self._closing:
                return
            # 1006: cut without a close frame (the network, or a killed gateway).
            self._set_state(ConnectionState.DROPPED, f"the connection closed ({conn.close_code})")
            conn = await self._reconnect()
            task = asyncio.create_task(self._resubscribe(), name="signalbox-ws-resubscribe")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _reconnect(self) -> ClientConnection:
        delay, waited = RECONNECT_FIRST_S, 0.0
        while True:
            try:
                return await self._open()
            except Unreachable as exc:
                if waited > self.give_up_s:
                    self._set_state(ConnectionState.GAVE_UP, str(exc))
                    self._events.put_nowait(exc)
                    raise
                self._set_state(ConnectionState.RETRYING, str(exc), delay)
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def _resubscribe(self) -> None:
        for conversation_id in list(self._following):
            try:
                await self.subscribe(conversation_id, self.last.get(conversation_id))
            except ConnectionLost:
                return  # the next connection resubscribes
            except SignalboxError as exc:
                exc.body.setdefault("conversation_id", conversation_id)
                self._events.put_nowait(exc)

    async def _read(self, conn: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in conn:
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "event":
                    self._deliver(parse_event(frame))
                elif kind in ("ack", "error", "pong"):
                    future = self._replies.pop(str(frame.get("req")), None)
                    if future is not None and not future.done():
                        future.set_result(frame)

    def _deliver(self, event: Event) -> None:
        previous = self.last.get(event.conversation_id)
        if previous is not None and not id_after(event.id, previous):
            return  # a replay overlapping what arrived live before a drop
        self.last[event.conversation_id] = event.id
        self._events.put_nowait(event)

    # -- requests ----------------------------------------------------------------------------

    async def request(self, message: BaseModel, resend: bool | None = None) -> Ack:
        """Send ``message`` (a ``signalbox.shared.protocol`` frame), a fresh ``req``; its ``ack``.

        An ``error`` reply raises its ``SignalboxError`` (``NotFound``, ``Conflict``...).
        ``resend`` (default: the session's): after a drop, send it again rather than raise.
        """
        ack, _attempts = await self._exchange(message, self.resend if resend is None else resend)
        return ack

    async def _exchange(self, message: BaseModel, resend: bool) -> tuple[Ack, int]:
        """The ``ack`` of ``message`` and how many times it was sent to get it."""
        attempts = 0
        while True:
            attempts += 1
            try:
                return await self._send_once(message), attempts
            except ConnectionLost:
                if not resend or self._closing:
                    raise
                self.resent += 1

    async def _wait_connected(self) -> ClientConnection:
        """The live connection; waits through a reconnect (``Unreachable`` once the session
        gives up, ``ConnectionLost`` once it is closed)."""
        if self._conn is not None and self._connected.is_set():
            return self._conn
        waiter = asyncio.ensure_future(self._connected.wait())
        watched: set[asyncio.Future[Any]] = {waiter}
        if self._runner is not None:
            watched.add(self._runner)
        try:
            await asyncio.wait(
                watched,
                timeout=self.give_up_s + REPLY_TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiter.cancel()
        if self._conn is not None:
            return self._conn
        if self._closing:
            raise ConnectionLost("the session is closed")
        raise Unreachable(f"not connected to {self.url}: gave up reconnecting")

    async def _send_once(self, message: BaseModel) -> Ack:
        conn = await self._wait_connected()
        req = uuid.uuid4().hex[:12]
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[req] = future
        try:
            await conn.send(message.model_copy(update={"req": req}).model_dump_json())
        except ConnectionClosed:
            self._replies.pop(req, None)
            if self._conn is conn:  # before the reader notices: a resend waits for the next
                self._conn = None
                self._connected.clear()
            raise ConnectionLost("the socket dropped before the frame was sent") from None
        reply = await asyncio.wait_for(future, REPLY_TIMEOUT_S)
        if reply["type"] == "error":
            raise from_code(str(reply.get("code")), str(reply.get("message")))
        return Ack.model_validate(reply)

    async def subscribe(self, conversation_id: str, after: str | None = None) -> Ack:
        """Follow a conversation from after ``after`` (None: from its start); kept on reconnect."""
        self._following.add(conversation_id)
        if after is not None:
            self.last.setdefault(conversation_id, after)
        return await self.request(
            frame(Subscribe, type="subscribe", conversation_id=conversation_id, after=after)
        )

    async def unsubscribe(self, conversation_id: str) -> Ack:
        """Stop following a conversation."""
        self._following.discard(conversation_id)
        return await self.request(
            frame(Unsubscribe, type="unsubscribe", conversation_id=conversation_id)
        )

    async def start_turn(
        self,
        text: str,
        conversation_id: str | None = None,
        client_turn_id: str | None = None,
        workspace: str | None = None,
        client_tools: Sequence[ClientToolSpec] | None = None,
        attachments: Sequence[str] | None = None,
    ) -> TurnAck:
        """Send a turn (a new conversation when ``conversation_id`` is None) and follow it.
        ``attachments``: ids of uploads (``Client.upload``) sent with the text.

        The ``ack`` has ``conversation_id`` and ``turn_id``. A ``client_turn_id`` is made up
        when none is given, so the turn can be sent again after ``ConnectionLost``.
        """
        built = frame(
            UserTurn,
            type="user_turn",
            conversation_id=conversation_id,
            text=text,
            client_turn_id=client_turn_id or uuid.uuid4().hex,
            workspace=workspace,
            client_tools=list(client_tools) if client_tools else None,
            attachments=list(attachments) if attachments else None,
        )
        reply, attempts = await self._exchange(built, self.resend)
        ack = TurnAck.model_validate(reply, from_attributes=True)
        followed = ack.conversation_id in self._following
        self._following.add(ack.conversation_id)
        if attempts > 1 and not followed:
            # The gateway follows a repeated turn from "now": replay what the drop lost
            # (events already delivered are dropped by id).
            with contextlib.suppress(ConnectionLost):
                await self.subscribe(ack.conversation_id, self.last.get(ack.conversation_id))
        return ack

    async def cancel(self, turn_id: str) -> Ack:
        """Stop a turn."""
        return await self.request(frame(Cancel, type="cancel", turn_id=turn_id))

    async def decide_tool(
        self, call_id: str, decision: Literal["allow", "deny"], reason: str | None = None
    ) -> Ack:
        """Allow or deny a tool call that waits for a decision."""
        return await self.request(
            frame(DecideTool, type="decide_tool", call_id=call_id, decision=decision, reason=reason)
        )

    async def decide_proposal(
        self, proposal_id: str, decision: Literal["approve", "reject"], reason: str | None = None
    ) -> ProposalAck:
        """Approve or reject a proposal; its new ``status``."""
        ack = await self.request(
            frame(
                DecideProposal,
                type="decide_proposal",
                proposal_id=proposal_id,
                decision=decision,
                reason=reason,
            )
        )
        return ProposalAck.model_validate(ack, from_attributes=True)

    async def answer(self, question_id: str, text: str) -> Ack:
        """Answer an ``ask_user`` question."""
        return await self.request(frame(Answer, type="answer", question_id=question_id, text=text))

    async def tool_result(
        self, call_id: str, token: str, output: str, is_error: bool = False
    ) -> Ack:
        """Return a client tool's result with its call's single-use token."""
        return await self.request(
            frame(
                ClientToolResult,
                type="tool_result",
                call_id=call_id,
                token=token,
                output=output,
                is_error=is_error,
            )
        )

    async def ping(self) -> None:
        """A round trip."""
        await self.request(frame(Ping, type="ping"))

    async def next_event(self, timeout_s: float | None = None) -> Event:
        """The next event of any followed conversation (``TimeoutError`` after ``timeout_s``)."""
        item = await asyncio.wait_for(self._events.get(), timeout_s)
        if isinstance(item, SignalboxError):
            raise item
        return item

    async def events(self) -> AsyncIterator[Event]:
        """Every event of the followed conversations, once each, in order, across drops."""
        while True:
            yield await self.next_event()


class WebSocket:
    """``AsyncWebSocket`` for blocking code: the session runs on its own event-loop thread."""

    def __init__(
        self,
        url: str,
        token: str,
        give_up_s: float = RECONNECT_GIVE_UP_S,
        *,
        resend: bool = False,
        on_state: StateHook | None = None,
    ) -> None:
        """``resend`` and ``on_state`` as ``AsyncWebSocket``'s (``on_state`` runs on the
        session's thread)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.session = AsyncWebSocket(url, token, give_up_s, resend=resend, on_state=on_state)
        try:
            self._call(self.session.connect())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coroutine: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        async def run() -> T:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> WebSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket and the session's thread."""
        self._call(self.session.close())
        self._stop_loop()

    def drop(self) -> None:
        """Close the current connection as a network failure would."""
        self._call(self.session.drop())

    def abort(self) -> None:
        """Cut the current connection without a close frame."""
        self._loop.call_soon_threadsafe(self.session.abort)

    def subscribe(self, conversation_id: str, after: str | None = None) -> Ack:
        """Follow a conversation from after ``after``."""
        return self._call(self.session.subscribe(conversation_id, after))

    def start_turn(
        self,
        text: str,
        conversation_id: str | None = None,
        client_turn_id: str | None = None,
        workspace: str | None = None,
        client_tools: Sequence[ClientToolSpec] | None = None,
        attachments: Sequence[str] | None = None,
    ) -> TurnAck:
        """Send a turn and follow its conversation (``attachments``: upload ids)."""
        return self._call(
            self.session.start_turn(
                text, conversation_id, client_turn_id, workspace, client_tools, attachments
            )
        )

    def cancel(self, turn_id: str) -> Ack:
        """Stop a turn."""
        return self._call(self.session.cancel(turn_id))

    def decide_tool(
        self, call_id: str, decision: Literal["allow", "deny"], reason: str | None = None
    ) -> Ack:
        """Allow or deny a tool call."""
        return self._call(self.session.decide_tool(call_id, decision, reason))

    def decide_proposal(
        self, proposal_id: str, decision: Literal["approve", "reject"], reason: str | None = None
    ) -> ProposalAck:
        """Approve or reject a proposal."""
        return self._call(self.session.decide_proposal(proposal_id, decision, reason))

    def answer(self, question_id: str, text: str) -> Ack:
        """Answer a question."""
        return self._call(self.session.answer(question_id, text))

    def tool_result(self, call_id: str, token: str, output: str, is_error: bool = False) -> Ack:
        """Return a client tool's result."""
        return self._call(self.session.tool_result(call_id, token, output, is_error))

    def next_event(self, timeout_s: float | None = None) -> Event:
        """The next event (``TimeoutError`` after ``timeout_s``)."""
        return self._call(self.session.next_event(timeout_s))

    def events(self) -> Iterator[Event]:
        """Every event of the followed conversations, once each, in order, across drops."""
        while True:
            yield self.next_event()
