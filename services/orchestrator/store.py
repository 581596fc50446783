"""The turn's state in SQL: every transition the loop makes, one short transaction each
(on PostgreSQL, a transition that is one statement runs in autocommit, atomic on its own).

SQL is the source of truth, so a runner that dies loses nothing committed, and the next
runner resumes from here. Transitions of a tool call are conditional updates (``WHERE
status IN open``) so that a call ends exactly once, even if two runners ever overlapped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ColumnDefault,
    Connection,
    CursorResult,
    Insert,
    Table,
    Update,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased, sessionmaker

from signalbox.services.orchestrator.model import ToolUse
from signalbox.services.orchestrator.transcript import OPEN_CALL_STATUSES
from signalbox.shared.db import UserLimits, standalone
from signalbox.shared.db.models import (
    AgentVersion,
    Conversation,
    Message,
    ModelRequest,
    Proposal,
    ToolCall,
    Turn,
    User,
    as_utc,
)
from signalbox.shared.db.session import engine_of, reading
from signalbox.shared.ids import new_id
from signalbox.shared.statuses import CallDecision, CallState, Executor, TurnState
from signalbox.shared.timestamps import rfc3339

FINISHED_TURN_STATUSES = frozenset(
    {
        TurnState.COMPLETED,
        TurnState.CANCELLED,
        TurnState.FAILED,
        TurnState.STEP_LIMIT,
        TurnState.TIMED_OUT,
        TurnState.BUDGET_EXCEEDED,
    }
)

# Executors of a call: a tool worker, the client that declared the tool, or the orchestrator
# itself (ask_user, spawn_agent).
SERVER, CLIENT, INLINE = Executor.SERVER, Executor.CLIENT, Executor.INLINE

Sessions = sessionmaker[Session]


_engine = engine_of


def standalone_connection(sessions: Sessions) -> Connection:
    """A bare connection of ``sessions``' engine for Core statements that each stand alone:
    reads, or a single write (``shared.db.standalone``: on PostgreSQL in autocommit, with no
    transaction's round trips). A ``Session`` costs about 0.1 ms more per use.

    Each statement commits as it ends: two writes that must land together take
    ``transaction`` instead."""
    return standalone(_engine(sessions)).connect()


def transaction(sessions: Sessions) -> AbstractContextManager[Connection]:
    """``engine.begin()`` of ``sessions``' engine: Core statements in one transaction."""
    return _engine(sessions).begin()


def utcnow() -> datetime:
    """The current time, timezone-aware."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class TurnInfo:
    """What the loop needs to know of a turn and its conversation, loaded once."""

    turn_id: str
    conversation_id: str
    user_id: str
    workspace: str
    seq: int
    status: str
    text: str = ""
    client_tools: tuple[dict[str, Any], ...] = ()
    parent_call_id: str | None = None  # set on a spawn_agent child turn
    # The agent version the conversation is bound to (its stored config, shared/agents.py);
    # None: the deployment's default agent.
    agent: BoundAgent | None = None
    # Admission gave it a slot (shared/admission.py); a queued turn without one waits.
    admitted: bool = True
    # An earlier turn of its conversation had not finished when it was loaded.
    behind: bool = False


@dataclass(frozen=True)
class BoundAgent:
    """An agent version as a conversation is bound to it: name, number, stored config."""

    name: str
    version: int
    config: dict[str, Any]


@dataclass(frozen=True)
class PlannedCall:
    """A tool_use of a step, with what the catalogue and the policy say about it."""

    use: ToolUse
    timeout_s: float
    status: str  # pending | needs_decision | error | denied
    error: str | None = None
    executor: str = SERVER
    decision_ttl_s: float = 600.0  # for needs_decision: when nobody decided, it expires


_earlier = aliased(Turn)
# The turn, its conversation, its bound agent version and whether an earlier turn of the
# conversation is unfinished, in ONE statement (it was three), as plain columns.
_LOAD_TURN = (
    select(
        Turn.id,
        Conversation.id,
        Conversation.user_id,
        Conversation.workspace,
        Turn.seq,
        Turn.status,
        Turn.text,
        Turn.client_tools,
        Turn.parent_call_id,
        Turn.admitted_at,
        Conversation.agent_name,
        AgentVersion.version,
        AgentVersion.spec,
        select(_earlier.id)
        .where(
            _earlier.conversation_id == Turn.conversation_id,
            _earlier.seq < Turn.seq,
            _earlier.status.not_in(FINISHED_TURN_STATUSES),
            _earlier.parent_call_id.is_(None),
        )
        .exists(),
    )
    .join(Conversation, Conversation.id == Turn.conversation_id)
    .outerjoin(AgentVersion, AgentVersion.id == Conversation.agent_version_id)
    .where(Turn.id == bindparam("turn_id"))
)


def load_turn(sessions: Sessions, turn_id: str) -> TurnInfo | None:
    """The turn and its conversation, or None if there is no such turn (a standalone read,
    on a bare connection: a ``Session`` cost twice the statement)."""
    with standalone_connection(sessions) as conn:
        return read_turn(conn, turn_id)


def read_turn(conn: Connection, turn_id: str) -> TurnInfo | None:
    """``load_turn`` on ``conn``: inside its transaction, if it has one."""
    row = conn.execute(_LOAD_TURN, {"turn_id": turn_id}).first()
    if row is None:
        return None
    (
        _id,
        conversation_id,
        user_id,
        workspace,
        seq,
        status,
        text,
        client_tools,
        parent_call_id,
        admitted_at,
        agent_name,
        version,
        spec,
        behind,
    ) = row
    bound = None
    if version is not None:
        bound = BoundAgent(agent_name or "", version, dict(spec))
    return TurnInfo(
        turn_id,
        conversation_id,
        user_id,
        workspace,
        seq,
        status,
        text,
        tuple(t for t in client_tools or () if isinstance(t, dict)),
        parent_call_id,
        bound,
        admitted=admitted_at is not None or status != TurnState.QUEUED,
        behind=bool(behind),
    )


def get_turn(sessions: Sessions, turn_id: str) -> Turn:
    """The turn row as committed now."""
    with sessions() as s:
        turn = s.get(Turn, turn_id)
        if turn is None:
            raise LookupError(f"no turn {turn_id!r}")
        return turn


def earlier_unfinished_turns(sessions: Sessions, info: TurnInfo) -> list[str]:
    """The turns before this one in the conversation that have not finished, oldest first."""
    with sessions() as s:
        return list(
            s.scalars(
                select(Turn.id)
                .where(
                    Turn.conversation_id == info.conversation_id,
                    Turn.seq < info.seq,
                    Turn.status.not_in(FINISHED_TURN_STATUSES),
                    Turn.parent_call_id.is_(None),  # a child turn belongs to its parent's run
                )
                .order_by(Turn.seq)
            )
        )


_messages = cast(Table, Message.__table__)
_calls = cast(Table, ToolCall.__table__)


def _updated(s: Session, statement: Any) -> bool:
    """Run a conditional ``UPDATE``; True if it changed exactly one row."""
    return cast(CursorResult[Any], s.execute(statement)).rowcount == 1


def _elapsed_ms(started: datetime | None, now: datetime) -> int:
    """Milliseconds from ``started`` (None: ``now``) to ``now``, never negative."""
    since = as_utc(started) if started else now
    return max(0, int((now - since).total_seconds() * 1000))


@dataclass(frozen=True)
class Opened:
    """The turn as ``open_turn`` found it (``status`` before it started it) and whether it
    started it."""

    status: str
    cancel_requested: bool
    step: int
    started: bool
    deadline_at: datetime | None = None  # past it the turn ends timed_out
    queued_s: float | None = None  # created → started, when it started it (metrics)
    admin: bool = False  # whether its user is an admin (the metrics' user class)


_turns = cast(Table, Turn.__table__)
# queued → running, if it is queued and not cancelled: what it found comes back with it.
_OPEN = (
    update(_turns)
    .where(
        _turns.c.id == bindparam("open_id"),
        _turns.c.status == TurnState.QUEUED,
        _turns.c.cancel_requested.is_(False),
    )
    .values(
        status=TurnState.RUNNING,
        started_at=bindparam("started_at"),
        deadline_at=func.coalesce(
            bindparam("new_deadline_at", type_=_turns.c.deadline_at.type), _turns.c.deadline_at
        ),
        model=bindparam("model"),
    )
    .returning(
        _turns.c.step, _turns.c.deadline_at, _turns.c.created_at, _turns.c.text, _turns.c.user_id
    )
)
_FOUND = select(
    _turns.c.status, _turns.c.cancel_requested, _turns.c.step, _turns.c.deadline_at
).where(_turns.c.id == bindparam("turn_id"))
_IS_ADMIN = select(User.is_admin).where(User.id == bindparam("user_id"))


def open_turn(
    sessions: Sessions,
    info: TurnInfo,
    model: str,
    timeout_s: float | None = None,
    then: Callable[[Connection], object] | None = None,
) -> Opened:
    """Read the turn and, if it is queued and not cancelled, start it, in ONE transaction:
    queued → running, and the user's text enters the transcript. ``timeout_s``: the turn's
    wall-clock limit, from now (its ``deadline_at``). ``then``: more writes of the same
    transaction when it starts the turn (``turn_started``'s webhook deliveries).

    Core statements built once: the conditional ``UPDATE ... RETURNING`` that starts it
    (only a queued, uncancelled turn moves), else one read of what it found; the user
    message's ``INSERT`` with ``max(seq) + 1`` as its subquery; on a bare connection (a
    Session's transaction cost more than the three statements)."""
    with transaction(sessions) as conn:
        return start_turn(conn, info, model, timeout_s, then)


def start_turn(
    conn: Connection,
    info: TurnInfo,
    model: str,
    timeout_s: float | None = None,
    then: Callable[[Connection], object] | None = None,
) -> Opened:
    """``open_turn`` in ``conn``'s transaction, which the caller commits (``loop.py`` reads
    the turn and starts it in one)."""
    now = utcnow()
    deadline = now + timedelta(seconds=timeout_s) if timeout_s is not None else None
    started = conn.execute(
        _OPEN,
        {
            "open_id": info.turn_id,
            "started_at": now,
            "new_deadline_at": deadline,
            "model": model,
        },
    ).one_or_none()
    if started is None:
        found = conn.execute(_FOUND, {"turn_id": info.turn_id}).one_or_none()
        if found is None:
            raise LookupError(f"no turn {info.turn_id!r}")
        status, cancel, step, deadline_at = found
        as_found = as_utc(deadline_at) if deadline_at is not None else None
        return Opened(status, bool(cancel), step, False, as_found)
    step, deadline_at, created_at, text, user_id = started
    conn.execute(
        _STEP_MESSAGE,
        {
            "id": new_id("msg"),
            "seq_conversation_id": info.conversation_id,
            "conversation_id": info.conversation_id,
            "turn_id": info.turn_id,
            "step": 0,
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "input_tokens": 0,
            "output_tokens": 0,
            "created_at": now,
        },
    )
    admin = bool(conn.scalar(_IS_ADMIN, {"user_id": user_id}))
    if then is not None:
        then(conn)
    queued_s = max(0.0, (now - as_utc(created_at)).total_seconds())
    opened_deadline = as_utc(deadline_at) if deadline_at is not None else None
    return Opened(TurnState.QUEUED, False, step, True, opened_deadline, queued_s, admin)


def set_turn_status(sessions: Sessions, turn_id: str, status: str, *, only_from: str) -> bool:
    """Move a turn between live states (running ⇄ parked); False if it was not ``only_from``."""
    with sessions() as s, s.begin():
        return _updated(
            s,
            update(Turn).where(Turn.id == turn_id, Turn.status == only_from).values(status=status),
        )


def last_assistant_message(
    sessions: Sessions, turn_id: str
) -> tuple[Message | None, list[ToolCall]]:
    """The turn's latest assistant message with its calls, or ``(None, [])``."""
    with sessions() as s:
        msg = s.scalar(
            select(Message)
            .where(Message.turn_id == turn_id, Message.role == "assistant")
            .order_by(Message.seq.desc())
            .limit(1)
        )
        if msg is None:
            return None, []
        calls = list(
            s.scalars(
                select(ToolCall).where(ToolCall.message_id == msg.id).order_by(ToolCall.position)
            )
        )
        return msg, calls


@dataclass(frozen=True)
class LoopState:
    """What the loop reads before each move, in one round trip (``loop_state``)."""

    step: int
    cancel_requested: bool  # the root turn's committed cancel flag
    message_id: str | None  # the turn's latest assistant message
    call_statuses: tuple[str, ...]  # of that message's calls, in position order
    # Whether its user has a token budget at all (``user_limits``): none, no budget to read.
    has_budget: bool = True


_root = aliased(Turn)
# Built once: a statement built per call costs more in SQLAlchemy than SQLite takes to run it.
_last_message = (
    select(Message.id)
    .where(Message.turn_id == bindparam("turn_id"), Message.role == "assistant")
    .order_by(Message.seq.desc())
    .limit(1)
    .scalar_subquery()
)
_LOOP_STATE = (
    select(
        Turn.step,
        _root.cancel_requested,
        _last_message,
        UserLimits.day_tokens.is_not(None) | UserLimits.month_tokens.is_not(None),
        ToolCall.status,
    )
    .select_from(Turn)
    .join(_root, _root.id == bindparam("root_turn_id"))
    .outerjoin(UserLimits, UserLimits.user_id == Turn.user_id)
    .outerjoin(ToolCall, ToolCall.message_id == _last_message)
    .where(Turn.id == bindparam("turn_id"))
    .order_by(ToolCall.position)
)


def loop_state(sessions: Sessions, turn_id: str, root_turn_id: str) -> LoopState:
    """The turn's step, its root's cancel flag, its latest assistant message's calls and
    whether its user has a token budget, in ONE statement (it was five: the message, its
    calls, the cancel flag, the step, the user's limits)."""
    with standalone_connection(sessions) as conn:
        rows = conn.execute(_LOOP_STATE, {"turn_id": turn_id, "root_turn_id": root_turn_id}).all()
    if not rows:
        raise LookupError(f"no turn {turn_id!r}")
    step, cancel, message_id, budgeted, _status = rows[0]
    statuses = tuple(status for *_, status in rows if status is not None)
    return LoopState(step, bool(cancel), message_id, statuses, bool(budgeted))


_requests = cast(Table, ModelRequest.__table__)
# The turn's step counter and token totals, one step on (``step_turn_id``,
# ``add_input_tokens``, ``add_output_tokens``), returning the new step.
_STEP_UPDATE = (
    update(_turns)
    .where(_turns.c.id == bindparam("step_turn_id"))
    .values(
        step=_turns.c.step + 1,
        input_tokens=_turns.c.input_tokens + bindparam("add_input_tokens"),
        output_tokens=_turns.c.output_tokens + bindparam("add_output_tokens"),
    )
    .returning(_turns.c.step)
)


def _next_seq(conversation_id: str) -> Any:
    """The seq after the conversation's last message (bound as ``conversation_id``)."""
    return (
        select(func.coalesce(func.max(_messages.c.seq), 0) + 1)
        .where(_messages.c.conversation_id == bindparam(conversation_id))
        .scalar_subquery()
    )


_STEP_MESSAGE = (
    insert(_messages).values(seq=_next_seq("seq_conversation_id")).returning(_messages.c.seq)
)
_CALL_COLUMNS = (
    "id",
    "turn_id",
    "message_id",
    "position",
    "tool_use_id",
    "tool",
    "input",
    "status",
    "executor",
    "timeout_s",
    "error",
    "output",
    "expires_at",
    "finished_at",
    "duration_ms",
    "attempts",
)


_MESSAGE_COLUMNS = (
    "id",
    "conversation_id",
    "turn_id",
    "role",
    "content",
    "input_tokens",
    "output_tokens",
    "created_at",
)
_REQUEST_COLUMNS = tuple(c.key for c in _requests.columns if c.key != "id")


def _bound_row(table: Table, columns: Sequence[str], prefix: str) -> list[Any]:
    """``columns`` of ``table`` as bound values named ``prefix + column``, typed as the
    columns are (a ``SELECT`` list to insert from)."""
    return [bindparam(f"{prefix}{c}", type_=table.c[c].type).label(c) for c in columns]


@functools.cache
def _one_step_statement(calls: int, request: bool) -> Insert:
    """PostgreSQL: ``store_step``'s writes as ONE statement, atomic on its own, so with no
    transaction around it (no ``BEGIN`` and ``COMMIT``: one round trip where there were
    six). The step counter's ``UPDATE ... RETURNING step`` is a data-modifying CTE; the
    message, the request's row (``request``) and the ``calls`` calls each insert from it,
    so nothing is written when the turn is not there. Returns the message's step and seq.

    Built once per shape; every value bound (the message's ``m_*``, the request's
    ``r_*``, call ``k``'s ``c{k}_*``)."""
    stepped = _STEP_UPDATE.cte("stepped")
    seq = _next_seq("m_conversation_id")
    message = select(*_bound_row(_messages, _MESSAGE_COLUMNS, "m_"), seq, stepped.c.step)
    statement = (
        insert(_messages)
        .from_select([*_MESSAGE_COLUMNS, "seq", "step"], message.select_from(stepped))
        .returning(_messages.c.step, _messages.c.seq)
    )
    writes = []
    if request:
        row = select(*_bound_row(_requests, _REQUEST_COLUMNS, "r_")).select_from(stepped)
        writes.append(insert(_requests).from_select(_REQUEST_COLUMNS, row).cte("request"))
    if calls:
        rows = union_all(
            *(
                select(*_bound_row(_calls, _CALL_COLUMNS, f"c{k}_")).select_from(stepped)
                for k in range(calls)
            )
        )
        writes.append(insert(_calls).from_select(_CALL_COLUMNS, rows).cte("calls"))
    return statement.add_cte(*writes) if writes else statement


def _store_step_at_once(
    sessions: Sessions,
    info: TurnInfo,
    msg: Message,
    calls: Sequence[ToolCall],
    request: ModelRequest | None,
) -> bool:
    """PostgreSQL: ``store_step``'s writes as ``_one_step_statement``, in autocommit; the
    message gets its step and seq. False, nothing written, when the seq it took was taken:
    its one snapshot predates a message another runner of the turn committed while the
    statement waited on the turn's row (the caller's transaction reads the seq afresh)."""
    try:
        with standalone_connection(sessions) as conn:
            found = conn.execute(
                _one_step_statement(len(calls), request is not None),
                _one_step_params(info, msg, calls, request),
            ).first()
            conn.commit()  # autocommit committed it already
    except IntegrityError:
        return False
    if found is None:
        raise LookupError(f"no turn {info.turn_id!r}")
    msg.step, msg.seq = found
    return True


def _one_step_params(
    info: TurnInfo,
    msg: Message,
    calls: Sequence[ToolCall],
    request: ModelRequest | None,
) -> dict[str, Any]:
    """The values ``_one_step_statement`` binds."""
    params: dict[str, Any] = {
        "step_turn_id": info.turn_id,
        "add_input_tokens": msg.input_tokens,
        "add_output_tokens": msg.output_tokens,
    }
    params.update({f"m_{c}": getattr(msg, c) for c in _MESSAGE_COLUMNS})
    if request is not None:
        values = {**_REQUEST_DEFAULTS, "created_at": msg.created_at, **request_values(request)}
        params.update({f"r_{c}": values.get(c) for c in _REQUEST_COLUMNS})
    for k, call in enumerate(calls):
        params.update({f"c{k}_{c}": getattr(call, c) for c in _CALL_COLUMNS})
    return params


# What the ORM would fill in of a request's row left unset (its scalar column defaults);
# ``created_at``, the one default it calls, is the step's time (``_one_step_params``).
_REQUEST_DEFAULTS: dict[str, Any] = {
    c.key: c.default.arg
    for c in _requests.columns
    if isinstance(c.default, ColumnDefault) and c.default.is_scalar
}
assert {
    c.key for c in _requests.columns if c.default is not None and c.key not in _REQUEST_DEFAULTS
} == {"created_at"}, "a request column's default that _one_step_params does not fill"


def request_values(request: ModelRequest) -> dict[str, Any]:
    """The column values of a model request's row not yet stored (its defaults left to
    the ``INSERT``), for a Core statement."""
    values = {c.key: getattr(request, c.key) for c in _requests.columns if c.key != "id"}
    return {key: value for key, value in values.items() if value is not None}


def store_step(
    sessions: Sessions,
    info: TurnInfo,
    text: str,
    planned: Sequence[PlannedCall],
    input_tokens: int,
    output_tokens: int,
    request: ModelRequest | None = None,
    thinking: Sequence[dict[str, Any]] = (),
    then: Callable[[Connection, Sequence[ToolCall]], object] | None = None,
) -> tuple[Message, list[ToolCall]]:
    """One model step: its assistant message, its calls and its usage, all or none of them
    (``request``: the model request's row, ``usage.py``). ``thinking``: the step's thinking
    blocks, kept first and unchanged (the API wants them back so before its ``tool_use``).

    Core statements built once (no unit of work, no ORM load of the turn): the step
    counter's ``UPDATE ... RETURNING``, the message's ``INSERT ... RETURNING seq`` with
    ``max(seq) + 1`` as its subquery, the request's row, and the calls in one
    ``executemany``. The returned message and calls are plain (transient) objects.
    ``then``: more writes of the same transaction, given the calls (their events' webhook
    deliveries: ``model_step``). Without it, on PostgreSQL, all of that is one statement
    with no transaction around it (``_one_step_statement``).
    """
    now = utcnow()
    content: list[Any] = [dict(block) for block in thinking]
    content += [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": p.use.id, "name": p.use.name, "input": p.use.input}
        for p in planned
    ]
    msg = Message(
        id=new_id("msg"),
        conversation_id=info.conversation_id,
        turn_id=info.turn_id,
        role="assistant",
        content=content,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        created_at=now,
    )
    calls = []
    for position, p in enumerate(planned):
        final = p.status not in OPEN_CALL_STATUSES
        calls.append(
            ToolCall(
                id=new_id("call"),
                turn_id=info.turn_id,
                message_id=msg.id,
                position=position,
                tool_use_id=p.use.id,
                tool=p.use.name,
                input=p.use.input,
                status=p.status,
                executor=p.executor,
                timeout_s=p.timeout_s,
                error=p.error,
                output="",
                expires_at=now + timedelta(seconds=p.decision_ttl_s)
                if p.status == CallState.NEEDS_DECISION
                else None,
                finished_at=now if final else None,
                duration_ms=0 if final else None,
                attempts=0,
            )
        )
    postgresql = _engine(sessions).dialect.name == "postgresql"
    if then is None and postgresql and _store_step_at_once(sessions, info, msg, calls, request):
        return msg, calls
    with transaction(sessions) as conn:
        step = conn.scalar(
            _STEP_UPDATE,
            {
                "step_turn_id": info.turn_id,
                "add_input_tokens": input_tokens,
                "add_output_tokens": output_tokens,
            },
        )
        if step is None:
            raise LookupError(f"no turn {info.turn_id!r}")
        msg.step = step
        msg.seq = conn.execute(
            _STEP_MESSAGE,
            {
                "id": msg.id,
                "seq_conversation_id": info.conversation_id,
                "conversation_id": info.conversation_id,
                "turn_id": info.turn_id,
                "step": step,
                "role": "assistant",
                "content": content,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "created_at": now,
            },
        ).scalar_one()
        if request is not None:
            conn.execute(insert(_requests), [request_values(request)])
        if calls:
            conn.execute(
                insert(_calls),
                [{key: getattr(call, key) for key in _CALL_COLUMNS} for call in calls],
            )
        if then is not None:
            then(conn, calls)
    return msg, calls


_MARK_RUNNING = (
    update(_calls)
    .where(_calls.c.id.in_(bindparam("ids", expanding=True)), _calls.c.status == CallState.PENDING)
    .values(status=CallState.RUNNING, started_at=bindparam("now"), attempts=_calls.c.attempts + 1)
    .returning(_calls.c.id, _calls.c.attempts)
)


def mark_running(sessions: Sessions, calls: Sequence[ToolCall]) -> list[ToolCall]:
    """pending → running (with ``started_at``) for the given calls, in ONE Core ``UPDATE
    ... RETURNING``; returns those it moved, updated in place (no ORM load)."""
    if not calls:
        return []
    now = utcnow()
    with standalone_connection(sessions) as conn:  # one statement: atomic on its own
        rows = conn.execute(_MARK_RUNNING, {"ids": [c.id for c in calls], "now": now})
        moved: dict[str, int] = {call_id: attempts for call_id, attempts in rows}
        conn.commit()  # SQLite's; PostgreSQL's autocommit committed it already
    started = []
    for call in calls:
        attempts = moved.get(call.id)
        if attempts is not None:
            call.status, call.started_at, call.attempts = CallState.RUNNING, now, attempts
            started.append(call)
    return sorted(started, key=lambda c: c.position)


def retry_call(sessions: Sessions, call_id: str, attempts: int) -> ToolCall | None:
    """A running call sent again: a new attempt from now. None if it ended or was retried
    already (``attempts`` is what the caller saw: two runners never both retry it)."""
    with sessions() as s, s.begin():
        retried = _updated(
            s,
            update(ToolCall)
            .where(
                ToolCall.id == call_id,
                ToolCall.status == CallState.RUNNING,
                ToolCall.attempts == attempts,
            )
            .values(attempts=attempts + 1, started_at=utcnow()),
        )
        return s.get(ToolCall, call_id) if retried else None


def apply_decision(sessions: Sessions, call_id: str) -> ToolCall | None:
    """A decided needs_decision call: allow → pending, deny → denied. None if undecided."""
    with sessions() as s, s.begin():
        call = s.get(ToolCall, call_id)
        if call is None or call.status != CallState.NEEDS_DECISION or call.decision is None:
            return None
        if call.decision == CallDecision.ALLOW:
            call.status = CallState.PENDING
        else:
            call.status = CallState.DENIED
            call.error = call.error or f"the user decided {call.decision!r}"
            call.finished_at = utcnow()
            call.duration_ms = 0
        return call


@dataclass(frozen=True)
class ResultRow:
    """One call's result, as ``record_results`` stores it."""

    call_id: str
    status: str
    output: str
    error: str | None
    duration_ms: int | None = None  # None: measured from the call's ``started_at``


@dataclass(frozen=True)
class EndedCall:
    """A call ``record_results`` ended: what its ``tool_call_finished`` event says."""

    id: str
    tool: str
    status: str
    output: str | None
    error: str | None
    duration_ms: int | None
    waited_ms: int = 0


def _asked_at(conn: Connection, message_id: str) -> datetime | None:
    """When a call's step was stored: the moment a call needing a decision began to wait."""
    return conn.scalar(select(Message.created_at).where(Message.id == message_id))


def _waited_ms(
    conn: Connection,
    message_id: str,
    decision: str | None,
    started_at: datetime | None,
    expires_at: datetime | None,
    now: datetime,
) -> int:
    """How long a call waited for a human's decision before it ran (or ended): 0 if it never
    needed one. A call that needed one has a ``decision``, or, still undecided, an
    ``expires_at`` and no ``started_at`` (a waiting client call has both)."""
    if decision is None and (expires_at is None or started_at is not None):
        return 0
    asked = _asked_at(conn, message_id)
    if asked is None:
        return 0
    return _elapsed_ms(asked, as_utc(started_at) if started_at else now)


def decision_wait_ms(sessions: Sessions, call: ToolCall) -> int:
    """``waited_ms`` of a call that ended at its decision (denied, or expired undecided)."""
    with standalone_connection(sessions) as conn:
        end = as_utc(call.finished_at) if call.finished_at else utcnow()
        return _waited_ms(conn, call.message_id, call.decision or "?", None, None, end)


def record_results(
    sessions: Sessions,
    rows: Sequence[ResultRow],
    then: Callable[[Connection, list[EndedCall]], object] | None = None,
) -> list[EndedCall]:
    """Several calls' results in ONE transaction; returns the calls they ended, in order.

    All of them in one conditional Core ``UPDATE ... RETURNING`` (a call already ended is
    skipped; a call named twice keeps its first result): no ORM read, refresh or unit of
    work, one statement and one commit for every result a single read of the results
    stream brought. This is the loop's hottest write. ``then``: more writes of the same
    transaction, given the calls that ended (the webhook deliveries of their events:
    ``TurnRunner.record_many``). Without it, and with one statement's worth of results,
    the ``UPDATE`` is the only write and atomic on its own: it runs on a standalone
    connection (on PostgreSQL no ``BEGIN`` and ``COMMIT``, two round trips of three); the
    reads around it see what they would at READ COMMITTED in a transaction.
    """
    now = utcnow()
    first: dict[str, ResultRow] = {}
    for row in rows:
        first.setdefault(row.call_id, row)
    ended: list[EndedCall] = []
    alone = then is None and len(first) <= _END_BATCH
    with standalone_connection(sessions) if alone else transaction(sessions) as conn:
        durations = _durations(conn, list(first.values()), now)
        done = _end_calls(conn, list(first.values()), durations, now)
        for row in first.values():
            found = done.get(row.call_id)
            if found is None:
                continue
            tool, message_id, decision, started_at, expires_at = found
            waited = _waited_ms(conn, message_id, decision, started_at, expires_at, now)
            ended.append(
                EndedCall(
                    row.call_id,
                    tool,
                    row.status,
                    row.output,
                    row.error,
                    durations[row.call_id],
                    waited,
                )
            )
        if then is not None and ended:
            then(conn, ended)
        if alone:
            conn.commit()  # SQLite's; PostgreSQL's autocommit committed it already
    return ended


def _durations(conn: Connection, rows: Sequence[ResultRow], now: datetime) -> dict[str, int]:
    """Each call's duration: as reported, else measured from its ``started_at``."""
    durations = {r.call_id: r.duration_ms for r in rows if r.duration_ms is not None}
    unknown = [r.call_id for r in rows if r.duration_ms is None]
    if unknown:
        query = select(_calls.c.id, _calls.c.started_at).where(_calls.c.id.in_(unknown))
        started: dict[str, datetime | None] = {cid: at for cid, at in conn.execute(query)}
        durations.update({cid: _elapsed_ms(started.get(cid), now) for cid in unknown})
    return durations


_Ended = tuple[str, str, str | None, datetime | None, datetime | None]


def _end_calls(
    conn: Connection, rows: Sequence[ResultRow], durations: dict[str, int], now: datetime
) -> dict[str, _Ended]:
    """End every still-open call of ``rows`` in one statement (one per ``_END_BATCH``);
    what each ended call's row holds (tool, message, decision, started, expires), by id."""
    done: dict[str, _Ended] = {}
    for start in range(0, len(rows), _END_BATCH):
        batch = rows[start : start + _END_BATCH]
        params: dict[str, Any] = {"now": now}
        for k, row in enumerate(batch):
            params[f"c{k}"] = row.call_id
            params[f"s{k}"] = row.status
            params[f"o{k}"] = row.output
            params[f"e{k}"] = row.error
            params[f"d{k}"] = durations[row.call_id]
        ended = conn.execute(_end_statement(len(batch)), params)
        done.update({cid: cast(_Ended, tuple(rest)) for cid, *rest in ended})
    return done


_END_BATCH = 16  # results ended by one statement; more go in several


@functools.cache
def _end_statement(size: int) -> Update:
    """The conditional end of ``size`` calls in one ``UPDATE ... RETURNING``, each column a
    ``CASE`` on the call id; built once per size, all values bound (``c0``: the first
    call's id, ``s0`` its status, ``o0`` output, ``e0`` error, ``d0`` duration), so the
    engine compiles it once and reuses it (literal values made a new statement to compile
    for every read of the results stream)."""
    by_id = _calls.c.id

    def each(column: Any, prefix: str) -> Any:
        whens = [
            (by_id == bindparam(f"c{k}"), bindparam(f"{prefix}{k}", type_=column.type))
            for k in range(size)
        ]
        return case(*whens, else_=column)

    return (
        update(_calls)
        .where(
            by_id.in_([bindparam(f"c{k}") for k in range(size)]),
            _calls.c.status.in_(OPEN_CALL_STATUSES),
        )
        .values(
            status=each(_calls.c.status, "s"),
            output=each(_calls.c.output, "o"),
            error=each(_calls.c.error, "e"),
            duration_ms=each(_calls.c.duration_ms, "d"),
            finished_at=bindparam("now"),
        )
        .returning(
            by_id,
            _calls.c.tool,
            _calls.c.message_id,
            _calls.c.decision,
            _calls.c.started_at,
            _calls.c.expires_at,
        )
    )


_OPEN_CALLS = (
    select(ToolCall)
    .where(ToolCall.turn_id == bindparam("turn_id"), ToolCall.status.in_(OPEN_CALL_STATUSES))
    .order_by(ToolCall.message_id, ToolCall.position)
)
_CANCEL_REQUESTED = select(Turn.cancel_requested).where(Turn.id == bindparam("turn_id"))


def open_calls(sessions: Sessions, turn_id: str) -> list[ToolCall]:
    """Calls of the turn that have not ended."""
    with reading(sessions) as s:
        return list(s.scalars(_OPEN_CALLS, {"turn_id": turn_id}))


def cancel_requested(sessions: Sessions, turn_id: str) -> bool:
    """The turn's committed cancel flag."""
    with sessions() as s:
        return bool(s.scalar(_CANCEL_REQUESTED, {"turn_id": turn_id}))


@dataclass(frozen=True)
class FinishedTurn:
    """A turn as ``finish_turn`` left it."""

    id: str
    status: str
    error: str | None
    step: int
    parent_call_id: str | None  # a sub-agent's turn: the spawn_agent call that made it


def finish_turn(
    sessions: Sessions,
    turn_id: str,
    status: str,
    error: str | None,
    usage_to: str | None = None,
    then: Callable[[Connection, FinishedTurn], object] | None = None,
) -> FinishedTurn | None:
    """Mark the turn finished; None if it already was (someone else finished it).

    Child turns of its spawn_agent calls that did not end (their runner died) end with it.
    ``usage_to``: a parent turn that is charged this (child) turn's usage, once. ``then``:
    more of the same transaction once it finished the turn (``turn_finished``'s usage and
    webhook deliveries).

    Core statements built once, on a bare connection (at every turn's end, a Session's
    ``get`` of the turn and its flush cost more than the statements): a conditional
    ``UPDATE ... RETURNING`` that only an unfinished turn passes.
    """
    with transaction(sessions) as conn:
        finished = conn.execute(
            _FINISH,
            {"finish_id": turn_id, "status": status, "error": error, "finished_at": utcnow()},
        ).one_or_none()
        if finished is None:
            return None
        step, parent_call_id, input_tokens, output_tokens = finished
        if usage_to is not None:
            conn.execute(
                _CHARGE,
                {"charged_id": usage_to, "more_input": input_tokens, "more_output": output_tokens},
            )
        conn.execute(
            _END_CHILDREN,
            {"parent_turn_id": turn_id, "child_error": f"its parent turn ended ({status})"},
        )
        turn = FinishedTurn(turn_id, status, error, step, parent_call_id)
        if then is not None:
            then(conn, turn)
        return turn


_FINISH = (
    update(_turns)
    .where(
        _turns.c.id == bindparam("finish_id"),
        _turns.c.status.not_in(FINISHED_TURN_STATUSES),
    )
    .values(
        status=bindparam("status"),
        error=bindparam("error"),
        finished_at=bindparam("finished_at"),
    )
    .returning(
        _turns.c.step, _turns.c.parent_call_id, _turns.c.input_tokens, _turns.c.output_tokens
    )
)
# A finished child turn's tokens added to the turn that pays for it.
_CHARGE = (
    update(_turns)
    .where(_turns.c.id == bindparam("charged_id"))
    .values(
        input_tokens=_turns.c.input_tokens + bindparam("more_input"),
        output_tokens=_turns.c.output_tokens + bindparam("more_output"),
    )
)


# The child turns of a turn's spawn_agent calls that have not ended, ended with it; built
# once (no loaded object is a child of the turn being finished: nothing to synchronise).
_END_CHILDREN = (
    update(Turn)
    .where(
        Turn.parent_call_id.in_(
            select(ToolCall.id).where(ToolCall.turn_id == bindparam("parent_turn_id"))
        ),
        Turn.status.not_in(FINISHED_TURN_STATUSES),
    )
    .values(status=TurnState.CANCELLED, error=bindparam("child_error"))
    .execution_options(synchronize_session=False)
)


def withdraw_proposals(sessions: Sessions, turn_id: str) -> list[str]:
    """Pending proposals of a cancelled turn (and of its spawn_agent children) → ``cancelled``.

    Conditional on ``pending``, like every decision: an approval that won first stands. The
    proposals service refuses new ones for a cancelled turn (``_refuse_if_cancelled``), so
    after this nothing the turn started can take effect.
    """
    children = select(Turn.id).where(
        Turn.parent_call_id.in_(select(ToolCall.id).where(ToolCall.turn_id == turn_id))
    )
    with sessions() as s, s.begin():
        rows = s.execute(
            update(Proposal)
            .where(
                or_(Proposal.turn_id == turn_id, Proposal.turn_id.in_(children)),
                Proposal.status == "pending",
            )
            .values(
                status="cancelled",
                version=Proposal.version + 1,
                decided_at=utcnow(),
                reason="withdrawn: the turn that proposed it was cancelled",
            )
            .returning(Proposal.id)
            .execution_options(synchronize_session=False)
        )
        return sorted(rows.scalars())


# -- calls that wait for a human or a client -----------------------------------------------


def _expired(call: ToolCall, now: datetime) -> bool:
    return call.expires_at is not None and as_utc(call.expires_at) <= now


def unresolved(call: ToolCall, now: datetime) -> bool:
    """True while ``call`` waits on someone else and may still get an answer."""
    if call.status == CallState.NEEDS_DECISION:
        return call.decision is None and not _expired(call, now)
    return call.status == CallState.WAITING and not _expired(call, now)


def ready_to_continue(sessions: Sessions, turn_id: str) -> bool:
    """A parked turn that has something to do: a cancel, a decision, an answer, an expiry,
    or its own deadline."""
    now = utcnow()
    with sessions() as s:
        turn = s.get(Turn, turn_id)
        if turn is None or turn.status != TurnState.PARKED:
            return False
        if turn.cancel_requested:
            return True
        if turn.deadline_at is not None and as_utc(turn.deadline_at) <= now:
            return True
        calls = s.scalars(
            select(ToolCall).where(
                ToolCall.turn_id == turn_id, ToolCall.status.in_(OPEN_CALL_STATUSES)
            )
        ).all()
        return not any(unresolved(c, now) for c in calls)


def parked_turns(sessions: Sessions) -> list[tuple[str, str]]:
    """(turn id, conversation id) of every parked turn."""
    with sessions() as s:
        rows = s.execute(
            select(Turn.id, Turn.conversation_id).where(Turn.status == TurnState.PARKED)
        )
        return [(turn_id, conversation_id) for turn_id, conversation_id in rows]


def expire_decision(sessions: Sessions, call_id: str) -> ToolCall | None:
    """needs_decision past ``expires_at`` with no decision → denied (decision ``expired``)."""
    now = utcnow()
    with sessions() as s, s.begin():
        call = s.get(ToolCall, call_id)
        if call is None or call.expires_at is None or not _expired(call, now):
            return None
        deadline = rfc3339(call.expires_at)
        if not _updated(
            s,
            update(ToolCall)
            .where(
                ToolCall.id == call_id,
                ToolCall.status == CallState.NEEDS_DECISION,
                ToolCall.decision.is_(None),  # the same condition a human decision races on
            )
            .values(
                status=CallState.DENIED,
                decision=CallDecision.EXPIRED,
                error=f"expired: nobody decided before {deadline}",
                finished_at=now,
                duration_ms=0,
            ),
        ):
            return None
        s.refresh(call)
        return call


def start_waiting(
    sessions: Sessions, call_id: str, wait_s: float, token_hash: str | None = None
) -> ToolCall | None:
    """pending → waiting (on a human or a client) until ``wait_s`` from now."""
    now = utcnow()
    with sessions() as s, s.begin():
        call = s.get(ToolCall, call_id)
        if call is None or call.status != CallState.PENDING:
            return None
        call.status = CallState.WAITING
        call.started_at = now
        call.expires_at = now + timedelta(seconds=wait_s)
        call.token_hash = token_hash
        call.attempts += 1
        return call


def expire_waiting(sessions: Sessions, call_id: str, error: str) -> ToolCall | None:
    """waiting past ``expires_at`` → timeout (its token, if any, no longer works)."""
    now = utcnow()
    with sessions() as s, s.begin():
        call = s.get(ToolCall, call_id)
        if call is None or not _expired(call, now):
            return None
        if not _updated(
            s,
            update(ToolCall)
            .where(ToolCall.id == call_id, ToolCall.status == CallState.WAITING)
            .values(
                status=CallState.TIMEOUT,
                error=error,
                token_hash=None,
                finished_at=now,
                duration_ms=_elapsed_ms(call.started_at, now),
            ),
        ):
            return None
        s.refresh(call)
        return call


# -- spawn_agent child turns ---------------------------------------------------------------


def child_turn(sessions: Sessions, parent: TurnInfo, call_id: str, task: str) -> str:
    """The child turn of a spawn_agent call, created on first use (a resumed parent finds it)."""
    with sessions() as s, s.begin():
        found = s.scalar(select(Turn.id).where(Turn.parent_call_id == call_id))
        if found is not None:
            return found
        turn = Turn(
            id=new_id("turn"),
            conversation_id=parent.conversation_id,
            user_id=parent.user_id,
            seq=parent.seq,
            text=task,
            parent_call_id=call_id,
            status=TurnState.QUEUED,
        )
        s.add(turn)
        return turn.id


def final_text(sessions: Sessions, turn_id: str) -> str:
    """The text of the turn's last assistant message that has any."""
    with sessions() as s:
        for content in s.scalars(
            select(Message.content)
            .where(Message.turn_id == turn_id, Message.role == "assistant")
            .order_by(Message.seq.desc())
        ):
            text = "".join(
                str(b.get("text", ""))
                for b in content
                if isinstance(b, dict) and b.get("type") == "text"
            )
            if text:
                return text
        return ""


# -- the agent's tool planner ----------------------------------------------------------------


def tools_selected(sessions: Sessions, turn_id: str) -> list[str] | None:
    """The tools the planner chose for the turn; None if it has not run."""
    with sessions() as s:
        chosen = s.scalar(select(Turn.tools_selected).where(Turn.id == turn_id))
        return None if chosen is None else [str(name) for name in chosen]


def save_tools_selected(
    sessions: Sessions, turn_id: str, chosen: Sequence[str], request: ModelRequest | None
) -> list[str]:
    """Keep the planner's choice with its request's usage, once: the choice already stored
    (by an earlier pass) wins and is returned."""
    with sessions() as s, s.begin():
        turn = s.get(Turn, turn_id)
        if turn is None:
            raise LookupError(f"no turn {turn_id!r}")
        if request is not None:
            s.add(request)  # billed either way: the request was made
            turn.input_tokens += request.input_tokens
            turn.output_tokens += request.output_tokens
        if turn.tools_selected is None:
            turn.tools_selected = list(chosen)
        return [str(name) for name in turn.tools_selected]
