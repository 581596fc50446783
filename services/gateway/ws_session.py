"""One accepted WebSocket: a reader that handles frames, a writer that drains one outbox.

Every outgoing frame (replies, events, heartbeats) goes through the socket's bounded
outbox and its single writer, so replies and events keep their order. A socket whose
outbox is full is closed with 1013; the relay that fills it never waits for it. The
heartbeat and the idle timeout are the gateway's one ``SocketClock``'s (socket_clock.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import redis.exceptions
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from signalbox.services.gateway import interactions, proposals_client, tool_decisions, turns
from signalbox.services.gateway.errors import BadInput, GatewayError, ReplayGapError
from signalbox.services.gateway.metrics import user_class
from signalbox.services.gateway.ownership import owned_conversation
from signalbox.services.gateway.rate_limit import FRAME_ACTIONS, Action
from signalbox.services.gateway.relay import EventHead, Subscription
from signalbox.services.gateway.state import Gateway
from signalbox.shared.db import User
from signalbox.shared.event_stream import ReplayGap, check_event_id
from signalbox.shared.events import Event
from signalbox.shared.protocol import (
    Ack,
    Answer,
    Cancel,
    ClientFrame,
    ClientToolResult,
    DecideProposal,
    DecideTool,
    ErrorCode,
    ErrorFrame,
    FrameError,
    Heartbeat,
    Ping,
    Pong,
    Subscribe,
    Unsubscribe,
    UserTurn,
    parse_client_frame,
)
from signalbox.shared.timestamps import rfc3339

log = logging.getLogger(__name__)

GOING_AWAY = 1001  # the client sent nothing for ``ws_idle_timeout_s``
MESSAGE_TOO_BIG = 1009
TRY_AGAIN_LATER = 1013  # a reader too slow for its outbox
INTERNAL_ERROR = 1011


def event_age_s(event: EventHead) -> float:
    """Seconds since ``event.ts`` (0 if the timestamp cannot be read)."""
    try:
        ts = datetime.fromisoformat(event.ts)
    except ValueError:
        return 0.0
    return max(0.0, (datetime.now(UTC) - ts).total_seconds())


@dataclass
class _Live:
    """A writer job: one live event (counted for the relay latency)."""

    event: EventHead
    text: str


@dataclass
class _CatchUp:
    """A writer job: replay a new subscription, then let it go live."""

    subscription: Subscription
    first_page: list[Event]
    req: str | None


class _Heartbeat:
    """A writer job: a heartbeat, its ``ts`` taken when it is sent."""


_HEARTBEAT = _Heartbeat()

_heartbeat_cache: tuple[int, str] = (-1, "")


def heartbeat_text(now_ms: int | None = None) -> str:
    """The ``heartbeat`` frame for the current millisecond (``now_ms``, Unix time), as
    ``Heartbeat(ts=...).model_dump_json()`` gives it: made once per millisecond, and shared
    by every socket whose beat is sent in that millisecond."""
    global _heartbeat_cache
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    cached_ms, text = _heartbeat_cache
    if cached_ms != now_ms:
        seconds, millis = divmod(now_ms, 1000)
        moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000)
        text = Heartbeat(ts=rfc3339(moment)).model_dump_json()
        _heartbeat_cache = (now_ms, text)
    return text


T = TypeVar("T")


class Outbox(Generic[T]):
    """A socket's bounded FIFO of writer jobs, for its one writer: a deque and at most one
    waiting future (an ``asyncio.Queue`` also keeps waiter deques, a counter of unfinished
    tasks and an Event for ``join``, per socket).

    ``put_nowait`` raises ``asyncio.QueueFull`` past ``maxsize`` items (``maxsize`` <= 0:
    unbounded), as the queue did; the relay's subscriptions rely on it.
    """

    __slots__ = ("_items", "_maxsize", "_waiter")

    def __init__(self, maxsize: int = 0) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        """Append ``item``, waking the writer; ``asyncio.QueueFull`` when full."""
        if 0 < self._maxsize <= len(self._items):
            raise asyncio.QueueFull
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> T:
        """The oldest job, waiting for one if there is none (one caller at a time)."""
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return items.popleft()


class WsSession:
    """The state of one connection: its user, subscriptions and outbox."""

    def __init__(
        self, gateway: Gateway, websocket: WebSocket, user_id: str, user_class: str | None = None
    ) -> None:
        self.gateway = gateway
        self.websocket = websocket
        self.user_id = user_id
        self.outbox: Outbox[str | _Live | _CatchUp | _Heartbeat] = Outbox(
            gateway.settings.client_queue_size
        )
        self.subscriptions: dict[str, Subscription] = {}
        self.close_code: int | None = None
        self._loop = asyncio.get_running_loop()
        # A future, not an Event waited on by a task: an idle socket holds only its reader
        # and writer tasks (what each socket holds is most of a gateway's memory at rest).
        self._closing: asyncio.Future[None] = self._loop.create_future()
        # For per-class limits and metrics: known from a bearer token's user, else read at the
        # first frame.
        self._user_class = user_class
        # The heartbeat and the idle timeout: the gateway's clock calls ``on_clock`` when the
        # earlier of the two is due, and the socket answers its next deadline then, rather
        # than on every frame (a timeout around each read and each queue wait cost a timer
        # and, for ``wait_for``, a task, per frame and per socket; a timer per socket, a heap
        # push per beat).
        self._heartbeat_s = gateway.settings.heartbeat_s
        self._idle_timeout_s = gateway.settings.ws_idle_timeout_s
        self._last_sent = self._last_received = self._loop.time()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the socket until the client leaves or the session closes it."""
        tasks = {
            asyncio.create_task(self._read_loop(), name="ws-reader"),
            asyncio.create_task(self._write_loop(), name="ws-writer"),
        }
        clock = self.gateway.ws_clock
        clock.register(self, self._next_due())
        try:
            done, _pending = await asyncio.wait(
                {*tasks, self._closing}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done & tasks:
                exc = task.exception()
                if exc is not None and not isinstance(exc, WebSocketDisconnect):
                    log.error("websocket session failed", exc_info=exc)
                    self.request_close(INTERNAL_ERROR)
        finally:
            clock.unregister(self)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for subscription in self.subscriptions.values():
                self.gateway.hub.unsubscribe(subscription)
            self.subscriptions.clear()
        if self.close_code is not None and self.websocket.client_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):  # the client may be gone already
                await self.websocket.close(code=self.close_code)

    def request_close(self, code: int) -> None:
        """Close the socket with ``code`` (the first reason wins)."""
        if self.close_code is None:
            self.close_code = code
            self.gateway.metrics.closes.labels(str(code)).inc()
        if not self._closing.done():
            self._closing.set_result(None)

    def _next_due(self) -> float:
        """When the heartbeat or the idle timeout is next due (loop time)."""
        return min(self._last_sent + self._heartbeat_s, self._last_received + self._idle_timeout_s)

    def on_clock(self, now: float) -> float | None:
        """Called by the gateway's clock at or after ``_next_due()``: close the socket if the
        client was silent too long, else queue a heartbeat if nothing was sent for
        ``heartbeat_s``. Returns the next deadline, or None once the socket is closing."""
        if self._closing.done():
            return None
        if now >= self._last_received + self._idle_timeout_s:
            # Only what the client sends counts: the server's heartbeats keep nothing open.
            self.request_close(GOING_AWAY)
            return None
        if now >= self._last_sent + self._heartbeat_s:
            # Counted from now, when it is due, not from when the writer gets it out: the
            # next beat is due heartbeat_s after this one was, never earlier.
            self._last_sent = now
            with contextlib.suppress(asyncio.QueueFull):  # a full outbox is not idle anyway
                self.outbox.put_nowait(_HEARTBEAT)
        return self._next_due()

    # -- outgoing --------------------------------------------------------------------------

    def _put(self, item: str | _Live | _CatchUp | _Heartbeat) -> None:
        try:
            self.outbox.put_nowait(item)
        except asyncio.QueueFull:
            self.request_close(TRY_AGAIN_LATER)

    def send(self, frame: BaseModel) -> None:
        """Queue one reply frame."""
        self._put(frame.model_dump_json())

    def send_error(self, req: str | None, code: ErrorCode, message: str) -> None:
        """Queue an ``error`` reply."""
        self.gateway.metrics.errors.labels(code).inc()
        self.send(ErrorFrame(req=req, code=code, message=message))

    def _deliver(self, event: EventHead, text: str) -> None:
        self.outbox.put_nowait(_Live(event, text))  # QueueFull is the subscription's to handle

    def _overflow(self) -> None:
        log.warning("closing a websocket of user %s: its outbox is full", self.user_id)
        self.request_close(TRY_AGAIN_LATER)

    async def _write_loop(self) -> None:
        send_text, outbox, loop = self.websocket.send_text, self.outbox, self._loop
        metrics = self.gateway.metrics
        while True:
            item = await outbox.get()
            if item is _HEARTBEAT:
                # Its beat was counted when it was due (on_clock): not reset here, so the
                # beats keep their schedule however long the writer took to get to this one.
                await send_text(heartbeat_text())
                continue
            if isinstance(item, str):
                await send_text(item)
            elif isinstance(item, _Live):
                await send_text(item.text)
                metrics.events_relayed.labels(item.event.kind).inc()
                metrics.relay_latency.observe(event_age_s(item.event))
            elif isinstance(item, _CatchUp):
                await self._catch_up(item)
            self._last_sent = loop.time()

    async def _catch_up(self, job: _CatchUp) -> None:
        subscription = job.subscription
        try:
            async for event, text in subscription.catch_up(job.first_page, self.gateway.hub.stream):
                await self.websocket.send_text(text)
                self.gateway.metrics.events_relayed.labels(event.kind).inc()
        except (ReplayGap, redis.exceptions.RedisError) as exc:
            # Trimmed or unreachable mid-replay: the client must resubscribe (or reload).
            self._drop(subscription)
            code: ErrorCode = "replay_gap" if isinstance(exc, ReplayGap) else "unavailable"
            self.gateway.metrics.errors.labels(code).inc()
            frame = ErrorFrame(
                req=job.req,
                code=code,
                message=f"replay of {subscription.conversation_id!r} stopped: {exc!r}",
            )
            await self.websocket.send_text(frame.model_dump_json())

    def _drop(self, subscription: Subscription) -> None:
        self.gateway.hub.unsubscribe(subscription)
        if self.subscriptions.get(subscription.conversation_id) is subscription:
            del self.subscriptions[subscription.conversation_id]

    # -- incoming --------------------------------------------------------------------------

    def _too_big(self, raw: str | bytes) -> bool:
        # A second guard only: the server (app.server_config, ws_max_size) refuses an
        # oversized frame from its header, before it is read; this catches an app served
        # by a bare `uvicorn` command that left the limit out.
        limit = self.gateway.settings.ws_max_frame_bytes
        if len(raw) > limit:
            return True
        return isinstance(raw, str) and len(raw) * 4 > limit and len(raw.encode()) > limit

    async def _read_loop(self) -> None:
        receive, loop = self.websocket.receive, self._loop
        while True:
            # The idle timeout runs while the reader waits (``_tick``), not while it handles.
            self._last_received = loop.time()
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            raw: str | bytes | None = message.get("text")
            if raw is None:
                raw = message.get("bytes")
            if raw is None:
                continue
            if self._too_big(raw):
                self.request_close(MESSAGE_TOO_BIG)
                return
            await self.handle(raw)

    async def handle(self, raw: str | bytes) -> None:
        """Parse and dispatch one frame; every failure becomes an ``error`` reply."""
        try:
            frame = parse_client_frame(raw)
        except FrameError as exc:
            self.gateway.metrics.frame(None)
            self.send_error(exc.req, exc.code, exc.message)
            return
        self.gateway.metrics.frame(frame.type)
        try:
            await self._count(frame.type)
            await self.dispatch(frame)
        except GatewayError as exc:
            self.send_error(frame.req, exc.code, exc.message)
        except redis.exceptions.RedisError as exc:
            log.error("redis error on %s frame: %s", frame.type, exc)
            self.send_error(frame.req, "unavailable", f"event store unavailable: {exc!r}")
        except Exception:
            log.exception("frame %s failed", frame.type)
            self.send_error(frame.req, "internal", f"{frame.type} failed; see the gateway log")

    async def _count(self, frame_type: str) -> None:
        """Count the frame against the user's limits (``frames``, and its action's class)."""
        if self._user_class is None:
            self._user_class = await self.gateway.read(lambda s: _user_class_of(s, self.user_id))
        action = FRAME_ACTIONS.get(frame_type)
        actions: list[Action] = ["frames"] if action is None else ["frames", action]
        await self.gateway.limits.hit_many(actions, self.user_id, self._user_class)

    async def dispatch(self, frame: ClientFrame) -> None:
        """Do what one parsed frame asks."""
        gateway, user_id = self.gateway, self.user_id
        match frame:
            case Ping():
                self.send(Pong(req=frame.req))
            case Subscribe():
                await self.subscribe(frame.conversation_id, frame.after, Ack(req=frame.req))
            case Unsubscribe():
                await self.gateway.read(
                    lambda s: owned_conversation(s, user_id, frame.conversation_id)
                )
                subscription = self.subscriptions.get(frame.conversation_id)
                if subscription is not None:
                    self._drop(subscription)
                self.send(Ack(req=frame.req))
            case UserTurn():
                await self.user_turn(frame)
            case Cancel():
                result = await turns.cancel_turn(gateway, user_id, frame.turn_id)
                self.send(_ack(frame.req, result))
            case DecideTool():
                result = await tool_decisions.decide_tool(
                    gateway, user_id, frame.call_id, frame.decision, frame.reason
                )
                self.send(_ack(frame.req, result))
            case DecideProposal():
                proposal = await proposals_client.decide_proposal(
                    gateway, user_id, frame.proposal_id, frame.decision, frame.reason
                )
                self.send(
                    _ack(
                        frame.req,
                        {"proposal_id": frame.proposal_id, "status": proposal.get("status")},
                    )
                )
            case Answer():
                result = await interactions.answer_question(
                    gateway, user_id, frame.question_id, frame.text
                )
                self.send(_ack(frame.req, result))
            case ClientToolResult():
                result = await interactions.client_tool_result(
                    gateway, user_id, frame.call_id, frame.token, frame.output, frame.is_error
                )
                self.send(_ack(frame.req, result))

    async def subscribe(
        self, conversation_id: str, after: str | None, ack: Ack, owned: bool = False
    ) -> None:
        """Reply ``ack``, then every stored event after ``after``, then live events.
        ``owned``: the user's ownership of the conversation was just checked (the turn
        submitted into it), so it is not read again."""
        if after is not None:
            try:
                check_event_id(after)
            except ValueError as exc:
                raise BadInput(str(exc)) from None
        if not owned:
            await self.gateway.read(lambda s: owned_conversation(s, self.user_id, conversation_id))
        old = self.subscriptions.pop(conversation_id, None)
        if old is not None:
            self.gateway.hub.unsubscribe(old)
        try:
            subscription, page = await self.gateway.hub.subscribe(
                conversation_id, after, self._deliver, self._overflow
            )
        except ReplayGap:
            raise ReplayGapError(
                f"event {after!r} of {conversation_id!r} is no longer kept; reload the "
                "conversation over HTTP"
            ) from None
        self.subscriptions[conversation_id] = subscription
        self.send(ack)
        self._put(_CatchUp(subscription, page, ack.req))

    async def user_turn(self, frame: UserTurn) -> None:
        """Submit a turn, ``ack`` it, and follow its conversation from just before it."""
        submitted = await turns.submit_turn(
            self.gateway,
            self.user_id,
            conversation_id=frame.conversation_id,
            text=frame.text,
            client_turn_id=frame.client_turn_id,
            workspace=frame.workspace,
            client_tools=turns.client_tools_json(frame.client_tools),
            agent=frame.agent,
            attachments=frame.attachments,
            new_trace=True,  # one trace per turn, not one per connection
        )
        ack = Ack(
            req=frame.req, conversation_id=submitted.conversation_id, turn_id=submitted.turn_id
        )
        if submitted.conversation_id in self.subscriptions:
            self.send(ack)
            return
        after: str | None
        if submitted.new_conversation:
            after = None  # from the start: conversation_created too
        elif submitted.queued_event_id is not None:
            after = await self._event_before(submitted.conversation_id, submitted.queued_event_id)
        else:
            # A repeated client_turn_id: its events are the client's to replay by id.
            after = await self.gateway.events.last_id(submitted.conversation_id)
        # A new turn was stored in this conversation in a transaction that created it for
        # this user or found it with ``owned_conversation`` (turns.py); a resent one's
        # conversation is checked again.
        await self.subscribe(submitted.conversation_id, after, ack, owned=submitted.created)

    async def _event_before(self, conversation_id: str, event_id: str) -> str | None:
        entries: Any = await self.gateway.redis.xrevrange(
            self.gateway.keys.events(conversation_id), max=f"({event_id}", min="-", count=1
        )
        if not entries:
            return None
        eid = entries[0][0]
        return eid.decode() if isinstance(eid, bytes) else str(eid)


def _user_class_of(session: Session, user_id: str) -> str:
    user = session.get(User, user_id)
    return user_class(user is not None and user.is_admin)


def _ack(req: str | None, fields: dict[str, Any]) -> Ack:
    return Ack(req=req, **fields)
