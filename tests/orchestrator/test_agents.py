"""Agents as configuration in the loop: the bound version's prompt, model and limits, chat
mode, the tool allow-list, approval overrides, the sub-agent cap, and the tool planner
(against the fake Messages API, whose recorded requests show what was offered)."""

from __future__ import annotations

from sqlalchemy import select

from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.policy import Decision, with_agent
from signalbox.shared.agents import AgentConfig
from signalbox.shared.db.agents import add_version
from signalbox.shared.db.models import Agent, Conversation, ModelRequest
from tests.fake_anthropic import FakeAnthropic, text, tool_use

from .bound_agents import bind_agent
from .support import Harness, ok, say, spec, use

PLANNER_MARKER = "The user's request:"  # in the planner's prompt alone


def _real_model(h: Harness, fake: FakeAnthropic) -> None:
    h.runtime.model = AnthropicModel("sk-test", fake.url, "claude-test", retry_backoff_s=0)


def _forty_tools(h: Harness) -> list[str]:
    names = [f"tool_{i:02d}" for i in range(40)]
    h.catalogue(*(spec(name) for name in names))
    for name in names:
        h.dispatcher.tools[name] = ok(f"{name} done")
    return names


def test_the_planner_offers_only_the_tools_it_chose_out_of_forty(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    names = _forty_tools(h)
    bind_agent(h, planner=True)
    fake_anthropic.script_for(
        PLANNER_MARKER,
        [[tool_use("select_tools", {"tools": ["tool_07", "tool_31", "made_up"]})]],
    )
    fake_anthropic.script(
        [
            [text("Using seven."), tool_use("tool_07", {})],
            [text("Now thirty-one."), tool_use("tool_31", {})],
            [text("Both done.")],
        ]
    )
    turn_id = h.turn("do the seventh and the thirty-first things")

    assert h.run(turn_id) == "completed"

    planner, *loop = [r.body for r in fake_anthropic.requests]
    assert planner["model"] == h.runtime.settings.planner_model
    assert [t["name"] for t in planner["tools"]] == ["select_tools"]
    prompt = planner["messages"][0]["content"][0]["text"]
    assert all(f"- {name}: " in prompt for name in names)
    assert "do the seventh and the thirty-first things" in prompt
    assert len(loop) == 3
    for body in loop:
        assert sorted(t["name"] for t in body["tools"]) == ["tool_07", "tool_31"]
    # 40 tools of the catalogue, ask_user, spawn_agent, run_plan and alarm
    assert h.data("tools_selected") == [
        {"tools": ["tool_07", "tool_31"], "offered": 44, "fallback": False}
    ]
    kinds = h.kinds()
    assert kinds.index("tools_selected") < kinds.index("text_delta")
    with h.sessions() as s:
        purposes = list(
            s.scalars(select(ModelRequest.purpose).where(ModelRequest.turn_id == turn_id))
        )
    assert sorted(purposes) == ["planner", "step", "step", "step"]
    usage = h.data("turn_finished")[0]["usage"]
    billed = sum(r.usage.get("input_tokens", 0) for r in fake_anthropic.requests)
    assert usage["input_tokens"] == billed


def test_a_planner_that_answers_in_text_falls_back_to_every_tool(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    _forty_tools(h)
    bind_agent(h, planner=True, tools=["tool_0*"])
    fake_anthropic.script_for(PLANNER_MARKER, [[text("I think you need tool_03.")]])
    fake_anthropic.script([[text("Done without tools.")]])
    turn_id = h.turn("anything")

    assert h.run(turn_id) == "completed"

    loop = fake_anthropic.requests[1].body
    expected = [f"tool_0{i}" for i in range(10)]
    assert sorted(t["name"] for t in loop["tools"]) == expected, "the allow-list still holds"
    assert h.data("tools_selected") == [{"tools": expected, "offered": 10, "fallback": True}]


def test_a_resumed_turn_keeps_the_planners_choice_without_asking_again(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("read_file"), spec("list_dir"), spec("grep"))
    h.dispatcher.tools["read_file"] = ok("x")
    bind_agent(h, planner=True)
    h.model.steps = [
        [use("select_tools", tools=["read_file"])],
        say("Reading.", use("read_file", path="a")),
        say("Done."),
    ]
    turn_id = h.turn("read a")

    assert h.run(turn_id) == "completed"

    _planner, first, second = h.model.requests
    assert [t.name for t in first.tools] == ["read_file"]
    assert [t.name for t in second.tools] == ["read_file"]
    assert len(h.data("tools_selected")) == 1


def test_the_bound_agent_sets_prompt_model_and_output_limit_and_a_new_version_changes_nothing(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    bind_agent(h, system_prompt="You are a pirate.", model="claude-pirate", max_output_tokens=321)
    with h.sessions() as s, s.begin():
        conv = s.get(Conversation, h.conversation_id)
        assert conv is not None and conv.agent_name is not None
        agent = s.scalars(select(Agent).where(Agent.name == conv.agent_name)).one()
        add_version(s, agent, AgentConfig(system_prompt="You are a parrot.", model="other"))
    fake_anthropic.script([[text("Arr.")]])
    turn_id = h.turn("hello")

    assert h.run(turn_id) == "completed"

    [body] = [r.body for r in fake_anthropic.requests]
    system = body["system"]
    system_text = system if isinstance(system, str) else "".join(b["text"] for b in system)
    assert system_text == "You are a pirate."
    assert body["model"] == "claude-pirate"
    assert body["max_tokens"] == 321


def test_chat_mode_offers_no_tools_and_streams_the_same_events(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    h.catalogue(spec("read_file"))
    bind_agent(h, mode="chat")
    fake_anthropic.script([[text("Just chatting here.")]])
    turn_id = h.turn("hi", client_tools=[{"name": "pick_color"}])

    assert h.run(turn_id) == "completed"

    [body] = [r.body for r in fake_anthropic.requests]
    assert "tools" not in body or body["tools"] == []
    kinds = h.kinds()
    assert {"turn_started", "text_delta", "assistant_message", "turn_finished"} <= set(kinds)
    assert "".join(d["text"] for d in h.data("text_delta")) == "Just chatting here."


def test_the_allow_list_filters_deployment_and_built_in_tools_but_not_client_tools(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("read_file"), spec("read_dir"), spec("write_file"))
    bind_agent(h, tools=["read_*", "ask_user"])
    h.model.steps = [say("Writing anyway.", use("write_file", path="x")), say("Refused.")]
    turn_id = h.turn("hi", client_tools=[{"name": "pick_color"}])

    assert h.run(turn_id) == "completed"

    first = h.model.requests[0]
    offered = sorted(t.name for t in first.tools)
    assert offered == ["ask_user", "pick_color", "read_dir", "read_file"]
    [call] = h.calls(turn_id)
    assert call.status == "error" and "unknown tool 'write_file'" in (call.error or "")


def test_approval_overrides_tighten_the_deployment_policy_never_loosen_it(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("read_file"), spec("run_python", mode="confirm"))
    bind_agent(h, approval={"read_*": "deny", "run_python": "auto"})
    h.model.steps = [
        say("Both.", use("read_file", path="a"), use("run_python", code="1")),
        say("ok"),
    ]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "parked"

    read, run = h.calls(turn_id)
    assert read.status == "denied" and "agent's approval mode" in (read.error or "")
    assert run.status == "needs_decision", "an agent cannot make a confirm tool auto"


def test_with_agent_picks_the_strictest_matching_override() -> None:
    auto = Decision("auto", "the tool's own mode 'auto'")
    assert with_agent(auto, "write_file", {"*": "confirm", "write_*": "deny"}).verdict == "deny"
    assert with_agent(auto, "read_file", {"write_*": "deny"}) is auto
    deny = Decision("deny", "pattern")
    assert with_agent(deny, "x", {"x": "auto"}) is deny


def test_spawn_agent_is_capped_by_the_agents_sub_agent_limit(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("read_file", side_effect="read"))
    bind_agent(h, max_sub_agents=1)
    h.model.steps = [
        say("Two helpers.", use("spawn_agent", task="one"), use("spawn_agent", task="two")),
        say("Child answer."),
        say("Done."),
    ]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "completed"

    first, second = h.calls(turn_id)
    assert first.status == "ok"
    assert second.status == "error" and "at most 1 sub-agent" in (second.error or "")


def test_no_sub_agents_means_spawn_agent_is_not_offered(harness: Harness) -> None:
    h = harness
    bind_agent(h, max_sub_agents=0)
    h.model.steps = [say("Hello.")]
    assert h.run(h.turn("hi")) == "completed"
    assert "spawn_agent" not in {t.name for t in h.model.requests[0].tools}
    assert "ask_user" in {t.name for t in h.model.requests[0].tools}


def test_the_demo_model_answers_a_chat_agent_in_text_alone() -> None:
    from signalbox.services.orchestrator.demo_model import DEMO_LABEL, DemoModel
    from signalbox.services.orchestrator.model import ModelRequest, TextDelta, ToolUse

    said_by_user = [{"role": "user", "content": [{"type": "text", "text": "look around"}]}]
    asked = ModelRequest("s", said_by_user)
    events = list(DemoModel().stream(asked))
    said = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert not any(isinstance(e, ToolUse) for e in events)
    assert said.startswith(DEMO_LABEL + "Chat mode") and "look around" in said
