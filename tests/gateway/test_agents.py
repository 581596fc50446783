"""``/api/agents`` and binding a conversation to an agent: owner-scoped, deployment agents
read-only over the API, versions immutable, bad input a clear 4xx with nothing stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.agents import AgentConfig
from signalbox.shared.db import AgentVersion, Conversation, Turn
from signalbox.shared.db.agents import create_agent
from signalbox.shared.ids import new_id
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer, connect, events_until, request

Users = Callable[[], tuple[str, str]]


def _name(prefix: str = "agent") -> str:
    return f"{prefix}-{new_id('x')[-8:]}"


def _deployment_agent(sessions: sessionmaker[Session], name: str, **config: Any) -> None:
    with sessions() as s, s.begin():
        create_agent(s, None, name, AgentConfig.model_validate(config))


def test_a_user_defines_edits_lists_and_archives_their_own_agent(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    _user_id, token = make_user()
    api, auth, name = f"{gateway.url}/api/agents", bearer(token), _name()

    created = http_calls.post(api, json={"name": name, "mode": "chat"}, headers=auth)
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 1 and created.json()["scope"] == "user"
    assert created.json()["config"] == {"mode": "chat"}
    again = http_calls.post(api, json={"name": name}, headers=auth)
    assert again.status_code == 409 and again.json()["code"] == "conflict"

    edited = http_calls.put(f"{api}/{name}", json={"system_prompt": "Be brief."}, headers=auth)
    assert edited.status_code == 200
    assert edited.json()["version"] == 2
    assert edited.json()["config"] == {"system_prompt": "Be brief."}
    shown = http_calls.get(f"{api}/{name}", headers=auth).json()
    assert shown["version"] == 2
    assert name in [a["name"] for a in http_calls.get(api, headers=auth).json()]

    assert http_calls.delete(f"{api}/{name}", headers=auth).status_code == 200
    assert name not in [a["name"] for a in http_calls.get(api, headers=auth).json()]
    assert http_calls.get(f"{api}/{name}", headers=auth).status_code == 404
    revived = http_calls.post(api, json={"name": name, "planner": True}, headers=auth)
    assert revived.status_code == 201 and revived.json()["version"] == 3


def test_another_users_agent_cannot_be_seen_edited_deleted_or_used(
    gateway: LiveGateway, make_user: Users
) -> None:
    _owner, owner_token = make_user()
    _attacker, attacker_token = make_user()
    api, name = f"{gateway.url}/api/agents", _name("secret")
    assert http_calls.post(api, json={"name": name}, headers=bearer(owner_token)).status_code == 201

    stolen = bearer(attacker_token)
    assert name not in [a["name"] for a in http_calls.get(api, headers=stolen).json()]
    assert http_calls.get(f"{api}/{name}", headers=stolen).status_code == 404
    assert http_calls.put(f"{api}/{name}", json={"mode": "chat"}, headers=stolen).status_code == 404
    assert http_calls.delete(f"{api}/{name}", headers=stolen).status_code == 404
    used = http_calls.post(f"{gateway.url}/api/conversations", json={"agent": name}, headers=stolen)
    assert used.status_code == 404 and used.json()["code"] == "not_found"
    assert http_calls.get(f"{api}/{name}", headers=bearer(owner_token)).json()["version"] == 1


def test_deployment_agents_are_visible_read_only_and_shadowed_by_a_users_own(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    _user_id, token = make_user()
    api, auth, name = f"{gateway.url}/api/agents", bearer(token), _name("shared")
    _deployment_agent(db_sessions, name, mode="chat")

    listed = {a["name"]: a for a in http_calls.get(api, headers=auth).json()}
    assert listed[name]["scope"] == "deployment"
    refused = http_calls.put(f"{api}/{name}", json={"mode": "agent"}, headers=auth)
    assert refused.status_code == 409 and "read-only" in refused.json()["detail"]
    assert http_calls.delete(f"{api}/{name}", headers=auth).status_code == 409

    mine = http_calls.post(api, json={"name": name, "planner": True}, headers=auth)
    assert mine.status_code == 201 and mine.json()["scope"] == "user"
    listed = {a["name"]: a for a in http_calls.get(api, headers=auth).json()}
    assert listed[name]["scope"] == "user" and listed[name]["config"] == {"planner": True}


@pytest.mark.parametrize(
    "body",
    [
        {"name": "bad name"},
        {"name": "x" * 65},
        {"name": "ok", "mode": "silent"},
        {"name": "ok", "max_steps": 0},
        {"name": "ok", "tools": ["read file"]},
        {"name": "ok", "approval": {"write_file": "sometimes"}},
        {"name": "ok", "system_prompt": "nul \x00 here"},
        {"name": "ok", "unknown_field": 1},
        {"name": "ok", "thinking_budget_tokens": 10},
    ],
)
def test_a_bad_agent_definition_is_a_422_and_nothing_is_stored(
    gateway: LiveGateway, make_user: Users, body: dict[str, Any]
) -> None:
    _user_id, token = make_user()
    answer = http_calls.post(f"{gateway.url}/api/agents", json=body, headers=bearer(token))
    assert answer.status_code == 422
    listed = http_calls.get(f"{gateway.url}/api/agents", headers=bearer(token)).json()
    assert [a for a in listed if a["scope"] == "user"] == []


def test_a_bad_agent_name_in_the_path_is_a_422(gateway: LiveGateway, make_user: Users) -> None:
    _user_id, token = make_user()
    answer = http_calls.get(f"{gateway.url}/api/agents/a..b", headers=bearer(token))
    assert answer.status_code == 422


@pytest.mark.anyio
async def test_user_turn_binds_a_new_conversation_to_the_agents_newest_version(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    _user_id, token = make_user()
    api, auth, name = f"{gateway.url}/api/agents", bearer(token), _name()
    http = http_calls.AsyncClient(headers=auth)
    assert (await http.post(api, json={"name": name})).status_code == 201
    assert (await http.put(f"{api}/{name}", json={"mode": "chat"})).status_code == 200

    async with await connect(gateway, token) as ws:
        frame = {"type": "user_turn", "conversation_id": None, "text": "hi", "agent": name}
        ack = await request(ws, frame)
        assert ack["type"] == "ack", ack
        events = await events_until(ws, lambda es: len(es) >= 2)
        assert events[0]["data"]["agent"] == name and events[0]["data"]["agent_version"] == 2
        conversation_id = ack["conversation_id"]

        # A new version afterwards does not move the conversation.
        assert (await http.put(f"{api}/{name}", json={})).json()["version"] == 3
        same = {"type": "user_turn", "conversation_id": conversation_id, "text": "again",
                "agent": name}  # fmt: skip
        assert (await request(ws, same))["type"] == "ack"
        other = {**same, "text": "switch", "agent": "default"}
        refused = await request(ws, other)
        assert refused["type"] == "error" and refused["code"] == "conflict"
        unknown = {"type": "user_turn", "conversation_id": None, "text": "x", "agent": "nope"}
        missing = await request(ws, unknown)
        assert missing["type"] == "error" and missing["code"] == "not_found"

    with db_sessions() as s:
        conv = s.get(Conversation, conversation_id)
        assert conv is not None and (conv.agent_name, conv.agent_version) == (name, 2)
        bound = s.get(AgentVersion, conv.agent_version_id)
        assert bound is not None and bound.spec == {"mode": "chat"}
        texts = s.scalars(select(Turn.text).where(Turn.conversation_id == conversation_id))
        assert sorted(texts) == ["again", "hi"], "the refused turn was not stored"
        total = s.scalar(select(func.count()).select_from(Conversation))
    detail = (await http.get(f"{gateway.url}/api/conversations/{conversation_id}")).json()
    assert (detail["agent"], detail["agent_version"]) == (name, 2)
    listed = (await http.get(f"{gateway.url}/api/conversations")).json()
    await http.aclose()
    assert [(c["agent"], c["agent_version"]) for c in listed] == [(name, 2)]
    with db_sessions() as s:
        assert s.scalar(select(func.count()).select_from(Conversation)) == total


def test_the_http_routes_bind_a_conversation_once(gateway: LiveGateway, make_user: Users) -> None:
    _user_id, token = make_user()
    auth, name = bearer(token), _name()
    assert http_calls.post(
        f"{gateway.url}/api/agents", json={"name": name}, headers=auth
    ).is_success
    convs = f"{gateway.url}/api/conversations"

    bound = http_calls.post(convs, json={"agent": name}, headers=auth)
    assert bound.status_code == 201 and bound.json()["agent"] == name
    plain = http_calls.post(convs, json={}, headers=auth).json()
    assert plain["agent"] is None
    turn = http_calls.post(f"{convs}/{plain['conversation_id']}/turns",
                      json={"text": "hi", "agent": name}, headers=auth)  # fmt: skip
    assert turn.status_code == 202, "its first turn binds an unstarted conversation"
    detail = http_calls.get(f"{convs}/{plain['conversation_id']}", headers=auth).json()
    assert detail["agent"] == name
    later = http_calls.post(f"{convs}/{bound.json()['conversation_id']}/turns",
                       json={"text": "hi", "agent": "default"}, headers=auth)  # fmt: skip
    assert later.status_code == 409
    unknown = http_calls.post(convs, json={"agent": "no-such-agent"}, headers=auth)
    assert unknown.status_code == 404
