"""One model step: offer the tools, send the transcript, stream the answer, store the calls.

The request is built from the runner's transcript (``running_transcript.py``: read from SQL
at its first step, kept in memory after) and fitted to the context budget
(``context_budget.py``). The notes on decided proposals are read again only when the
approvals feed (``approvals.py``) can't vouch that none was decided since this runner's
previous step (see ``proposal_notes``). Text deltas go to the event stream as they arrive. Each
``tool_use`` of the answer is planned against the offers and the tool policy: a call to run
(``pending``), one that needs a human decision first, or one that ends at once (unknown
tool, bad input, denied). The step and its calls are committed together; running them is
the state machine's next move (``turn_runner.py``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from signalbox.services.orchestrator import (
    compaction,
    hooks,
    metrics,
    plan_graph,
    planner,
    spans,
    store,
    usage,
)
from signalbox.services.orchestrator.agent_tools import agent_offers, cap_sub_agents
from signalbox.services.orchestrator.approvals import Stamp
from signalbox.services.orchestrator.builtin_tools import (
    ALARM,
    ASK_USER,
    BUILTIN_DEFS,
    RUN_PLAN,
    RUN_PLAN_TIMEOUT_S,
    SPAWN_AGENT,
    SPAWN_AGENT_TIMEOUT_S,
    AlarmInput,
    AskUserInput,
    SpawnAgentInput,
    client_tools,
    input_problem,
)
from signalbox.services.orchestrator.context_budget import (
    blocks,
    estimate_tokens,
    fit,
    json_bytes,
    surely_fits,
)
from signalbox.services.orchestrator.context_window import input_budget, window_tokens
from signalbox.services.orchestrator.model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    PromptTooLong,
    StepEnd,
    StepRetry,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolDef,
    ToolUse,
)
from signalbox.services.orchestrator.policy import Decision, with_agent
from signalbox.services.orchestrator.store import CLIENT, INLINE, SERVER, PlannedCall
from signalbox.services.orchestrator.text_deltas import DeltaBuffer
from signalbox.services.orchestrator.transcript import (
    OPEN_CALL_STATUSES,
    ProposalNotes,
    load_proposal_notes,
)
from signalbox.shared.agents import AgentSpec
from signalbox.shared.db.models import ToolCall
from signalbox.shared.events import EventKind, tool_call_finished
from signalbox.shared.timestamps import rfc3339
from signalbox.shared.tool_contract import ApprovalMode

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

log = logging.getLogger(__name__)

UNKNOWN_TOOL_TIMEOUT_S = 0.0
# Proposals are read again at least this often, even if the feed heard nothing: a connection
# that died without a sound (no reset) would otherwise keep a step from seeing a decision.
NOTES_MAX_AGE_S = 30.0


@dataclass(frozen=True)
class Offer:
    """A tool as offered to the model in one step, with how its calls are run."""

    tool_def: ToolDef
    executor: str  # store.SERVER | store.CLIENT | store.INLINE
    timeout_s: float
    mode: ApprovalMode


@dataclass
class NotesCache:
    """The proposal notes a runner's previous step read, with the feed's stamp then."""

    stamp: Stamp | None = None
    read_at: float = 0.0
    notes: ProposalNotes = field(default_factory=dict)


def proposal_notes(runner: TurnRunner, db: Session | Connection) -> ProposalNotes:
    """The notes on the conversation's decided proposals, from SQL unless nothing changed.

    "Nothing changed": the approvals feed is live and its stamp for the conversation is the
    one taken before the previous read (so nothing was decided since, or it would have been
    heard), and that read is younger than ``NOTES_MAX_AGE_S``. Without a live feed, every
    step reads SQL. The stamp is taken before the read, so a decision heard during the read
    makes the next step read again.
    """
    cache = runner.notes
    feed = runner.rt.approvals
    stamp = feed.stamp(runner.info.conversation_id) if feed is not None else None
    now = time.monotonic()
    if stamp is not None and stamp == cache.stamp and now - cache.read_at < NOTES_MAX_AGE_S:
        return cache.notes
    cache.notes = load_proposal_notes(db, runner.info.conversation_id)
    cache.stamp, cache.read_at = stamp, now
    return cache.notes


def offers(runner: TurnRunner) -> dict[str, Offer]:
    """What the model may call this step: what the deployment offers, as the turn's agent
    may see it (``agent_tools.py``), narrowed to its planner's choice (``planner.py``)."""
    return planner.selected(runner, agent_offers(runner.agent, deployment_offers(runner)))


