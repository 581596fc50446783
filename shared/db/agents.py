"""Agents in SQL: define, version, archive and find them (shared/agents.py says what one is).

Used by the gateway (a user's own agents), ``signalbox agents`` (deployment-wide ones) and
the orchestrator (the version a conversation is bound to). A name is looked up among the
user's own agents first, then the deployment's: a user's agent shadows a deployment agent
of the same name, for that user only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from signalbox.shared.agents import AgentConfig
from signalbox.shared.db.concurrency import lock_row
from signalbox.shared.db.models import Agent, AgentVersion, User, now
from signalbox.shared.ids import new_id


class AgentExists(ValueError):
    """An agent of that name is already defined in that scope."""


@dataclass(frozen=True)
class FoundAgent:
    """An agent with its newest version."""

    agent: Agent
    version: AgentVersion

    @property
    def deployment(self) -> bool:
        """Deployment-wide (defined by an operator), not a user's own."""
        return self.agent.user_id is None


def _live(user_id: str | None, name: str) -> Any:
    owner = Agent.user_id.is_(None) if user_id is None else Agent.user_id == user_id
    return select(Agent).where(owner, Agent.name == name, Agent.archived_at.is_(None))


def latest_version(session: Session, agent_id: str) -> AgentVersion:
    """The newest version of an agent (every agent has one)."""
    return session.scalars(
        select(AgentVersion)
        .where(AgentVersion.agent_id == agent_id)
        .order_by(AgentVersion.version.desc())
        .limit(1)
    ).one()


def find_in_scope(session: Session, user_id: str | None, name: str) -> FoundAgent | None:
    """The live agent ``name`` of exactly this owner (None: deployment-wide)."""
    agent = session.scalars(_live(user_id, name)).first()
    return None if agent is None else FoundAgent(agent, latest_version(session, agent.id))


def find_agent(session: Session, user_id: str, name: str) -> FoundAgent | None:
    """The agent ``name`` as ``user_id`` sees it: their own, else the deployment's."""
    return find_in_scope(session, user_id, name) or find_in_scope(session, None, name)


def visible_agents(session: Session, user_id: str) -> list[FoundAgent]:
    """The agents ``user_id`` can use, by name: their own, and the deployment's they do not
    shadow."""
    rows = session.scalars(
        select(Agent)
        .where(
            (Agent.user_id == user_id) | Agent.user_id.is_(None),
            Agent.archived_at.is_(None),
        )
        .order_by(Agent.name, Agent.user_id.is_(None))
    ).all()
    found: dict[str, FoundAgent] = {}
    for agent in rows:
        if agent.name not in found:  # the user's own comes first: it shadows
            found[agent.name] = FoundAgent(agent, latest_version(session, agent.id))
    return list(found.values())


def any_deployment_agent(session: Session, name: str) -> bool:
    """Whether a deployment agent ``name`` was ever defined (live or archived)."""
    found = session.scalar(
        select(Agent.id).where(Agent.user_id.is_(None), Agent.name == name).limit(1)
    )
    return found is not None


def deployment_agents(session: Session) -> list[FoundAgent]:
    """Every live deployment-wide agent, by name."""
    rows = session.scalars(
        select(Agent)
        .where(Agent.user_id.is_(None), Agent.archived_at.is_(None))
        .order_by(Agent.name)
    ).all()
    return [FoundAgent(agent, latest_version(session, agent.id)) for agent in rows]


def create_agent(
    session: Session, user_id: str | None, name: str, config: AgentConfig
) -> FoundAgent:
    """Define agent ``name`` (deployment-wide when ``user_id`` is None) with version 1.

    Raises ``AgentExists`` if a live agent has that name in that scope. An archived one of
    the same name is brought back with a new version (names stay unique per owner).
    """
    if user_id is not None:
        lock_row(session, User, user_id)  # two creates of one name: the second sees the first
    if session.scalars(_live(user_id, name)).first() is not None:
        scope = "deployment-wide" if user_id is None else "of yours"
        raise AgentExists(f"an agent {name!r} {scope} already exists")
    owner = Agent.user_id.is_(None) if user_id is None else Agent.user_id == user_id
    archived = session.scalars(select(Agent).where(owner, Agent.name == name)).first()
    if archived is not None:
        archived.archived_at = None
        return FoundAgent(archived, add_version(session, archived, config))
    agent = Agent(id=new_id("agent"), user_id=user_id, name=name)
    session.add(agent)
    session.flush()
    return FoundAgent(agent, add_version(session, agent, config))


def add_version(session: Session, agent: Agent, config: AgentConfig) -> AgentVersion:
    """A new, immutable version of ``agent``; conversations bound to older ones keep them."""
    lock_row(session, Agent, agent.id)  # concurrent edits get distinct version numbers
    last = session.scalar(
        select(func.max(AgentVersion.version)).where(AgentVersion.agent_id == agent.id)
    )
    version = AgentVersion(
        id=new_id("agentv"), agent_id=agent.id, version=(last or 0) + 1, spec=config.stored()
    )
    session.add(version)
    session.flush()
    return version


def archive_agent(session: Session, agent: Agent) -> None:
    """Hide ``agent`` from lists and new conversations; bound conversations keep it."""
    agent.archived_at = now()


def bound_version(session: Session, version_id: str) -> tuple[str, AgentVersion] | None:
    """The name and row of an agent version a conversation is bound to."""
    row = session.execute(
        select(Agent.name, AgentVersion)
        .join(Agent, Agent.id == AgentVersion.agent_id)
        .where(AgentVersion.id == version_id)
    ).first()
    return None if row is None else (row[0], row[1])
