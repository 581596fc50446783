"""delete_directory against the real proposals service: one proposal listing every file it
would remove, recursive only when asked, nothing deleted until a human approves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from signalbox.services.tools.proposals_client import USER_HEADER
from tests.tools.conftest import ToolEnv
from tests.tools.test_workspace_view import _chain, _unchain

pytestmark = pytest.mark.usefixtures("proposals_http")


@pytest.fixture
def tree(tool_env: ToolEnv) -> Path:
    root = tool_env.workspace / "build"
    (root / "lib" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text("a\n")
    (root / "lib" / "b.txt").write_text("b\n")
    (root / "lib" / "deep" / "c.txt").write_text("c\n")
    (tool_env.workspace / "flat").mkdir()
    (tool_env.workspace / "flat" / "x.log").write_text("x\n")
    (tool_env.workspace / "empty").mkdir()
    return root


def _proposal(env: ToolEnv, client: httpx.Client, proposal_id: str) -> dict[str, Any]:
    response = client.get(f"/api/proposals/{proposal_id}", headers={USER_HEADER: env.user_id})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_recursive_delete_lists_every_file_and_deletes_nothing_yet(
    tool_env: ToolEnv, proposals_http: httpx.Client, tree: Path
) -> None:
    result = tool_env.run("delete_directory", path="build", recursive=True)
    assert result.status == "ok", result.error
    proposal = _proposal(tool_env, proposals_http, result.extra["proposal_id"])
    assert proposal["summary"] == "delete build/ (3 files)"
    files = [(f["path"], f["operation"], f["after"]) for f in proposal["files"]]
    assert files == [
        ("build/a.txt", "delete", None),
        ("build/lib/b.txt", "delete", None),
        ("build/lib/deep/c.txt", "delete", None),
    ]
    assert all(f["diff"].startswith("--- a/") for f in proposal["files"])
    assert (tree / "lib" / "deep" / "c.txt").exists()


def test_without_recursive_subdirectories_are_refused(tool_env: ToolEnv, tree: Path) -> None:
    result = tool_env.run("delete_directory", path="build")
    assert result.status == "error" and "recursive=true" in (result.error or "")
    flat = tool_env.run("delete_directory", path="flat")
    assert flat.status == "ok", flat.error


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".", "whole workspace"),
        ("hello.txt", "expected a directory"),
        ("missing", "expected a directory"),
        ("empty", "holds no files"),
        ("../outside", "'..' is not allowed"),
    ],
)
def test_what_cannot_be_deleted_is_an_error(
    tool_env: ToolEnv, tree: Path, path: str, expected: str
) -> None:
    result = tool_env.run("delete_directory", path=path, recursive=True)
    assert result.status == "error" and expected in (result.error or ""), result


def test_a_directory_holding_hidden_secrets_or_symlinks_is_refused(
    tool_env: ToolEnv, tree: Path
) -> None:
    (tree / "lib" / ".env").write_text("TOKEN=x\n")
    result = tool_env.run("delete_directory", path="build", recursive=True)
    assert result.status == "error" and "hidden from tools" in (result.error or "")
    (tree / "lib" / ".env").unlink()
    (tree / "link").symlink_to("/etc/passwd")
    result = tool_env.run("delete_directory", path="build", recursive=True)
    assert result.status == "error" and "symlink" in (result.error or "")


def test_deleting_a_directory_a_thousand_levels_deep_is_refused_clearly(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "deep").mkdir()
    _chain(tool_env.workspace / "deep", "d", 1000)
    try:
        result = tool_env.run("delete_directory", path="deep", recursive=True)
        assert result.status == "error" and "directories deep" in (result.error or ""), result
    finally:
        _unchain(tool_env.workspace / "deep", "d")
