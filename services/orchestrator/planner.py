"""The agent's tool planner: a cheap first model call picks which tools a turn needs.

With 40 tools offered, every step's request carries 40 definitions the model must read and
pay for. When the agent has ``planner`` on, the turn's first pass asks the planner model
(``SIGNALBOX_PLANNER_MODEL``, a small one) with the user's text and each tool's name and
description to call ``select_tools`` with the names it needs. Only those are offered for
the rest of the turn, and a ``tools_selected`` event says which.

The choice is kept with the turn (``turns.tools_selected``), so a resumed or parked turn
offers the same tools without asking again. The planner never stops a turn: no answer, a
text answer, bad input or a model error all fall back to every tool (``fallback: true``).
Its request is billed like any other, with purpose ``planner`` (``usage.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from signalbox.services.orchestrator import metrics, store, usage
from signalbox.services.orchestrator.model import ModelRequest, StepEnd, ToolDef, ToolUse
from signalbox.shared.db.models import ModelRequest as RequestRow
from signalbox.shared.events import ToolsSelected

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

log = logging.getLogger(__name__)

SELECT_TOOLS = "select_tools"
PLANNER_MAX_TOKENS = 1024  # a list of names; more is a planner that rambles
DESCRIPTION_CHARS = 300  # of each tool's description in the planner's prompt

PLANNER_SYSTEM = (
    "You choose the tools an agent needs for the user's request. Call select_tools once "
    "with the names of every tool the agent is likely to need, and no others. When unsure "
    "whether a tool is needed, include it. An empty list means no tool is needed."
)

SELECT_TOOLS_DEF = ToolDef(
    name=SELECT_TOOLS,
    description="The tools the agent needs for this request, by name.",
    input_schema={
        "type": "object",
        "properties": {
            "tools": {
                "type": "array",
                "items": {"type": "string"},
                "description": "names of the needed tools, from the list given",
            }
        },
        "required": ["tools"],
    },
)


class _Offered(Protocol):
    @property
    def tool_def(self) -> ToolDef: ...


OfferT = TypeVar("OfferT", bound=_Offered)


def selected(runner: TurnRunner, offered: Mapping[str, OfferT]) -> dict[str, OfferT]:
    """``offered`` narrowed to the planner's choice for this turn (asked on first use)."""
    if runner.child or not runner.agent.planner or not offered:
        return dict(offered)
    sessions, turn_id = runner.rt.sessions, runner.info.turn_id
    chosen = store.tools_selected(sessions, turn_id)
    if chosen is None:
        picked, row = ask(runner, offered)
        fallback = picked is None
        names = sorted(offered) if picked is None else picked
        chosen = store.save_tools_selected(sessions, turn_id, names, row)
        event = ToolsSelected(tools=chosen, offered=len(offered), fallback=fallback)
        runner.emit("tools_selected", event)
    keep = set(chosen)
    return {name: offer for name, offer in offered.items() if name in keep}


def planner_request(text: str, offered: Mapping[str, _Offered], model: str) -> ModelRequest:
    """The planner's request: the user's text and the tools to choose from."""
    lines = []
    for name in sorted(offered):
        description = " ".join(offered[name].tool_def.description.split())
        lines.append(f"- {name}: {description[:DESCRIPTION_CHARS]}")
    prompt = f"Tools:\n{chr(10).join(lines)}\n\nThe user's request:\n{text}"
    return ModelRequest(
        system=PLANNER_SYSTEM,
        messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}],
        tools=[SELECT_TOOLS_DEF],
        max_tokens=PLANNER_MAX_TOKENS,
        model=model,
    )


def parse_choice(uses: list[ToolUse], offered: Mapping[str, Any]) -> list[str] | None:
    """The offered names the planner's ``select_tools`` call named, or None if it made no
    usable call (names it made up are dropped; an explicit empty list is kept)."""
    for use in uses:
        if use.name != SELECT_TOOLS:
            continue
        names = use.input.get("tools")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return None
        known = {n for n in names if n in offered}
        if names and not known:
            return None  # only made-up names: not a usable answer
        return sorted(known)
    return None


def ask(
    runner: TurnRunner, offered: Mapping[str, _Offered]
) -> tuple[list[str] | None, RequestRow | None]:
    """Ask the planner model; the chosen names (None: fall back) and its usage row."""
    sent = planner_request(runner.info.text, offered, runner.rt.settings.planner_model)
    uses: list[ToolUse] = []
    end: StepEnd | None = None
    try:
        stream = metrics.model_stream(runner.rt.model, sent, "planner")
        try:
            for event in stream:
                if isinstance(event, ToolUse):
                    uses.append(event)
                elif isinstance(event, StepEnd):
                    end = event
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    except Exception as exc:  # the planner only narrows: any failure offers every tool
        log.warning("turn %s: the tool planner failed: %s", runner.info.turn_id, exc)
        return None, None
    row = None
    if end is not None:
        row = usage.request_row(runner, end.model or sent.model, end, "planner")
    return parse_choice(uses, offered), row
