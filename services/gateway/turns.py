"""Submitting and cancelling turns: the one path both the WebSocket and HTTP use.

The gateway stores the turn (``queued``), appends ``turn_queued`` and enqueues
``orchestrator.run_turn``; it never waits for the model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio.to_thread
from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from signalbox.services.gateway.agents import bind_agent, check_bound_agent
from signalbox.services.gateway.budgets import check_budget
from signalbox.services.gateway.conversations import (
    TITLE_CHARS,
    conversation_created_data,
    create_conversation,
)
from signalbox.services.gateway.errors import Conflict, TurnBusy, Unavailable
from signalbox.services.gateway.metrics import user_class
from signalbox.services.gateway.ownership import (
    owned_conversation,
    owned_conversation_locked,
    owned_turn,
)
from signalbox.services.gateway.quotas import Quotas
from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.uploads import owned_attachments
from signalbox.services.gateway.workspaces import make_workspace_dir
from signalbox.shared.db import Conversation, Turn, User
from signalbox.shared.db.concurrency import lock_row
from signalbox.shared.db.models import as_utc, now
from signalbox.shared.db.session import core
from signalbox.shared.db.tenancy import user_with_limits
from signalbox.shared.event_stream import STREAM_MAXLEN, appended, encode, ring
from signalbox.shared.events import EventKind
from signalbox.shared.ids import new_id
from signalbox.shared.log_context import log_context
from signalbox.shared.protocol import ClientToolSpec
from signalbox.shared.statuses import UNFINISHED_TURNS, TurnState
from signalbox.shared.tracing import root_span, tracer

log = logging.getLogger(__name__)

UNFINISHED = UNFINISHED_TURNS
RESEND_AFTER_S = 2.0  # a queued turn sent again this long after its admission is sent again


@dataclass(frozen=True)
class SubmittedTurn:
    """What a submission did; ``created`` is False for a repeated ``client_turn_id``."""

    conversation_id: str
    turn_id: str
    created: bool
    new_conversation: bool = False
    queued_event_id: str | None = None


@dataclass
class _Inserted:
    turn: Turn
    created: bool
    interrupted: list[str] = field(default_factory=list)
    conversation: Conversation | None = None  # the conversation this insert started, if any
    user_class: str = "user"  # of the submitter, for per-class metrics


# Built once, run as Core (``core``): asked for every message with a ``client_turn_id``, and
# a turn is found only for a resend, when the ORM loads it.
_RESENT_TURN = (
    select(Turn.id)
    .where(Turn.user_id == bindparam("user_id"), Turn.client_turn_id == bindparam("client_turn_id"))
    .order_by(Turn.created_at)
    .limit(1)
)


# Built once, run as Core (``core``) on the path of every turn sent into a started
# conversation: built at each call, the ORM statements cost more to compile than to run.
_UNFINISHED_TURNS = (
    select(Turn.id)
    .where(
        Turn.conversation_id == bindparam("conversation_id"),
        Turn.status.in_(UNFINISHED),
        Turn.parent_call_id.is_(None),
    )
    .order_by(Turn.seq)
)
_ASK_CANCEL = (
    update(Turn)
    .where(Turn.id.in_(bindparam("turn_ids", expanding=True)))
    .values(cancel_requested=True)
)
_INSERT_TURN = insert(Turn)  # an ORM add and flush cost twice as much, for one row
_ATTACH = (
    update(Turn).where(Turn.id == bindparam("turn_id")).values(attachments=bindparam("attachments"))
)
_LAST_SEQ = select(func.max(Turn.seq)).where(Turn.conversation_id == bindparam("conversation_id"))


def _existing_turn(session: Session, user_id: str, client_turn_id: str) -> Turn | None:
    turn_id = core(session).scalar(
        _RESENT_TURN, {"user_id": user_id, "client_turn_id": client_turn_id}
    )
    return None if turn_id is None else session.get(Turn, turn_id)


def _insert_turn(
    session: Session,
    user_id: str,
    conversation_id: str,
    text: str,
    client_turn_id: str | None,
    client_tools: list[dict[str, Any]] | None,
    busy_policy: str,
    agent: str | None = None,
    deployment: str | None = None,
) -> _Inserted:
    # Concurrent submissions get distinct seqs and one client_turn_id makes one turn: the
    # conversation's row is held from its ownership's check on.
    conversation = owned_conversation_locked(session, user_id, conversation_id)
    cid: str = conversation.id
    if client_turn_id is not None:
        existing = session.scalars(
            select(Turn).where(
                Turn.conversation_id == conversation.id, Turn.client_turn_id == client_turn_id
            )
        ).first()
        if existing is not None:
            return _Inserted(existing, created=False)
    if conversation.archived_at is not None:
        raise Conflict(f"conversation {conversation.id!r} is archived: it takes no new turns")
    if agent is not None:
        started = session.scalar(
            select(func.count()).select_from(Turn).where(Turn.conversation_id == conversation.id)
        )
        if not started and conversation.agent_version_id is None:
            # Its first turn: it starts now.
            bind_agent(session, user_id, owned_conversation(session, user_id, cid), agent)
        else:
            check_bound_agent(cid, conversation.agent_name, agent)
    conn = core(session)
    unfinished = list(conn.scalars(_UNFINISHED_TURNS, {"conversation_id": conversation.id}))
    interrupted: list[str] = []
    if unfinished and busy_policy == "reject":
        raise TurnBusy(f"conversation {conversation.id!r} has an unfinished turn {unfinished[0]!r}")
    if unfinished and busy_policy == "interrupt":
        # On PostgreSQL, row locks a pass may be waiting for: there this transaction runs no
        # pass of its own (``admit_in_writer``), so it never waits for a pass in turn.
        conn.execute(_ASK_CANCEL, {"turn_ids": unfinished})
        interrupted = unfinished
    turn = _add_turn(
        session, user_id, conversation.id, text, client_turn_id, client_tools, deployment
    )
    return _Inserted(turn, created=True, interrupted=interrupted)


def _insert_first_turn(
    session: Session,
    user_id: str,
    workspace: str | None,
    text: str,
    client_turn_id: str | None,
    client_tools: list[dict[str, Any]] | None,
    agent: str | None = None,
    quotas: Quotas | None = None,
    deployment: str | None = None,
) -> _Inserted:
    """A new conversation and its first turn, in one transaction.

    With a ``client_turn_id`` the user's row is locked first, so a first message resent
    while its first send is still being stored (on a second socket, after a reconnect)
    finds that turn instead of opening a second conversation.
    """
    if client_turn_id is not None:
        lock_row(session, User, user_id)
        existing = _existing_turn(session, user_id, client_turn_id)
        if existing is not None:
            return _Inserted(existing, created=False)
    conversation = create_conversation(
        session, user_id, workspace, text[:TITLE_CHARS], agent, quotas
    )
    turn = _add_turn(
        session, user_id, conversation.id, text, client_turn_id, client_tools, deployment, seq=1
    )
    return _Inserted(turn, created=True, conversation=conversation)


def _add_turn(
    session: Session,
    user_id: str,
    conversation_id: str,
    text: str,
    client_turn_id: str | None,
    client_tools: list[dict[str, Any]] | None,
    deployment: str | None,
    seq: int | None = None,
) -> Turn:
    """A new turn, ``queued``, last of its conversation; ``deployment``: whose queues run it
    (stored with the row, not set by an UPDATE after it). ``seq``: known already (1 in a
    conversation created in this transaction), else read."""
    if seq is None:
        seq = (core(session).scalar(_LAST_SEQ, {"conversation_id": conversation_id}) or 0) + 1
    values: dict[str, Any] = {
        "id": new_id("turn"),
        "conversation_id": conversation_id,
        "user_id": user_id,
        "seq": seq,
        "text": text,
        "client_turn_id": client_turn_id,
        "client_tools": client_tools,
        "status": TurnState.QUEUED,
        "deployment": deployment,
    }
    core(session).execute(_INSERT_TURN, values)
    # What the submission reads of it, not in the session: the row is Core's.
    return Turn(**values)


def _entry(kind: EventKind, data: dict[str, Any], turn_id: str | None) -> dict[Any, Any]:
    """``encode``'s stream entry, typed for redis-py's ``xadd``."""
    return dict(encode(kind, data, turn_id))


@dataclass
class _Stored:
    """What a submission's worker thread did: stored (or found) the turn, and for a new one
    appended its events, then ran an admission pass and sent what it admitted."""

    inserted: _Inserted
    queued_event_id: str | None = None
    enqueue_error: Exception | None = None


def _store_and_send(
    gateway: Gateway,
    user_id: str,
    upload_ids: Sequence[str] | None,
    insert: Callable[[Session], _Inserted],
    queued: dict[str, Any],
) -> _Stored:
    """A turn's submission, blocking, in one worker thread (a thread hop each for the budget
    check, the insert, the admission pass and the Celery publish made most of the ``ack``).

    In order: the budget check, ``insert`` and, for a new turn on SQLite, an admission
    pass, in one transaction (the turn keeps the user's own uploads it
    names, ``NotFound`` otherwise, nothing stored; started now if its user's fair share
    allows, shared/admission.py, otherwise it waits in SQL, holding nothing, until a slot
    frees); then the conversation's workspace directory, its ``conversation_created`` (a
    new one), the cancels of turns it interrupts and its ``turn_queued``, in one pipeline;
    then the ``run_turn`` messages of the turns the pass admitted, so ``turn_queued`` is in
    the stream before any runner starts, or, where no pass ran in the transaction, a pass
    after the commit and its messages. Whatever fails after the commit leaves the turn
    stored: a waiting one is admitted by a reconciler's next sweep, an admitted one that
    never started is sent again once it has been queued ``stale_queued_s``; what the pass
    admitted is sent even when the appends fail.
    """
    now = gateway.clock()
    with gateway.sessions() as session:
        # Held for the transaction: the budget check and a new conversation's workspace both
        # read the user, and the Session's identity map keeps only objects something holds;
        # its limits (the budget, a new conversation's quotas) come with it, one statement.
        user = user_with_limits(session, user_id)
        is_admin = check_budget(gateway, session, user_id, now)
        attached = owned_attachments(session, user_id, upload_ids)
        inserted = insert(session)
        inserted.user_class = user_class(is_admin)
        passed: list[str] | None = None  # what a pass in this transaction admitted
        if inserted.created:
            if attached:
                inserted.turn.attachments = [a.upload_id for a in attached]
                core(session).execute(
                    _ATTACH,
                    {"turn_id": inserted.turn.id, "attachments": inserted.turn.attachments},
                )
            # Sees the new turn (flushed by the insert) and any other that waits.
            passed = gateway.admit_in_writer(session)
        session.commit()
    del user
    stored = _Stored(inserted)
    if not inserted.created:
        return stored
    turn, admitted = inserted.turn, passed or []
    if attached:
        queued["attachments"] = [a.model_dump(mode="json") for a in attached]
    try:
        stored.queued_event_id = _announce(gateway, inserted, user_id, queued)
    except Exception:
        # Committed: the turns the pass admitted hold their slots. Sent now (this one
        # without its turn_queued, as a sweep would start it later) rather than after
        # ``stale_queued_s``.
        try:
            gateway.send_admitted(admitted)
        except Exception as exc:
            log.error("could not enqueue turns %s: %s", admitted, exc)
        raise
    gateway.metrics.turns_queued.labels(inserted.user_class).inc()
    # The run_turn message carries these ids to the orchestrator's log lines.
    with log_context(conversation_id=turn.conversation_id, turn_id=turn.id, user_id=user_id):
        try:
            gateway.send_admitted(admitted)
            if passed is None:
                # No pass in the transaction (PostgreSQL): one now.
                gateway.admit_and_send()
        except Exception as exc:
            # The turn stays in SQL: a reconciler's sweep admits it if it waits, and sends
            # it again once queued ``stale_queued_s`` if it was admitted.
            log.error("could not admit or enqueue turn %s: %s", turn.id, exc)
            stored.enqueue_error = exc
        else:
            log.info("turn %s queued", turn.id)
    return stored


def _announce(gateway: Gateway, inserted: _Inserted, user_id: str, queued: dict[str, Any]) -> str:
    """A stored turn's workspace directory (a new conversation's), ``conversation_created``,
    the cancels of the turns it interrupts and ``turn_queued``, in one pipeline; returns
    ``turn_queued``'s event id."""
    turn, conversation = inserted.turn, inserted.conversation
    pipe = gateway.thread_redis.pipeline(transaction=False)
    if conversation is not None:
        make_workspace_dir(gateway.settings.workspaces_root, user_id, conversation.workspace)
        pipe.xadd(
            gateway.keys.events(conversation.id),
            _entry("conversation_created", conversation_created_data(conversation), None),
            maxlen=STREAM_MAXLEN,
            approximate=True,
        )
    for earlier in inserted.interrupted:
        pipe.publish(gateway.keys.control_channel, cancel_message(earlier))
    pipe.xadd(
        gateway.keys.events(turn.conversation_id),
        _entry("turn_queued", queued, turn.id),
        maxlen=STREAM_MAXLEN,
        approximate=True,
    )
    ring(pipe, gateway.keys, turn.conversation_id)
    results = pipe.execute(raise_on_error=False)
    # Any error raised but the bell's; turn_queued's id is the result before the bell's.
    return appended(results, len(results) - 1)[-1]


