"""Tools the orchestrator runs itself, never on a tool worker: ``ask_user``, ``spawn_agent``,
``run_plan`` and ``alarm``, and the tools a client declared on its ``user_turn``.

``ask_user`` parks the turn until the human answers (the ``answer`` frame); ``spawn_agent``
runs a read-only child turn inline, under the parent's lease; a client tool parks the turn
until the client sends ``tool_result``; ``run_plan`` runs its steps as tool calls of the
turn (``plans.py``); ``alarm`` stores a wake-up the scheduler turns into a turn of the
conversation (``alarms.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import AwareDatetime, BaseModel, Field, ValidationError, model_validator

from signalbox.services.orchestrator.model import ToolDef
from signalbox.shared.protocol import ClientToolSpec

ASK_USER = "ask_user"
SPAWN_AGENT = "spawn_agent"
SPAWN_AGENT_TIMEOUT_S = 0.0  # not a worker deadline: the child is bounded by its step limit
RUN_PLAN = "run_plan"
RUN_PLAN_TIMEOUT_S = 0.0  # not a worker deadline: each step has its own tool's time limit
ALARM = "alarm"
# An alarm may be set at most this far ahead (a year and a day), and a note this long.
ALARM_MAX_AHEAD_S = 366 * 86_400
ALARM_NOTE_MAX_CHARS = 2_000

ASK_USER_DEF = ToolDef(
    name=ASK_USER,
    description=(
        "Ask the human a question and wait for the answer. Use it when you cannot go on "
        "without a choice or a fact only the human has. Offer options when the answer is "
        "one of a few."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "the question, self-contained"},
            "options": {
                "type": "array",
                "items": {"type": "string"},
                "description": "possible answers to choose from (optional)",
            },
        },
        "required": ["question"],
    },
)

SPAWN_AGENT_DEF = ToolDef(
    name=SPAWN_AGENT,
    description=(
        "Give a self-contained task to a sub-agent that can only read the workspace (no "
        "changes, no questions to the human). It works on its own and returns its final "
        "answer. Use it to research something without filling this conversation."
    ),
    input_schema={
        "type": "object",
        "properties": {"task": {"type": "string", "description": "what the sub-agent should do"}},
        "required": ["task"],
    },
)

RUN_PLAN_DEF = ToolDef(
    name=RUN_PLAN,
    description=(
        "Run several tool calls as one plan, in a single step: steps that do not depend on "
        "each other run in parallel, a step runs once the steps it refers to have ended, and "
        "a step whose dependency failed is skipped. Refer to an earlier step's result in a "
        "step's input as $steps.<save_as>.output (the output text), or "
        "$steps.<save_as>.output.key[0].field (a path into an output that is JSON). You get "
        "one result: every step's status and output. Use it when you already know the calls."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "save_as": {
                            "type": "string",
                            "description": "the step's name, for references (letters, digits, _)",
                        },
                        "tool": {"type": "string", "description": "the tool to call"},
                        "input": {"type": "object", "description": "the tool's input"},
                    },
                    "required": ["save_as", "tool", "input"],
                },
            }
        },
        "required": ["steps"],
    },
)

ALARM_DEF = ToolDef(
    name=ALARM,
    description=(
        "Set an alarm to wake yourself later in this conversation: at that time a new turn "
        "starts here with your note as its message, even if nobody writes. Give either `at` "
        "(an RFC 3339 time with its offset) or `in_minutes`, and a note that tells your "
        "future self what to do then. The result says when you will be woken."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "at": {"type": "string", "description": "when, RFC 3339: 2030-01-31T09:00:00+01:00"},
            "in_minutes": {"type": "number", "description": "or: how many minutes from now"},
            "note": {"type": "string", "description": "what to do when woken, self-contained"},
        },
        "required": ["note"],
    },
)

BUILTIN_DEFS = {d.name: d for d in (ASK_USER_DEF, SPAWN_AGENT_DEF, RUN_PLAN_DEF, ALARM_DEF)}


class AskUserInput(BaseModel):
    """Input of ``ask_user``."""

    question: str = Field(min_length=1)
    options: list[str] | None = None


class SpawnAgentInput(BaseModel):
    """Input of ``spawn_agent``."""

    task: str = Field(min_length=1)


class AlarmInput(BaseModel):
    """Input of ``alarm``: exactly one of ``at`` (with an offset) and ``in_minutes``."""

    at: AwareDatetime | None = None
    in_minutes: float | None = Field(default=None, gt=0, le=ALARM_MAX_AHEAD_S / 60)
    note: str = Field(min_length=1, max_length=ALARM_NOTE_MAX_CHARS)

    @model_validator(mode="after")
    def _one_time(self) -> AlarmInput:
        if (self.at is None) == (self.in_minutes is None):
            raise ValueError("give exactly one of at and in_minutes")
        return self


def input_problem(model: type[BaseModel], tool_input: Mapping[str, Any]) -> str | None:
    """Why ``tool_input`` does not fit ``model``, or None if it does."""
    try:
        model.model_validate(dict(tool_input))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "input"
        return f"bad input for the tool: {where}: {first['msg']}"
    return None


@dataclass(frozen=True)
class ClientTool:
    """A tool the turn's client runs itself."""

    name: str
    description: str
    input_schema: dict[str, Any]
    timeout_s: float

    def as_def(self) -> ToolDef:
        """How the model is offered it."""
        return ToolDef(self.name, self.description, self.input_schema)


def client_tools(
    declared: Iterable[Mapping[str, Any]], taken: Iterable[str]
) -> dict[str, ClientTool]:
    """The turn's client tools by name; names ``taken`` by server or built-in tools are skipped
    (a client cannot stand in for a tool of the deployment), as are malformed declarations."""
    names = set(taken)
    tools: dict[str, ClientTool] = {}
    for raw in declared:
        try:
            spec = ClientToolSpec.model_validate(dict(raw))
        except ValidationError:
            continue
        if spec.name in names or spec.name in tools:
            continue
        tools[spec.name] = ClientTool(
            spec.name, spec.description, dict(spec.input_schema), spec.timeout_s
        )
    return tools
