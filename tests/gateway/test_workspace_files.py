"""The read-only file browser: my own workspace only, confined like the tools' paths."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from signalbox.shared.workspace_paths import workspace_dir
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer

Users = Callable[[], tuple[str, str]]


@pytest.fixture
def tree(gateway: LiveGateway, make_user: Users, tmp_path: Path) -> tuple[str, str, Path]:
    """A user whose default workspace holds files, a directory, and symlinks out of it."""
    user_id, token = make_user()
    ws = workspace_dir(gateway.settings.workspaces_root, user_id, "default")
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print('hi')\n")
    (ws / "README.md").write_text("# hello\n")
    (ws / "blob.bin").write_bytes(b"\x00\xff\xfe")
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text('[remote "origin"]\nurl = https://user:s3cret@host/r\n')
    secret = tmp_path / "secret.txt"
    secret.write_text("outside\n")
    os.symlink(secret, ws / "link.txt")
    os.symlink(tmp_path, ws / "linkdir")
    return user_id, token, ws


def _get(gateway: LiveGateway, token: str, route: str, path: str) -> httpx.Response:
    return http_calls.get(
        f"{gateway.url}/api/workspaces/default/{route}",
        params={"path": path},
        headers=bearer(token),
    )


def test_lists_directories_first_and_reads_text(
    gateway: LiveGateway, tree: tuple[str, str, Path]
) -> None:
    _user_id, token, _ws = tree
    listing = _get(gateway, token, "files", ".").json()
    assert [(e["name"], e["kind"]) for e in listing["entries"]] == [
        ("src", "dir"),
        ("README.md", "file"),
        ("blob.bin", "file"),
        ("link.txt", "symlink"),
        ("linkdir", "symlink"),
    ], "symlinks shown as such, .git hidden"
    sub = _get(gateway, token, "files", "src").json()
    assert [e["path"] for e in sub["entries"]] == ["src/main.py"]
    text = _get(gateway, token, "file", "src/main.py").json()
    assert (text["text"], text["binary"], text["size"]) == ("print('hi')\n", False, 12)
    binary = _get(gateway, token, "file", "blob.bin").json()
    assert (binary["text"], binary["binary"]) == (None, True)


@pytest.mark.parametrize(
    ("route", "path", "status"),
    [
        ("file", "../../etc/passwd", 422),
        ("file", "/etc/passwd", 422),
        ("file", "src/\x00main.py", 422),
        ("files", "..", 422),
        ("file", "link.txt", 422),  # a symlink is never followed
        ("file", "linkdir/secret.txt", 422),
        ("files", "linkdir", 422),
        ("file", "nope.txt", 404),
        ("files", "nope", 404),
        ("file", ".", 422),
        ("file", "src", 422),
        ("file", ".git/config", 404),  # hidden from listings, so not there by name either
        ("file", ".GIT/config", 404),
        ("files", ".git", 404),
        ("files", "src/../.git", 422),
    ],
)
def test_paths_that_leave_or_are_not_there_are_refused(
    gateway: LiveGateway, tree: tuple[str, str, Path], route: str, path: str, status: int
) -> None:
    _user_id, token, _ws = tree
    response = _get(gateway, token, route, path)
    assert response.status_code == status, response.text
    assert "outside" not in response.text
    assert "s3cret" not in response.text


def test_another_users_workspace_is_not_reachable(
    gateway: LiveGateway, tree: tuple[str, str, Path], make_user: Users
) -> None:
    owner_id, _token, _ws = tree
    _other_id, other_token = make_user()
    # The other user has no such workspace; the owner's files are not found under any name.
    assert _get(gateway, other_token, "file", "README.md").status_code == 404
    assert _get(gateway, other_token, "file", f"../{owner_id}/default/README.md").status_code == 422
    bad_name = http_calls.get(
        f"{gateway.url}/api/workspaces/..%2F{owner_id}/files", headers=bearer(other_token)
    )
    assert bad_name.status_code in (404, 422)
    assert http_calls.get(f"{gateway.url}/api/workspaces/default/files").status_code == 401