def client_tools_json(specs: Sequence[ClientToolSpec] | None) -> list[dict[str, Any]] | None:
    """Declared client tools (frame or HTTP) as the turn stores them; None when there are none."""
    return [spec.model_dump(mode="json") for spec in specs] if specs else None


async def submit_turn(
    gateway: Gateway,
    user_id: str,
    *,
    conversation_id: str | None,
    text: str,
    client_turn_id: str | None = None,
    workspace: str | None = None,
    client_tools: list[dict[str, Any]] | None = None,
    agent: str | None = None,
    attachments: Sequence[str] | None = None,
    new_trace: bool = False,
) -> SubmittedTurn:
    """Store a turn, announce it, enqueue it; a new conversation if ``conversation_id`` is None.

    ``agent``: the agent a new conversation is bound to; on a started one it must name the
    agent it is bound to (else ``Conflict``, nothing stored). A user whose token budget is
    used up is refused ``BudgetExceeded`` before anything is stored.

    Traced as ``user_turn``, under the HTTP request's span, or (``new_trace``: a WebSocket
    frame, whose connection carries many turns) as a trace of its own linked to it."""
    span = root_span("user_turn") if new_trace else tracer.start_as_current_span("user_turn")
    with span as current:
        current.set_attribute("signalbox.user.id", user_id)
        submitted = await _submit_turn(
            gateway,
            user_id,
            conversation_id=conversation_id,
            text=text,
            client_turn_id=client_turn_id,
            workspace=workspace,
            client_tools=client_tools,
            agent=agent,
            attachments=attachments,
        )
        current.set_attribute("signalbox.conversation.id", submitted.conversation_id)
        current.set_attribute("signalbox.turn.id", submitted.turn_id)
        current.set_attribute("signalbox.turn.created", submitted.created)
        return submitted


