"""``POST /api/agui``: run one turn for an AG-UI client and stream it as AG-UI events.

The route only glues existing paths together: the turn is submitted by ``turns.submit_turn``
(the same checks, limits and idempotency as ``POST /api/conversations/{id}/turns``, with the
run id as ``client_turn_id``), its events are read through the relay hub exactly as the SSE
route reads them, and each one is translated by the pure ``agui.map_event``. The stream
ends with the turn (RUN_FINISHED or RUN_ERROR).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ag_ui.core import BaseEvent, RunAgentInput, RunErrorEvent
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from signalbox.services.gateway import agui, turns
from signalbox.services.gateway.deps import CurrentUser, GatewayDep
from signalbox.services.gateway.errors import ReplayGapError
from signalbox.services.gateway.relay import EventHead, Subscription
from signalbox.services.gateway.routes.interactions import REFUSALS
from signalbox.services.gateway.state import Gateway
from signalbox.shared.event_stream import ReplayGap
from signalbox.shared.events import Event

router = APIRouter(prefix="/api")

HEARTBEAT = ": heartbeat\n\n"  # an SSE comment: AG-UI clients skip it, proxies see traffic


class _Overflowed(Exception):
    """The client read too slowly: the relay dropped its queue (as for the SSE route)."""


@dataclass
class _Following:
    """One run's subscription to its conversation, through the relay hub as the SSE route's."""

    gateway: Gateway
    subscription: Subscription
    page: list[Event]
    queue: asyncio.Queue[Event | None]

    @classmethod
    async def start(cls, gateway: Gateway, conversation_id: str, after: str | None) -> _Following:
        """Subscribe after ``after``; ``ReplayGap`` is raised here, before any response."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(
            maxsize=gateway.settings.client_queue_size
        )

        def deliver(event: EventHead, text: str) -> None:
            # A live event comes as its frame's text (relay.py): decoded here, for its data.
            queue.put_nowait(event if isinstance(event, Event) else Event.model_validate_json(text))

        def overflow() -> None:
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)

        subscription, page = await gateway.hub.subscribe(conversation_id, after, deliver, overflow)
        return cls(gateway, subscription, page, queue)

    async def events(self) -> AsyncIterator[Event | None]:
        """The events, stored then live; None for each idle heartbeat period."""
        async for event, text in self.subscription.catch_up(self.page, self.gateway.hub.stream):
            yield event if isinstance(event, Event) else Event.model_validate_json(text)
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), self.gateway.settings.heartbeat_s)
            except TimeoutError:
                yield None
                continue
            if item is None:
                raise _Overflowed
            yield item

    def stop(self) -> None:
        """Unsubscribe (whether or not the response ever started streaming)."""
        self.gateway.hub.unsubscribe(self.subscription)


@router.post("/agui", responses=REFUSALS)
async def run_agent(
    body: RunAgentInput, user: CurrentUser, gateway: GatewayDep
) -> StreamingResponse:
    """Run the last user message of ``messages`` as a turn of conversation ``threadId``.

    ``runId`` makes the run idempotent: sending the same input again starts nothing new and
    streams that turn again from its start. Approvals and questions arrive as CUSTOM events
    and are answered through the usual HTTP routes (docs/protocol.md, "AG-UI").
    """
    request = agui.turn_request(body)
    submitted = await turns.submit_turn(
        gateway,
        user.id,
        conversation_id=request.conversation_id,
        text=request.text,
        client_turn_id=request.run_id,
    )
    # A new turn's events all follow its turn_queued; a repeated run reads the conversation
    # from the start and keeps only that turn's (map_event filters by turn).
    after = submitted.queued_event_id if submitted.created else None
    try:
        following = await _Following.start(gateway, submitted.conversation_id, after)
    except ReplayGap:
        raise ReplayGapError(
            f"conversation {submitted.conversation_id!r} no longer keeps turn "
            f"{submitted.turn_id!r}'s events"
        ) from None
    encoder = EventEncoder()
    start = agui.RunMapping(
        thread_id=request.conversation_id, run_id=request.run_id, turn_id=submitted.turn_id
    )

    async def stream() -> AsyncIterator[str]:
        run = start
        gateway.metrics.connections.labels("sse").inc()  # an AG-UI stream is an SSE stream
        try:
            yield encoder.encode(agui.run_started(run))
            async for event in following.events():
                if event is None:
                    yield HEARTBEAT
                    continue
                gateway.metrics.events_relayed.labels(event.kind).inc()
                mapped: list[BaseEvent]
                run, mapped = agui.map_event(run, event)
                for out in mapped:
                    yield encoder.encode(out)
                if run.finished:
                    return
        except _Overflowed:
            yield encoder.encode(_overflowed())
        finally:
            gateway.metrics.connections.labels("sse").dec()
            following.stop()

    return StreamingResponse(
        stream(),
        media_type=encoder.get_content_type(),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _overflowed() -> RunErrorEvent:
    return RunErrorEvent(
        message="the client read the stream too slowly and fell behind; send the same "
        "input again (same runId) to read this turn again from its start",
        code="overflow",
    )
