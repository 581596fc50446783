"""Binding the harness conversation to an agent version, as the gateway does (SQL rows)."""

from __future__ import annotations

from typing import Any

from signalbox.shared.agents import AgentConfig
from signalbox.shared.db.models import Agent, AgentVersion, Conversation
from signalbox.shared.ids import new_id

from .support import Harness


def bind_agent(h: Harness, name: str = "tester", **config: Any) -> None:
    """Bind ``h``'s conversation to a new agent version with ``config`` (AgentConfig fields)."""
    stored = AgentConfig.model_validate(config).stored()
    with h.sessions() as s, s.begin():
        agent = Agent(id=new_id("agt"), user_id=h.user_id, name=f"{name}-{new_id('n')[-6:]}")
        s.add(agent)
        s.flush()
        version = AgentVersion(id=new_id("agv"), agent_id=agent.id, version=1, spec=stored)
        s.add(version)
        s.flush()
        conv = s.get(Conversation, h.conversation_id)
        assert conv is not None
        conv.agent_version_id = version.id
        conv.agent_name = agent.name
        conv.agent_version = 1
