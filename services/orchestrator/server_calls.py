"""Calls run by the tool workers: sent in one publish batch per step, gathered with deadlines.

Each worker reports on the turn's result stream (``keys.tool_results``); the runner reads it
with ``XREAD`` and its own deadline per call (its time limit plus ``tool_grace_s``), so a
call ends ``ok``/``error``/``timeout`` with the worker's report, or ``lost`` when none came.
A call that started (its claim is set) and whose worker stopped renewing its heartbeat
(``services/tools/heartbeat.py``) for ``tool_heartbeat_grace_s`` is ``lost`` at once, not at
its deadline: its worker died. An idempotent call whose worker vanished is sent again
instead (``MAX_IDEMPOTENT_ATTEMPTS``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from signalbox.services.orchestrator import store
from signalbox.shared.db.models import ToolCall, as_utc
from signalbox.shared.events import tool_call_started
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

log = logging.getLogger(__name__)

MAX_IDEMPOTENT_ATTEMPTS = 3  # an idempotent call whose worker vanished is sent twice more
RESULTS_PER_READ = 64
HEARTBEAT_CHECK_S = 0.5  # how often the heartbeats of started calls are read while waiting


def dispatch(
    runner: TurnRunner, pending: Sequence[ToolCall], limited: bool = False
) -> tuple[list[ToolCall], int]:
    """Send the step's calls in one batch, then mark them running and announce them;
    returns the calls it started and how many it held back.

    Sent before marked: if this runner dies in between, the next one finds the calls
    still pending and sends them again; the tool worker's claim on the call id skips
    the duplicate, and the first run's result is on the results stream all the same.
    (Marked first, a death in between would leave calls that were never sent, lost.)
    ``limited``: only the calls that get one of their user's slots (``tool_slots.py``) go;
    the rest stay pending, for the runner to send as slots free.
    """
    catalogue = runner.step_catalogue()  # read for this step's offers, if just now
    runner.specs.update(catalogue)
    for call in pending:
        if call.tool not in catalogue:
            runner.record(call, "error", "", f"no live tool worker serves {call.tool!r} now")
    sendable = sorted((c for c in pending if c.tool in catalogue), key=lambda c: c.position)
    held = 0
    slots = runner.rt.tool_slots
    if limited and slots is not None and sendable:
        grace_s, now = runner.rt.settings.tool_grace_s, time.time()
        granted = slots.take(
            runner.info.user_id, [(c.id, now + c.timeout_s + grace_s) for c in sendable]
        )
        held = sum(1 for c in sendable if c.id not in granted)
        sendable = [c for c in sendable if c.id in granted]
    if sendable:
        runner.rt.dispatcher.send([(call_request(runner, c), catalogue[c.tool]) for c in sendable])
    started = store.mark_running(runner.rt.sessions, sendable)
    runner.emit_many([("tool_call_started", tool_call_started(call)) for call in started])
    return started, held


def call_request(runner: TurnRunner, call: ToolCall) -> ToolCallRequest:
    """The task payload of a call, as the tool worker receives it."""
    info = runner.info
    return ToolCallRequest(
        call_id=call.id,
        turn_id=info.turn_id,
        conversation_id=info.conversation_id,
        user_id=info.user_id,
        workspace=info.workspace,
        tool=call.tool,
        input=call.input,
        timeout_s=call.timeout_s,
    )


def retry(runner: TurnRunner, call: ToolCall) -> ToolCall | None:
    """Send a call again whose worker vanished, if its tool is idempotent (else None).

    Running an idempotent tool twice is harmless by its own declaration, so the model
    gets a real result instead of ``lost``; any other call could have taken effect.
    """
    # Also the specs this runner saw: the workers may be gone from the catalogue now.
    spec = runner.rt.catalogue().get(call.tool) or runner.specs.get(call.tool)
    if spec is None or not spec.idempotent or call.attempts >= MAX_IDEMPOTENT_ATTEMPTS:
        return None
    retried = store.retry_call(runner.rt.sessions, call.id, call.attempts)
    if retried is None:
        return None
    log.warning(
        "turn %s: no result for idempotent call %s (%s); sending it again (attempt %d)",
        runner.info.turn_id,
        call.id,
        call.tool,
        retried.attempts,
    )
    runner.rt.dispatcher.send([(call_request(runner, retried), spec)])
    return retried


def gather(
    runner: TurnRunner,
    running: Sequence[ToolCall],
    until_first: bool = False,
    just_sent: bool = False,
) -> str | None:
    """All-settled: each call ends with its result, or ``lost`` at its own deadline.

    Reads the turn's result stream from the start, so results published while no
    runner was listening (a resumed turn) are found too. ``until_first``: return as soon
    as any of the calls ended (a plan starts a step the moment its inputs are ready).
    ``just_sent``: this runner sent every call a moment ago, so their heartbeats are read
    first a ``HEARTBEAT_CHECK_S`` later (a call no worker has taken yet is not judged).
    """
    grace_s = runner.rt.settings.tool_grace_s
    waiting = {c.id: c for c in running}

    def settled() -> bool:
        return not waiting or (until_first and len(waiting) < len(running))

    def deadline_of(c: ToolCall) -> float:
        return as_utc(c.started_at or store.utcnow()).timestamp() + c.timeout_s + grace_s

    deadline = {c.id: deadline_of(c) for c in running}
    beats = Heartbeats(runner, [c.id for c in running if c.attempts > 1], just_sent)
    key = runner.rt.keys.tool_results(runner.info.turn_id)
    last_id = "0-0"
    while not settled():
        runner.lease.check()
        if runner.cancelled():
            return "cancelled"
        # Heartbeats first, results next: a worker publishes its result before its
        # heartbeat stops, so a call found silent here and without a result below is dead.
        dead = beats.dead(waiting)
        # What already arrived counts before any deadline is judged: a resumed runner,
        # or one back from a long sub-agent, must not call a delivered result lost.
        last_id = _take_results(runner, key, last_id, waiting, block_ms=None)
        now = time.time()
        for call_id in [cid for cid in waiting if deadline[cid] <= now or cid in dead]:
            retried = retry(runner, waiting[call_id])
            if retried is not None:
                waiting[call_id] = retried
                deadline[call_id] = deadline_of(retried)
                beats.retried(call_id)
                continue
            call = waiting.pop(call_id)
            if call_id in dead:
                why = (
                    f"its tool worker stopped while running it (no heartbeat for "
                    f"{beats.grace_s:g} s)"
                )
            else:
                why = f"no result within {call.timeout_s:g} s + {grace_s:g} s grace"
            runner.record(
                call,
                "lost",
                "",
                f"{why}: the tool worker vanished; the call may or may not have taken effect",
            )
        if settled():
            break
        wait_s = min(max(min(deadline[c] for c in waiting) - now, 0.001), runner.rt.poll_s)
        last_id = _take_results(runner, key, last_id, waiting, max(1, int(wait_s * 1000)))
    return None


class Heartbeats:
    """Which started calls' workers stopped renewing their heartbeat, for how long.

    A call counts once it started (its claim key is set by the worker that took it). One
    sent again (``retry``, or a resumed runner's call on a later attempt) counts only once
    its heartbeat was seen again: until a worker takes it, the old claim is all there is.
    """

    def __init__(self, runner: TurnRunner, unseen: Sequence[str], wait: bool = False) -> None:
        self.client = runner.rt.redis
        self.keys = runner.rt.keys
        self.grace_s = runner.rt.settings.tool_heartbeat_grace_s
        self.unseen = set(unseen)
        self.silent_since: dict[str, float] = {}
        # ``wait``: calls sent just now; a first read at once would find them not yet
        # taken (no claim: not judged) and cost a round trip per step for nothing.
        self.next_check = time.monotonic() + HEARTBEAT_CHECK_S if wait else 0.0

    def retried(self, call_id: str) -> None:
        """``call_id`` was sent again: judge it only once a worker runs it."""
        self.unseen.add(call_id)
        self.silent_since.pop(call_id, None)

    def dead(self, waiting: dict[str, ToolCall]) -> set[str]:
        """The waiting calls silent for ``grace_s`` (read every ``HEARTBEAT_CHECK_S``)."""
        now = time.monotonic()
        if self.grace_s <= 0 or not waiting or now < self.next_check:
            return set()
        self.next_check = now + HEARTBEAT_CHECK_S
        ids = list(waiting)
        pipe = self.client.pipeline(transaction=False)
        for call_id in ids:
            pipe.exists(self.keys.call_claim(call_id))
            pipe.exists(self.keys.call_alive(call_id))
        found: list[Any] = pipe.execute()
        dead = set()
        for call_id, claimed, alive in zip(ids, found[0::2], found[1::2], strict=True):
            if alive:
                self.unseen.discard(call_id)
            if alive or not claimed or call_id in self.unseen:
                self.silent_since.pop(call_id, None)
                continue
            if now - self.silent_since.setdefault(call_id, now) >= self.grace_s:
                dead.add(call_id)
        return dead


def _take_results(
    runner: TurnRunner,
    key: str,
    last_id: str,
    waiting: dict[str, ToolCall],
    block_ms: int | None,
) -> str:
    """Record the results after ``last_id`` (blocking up to ``block_ms`` for the first)."""
    while True:
        reply: Any = runner.rt.redis.xread({key: last_id}, block=block_ms, count=RESULTS_PER_READ)
        read = 0
        rows: list[store.ResultRow] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                read += 1
                last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                raw = fields.get(b"r", fields.get("r"))
                try:
                    result = ToolResult.model_validate_json(raw)
                except (ValidationError, TypeError):
                    log.warning("turn %s: unreadable tool result %r", runner.info.turn_id, raw)
                    continue
                if waiting.pop(result.call_id, None) is not None:
                    rows.append(
                        store.ResultRow(
                            result.call_id,
                            result.status,
                            result.output,
                            result.error,
                            result.duration_ms,
                        )
                    )
        # One transaction for everything this read brought, not one per call.
        runner.record_many(rows)
        if read < RESULTS_PER_READ:
            return last_id
        block_ms = None  # a full batch: more may be there already
