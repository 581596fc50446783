"""The gateway's HTTP API as methods: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both send the requests described once in ``_calls``; ``stream`` follows a conversation's
Server-Sent Events and, when the connection drops, reconnects by itself with
``Last-Event-ID``, so the caller sees every event once, in order.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import httpx

from signalbox.client import _calls
from signalbox.client._calls import Call, Json
from signalbox.client.errors import SignalboxError, Unreachable
from signalbox.client.sse import SseParser
from signalbox.shared.event_stream import id_after
from signalbox.shared.events import Event
from signalbox.shared.gateway_api import (
    AgentView,
    AnswerRecorded,
    ConversationDetail,
    ConversationSummary,
    ToolDecided,
    ToolResultRecorded,
    TurnAccepted,
    TurnCancel,
    UploadPublic,
    WsTicket,
)
from signalbox.shared.proposals_api import ProposalPublic
from signalbox.shared.protocol import ClientToolSpec
from signalbox.shared.schedules_api import (
    AlarmOut,
    ScheduleIn,
    ScheduleOut,
    SchedulePatch,
    ScheduleRunOut,
)
from signalbox.shared.webhooks_api import WebhookCreated, WebhookDetail, WebhookView

T = TypeVar("T")

HTTP_TIMEOUT_S = 30.0  # an approval applies files and commits; give it room
# The gateway sends a heartbeat every 15 s on an idle stream: a minute of silence is a drop.
STREAM_READ_TIMEOUT_S = 60.0
RECONNECT_FIRST_S = 0.25
RECONNECT_MAX_S = 5.0
RECONNECT_GIVE_UP_S = 60.0  # no stream answering for this long ends ``stream`` with the error

_DROPS = (httpx.TransportError, httpx.RemoteProtocolError)


def _upload_source(file: str | os.PathLike[str] | bytes, name: str | None) -> tuple[bytes, str]:
    """The bytes to upload and the name shown: a path's own name unless ``name`` is given."""
    if isinstance(file, bytes):
        return file, name or "upload"
    path = Path(file)
    return path.read_bytes(), name or path.name


def _stream_call(conversation_id: str) -> Call[None]:
    return Call(
        "GET",
        f"/api/conversations/{conversation_id}/stream",
        f"the stream of {conversation_id!r}",
        lambda _value: None,
    )


def _stream_headers(last: str | None) -> dict[str, str]:
    return {"Last-Event-ID": last} if last else {}


def _new(event: Event, last: str | None) -> bool:
    return last is None or id_after(event.id, last)


class _Backoff:
    """Reconnect delays, and when to stop trying."""

    def __init__(self, give_up_s: float) -> None:
        self.give_up_s = give_up_s
        self.reset()

    def reset(self) -> None:
        self.delay = RECONNECT_FIRST_S
        self.since = time.monotonic()

    def next(self, error: Exception) -> float:
        if time.monotonic() - self.since > self.give_up_s:
            raise error
        delay, self.delay = self.delay, min(self.delay * 2, RECONNECT_MAX_S)
        return delay


