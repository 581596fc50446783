"""One model step: offer the tools, send the transcript, stream the answer, store the calls.

The request is built from SQL (``transcript.py``) and fitted to the context budget
(``context_budget.py``). The notes on decided proposals are read again only when the
approvals feed (``approvals.py``) can't vouch that none was decided since this runner's
previous step (see ``proposal_notes``). Text deltas go to the event stream as they arrive. Each
``tool_use`` of the answer is planned against the offers and the tool policy: a call to run
(``pending``), one that needs a human decision first, or one that ends at once (unknown
tool, bad input, denied). The step and its calls are committed together; running them is
the state machine's next move (``turn_runner.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from sqlalchemy.orm import Session

from services.orchestrator import store, usage
from services.orchestrator.approvals import Stamp
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
from services.orchestrator.context_budget import blocks, estimate_tokens, fit
from services.orchestrator.model import (
    ModelError,
    ModelRequest,
    StepEnd,
    StepRetry,
    TextDelta,
    ToolDef,
    ToolUse,
)
from services.orchestrator.policy import Decision
from services.orchestrator.store import CLIENT, INLINE, SERVER, PlannedCall
from services.orchestrator.text_deltas import DeltaBuffer
from services.orchestrator.transcript import (
    OPEN_CALL_STATUSES,
    ProposalNotes,
    load_messages,
    load_proposal_notes,
)
from shared.db.models import as_utc
from shared.tool_contract import ApprovalMode

if TYPE_CHECKING:
    from services.orchestrator.turn_runner import TurnRunner

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


def proposal_notes(runner: TurnRunner, session: Session) -> ProposalNotes:
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
    cache.notes = load_proposal_notes(session, runner.info.conversation_id)
    cache.stamp, cache.read_at = stamp, now
    return cache.notes


def offers(runner: TurnRunner) -> dict[str, Offer]:
    """What the model may call this step: the live catalogue (read-only tools alone for a
    sub-agent), then the built-in tools, then the client's own tools."""
    found: dict[str, Offer] = {}
    for spec in runner.rt.catalogue().values():
        if runner.child and spec.side_effect != "read":
            continue
        definition = ToolDef(spec.name, spec.description, spec.input_schema)
        found[spec.name] = Offer(definition, SERVER, spec.timeout_s, spec.mode)
    if runner.child:
        return found
    for definition in BUILTIN_DEFS.values():
        wait_s = (
            runner.rt.settings.decision_ttl_s
            if definition.name == ASK_USER
            else SPAWN_AGENT_TIMEOUT_S
        )
        found[definition.name] = Offer(definition, INLINE, wait_s, "auto")
    for tool in client_tools(runner.info.client_tools, found).values():
        found[tool.name] = Offer(tool.as_def(), CLIENT, tool.timeout_s, "auto")
    return found


def request(runner: TurnRunner, offered: dict[str, Offer]) -> ModelRequest:
    """The Messages-API request of the next step: the transcript as SQL has it now."""
    settings = runner.rt.settings
    with runner.rt.sessions() as s:
        if runner.child:  # a sub-agent proposes nothing: it has read-only tools alone
            messages = load_messages(s, runner.info.conversation_id, runner.info.turn_id, {})
        else:
            messages = load_messages(
                s, runner.info.conversation_id, notes=proposal_notes(runner, s)
            )
    tools = [offered[name].tool_def for name in sorted(offered)]
    counter = runner.rt.tokens  # exact, each block counted once (token_count.py), or None
    if counter is None:
        count = None
        overhead = estimate_tokens(settings.system_prompt)
        overhead += estimate_tokens([asdict(t) for t in tools])
    else:
        count = counter.count
        tool_dicts = [asdict(t) for t in tools]
        counter.prime([settings.system_prompt, *tool_dicts, *blocks(messages)])
        overhead = count(settings.system_prompt) + sum(count(t) for t in tool_dicts)
    budget, cap = settings.context_tokens, settings.tool_output_max_chars
    return ModelRequest(
        system=settings.system_prompt,
        messages=fit(messages, budget, cap, overhead, count),
        tools=tools,
        max_tokens=settings.max_tokens,
        model=settings.model,
    )


def take_step(runner: TurnRunner) -> str | None:
    """Stream one answer of the model and commit it with its calls; an outcome ends the run."""
    offered = offers(runner)
    texts: list[str] = []
    uses: list[ToolUse] = []
    end: StepEnd | None = None
    cancelled = False
    buffer = DeltaBuffer(lambda text: runner.emit("text_delta", {"text": text}))
    sent = request(runner, offered)
    stream = runner.rt.model.stream(sent)
    try:
        for event in stream:
            if runner.cancel.is_set():
                cancelled = True
                break
            runner.lease.check()
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
        return runner.finish("failed", error=str(exc))
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # stops an unfinished HTTP stream
    buffer.flush()
    text = "".join(texts)
    sessions, info = runner.rt.sessions, runner.info
    if cancelled:
        if text:  # the partial answer stays in the transcript
            store.store_step(sessions, info, text, [], 0, 0)
            runner.emit("assistant_message", {"text": text})
        return runner.finish("cancelled")
    if end is None:
        return runner.finish("failed", error="the model stream ended without finishing the step")
    planned = [plan(runner, use, offered) for use in uses]
    row = usage.request_row(runner, end.model or sent.model or runner.rt.model.name, end)
    _msg, calls = store.store_step(
        sessions, info, text, planned, end.input_tokens, end.output_tokens, row
    )
    runner.emit("assistant_message", {"text": text})
    for call in calls:
        if call.status == "needs_decision":
            assert call.expires_at is not None
            runner.emit(
                "tool_call_needs_decision",
                {
                    "call_id": call.id,
                    "tool": call.tool,
                    "input": call.input,
                    "expires_at": _rfc3339(call.expires_at),
                },
            )
        elif call.status not in OPEN_CALL_STATUSES:
            runner.finished(call)
    return None


def plan(runner: TurnRunner, use: ToolUse, offered: dict[str, Offer]) -> PlannedCall:
    """What becomes of one ``tool_use``: its executor, time limit and first status."""
    offer = offered.get(use.name)
    if offer is None:
        why = f"unknown tool {use.name!r}"
        if runner.child:
            why += " (a sub-agent has read-only tools alone)"
        return PlannedCall(use, UNKNOWN_TOOL_TIMEOUT_S, "error", why)
    shapes: dict[str, type[BaseModel]] = {ASK_USER: AskUserInput, SPAWN_AGENT: SpawnAgentInput}
    shape = shapes.get(use.name)
    if offer.executor == INLINE and shape is not None:
        problem = input_problem(shape, use.input)
        if problem is not None:
            return PlannedCall(use, offer.timeout_s, "error", problem, offer.executor)
    try:
        decision = runner.rt.policy.decide(use.name, use.input, offer.mode)
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


def _rfc3339(value: Any) -> str:
    return str(as_utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z"))
