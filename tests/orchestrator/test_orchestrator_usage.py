"""Usage, exactly, and in money: one ``model_requests`` row per model request as the API
billed it (cache reads and writes apart), summed per turn in ``turn_finished.usage`` with
its cost from the price table; a sub-agent's requests are charged to its parent turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.demo_model import DEMO_MODEL_NAME, DemoModel
from signalbox.services.orchestrator.pricing import PriceError, PriceTable, Tokens
from signalbox.shared.db.models import ModelRequest
from tests.fake_anthropic import FakeAnthropic, text, tool_use

from .support import Harness, ok, spec


def _rows(h: Harness, root_turn_id: str) -> list[ModelRequest]:
    with h.sessions() as s:
        return list(
            s.scalars(
                select(ModelRequest)
                .where(ModelRequest.root_turn_id == root_turn_id)
                .order_by(ModelRequest.id)
            )
        )


def test_each_request_is_recorded_and_summed_per_turn_with_its_cost(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    h.runtime.model = AnthropicModel(
        "sk-test", fake_anthropic.url, "claude-test", retry_backoff_s=0
    )
    fake_anthropic.cache.min_tokens = 1  # every marked prefix is cached
    h.catalogue(spec("read_file", side_effect="read"))
    h.dispatcher.tools["read_file"] = ok("def main(): ...")
    fake_anthropic.script(
        [
            [text("Delegating."), tool_use("spawn_agent", {"task": "find the entry point"})],
            [text("Reading."), tool_use("read_file", {"path": "main.py"})],
            [text("main() in main.py.")],
            [text("The sub-agent says: main().")],
        ]
    )
    turn_id = h.turn("where does it start?")

    assert h.run(turn_id) == "completed"

    rows = _rows(h, turn_id)
    assert [r.purpose for r in rows] == ["step", "sub_agent", "sub_agent", "step"]
    assert {r.model for r in rows} == {h.runtime.settings.model}
    assert {r.user_id for r in rows} == {h.user_id}
    for row, sent in zip(rows, fake_anthropic.requests, strict=True):
        assert (
            row.input_tokens,
            row.cache_creation_input_tokens,
            row.cache_read_input_tokens,
            row.output_tokens,
        ) == (
            sent.usage["input_tokens"],
            sent.usage["cache_creation_input_tokens"],
            sent.usage["cache_read_input_tokens"],
            7,  # the fake's scripted output
        )
    assert sum(r.cache_read_input_tokens for r in rows) > 0
    prices = PriceTable.load()
    for row in rows:
        tokens = Tokens(
            row.input_tokens,
            row.output_tokens,
            row.cache_creation_input_tokens,
            row.cache_read_input_tokens,
        )
        assert row.cost_usd == pytest.approx(prices.cost_usd(row.model, tokens))

    finished = {e.turn_id: e.data["usage"] for e in h.events() if e.kind == "turn_finished"}
    parent = finished[turn_id]
    assert parent["input_tokens"] == sum(r.input_tokens for r in rows)
    assert parent["output_tokens"] == sum(r.output_tokens for r in rows)
    assert parent["cache_creation_input_tokens"] == sum(r.cache_creation_input_tokens for r in rows)
    assert parent["cache_read_input_tokens"] == sum(r.cache_read_input_tokens for r in rows)
    assert parent["cost_usd"] == pytest.approx(sum(r.cost_usd or 0 for r in rows), abs=1e-6)
    [child_id] = [t for t in finished if t != turn_id]
    child_rows = [r for r in rows if r.turn_id == child_id]
    assert finished[child_id]["cache_read_input_tokens"] == sum(
        r.cache_read_input_tokens for r in child_rows
    )


def test_a_model_without_a_price_costs_null(harness: Harness) -> None:
    h = harness
    h.runtime.settings = h.runtime.settings.model_copy(update={"model": "no-such-model"})
    h.model.steps = [[]]  # one step: StepEnd only

    assert h.run(h.turn("hello")) == "completed"

    [finished] = h.data("turn_finished")
    assert finished["usage"]["cost_usd"] is None
    assert finished["usage"]["input_tokens"] == 3


def test_prices_are_found_by_exact_name_then_longest_prefix(tmp_path: Path) -> None:
    table = PriceTable.load()
    dated = table.price("claude-sonnet-4-5-20250929")
    assert dated is not None and dated == table.price("claude-sonnet-4-5")
    assert table.price("claude-opus-5-5") != table.price("claude-opus-5"), "exact name first"
    assert table.price("gpt-whatever") is None
    tokens = Tokens(1_000_000, 1_000_000, 1_000_000, 1_000_000)
    # Sonnet 5.5: $2 input + $10 output + $2.50 5m write (or $4 1h) + $0.20 read.
    assert table.cost_usd("claude-sonnet-5-5", tokens) == pytest.approx(14.7)
    assert table.cost_usd("claude-sonnet-5-5", tokens, "1h") == pytest.approx(16.2)

    own = tmp_path / "prices.json"
    price = {"input": 1, "output": 2, "cache_write_5m": 3, "cache_write_1h": 4, "cache_read": 5}
    own.write_text(json.dumps({"models": {"house-model": price}}))
    assert PriceTable.load(own).cost_usd("house-model-v2", Tokens(10**6, 0)) == 1.0
    broken = tmp_path / "broken.toml"
    broken.write_text('[models."m"]\ninput = -1\n')
    with pytest.raises(PriceError, match=r"broken\.toml"):
        PriceTable.load(broken)


def test_the_offline_demo_model_is_recorded_as_itself_and_costs_nothing(harness: Harness) -> None:
    h = harness
    h.runtime.model = DemoModel()
    turn_id = h.turn("hello")

    assert h.run(turn_id) == "completed"

    [row] = _rows(h, turn_id)
    assert (row.model, row.purpose, row.cost_usd) == (DEMO_MODEL_NAME, "step", 0.0)
    [finished] = h.data("turn_finished")
    assert finished["usage"]["cost_usd"] == 0.0
