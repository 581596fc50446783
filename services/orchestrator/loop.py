"""The agent loop of one turn, as a state machine over what SQL holds.

Every ``run_turn`` delivery starts from what is committed, so the same code runs a fresh
turn, resumes one whose runner died, and continues a parked one:

    queued ──start──► running ─┬─ model step ─► calls pending ─dispatch─► running ─gather─┐
                               │     ▲                                                    │
                               │     └──────────────── all calls ended ◄──────────────────┘
                               ├─ step without calls ─► completed
                               ├─ max_steps ─► step_limit      ├─ cancel ─► cancelled
                               ├─ needs_decision / waiting ─► parked   └─ error ─► failed

A call starts by its executor: a tool worker (one Celery group per step), the client that
declared it (``waiting`` on ``tool_result``), a human (``ask_user``: ``waiting`` on
``answer``), or this loop itself (``spawn_agent``: a read-only child turn run inline, under
this turn's lease, its events tagged with ``parent_call_id``). A turn whose open calls all
wait on someone parks: no worker slot is held; the answer, the decision, an expiry (the
reconciler) or a cancel enqueues it again.

One runner per turn (``lease.TurnLease``); turns of a conversation run one at a time in
``seq`` order, and each finished turn enqueues the next queued one.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from pydantic import BaseModel, ValidationError

from services.orchestrator import deliveries, faults, store
from services.orchestrator.builtin_tools import (
    ASK_USER,
    BUILTIN_DEFS,
    SPAWN_AGENT,
    SPAWN_AGENT_TIMEOUT_S,
    AskUserInput,
    SpawnAgentInput,
    client_tools,
    input_problem,
)
from services.orchestrator.cancel_watch import CancelWatch
from services.orchestrator.context_budget import estimate_tokens, fit
from services.orchestrator.dispatch import Dispatcher
from services.orchestrator.lease import LeaseLost, TurnLease
from services.orchestrator.model import (
    Model,
    ModelError,
    ModelRequest,
    StepEnd,
    StepRetry,
    TextDelta,
    ToolDef,
    ToolUse,
)
from services.orchestrator.policy import Decision, ToolPolicy
from services.orchestrator.store import (
    CLIENT,
    FINISHED_TURN_STATUSES,
    INLINE,
    SERVER,
    PlannedCall,
    Sessions,
    TurnInfo,
)
from services.orchestrator.text_deltas import DeltaBuffer, preview
from services.orchestrator.transcript import OPEN_CALL_STATUSES, load_messages
from shared.auth import hash_token
from shared.db.models import ToolCall
from shared.event_stream import EventStream
from shared.events import EventKind
from shared.redis_keys import RedisKeys
from shared.settings import OrchestratorSettings
from shared.tool_contract import ApprovalMode, ToolCallRequest, ToolResult, ToolSpec, read_catalogue

log = logging.getLogger(__name__)

UNKNOWN_TOOL_TIMEOUT_S = 0.0
# Redis errors that mean "not reachable now" rather than a bug in a command.
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)
NOT_RUN = frozenset({"lease_lost", "redis_unavailable"})  # outcomes that leave the turn as is
MAX_IDEMPOTENT_ATTEMPTS = 3  # an idempotent call whose worker vanished is sent twice more
RESULTS_PER_READ = 64
POLL_S = 0.25  # longest single wait on the results stream: bounds how late a deadline is seen
CANCEL_CHECK_S = 1.0  # how often the committed cancel flag is read while waiting on tools


@dataclass
class Runtime:
    """Everything a turn needs from the outside world, built once per worker process."""

    settings: OrchestratorSettings
    sessions: Sessions
    redis: redis.Redis
    keys: RedisKeys
    model: Model
    dispatcher: Dispatcher
    enqueue_turn: Callable[[str], object]
    poll_s: float = POLL_S
    cancel_check_s: float = CANCEL_CHECK_S
    policy: ToolPolicy = field(default_factory=ToolPolicy)

    @property
    def events(self) -> EventStream:
        """The conversations' event streams."""
        return EventStream(self.redis, self.keys)

    def catalogue(self) -> dict[str, ToolSpec]:
        """The tools live workers serve right now."""
        return read_catalogue(self.redis, self.keys)


