"""run_python's copy of the workspace, against workspaces built to break it: 1,000 directories
deep, paths past PATH_MAX, many directories, a file growing while it is copied."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from signalbox.services.tools import workspace_view as wv
from signalbox.services.tools.workspace_view import workspace_view


def _chain(root: Path, name: str, depth: int) -> None:
    """``depth`` nested directories ``name`` under ``root``, made through dir fds (the path
    may be longer than the kernel takes in one piece)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        with open(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
            f.write("deep")
    finally:
        os.close(fd)


def _unchain(root: Path, name: str) -> None:
    """Remove a chain from the bottom up, without recursion (so pytest's cleanup need not)."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    while name in os.listdir(fds[-1]):
        fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    for parent, child in zip(reversed(fds[:-1]), reversed(fds[1:]), strict=True):
        for entry in os.listdir(child):
            os.unlink(entry, dir_fd=child)
        os.close(child)
        os.rmdir(name, dir_fd=parent)
    os.close(fds[0])


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "top.txt").write_text("top")
    yield ws


def test_a_workspace_a_thousand_directories_deep_is_copied_down_to_a_limit(
    workspace: Path,
) -> None:
    _chain(workspace, "d", 1000)
    try:
        with workspace_view(workspace, [], 1 << 20) as view:
            assert (view.directory / "top.txt").read_text() == "top"
            assert (view.directory / "d" / "d").is_dir()
            assert "directories deep" in view.note()
    finally:
        _unchain(workspace, "d")


def test_a_path_longer_than_the_kernel_takes_is_left_out_and_named(workspace: Path) -> None:
    name = "n" * 250
    _chain(workspace, name, 20)  # 5,000 characters: past PATH_MAX (4,096) for the copy
    with workspace_view(workspace, [], 1 << 20) as view:
        assert (view.directory / "top.txt").read_text() == "top"
        assert "could not be copied" in view.note()


def test_directories_and_symlinks_count_against_the_entry_limit(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wv, "MAX_ENTRIES", 10)
    for i in range(30):
        (workspace / f"dir{i:02}").mkdir()
        os.symlink("top.txt", workspace / f"link{i:02}")
    with workspace_view(workspace, [], 1 << 20) as view:
        copied = list(view.directory.iterdir())
        assert len(copied) <= 10, len(copied)
        assert "entries" in view.note()


def test_a_file_growing_while_it_is_copied_stays_within_the_budget(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grows = workspace / "grows.log"
    grows.write_bytes(b"x" * 1000)
    real_fstat = os.fstat

    def fstat_then_grow(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        if st.st_size == 1000:  # the size is read: now a writer appends, as a log would
            with grows.open("ab") as f:
                f.write(b"y" * 1_000_000)
        return st

    monkeypatch.setattr(os, "fstat", fstat_then_grow)
    with workspace_view(workspace, [], 5000) as view:
        assert (view.directory / "grows.log").stat().st_size == 1000
        assert view.bytes <= 5000
