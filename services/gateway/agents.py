"""A user's agents over HTTP: list, show, define, edit (a new version), archive; and the
binding of a new conversation to an agent version.

Deployment-wide agents (``user_id`` null) are defined by an operator with ``signalbox agents
--deployment``, which writes SQL directly; over the API every user sees them and none can
change them (there is no admin role yet). A user's own agent of the same name shadows the
deployment's for that user.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import Conflict
from signalbox.services.gateway.ownership import owned_agent, visible_agent
from signalbox.shared.agents import DEFAULT_AGENT, AgentConfig
from signalbox.shared.db import Conversation
from signalbox.shared.db.agents import (
    AgentExists,
    FoundAgent,
    add_version,
    archive_agent,
    create_agent,
    find_agent,
    visible_agents,
)
from signalbox.shared.timestamps import rfc3339_or_none


def agent_json(found: FoundAgent) -> dict[str, Any]:
    """An agent as the HTTP API shows it (``AgentView``)."""
    return {
        "name": found.agent.name,
        "version": found.version.version,
        "scope": "deployment" if found.deployment else "user",
        "config": dict(found.version.spec),
        "created_at": rfc3339_or_none(found.agent.created_at),
        "version_created_at": rfc3339_or_none(found.version.created_at),
    }


def list_agents(session: Session, user_id: str) -> list[dict[str, Any]]:
    """The agents the user can start a conversation with, by name."""
    return [agent_json(found) for found in visible_agents(session, user_id)]


def show_agent(session: Session, user_id: str, name: str) -> dict[str, Any]:
    """One agent the user can see."""
    return agent_json(visible_agent(session, user_id, name))


def define_agent(session: Session, user_id: str, name: str, config: AgentConfig) -> dict[str, Any]:
    """A new agent of the user's own, version 1 (409 if they already have one so named)."""
    try:
        return agent_json(create_agent(session, user_id, name, config))
    except AgentExists as exc:
        raise Conflict(str(exc)) from None


def edit_agent(session: Session, user_id: str, name: str, config: AgentConfig) -> dict[str, Any]:
    """A new version of the user's agent; conversations bound to older versions keep them."""
    found = owned_agent(session, user_id, name)
    return agent_json(FoundAgent(found.agent, add_version(session, found.agent, config)))


def delete_agent(session: Session, user_id: str, name: str) -> dict[str, Any]:
    """Archive the user's agent: gone from lists and new conversations, kept for bound ones."""
    found = owned_agent(session, user_id, name)
    archive_agent(session, found.agent)
    return agent_json(found)


def bind_agent(session: Session, user_id: str, conversation: Conversation, name: str) -> None:
    """Bind a conversation that has not started to the newest version of agent ``name``.

    ``default`` with no agent of that name is the deployment's default (no binding). An
    unknown name is ``NotFound``, raised before anything of the turn is stored.
    """
    found = find_agent(session, user_id, name)
    if found is None and name == DEFAULT_AGENT:
        return
    if found is None:
        found = visible_agent(session, user_id, name)  # raises the NotFound
    conversation.agent_version_id = found.version.id
    conversation.agent_name = found.agent.name
    conversation.agent_version = found.version.version


def check_bound_agent(conversation_id: str, agent_name: str | None, name: str | None) -> None:
    """A turn on a started conversation (bound to ``agent_name``; None: the deployment's
    default) may name its agent only as the one it is bound to."""
    if name is None:
        return
    bound = agent_name or DEFAULT_AGENT
    if name != bound:
        raise Conflict(
            f"conversation {conversation_id!r} runs agent {bound!r}: the agent is chosen when "
            f"a conversation starts, so a turn cannot switch it to {name!r}"
        )
