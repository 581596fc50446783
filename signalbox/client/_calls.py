"""Each HTTP request of the SDK described once (method, path, body, how to read the answer),
so the sync ``Client`` and the async ``AsyncClient`` only send them.

Bodies are built from the WebSocket frame models of ``shared/protocol.py``, which hold the
same limits the gateway checks: a text over its maximum fails here, before it is sent.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from signalbox.client.errors import SignalboxError, Unreachable, frame, from_status
from signalbox.client.sse import parse_event
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
from signalbox.shared.proposals_api import ApproveBody, PendingProposals, ProposalPublic, RejectBody
from signalbox.shared.protocol import Answer, ClientToolResult, ClientToolSpec, DecideTool, UserTurn
from signalbox.shared.schedules_api import (
    AlarmOut,
    ScheduleIn,
    ScheduleOut,
    SchedulePatch,
    ScheduleRunOut,
)
from signalbox.shared.webhooks_api import WebhookCreated, WebhookDetail, WebhookView

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Json = dict[str, Any]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the reader of its answer."""

    method: str
    path: str
    what: str
    read: Callable[[Any], T]
    body: Any = None
    params: dict[str, str] | None = None
    content: bytes | None = None  # a raw body instead of JSON (an upload)

    def send_args(self) -> dict[str, Any]:
        """The body arguments of ``httpx``'s ``request``: JSON, or the raw ``content``."""
        if self.content is not None:
            return {"content": self.content, "params": self.params}
        return {"json": self.body, "params": self.params}


def _model(model: type[M]) -> Callable[[Any], M]:
    return model.model_validate


def _json(value: Any) -> Json:
    result: Json = value
    return result


_summaries: TypeAdapter[list[ConversationSummary]] = TypeAdapter(list[ConversationSummary])


def _events(value: Any) -> list[Event]:
    return [parse_event(item) for item in value]


def _body(frame: BaseModel, *fields: str) -> Json:
    """The fields of a validated frame that the HTTP route takes in its body."""
    return frame.model_dump(mode="json", include=set(fields), exclude_none=True)


def read(call: Call[T], response: httpx.Response) -> T:
    """The answer of ``call``, or the error the gateway's status and body mean."""
    status = response.status_code
    if status >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {"detail": body}
        detail = body.get("detail", response.text[:300] or response.reason_phrase)
        if status == 401:
            gateway = str(response.request.url.copy_with(path="/", query=None)).rstrip("/")
            message = f"the gateway at {gateway} refused the token (401)"
        elif status == 404:
            message = f"{call.what} not found"
        elif status == 409:
            message = f"{call.what}: conflict: {detail}"
        else:
            message = f"{call.what}: the gateway answered {status}: {detail}"
        raise from_status(status, message, body)
    return call.read(None if status == 204 else response.json())


def unreachable(base_url: str, exc: Exception) -> SignalboxError:
    """The error of a request that reached no gateway."""
    return Unreachable(f"cannot reach the gateway at {base_url}: {exc!r}")


# -- the routes ----------------------------------------------------------------------------


def me() -> Call[Json]:
    return Call("GET", "/api/me", "who am I", _json)


def ws_ticket() -> Call[WsTicket]:
    return Call("POST", "/api/ws-tickets", "a ticket", _model(WsTicket))


def conversations() -> Call[list[ConversationSummary]]:
    return Call("GET", "/api/conversations", "conversations", _summaries.validate_python)


def create_conversation(
    workspace: str | None, title: str, agent: str | None = None
) -> Call[ConversationSummary]:
    body: Json = {"title": title}
    if workspace is not None:
        body["workspace"] = workspace
    if agent is not None:
        body["agent"] = agent
    return Call(
        "POST", "/api/conversations", "a new conversation", _model(ConversationSummary), body
    )


def conversation(conversation_id: str) -> Call[ConversationDetail]:
    return Call(
        "GET",
        f"/api/conversations/{conversation_id}",
        f"conversation {conversation_id!r}",
        _model(ConversationDetail),
    )