async def _submit_turn(
    gateway: Gateway,
    user_id: str,
    *,
    conversation_id: str | None,
    text: str,
    client_turn_id: str | None,
    workspace: str | None,
    client_tools: list[dict[str, Any]] | None,
    agent: str | None,
    attachments: Sequence[str] | None,
) -> SubmittedTurn:
    queued: dict[str, Any] = {"text": text, "client_turn_id": client_turn_id}
    insert: Callable[[Session], _Inserted]
    deployment = gateway.settings.redis_prefix  # whose queues run it
    if conversation_id is None:
        quotas = gateway.quotas
        insert = lambda s: _insert_first_turn(  # noqa: E731
            s, user_id, workspace, text, client_turn_id, client_tools, agent, quotas, deployment
        )
    else:
        cid, busy_policy = conversation_id, gateway.settings.busy_policy
        insert = lambda s: _insert_turn(  # noqa: E731
            s, user_id, cid, text, client_turn_id, client_tools, busy_policy, agent, deployment
        )
    stored = await anyio.to_thread.run_sync(
        _store_and_send, gateway, user_id, attachments, insert, queued
    )
    inserted = stored.inserted
    turn = inserted.turn
    conv_id = turn.conversation_id
    if not inserted.created:
        if turn.status == TurnState.QUEUED:
            await _send_again(gateway, turn.id)
        return SubmittedTurn(conv_id, turn.id, created=False)
    if stored.enqueue_error is not None:
        raise Unavailable(
            f"turn {turn.id!r} is stored but could not be enqueued: {stored.enqueue_error}"
        ) from stored.enqueue_error
    return SubmittedTurn(
        conv_id,
        turn.id,
        created=True,
        new_conversation=inserted.conversation is not None,
        queued_event_id=stored.queued_event_id,
    )