def deployment_offers(runner: TurnRunner) -> dict[str, Offer]:
    """Every tool of the deployment: the live catalogue (read-only tools alone for a
    sub-agent), then the built-in tools, then the client's own tools."""
    found: dict[str, Offer] = {}
    for spec in runner.catalogue().values():
        if runner.child and spec.side_effect != "read":
            continue
        definition = ToolDef(spec.name, spec.description, spec.input_schema)
        found[spec.name] = Offer(definition, SERVER, spec.timeout_s, spec.mode)
    if runner.child:
        return found
    for definition in BUILTIN_DEFS.values():
        wait_s = {
            ASK_USER: runner.rt.settings.decision_ttl_s,
            RUN_PLAN: RUN_PLAN_TIMEOUT_S,
        }.get(definition.name, SPAWN_AGENT_TIMEOUT_S)
        found[definition.name] = Offer(definition, INLINE, wait_s, "auto")
    for tool in client_tools(runner.info.client_tools, found).values():
        found[tool.name] = Offer(tool.as_def(), CLIENT, tool.timeout_s, "auto")
    return found


def request(runner: TurnRunner, offered: dict[str, Offer], harder: bool = False) -> ModelRequest:
    """The Messages-API request of the next step: the transcript as SQL has it now, its
    older turns compacted if it would not fit the context window (``harder``: all of them,
    after the API said it was too long)."""
    settings = runner.rt.settings
    system = runner.agent.system_prompt  # the turn's agent's (shared/agents.py)
    notes: ProposalNotes = {}
    with store.standalone_connection(runner.rt.sessions) as conn:
        # A sub-agent proposes nothing: it has read-only tools alone, and no notes.
        notes = {} if runner.child else proposal_notes(runner, conn)
        # Read from SQL at the runner's first step, kept in memory after (see the module).
        messages = runner.transcript.sent(conn, notes)
    tools = [offered[name].tool_def for name in sorted(offered)]
    # Shallow: the schemas are only read (``asdict`` deep-copied them, each step).
    tool_dicts = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in tools
    ]
    counter = runner.rt.tokens  # exact, each block counted once (token_count.py), or None
    window = window_tokens(runner.agent.model, settings.context_window_tokens)
    fits = input_budget(window, output_tokens(runner.agent))
    budget, cap = min(settings.context_tokens, fits), settings.tool_output_max_chars
    offered_now = _offered_measures(runner, system, tools, tool_dicts)
    fixed = offered_now.fixed_bytes
    if (
        counter is not None
        and not harder
        and fixed is not None
        and surely_fits(messages, budget, fixed)
    ):
        # Nothing will be cut whatever the count: the estimate decides the same, and the
        # step saves the API's count_tokens round trip.
        counter = None
    if counter is None:
        count = None
        overhead = estimate_tokens(system) + offered_now.tools_tokens
    else:
        count = counter.count
        counter.prime([system, *tool_dicts, *blocks(messages)])
        overhead = count(system) + sum(count(t) for t in tool_dicts)

    def size(sent: list[dict[str, Any]]) -> int:
        if count is None:
            return overhead + estimate_tokens(sent)
        return overhead + sum(count(b) for b in blocks(sent))

    if not runner.child and (harder or size(messages) > fits):
        compacted = compaction.compact(runner, notes, size, fits, harder)
        if compacted is not None:
            runner.transcript.reset()  # a new note: the next step reads from it
            messages = compacted
    return ModelRequest(
        system=system,
        messages=fit(messages, budget, cap, overhead, count),
        tools=tools,
        max_tokens=output_tokens(runner.agent),
        model=runner.agent.model,
        thinking_budget_tokens=runner.agent.thinking_budget_tokens,
    )


