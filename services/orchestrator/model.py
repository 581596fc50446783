"""The model interface the loop drives: one streamed step in, model events out.

The real implementation is ``anthropic_model.AnthropicModel``; ``demo_model.DemoModel`` is
the offline one. Tests script either the fake Messages API server or a ``Model`` of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolDef:
    """A tool as offered to the model."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    """One model step: the transcript so far (Anthropic content-block form) and the tools."""

    system: str
    messages: list[dict[str, Any]]
    tools: list[ToolDef] = field(default_factory=list)
    max_tokens: int = 4096
    model: str = ""
    # Extended thinking: the tokens the model may think with (None: no thinking asked for).
    # ``max_tokens`` must exceed it; ``model_step.request`` sees to that.
    thinking_budget_tokens: int | None = None


@dataclass(frozen=True)
class TextDelta:
    """A piece of the step's text, as it streams."""

    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    """A piece of the step's thinking, as it streams (extended thinking)."""

    text: str


@dataclass(frozen=True)
class ThinkingBlock:
    """One complete ``thinking`` (with its ``signature``) or ``redacted_thinking`` block,
    exactly as the API sent it: it goes back unchanged, or tool use cannot continue."""

    block: dict[str, Any]


@dataclass(frozen=True)
class ToolUse:
    """One complete ``tool_use`` block (its input fully assembled)."""

    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class StepEnd:
    """The step is over; the last event of a successful stream."""

    stop_reason: str | None
    input_tokens: int  # not read from the cache nor written to it
    output_tokens: int
    cache_creation_input_tokens: int = 0  # written to the prompt cache
    cache_read_input_tokens: int = 0  # read from the prompt cache
    model: str = ""  # the model that answered, as it names itself ("": the one asked for)


@dataclass(frozen=True)
class StepRetry:
    """The stream broke and the step starts again: discard what this step streamed so far."""

    attempt: int
    error: str
    # What the broken attempt was billed, as far as its stream told (usage by purpose).
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    model: str = ""


ModelEvent = TextDelta | ThinkingDelta | ThinkingBlock | ToolUse | StepEnd | StepRetry


class ModelError(Exception):
    """The model could not produce a step (after the retries it is allowed)."""


class PromptTooLong(ModelError):
    """The API refused the request as longer than the model's context window (a 400
    ``prompt is too long``): the step may compact harder and try once more."""


class Model(Protocol):
    """Anything that can stream one step of the agent loop."""

    @property
    def name(self) -> str:
        """The model name reported in ``turn_started``."""
        ...

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        """Stream one step; ends with ``StepEnd`` or raises ``ModelError``."""
        ...
