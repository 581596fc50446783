"""The agent loop's entry point: ``run_turn(rt, turn_id)``, one delivery of one turn.

A delivery decides whether it may run the turn at all (it exists, is not a spawn_agent
child, every earlier turn of its conversation has finished, nobody else holds its lease,
it has not killed its worker too often), runs one pass of the state machine under the
lease, and then hands its slot on: a turn that finished or parked runs an admission pass
(``shared/admission.py``), which starts the waiting turns whose user's fair share allows.
It takes the lease first, so that a turn that may run is read and started in one
transaction (``_open_leased``); one that may not gives the lease back and is decided from
a second read (``_run_checked``), as a delivery that finds the lease taken is.

Where the rest of a turn lives, in the order a turn meets it:

- ``turn_runner.py``: the turn's state machine over SQL (start, resume, park, finish);
- ``model_step.py``: one model step (tools offered, transcript sent, answer stored);
- ``server_calls.py``: calls sent to the tool workers, gathered with deadlines;
- ``own_calls.py``: calls the orchestrator runs itself (client tools, ask_user, spawn_agent);
- ``transcript.py``: the model's view of the conversation, built from SQL;
  ``running_transcript.py``: the same, read once per runner and kept while it runs;
- ``approvals.py``: proposal decisions heard on Redis, reconciled from SQL;
- ``store.py``: every SQL transition; ``lease.py``, ``deliveries.py``: one runner per turn.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from opentelemetry.trace import Span

from signalbox.services.orchestrator import deliveries, spans, store
from signalbox.services.orchestrator.cancel_watch import CancelWatch
from signalbox.services.orchestrator.lease import LeaseLost, TurnLease
from signalbox.services.orchestrator.runtime import REDIS_DOWN, Runtime
from signalbox.services.orchestrator.store import FINISHED_TURN_STATUSES, TurnInfo
from signalbox.services.orchestrator.turn_runner import TurnRunner
from signalbox.shared.log_context import bind_log_context, log_context

__all__ = ["Runtime", "TurnRunner", "run_turn"]

log = logging.getLogger(__name__)

NOT_RUN = frozenset({"lease_lost", "redis_unavailable"})  # outcomes that leave the turn as is


def run_turn(rt: Runtime, turn_id: str) -> str:
    """Run (or resume, or continue) one turn as far as it can go; returns what happened.

    Outcomes: a finished status (``completed``, ``cancelled``, ``failed``, ``step_limit``),
    ``parked`` (waiting for a human or a client), or why nothing ran: ``missing``,
    ``finished``, ``child`` (a spawn_agent child turn: its parent runs it), ``waiting`` (an
    earlier turn of the conversation is unfinished), ``not_admitted`` (its user's fair share
    of slots is taken: ``shared/admission.py``), ``leased`` (another runner has it),
    ``lease_lost``, ``redis_unavailable`` (left as SQL has it, for the reconciler to resume).
    A run whose turn kept killing its worker fails it instead (``deliveries.py``).
    Traced as ``turn.run`` (``spans.py``).
    """
    # The ids on its log lines end with the run (in a Celery task and called directly alike).
    with spans.turn_run(turn_id) as span, log_context(turn_id=turn_id):
        outcome = _run_turn(rt, turn_id, span)
        span.set_attribute(spans.OUTCOME, outcome)
        return outcome


def _run_turn(rt: Runtime, turn_id: str, span: Span) -> str:
    lease = _lease(rt, turn_id)
    try:
        # The lease and the run's count (deliveries.py) in one round trip, first: a turn
        # that may run is then read and started in ONE transaction (``_open_leased``).
        started = deliveries.lease_and_count(lease, rt.keys, turn_id)
    except REDIS_DOWN:
        started = 0  # ``_run_checked`` does what SQL alone decides, and else says why
    if started:
        opened = _open_leased(rt, turn_id, lease, started)
        if opened is not None:
            _bind(opened.runner.info, span)
            return _run_counted(rt, opened.runner.info, lease, started, opened)
    return _run_checked(rt, turn_id, span)


def _lease(rt: Runtime, turn_id: str) -> TurnLease:
    return TurnLease(
        rt.redis, rt.keys.turn_lease(turn_id), rt.settings.lease_s, rt.settings.lease_renew_s
    )


def _bind(info: TurnInfo, span: Span) -> None:
    bind_log_context(conversation_id=info.conversation_id, user_id=info.user_id)
    span.set_attribute(spans.CONVERSATION_ID, info.conversation_id)


def _may_run(info: TurnInfo) -> bool:
    """Whether ``_run_checked`` would take the lease for this turn without more ado."""
    return (
        info.parent_call_id is None
        and info.status not in FINISHED_TURN_STATUSES
        and not info.behind
        and info.admitted
    )


@dataclass(frozen=True)
class _Started:
    """What ``_open_leased`` did under the lease: the turn's runner, what ``open`` found or
    started (None: a run ``_give_up`` ends, not opened), or the error the start raised, for
    the runner to end the turn with under the lease (as when it opens the turn itself)."""

    runner: TurnRunner
    opened: store.Opened | None = None
    failure: Exception | None = None


def _open_leased(rt: Runtime, turn_id: str, lease: TurnLease, started: int) -> _Started | None:
    """Under the lease just taken, its heartbeat running: read the turn and, if it may run,
    start it (or read how it stands) in the same transaction; else give the lease back and
    return None, for ``_run_checked`` to decide from what is committed then.

    Giving it back strands nobody: a delivery that found the lease taken meanwhile
    returned ``leased``, but whatever sent it (an earlier turn's end, an admission) was
    committed before, and ``_run_checked`` reads after the release."""
    lease.keep_alive()  # the transaction may wait (a write lock, a pooled connection)
    runner: TurnRunner | None = None
    opened: store.Opened | None = None
    try:
        with store.transaction(rt.sessions) as conn:
            info = store.read_turn(conn, turn_id)
            if info is not None and _may_run(info):
                watch = CancelWatch(rt.redis, rt.keys.control_channel, turn_id, start_now=False)
                runner = TurnRunner(rt, info, lease, watch)
                if started <= rt.settings.max_turn_deliveries:
                    opened = runner.open(conn)
                    # Renewals failed for longer than the lease while it waited: another
                    # runner may hold the turn, so the start is rolled back (``lease_lost``).
                    lease.check()
    except Exception as exc:
        if runner is None:  # the read failed: nothing was decided under the lease
            lease.give_back()
            raise
        return _Started(runner, failure=exc)  # rolled back; the runner fails the turn
    except BaseException:
        lease.give_back()
        raise
    if runner is None:
        lease.give_back()
        return None
    return _Started(runner, opened)


def _run_checked(rt: Runtime, turn_id: str, span: Span) -> str:
    """A delivery that could not take the lease at once, or whose turn may not run as it
    was read: read the turn, decide, and take the lease only if it may run."""
    info = store.load_turn(rt.sessions, turn_id)
    if info is None:
        log.warning("run_turn: no turn %r", turn_id)
        return "missing"
    _bind(info, span)
    if info.parent_call_id is not None:
        return "child"  # a spawn_agent child runs inside its parent's run, never alone
    if info.status in FINISHED_TURN_STATUSES:
        _admit_next(rt)  # in case the runner died before doing it
        return "finished"
    earlier = store.earlier_unfinished_turns(rt.sessions, info) if info.behind else []
    if earlier:
        for turn_id_before in earlier:
            # A parked turn interrupted by this one (busy policy ``interrupt``) has nobody
            # listening for its cancel: wake it, so it ends and enqueues this one.
            if store.ready_to_continue(rt.sessions, turn_id_before):
                rt.enqueue_turn(turn_id_before)
        return "waiting"  # the earlier turn's end lets admission start this one
    if not info.admitted and turn_id not in rt.admit_waiting_turns(running_here=turn_id):
        # Sent before admission gave it a slot (a scheduler tick, a message from before an
        # upgrade): it waits in SQL for its user's fair share, holding no worker thread.
        return "not_admitted"
    lease = _lease(rt, turn_id)
    try:
        started = deliveries.lease_and_count(lease, rt.keys, turn_id)
        if not started:
            # A redelivery (visibility timeout, a duplicate enqueue) while a runner works on
            # the turn: it does nothing, so a turn never runs twice at once.
            log.info("run_turn(%s): another runner holds the lease; nothing to do", turn_id)
            return "leased"
    except REDIS_DOWN as exc:
        log.error("run_turn(%s): Redis unavailable (%s); the reconciler retries", turn_id, exc)
        return "redis_unavailable"
    return _run_counted(rt, info, lease, started)


def _run_counted(
    rt: Runtime, info: TurnInfo, lease: TurnLease, started: int, opened: _Started | None = None
) -> str:
    """The leased run (``started``: its count), then the slot handed on."""
    turn_id = info.turn_id
    try:
        if started > rt.settings.max_turn_deliveries:
            if opened is not None and opened.failure is not None:
                log.error("turn %s: reading it failed: %s", turn_id, opened.failure)
            return _give_up(rt, info, lease, started)
        outcome = _run_leased(rt, info, lease, opened)
    finally:
        lease.forget_count()  # the run came back; releasing the lease forgot it already
    if outcome in NOT_RUN:
        return outcome
    if outcome in FINISHED_TURN_STATUSES:
        _admit_next(rt)
    elif outcome == "parked":
        if store.ready_to_continue(rt.sessions, turn_id):
            # An answer (or cancel) came while this runner still held the lease: the delivery
            # it enqueued found the lease taken and returned, so nobody else will wake it.
            rt.enqueue_turn(turn_id)
        _admit_next(rt)  # a parked turn holds no slot
    return outcome


def _run_leased(
    rt: Runtime, info: TurnInfo, lease: TurnLease, opened: _Started | None = None
) -> str:
    """One pass of the turn's runner under the lease: ``opened``'s (``_open_leased``), or
    one made here that opens the turn itself."""
    turn_id = info.turn_id
    try:
        # Started by the runner once turn_started is out (a pub/sub connection and a thread
        # are not worth delaying the first event for); it reads the SQL flag right after.
        watch = (
            opened.runner.cancel
            if opened is not None
            else CancelWatch(rt.redis, rt.keys.control_channel, turn_id, start_now=False)
        )
        with lease, watch as cancel:
            runner = opened.runner if opened is not None else TurnRunner(rt, info, lease, cancel)
            try:
                if opened is None:
                    return runner.run()
                if opened.failure is not None:
                    raise opened.failure
                return runner.run(opened.opened)
            except LeaseLost:
                log.error("turn %s: lease lost, leaving the turn to its new runner", turn_id)
                return "lease_lost"
            except REDIS_DOWN:
                raise
            except Exception as exc:
                try:  # ``finish`` refuses once the lease is lost: the turn is not ours to end
                    outcome = runner.finish("failed", error=f"{type(exc).__name__}: {exc}")
                except LeaseLost:
                    log.error("turn %s: %s after its lease was lost; leaving it", turn_id, exc)
                    return "lease_lost"
                log.error("turn %s failed", turn_id, exc_info=exc)
                return outcome
    except REDIS_DOWN as exc:
        # Nothing can be announced or dispatched without Redis. The turn stays as SQL has
        # it (running, no lease), and the reconciler resumes it once Redis is back.
        log.error("turn %s: Redis unavailable (%s); leaving it to be resumed", turn_id, exc)
        return "redis_unavailable"


def _give_up(rt: Runtime, info: TurnInfo, lease: TurnLease, started: int) -> str:
    """A poison turn: its runs kept dying with their worker; fail it instead of a next run."""
    error = deliveries.given_up_error(started, rt.settings.max_turn_deliveries)
    log.error("turn %s: %s", info.turn_id, error)
    with lease:
        runner = TurnRunner(rt, info, lease, CancelWatch(rt.redis, rt.keys.control_channel, ""))
        outcome = runner.finish("failed", error=error)
    _admit_next(rt)
    return outcome


def _admit_next(rt: Runtime) -> None:
    """A slot freed (a turn finished or parked, committed): admit what may start now, the
    conversation's next turn among them if its user's share allows. No pass when no turn
    waits (``shared/admission.py`` says why that strands none)."""
    rt.admit_waiting_turns(if_waiting=True)