@dataclass(frozen=True)
class OfferedMeasures:
    """What a step's system prompt and tools cost, measured again only when they change:
    most of a request, the same at every step of a turn."""

    system: str
    tools: list[ToolDef]
    tools_tokens: int  # the tools' estimated tokens (``estimate_tokens``)
    fixed_bytes: int | None  # the JSON bytes of both (``json_bytes``, for ``surely_fits``)


def _offered_measures(
    runner: TurnRunner, system: str, tools: list[ToolDef], tool_dicts: list[dict[str, Any]]
) -> OfferedMeasures:
    kept = runner.offered_measures
    if kept is not None and kept.system == system and kept.tools == tools:
        return kept
    kept = OfferedMeasures(
        system, tools, estimate_tokens(tool_dicts), json_bytes([system, tool_dicts])
    )
    runner.offered_measures = kept
    return kept


def output_tokens(agent: AgentSpec) -> int:
    """``max_tokens`` of a step: the agent's output limit, plus its thinking budget when it
    thinks (the API counts thinking in ``max_tokens`` and wants it above the budget)."""
    budget = agent.thinking_budget_tokens
    return agent.max_output_tokens + (budget or 0)


def take_step(runner: TurnRunner) -> str | None:
    """Stream one answer of the model and commit it with its calls; an outcome ends the run."""
    offered = offers(runner)
    texts: list[str] = []
    uses: list[ToolUse] = []
    thinking: list[dict[str, Any]] = []  # the step's thinking blocks, as the API sent them
    end: StepEnd | None = None
    cancelled = False
    buffer = DeltaBuffer(lambda text: runner.emit("text_delta", {"text": text}))
    thoughts = DeltaBuffer(lambda text: runner.emit("thinking_delta", {"text": text}))
    stream: Iterator[ModelEvent] = iter(())
    failure: ModelError | hooks.HookFailed | None = None
    try:
        sent = _edited(runner, request(runner, offered))
    except hooks.HookFailed as exc:  # a before_model hook refused: no request was made
        return runner.finish("failed", error=str(exc))
    with spans.chat(
        sent.model or runner.rt.model.name,
        spans.provider(runner.rt.model),
        sent.max_tokens,
        runner.info.conversation_id,
    ) as chat:
        try:
            sent, stream, events = _open(runner, offered, sent)
            end, cancelled = _read(runner, sent, events, texts, uses, thinking, buffer, thoughts)
        except (ModelError, hooks.HookFailed) as exc:  # HookFailed: a before_model hook's
            failure = exc
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # stops an unfinished HTTP stream
        spans.chat_ended(chat, end, cancelled, failure)
    if failure is not None:
        thoughts.flush()
        buffer.flush()
        return runner.finish("failed", error=str(failure))
    return _store(runner, offered, sent, end, cancelled, texts, uses, thinking, buffer, thoughts)


def _read(
    runner: TurnRunner,
    sent: ModelRequest,
    events: Iterator[ModelEvent],
    texts: list[str],
    uses: list[ToolUse],
    thinking: list[dict[str, Any]],
    buffer: DeltaBuffer,
    thoughts: DeltaBuffer,
) -> tuple[StepEnd | None, bool]:
    """Take the answer's events as they stream: (the step's end, whether it was cancelled)."""
    end: StepEnd | None = None
    for event in events:
        if runner.cancel.is_set():
            return end, True
        runner.lease.check()
        if isinstance(event, TextDelta):
            thoughts.flush()  # the thinking shown before the text it led to
            texts.append(event.text)
            buffer.add(event.text)
        elif isinstance(event, ThinkingDelta):
            thoughts.add(event.text)
        elif isinstance(event, ThinkingBlock):
            thinking.append(event.block)
        elif isinstance(event, ToolUse):
            uses.append(event)
        elif isinstance(event, StepRetry):
            thoughts.flush()
            buffer.flush()
            texts.clear()
            uses.clear()
            thinking.clear()
            usage.record(runner, usage.retried_row(runner, sent.model, event))
        elif isinstance(event, StepEnd):
            end = event
    return end, False


