"""One turn as a state machine over what SQL holds.

Every pass starts from what is committed, so the same code runs a fresh turn, resumes one
whose runner died, and continues a parked one:

    queued ──start──► running ─┬─ model step ─► calls pending ─dispatch─► running ─gather─┐
                               │     ▲                                                    │
                               │     └──────────────── all calls ended ◄──────────────────┘
                               ├─ step without calls ─► completed
                               ├─ max_steps ─► step_limit      ├─ cancel ─► cancelled
                               ├─ needs_decision / waiting ─► parked   └─ error ─► failed

A call starts by its executor: a tool worker (``server_calls.py``: one publish batch per
step, results gathered with deadlines), the client that declared it, a human, or this loop
itself (``own_calls.py``: client tools, ``ask_user``, ``spawn_agent``; ``plans.py``:
``run_plan``, whose steps are calls of the turn made as their inputs become ready). A turn
whose open calls all wait on someone parks: no worker slot is held; the answer, the decision, an
expiry (the reconciler) or a cancel enqueues it again. The model step itself is in
``model_step.py``; the delivery around a pass (lease, ordering) in ``loop.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Connection, bindparam, select
from sqlalchemy.orm import Session

from signalbox.services.orchestrator import (
    alarms,
    budget,
    faults,
    hooks,
    metrics,
    model_step,
    own_calls,
    plans,
    server_calls,
    spans,
    store,
    usage,
)
from signalbox.services.orchestrator.builtin_tools import ALARM, RUN_PLAN
from signalbox.services.orchestrator.cancel_watch import CancelWatch
from signalbox.services.orchestrator.lease import TurnLease
from signalbox.services.orchestrator.running_transcript import RunningTranscript
from signalbox.services.orchestrator.runtime import Runtime
from signalbox.services.orchestrator.store import (
    CLIENT,
    FINISHED_TURN_STATUSES,
    INLINE,
    SERVER,
    TurnInfo,
)
from signalbox.services.orchestrator.transcript import OPEN_CALL_STATUSES
from signalbox.services.orchestrator.turn_deadline import TurnDeadline
from signalbox.shared.agents import AgentSpec, bound_agent
from signalbox.shared.db.models import Message, ToolCall
from signalbox.shared.db.webhooks import WEBHOOK_EVENT_KINDS, Webhook, enqueue
from signalbox.shared.events import EventKind, tool_call_finished, turn_finished
from signalbox.shared.statuses import CallDecision, CallState, TurnState
from signalbox.shared.tool_contract import ToolSpec

log = logging.getLogger(__name__)

_WEBHOOK_KINDS = select(Webhook.kinds).where(Webhook.user_id == bindparam("user_id"))

# How old the catalogue a step's offers read may be for its calls' dispatch to reuse it;
# a worker gone within it gets the call all the same, which then ends ``lost``, as when
# a worker dies just after it was sent.
CATALOGUE_REUSE_S = 1.0
# Open calls that wait on a human's decision or a client's answer (the turn may park).
WAITS_ON_SOMEONE = frozenset({CallState.NEEDS_DECISION, CallState.WAITING})


def _joined(db: Session | Connection) -> contextlib.AbstractContextManager[Session]:
    """A session in ``db``'s open transaction: ``db`` itself, or one joined to the
    connection's (its close neither commits nor rolls back the caller's transaction; a
    connection outside a transaction would let the session roll back what it wrote)."""
    if isinstance(db, Session):
        return contextlib.nullcontext(db)
    if not db.in_transaction():
        raise TypeError("webhook deliveries need the caller's open transaction")
    return Session(bind=db, join_transaction_mode="rollback_only")


class TurnRunner:
    """One pass over one turn (or a spawn_agent child turn), holding its root turn's lease."""

    def __init__(
        self,
        rt: Runtime,
        info: TurnInfo,
        lease: TurnLease,
        cancel: CancelWatch,
        root_turn_id: str | None = None,
    ) -> None:
        self.rt = rt
        self.info = info
        self.lease = lease
        self.cancel = cancel
        self.root_turn_id = root_turn_id or info.turn_id  # whose cancel flag stops this one
        self.child = info.parent_call_id is not None
        settings = rt.settings
        # The agent this turn runs as (shared/agents.py): the version its conversation is
        # bound to, over the deployment's default; a new version never changes it.
        self.agent: AgentSpec = bound_agent(settings, info.agent)
        self.max_steps = settings.subagent_max_steps if self.child else self.agent.max_steps
        self._next_cancel_check = 0.0
        self.specs: dict[str, ToolSpec] = {}  # of the tools this runner dispatched to
        self.notes = model_step.NotesCache()  # the proposal notes its last model step read
        self.timed_out = False  # the turn's deadline passed (turn_deadline.py)
        self.step_span = spans.StepSpan()  # traced: a model step with its calls
        # Its conversation's transcript, read once and kept while it runs (SQL on resume).
        self.transcript = RunningTranscript(
            info.conversation_id, info.turn_id if self.child else None
        )
        # What its last step's system prompt and tools cost (model_step.py).
        self.offered_measures: model_step.OfferedMeasures | None = None
        # The live catalogue as its last step's offers read it, and when (``step_catalogue``).
        self._catalogue: tuple[float, dict[str, ToolSpec]] | None = None
        # The loop's state as this runner's own last move left it (a step it stored), so the
        # next move need not read it back (``_state``); None: read it.
        # With the step's calls not yet ended, as it stored them (its next ``_settle``'s).
        self._moved: tuple[store.LoopState, list[ToolCall]] | None = None
        self._opened: list[ToolCall] | None = None  # ``_settle``'s, when ``_moved`` was used
        self._has_budget = True  # as ``loop_state`` last read it
        # The kinds its user's webhooks subscribe to, and until when (``enqueue_hooks``).
        self._webhook_kinds: tuple[float, frozenset[str]] | None = None

    def catalogue(self) -> dict[str, ToolSpec]:
        """The live catalogue, read now (for a step's offers); kept for its dispatch."""
        found = self.rt.catalogue()
        self._catalogue = (time.monotonic(), found)
        return found

    def step_catalogue(self) -> dict[str, ToolSpec]:
        """The catalogue the step's offers read, if that was under ``CATALOGUE_REUSE_S``
        ago (a step's calls go out moments after its offers: one read for both), else
        read now."""
        kept = self._catalogue
        if kept is not None and time.monotonic() - kept[0] < CATALOGUE_REUSE_S:
            self._catalogue = None  # once: a later dispatch (a resume, a retry) reads again
            return kept[1]
        return self.rt.catalogue()

    def child_runner(self, info: TurnInfo) -> TurnRunner:
        """A runner for a spawn_agent child turn, under this runner's lease and cancel."""
        return TurnRunner(self.rt, info, self.lease, self.cancel, self.root_turn_id)

    # -- events ------------------------------------------------------------------------

    def emit(self, kind: EventKind, data: Mapping[str, Any] | BaseModel) -> str:
        """Append one event of this turn to its conversation's stream.

        ``data`` is best built by its model (or builder) of ``shared/events.py``.
        """
        payloads = self.payloads([(kind, data)])
        if kind in WEBHOOK_EVENT_KINDS:  # committed before anyone can see the event
            with self.rt.sessions() as s, s.begin():
                self.enqueue_hooks(s, payloads)
        kind, body = payloads[0]
        return self.rt.events.append(self.info.conversation_id, kind, body, self.info.turn_id)

    def emit_many(self, events: Sequence[tuple[EventKind, Mapping[str, Any] | BaseModel]]) -> None:
        """Append several events of this turn in order: their webhook deliveries in one
        transaction, then the events in one Redis round trip (``emit``, batched)."""
        if not events:
            return
        payloads = self.payloads(events)
        if any(kind in WEBHOOK_EVENT_KINDS for kind, _data in payloads):
            with self.rt.sessions() as s, s.begin():  # committed before anyone can see them
                self.enqueue_hooks(s, payloads)
        self.append_events(payloads)

    def payloads(
        self, events: Sequence[tuple[EventKind, Mapping[str, Any] | BaseModel]]
    ) -> list[tuple[EventKind, Mapping[str, Any]]]:
        """The events' data as they go on the stream (a child's with its parent call)."""
        payloads: list[tuple[EventKind, Mapping[str, Any]]] = []
        for kind, data in events:
            if isinstance(data, BaseModel):
                data = data.model_dump(mode="json")
            if self.child:
                data = {**data, "parent_call_id": self.info.parent_call_id}
            payloads.append((kind, data))
        return payloads

    def webhook_kinds(self, db: Session | Connection | None = None) -> frozenset[str]:
        """The event kinds the user's webhooks subscribe to, read at most every
        ``cancel_check_s`` (on ``db``; None: a standalone read). Empty, the loop's hot
        writes go without a transaction of their own (``store.store_step``'s ``then``)."""
        now = time.monotonic()
        if self._webhook_kinds is None or now >= self._webhook_kinds[0]:
            with contextlib.ExitStack() as stack:
                if db is None:
                    db = stack.enter_context(store.standalone_connection(self.rt.sessions))
                found = frozenset(
                    str(kind)
                    for kinds in db.scalars(_WEBHOOK_KINDS, {"user_id": self.info.user_id})
                    for kind in kinds or ()
                )
            self._webhook_kinds = (now + self.rt.cancel_check_s, found)
        return self._webhook_kinds[1]

    def enqueue_hooks(
        self, db: Session | Connection, payloads: Sequence[tuple[EventKind, Mapping[str, Any]]]
    ) -> None:
        """The webhook deliveries of these events, in ``db``'s transaction (which must
        commit before the events go out: ``append_events``); on a bare connection (the
        loop's hot writes, ``store.store_step``) a session joins its transaction only when
        a delivery is due. The kinds the user's webhooks subscribe to are read at most
        every ``cancel_check_s`` (a turn's steps enqueue
        several times a second): a webhook added meanwhile gets the turn's events from the
        next read on, and ``enqueue`` reads the webhooks themselves (one deleted meanwhile
        gets nothing). None subscribed, nothing more is read."""
        hooked = [(k, d) for k, d in payloads if k in WEBHOOK_EVENT_KINDS]
        if not hooked:
            return
        subscribed = self.webhook_kinds(db)
        due = [(kind, data) for kind, data in hooked if kind in subscribed]
        if not due:
            return
        info = self.info
        with _joined(db) as session:
            for kind, data in due:
                enqueue(session, info.user_id, info.conversation_id, kind, data, info.turn_id)

    def append_events(self, payloads: Sequence[tuple[EventKind, Mapping[str, Any]]]) -> None:
        """Put events (``payloads``) on the stream in one round trip; their webhook
        deliveries must be committed already (``enqueue_hooks``)."""
        if payloads:
            self.rt.events.append_many(self.info.conversation_id, payloads, self.info.turn_id)

    def finished(self, call: ToolCall | store.EndedCall, waited_ms: int | None = None) -> None:
        """Announce a call that reached its final status (``waited_ms``: for a decision)."""
        self.emit(*self._finished_event(call, waited_ms))

    def _finished_event(
        self, call: ToolCall | store.EndedCall, waited_ms: int | None = None
    ) -> tuple[EventKind, BaseModel]:
        self.call_ended(call)
        return self._finished_data(call, waited_ms)

    def call_ended(self, call: ToolCall | store.EndedCall) -> None:
        """What a call's end frees and counts (before its event goes out)."""
        metrics.tool_call_finished(call.tool, call.status, call.duration_ms)
        if self.rt.tool_slots is not None:
            self.rt.tool_slots.give_back(self.info.user_id, [call.id])

    @staticmethod
    def _finished_data(
        call: ToolCall | store.EndedCall, waited_ms: int | None = None
    ) -> tuple[EventKind, BaseModel]:
        if waited_ms is None:
            waited_ms = call.waited_ms if isinstance(call, store.EndedCall) else 0
        return "tool_call_finished", tool_call_finished(
            call.id,
            call.tool,
            call.status,
            call.output,
            call.error,
            call.duration_ms,
            waited_ms,
        )

    def record(
        self,
        call: ToolCall,
        status: str,
        output: str,
        error: str | None,
        duration_ms: int | None = None,
    ) -> None:
        """End a call with its result (once: a call already ended stays as it is)."""
        self.record_many([store.ResultRow(call.id, status, output, error, duration_ms)])

    def record_many(self, rows: Sequence[store.ResultRow]) -> None:
        """End several calls in one transaction with their events' webhook deliveries,
        then announce each that ended in one Redis round trip."""
        if not rows:
            return
        if self.rt.hooks.has("after_tool"):
            rows = self._after_tool(rows)
        announced: list[tuple[EventKind, Mapping[str, Any]]] = []

        def deliveries(conn: Connection, ended: list[store.EndedCall]) -> None:
            announced.extend(self.payloads([self._finished_data(done) for done in ended]))
            self.enqueue_hooks(conn, announced)

        hooked = "tool_call_finished" in self.webhook_kinds()
        ended = store.record_results(self.rt.sessions, rows, then=deliveries if hooked else None)
        if not hooked:
            announced = self.payloads([self._finished_data(done) for done in ended])
        self.transcript.ended(ended)
        for done in ended:
            self.call_ended(done)
        self.append_events(announced)

    def _after_tool(self, rows: Sequence[store.ResultRow]) -> list[store.ResultRow]:
        """The rows as the ``after_tool`` hooks leave their outputs; a ``fail_closed`` hook
        that fails withholds the output (the call ends ``error``), never passes it as is."""
        with self.rt.sessions() as s:
            ids = [r.call_id for r in rows]
            found = s.execute(select(ToolCall.id, ToolCall.tool).where(ToolCall.id.in_(ids)))
            tools: dict[str, str] = {call_id: tool for call_id, tool in found}
        ctx = hooks.context(self)
        edited = []
        for row in rows:
            try:
                output = self.rt.hooks.after_tool(
                    ctx, tools.get(row.call_id, ""), row.status, row.output
                )
            except hooks.HookFailed as exc:
                row = store.ResultRow(row.call_id, "error", "", str(exc), row.duration_ms)
            else:
                row = store.ResultRow(row.call_id, row.status, output, row.error, row.duration_ms)
            edited.append(row)
        return edited

    # -- the state machine -------------------------------------------------------------

    def open(self, conn: Connection | None = None) -> store.Opened:
        """Start the turn if it is queued and not cancelled, else read how it stands: in
        ``conn``'s transaction (the caller's, which read the turn in it and commits), or in
        one of its own. ``turn_started``'s webhook deliveries commit with the start."""
        timeout_s = None if self.child else self.agent.turn_timeout_s  # a child: its root's
        model = self.rt.model.name
        then = lambda c: self.enqueue_hooks(c, self._started_payloads())  # noqa: E731
        if conn is None:
            return store.open_turn(self.rt.sessions, self.info, model, timeout_s, then=then)
        return store.start_turn(conn, self.info, model, timeout_s, then=then)

    def _started_payloads(self) -> list[tuple[EventKind, Mapping[str, Any]]]:
        return self.payloads([("turn_started", {"model": self.rt.model.name})])

    def run(self, opened: store.Opened | None = None) -> str:
        """Bring the turn from its committed state as far as it can go; ``opened``: what
        ``open`` found or started, if the caller opened it already."""
        # The read and the start are one transaction, and turn_started goes out right after
        # it commits: the first thing the user sees waits on nothing else.
        turn = opened if opened is not None else self.open()
        if turn.status in FINISHED_TURN_STATUSES:
            return "finished"
        if turn.status == TurnState.QUEUED:
            if turn.cancel_requested:
                return self.finish(TurnState.CANCELLED)
            if turn.started:
                metrics.turn_started(turn)
                self.append_events(self._started_payloads())
                try:
                    self.rt.hooks.turn_started(hooks.context(self))
                except hooks.HookFailed as exc:
                    return self.finish(TurnState.FAILED, error=str(exc))
        elif turn.status == TurnState.PARKED:
            if store.set_turn_status(
                self.rt.sessions, self.info.turn_id, TurnState.RUNNING, only_from=TurnState.PARKED
            ):
                metrics.turn_unparked(self.rt, self.info.turn_id)
        else:
            self.emit("turn_resumed", {"step": turn.step})
        self.cancel.start()  # before _loop reads the SQL cancel flag (see CancelWatch.start)
        if not self.child:
            faults.maybe_kill_on_turn(self.info.text)  # test-only; a no-op in a deployment
        with TurnDeadline(turn.deadline_at, self._time_out):
            try:
                return self._loop()
            finally:
                self.step_span.end()

    def _time_out(self) -> None:
        # The deadline stops the turn the way a cancel does (every wait watches the flag);
        # ``finish`` then names it for what it was.
        self.timed_out = True
        self.cancel.set()

    def stepped(self, message: Message, calls: Sequence[ToolCall]) -> None:
        """A model step this runner just committed: the loop's next state, known."""
        state = store.LoopState(
            step=message.step,
            cancel_requested=False,  # read with the next state read, as ``_state`` says
            message_id=message.id,
            call_statuses=tuple(call.status for call in calls),
            has_budget=self._has_budget,
        )
        # Every earlier call of the turn had ended (a step is taken only then): the open
        # calls of the turn are this step's.
        self._moved = (state, [call for call in calls if call.status in OPEN_CALL_STATUSES])

    def _state(self) -> store.LoopState:
        """The loop's state before a move: one read (the step, the cancel flag, the latest
        step's calls, whether a budget applies), or, right after a step this runner stored,
        what that step left. Only this runner adds steps and messages to its turn, and the
        statuses of calls just stored only choose the way on (an open one: ``_settle``
        reads them again). The committed cancel flag is read at least every
        ``cancel_check_s`` all the same (a cancel is heard at once by ``CancelWatch``), and
        a budget set meanwhile applies from the next read. The step's open calls, as
        stored, are then the next ``_settle``'s (it reads the calls otherwise)."""
        moved, self._moved = self._moved, None
        self._opened = None
        if moved is not None and time.monotonic() < self._next_cancel_check:
            self._opened = moved[1]
            return moved[0]
        state = store.loop_state(self.rt.sessions, self.info.turn_id, self.root_turn_id)
        self._next_cancel_check = time.monotonic() + self.rt.cancel_check_s
        self._has_budget = state.has_budget
        return state

    def _loop(self) -> str:
        while True:
            self.lease.check()
            state = self._state()
            if state.cancel_requested:
                self.cancel.set()
            if self.cancel.is_set():
                return self.finish(TurnState.CANCELLED)
            statuses = state.call_statuses
            if state.message_id is None or statuses:
                # Before a step's calls start and before the next step (never after a
                # final answer: a turn that ended within its step completed).
                over = budget.exhausted(self, state.has_budget)
                if over is not None:
                    return self.finish(TurnState.BUDGET_EXCEEDED, over.describe())
            if state.message_id is not None:
                if any(status in OPEN_CALL_STATUSES for status in statuses):
                    with self.step_span.current():  # the calls under the step that made them
                        outcome = self._settle()
                    if outcome is not None:
                        return outcome
                    continue
                if not statuses:
                    return self.finish(TurnState.COMPLETED)
            if state.step >= self.max_steps:
                return self.finish(TurnState.STEP_LIMIT)
            self.step_span.begin(state.step + 1, self.info.turn_id)
            with self.step_span.current():
                outcome = model_step.take_step(self)
            if outcome is not None:
                return outcome

    def cancelled(self, force: bool = False) -> bool:
        """Whether the turn (or its root turn) was cancelled; SQL is read at most every
        ``cancel_check_s`` unless ``force``."""
        if self.cancel.is_set():
            return True
        now = time.monotonic()
        if force or now >= self._next_cancel_check:
            self._next_cancel_check = now + self.rt.cancel_check_s
            if store.cancel_requested(self.rt.sessions, self.root_turn_id):
                self.cancel.set()
        return self.cancel.is_set()

    def open_calls(self) -> list[ToolCall]:
        """The calls of this turn that have not ended."""
        return store.open_calls(self.rt.sessions, self.info.turn_id)

    def _settle(self) -> str | None:
        """Drive the open calls of the latest step to their end; an outcome ends the run."""
        opened, self._opened = self._opened, None
        if opened is None:
            opened = self.open_calls()
        on_someone = [c for c in opened if c.status in WAITS_ON_SOMEONE]
        for call in on_someone:
            if call.status == CallState.NEEDS_DECISION:
                self._decided_or_expired(call)
            else:
                self._maybe_expire_waiting(call)
        if on_someone:
            opened = self.open_calls()
        pending = [c for c in opened if c.status == CallState.PENDING]
        server = [c for c in pending if c.executor == SERVER]
        ran = [c for c in opened if c.status == CallState.RUNNING]  # before any start here
        started, held = server_calls.dispatch(self, server, limited=True) if server else ([], 0)
        own = [c for c in pending if c.executor in (CLIENT, INLINE)]
        for call in own:
            if call.executor == CLIENT:
                own_calls.offer_to_client(self, call)
            else:
                own_calls.start_inline(self, call)
        if own or len(started) != len(server):
            running = [c for c in self.open_calls() if c.status == CallState.RUNNING]
        else:
            # Nothing but the dispatch moved a call since ``opened`` was read: the calls
            # running are those that were, and those it started (no third read).
            running = sorted([*ran, *started], key=lambda c: (c.message_id, c.position))
        for call in running:
            if call.executor != INLINE:
                continue
            run_inline = {RUN_PLAN: plans.run, ALARM: alarms.run}.get(
                call.tool, own_calls.run_child
            )
            if run_inline(self, call) == "cancelled":
                return self.finish(TurnState.CANCELLED)
        # A plan's steps are gathered by the plan (plans.py), with its dependents after them.
        workers = [c for c in running if c.executor == SERVER and c.plan_call_id is None]
        # Calls held back for their user's limit go out as this turn's own calls end (the
        # first to end is enough), or as other turns' do (a short wait, then try again).
        # Every call gathered was sent by this pass (none was running before it).
        just_sent = bool(started) and not ran and not own
        if (
            workers
            and server_calls.gather(self, workers, until_first=held > 0, just_sent=just_sent)
            == "cancelled"
        ):
            return self.finish(TurnState.CANCELLED)
        if held and not workers:
            if self._wait_for_tool_slots():
                return self.finish(TurnState.CANCELLED)
            return None
        if all(c.executor == SERVER and c.status not in WAITS_ON_SOMEONE for c in opened):
            # Only calls of the tool workers were open, and gather ended each of them (or
            # the turn): none can be waiting on a human or a client.
            return None
        now = store.utcnow()
        if any(store.unresolved(c, now) for c in self.open_calls()):
            # No worker slot is held while someone decides or answers; that (or an expiry
            # the reconciler sees) enqueues the turn again.
            if store.set_turn_status(
                self.rt.sessions, self.info.turn_id, TurnState.PARKED, only_from=TurnState.RUNNING
            ):
                metrics.turn_parked(self.rt, self.info.turn_id)
            return TurnState.PARKED
        return None

    def _wait_for_tool_slots(self) -> bool:
        """Wait a moment for another turn of this user to free a tool slot (its calls end
        in other processes: polled, like results); True if the turn was cancelled."""
        deadline = time.monotonic() + self.rt.poll_s
        while time.monotonic() < deadline:
            self.lease.check()
            if self.cancelled():
                return True
            time.sleep(min(0.05, self.rt.poll_s))
        return False

    def _decided_or_expired(self, call: ToolCall) -> None:
        decided = store.apply_decision(self.rt.sessions, call.id)
        if decided is not None:
            if decided.status == CallState.DENIED:
                self.finished(decided, store.decision_wait_ms(self.rt.sessions, decided))
            return
        expired = store.expire_decision(self.rt.sessions, call.id)
        if expired is not None:
            self.emit("tool_call_decided", {"call_id": call.id, "decision": CallDecision.EXPIRED})
            self.finished(expired, store.decision_wait_ms(self.rt.sessions, expired))

    def _maybe_expire_waiting(self, call: ToolCall) -> None:
        who = "the human" if call.executor == INLINE else "the client"
        error = f"{who} did not answer within {call.timeout_s:g} s"
        expired = store.expire_waiting(self.rt.sessions, call.id, error)
        if expired is not None:
            self.finished(expired)

    # -- the end -----------------------------------------------------------------------

    def finish(self, status: str, error: str | None = None) -> str:
        """End the turn: open calls are cancelled, then ``turn_finished``."""
        # A runner whose lease is gone (cut off from Redis past it) must not end a turn that
        # runs elsewhere now: seen in tests/chaos/test_partitions.py as a turn ``failed`` by
        # the cut-off runner after the new one had taken it over.
        self.lease.check()
        if status == TurnState.CANCELLED and self.timed_out:
            status = TurnState.TIMED_OUT
            error = f"the turn's time limit of {self.agent.turn_timeout_s:g} s passed"
        closing = self.open_calls()
        for call in closing:
            if call.tool == RUN_PLAN and call.plan_call_id is None:
                plans.close(self, call, status)  # its steps end too, before the calls do
        for call in closing:
            reason = None if status == TurnState.CANCELLED else f"the turn ended ({status})"
            self.record(call, CallState.CANCELLED, "", reason)
        in_flight = [c.id for c in closing if c.status == CallState.RUNNING]
        if in_flight:
            try:
                self.rt.dispatcher.revoke(in_flight)
            except Exception:  # revoking is best effort; the calls are already recorded
                log.warning("turn %s: could not revoke %s", self.info.turn_id, in_flight)
        if status == TurnState.CANCELLED:
            # After the revoke: a write call stopped just now made its proposal, or not.
            for proposal_id in store.withdraw_proposals(self.rt.sessions, self.info.turn_id):
                self.emit("proposal_resolved", {"proposal_id": proposal_id, "status": "cancelled"})
        announced: list[tuple[EventKind, Mapping[str, Any]]] = []

        def deliveries(conn: Connection, turn: store.FinishedTurn) -> None:
            # Its usage and webhook deliveries read and written in the finishing transaction.
            turn_usage = usage.usage_in(conn, turn)
            finished = turn_finished(status, turn.step, turn_usage, error)
            announced.extend(self.payloads([("turn_finished", finished)]))
            self.enqueue_hooks(conn, announced)

        turn = store.finish_turn(
            self.rt.sessions,
            self.info.turn_id,
            status,
            error,
            usage_to=self.root_turn_id if self.child else None,  # the parent pays for its child
            then=deliveries,
        )
        if turn is not None:
            metrics.TURNS_FINISHED.labels(status).inc()
            self.append_events(announced)
            self.rt.hooks.turn_finished(hooks.context(self), status)
        return status
