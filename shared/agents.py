"""What an agent is: the configuration one turn runs with, named and versioned.

A deployment offers several agents (issue 15). Each version is immutable: a conversation is
bound to one version when it starts, so editing an agent never changes a running turn.
``default_agent`` is the deployment's default, built from the orchestrator's settings: a
turn without an agent behaves exactly as before agents existed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from signalbox.shared.settings import OrchestratorSettings
from signalbox.shared.tool_contract import ApprovalMode

DEFAULT_AGENT = "default"

AgentMode = Literal["agent", "chat"]  # chat: streaming text, no tools offered

# An agent's name: what a user types in `user_turn.agent` and a URL path, so id-like.
AGENT_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
# A tool name or fnmatch pattern of the allow-list and the approval overrides.
TOOL_PATTERN = r"^[A-Za-z0-9_*?\[\]!-]{1,64}$"
MAX_TOOL_PATTERNS = 200
MAX_SYSTEM_PROMPT_CHARS = 100_000

AgentName = Annotated[str, Field(pattern=AGENT_NAME_PATTERN, max_length=64)]
ToolPattern = Annotated[str, Field(pattern=TOOL_PATTERN, max_length=64)]


class AgentSpec(BaseModel):
    """One version of an agent, as the orchestrator runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = DEFAULT_AGENT
    version: int = Field(default=1, ge=1)
    system_prompt: str
    model: str
    mode: AgentMode = "agent"
    # Tool names or fnmatch patterns ("read_*"); ["*"] offers every tool.
    tools: tuple[str, ...] = ("*",)
    # Per-tool (name or fnmatch pattern) approval mode applied on top of the deployment
    # policy: it only ever tightens (deny > confirm > auto), see services/orchestrator/policy.py.
    approval: dict[str, ApprovalMode] = Field(default_factory=dict)
    max_steps: int = Field(ge=1)
    max_sub_agents: int = Field(default=4, ge=0)  # spawn_agent calls one turn may make
    thinking_budget_tokens: int | None = Field(default=None, ge=1024)  # None: no thinking
    planner: bool = False  # a cheap first call picks which tools this turn needs
    max_output_tokens: int = Field(ge=1)
    turn_timeout_s: float = Field(gt=0)  # wall-clock limit of one turn


def default_agent(settings: OrchestratorSettings) -> AgentSpec:
    """The deployment's default agent: today's behaviour, from the settings."""
    return AgentSpec(
        system_prompt=settings.system_prompt,
        model=settings.model,
        max_steps=settings.max_steps,
        max_output_tokens=settings.max_tokens,
        turn_timeout_s=settings.turn_timeout_s,
    )


class AgentConfig(BaseModel):
    """What a user or an operator defines for one agent version: any ``AgentSpec`` field but
    the name and version. A field left out is the deployment's default at run time (the
    stored JSON holds only the fields given), so a version needs no knowledge of the
    orchestrator's settings to be written."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str | None = Field(
        default=None, max_length=MAX_SYSTEM_PROMPT_CHARS, pattern=r"^[^\x00]*$"
    )
    model: str | None = Field(default=None, min_length=1, max_length=100, pattern=r"^[^\x00]*$")
    mode: AgentMode | None = None
    tools: tuple[ToolPattern, ...] | None = Field(default=None, max_length=MAX_TOOL_PATTERNS)
    approval: dict[ToolPattern, ApprovalMode] | None = Field(
        default=None, max_length=MAX_TOOL_PATTERNS
    )
    max_steps: int | None = Field(default=None, ge=1, le=1000)
    max_sub_agents: int | None = Field(default=None, ge=0, le=100)
    thinking_budget_tokens: int | None = Field(default=None, ge=1024)
    planner: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=128_000)
    turn_timeout_s: float | None = Field(default=None, gt=0, le=86_400)

    def stored(self) -> dict[str, Any]:
        """The JSON an ``agent_versions`` row keeps: only the fields that were given (a null
        is "the default", except ``thinking_budget_tokens`` where it means no thinking)."""
        given = self.model_dump(mode="json", exclude_unset=True)
        return {k: v for k, v in given.items() if v is not None or k in _NULLABLE}


_NULLABLE = frozenset({"thinking_budget_tokens"})


class BoundVersion(Protocol):
    """An agent version as SQL holds it: what ``bound_agent`` reads."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def config(self) -> dict[str, Any]: ...


def bound_agent(settings: OrchestratorSettings, bound: BoundVersion | None) -> AgentSpec:
    """The spec a turn runs as: its conversation's bound version, else the default."""
    default = default_agent(settings)
    if bound is None:
        return default
    return resolve_agent(default, bound.name, bound.version, bound.config)


def resolve_agent(default: AgentSpec, name: str, version: int, stored: dict[str, Any]) -> AgentSpec:
    """The spec a bound agent version runs as: its stored fields over the default's."""
    config = AgentConfig.model_validate(stored)
    return AgentSpec.model_validate(
        {
            **default.model_dump(),
            **config.stored(),
            "name": name,
            "version": version,
        }
    )
