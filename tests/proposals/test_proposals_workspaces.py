"""Workspaces that are git repositories: branch and dirty state, and commit-on-apply."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from signalbox.services.proposals import git_info
from signalbox.services.proposals.app import create_app
from signalbox.shared.db import Proposal, ProposalFile
from tests.proposals.conftest import Owner, Propose

IDENTITY = ("-c", "user.name=Test", "-c", "user.email=test@localhost")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *IDENTITY, "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    return done.stdout


def make_repo(path: Path) -> None:
    git(path, "init", "-q", "-b", "main")
    (path / "tracked.txt").write_text("one\n")
    git(path, "add", "tracked.txt")
    git(path, "commit", "-q", "-m", "first")


def status(
    client: TestClient, token: str, user_id: str, name: str = "default"
) -> tuple[int, dict[str, Any]]:
    response = client.get(
        f"/internal/workspaces/{user_id}/{name}", headers={"X-Signalbox-Internal-Token": token}
    )
    return response.status_code, response.json()


def test_workspace_status_shows_branch_and_dirty_state(
    client: TestClient, owner: Owner, internal_token: str
) -> None:
    assert status(client, internal_token, owner.user_id) == (
        200,
        {"name": "default", "path_exists": True, "git": None},
    )
    assert status(client, internal_token, owner.user_id, "other") == (
        200,
        {"name": "other", "path_exists": False, "git": None},
    )
    make_repo(owner.workspace)
    assert status(client, internal_token, owner.user_id)[1]["git"] == {
        "branch": "main",
        "dirty": False,
    }
    (owner.workspace / "untracked.txt").write_text("new")
    assert status(client, internal_token, owner.user_id)[1]["git"] == {
        "branch": "main",
        "dirty": True,
    }
    (owner.workspace / "untracked.txt").unlink()
    git(owner.workspace, "checkout", "-q", "--detach")
    assert status(client, internal_token, owner.user_id)[1]["git"] == {
        "branch": None,
        "dirty": False,
    }


def test_a_repository_above_the_workspace_does_not_count(
    client: TestClient, owner: Owner, internal_token: str
) -> None:
    make_repo(owner.workspace.parent)  # the user's directory, not the workspace
    assert status(client, internal_token, owner.user_id)[1]["git"] is None


def test_workspace_status_checks_its_caller_and_its_input(
    client: TestClient, owner: Owner, internal_token: str
) -> None:
    assert client.get(f"/internal/workspaces/{owner.user_id}/default").status_code == 401
    assert status(client, internal_token, "user_nobody")[0] == 404
    assert status(client, internal_token, "..x")[0] == 422
    assert status(client, internal_token, owner.user_id, ".hidden")[0] == 422
    assert status(client, internal_token, owner.user_id, "bad name!")[0] == 422


def test_git_config_cannot_make_the_service_run_commands(owner: Owner, tmp_path: Path) -> None:
    make_repo(owner.workspace)
    marker = tmp_path / "ran"
    hook = owner.workspace / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    git(owner.workspace, "config", "core.fsmonitor", f"touch {marker}; echo")
    (owner.workspace / "tracked.txt").write_text("two\n")
    found = git_info.status(owner.workspace)
    assert found == git_info.GitStatus(branch="main", dirty=True)
    applied = Proposal(id="prop_hooks", summary="no hooks", decided_by=owner.user_id)
    applied.files = [ProposalFile(path="tracked.txt", operation="update", after="two\n")]
    assert git_info.commit_applied(owner.workspace, applied) is not None
    assert git(owner.workspace, "log", "-1", "--format=%s") == "no hooks\n"
    assert not marker.exists()


@pytest.mark.parametrize("path", [".git/config", "sub/.GIT/hooks/pre-commit", ".git"])
def test_paths_into_git_metadata_are_refused(
    client: TestClient, owner: Owner, propose: Propose, path: str
) -> None:
    make_repo(owner.workspace)
    before = (owner.workspace / ".git" / "config").read_text()
    response = propose(owner, [{"path": path, "operation": "create", "after": "[core]\n"}])
    assert response.status_code in (409, 422), response.text
    assert (owner.workspace / ".git" / "config").read_text() == before


@pytest.fixture
def committing_client(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("SIGNALBOX_GIT_COMMIT_ON_APPLY", "true")
    with TestClient(create_app()) as c:
        yield c


def test_commit_on_apply_commits_only_the_proposals_files(
    committing_client: TestClient, owner: Owner, propose: Propose
) -> None:
    make_repo(owner.workspace)
    (owner.workspace / "gone.txt").write_text("bye\n")
    git(owner.workspace, "add", "gone.txt")
    git(owner.workspace, "commit", "-q", "-m", "second")
    (owner.workspace / "human.txt").write_text("the human's own work in progress\n")
    pid = propose(
        owner,
        [
            {"path": "tracked.txt", "operation": "update", "after": "two\n"},
            {"path": "dir/new.txt", "operation": "create", "after": "new\n"},
            {"path": "gone.txt", "operation": "delete"},
        ],
        summary="Rename the widget",
    ).json()["proposal_id"]
    response = committing_client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert response.status_code == 200, response.text
    message = git(owner.workspace, "log", "-1", "--format=%B")
    assert message.startswith("Rename the widget\n")
    assert f"Proposal: {pid}" in message
    changed = git(owner.workspace, "show", "--name-status", "--format=", "HEAD").split("\n")
    assert sorted(line for line in changed if line) == [
        "A\tdir/new.txt",
        "D\tgone.txt",
        "M\ttracked.txt",
    ]
    assert git(owner.workspace, "status", "--porcelain") == "?? human.txt\n"


def test_commit_on_apply_is_off_by_default(
    client: TestClient, owner: Owner, propose: Propose
) -> None:
    make_repo(owner.workspace)
    pid = propose(owner, [{"path": "tracked.txt", "operation": "update", "after": "2\n"}]).json()[
        "proposal_id"
    ]
    assert client.post(f"/api/proposals/{pid}/approve", headers=owner.auth).status_code == 200
    assert git(owner.workspace, "log", "--format=%s").splitlines() == ["first"]
    assert git(owner.workspace, "status", "--porcelain") == " M tracked.txt\n"
