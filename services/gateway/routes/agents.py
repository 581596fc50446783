"""``/api/agents``: the agents a user can run, their own and the deployment's.

Owner-scoped: a user lists, shows and starts conversations with their own agents and the
deployment-wide ones; they create, edit (``PUT``: a new version) and archive (``DELETE``)
only their own. Deployment-wide agents are read-only here (``signalbox agents --deployment``
defines them).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from signalbox.services.gateway import agents
from signalbox.services.gateway.deps import CurrentUser, GatewayDep
from signalbox.services.gateway.routes.interactions import REFUSALS
from signalbox.shared.agents import AGENT_NAME_PATTERN, AgentConfig, AgentName
from signalbox.shared.gateway_api import AgentView

router = APIRouter(prefix="/api/agents")

AgentPath = Annotated[
    str,
    Path(
        pattern=AGENT_NAME_PATTERN,
        max_length=64,
        description="an agent's name: letters, digits, '_' and '-', at most 64 (else 422)",
    ),
]


class NewAgent(AgentConfig):
    """Body of ``POST /api/agents``: a name and the first version's configuration."""

    name: AgentName


@router.get("", response_model=list[AgentView])
async def list_agents(user: CurrentUser, gateway: GatewayDep) -> list[AgentView]:
    """My agents and the deployment's (mine shadow theirs of the same name), by name."""
    rows = await gateway.db(lambda s: agents.list_agents(s, user.id))
    return [AgentView.model_validate(row) for row in rows]


@router.post("", status_code=201, response_model=AgentView, responses=REFUSALS)
async def create_agent(body: NewAgent, user: CurrentUser, gateway: GatewayDep) -> AgentView:
    """Define an agent of my own, version 1 (409 if I already have one of that name)."""
    config = AgentConfig.model_validate(body.model_dump(exclude={"name"}, exclude_unset=True))
    row = await gateway.db(lambda s: agents.define_agent(s, user.id, body.name, config))
    return AgentView.model_validate(row)


@router.get("/{name}", response_model=AgentView, responses=REFUSALS)
async def get_agent(name: AgentPath, user: CurrentUser, gateway: GatewayDep) -> AgentView:
    """One agent I can use: its newest version."""
    return AgentView.model_validate(await gateway.db(lambda s: agents.show_agent(s, user.id, name)))


@router.put("/{name}", response_model=AgentView, responses=REFUSALS)
async def edit_agent(
    name: AgentPath, body: AgentConfig, user: CurrentUser, gateway: GatewayDep
) -> AgentView:
    """A new version of my agent with exactly this configuration; running turns and
    conversations bound to an older version keep theirs."""
    row = await gateway.db(lambda s: agents.edit_agent(s, user.id, name, body))
    return AgentView.model_validate(row)


@router.delete("/{name}", response_model=AgentView, responses=REFUSALS)
async def delete_agent(name: AgentPath, user: CurrentUser, gateway: GatewayDep) -> AgentView:
    """Archive my agent: gone from the list and new conversations, kept by bound ones."""
    row = await gateway.db(lambda s: agents.delete_agent(s, user.id, name))
    return AgentView.model_validate(row)