def events(conversation_id: str, after: str | None, limit: int | None) -> Call[list[Event]]:
    params = {k: str(v) for k, v in (("after", after), ("limit", limit)) if v is not None}
    return Call(
        "GET",
        f"/api/conversations/{conversation_id}/events",
        f"events of {conversation_id!r}",
        _events,
        params=params,
    )


def start_turn(
    conversation_id: str,
    text: str,
    client_turn_id: str | None,
    client_tools: Sequence[ClientToolSpec] | None,
    attachments: Sequence[str] | None = None,
    agent: str | None = None,
) -> Call[TurnAccepted]:
    built = frame(
        UserTurn,
        type="user_turn",
        conversation_id=conversation_id,
        text=text,
        client_turn_id=client_turn_id,
        client_tools=list(client_tools) if client_tools else None,
        attachments=list(attachments) if attachments else None,
        agent=agent,
    )
    return Call(
        "POST",
        f"/api/conversations/{conversation_id}/turns",
        f"a turn in {conversation_id!r}",
        _model(TurnAccepted),
        _body(built, "text", "client_turn_id", "client_tools", "attachments", "agent"),
    )


def upload(data: bytes, name: str) -> Call[UploadPublic]:
    """``POST /api/uploads``: the file as the raw body, its name in the query."""
    return Call(
        "POST",
        "/api/uploads",
        f"the upload {name!r}",
        _model(UploadPublic),
        params={"name": name},
        content=data,
    )


def upload_info(upload_id: str) -> Call[UploadPublic]:
    return Call("GET", f"/api/uploads/{upload_id}", f"upload {upload_id!r}", _model(UploadPublic))


def cancel(turn_id: str) -> Call[TurnCancel]:
    return Call("POST", f"/api/turns/{turn_id}/cancel", f"turn {turn_id!r}", _model(TurnCancel))


def decide_tool(
    call_id: str, decision: Literal["allow", "deny"], reason: str | None
) -> Call[ToolDecided]:
    built = frame(DecideTool, type="decide_tool", call_id=call_id, decision=decision, reason=reason)
    return Call(
        "POST",
        f"/api/tool-calls/{call_id}/decision",
        f"tool call {call_id!r}",
        _model(ToolDecided),
        _body(built, "decision", "reason"),
    )


def answer(question_id: str, text: str) -> Call[AnswerRecorded]:
    built = frame(Answer, type="answer", question_id=question_id, text=text)
    return Call(
        "POST",
        f"/api/questions/{question_id}/answer",
        f"question {question_id!r}",
        _model(AnswerRecorded),
        _body(built, "text"),
    )


def tool_result(call_id: str, token: str, output: str, is_error: bool) -> Call[ToolResultRecorded]:
    built = frame(
        ClientToolResult,
        type="tool_result",
        call_id=call_id,
        token=token,
        output=output,
        is_error=is_error,
    )
    return Call(
        "POST",
        f"/api/tool-calls/{call_id}/result",
        f"client tool call {call_id!r}",
        _model(ToolResultRecorded),
        _body(built, "token", "output", "is_error"),
    )


def pending_proposals() -> Call[list[ProposalPublic]]:
    return Call(
        "GET",
        "/api/proposals/pending",
        "pending proposals",
        lambda value: PendingProposals.model_validate(value).proposals,
    )


def proposal(proposal_id: str) -> Call[ProposalPublic]:
    return Call(
        "GET", f"/api/proposals/{proposal_id}", f"proposal {proposal_id!r}", _model(ProposalPublic)
    )


def approve(proposal_id: str, files: Sequence[str] | None) -> Call[ProposalPublic]:
    body = ApproveBody(files=list(files)) if files is not None else None
    return Call(
        "POST",
        f"/api/proposals/{proposal_id}/approve",
        f"proposal {proposal_id!r}",
        _model(ProposalPublic),
        body.model_dump(mode="json") if body is not None else None,
    )


def reject(proposal_id: str, reason: str | None) -> Call[ProposalPublic]:
    return Call(
        "POST",
        f"/api/proposals/{proposal_id}/reject",
        f"proposal {proposal_id!r}",
        _model(ProposalPublic),
        RejectBody(reason=reason).model_dump(mode="json"),
    )


# -- agents (GET/POST /api/agents, GET/PUT/DELETE /api/agents/{name}) ------------------------

