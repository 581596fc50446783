"""Every way out of the workspace is refused by every tool that takes a path.

The workspace holds symlinks to a directory outside it, to a sibling whose name shares the
workspace's prefix, chains and loops; the outside holds ``SECRET``, which no output may show.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.tools.confinement import confine, open_directory, open_file
from signalbox.shared.db import Proposal
from signalbox.shared.workspace_paths import PathOutsideWorkspace
from tests.tools.conftest import SECRET, ToolEnv

ESCAPES = [
    "../secret.txt",
    "../../outside/secret.txt",
    "./../secret.txt",
    "sub/../../secret.txt",
    "sub/./../../outside/secret.txt",
    "../",
    "..",
    "/etc/passwd",
    "//etc/passwd",
    "\\etc\\passwd",
    "OUTSIDE_ABSOLUTE",  # replaced by the real absolute path of the secret
    "hello.txt\x00.png",
    "../proj-evil/secret.txt",  # sibling whose name starts with the workspace's name
    "link_file",  # symlink to a file outside
    "link_dir",  # symlink to a directory outside
    "link_dir/",
    "link_dir/secret.txt",
    "link_dir/./secret.txt",
    "chain1",  # chain1 -> chain2 -> outside file
    "sub/inner/secret.txt",  # a directory symlink in the middle of the path
    "sibling_link/secret.txt",  # symlink to the same-prefix sibling
    "relative_out",  # relative symlink target climbing out
    "dangling_out",  # symlink to a file that does not exist yet, outside
    "loop",  # a symlink loop
]
TOOLS = ["read_file", "list_dir", "search_files", "write_file"]


def _arrange(env: ToolEnv) -> None:
    ws, outside = env.workspace, env.outside
    sibling = ws.parent / (ws.name + "-evil")
    sibling.mkdir()
    (sibling / "secret.txt").write_text(SECRET)
    (ws / "link_file").symlink_to(outside / "secret.txt")
    (ws / "link_dir").symlink_to(outside)
    (ws / "chain2").symlink_to(outside / "secret.txt")
    (ws / "chain1").symlink_to(ws / "chain2")
    (ws / "sub" / "inner").symlink_to(outside)
    (ws / "sibling_link").symlink_to(sibling)
    (ws / "relative_out").symlink_to(Path("..") / ".." / ".." / ".." / "outside" / "secret.txt")
    (ws / "dangling_out").symlink_to(outside / "not-yet.txt")
    (ws / "loop").symlink_to("loop")


def _input(tool: str, path: str) -> dict[str, str]:
    if tool == "write_file":
        return {"path": path, "content": "pwned"}
    if tool == "search_files":
        return {"path": path, "pattern": "."}
    return {"path": path}


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("path", ESCAPES)
def test_escapes_are_refused(
    request: pytest.FixtureRequest,
    tool_env: ToolEnv,
    db_sessions: sessionmaker[Session],
    tool: str,
    path: str,
) -> None:
    if tool == "write_file":
        request.getfixturevalue("proposals_http")  # the real service, should anything reach it
    _arrange(tool_env)
    if path == "OUTSIDE_ABSOLUTE":
        path = str(tool_env.outside / "secret.txt")
    result = tool_env.run(tool, **_input(tool, path))
    assert result.status == "error", f"{tool}({path!r}) answered {result.output!r}"
    assert SECRET not in result.output + (result.error or "")
    assert "proposal was refused" not in (result.error or ""), "refused by proposals, not us"
    assert not (tool_env.outside / "not-yet.txt").exists()
    assert (tool_env.outside / "secret.txt").read_text() == SECRET + "\n"
    with db_sessions() as session:
        made = session.scalars(
            select(Proposal).where(Proposal.conversation_id == tool_env.conversation_id)
        ).all()
    assert made == []


def test_listing_and_searching_the_root_never_follow_symlinks_out(tool_env: ToolEnv) -> None:
    _arrange(tool_env)
    listing = tool_env.run("list_dir", depth=3)
    assert listing.status == "ok"
    assert "link_dir@ (symlink, not followed)" in listing.output
    assert "sub/inner@ (symlink, not followed)" in listing.output
    assert "secret.txt" not in listing.output
    searched = tool_env.run("search_files", pattern="TOPSECRET")
    assert searched.status == "ok" and "no matches" in searched.output


def test_a_symlink_inside_the_workspace_still_works(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "alias.txt").symlink_to("hello.txt")
    (tool_env.workspace / "src").symlink_to("sub")
    assert tool_env.run("read_file", path="alias.txt").output.startswith("line one")
    assert tool_env.run("read_file", path="src/code.py").output.startswith("def main")


@pytest.mark.parametrize("path", ["~/secret.txt", "%2e%2e/secret.txt", "..%2fsecret.txt", "~"])
def test_tilde_and_percent_encoding_are_literal_names_inside(tool_env: ToolEnv, path: str) -> None:
    where = confine(tool_env.workspace, path)
    assert where.absolute == tool_env.workspace.resolve().joinpath(*Path(path).parts)
    result = tool_env.run("read_file", path=path)
    assert result.status == "error" and "no such file" in (result.error or "")


def test_a_directory_swapped_for_a_symlink_after_the_check_is_refused(tool_env: ToolEnv) -> None:
    (tool_env.outside / "code.py").write_text(SECRET)
    where = confine(tool_env.workspace, "sub/code.py")
    os.rename(tool_env.workspace / "sub", tool_env.workspace / "sub-old")
    (tool_env.workspace / "sub").symlink_to(tool_env.outside)
    with pytest.raises(PathOutsideWorkspace), open_file(where):
        pass
    listing = confine(tool_env.workspace, "sub-old")
    os.rename(tool_env.workspace / "sub-old", tool_env.workspace / "sub-gone")
    (tool_env.workspace / "sub-old").symlink_to(tool_env.outside)
    with pytest.raises(PathOutsideWorkspace), open_directory(listing):
        pass


def test_a_file_swapped_for_a_symlink_after_the_check_is_refused(tool_env: ToolEnv) -> None:
    where = confine(tool_env.workspace, "hello.txt")
    (tool_env.workspace / "hello.txt").unlink()
    (tool_env.workspace / "hello.txt").symlink_to(tool_env.outside / "secret.txt")
    with pytest.raises(PathOutsideWorkspace), open_file(where):
        pass
