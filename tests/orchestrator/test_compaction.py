"""Context compaction on the real SDK against the fake Messages API with a small window:
older turns folded into a stored note, ``context_compacted`` announced, every request valid."""

from __future__ import annotations

import time

from sqlalchemy import select

from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.compaction import NOTE_HEADER, SUMMARY_INSTRUCTION
from signalbox.shared.db.models import Compaction, ModelRequest
from tests.fake_anthropic import FakeAnthropic, text, tool_use
from tests.fake_prompt_cache import count_tokens

from .support import Harness, ok, spec

SUMMARY = "Summary: the user counted turns; the agent noted each."


def _setup(h: Harness, fake: FakeAnthropic, window: int | None) -> None:
    h.runtime.model = AnthropicModel("sk-test", fake.url, "claude-test", retry_backoff_s=0)
    h.runtime.settings = h.runtime.settings.model_copy(
        update={"context_window_tokens": window, "max_tokens": 512}
    )
    # The summariser's requests carry its instruction; every other request gets the queue.
    fake.script_for(SUMMARY_INSTRUCTION, [[text(SUMMARY)]] * 200)


def test_a_conversation_of_300_turns_keeps_working_in_a_small_window(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    fake_anthropic.context_window_tokens = 8000
    fake_anthropic.split_chunks = False  # one write per event: 300 turns stay quick
    _setup(h, fake_anthropic, 6000)
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("the file says hello")
    turns = 300
    script: list[object] = []
    for i in range(turns):
        if i % 10 == 0:  # some turns use a tool: folded turns keep tool_use/tool_result pairs
            script.append([text(f"Reading for {i}."), tool_use("read_file", {"path": "a"})])
        script.append([text(f"Noted number {i}, as you asked.")])
    fake_anthropic.script(script)  # type: ignore[arg-type]

    started = time.monotonic()
    outcomes = [h.run(h.turn(f"Please note the number {i}.", seq=i + 1)) for i in range(turns)]
    took = time.monotonic() - started

    assert outcomes == ["completed"] * turns
    assert fake_anthropic.violations == []
    assert fake_anthropic.remaining == 0
    compacted = h.data("context_compacted")
    assert compacted, "a 300-turn conversation never fit a 6000-token window"
    for event in compacted:
        assert event["turns_folded"] >= 1
        assert event["tokens_after"] < event["tokens_before"]
    with h.sessions() as s:
        notes = s.scalars(
            select(Compaction).where(Compaction.conversation_id == h.conversation_id)
        ).all()
        purposes = s.scalars(
            select(ModelRequest.purpose).where(ModelRequest.conversation_id == h.conversation_id)
        ).all()
    assert len(notes) == len(compacted)
    assert purposes.count("compaction") == len(compacted)
    assert purposes.count("step") == turns + turns // 10
    last = fake_anthropic.requests[-1].body["messages"]
    assert NOTE_HEADER in last[0]["content"][0]["text"]
    assert "Please note the number 299." in str(last[-1])
    print(f"\n300 turns: {took:.1f} s, {len(compacted)} compactions")


def test_prompt_too_long_from_the_api_compacts_harder_and_retries_once(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _setup(h, fake_anthropic, None)  # the orchestrator thinks the window is 200k
    fake_anthropic.script([[text(f"Answer {i}: " + "word " * 40)] for i in range(4)])
    for i in range(3):
        assert h.run(h.turn(f"question {i} " + "filler " * 40, seq=i + 1)) == "completed"
    # The API's window is smaller than the orchestrator thinks: the size of the third turn's
    # request, so the fourth (one turn longer) is refused and a compacted one fits.
    fake_anthropic.context_window_tokens = count_tokens(fake_anthropic.requests[-1].body)

    assert h.run(h.turn("last question", seq=4)) == "completed"

    assert fake_anthropic.too_long == 1
    [compacted] = h.data("context_compacted")
    assert compacted["turns_folded"] == 3
    last = fake_anthropic.requests[-1].body["messages"]
    assert len(last) == 1 and NOTE_HEADER in last[0]["content"][0]["text"]
    assert fake_anthropic.violations == []