def run_turn(rt: Runtime, turn_id: str) -> str:
    """Run (or resume, or continue) one turn as far as it can go; returns what happened.

    Outcomes: a finished status (``completed``, ``cancelled``, ``failed``, ``step_limit``),
    ``parked`` (waiting for a human or a client), or why nothing ran: ``missing``,
    ``finished``, ``child`` (a spawn_agent child turn: its parent runs it), ``waiting`` (an
    earlier turn of the conversation is unfinished), ``leased`` (another runner has it),
    ``lease_lost``, ``redis_unavailable`` (left as SQL has it, for the reconciler to resume).
    A run whose turn kept killing its worker fails it instead (``deliveries.py``).
    """
    info = store.load_turn(rt.sessions, turn_id)
    if info is None:
        log.warning("run_turn: no turn %r", turn_id)
        return "missing"
    if info.parent_call_id is not None:
        return "child"  # a spawn_agent child runs inside its parent's run, never alone
    if info.status in FINISHED_TURN_STATUSES:
        _start_next(rt, info.conversation_id)  # in case the runner died before doing it
        return "finished"
    earlier = store.earlier_unfinished_turns(rt.sessions, info)
    if earlier:
        for turn_id_before in earlier:
            # A parked turn interrupted by this one (busy policy ``interrupt``) has nobody
            # listening for its cancel: wake it, so it ends and enqueues this one.
            if store.ready_to_continue(rt.sessions, turn_id_before):
                rt.enqueue_turn(turn_id_before)
        return "waiting"  # the earlier turn enqueues this one when it ends
    lease = TurnLease(rt.redis, rt.keys.turn_lease(turn_id), rt.settings.lease_s)
    try:
        if not lease.acquire():
            # A redelivery (visibility timeout, a duplicate enqueue) while a runner works on
            # the turn: it does nothing, so a turn never runs twice at once.
            log.info("run_turn(%s): another runner holds the lease; nothing to do", turn_id)
            return "leased"
        started = deliveries.count_start(rt.redis, rt.keys, turn_id)
    except REDIS_DOWN as exc:
        log.error("run_turn(%s): Redis unavailable (%s); the reconciler retries", turn_id, exc)
        return "redis_unavailable"
    try:
        if started > rt.settings.max_turn_deliveries:
            return _give_up(rt, info, lease, started)
        outcome = _run_leased(rt, info, lease)
    finally:
        deliveries.count_return(rt.redis, rt.keys, turn_id)
    if outcome in NOT_RUN:
        return outcome
    if outcome in FINISHED_TURN_STATUSES:
        _start_next(rt, info.conversation_id)
    elif outcome == "parked" and store.ready_to_continue(rt.sessions, turn_id):
        # An answer (or cancel) came while this runner still held the lease: the delivery it
        # enqueued found the lease taken and returned, so nobody else will wake the turn.
        rt.enqueue_turn(turn_id)
    return outcome


def _run_leased(rt: Runtime, info: TurnInfo, lease: TurnLease) -> str:
    turn_id = info.turn_id
    try:
        with lease, CancelWatch(rt.redis, rt.keys.control_channel, turn_id) as cancel:
            runner = TurnRunner(rt, info, lease, cancel)
            try:
                return runner.run()
            except LeaseLost:
                log.error("turn %s: lease lost, leaving the turn to its new runner", turn_id)
                return "lease_lost"
            except REDIS_DOWN:
                raise
            except Exception as exc:
                log.exception("turn %s failed", turn_id)
                return runner.finish("failed", error=f"{type(exc).__name__}: {exc}")
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
    _start_next(rt, info.conversation_id)
    return outcome


def _start_next(rt: Runtime, conversation_id: str) -> None:
    following = store.next_queued_turn(rt.sessions, conversation_id)
    if following is not None:
        rt.enqueue_turn(following)


