"""The tool-approval policy (pure) and the context budget (pure), plus: a broken policy stops
the orchestrator at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signalbox.services.orchestrator.context_budget import estimate_tokens, fit
from signalbox.services.orchestrator.policy import (
    PolicyError,
    ToolPolicy,
    ToolRule,
    load_policy,
    parse_policy,
    read_policy_file,
)
from signalbox.shared.settings import OrchestratorSettings
from tests.fake_anthropic import transcript_problems

REPO = Path(__file__).resolve().parents[2]


def test_deny_patterns_then_allow_patterns_then_the_mode() -> None:
    policy = ToolPolicy(
        {
            "run_python": ToolRule(mode="confirm", allow=["print"], deny=["os\\.system"]),
            "*": ToolRule(deny=["secret"]),
        }
    )

    def verdict(tool: str, default: Any = "auto", **tool_input: Any) -> str:
        return policy.decide(tool, tool_input, default).verdict

    assert verdict("run_python", code="os.system('print')") == "deny"  # deny beats allow
    assert verdict("run_python", code="print(1)") == "auto"  # allow beats the mode
    assert verdict("run_python", code="1+1") == "confirm"  # the policy's mode
    assert verdict("read_file", path="secret.txt") == "deny"  # '*' patterns apply to all
    assert verdict("read_file", path="a.txt") == "auto"  # the catalogue's mode
    assert verdict("delete_file", "confirm", path="a.txt") == "confirm"


def test_a_tool_mode_wins_over_the_star_mode_which_wins_over_the_catalogue() -> None:
    policy = ToolPolicy({"*": ToolRule(mode="confirm"), "list_dir": ToolRule(mode="auto")})

    assert policy.decide("list_dir", {}, "deny").verdict == "auto"
    assert policy.decide("read_file", {}, "auto").verdict == "confirm"
    assert ToolPolicy().decide("read_file", {}, "deny").verdict == "deny"


def test_patterns_match_the_canonical_json_of_the_input() -> None:
    policy = ToolPolicy({"t": ToolRule(deny=['^\\{"a": 1, "b": 2\\}$'])})

    assert policy.decide("t", {"b": 2, "a": 1}, "auto").verdict == "deny"


def test_a_file_as_json_or_toml_then_the_environment(tmp_path: Path) -> None:
    as_json = tmp_path / "policy.json"
    as_json.write_text(json.dumps({"tools": {"run_python": {"mode": "auto", "deny": ["x"]}}}))
    as_toml = tmp_path / "policy.toml"
    as_toml.write_text("[tools.run_python]\nmode = \"auto\"\ndeny = ['x']\n")
    assert read_policy_file(as_json) == read_policy_file(as_toml)

    settings = OrchestratorSettings(
        tool_policy_file=as_toml,
        tool_policy={"tools": {"run_python": {"mode": "confirm", "deny": ["y"]}}},
    )
    rule = load_policy(settings).rules["run_python"]
    assert (rule.mode, rule.deny) == ("confirm", ["x", "y"])


def test_the_environment_variable_is_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNALBOX_TOOL_POLICY", '{"tools": {"*": {"mode": "deny"}}}')

    policy = load_policy(OrchestratorSettings())

    assert policy.decide("anything", {}, "auto").verdict == "deny"


@pytest.mark.parametrize(
    ("name", "body", "problem"),
    [
        ("p.json", '{"tools": {"t": {"allow": ["("]}}}', "bad regular expression '('"),
        ("p.json", '{"tools": {"t": {"mode": "sometimes"}}}', "tools.t.mode"),
        ("p.json", '{"tools": {"t": {"alow": ["x"]}}}', "tools.t.alow"),
        ("p.json", '{"tool": {}}', "tool"),
        ("p.json", "{not json", "does not parse"),
        ("p.toml", "[tools.t\nmode=", "does not parse"),
    ],
)
def test_a_broken_policy_is_refused_with_what_is_wrong(
    tmp_path: Path, name: str, body: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(body)

    with pytest.raises(PolicyError, match=r"p\.(json|toml)") as refused:
        read_policy_file(path)

    assert problem in str(refused.value)


def test_a_missing_policy_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        read_policy_file(tmp_path / "nope.json")
    with pytest.raises(PolicyError):
        parse_policy(["not", "a", "mapping"], "test")


def test_the_orchestrator_does_not_start_with_a_broken_policy(tmp_path: Path) -> None:
    broken = tmp_path / "policy.json"
    broken.write_text('{"tools": {"run_python": {"deny": ["[unclosed"]}}}')
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SIGNALBOX_TOOL_POLICY_FILE": str(broken),
    }

    started = subprocess.run(
        [sys.executable, "-c", "import signalbox.services.orchestrator.worker"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert started.returncode != 0
    assert "PolicyError" in started.stderr and "[unclosed" in started.stderr


# -- the context budget ------------------------------------------------------------------

_outputs = st.lists(st.text(alphabet="ab \n", max_size=3000), min_size=1, max_size=8)


def _transcript(outputs: list[str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    for i, output in enumerate(outputs):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "read", "input": {}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": output}],
            }
        )
    return messages


@settings(max_examples=60, deadline=None)
@given(outputs=_outputs, budget=st.integers(50, 5000), cap=st.integers(300, 4000))
def test_the_budget_never_breaks_the_pairing_of_calls_and_results(
    outputs: list[str], budget: int, cap: int
) -> None:
    messages = _transcript(outputs)

    fitted = fit(messages, budget, cap)

    assert transcript_problems(fitted) == []
    assert [m["role"] for m in fitted] == [m["role"] for m in messages]
    ids = [[b.get("id") or b.get("tool_use_id") for b in m["content"]] for m in fitted]
    assert ids == [[b.get("id") or b.get("tool_use_id") for b in m["content"]] for m in messages]
    assert messages == _transcript(outputs), "the input is not changed"
    for block in (b for m in fitted for b in m["content"] if b["type"] == "tool_result"):
        assert len(block["content"]) <= cap + 80
    results = [b["content"] for m in fitted for b in m["content"] if b["type"] == "tool_result"]
    shortened = ["shortened to fit" in r for r in results]
    # Among outputs long enough to be worth shortening, the oldest go first.
    worth = [s for s, original in zip(shortened, outputs, strict=True) if len(original) > 280]
    assert worth == sorted(worth, reverse=True), "the oldest outputs are shortened first"
    if estimate_tokens(fit(messages, 10**9, cap)) <= budget:
        assert not any(shortened), "nothing is shortened when the transcript fits"
