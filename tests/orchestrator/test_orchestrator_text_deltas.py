"""Text delta coalescing and output previews."""

from __future__ import annotations

from signalbox.services.orchestrator.text_deltas import DeltaBuffer
from signalbox.shared.events import output_preview as preview


def test_deltas_are_coalesced_per_window_and_flushed_at_the_end() -> None:
    now = [0.0]
    sent: list[str] = []
    buffer = DeltaBuffer(sent.append, window_s=0.05, clock=lambda: now[0])

    for t, piece in [(0.0, "a"), (0.01, "b"), (0.02, "c"), (0.06, "d"), (0.07, "e")]:
        now[0] = t
        buffer.add(piece)
    assert sent == ["abcd"]
    buffer.flush()
    assert sent == ["abcd", "e"]
    buffer.flush()
    assert sent == ["abcd", "e"]


def test_preview_is_bounded_and_never_splits_a_character() -> None:
    assert preview("short") == "short"
    cut = preview("é" * 5000, limit_bytes=4096)
    assert len(cut.encode()) <= 4096
    assert cut.endswith("(truncated)")
    assert "\ufffd" not in cut
