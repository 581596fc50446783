"""Workspaces through the gateway, with the real proposals service answering for git."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import User, Workspace
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer

Users = Callable[[], tuple[str, str]]
IDENTITY = ("-c", "user.name=Test", "-c", "user.email=test@localhost")


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", *IDENTITY, "-C", str(repo), *args], capture_output=True, check=True, timeout=10
    )


def test_listing_has_real_workspaces_with_git_info(
    gw: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    user_id, token = make_user()
    _, other_token = make_user()
    home = gw.settings.workspaces_root.resolve() / user_id
    with http_calls.Client(base_url=gw.url, headers=bearer(token)) as http:
        created = http.post("/api/workspaces", json={"name": "site"})
        assert created.status_code == 201, created.text
        assert created.json() == {
            "name": "site",
            "selected": False,
            "path_exists": True,
            "git": None,
            "git_checked": True,
        }
        assert http.post("/api/workspaces", json={"name": "../up"}).status_code == 422
        git(home / "site", "init", "-q", "-b", "main")
        (home / "site" / "index.html").write_text("<p>hi</p>\n")
        git(home / "site", "add", "index.html")
        git(home / "site", "commit", "-q", "-m", "first")
        (home / "site" / "draft.txt").write_text("not committed\n")
        (home / "handmade").mkdir()  # a directory nobody registered is still a workspace
        (home / "bad name!").mkdir()  # not a valid workspace name: not listed

        listing = http.get("/api/workspaces").json()
        by_name = {w["name"]: w for w in listing["workspaces"]}
        assert sorted(by_name) == ["default", "handmade", "site"]
        assert listing["selected"] == "default"
        assert by_name["site"]["git"] == {"branch": "main", "dirty": True}
        assert by_name["handmade"] == {
            "name": "handmade",
            "selected": False,
            "path_exists": True,
            "git": None,
            "git_checked": True,
        }
        assert by_name["default"]["path_exists"] is False  # nothing made it yet
        assert by_name["default"]["selected"] is True

        assert http.post("/api/workspace/select", json={"name": "nope"}).status_code == 404
        assert http.post("/api/workspace/select", json={"name": "handmade"}).status_code == 200
        current = http.get("/api/workspace/current").json()
        assert (current["name"], current["selected"], current["path_exists"]) == (
            "handmade",
            True,
            True,
        )
        assert http.post("/api/workspace/select", json={"name": "site"}).status_code == 200
        assert http.get("/api/workspace/current").json()["git"] == {
            "branch": "main",
            "dirty": True,
        }
        assert http.post("/api/conversations", json={}).json()["workspace"] == "site"

    with http_calls.Client(base_url=gw.url, headers=bearer(other_token)) as http:
        # Another user's workspace is not theirs to select or see.
        assert http.post("/api/workspace/select", json={"name": "site"}).status_code == 404
        names = [w["name"] for w in http.get("/api/workspaces").json()["workspaces"]]
        assert names == ["default"]
    with db_sessions() as session:
        rows = session.scalars(select(Workspace.name).where(Workspace.user_id == user_id)).all()
        user = session.get(User, user_id)
    assert sorted(rows) == ["handmade", "site"]  # selecting "handmade" registered it
    assert user is not None and user.selected_workspace == "site"
