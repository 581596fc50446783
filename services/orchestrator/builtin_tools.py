"""Tools the orchestrator runs itself, never on a tool worker: ``ask_user`` and ``spawn_agent``,
and the tools a client declared on its ``user_turn``.

``ask_user`` parks the turn until the human answers (the ``answer`` frame); ``spawn_agent``
runs a read-only child turn inline, under the parent's lease; a client tool parks the turn
until the client sends ``tool_result``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from services.orchestrator.model import ToolDef
from shared.protocol import ClientToolSpec

ASK_USER = "ask_user"
SPAWN_AGENT = "spawn_agent"
SPAWN_AGENT_TIMEOUT_S = 0.0  # not a worker deadline: the child is bounded by its step limit

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

BUILTIN_DEFS = {d.name: d for d in (ASK_USER_DEF, SPAWN_AGENT_DEF)}


class AskUserInput(BaseModel):
    """Input of ``ask_user``."""

    question: str = Field(min_length=1)
    options: list[str] | None = None


class SpawnAgentInput(BaseModel):
    """Input of ``spawn_agent``."""

    task: str = Field(min_length=1)


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
