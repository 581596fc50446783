"""Extension hooks in a real turn (real Redis and SQL, the loop in this process): a hook that
denies a tool, one that raises, one that hangs past its limit, one that edits the request
the Messages API receives, one that redacts an output; and how hooks are loaded."""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, ClassVar

import pytest

from signalbox.hooks import Hook as PublicHook
from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.hooks import (
    Hook,
    HookLoadError,
    Hooks,
    OnError,
    ToolVerdict,
    TurnContext,
    from_entry_points,
    from_module,
)
from signalbox.services.orchestrator.model import ModelRequest, ToolUse
from tests.fake_anthropic import FakeAnthropic, text

from .support import Harness, ok, say, spec, use

released = threading.Event()  # lets a hung hook's thread end when the test is over
hang_ended = threading.Event()  # a hung hook's wait is over (released, or it gave up)
HANG_S = 300.0  # how long a hung hook waits to be released: far longer than any test


class DenyDeletes(Hook):
    name = "no-deletes"

    def before_tool(self, ctx: TurnContext, tool: str, input: dict[str, Any]) -> ToolVerdict:
        if tool == "delete_file":
            return ToolVerdict.deny(f"{ctx.user_id} may not delete {input.get('path')}")
        return ToolVerdict.allow()


class Raises(Hook):
    on_error: ClassVar[OnError] = "skip"

    def before_tool(self, ctx: TurnContext, tool: str, input: dict[str, Any]) -> None:
        raise RuntimeError("the hook's own bug")


class RaisesClosed(Raises):
    on_error: ClassVar[OnError] = "fail_closed"


class Hangs(Hook):
    timeout_s: ClassVar[float] = 0.3
    on_error: ClassVar[OnError] = "fail_closed"

    def before_tool(self, ctx: TurnContext, tool: str, input: dict[str, Any]) -> None:
        released.wait(HANG_S)
        hang_ended.set()


class RewritesPath(Hook):
    def before_tool(self, ctx: TurnContext, tool: str, input: dict[str, Any]) -> ToolVerdict:
        return ToolVerdict.allow({**input, "path": "safe/" + str(input["path"])})


class Redacts(Hook):
    def after_tool(self, ctx: TurnContext, tool: str, status: str, output: str) -> str:
        return output.replace("hunter2", "[redacted]")


class HouseRules(Hook):
    def before_model(self, ctx: TurnContext, request: ModelRequest) -> ModelRequest:
        return replace(request, system=request.system + f"\n\nHOUSE RULES for {ctx.agent}.")


class BrokenStart(Hook):
    on_error: ClassVar[OnError] = "fail_closed"

    def turn_started(self, ctx: TurnContext) -> None:
        raise ValueError("audit log unreachable")


class Seen(Hook):
    def __init__(self) -> None:
        self.points: list[str] = []

    def turn_started(self, ctx: TurnContext) -> None:
        self.points.append("turn_started")

    def after_model(self, ctx: TurnContext, text: str, tool_uses: list[ToolUse]) -> None:
        self.points.append(f"after_model:{len(tool_uses)}")

    def turn_finished(self, ctx: TurnContext, status: str) -> None:
        self.points.append(f"turn_finished:{status}")


@pytest.fixture(autouse=True)
def _release_hung_hooks() -> Any:
    released.clear()
    hang_ended.clear()
    yield
    released.set()


def _tools(h: Harness) -> None:
    h.catalogue(spec("delete_file"), spec("read_file"))
    h.dispatcher.tools.update({"delete_file": ok("deleted"), "read_file": ok("pw: hunter2")})


def test_a_hook_denies_a_tool_with_its_reason_and_the_tool_never_runs(harness: Harness) -> None:
    h = harness
    _tools(h)
    seen = Seen()
    h.runtime.hooks = Hooks([DenyDeletes(), seen])
    h.model.steps = [
        say("Cleaning.", use("delete_file", path="a.txt"), use("read_file", path="b.txt")),
        say("Done."),
    ]

    assert h.run(h.turn("clean up")) == "completed"

    statuses = {d["tool"]: (d["status"], d["error"]) for d in h.data("tool_call_finished")}
    assert statuses["delete_file"][0] == "denied"
    assert f"no-deletes: {h.user_id} may not delete a.txt" in statuses["delete_file"][1]
    assert statuses["read_file"][0] == "ok"
    assert [r.tool for r in h.dispatcher.sent] == ["read_file"]
    assert seen.points == [
        "turn_started",
        "after_model:2",
        "after_model:0",
        "turn_finished:completed",
    ]


