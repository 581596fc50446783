"""``signalbox usage``: every user's model tokens and cost, read from the database."""

from __future__ import annotations

from pathlib import Path

import pytest

from signalbox.cli import main
from signalbox.shared.db import ModelRequest, User, make_engine, make_session_factory
from signalbox.shared.db.migrate import upgrade


def _request(user_id: str, model: str, cost: float | None) -> ModelRequest:
    return ModelRequest(
        user_id=user_id,
        conversation_id="conv_1",
        turn_id="turn_1",
        root_turn_id="turn_1",
        purpose="step",
        model=model,
        input_tokens=10,
        output_tokens=5,
        cache_creation_input_tokens=100,
        cache_read_input_tokens=1000,
        cost_usd=cost,
    )


def test_usage_prints_cost_per_user_and_a_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'usage.db'}"
    upgrade(url)
    engine = make_engine(url)
    with make_session_factory(engine)() as s, s.begin():
        s.add_all([User(id="user_a", name="alice"), User(id="user_b", name="bob")])
        s.add_all(
            [
                _request("user_a", "claude-sonnet-5-5", 0.5),
                _request("user_a", "claude-sonnet-5-5", 0.25),
                _request("user_b", "house-model", None),
            ]
        )
    engine.dispose()
    monkeypatch.setenv("SIGNALBOX_DATABASE_URL", url)

    assert main(["usage"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["user", "requests"]
    assert lines[1].split() == ["alice", "2", "20", "200", "2000", "10", "0.7500"]
    assert lines[2].split() == ["bob", "1", "10", "100", "1000", "5", "0.0000", "(+1", "unpriced)"]
    assert lines[3].split()[:2] == ["total", "3"] and "0.7500" in lines[3]

    assert main(["usage", "--by", "model", "--user", "bob"]) == 0
    by_model = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in by_model] == ["model", "house-model", "total"]

    assert main(["usage", "--user", "nobody"]) == 1
    assert "no user named 'nobody'" in capsys.readouterr().err