async def _send_again(gateway: Gateway, turn_id: str) -> None:
    """A turn sent again (same ``client_turn_id``) that is still queued: its first send may
    have been answered ``unavailable`` after it was stored (Redis away between the insert and
    the ``run_turn`` message). Admit what may start, and send the message of a turn admitted
    ``RESEND_AFTER_S`` ago and still not started once more (a duplicate is harmless: its
    lease lets one runner in), rather than leave it to the reconciler's next sweep. A resend
    right after the first send (a reconnect) sends nothing."""

    def admitted(session: Session) -> bool:
        row = session.get(Turn, turn_id)
        if row is None or row.status != TurnState.QUEUED or row.admitted_at is None:
            return False
        return as_utc(row.admitted_at) <= now() - timedelta(seconds=RESEND_AFTER_S)

    try:
        if turn_id not in await gateway.admit_waiting_turns() and await gateway.db(admitted):
            await gateway.enqueue_turn(turn_id)
    except Exception as exc:
        raise Unavailable(f"turn {turn_id!r} is stored but could not be enqueued: {exc}") from exc


def cancel_message(turn_id: str) -> str:
    """The control channel's message that ``turn_id`` is to stop."""
    return json.dumps({"type": "cancel", "turn_id": turn_id})


async def publish_cancel(gateway: Gateway, turn_id: str) -> None:
    """Tell every orchestrator that ``turn_id`` is to stop."""
    await gateway.redis.publish(gateway.keys.control_channel, cancel_message(turn_id))


