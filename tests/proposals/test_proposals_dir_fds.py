"""Apply through directory fds: a symlink met anywhere on the way is a 409, never followed.

The name check (``resolve``) refuses a symlink that is already there when the apply starts;
these tests put it there right after that check (the attacker winning the race at the
worst moment, deterministically), so only the ``O_NOFOLLOW`` walk stands in its way.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from signalbox.services.proposals import apply, workspace_files
from signalbox.services.proposals.journal import TEMP_PREFIX
from signalbox.services.proposals.workspace_files import PathRefused, Target, Tree
from signalbox.shared.safe_paths import SymlinkInPath, open_dirs_at, open_root
from signalbox.shared.workspace_paths import resolve_in_workspace
from tests.proposals.conftest import Owner, Propose

Swap = Callable[[Path, Path], None]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def everything_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.startswith(TEMP_PREFIX)]


def replace_with_symlink(victim: Path, to: Path) -> None:
    """What the agent does: move ``victim`` aside (inside its workspace), link ``to`` there."""
    victim.rename(victim.with_name(victim.name + ".aside"))
    victim.symlink_to(to)


@pytest.fixture
def swap_after_check(monkeypatch: pytest.MonkeyPatch) -> Swap:
    """``swap(victim, to)``: once the path check has resolved a path, ``victim`` becomes a link."""

    def arrange(victim: Path, to: Path) -> None:
        def resolve_then_swap(workspace: Path, relative: str) -> Path:
            resolved = resolve_in_workspace(workspace, relative)
            if not victim.is_symlink() and (workspace / relative).is_relative_to(victim):
                replace_with_symlink(victim, to)
            return resolved

        monkeypatch.setattr(workspace_files, "resolve_in_workspace", resolve_then_swap)

    return arrange


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    return directory


def test_a_directory_swapped_for_a_symlink_after_the_check_is_a_conflict(
    client: TestClient, owner: Owner, propose: Propose, outside: Path, swap_after_check: Swap
) -> None:
    (owner.workspace / "sub").mkdir()
    pid = propose(
        owner,
        [
            {"path": "first.txt", "operation": "create", "after": "1"},
            {"path": "sub/new.txt", "operation": "create", "after": "pwned"},
        ],
    ).json()["proposal_id"]
    swap_after_check(owner.workspace / "sub", outside)

    response = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert response.status_code == 409, response.text
    body = response.json()
    assert body["status"] == "conflict"
    assert "'sub/new.txt' passes through a symlink ('sub')" in body["detail"]
    assert everything_under(outside) == []
    assert not (owner.workspace / "first.txt").exists()  # all or nothing
    assert everything_under(owner.workspace / "sub.aside") == []
    assert temp_files(owner.workspace) == []


def test_a_file_swapped_for_a_symlink_after_the_check_is_a_conflict(
    client: TestClient, owner: Owner, propose: Propose, outside: Path, swap_after_check: Swap
) -> None:
    (owner.workspace / "a.txt").write_text("v1\n")
    secret = outside / "secret.txt"
    secret.write_text("v1\n")  # the same bytes: a followed link would pass the hash check
    pid = propose(owner, [{"path": "a.txt", "operation": "update", "after": "pwned\n"}]).json()[
        "proposal_id"
    ]
    swap_after_check(owner.workspace / "a.txt", secret)

    response = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert response.status_code == 409, response.text
    assert response.json()["status"] == "conflict"
    assert "'a.txt' is a symlink" in response.json()["detail"]
    assert secret.read_text() == "v1\n"
    assert (owner.workspace / "a.txt.aside").read_text() == "v1\n"
    assert temp_files(owner.workspace) == [] and everything_under(outside) == ["secret.txt"]


def test_a_swap_after_the_check_cannot_redirect_the_writes(
    owner: Owner, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directories checked are the ones written: their fds are held, not their names."""
    (owner.workspace / "sub").mkdir()
    real_write = apply.write_atomic

    def swap_then_write(target: Target, data: bytes, **kwargs: str) -> None:
        if not (owner.workspace / "sub").is_symlink():
            replace_with_symlink(owner.workspace / "sub", outside)
        real_write(target, data, **kwargs)

    monkeypatch.setattr(apply, "write_atomic", swap_then_write)
    applied = apply.apply_changes(
        owner.workspace,
        [
            apply.FileChange("first.txt", "create", "1", None),
            apply.FileChange("sub/new.txt", "create", "mine", None),
        ],
    )
    applied.finish()
    assert everything_under(outside) == []
    assert (owner.workspace / "sub.aside" / "new.txt").read_text() == "mine"  # where it was


def test_the_fd_layer_refuses_a_symlinked_final_file(owner: Owner, outside: Path) -> None:
    secret = outside / "secret.txt"
    secret.write_bytes(b"s")
    os.symlink(secret, owner.workspace / "link.txt")
    with Tree.open(owner.workspace) as tree:
        target = Target(tree.root_fd, "link.txt", "link.txt")
        with pytest.raises(PathRefused, match=r"'link\.txt' is a symlink"):
            workspace_files.read(target)
        with pytest.raises(PathRefused, match=r"'link\.txt' became a symlink"):
            workspace_files.write_atomic(target, b"pwned")
        workspace_files.delete_file(target)  # removes the link itself
    assert secret.read_bytes() == b"s"
    assert not (owner.workspace / "link.txt").is_symlink()
    assert temp_files(owner.workspace) == []


def test_the_walk_refuses_every_symlinked_directory_even_one_pointing_inside(
    owner: Owner, outside: Path
) -> None:
    (owner.workspace / "real").mkdir()
    (owner.workspace / "inside-link").symlink_to(owner.workspace / "real")
    (owner.workspace / "outside-link").symlink_to(outside)
    (owner.workspace / "file.txt").write_text("f")
    root = open_root(owner.workspace)
    try:
        os.close(open_dirs_at(root, ["real"]))
        for name in ("inside-link", "outside-link"):
            with pytest.raises(SymlinkInPath):
                open_dirs_at(root, [name])
        with pytest.raises(NotADirectoryError):
            open_dirs_at(root, ["file.txt", "x"])
    finally:
        os.close(root)
    with pytest.raises(SymlinkInPath):
        open_root(owner.workspace / "outside-link")


def test_a_rollback_never_follows_a_symlink_swapped_in_after_the_crash(
    owner: Owner, outside: Path, tmp_path: Path
) -> None:
    (owner.workspace / "d").mkdir()
    (owner.workspace / "d" / "c.txt").write_text("old\n")
    spec = apply.JournalSpec(tmp_path / "journal", "prop_x", "prop_x")
    applied = apply.apply_changes(
        owner.workspace, [apply.FileChange("d/c.txt", "update", "new\n", sha(b"old\n"))], spec
    )
    record = applied.journal
    assert record is not None
    # The process dies (nothing closed, nothing committed); then the agent swaps 'd' out.
    (outside / "c.txt").write_text("new\n")  # would be 'restored' if the link were followed
    replace_with_symlink(owner.workspace / "d", outside)

    assert apply.roll_back(record, owner.workspace.parent.parent) == []
    assert (outside / "c.txt").read_text() == "new\n"
    assert everything_under(outside) == ["c.txt"]
    applied.finish()
