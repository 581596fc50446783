"""``signalbox agents``: deployment-wide agents written to SQL by an operator, a user's own
through a live gateway, and a deployment agent read-only to that user."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from signalbox.cli import main
from signalbox.shared.db.migrate import upgrade
from signalbox.shared.ids import new_id
from tests.gateway.conftest import (  # noqa: F401 (fixtures)
    LiveGateway,
    gateway,
    gateway_settings,
    start_gateway,
)


def _shown(text: str) -> tuple[str, dict[str, object]]:
    head, _, body = text.partition("\n")
    return head, json.loads(body)


def test_an_operator_defines_and_edits_a_deployment_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'agents.db'}"
    upgrade(url)
    monkeypatch.setenv("SIGNALBOX_DATABASE_URL", url)
    spec = tmp_path / "chat.toml"
    spec.write_text('mode = "chat"\nsystem_prompt = "Chat only."\n')

    assert main(["agents", "create", "chat", "--deployment", "--file", str(spec)]) == 0
    head, config = _shown(capsys.readouterr().out)
    assert head == "chat  version 1  (deployment)"
    assert config == {"mode": "chat", "system_prompt": "Chat only."}

    assert main(["agents", "edit", "chat", "--deployment", "--planner", "--tools", "read_*"]) == 0
    head, config = _shown(capsys.readouterr().out)
    assert head == "chat  version 2  (deployment)"
    assert config == {
        "mode": "chat",
        "system_prompt": "Chat only.",
        "planner": True,
        "tools": ["read_*"],
    }

    assert main(["agents", "list", "--deployment"]) == 0
    assert capsys.readouterr().out.split() == ["chat", "v2", "deployment", "chat"]
    assert main(["agents", "create", "chat", "--deployment"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["agents", "create", "bad", "--deployment", "--config", '{"mode": "x"}']) == 1
    assert "not a valid agent: mode" in capsys.readouterr().err
    assert main(["agents", "show", "nope", "--deployment"]) == 1


def test_a_user_manages_their_agents_through_the_gateway(
    gateway: LiveGateway,  # noqa: F811
    make_user: Callable[[], tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    _user_id, token = make_user()
    name = f"mine-{new_id('x')[-8:]}"
    client = ["--url", gateway.url, "--token", token]

    assert main(["agents", "create", name, "--mode", "chat", *client]) == 0
    head, config = _shown(capsys.readouterr().out)
    assert head == f"{name}  version 1  (user)" and config == {"mode": "chat"}
    assert main(["agents", "edit", name, "--max-steps", "3", *client]) == 0
    head, config = _shown(capsys.readouterr().out)
    assert head == f"{name}  version 2  (user)" and config == {"mode": "chat", "max_steps": 3}
    assert main(["agents", "list", *client]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [name, "v2", "user", "chat"] in rows
    assert main(["agents", "show", "nobody-has-this", *client]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["agents", "create", "bad name", *client]) == 1


def test_up_defines_the_chat_agent_once_and_never_revives_it(tmp_path: Path) -> None:
    from signalbox.agents_cli import ensure_chat_agent
    from signalbox.shared.db import make_engine, make_session_factory
    from signalbox.shared.db.agents import archive_agent, find_in_scope

    url = f"sqlite:///{tmp_path / 'up.db'}"
    upgrade(url)
    assert ensure_chat_agent(url) is True
    assert ensure_chat_agent(url) is False
    engine = make_engine(url)
    with make_session_factory(engine)() as s, s.begin():
        found = find_in_scope(s, None, "chat")
        assert found is not None and found.version.spec == {"mode": "chat"}
        archive_agent(s, found.agent)
    engine.dispose()
    assert ensure_chat_agent(url) is False, "an operator's archive stays archived"