def test_a_raising_hook_is_skipped_by_policy_skip_and_denies_by_policy_fail_closed(
    harness: Harness,
) -> None:
    h = harness
    _tools(h)
    h.runtime.hooks = Hooks([Raises()])
    h.model.steps = [say("Reading.", use("read_file", path="b.txt")), say("Done.")]
    assert h.run(h.turn("read", seq=1)) == "completed"
    assert [d["status"] for d in h.data("tool_call_finished")] == ["ok"]

    h.runtime.hooks = Hooks([RaisesClosed()])
    h.model.steps = [say("Reading.", use("read_file", path="b.txt")), say("Done.")]
    assert h.run(h.turn("read again", seq=2)) == "completed"

    second = h.data("tool_call_finished")[-1]
    assert second["status"] == "denied"
    assert "RaisesClosed" in second["error"] and "the hook's own bug" in second["error"]
    assert len(h.dispatcher.sent) == 1, "the call the hook failed closed on never ran"


def test_a_hung_hook_is_cut_at_its_time_limit_and_fails_closed(harness: Harness) -> None:
    h = harness
    _tools(h)
    h.runtime.hooks = Hooks([Hangs()])
    h.model.steps = [say("Reading.", use("read_file", path="b.txt")), say("Done.")]

    assert h.run(h.turn("read")) == "completed"

    [finished] = h.data("tool_call_finished")
    assert finished["status"] == "denied"
    assert "did not return within 0.3 s" in finished["error"]
    # The turn did not wait for the hook: it is over while the hook still hangs (nothing
    # releases it before the test ends), whatever time a loaded machine took.
    assert not hang_ended.is_set(), "the turn waited for a hook limited to 0.3 s"
    assert h.dispatcher.sent == []


def test_a_hook_rewrites_the_input_and_another_redacts_the_output(harness: Harness) -> None:
    h = harness
    _tools(h)
    h.runtime.hooks = Hooks([RewritesPath(), Redacts()])
    h.model.steps = [say("Reading.", use("read_file", path="b.txt")), say("Done.")]

    assert h.run(h.turn("read")) == "completed"

    [sent] = h.dispatcher.sent
    assert sent.input == {"path": "safe/b.txt"}
    [finished] = h.data("tool_call_finished")
    assert finished["output"] == "pw: [redacted]"
    result = h.model.requests[1].messages[-1]["content"][0]
    assert result["content"] == "pw: [redacted]", "the model never sees the secret"


def test_a_before_model_hook_edits_the_system_prompt_the_api_receives(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    h.runtime.model = AnthropicModel(
        "sk-test", fake_anthropic.url, "claude-test", retry_backoff_s=0
    )
    h.runtime.hooks = Hooks([HouseRules()])
    fake_anthropic.script([[text("Hello.")]])

    assert h.run(h.turn("hi")) == "completed"

    [sent] = fake_anthropic.requests
    system = sent.body["system"]
    system_text = system if isinstance(system, str) else "".join(b["text"] for b in system)
    assert system_text.endswith("HOUSE RULES for default.")


def test_a_fail_closed_turn_started_hook_fails_the_turn_before_any_model_step(
    harness: Harness,
) -> None:
    h = harness
    h.runtime.hooks = Hooks([BrokenStart()])
    h.model.steps = [say("Never.")]

    assert h.run(h.turn("hi")) == "failed"

    [finished] = h.data("turn_finished")
    assert "audit log unreachable" in finished["error"]
    assert h.model.requests == []


def test_hooks_load_from_entry_points_and_modules_and_a_bad_target_is_named() -> None:
    point = EntryPoint("acme", "tests.orchestrator.test_hooks:DenyDeletes", "signalbox.hooks")
    [loaded] = from_entry_points(lambda: [point])
    assert isinstance(loaded, DenyDeletes)
    assert [type(x) for x in from_module("tests.orchestrator.test_hooks:PAIR")] == [
        Redacts,
        HouseRules,
    ]
    with pytest.raises(HookLoadError, match=r"expected a signalbox Hook at 'tests\.orchestrator"):
        from_module("tests.orchestrator.test_hooks:released")
    with pytest.raises(HookLoadError, match="cannot import hook module 'no_such_module'"):
        from_module("no_such_module")


PAIR = [Redacts, HouseRules()]


def test_the_documented_example_hooks_load_from_the_public_import_and_act_in_a_turn(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The example of docs/hooks.md, as a deployment's module importing signalbox.hooks.
    doc = (Path(__file__).parents[2] / "docs" / "hooks.md").read_text()
    [example] = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "acme/hooks.py" in b]
    assert "from signalbox.hooks import" in example
    (tmp_path / "acme_doc_hooks.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = from_module("acme_doc_hooks")
    assert all(isinstance(hook, PublicHook) for hook in loaded)
    h = harness
    _tools(h)
    h.runtime.hooks = Hooks(loaded)
    h.model.steps = [
        say("Cleaning.", use("delete_file", path="a.txt"), use("read_file", path="b.txt")),
        say("Done."),
    ]

    assert h.run(h.turn("clean up")) == "completed"

    finished = {d["tool"]: d for d in h.data("tool_call_finished")}
    assert finished["delete_file"]["status"] == "denied"
    assert "no deletes today" in finished["delete_file"]["error"]
    assert finished["read_file"]["output"] == "pw: [redacted]"
    assert h.model.requests[0].system.endswith("Answer in British English.")
    assert [r.tool for r in h.dispatcher.sent] == ["read_file"]
