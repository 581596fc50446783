"""Attachments reach the model as the Messages API's content blocks: the real SDK against the
fake Messages API, which checks each block's shape as the real API does (bad base64 or a
media type that does not match the bytes is a 400)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from signalbox.services.gateway.uploads import read_upload, store_upload
from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.context_budget import (
    IMAGE_TOKENS,
    _estimate_walk,
    estimate_tokens,
    fit,
)
from signalbox.services.orchestrator.token_count import EstimateCounter
from signalbox.services.orchestrator.transcript import attachment_block
from signalbox.shared.db import Turn
from tests.fake_anthropic import FakeAnthropic, attachment_blocks, attachment_problems, text
from tests.gateway.test_uploads import PDF, png_bytes

from .support import Harness

NOTES = "line one\nline two — ünïcode\n"


async def _chunks(data: bytes) -> Any:
    yield data


def _upload(h: Harness, name: str, data: bytes) -> str:
    """An upload of the harness user, stored as the gateway stores it (sniffed, then one row)."""
    body, sniffed = asyncio.run(read_upload(_chunks(data), len(data), 32 * 1024 * 1024))
    with h.sessions() as s, s.begin():
        return store_upload(s, h.user_id, name, body, sniffed).upload_id


def _attach(h: Harness, turn_id: str, upload_ids: list[str]) -> None:
    with h.sessions() as s, s.begin():
        turn = s.get(Turn, turn_id)
        assert turn is not None
        turn.attachments = upload_ids


def _real_model(h: Harness, fake: FakeAnthropic) -> None:
    h.runtime.model = AnthropicModel("sk-test", fake.url, "claude-test", retry_backoff_s=0)


def test_the_model_receives_image_pdf_and_text_blocks_before_the_words(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    image = _upload(h, "dot.png", png_bytes())
    paper = _upload(h, "paper.pdf", PDF)
    notes = _upload(h, "notes.md", NOTES.encode())
    fake_anthropic.script([[text("I see a dot, a paper and notes.")], [text("Still there.")]])
    first = h.turn("what are these?")
    _attach(h, first, [image, paper, notes])

    assert h.run(first) == "completed"
    h.run(h.turn("and again?", seq=2))

    assert fake_anthropic.violations == []
    sent = fake_anthropic.requests[0].body["messages"]
    assert sent[0]["role"] == "user"
    assert [b["type"] for b in sent[0]["content"]] == ["image", "document", "document", "text"]
    img, pdf, txt, words = sent[0]["content"]
    assert img["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(png_bytes()).decode(),
    }
    assert pdf["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(pdf["source"]["data"]) == PDF
    assert pdf["title"] == "paper.pdf"
    assert txt["source"] == {"type": "text", "media_type": "text/plain", "data": NOTES}
    assert txt["title"] == "notes.md"
    assert (words["type"], words["text"]) == ("text", "what are these?")
    # The next turn's request still carries the first turn's attachments, once.
    later = attachment_blocks(fake_anthropic.requests[1].body)
    assert [b["type"] for b in later] == ["image", "document", "document"]


def test_the_fake_refuses_bad_blocks_as_the_real_api_does() -> None:
    good = base64.b64encode(png_bytes()).decode()

    def image(media_type: str, data: str) -> list[dict[str, Any]]:
        source = {"type": "base64", "media_type": media_type, "data": data}
        return [{"role": "user", "content": [{"type": "image", "source": source}]}]

    assert attachment_problems(image("image/png", good)) == []
    assert "invalid base64" in attachment_problems(image("image/png", "not base64!!"))[0]
    assert "does not match" in attachment_problems(image("image/jpeg", good))[0]
    assert "media_type" in attachment_problems(image("image/bmp", good))[0]
    bad_pdf = {"type": "base64", "media_type": "application/pdf", "data": good}
    doc = [{"role": "user", "content": [{"type": "document", "source": bad_pdf}]}]
    assert "PDF" in attachment_problems(doc)[0]


def test_an_image_counts_as_an_image_not_as_its_base64_length() -> None:
    big = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(3 * 1024 * 1024)).decode()
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": big}}
    output = "o" * 4000
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [block, {"type": "text", "text": "look"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": output}],
        },
    ]

    estimated = estimate_tokens(messages)
    fitted = fit(messages, budget_tokens=5_000, max_output_chars=50_000)
    counted = fit(messages, 5_000, 50_000, count=EstimateCounter().count)

    assert IMAGE_TOKENS <= estimated < IMAGE_TOKENS + 2_000
    assert EstimateCounter().count(block) == IMAGE_TOKENS
    # Within the budget as an image: the tool output is not shortened to make room.
    assert fitted[2]["content"][0]["content"] == output
    assert counted[2]["content"][0]["content"] == output


_LEAF = st.one_of(
    st.text(max_size=20),
    st.sampled_from(['"type": "image"', "image", "document", '{"type": "document"}']),
    st.integers(),
    st.none(),
)
_BLOCK = st.sampled_from(
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}},
        {"type": "document", "source": {"type": "text", "data": "some text " * 9}},
        {"type": "text", "text": '"type": "image"'},
    ]
)
_VALUE = st.recursive(
    st.one_of(_LEAF, _BLOCK),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["type", "a"]), inner)
    ),
    max_leaves=12,
)


@given(_VALUE)
def test_the_estimate_without_a_walk_is_the_walks_estimate(value: Any) -> None:
    """The shortcut (no attachment marker in the JSON: no walk) changes no estimate, also
    for text that spells out a marker and blocks nested anywhere."""
    assert estimate_tokens(value) == _estimate_walk(value)


@pytest.mark.parametrize("kind", ["image", "pdf", "text"])
def test_each_kind_becomes_the_block_the_api_takes(kind: str) -> None:
    data = {"image": png_bytes(), "pdf": PDF, "text": NOTES.encode()}[kind]
    media = {"image": "image/png", "pdf": "application/pdf", "text": "text/plain"}[kind]
    block = attachment_block(kind, media, f"f.{kind}", data)
    message = [{"role": "user", "content": [block, {"type": "text", "text": "hi"}]}]

    assert attachment_problems(message) == []
