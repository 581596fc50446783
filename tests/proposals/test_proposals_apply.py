"""``apply.py`` and ``diffs.py`` on their own: no HTTP, no SQL, a real directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from signalbox.services.proposals import apply
from signalbox.services.proposals.apply import FileChange, PathRefused, StaleFiles, apply_changes
from signalbox.services.proposals.diffs import unified_diff


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_bytes(b"a\n")
    (workspace / "b.txt").write_bytes(b"b\n")
    return workspace


def test_applies_update_create_delete(ws: Path) -> None:
    os.chmod(ws / "a.txt", 0o640)
    apply_changes(
        ws,
        [
            FileChange("a.txt", "update", "A\n", sha(b"a\n")),
            FileChange("deep/new.txt", "create", "new\n", None),
            FileChange("b.txt", "delete", None, sha(b"b\n")),
        ],
    )
    assert (ws / "a.txt").read_bytes() == b"A\n"
    assert (ws / "a.txt").stat().st_mode & 0o777 == 0o640
    assert (ws / "deep/new.txt").read_bytes() == b"new\n"
    assert not (ws / "b.txt").exists()


def test_one_stale_file_stops_every_write(ws: Path) -> None:
    with pytest.raises(StaleFiles) as caught:
        apply_changes(
            ws,
            [
                FileChange("a.txt", "update", "A\n", sha(b"a\n")),
                FileChange("b.txt", "update", "B\n", sha(b"something else\n")),
                FileChange("a.txt.new", "create", "n", None),
            ],
        )
    assert [s.path for s in caught.value.stale] == ["b.txt"]
    assert (ws / "a.txt").read_bytes() == b"a\n"
    assert not (ws / "a.txt.new").exists()


def test_failure_midway_restores_what_was_written(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = apply.write_atomic

    def failing_write(target: apply.Target, data: bytes, **kwargs: str) -> None:
        if target.name == "c.txt":
            raise OSError(28, "No space left on device")
        real_write(target, data, **kwargs)

    monkeypatch.setattr(apply, "write_atomic", failing_write)
    with pytest.raises(OSError, match="No space"):
        apply_changes(
            ws,
            [
                FileChange("a.txt", "update", "A\n", sha(b"a\n")),
                FileChange("b.txt", "delete", None, sha(b"b\n")),
                FileChange("made/x.txt", "create", "x", None),
                FileChange("c.txt", "create", "c", None),
            ],
        )
    assert (ws / "a.txt").read_bytes() == b"a\n"
    assert (ws / "b.txt").read_bytes() == b"b\n"
    assert not (ws / "made").exists()
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "b.txt"]


def test_undo_puts_everything_back(ws: Path) -> None:
    applied = apply_changes(
        ws,
        [
            FileChange("a.txt", "update", "A\n", sha(b"a\n")),
            FileChange("b.txt", "delete", None, sha(b"b\n")),
            FileChange("n/new.txt", "create", "x", None),
        ],
    )
    applied.undo()
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "b.txt"]
    assert (ws / "a.txt").read_bytes() == b"a\n"


def test_symlinked_file_pointing_outside_is_refused(ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s")
    os.symlink(secret, ws / "link.txt")
    with pytest.raises(PathRefused):
        apply_changes(ws, [FileChange("link.txt", "update", "pwned", sha(b"s"))])
    assert secret.read_bytes() == b"s"


def test_a_file_where_a_directory_is_expected_is_refused(ws: Path) -> None:
    with pytest.raises(PathRefused):
        apply_changes(ws, [FileChange("a.txt/inner.txt", "create", "x", None)])


def test_unified_diff_marks_a_missing_final_newline() -> None:
    diff = unified_diff("f.txt", "x\ny", "x\nz\n")
    assert diff.splitlines() == [
        "--- a/f.txt",
        "+++ b/f.txt",
        "@@ -1,2 +1,2 @@",
        " x",
        "-y",
        "\\ No newline at end of file",
        "+z",
    ]
    assert unified_diff("f.txt", "same\n", "same\n") == ""
    assert unified_diff("g.txt", "gone\n", None).startswith("--- a/g.txt\n+++ /dev/null\n")
