"""Conversations: list, create, detail, stored events, live events (SSE), new turns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field

from signalbox.services.gateway import conversations, turns
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.services.gateway.errors import BadInput, ReplayGapError
from signalbox.services.gateway.ownership import owned_conversation
from signalbox.services.gateway.relay import EventHead
from signalbox.services.gateway.routes.interactions import REFUSALS
from signalbox.services.gateway.stream_auth import bearer_scheme, stream_access
from signalbox.shared.agents import AgentName
from signalbox.shared.event_stream import ReplayGap, check_event_id
from signalbox.shared.events import Event
from signalbox.shared.gateway_api import ConversationDetail, ConversationSummary, TurnAccepted
from signalbox.shared.protocol import (
    MAX_ATTACHMENTS,
    MAX_CLIENT_TOOLS,
    MAX_ID_CHARS,
    MAX_TURN_TEXT_CHARS,
    NO_NUL,
    ClientToolSpec,
    Id,
)

router = APIRouter(prefix="/api/conversations")


class NewConversation(BaseModel):
    """Body of ``POST /api/conversations``."""

    workspace: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    title: str = Field(default="", max_length=200, pattern=NO_NUL)
    agent: AgentName | None = Field(
        default=None, description="the agent it runs as (default: the deployment's default)"
    )


class NewTurn(BaseModel):
    """Body of ``POST /api/conversations/{id}/turns``: the limits of the ``user_turn`` frame."""

    text: str = Field(min_length=1, max_length=MAX_TURN_TEXT_CHARS, pattern=NO_NUL)
    client_turn_id: str | None = Field(default=None, max_length=MAX_ID_CHARS, pattern=NO_NUL)
    client_tools: list[ClientToolSpec] | None = Field(
        default=None,
        max_length=MAX_CLIENT_TOOLS,
        description="tools this client runs itself for this turn, as on the user_turn frame",
    )
    agent: AgentName | None = Field(
        default=None,
        description="as on the user_turn frame: binds a conversation that has no turn yet; "
        "else must be the agent it is bound to (409)",
    )
    attachments: list[Id] | None = Field(
        default=None,
        max_length=MAX_ATTACHMENTS,
        description="ids from POST /api/uploads, as on the user_turn frame (404 if one is "
        "not mine: no turn is stored)",
    )


def _checked_after(after: str | None) -> str | None:
    if after is None or after == "":
        return None
    try:
        return check_event_id(after)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _gap(conversation_id: str, after: str | None) -> ReplayGapError:
    return ReplayGapError(
        f"event {after!r} of {conversation_id!r} is no longer kept; reload the conversation"
    )


@router.get("", response_model=list[ConversationSummary])
async def list_conversations(user: CurrentUser, gateway: GatewayDep) -> list[ConversationSummary]:
    """My conversations, newest first."""
    rows = await gateway.db(lambda s: conversations.list_conversations(s, user.id))
    return [ConversationSummary.model_validate(row) for row in rows]


@router.post("", status_code=201, response_model=ConversationSummary)
async def create_conversation(
    body: NewConversation, user: CurrentUser, gateway: GatewayDep
) -> ConversationSummary:
    """A new, empty conversation."""
    conversation = await conversations.start_conversation(
        gateway, user.id, body.workspace, body.title, body.agent
    )
    return ConversationSummary.model_validate(conversations.conversation_json(conversation))


@router.get("/{conversation_id}", response_model=ConversationDetail, responses={404: REFUSALS[404]})
async def get_conversation(
    conversation_id: IdPath, user: CurrentUser, gateway: GatewayDep
) -> ConversationDetail:
    """Turns, transcript, pending decisions and proposals."""
    detail = await gateway.db(
        lambda s: conversations.conversation_detail(s, user.id, conversation_id)
    )
    return ConversationDetail.model_validate(detail)


@router.get("/{conversation_id}/events")
async def list_events(
    conversation_id: IdPath,
    user: CurrentUser,
    gateway: GatewayDep,
    after: str | None = None,
    limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
) -> list[Event]:
    """Stored events after ``after`` (410 ``replay_gap`` if it is no longer kept)."""
    start = _checked_after(after)
    await gateway.db(lambda s: owned_conversation(s, user.id, conversation_id))
    try:
        return await gateway.events.read_after(conversation_id, start, count=limit)
    except ReplayGap:
        raise _gap(conversation_id, start) from None


def _sse(event_id: str, text: str) -> str:
    return f"id: {event_id}\ndata: {text}\n\n"


# How long a browser's EventSource waits before it reconnects after a drop (its default is
# about 3 s): sent once, first, as the stream's ``retry:`` field.
SSE_RETRY_MS = 1000


@router.get("/{conversation_id}/stream")
async def stream_events(
    conversation_id: IdPath,
    gateway: GatewayDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    after: str | None = None,
    ticket: Annotated[
        str | None,
        Query(
            max_length=MAX_ID_CHARS,
            description="a single-use ticket from POST /api/ws-tickets, for a browser's "
            "EventSource (which cannot send Authorization); never logged",
        ),
    ] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Stored then live events as Server-Sent Events; resumes from ``Last-Event-ID``.

    Authenticated by ``Authorization: Bearer`` or ``?ticket=`` (see ``stream_auth``).
    """
    access = await stream_access(
        gateway, conversation_id, credentials, ticket, resuming=bool(last_event_id)
    )
    start = _checked_after(last_event_id or after)
    queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue(
        maxsize=gateway.settings.client_queue_size
    )

    def deliver(event: EventHead, text: str) -> None:
        queue.put_nowait((event.kind, _sse(event.id, text)))

    def overflow() -> None:
        # Too slow a reader: drop what is queued and end the stream; it resumes by id.
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)

    try:
        subscription, page = await gateway.hub.subscribe(conversation_id, start, deliver, overflow)
    except ReplayGap:
        raise _gap(conversation_id, start) from None

    metrics = gateway.metrics

    async def body() -> AsyncIterator[str]:
        metrics.connections.labels("sse").inc()
        try:
            yield f"retry: {SSE_RETRY_MS}\n\n"
            async for event, text in subscription.catch_up(page, gateway.hub.stream):
                metrics.events_relayed.labels(event.kind).inc()
                yield _sse(event.id, text)
            while True:
                await access.keep_alive(gateway)
                try:
                    item = await asyncio.wait_for(queue.get(), gateway.settings.heartbeat_s)
                except TimeoutError:
                    yield ": heartbeat\n\n"
                    continue
                if item is None:
                    return
                metrics.events_relayed.labels(item[0]).inc()
                yield item[1]
        finally:
            metrics.connections.labels("sse").dec()
            gateway.hub.unsubscribe(subscription)

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{conversation_id}/turns", status_code=202, response_model=TurnAccepted, responses=REFUSALS
)
async def create_turn(
    conversation_id: IdPath, body: NewTurn, user: CurrentUser, gateway: GatewayDep
) -> TurnAccepted:
    """Queue a turn (idempotent by ``client_turn_id``)."""
    submitted = await turns.submit_turn(
        gateway,
        user.id,
        conversation_id=conversation_id,
        text=body.text,
        client_turn_id=body.client_turn_id,
        client_tools=turns.client_tools_json(body.client_tools),
        agent=body.agent,
        attachments=body.attachments,
    )
    return TurnAccepted(
        turn_id=submitted.turn_id,
        conversation_id=submitted.conversation_id,
        created=submitted.created,
    )