def _store(
    runner: TurnRunner,
    offered: dict[str, Offer],
    sent: ModelRequest,
    end: StepEnd | None,
    cancelled: bool,
    texts: list[str],
    uses: list[ToolUse],
    thinking: list[dict[str, Any]],
    buffer: DeltaBuffer,
    thoughts: DeltaBuffer,
) -> str | None:
    """Commit what the step streamed, with its calls planned; an outcome ends the run."""
    text = "".join(texts)
    sessions, info = runner.rt.sessions, runner.info
    if cancelled or end is None:
        thoughts.flush()
        buffer.flush()
    if cancelled:
        # Billed all the same; the stream was cut before the API said how much (estimated).
        row = usage.cancelled_row(runner, sent, text)
        if text:  # the partial answer stays in the transcript
            runner.transcript.stored(*store.store_step(sessions, info, text, [], 0, 0, row))
            runner.emit("assistant_message", {"text": text})
        else:
            usage.record(runner, row)
        return runner.finish("cancelled")
    if end is None:
        return runner.finish("failed", error="the model stream ended without finishing the step")
    row = usage.request_row(runner, end.model or sent.model or runner.rt.model.name, end)
    try:
        runner.rt.hooks.after_model(hooks.context(runner), text, uses)
    except hooks.HookFailed as exc:
        thoughts.flush()
        buffer.flush()
        usage.record(runner, row)  # billed all the same
        return runner.finish("failed", error=str(exc))
    planned = cap_sub_agents(runner, [plan(runner, use, offered) for use in uses])
    # The step's last deltas, its message and its calls' events go out together, in one
    # Redis round trip after the commit; their webhook deliveries commit with the step.
    shown: list[tuple[EventKind, Mapping[str, Any] | BaseModel]] = []
    thought, said = thoughts.take(), buffer.take()
    if thought:
        shown.append(("thinking_delta", {"text": thought}))
    if said:
        shown.append(("text_delta", {"text": said}))
    shown.append(("assistant_message", {"text": text}))
    events: list[tuple[EventKind, Mapping[str, Any]]] = []

    def deliveries(conn: Connection, calls: Sequence[ToolCall]) -> None:
        step_events = [*shown, *_call_events(calls)]
        events.extend(runner.payloads(step_events))
        runner.enqueue_hooks(conn, events)

    # No webhook subscribed to what the step may announce: its writes go alone.
    kinds = {kind for kind, _data in shown} | {"tool_call_needs_decision", "tool_call_finished"}
    hooked = not kinds.isdisjoint(runner.webhook_kinds())
    msg, calls = store.store_step(
        sessions,
        info,
        text,
        planned,
        end.input_tokens,
        end.output_tokens,
        row,
        thinking,
        then=deliveries if hooked else None,
    )
    if not hooked:
        events.extend(runner.payloads([*shown, *_call_events(calls)]))
    runner.transcript.stored(msg, calls)
    for call in calls:
        if call.status not in OPEN_CALL_STATUSES:
            runner.call_ended(call)
    runner.append_events(events)
    runner.stepped(msg, calls)
    return None


def _call_events(
    calls: Sequence[ToolCall],
) -> list[tuple[EventKind, Mapping[str, Any] | BaseModel]]:
    """The events of calls just stored: a decision asked for, or an end met at once."""
    events: list[tuple[EventKind, Mapping[str, Any] | BaseModel]] = []
    for call in calls:
        if call.status == "needs_decision":
            assert call.expires_at is not None
            events.append(
                (
                    "tool_call_needs_decision",
                    {
                        "call_id": call.id,
                        "tool": call.tool,
                        "input": call.input,
                        "expires_at": rfc3339(call.expires_at),
                    },
                )
            )
        elif call.status not in OPEN_CALL_STATUSES:
            finished = tool_call_finished(
                call.id, call.tool, call.status, call.output, call.error, call.duration_ms, 0
            )
            events.append(("tool_call_finished", finished))
    return events


def announce(runner: TurnRunner, calls: Sequence[ToolCall]) -> None:
    """The events of calls just stored: a decision asked for, or an end met at once."""
    for call in calls:
        if call.status not in OPEN_CALL_STATUSES:
            runner.call_ended(call)
    runner.emit_many(_call_events(calls))