_agents: TypeAdapter[list[AgentView]] = TypeAdapter(list[AgentView])


def agents() -> Call[list[AgentView]]:
    return Call("GET", "/api/agents", "agents", _agents.validate_python)


def agent(name: str) -> Call[AgentView]:
    return Call("GET", f"/api/agents/{_segment(name)}", f"agent {name!r}", _model(AgentView))


def create_agent(name: str, config: Json) -> Call[AgentView]:
    body = {"name": name, **config}
    return Call("POST", "/api/agents", f"agent {name!r}", _model(AgentView), body)


def edit_agent(name: str, config: Json) -> Call[AgentView]:
    path = f"/api/agents/{_segment(name)}"
    return Call("PUT", path, f"agent {name!r}", _model(AgentView), config)


def _segment(name: str) -> str:
    """An agent name as one path segment (the gateway refuses any other form with 422)."""
    return urllib.parse.quote(name, safe="")


# -- webhooks (GET/POST /api/webhooks, GET/DELETE /api/webhooks/{id}) -------------------------

_webhooks: TypeAdapter[list[WebhookView]] = TypeAdapter(list[WebhookView])


def webhooks() -> Call[list[WebhookView]]:
    return Call("GET", "/api/webhooks", "webhooks", _webhooks.validate_python)


def webhook(webhook_id: str) -> Call[WebhookDetail]:
    path = f"/api/webhooks/{_segment(webhook_id)}"
    return Call("GET", path, f"webhook {webhook_id!r}", _model(WebhookDetail))


def create_webhook(url: str, kinds: Sequence[str]) -> Call[WebhookCreated]:
    body: Json = {"url": url, "kinds": list(kinds)}  # checked by the gateway (422)
    return Call("POST", "/api/webhooks", f"webhook for {url!r}", _model(WebhookCreated), body)


def delete_webhook(webhook_id: str) -> Call[WebhookView]:
    path = f"/api/webhooks/{_segment(webhook_id)}"
    return Call("DELETE", path, f"webhook {webhook_id!r}", _model(WebhookView))


# -- schedules and alarms (/api/schedules, /api/alarms) ---------------------------------------

_schedules: TypeAdapter[list[ScheduleOut]] = TypeAdapter(list[ScheduleOut])
_runs: TypeAdapter[list[ScheduleRunOut]] = TypeAdapter(list[ScheduleRunOut])
_alarms: TypeAdapter[list[AlarmOut]] = TypeAdapter(list[AlarmOut])


def schedules() -> Call[list[ScheduleOut]]:
    return Call("GET", "/api/schedules", "schedules", _schedules.validate_python)


def create_schedule(spec: ScheduleIn) -> Call[ScheduleOut]:
    # The cron and time zone are checked by the gateway (422 naming the bad one).
    body = spec.model_dump(mode="json", exclude_none=True)
    return Call("POST", "/api/schedules", "schedule", _model(ScheduleOut), body)


def update_schedule(schedule_id: str, patch: SchedulePatch) -> Call[ScheduleOut]:
    path = f"/api/schedules/{_segment(schedule_id)}"
    body = patch.model_dump(mode="json", exclude_none=True)
    return Call("PATCH", path, f"schedule {schedule_id!r}", _model(ScheduleOut), body)


def delete_schedule(schedule_id: str) -> Call[None]:
    path = f"/api/schedules/{_segment(schedule_id)}"
    return Call("DELETE", path, f"schedule {schedule_id!r}", lambda _none: None)


def schedule_runs(schedule_id: str) -> Call[list[ScheduleRunOut]]:
    path = f"/api/schedules/{_segment(schedule_id)}/runs"
    return Call("GET", path, f"schedule {schedule_id!r}", _runs.validate_python)


def alarms() -> Call[list[AlarmOut]]:
    return Call("GET", "/api/alarms", "alarms", _alarms.validate_python)


def cancel_alarm(alarm_id: str) -> Call[AlarmOut]:
    path = f"/api/alarms/{_segment(alarm_id)}"
    return Call("DELETE", path, f"alarm {alarm_id!r}", _model(AlarmOut))
