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


@dataclass(frozen=True)
class TextDelta:
    """A piece of the step's text, as it streams."""

    text: str


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


ModelEvent = TextDelta | ToolUse | StepEnd | StepRetry


class ModelError(Exception):
    """The model could not produce a step (after the retries it is allowed)."""


class Model(Protocol):
    """Anything that can stream one step of the agent loop."""

    @property
    def name(self) -> str:
        """The model name reported in ``turn_started``."""
        ...

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        """Stream one step; ends with ``StepEnd`` or raises ``ModelError``."""
        ...
