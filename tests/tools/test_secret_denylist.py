"""Secret files out of the model's reach: ``.git`` internals (a credential in a remote URL),
``.env``, keys. A hostile model asks by name, through a symlink, by listing, by searching,
and through the write tools' answers; none of it shows the secret or that it exists."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

import pytest

from signalbox.services.tools.denylist import DEFAULT_DENYLIST, denied
from signalbox.shared.secret_files import DEFAULT_SECRET_DENYLIST
from signalbox.shared.settings import ToolsSettings
from tests.tools.conftest import ToolEnv

CREDENTIAL = "ghp_s3cr3tT0ken4f2a"


@pytest.fixture
def secrets_env(tool_env: ToolEnv) -> ToolEnv:
    ws = tool_env.workspace
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text(
        f'[remote "origin"]\n\turl = https://bot:{CREDENTIAL}@github.com/acme/app.git\n'
    )
    (ws / ".env").write_text(f"TOKEN={CREDENTIAL}\n")
    (ws / ".env.production").write_text(f"TOKEN={CREDENTIAL}\n")
    (ws / "sub" / "server.key").write_text(CREDENTIAL)
    (ws / "sub" / "id_ed25519").write_text(CREDENTIAL)
    os.symlink(".git/config", ws / "innocent.txt")
    return tool_env


@pytest.mark.parametrize(
    "path", [".git/config", ".git", ".env", ".env.production", "sub/server.key", "sub/id_ed25519",
             "./.git//config", "innocent.txt", ".env.absent", ".git/absent"],
)  # fmt: skip
def test_reading_a_secret_by_name_is_refused_alike_whether_it_exists_or_not(
    secrets_env: ToolEnv, path: str
) -> None:
    result = secrets_env.run("read_file", path=path)
    assert result.status == "error", result
    assert "secret denylist" in (result.error or "") and CREDENTIAL not in result.output


def test_listing_shows_no_secret_and_no_git_directory(secrets_env: ToolEnv) -> None:
    result = secrets_env.run("list_dir", path=".", depth=5)
    assert result.status == "ok", result.error
    names = [line.split(" ")[0] for line in result.output.splitlines()]
    assert not any(
        n.startswith(".git") or n.startswith(".env") or n.endswith((".key", "id_ed25519"))
        for n in names
    ), names
    assert "hello.txt" in names


def test_searching_finds_nothing_in_secrets(secrets_env: ToolEnv) -> None:
    for pattern in (CREDENTIAL, "ghp_", "url ="):
        result = secrets_env.run("search_files", pattern=pattern)
        assert result.status == "ok", result.error
        assert result.output == f"no matches for {pattern!r} in ."  # not one secret line
    result = secrets_env.run("search_files", pattern="x", path=".git")
    assert result.status == "error" and "secret denylist" in (result.error or "")


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("edit_file", {"path": ".env", "old_str": "TOKEN=ghp", "new_str": "x"}),
        ("write_file", {"path": ".git/config", "content": "x"}),
        ("delete_file", {"path": "sub/server.key"}),
    ],
)
def test_the_write_tools_do_not_answer_about_secrets_either(
    secrets_env: ToolEnv, tool: str, args: dict[str, str]
) -> None:
    result = secrets_env.run(tool, **args)
    assert result.status == "error" and "secret denylist" in (result.error or ""), result


def test_a_deployment_sets_its_own_denylist(secrets_env: ToolEnv) -> None:
    result = secrets_env.run_with({"secret_denylist": ["*.key"]}, "read_file", path=".env")
    assert (result.status, result.output) == ("ok", f"TOKEN={CREDENTIAL}\n")
    result = secrets_env.run_with({"secret_denylist": ["config/"]}, "read_file", path="hello.txt")
    assert result.status == "ok"


def test_the_default_is_on_and_matches_by_name_at_any_depth() -> None:
    assert ToolsSettings.model_fields["secret_denylist"].default_factory() == list(  # type: ignore[call-arg,misc]
        DEFAULT_DENYLIST
    )
    deny = DEFAULT_DENYLIST
    assert denied(PurePosixPath("a/b/.env"), False, deny) == ".env"
    assert denied(PurePosixPath("a/.git/objects/ab"), False, deny) == ".git/"
    assert denied(PurePosixPath(".git"), True, deny) == ".git/"
    assert denied(PurePosixPath(".git"), False, deny) is None  # a worktree's .git file
    assert denied(PurePosixPath("environment.py"), False, deny) is None
    assert denied(PurePosixPath("config/prod.yaml"), False, ["config/prod.yaml"]) is not None


@pytest.mark.parametrize("name", ["SERVER.PEM", "Prod.Key", ".ENV", ".Env.Local", "ID_RSA"])
def test_a_secret_named_in_other_letter_case_is_hidden_too(tool_env: ToolEnv, name: str) -> None:
    (tool_env.workspace / name).write_text(CREDENTIAL)
    result = tool_env.run("read_file", path=name)
    assert result.status == "error" and "secret denylist" in (result.error or ""), result
    listed = tool_env.run("list_dir", path=".")
    assert name not in listed.output and CREDENTIAL not in listed.output


def test_a_deployment_list_without_git_still_hides_git(secrets_env: ToolEnv) -> None:
    for patterns in (["*.key"], []):
        result = secrets_env.run_with(
            {"secret_denylist": patterns}, "read_file", path=".git/config"
        )
        assert result.status == "error" and CREDENTIAL not in result.output, (patterns, result)
        listed = secrets_env.run_with({"secret_denylist": patterns}, "list_dir", path=".")
        assert ".git" not in listed.output.split(), listed.output


def test_settings_and_the_tools_share_one_default() -> None:
    assert ToolsSettings.model_fields["secret_denylist"].default_factory is not None
    assert list(DEFAULT_DENYLIST) == list(DEFAULT_SECRET_DENYLIST)
