"""Which tools an agent is offered, and how many sub-agents one of its turns may spawn.

An agent (shared/agents.py) narrows what the deployment offers, never widens it:

- ``mode == "chat"``: no tool at all (the turn streams text and ends; same events).
- ``tools``: an allow-list of names and fnmatch patterns (``read_*``), matched against the
  catalogue's tools and the built-in ``ask_user`` / ``spawn_agent``. The tools a client
  declares on its ``user_turn`` are the client's own choice for that turn and run on the
  client: the allow-list does not filter them (chat mode still drops them).
- ``max_sub_agents``: 0 removes ``spawn_agent``; past the limit a call ends ``error``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Protocol, TypeVar

from sqlalchemy import func, or_, select

from signalbox.services.orchestrator.builtin_tools import SPAWN_AGENT
from signalbox.services.orchestrator.store import CLIENT, PlannedCall
from signalbox.shared.agents import AgentSpec
from signalbox.shared.db.models import ToolCall
from signalbox.shared.statuses import CallState

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner


class _Offered(Protocol):
    @property
    def executor(self) -> str: ...


def allowed(name: str, patterns: Sequence[str]) -> bool:
    """Whether tool ``name`` is on an allow-list of names and fnmatch patterns."""
    return any(fnmatchcase(name, pattern) for pattern in patterns)


OfferT = TypeVar("OfferT", bound=_Offered)


def agent_offers(agent: AgentSpec, offered: Mapping[str, OfferT]) -> dict[str, OfferT]:
    """``offered`` as the agent may see it (see the module's docstring)."""
    if agent.mode == "chat":
        return {}
    kept: dict[str, OfferT] = {}
    for name, offer in offered.items():
        if name == SPAWN_AGENT and agent.max_sub_agents == 0:
            continue
        if offer.executor == CLIENT or allowed(name, agent.tools):
            kept[name] = offer
    return kept


def cap_sub_agents(runner: TurnRunner, planned: list[PlannedCall]) -> list[PlannedCall]:
    """The step's calls with every ``spawn_agent`` past the agent's limit ended ``error``."""
    if not any(p.use.name == SPAWN_AGENT for p in planned):
        return planned
    with runner.rt.sessions() as s:
        spawned = s.scalar(
            select(func.count())
            .select_from(ToolCall)
            .where(
                ToolCall.turn_id == runner.info.turn_id,
                ToolCall.tool == SPAWN_AGENT,
                # one that ran, or may still run (not refused before it started)
                or_(
                    ToolCall.started_at.is_not(None),
                    ToolCall.status.not_in((CallState.ERROR, CallState.DENIED)),
                ),
            )
        )
    limit = runner.agent.max_sub_agents
    count = int(spawned or 0)
    capped: list[PlannedCall] = []
    for p in planned:
        if p.use.name == SPAWN_AGENT and p.status not in (CallState.ERROR, CallState.DENIED):
            count += 1
            if count > limit:
                why = f"the agent may spawn at most {limit} sub-agent(s) in one turn"
                p = replace(p, status=CallState.ERROR, error=why)
        capped.append(p)
    return capped