async def cancel_turn(gateway: Gateway, user_id: str, turn_id: str) -> dict[str, Any]:
    """Ask for a turn to stop; a turn that already ended is left as it is."""

    def mark(session: Session) -> tuple[str, str]:
        turn = owned_turn(session, user_id, turn_id)
        if turn.status in UNFINISHED:
            turn.cancel_requested = True
        return turn.conversation_id, turn.status

    conversation_id, status = await gateway.db(mark)
    if status in UNFINISHED:
        await publish_cancel(gateway, turn_id)
    if status == TurnState.QUEUED:
        # A turn still waiting for a slot has no runner either: admission lets a cancelled
        # turn through at once, and its run ends it.
        try:
            await gateway.admit_waiting_turns()
        except Exception as exc:
            log.warning("could not admit cancelled queued turn %s: %s", turn_id, exc)
    if status == TurnState.PARKED:
        # A parked turn has no runner to hear the pub/sub cancel; a delivery makes one finish
        # it now rather than at the orchestrator's next reconcile (run_turn holds a lease, so
        # an extra delivery is harmless).
        try:
            await gateway.enqueue_turn(turn_id)
        except Exception as exc:
            # cancel_requested is in SQL already: the reconciler still ends the turn.
            log.warning("could not enqueue cancelled parked turn %s: %s", turn_id, exc)
    return {"turn_id": turn_id, "conversation_id": conversation_id, "status": status}
