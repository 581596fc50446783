"""write_file, edit_file and delete_file against the real proposals service (over HTTP).

The tools never touch the workspace: each creates a proposal and says so; the proposal
holds what the tool computed, made against the hash of what it read.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import httpx
import pytest

from signalbox.services.tools.execution import execute
from signalbox.services.tools.proposals_client import USER_HEADER
from tests.tools.conftest import ToolEnv

pytestmark = pytest.mark.usefixtures("proposals_http")


def _proposal(env: ToolEnv, client: httpx.Client, proposal_id: str) -> dict[str, Any]:
    response = client.get(f"/api/proposals/{proposal_id}", headers={USER_HEADER: env.user_id})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _sha(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()


def test_write_file_creates_a_proposal_and_writes_nothing(
    tool_env: ToolEnv, proposals_http: httpx.Client
) -> None:
    result = tool_env.run("write_file", path="docs/new.md", content="# New\n")
    assert result.status == "ok", result.error
    proposal_id = result.extra["proposal_id"]
    assert result.output == f"proposed, awaiting approval (proposal_id {proposal_id})"
    assert not (tool_env.workspace / "docs").exists()
    proposal = _proposal(tool_env, proposals_http, proposal_id)
    assert proposal["status"] == "pending"
    assert proposal["conversation_id"] == tool_env.conversation_id
    assert [(f["path"], f["operation"], f["after"]) for f in proposal["files"]] == [
        ("docs/new.md", "create", "# New\n")
    ]


def test_write_file_over_an_existing_file_is_an_update_against_its_hash(
    tool_env: ToolEnv, proposals_http: httpx.Client
) -> None:
    result = tool_env.run("write_file", path="hello.txt", content="replaced\n")
    proposal = _proposal(tool_env, proposals_http, result.extra["proposal_id"])
    (file,) = proposal["files"]
    assert file["operation"] == "update"
    assert file["before_sha256"] == _sha("line one\nline two\nline three\n")
    assert file["after"] == "replaced\n"
    assert (tool_env.workspace / "hello.txt").read_text() == "line one\nline two\nline three\n"


def test_write_file_with_the_same_content_proposes_nothing(tool_env: ToolEnv) -> None:
    result = tool_env.run(
        "write_file", path="hello.txt", content="line one\nline two\nline three\n"
    )
    assert result.status == "ok" and "no change" in result.output and result.extra == {}


def test_edit_file_replaces_the_single_match(
    tool_env: ToolEnv, proposals_http: httpx.Client
) -> None:
    result = tool_env.run("edit_file", path="sub/code.py", old_str="return 42", new_str="return 7")
    assert result.status == "ok", result.error
    (file,) = _proposal(tool_env, proposals_http, result.extra["proposal_id"])["files"]
    assert file["path"] == "sub/code.py" and file["operation"] == "update"
    assert file["after"] == "def main():\n    return 7\n"
    assert file["before_sha256"] == _sha("def main():\n    return 42\n")
    assert "-    return 42" in file["diff"] and "+    return 7" in file["diff"]


def test_edit_file_with_no_match_says_zero(tool_env: ToolEnv) -> None:
    result = tool_env.run("edit_file", path="hello.txt", old_str="line four", new_str="x")
    assert result.status == "error"
    assert "exactly once" in (result.error or "") and "0 times" in (result.error or "")


def test_edit_file_with_several_matches_says_how_many(tool_env: ToolEnv) -> None:
    result = tool_env.run("edit_file", path="hello.txt", old_str="line", new_str="row")
    assert result.status == "error"
    assert "3 times" in (result.error or "") and "hello.txt" in (result.error or "")


def test_edit_file_of_a_missing_or_binary_file_is_an_error(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "blob.bin").write_bytes(b"a\x00b")
    assert "no such file" in (
        tool_env.run("edit_file", path="gone.txt", old_str="a", new_str="b").error or ""
    )
    assert "binary" in (
        tool_env.run("edit_file", path="blob.bin", old_str="a", new_str="b").error or ""
    )


def test_delete_file_proposes_a_delete_against_the_hash(
    tool_env: ToolEnv, proposals_http: httpx.Client
) -> None:
    result = tool_env.run("delete_file", path="hello.txt")
    assert result.status == "ok", result.error
    (file,) = _proposal(tool_env, proposals_http, result.extra["proposal_id"])["files"]
    assert (file["path"], file["operation"], file["after"]) == ("hello.txt", "delete", None)
    assert file["before_sha256"] == _sha("line one\nline two\nline three\n")
    assert (tool_env.workspace / "hello.txt").exists()


def test_delete_file_of_a_directory_or_missing_file_is_an_error(tool_env: ToolEnv) -> None:
    assert "directory" in (tool_env.run("delete_file", path="sub").error or "")
    assert "gone.txt" in (tool_env.run("delete_file", path="gone.txt").error or "")


def test_a_write_through_an_inside_symlink_targets_the_real_file(
    tool_env: ToolEnv, proposals_http: httpx.Client
) -> None:
    (tool_env.workspace / "src").symlink_to("sub")
    result = tool_env.run("edit_file", path="src/code.py", old_str="42", new_str="43")
    (file,) = _proposal(tool_env, proposals_http, result.extra["proposal_id"])["files"]
    assert file["path"] == "sub/code.py"


def test_a_refusal_by_the_proposals_service_is_an_error_for_the_model(tool_env: ToolEnv) -> None:
    # A conversation of nobody: the service answers 404 and the model reads why.
    request = tool_env.request("write_file", path="x.txt", content="x")
    context = dataclasses.replace(tool_env.context(request.call_id), conversation_id="conv_nobody")
    result = execute(request, context, tool_env.registry)
    assert result.status == "error"
    assert "proposal was refused" in (result.error or "") and "conv_nobody" in (result.error or "")