def _open(
    runner: TurnRunner, offered: dict[str, Offer], sent: ModelRequest
) -> tuple[ModelRequest, Iterator[ModelEvent], Iterator[ModelEvent]]:
    """Send the step's request ``sent`` (the stream's first event sends it); the API finding
    it too long gets it once more, compacted harder. The request, its stream, its events."""
    purpose = "sub_agent" if runner.child else "step"
    stream = metrics.model_stream(runner.rt.model, sent, purpose)
    try:
        first = next(stream, None)
    except PromptTooLong:
        if runner.child:
            raise
        log.warning("turn %s: the prompt was too long; compacting harder", runner.info.turn_id)
        sent = _edited(runner, request(runner, offered, harder=True))
        stream = metrics.model_stream(runner.rt.model, sent, purpose)
        first = next(stream, None)
    head = [] if first is None else [first]
    return sent, stream, itertools.chain(head, stream)


def plan_tools(offered: dict[str, Offer]) -> list[str]:
    """The tools a ``run_plan`` step may call: those of the tool workers offered this step
    (not the built-in ones, nor a client's: a plan runs on the server alone)."""
    return [name for name, offer in offered.items() if offer.executor == SERVER]


def _edited(runner: TurnRunner, sent: ModelRequest) -> ModelRequest:
    """The request as the ``before_model`` hooks leave it (``HookFailed`` if one refused)."""
    if not runner.rt.hooks.has("before_model"):
        return sent
    return runner.rt.hooks.before_model(hooks.context(runner), sent)


def plan(runner: TurnRunner, use: ToolUse, offered: dict[str, Offer]) -> PlannedCall:
    """What becomes of one ``tool_use``: its executor, time limit and first status."""
    offer = offered.get(use.name)
    if offer is None:
        why = f"unknown tool {use.name!r}"
        if runner.child:
            why += " (a sub-agent has read-only tools alone)"
        return PlannedCall(use, UNKNOWN_TOOL_TIMEOUT_S, "error", why)
    # The hooks first, so the tool policy judges the input that would run (a rewrite too).
    try:
        use, refused = runner.rt.hooks.before_tool(hooks.context(runner), use)
    except hooks.HookFailed as exc:
        return PlannedCall(use, offer.timeout_s, "denied", f"denied: {exc}", offer.executor)
    if refused is not None:
        error = f"denied by a hook: {refused}"
        return PlannedCall(use, offer.timeout_s, "denied", error, offer.executor)
    shapes: dict[str, type[BaseModel]] = {
        ASK_USER: AskUserInput,
        SPAWN_AGENT: SpawnAgentInput,
        ALARM: AlarmInput,
    }
    shape = shapes.get(use.name)
    if offer.executor == INLINE and shape is not None:
        problem = input_problem(shape, use.input)
        if problem is not None:
            return PlannedCall(use, offer.timeout_s, "error", problem, offer.executor)
    if use.name == RUN_PLAN:
        try:  # refused whole before anything runs: the model is told what is wrong
            plan_graph.check(use.input, plan_tools(offered))
        except plan_graph.BadPlan as exc:
            return PlannedCall(use, offer.timeout_s, "error", str(exc), offer.executor)
    try:
        decision = runner.rt.policy.decide(use.name, use.input, offer.mode)
        decision = with_agent(decision, use.name, runner.agent.approval)
    except Exception as exc:  # a decision never fails open
        log.exception("tool policy failed on %s", use.name)
        decision = Decision("deny", f"the tool policy could not be applied ({exc!r})")
    if decision.verdict == "deny":
        error = f"denied by the tool policy: {decision.reason}"
        return PlannedCall(use, offer.timeout_s, "denied", error, offer.executor)
    if decision.verdict == "confirm":
        if runner.child:
            error = f"a sub-agent cannot wait for a human decision ({decision.reason})"
            return PlannedCall(use, offer.timeout_s, "denied", error, offer.executor)
        return PlannedCall(
            use,
            offer.timeout_s,
            "needs_decision",
            executor=offer.executor,
            decision_ttl_s=runner.rt.settings.decision_ttl_s,
        )
    return PlannedCall(use, offer.timeout_s, "pending", executor=offer.executor)
