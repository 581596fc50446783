"""A typed registry of tools: each one a plain function declared once with ``@registry.tool``.

A tool takes its pydantic input model and a ``ToolContext`` and returns the text the model
reads. The JSON schema the model sees is the input model's ``model_json_schema()``, so the
signature, the validation and the published catalogue cannot drift apart.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import redis
from pydantic import BaseModel

from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings
from signalbox.shared.tool_contract import ApprovalMode, SideEffect, ToolSpec

DEFAULT_TIMEOUT_S = 30.0  # long enough for a slow disk, short enough that a turn keeps moving


class ToolError(Exception):
    """A failure the model should read and can act on (bad path, no match, conflict)."""


class ToolTimeout(ToolError):
    """The tool stopped its own work at its time limit: the call ends ``timeout``."""


@dataclass(frozen=True)
class ToolOutput:
    """A tool's text plus machine-readable extras (``ToolResult.extra``), e.g. a proposal id."""

    text: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolContext:
    """Everything a tool may use besides its input: whose call it is and how to reach out."""

    workspace: Path
    user_id: str
    conversation_id: str
    turn_id: str
    call_id: str
    workspace_name: str
    settings: ToolsSettings
    proposals: httpx.Client
    redis: redis.Redis
    keys: RedisKeys
    timeout_s: float = DEFAULT_TIMEOUT_S  # this call's soft time limit, for tools that pace work


ToolFunction = Callable[[Any, ToolContext], str | ToolOutput]
F = TypeVar("F", bound=ToolFunction)


@dataclass(frozen=True)
class Tool:
    """One registered tool: its function, its input model and how it is run."""

    function: ToolFunction
    input_model: type[BaseModel]
    spec: ToolSpec

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        return self.spec.name


def _input_model(function: Callable[..., str | ToolOutput]) -> type[BaseModel]:
    params = list(inspect.signature(function).parameters)
    if len(params) != 2:
        raise TypeError(
            f"a tool takes (input, context), got {function.__name__}({', '.join(params)})"
        )
    hints = typing.get_type_hints(function)
    model = hints.get(params[0])
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(
            f"the first parameter of tool {function.__name__} must be a pydantic model, "
            f"got {model!r}"
        )
    return model


class Registry:
    """Tools by name; ``specs()`` is what a worker publishes as its catalogue."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, entry: Tool) -> None:
        """Register ``entry``; a second tool with the same name is a programming error."""
        if entry.name in self._tools:
            raise ValueError(f"tool {entry.name!r} is registered twice")
        self._tools[entry.name] = entry

    def tool(
        self,
        *,
        name: str,
        description: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        queue: str = "tools",
        mode: ApprovalMode = "auto",
        side_effect: SideEffect = "read",
        idempotent: bool = False,
        quick: bool = False,
    ) -> Callable[[F], F]:
        """Declare the decorated function as tool ``name``; returns the function unchanged."""

        def register(function: F) -> F:
            model = _input_model(function)
            spec = ToolSpec(
                name=name,
                description=description,
                input_schema=model.model_json_schema(),
                timeout_s=timeout_s,
                queue=queue,
                mode=mode,
                side_effect=side_effect,
                idempotent=idempotent,
                quick=quick,
            )
            self.add(Tool(function=function, input_model=model, spec=spec))
            return function

        return register

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Every tool name, sorted."""
        return sorted(self._tools)

    def specs(self) -> list[ToolSpec]:
        """The catalogue entries of every tool, sorted by name."""
        return [self._tools[n].spec for n in self.names()]

    def tools(self) -> list[Tool]:
        """Every tool, sorted by name."""
        return [self._tools[n] for n in self.names()]

    def with_overrides(self, timeouts: Mapping[str, float], queues: Mapping[str, str]) -> Registry:
        """A copy with some tools' time limits and queues replaced (a deployment's settings).

        A name that is no tool here is refused: a typo would otherwise leave a limit unset.
        """
        unknown = sorted((set(timeouts) | set(queues)) - set(self._tools))
        if unknown:
            raise ValueError(
                f"time limit or queue set for unknown tools {unknown!r}; "
                f"known tools: {', '.join(self.names())}"
            )
        for name, limit in timeouts.items():
            if limit <= 0:
                raise ValueError(f"expected a positive time limit for {name!r}, got {limit!r}")
        changed = []
        for t in self._tools.values():
            update: dict[str, Any] = {}
            if t.name in timeouts:
                update["timeout_s"] = float(timeouts[t.name])
            if t.name in queues:
                update["queue"] = queues[t.name]
            changed.append(replace(t, spec=t.spec.model_copy(update=update)) if update else t)
        return Registry(changed)

    @classmethod
    def merged(cls, registries: Iterable[Registry]) -> Registry:
        """One registry holding the tools of all ``registries`` (names must not clash)."""
        return cls(t for r in registries for t in r._tools.values())