class Client:
    """The gateway at ``url`` as the user of ``token``; blocking calls."""

    def __init__(self, url: str, token: str, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _do(self, call: Call[T]) -> T:
        try:
            response = self._http.request(call.method, call.path, **call.send_args())
        except httpx.TransportError as exc:
            raise _calls.unreachable(self.url, exc) from None
        return _calls.read(call, response)

    # -- conversations and turns -------------------------------------------------------------

    def me(self) -> Json:
        """Who the token belongs to."""
        return self._do(_calls.me())

    def conversations(self) -> list[ConversationSummary]:
        """My conversations, newest first."""
        return self._do(_calls.conversations())

    def agents(self) -> list[AgentView]:
        """The agents I can use: mine and the deployment's."""
        return self._do(_calls.agents())

    def agent(self, name: str) -> AgentView:
        """One agent's newest version."""
        return self._do(_calls.agent(name))

    def create_agent(self, name: str, config: Json) -> AgentView:
        """Define an agent of my own (``config``: ``AgentConfig`` fields)."""
        return self._do(_calls.create_agent(name, config))

    def edit_agent(self, name: str, config: Json) -> AgentView:
        """A new version of my agent with exactly ``config``."""
        return self._do(_calls.edit_agent(name, config))

    def webhooks(self) -> list[WebhookView]:
        """My webhooks, each with its latest delivery."""
        return self._do(_calls.webhooks())

    def webhook(self, webhook_id: str) -> WebhookDetail:
        """One of my webhooks with its recent deliveries."""
        return self._do(_calls.webhook(webhook_id))

    def create_webhook(self, url: str, kinds: Sequence[str]) -> WebhookCreated:
        """Register ``url`` for the event ``kinds``; the answer holds the secret, once."""
        return self._do(_calls.create_webhook(url, kinds))

    def delete_webhook(self, webhook_id: str) -> WebhookView:
        """Remove one of my webhooks."""
        return self._do(_calls.delete_webhook(webhook_id))

    def schedules(self) -> list[ScheduleOut]:
        """My schedules, newest first."""
        return self._do(_calls.schedules())

    def create_schedule(self, spec: ScheduleIn) -> ScheduleOut:
        """Create a schedule (the body of ``POST /api/schedules``)."""
        return self._do(_calls.create_schedule(spec))

    def update_schedule(self, schedule_id: str, patch: SchedulePatch) -> ScheduleOut:
        """Pause, resume or change one of my schedules."""
        return self._do(_calls.update_schedule(schedule_id, patch))

    def delete_schedule(self, schedule_id: str) -> None:
        """Delete one of my schedules and its runs."""
        self._do(_calls.delete_schedule(schedule_id))

    def schedule_runs(self, schedule_id: str) -> list[ScheduleRunOut]:
        """A schedule's last runs, newest first."""
        return self._do(_calls.schedule_runs(schedule_id))

    def alarms(self) -> list[AlarmOut]:
        """The alarms my agents set, soonest first."""
        return self._do(_calls.alarms())

    def cancel_alarm(self, alarm_id: str) -> AlarmOut:
        """Cancel a pending alarm."""
        return self._do(_calls.cancel_alarm(alarm_id))

    def create_conversation(
        self, workspace: str | None = None, title: str = "", agent: str | None = None
    ) -> ConversationSummary:
        """A new, empty conversation, bound to ``agent`` (None: the deployment's default)."""
        return self._do(_calls.create_conversation(workspace, title, agent))

    def conversation(self, conversation_id: str) -> ConversationDetail:
        """Turns, transcript, pending decisions, questions and client tools."""
        return self._do(_calls.conversation(conversation_id))

    def start_turn(
        self,
        conversation_id: str,
        text: str,
        client_turn_id: str | None = None,
        client_tools: Sequence[ClientToolSpec] | None = None,
        attachments: Sequence[str] | None = None,
        agent: str | None = None,
    ) -> TurnAccepted:
        """Queue a turn (idempotent by ``client_turn_id``); ``attachments``: upload ids.

        ``agent`` binds a conversation that has no turn yet; on one already bound it must
        name the same agent (else ``Conflict``).
        """
        call = _calls.start_turn(
            conversation_id, text, client_turn_id, client_tools, attachments, agent
        )
        return self._do(call)

    def upload(self, file: str | os.PathLike[str] | bytes, name: str | None = None) -> UploadPublic:
        """Upload a file (a path, or bytes with ``name``) to attach to a turn by its id."""
        data, shown = _upload_source(file, name)
        return self._do(_calls.upload(data, shown))

    def upload_info(self, upload_id: str) -> UploadPublic:
        """An upload's metadata: what it was sniffed as."""
        return self._do(_calls.upload_info(upload_id))

    def cancel(self, turn_id: str) -> TurnCancel:
        """Stop a queued, running or parked turn."""
        return self._do(_calls.cancel(turn_id))

    def decide_tool(
        self, call_id: str, decision: Literal["allow", "deny"], reason: str | None = None
    ) -> ToolDecided:
        """Allow or deny a call that waits for a decision (``Conflict`` if it no longer does)."""
        return self._do(_calls.decide_tool(call_id, decision, reason))

    def answer(self, question_id: str, text: str) -> AnswerRecorded:
        """Answer an ``ask_user`` question."""
        return self._do(_calls.answer(question_id, text))

    def tool_result(
        self, call_id: str, token: str, output: str, is_error: bool = False
    ) -> ToolResultRecorded:
        """Return a client tool's result with the single-use token of its call."""
        return self._do(_calls.tool_result(call_id, token, output, is_error))

    def ws_ticket(self) -> WsTicket:
        """A single-use ticket for ``/ws`` or ``/stream`` (what a browser uses)."""
        return self._do(_calls.ws_ticket())

    # -- events ------------------------------------------------------------------------------

    def events(
        self, conversation_id: str, after: str | None = None, limit: int | None = None
    ) -> list[Event]:
        """Stored events after ``after`` (``ReplayGap`` if it is no longer kept)."""
        return self._do(_calls.events(conversation_id, after, limit))

    def stream(
        self,
        conversation_id: str,
        after: str | None = None,
        give_up_s: float = RECONNECT_GIVE_UP_S,
    ) -> Iterator[Event]:
        """Every event after ``after``, then live ones, forever; reconnects after a drop."""
        call = _stream_call(conversation_id)
        last, backoff = after, _Backoff(give_up_s)
        timeout = httpx.Timeout(HTTP_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        while True:
            try:
                headers = _stream_headers(last)
                with self._http.stream("GET", call.path, headers=headers, timeout=timeout) as r:
                    if r.status_code != 200:
                        r.read()
                        _calls.read(call, r)
                    backoff.reset()
                    parser = SseParser()
                    for line in r.iter_lines():
                        event = parser.feed(line)
                        if event is not None and _new(event, last):
                            last = event.id
                            yield event
            except _DROPS as exc:
                time.sleep(backoff.next(_calls.unreachable(self.url, exc)))
                continue
            # The gateway ended the stream (a reader too slow for its queue): resume.
            time.sleep(backoff.next(Unreachable(f"{call.what} keeps ending")))

    # -- proposals ---------------------------------------------------------------------------

    def pending_proposals(self) -> list[ProposalPublic]:
        """My pending proposals, oldest first."""
        return self._do(_calls.pending_proposals())

    def proposal(self, proposal_id: str) -> ProposalPublic:
        """One proposal, each file with its diff."""
        return self._do(_calls.proposal(proposal_id))

    def approve(self, proposal_id: str, files: Sequence[str] | None = None) -> ProposalPublic:
        """Apply a proposal (or only ``files`` of it); ``Conflict`` if a file changed."""
        return self._do(_calls.approve(proposal_id, files))

    def reject(self, proposal_id: str, reason: str | None = None) -> ProposalPublic:
        """Reject a proposal."""
        return self._do(_calls.reject(proposal_id, reason))


class AsyncClient:
    """The gateway at ``url`` as the user of ``token``; asyncio calls."""

    def __init__(self, url: str, token: str, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _do(self, call: Call[T]) -> T:
        try:
            response = await self._http.request(call.method, call.path, **call.send_args())
        except httpx.TransportError as exc:
            raise _calls.unreachable(self.url, exc) from None
        return _calls.read(call, response)

    async def me(self) -> Json:
        """Who the token belongs to."""
        return await self._do(_calls.me())

    async def conversations(self) -> list[ConversationSummary]:
        """My conversations, newest first."""
        return await self._do(_calls.conversations())

    async def agents(self) -> list[AgentView]:
        """The agents I can use: mine and the deployment's."""
        return await self._do(_calls.agents())

    async def agent(self, name: str) -> AgentView:
        """One agent's newest version."""
        return await self._do(_calls.agent(name))

    async def create_agent(self, name: str, config: Json) -> AgentView:
        """Define an agent of my own (``config``: ``AgentConfig`` fields)."""
        return await self._do(_calls.create_agent(name, config))

    async def edit_agent(self, name: str, config: Json) -> AgentView:
        """A new version of my agent with exactly ``config``."""
        return await self._do(_calls.edit_agent(name, config))

    async def webhooks(self) -> list[WebhookView]:
        """My webhooks, each with its latest delivery."""
        return await self._do(_calls.webhooks())

    async def webhook(self, webhook_id: str) -> WebhookDetail:
        """One of my webhooks with its recent deliveries."""
        return await self._do(_calls.webhook(webhook_id))

    async def create_webhook(self, url: str, kinds: Sequence[str]) -> WebhookCreated:
        """Register ``url`` for the event ``kinds``; the answer holds the secret, once."""
        return await self._do(_calls.create_webhook(url, kinds))

    async def delete_webhook(self, webhook_id: str) -> WebhookView:
        """Remove one of my webhooks."""
        return await self._do(_calls.delete_webhook(webhook_id))

    async def schedules(self) -> list[ScheduleOut]:
        """My schedules, newest first."""
        return await self._do(_calls.schedules())

    async def create_schedule(self, spec: ScheduleIn) -> ScheduleOut:
        """Create a schedule (the body of ``POST /api/schedules``)."""
        return await self._do(_calls.create_schedule(spec))

    async def update_schedule(self, schedule_id: str, patch: SchedulePatch) -> ScheduleOut:
        """Pause, resume or change one of my schedules."""
        return await self._do(_calls.update_schedule(schedule_id, patch))

    async def delete_schedule(self, schedule_id: str) -> None:
        """Delete one of my schedules and its runs."""
        await self._do(_calls.delete_schedule(schedule_id))

    async def schedule_runs(self, schedule_id: str) -> list[ScheduleRunOut]:
        """A schedule's last runs, newest first."""
        return await self._do(_calls.schedule_runs(schedule_id))

    async def alarms(self) -> list[AlarmOut]:
        """The alarms my agents set, soonest first."""
        return await self._do(_calls.alarms())

    async def cancel_alarm(self, alarm_id: str) -> AlarmOut:
        """Cancel a pending alarm."""
        return await self._do(_calls.cancel_alarm(alarm_id))

    async def create_conversation(
        self, workspace: str | None = None, title: str = "", agent: str | None = None
    ) -> ConversationSummary:
        """A new, empty conversation, bound to ``agent`` (None: the deployment's default)."""
        return await self._do(_calls.create_conversation(workspace, title, agent))

    async def conversation(self, conversation_id: str) -> ConversationDetail:
        """Turns, transcript, pending decisions, questions and client tools."""
        return await self._do(_calls.conversation(conversation_id))

    async def start_turn(
        self,
        conversation_id: str,
        text: str,
        client_turn_id: str | None = None,
        client_tools: Sequence[ClientToolSpec] | None = None,
        attachments: Sequence[str] | None = None,
        agent: str | None = None,
    ) -> TurnAccepted:
        """Queue a turn (idempotent by ``client_turn_id``); ``attachments``: upload ids.

        ``agent`` binds a conversation that has no turn yet; on one already bound it must
        name the same agent (else ``Conflict``).
        """
        call = _calls.start_turn(
            conversation_id, text, client_turn_id, client_tools, attachments, agent
        )
        return await self._do(call)

    async def upload(
        self, file: str | os.PathLike[str] | bytes, name: str | None = None
    ) -> UploadPublic:
        """Upload a file (a path, or bytes with ``name``) to attach to a turn by its id."""
        data, shown = await asyncio.to_thread(_upload_source, file, name)
        return await self._do(_calls.upload(data, shown))

    async def upload_info(self, upload_id: str) -> UploadPublic:
        """An upload's metadata: what it was sniffed as."""
        return await self._do(_calls.upload_info(upload_id))

    async def cancel(self, turn_id: str) -> TurnCancel:
        """Stop a queued, running or parked turn."""
        return await self._do(_calls.cancel(turn_id))

    async def decide_tool(
        self, call_id: str, decision: Literal["allow", "deny"], reason: str | None = None
    ) -> ToolDecided:
        """Allow or deny a call that waits for a decision."""
        return await self._do(_calls.decide_tool(call_id, decision, reason))

    async def answer(self, question_id: str, text: str) -> AnswerRecorded:
        """Answer an ``ask_user`` question."""
        return await self._do(_calls.answer(question_id, text))

    async def tool_result(
        self, call_id: str, token: str, output: str, is_error: bool = False
    ) -> ToolResultRecorded:
        """Return a client tool's result with the single-use token of its call."""
        return await self._do(_calls.tool_result(call_id, token, output, is_error))

    async def ws_ticket(self) -> WsTicket:
        """A single-use ticket for ``/ws`` or ``/stream``."""
        return await self._do(_calls.ws_ticket())

    async def events(
        self, conversation_id: str, after: str | None = None, limit: int | None = None
    ) -> list[Event]:
        """Stored events after ``after``."""
        return await self._do(_calls.events(conversation_id, after, limit))

    async def stream(
        self,
        conversation_id: str,
        after: str | None = None,
        give_up_s: float = RECONNECT_GIVE_UP_S,
    ) -> AsyncIterator[Event]:
        """Every event after ``after``, then live ones, forever; reconnects after a drop."""
        call = _stream_call(conversation_id)
        last, backoff = after, _Backoff(give_up_s)
        timeout = httpx.Timeout(HTTP_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        while True:
            try:
                headers = _stream_headers(last)
                async with self._http.stream(
                    "GET", call.path, headers=headers, timeout=timeout
                ) as r:
                    if r.status_code != 200:
                        await r.aread()
                        _calls.read(call, r)
                    backoff.reset()
                    parser = SseParser()
                    async for line in r.aiter_lines():
                        event = parser.feed(line)
                        if event is not None and _new(event, last):
                            last = event.id
                            yield event
            except _DROPS as exc:
                await asyncio.sleep(backoff.next(_calls.unreachable(self.url, exc)))
                continue
            await asyncio.sleep(backoff.next(Unreachable(f"{call.what} keeps ending")))

    async def pending_proposals(self) -> list[ProposalPublic]:
        """My pending proposals, oldest first."""
        return await self._do(_calls.pending_proposals())

    async def proposal(self, proposal_id: str) -> ProposalPublic:
        """One proposal, each file with its diff."""
        return await self._do(_calls.proposal(proposal_id))

    async def approve(self, proposal_id: str, files: Sequence[str] | None = None) -> ProposalPublic:
        """Apply a proposal (or only ``files`` of it); ``Conflict`` if a file changed."""
        return await self._do(_calls.approve(proposal_id, files))

    async def reject(self, proposal_id: str, reason: str | None = None) -> ProposalPublic:
        """Reject a proposal."""
        return await self._do(_calls.reject(proposal_id, reason))


__all__ = ["AsyncClient", "Client", "SignalboxError"]