@dataclass(frozen=True)
class Offer:
    """A tool as offered to the model in one step, with how its calls are run."""

    tool_def: ToolDef
    executor: str  # store.SERVER | store.CLIENT | store.INLINE
    timeout_s: float
    mode: ApprovalMode


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
        self.max_steps = settings.subagent_max_steps if self.child else settings.max_steps
        self._next_cancel_check = 0.0
        self._specs: dict[str, ToolSpec] = {}  # of the tools this runner dispatched to

    # -- events ------------------------------------------------------------------------

    def emit(self, kind: EventKind, data: dict[str, Any]) -> str:
        """Append one event of this turn to its conversation's stream."""
        if self.child:
            data = {**data, "parent_call_id": self.info.parent_call_id}
        return self.rt.events.append(self.info.conversation_id, kind, data, self.info.turn_id)

    def _finished(self, call: ToolCall) -> None:
        self.emit(
            "tool_call_finished",
            {
                "call_id": call.id,
                "tool": call.tool,
                "status": call.status,
                "output": preview(call.output or ""),
                "error": call.error,
                "duration_ms": call.duration_ms or 0,
            },
        )

    def _record(
        self,
        call: ToolCall,
        status: str,
        output: str,
        error: str | None,
        duration_ms: int | None = None,
    ) -> None:
        done = store.record_result(self.rt.sessions, call.id, status, output, error, duration_ms)
        if done is not None:
            self._finished(done)

    # -- the state machine -------------------------------------------------------------

    def run(self) -> str:
        """Bring the turn from its committed state as far as it can go."""
        turn = store.get_turn(self.rt.sessions, self.info.turn_id)
        if turn.status in FINISHED_TURN_STATUSES:
            return "finished"
        if turn.status == "queued":
            if turn.cancel_requested:
                return self.finish("cancelled")
            if store.start_turn(self.rt.sessions, self.info, self.rt.model.name):
                self.emit("turn_started", {"model": self.rt.model.name})
        elif turn.status == "parked":
            store.set_turn_status(
                self.rt.sessions, self.info.turn_id, "running", only_from="parked"
            )
        else:
            self.emit("turn_resumed", {"step": turn.step})
        if not self.child:
            faults.maybe_kill_on_turn(self.info.text)  # test-only; a no-op in a deployment
        return self._loop()

    def _loop(self) -> str:
        while True:
            self.lease.check()
            if self._cancelled(force=True):
                return self.finish("cancelled")
            message, calls = store.last_assistant_message(self.rt.sessions, self.info.turn_id)
            if message is not None:
                if any(c.status in OPEN_CALL_STATUSES for c in calls):
                    outcome = self._settle()
                    if outcome is not None:
                        return outcome
                    continue
                if not calls:
                    return self.finish("completed")
            turn = store.get_turn(self.rt.sessions, self.info.turn_id)
            if turn.step >= self.max_steps:
                return self.finish("step_limit")
            outcome = self._model_step()
            if outcome is not None:
                return outcome

    def _cancelled(self, force: bool = False) -> bool:
        if self.cancel.is_set():
            return True
        now = time.monotonic()
        if force or now >= self._next_cancel_check:
            self._next_cancel_check = now + self.rt.cancel_check_s
            if store.cancel_requested(self.rt.sessions, self.root_turn_id):
                self.cancel.set()
        return self.cancel.is_set()

    # -- one model step ----------------------------------------------------------------

    def _offers(self) -> dict[str, Offer]:
        """What the model may call this step: the live catalogue (read-only tools alone for a
        sub-agent), then the built-in tools, then the client's own tools."""
        offers: dict[str, Offer] = {}
        for spec in self.rt.catalogue().values():
            if self.child and spec.side_effect != "read":
                continue
            definition = ToolDef(spec.name, spec.description, spec.input_schema)
            offers[spec.name] = Offer(definition, SERVER, spec.timeout_s, spec.mode)
        if self.child:
            return offers
        for definition in BUILTIN_DEFS.values():
            wait_s = (
                self.rt.settings.decision_ttl_s
                if definition.name == ASK_USER
                else SPAWN_AGENT_TIMEOUT_S
            )
            offers[definition.name] = Offer(definition, INLINE, wait_s, "auto")
        for tool in client_tools(self.info.client_tools, offers).values():
            offers[tool.name] = Offer(tool.as_def(), CLIENT, tool.timeout_s, "auto")
        return offers

    def _request(self, offers: dict[str, Offer]) -> ModelRequest:
        settings = self.rt.settings
        with self.rt.sessions() as s:
            messages = load_messages(
                s, self.info.conversation_id, self.info.turn_id if self.child else None
            )
        tools = [offers[name].tool_def for name in sorted(offers)]
        overhead = estimate_tokens(settings.system_prompt) + estimate_tokens(
            [asdict(t) for t in tools]
        )
        return ModelRequest(
            system=settings.system_prompt,
            messages=fit(
                messages, settings.context_tokens, settings.tool_output_max_chars, overhead
            ),
            tools=tools,
            max_tokens=settings.max_tokens,
            model=settings.model,
        )

    def _model_step(self) -> str | None:
        offers = self._offers()
        request = self._request(offers)
        texts: list[str] = []
        uses: list[ToolUse] = []
        end: StepEnd | None = None
        cancelled = False
        buffer = DeltaBuffer(lambda text: self.emit("text_delta", {"text": text}))
        stream = self.rt.model.stream(request)
        try:
            for event in stream:
                if self.cancel.is_set():
                    cancelled = True
                    break
                self.lease.check()
                if isinstance(event, TextDelta):
                    texts.append(event.text)
                    buffer.add(event.text)
                elif isinstance(event, ToolUse):
                    uses.append(event)
                elif isinstance(event, StepRetry):
                    buffer.flush()
                    texts.clear()
                    uses.clear()
                elif isinstance(event, StepEnd):
                    end = event
        except ModelError as exc:
            buffer.flush()
            return self.finish("failed", error=str(exc))
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # stops an unfinished HTTP stream
        buffer.flush()
        text = "".join(texts)
        if cancelled:
            if text:  # the partial answer stays in the transcript
                store.store_step(self.rt.sessions, self.info, text, [], 0, 0)
                self.emit("assistant_message", {"text": text})
            return self.finish("cancelled")
        if end is None:
            return self.finish("failed", error="the model stream ended without finishing the step")
        planned = [self._plan(use, offers) for use in uses]
        _msg, calls = store.store_step(
            self.rt.sessions, self.info, text, planned, end.input_tokens, end.output_tokens
        )
        self.emit("assistant_message", {"text": text})
        for call in calls:
            if call.status == "needs_decision":
                assert call.expires_at is not None
                self.emit(
                    "tool_call_needs_decision",
                    {
                        "call_id": call.id,
                        "tool": call.tool,
                        "input": call.input,
                        "expires_at": _rfc3339(call.expires_at),
                    },
                )
            elif call.status not in OPEN_CALL_STATUSES:
                self._finished(call)
        return None

    def _plan(self, use: ToolUse, offers: dict[str, Offer]) -> PlannedCall:
        offer = offers.get(use.name)
        if offer is None:
            why = f"unknown tool {use.name!r}"
            if self.child:
                why += " (a sub-agent has read-only tools alone)"
            return PlannedCall(use, UNKNOWN_TOOL_TIMEOUT_S, "error", why)
        shapes: dict[str, type[BaseModel]] = {ASK_USER: AskUserInput, SPAWN_AGENT: SpawnAgentInput}
        shape = shapes.get(use.name)
        if offer.executor == INLINE and shape is not None:
            problem = input_problem(shape, use.input)
            if problem is not None:
                return PlannedCall(use, offer.timeout_s, "error", problem, offer.executor)
        try:
            decision = self.rt.policy.decide(use.name, use.input, offer.mode)
        except Exception as exc:  # a decision never fails open
            log.exception("tool policy failed on %s", use.name)
            decision = Decision("deny", f"the tool policy could not be applied ({exc!r})")
        if decision.verdict == "deny":
            error = f"denied by the tool policy: {decision.reason}"
            return PlannedCall(use, offer.timeout_s, "denied", error, offer.executor)
        if decision.verdict == "confirm":
            if self.child:
                error = f"a sub-agent cannot wait for a human decision ({decision.reason})"
                return PlannedCall(use, offer.timeout_s, "denied", error, offer.executor)
            return PlannedCall(
                use,
                offer.timeout_s,
                "needs_decision",
                executor=offer.executor,
                decision_ttl_s=self.rt.settings.decision_ttl_s,
            )
        return PlannedCall(use, offer.timeout_s, "pending", executor=offer.executor)

    # -- the calls of a step -----------------------------------------------------------

    def _open(self) -> list[ToolCall]:
        return store.open_calls(self.rt.sessions, self.info.turn_id)

    def _settle(self) -> str | None:
        """Drive the open calls of the latest step to their end; an outcome ends the run."""
        for call in self._open():
            if call.status == "needs_decision":
                self._decided_or_expired(call)
            elif call.status == "waiting":
                self._maybe_expire_waiting(call)
        pending = [c for c in self._open() if c.status == "pending"]
        server = [c for c in pending if c.executor == SERVER]
        if server:
            self._dispatch(server)
        for call in pending:
            if call.executor == CLIENT:
                self._offer_to_client(call)
            elif call.executor == INLINE and call.tool == ASK_USER:
                self._ask(call)
            elif call.executor == INLINE:
                self._start_inline(call)
        running = [c for c in self._open() if c.status == "running"]
        for call in running:
            if call.executor == INLINE and self._run_child(call) == "cancelled":
                return self.finish("cancelled")
        workers = [c for c in running if c.executor == SERVER]
        if workers and self._gather(workers) == "cancelled":
            return self.finish("cancelled")
        now = store.utcnow()
        if any(store.unresolved(c, now) for c in self._open()):
            # No worker slot is held while someone decides or answers; that (or an expiry
            # the reconciler sees) enqueues the turn again.
            store.set_turn_status(
                self.rt.sessions, self.info.turn_id, "parked", only_from="running"
            )
            return "parked"
        return None

    def _decided_or_expired(self, call: ToolCall) -> None:
        decided = store.apply_decision(self.rt.sessions, call.id)
        if decided is not None:
            if decided.status == "denied":
                self._finished(decided)
            return
        expired = store.expire_decision(self.rt.sessions, call.id)
        if expired is not None:
            self.emit("tool_call_decided", {"call_id": call.id, "decision": "expired"})
            self._finished(expired)

    def _maybe_expire_waiting(self, call: ToolCall) -> None:
        who = "the human" if call.executor == INLINE else "the client"
        error = f"{who} did not answer within {call.timeout_s:g} s"
        expired = store.expire_waiting(self.rt.sessions, call.id, error)
        if expired is not None:
            self._finished(expired)

    def _ask(self, call: ToolCall) -> None:
        """ask_user: the question goes out and the call waits for the ``answer`` frame."""
        waiting = store.start_waiting(self.rt.sessions, call.id, call.timeout_s)
        if waiting is not None:
            question = AskUserInput.model_validate(call.input)
            self.emit(
                "question",
                {"question_id": call.id, "text": question.question, "options": question.options},
            )

    def _offer_to_client(self, call: ToolCall) -> None:
        """A client tool: announced with a single-use token (only its hash is stored)."""
        token = secrets.token_urlsafe(32)
        waiting = store.start_waiting(self.rt.sessions, call.id, call.timeout_s, hash_token(token))
        if waiting is not None:
            self.emit(
                "tool_call_started",
                {
                    "call_id": call.id,
                    "tool": call.tool,
                    "input": call.input,
                    "timeout_s": call.timeout_s,
                    "executor": "client",
                    "token": token,
                },
            )

    def _start_inline(self, call: ToolCall) -> None:
        for started in store.mark_running(self.rt.sessions, [call.id]):
            self.emit(
                "tool_call_started",
                {
                    "call_id": started.id,
                    "tool": started.tool,
                    "input": started.input,
                    "timeout_s": started.timeout_s,
                    "executor": "server",
                },
            )

    def _run_child(self, call: ToolCall) -> str | None:
        """spawn_agent: run (or resume) the child turn here; its final answer is the result."""
        task = SpawnAgentInput.model_validate(call.input).task
        child_id = store.child_turn(self.rt.sessions, self.info, call.id, task)
        info = store.load_turn(self.rt.sessions, child_id)
        assert info is not None
        runner = TurnRunner(self.rt, info, self.lease, self.cancel, self.root_turn_id)
        try:
            runner.run()
        except LeaseLost:
            raise
        except Exception as exc:
            log.exception("sub-agent turn %s failed", child_id)
            runner.finish("failed", error=f"{type(exc).__name__}: {exc}")
        child = store.get_turn(self.rt.sessions, child_id)
        if child.status == "cancelled" and self._cancelled(force=True):
            return "cancelled"
        answer = store.final_text(self.rt.sessions, child_id)
        if child.status == "completed":
            self._record(call, "ok", answer or "(the sub-agent gave no answer)", None)
        else:
            why = f"the sub-agent ended {child.status}" + (
                f": {child.error}" if child.error else ""
            )
            self._record(call, "error", answer, why)
        return None

    def _dispatch(self, pending: Sequence[ToolCall]) -> None:
        """Send the step's calls as one group, then mark them running and announce them.

        Sent before marked: if this runner dies in between, the next one finds the calls
        still pending and sends them again; the tool worker's claim on the call id skips
        the duplicate, and the first run's result is on the results stream all the same.
        (Marked first, a death in between would leave calls that were never sent, lost.)
        """
        catalogue = self.rt.catalogue()
        self._specs.update(catalogue)
        for call in pending:
            if call.tool not in catalogue:
                self._record(call, "error", "", f"no live tool worker serves {call.tool!r} now")
        sendable = sorted((c for c in pending if c.tool in catalogue), key=lambda c: c.position)
        self.rt.dispatcher.send([(self._call_request(c), catalogue[c.tool]) for c in sendable])
        for call in store.mark_running(self.rt.sessions, [c.id for c in sendable]):
            self.emit(
                "tool_call_started",
                {
                    "call_id": call.id,
                    "tool": call.tool,
                    "input": call.input,
                    "timeout_s": call.timeout_s,
                    "executor": "server",
                },
            )

    def _call_request(self, call: ToolCall) -> ToolCallRequest:
        return ToolCallRequest(
            call_id=call.id,
            turn_id=self.info.turn_id,
            conversation_id=self.info.conversation_id,
            user_id=self.info.user_id,
            workspace=self.info.workspace,
            tool=call.tool,
            input=call.input,
            timeout_s=call.timeout_s,
        )

    def _retry(self, call: ToolCall) -> ToolCall | None:
        """Send a call again whose worker vanished, if its tool is idempotent (else None).

        Running an idempotent tool twice is harmless by its own declaration, so the model
        gets a real result instead of ``lost``; any other call could have taken effect.
        """
        # Also the specs this runner saw: the workers may be gone from the catalogue now.
        spec = self.rt.catalogue().get(call.tool) or self._specs.get(call.tool)
        if spec is None or not spec.idempotent or call.attempts >= MAX_IDEMPOTENT_ATTEMPTS:
            return None
        retried = store.retry_call(self.rt.sessions, call.id, call.attempts)
        if retried is None:
            return None
        log.warning(
            "turn %s: no result for idempotent call %s (%s); sending it again (attempt %d)",
            self.info.turn_id,
            call.id,
            call.tool,
            retried.attempts,
        )
        self.rt.dispatcher.send([(self._call_request(retried), spec)])
        return retried

    def _gather(self, running: Sequence[ToolCall]) -> str | None:
        """All-settled: each call ends with its result, or ``lost`` at its own deadline.

        Reads the turn's result stream from the start, so results published while no
        runner was listening (a resumed turn) are found too.
        """
        grace_s = self.rt.settings.tool_grace_s
        waiting = {c.id: c for c in running}

        def deadline_of(c: ToolCall) -> float:
            return store.as_utc(c.started_at or store.utcnow()).timestamp() + c.timeout_s + grace_s

        deadline = {c.id: deadline_of(c) for c in running}
        key = self.rt.keys.tool_results(self.info.turn_id)
        last_id = "0-0"
        while waiting:
            self.lease.check()
            if self._cancelled():
                return "cancelled"
            # What already arrived counts before any deadline is judged: a resumed runner,
            # or one back from a long sub-agent, must not call a delivered result lost.
            last_id = self._take_results(key, last_id, waiting, block_ms=None)
            now = time.time()
            for call_id in [cid for cid in waiting if deadline[cid] <= now]:
                retried = self._retry(waiting[call_id])
                if retried is not None:
                    waiting[call_id] = retried
                    deadline[call_id] = deadline_of(retried)
                    continue
                call = waiting.pop(call_id)
                self._record(
                    call,
                    "lost",
                    "",
                    f"no result within {call.timeout_s:g} s + {grace_s:g} s grace: the tool "
                    "worker vanished; the call may or may not have taken effect",
                )
            if not waiting:
                break
            wait_s = min(max(min(deadline[c] for c in waiting) - now, 0.001), self.rt.poll_s)
            last_id = self._take_results(key, last_id, waiting, max(1, int(wait_s * 1000)))
        return None

    def _take_results(
        self, key: str, last_id: str, waiting: dict[str, ToolCall], block_ms: int | None
    ) -> str:
        """Record the results after ``last_id`` (blocking up to ``block_ms`` for the first)."""
        while True:
            reply: Any = self.rt.redis.xread({key: last_id}, block=block_ms, count=RESULTS_PER_READ)
            read = 0
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    read += 1
                    last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    raw = fields.get(b"r", fields.get("r"))
                    try:
                        result = ToolResult.model_validate_json(raw)
                    except (ValidationError, TypeError):
                        log.warning("turn %s: unreadable tool result %r", self.info.turn_id, raw)
                        continue
                    done = waiting.pop(result.call_id, None)
                    if done is not None:
                        self._record(
                            done, result.status, result.output, result.error, result.duration_ms
                        )
            if read < RESULTS_PER_READ:
                return last_id
            block_ms = None  # a full batch: more may be there already

    # -- the end -----------------------------------------------------------------------

    def finish(self, status: str, error: str | None = None) -> str:
        """End the turn: open calls are cancelled, then ``turn_finished``."""
        closing = store.open_calls(self.rt.sessions, self.info.turn_id)
        for call in closing:
            reason = None if status == "cancelled" else f"the turn ended ({status})"
            self._record(call, "cancelled", "", reason)
        in_flight = [c.id for c in closing if c.status == "running"]
        if in_flight:
            try:
                self.rt.dispatcher.revoke(in_flight)
            except Exception:  # revoking is best effort; the calls are already recorded
                log.warning("turn %s: could not revoke %s", self.info.turn_id, in_flight)
        turn = store.finish_turn(
            self.rt.sessions,
            self.info.turn_id,
            status,
            error,
            usage_to=self.root_turn_id if self.child else None,  # the parent pays for its child
        )
        if turn is not None:
            self.emit(
                "turn_finished",
                {
                    "status": status,
                    "steps": turn.step,
                    "usage": {
                        "input_tokens": turn.input_tokens,
                        "output_tokens": turn.output_tokens,
                    },
                    "error": error,
                },
            )
        return status


def _rfc3339(value: Any) -> str:
    return str(store.as_utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z"))
