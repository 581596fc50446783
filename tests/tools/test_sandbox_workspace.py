"""run_python over the conversation's own workspace, as a user asking "analyse this CSV" and a
hostile program meet it: it reads its files at /workspace, cannot change them, and sees
neither another user's workspace nor ``.git`` internals nor secret files.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from signalbox.services.tools.execution import execute
from signalbox.services.tools.workspace_view import STAGE_PREFIX
from signalbox.shared.ids import new_id
from signalbox.shared.tool_contract import ToolResult
from signalbox.shared.workspace_paths import workspace_dir
from tests.tools.conftest import WORKSPACE, ToolEnv

CREDENTIAL = "ghp_s3cr3tT0ken4f2a"
OTHER_MARKER = "OTHER-USER-MARKER-9c1e"

pytestmark = pytest.mark.usefixtures("sandbox_ready")


def _run(env: ToolEnv, code: str, **settings: object) -> ToolResult:
    request = env.request("run_python", code=code)
    context = dataclasses.replace(env.context(request.call_id, **settings), timeout_s=10.0)
    return execute(request, context, env.registry)


@pytest.fixture
def csv_workspace(tool_env: ToolEnv) -> ToolEnv:
    ws = tool_env.workspace
    (ws / "sales.csv").write_text("region,amount\nnorth,10\nsouth,32\nnorth,5\n")
    (ws / "sales.csv").chmod(0o600)  # as the proposals service leaves files: private
    git = ws / ".git"
    git.mkdir()
    (git / "config").write_text(
        f'[remote "origin"]\n\turl = https://bot:{CREDENTIAL}@github.com/acme/app.git\n'
    )
    (ws / ".env").write_text(f"TOKEN={CREDENTIAL}\n")
    (ws / "deploy.pem").write_text(f"-----BEGIN PRIVATE KEY-----\n{CREDENTIAL}\n")
    other = workspace_dir(tool_env.settings.workspaces_root, new_id("user"), WORKSPACE)
    other.mkdir(parents=True)
    (other / "theirs.txt").write_text(OTHER_MARKER)
    return tool_env


def test_a_program_summarises_a_csv_of_its_own_workspace(csv_workspace: ToolEnv) -> None:
    code = (
        "import csv, collections, os\n"
        "totals = collections.Counter()\n"
        "for row in csv.DictReader(open('sales.csv')):\n"
        "    totals[row['region']] += int(row['amount'])\n"
        "print(os.getcwd(), dict(sorted(totals.items())))\n"
    )
    result = _run(csv_workspace, code)
    assert (result.status, result.output) == (
        "ok",
        "/workspace {'north': 15, 'south': 32}\n",
    ), result.error


@pytest.mark.parametrize(
    "attempt",
    [
        "open('sales.csv', 'w').write('x')",
        "open('new.txt', 'w').write('x')",
        "os.remove('sales.csv')",
        "os.mkdir('made')",
    ],
)
def test_the_workspace_cannot_be_changed(csv_workspace: ToolEnv, attempt: str) -> None:
    code = (
        f"import os, errno\ntry:\n    {attempt}\n"
        "except OSError as e:\n    print(errno.errorcode[e.errno])\n"
    )
    result = _run(csv_workspace, code)
    assert (result.status, result.output) == ("ok", "EROFS\n"), result
    assert (csv_workspace.workspace / "sales.csv").read_text().startswith("region,amount")
    assert not (csv_workspace.workspace / "new.txt").exists()


def test_git_internals_and_secret_files_are_not_there(csv_workspace: ToolEnv) -> None:
    code = (
        "import os, json\n"
        "seen, leaked = [], []\n"
        "for top, dirs, files in os.walk('/workspace'):\n"
        "    for name in dirs + files:\n"
        "        seen.append(os.path.relpath(os.path.join(top, name), '/workspace'))\n"
        "    for name in files:\n"
        f"        if {CREDENTIAL!r} in open(os.path.join(top, name), errors='replace').read():\n"
        "            leaked.append(name)\n"
        "tries = {}\n"
        "for p in ('.git/config', '.env', 'deploy.pem'):\n"
        "    try:\n"
        "        tries[p] = open(p).read()\n"
        "    except OSError as e:\n"
        "        tries[p] = type(e).__name__\n"
        "print(json.dumps([sorted(seen), leaked, tries]))\n"
    )
    result = _run(csv_workspace, code)
    assert result.status == "ok", result.error
    seen, leaked, tries = json.loads(result.output)
    assert seen == ["hello.txt", "sales.csv", "sub", "sub/code.py"]
    assert leaked == [] and CREDENTIAL not in result.output
    assert tries == {p: "FileNotFoundError" for p in (".git/config", ".env", "deploy.pem")}


def test_another_users_workspace_is_not_visible(csv_workspace: ToolEnv) -> None:
    root = csv_workspace.settings.workspaces_root.resolve()
    code = (
        "import os\n"
        f"print(os.path.exists({str(root)!r}), sorted(os.listdir('/')))\n"
        "for top, dirs, files in os.walk('/workspace'):\n"
        "    for name in files:\n"
        f"        assert {OTHER_MARKER!r} not in open(os.path.join(top, name)).read()\n"
    )
    result = _run(csv_workspace, code)
    assert result.status == "ok", result.error
    assert result.output.startswith("False ") and "'workspace'" in result.output
    assert OTHER_MARKER not in result.output


def test_the_copy_is_bounded_says_what_it_left_out_and_is_removed(
    csv_workspace: ToolEnv, tmp_path: Path
) -> None:
    (csv_workspace.workspace / "big.bin").write_bytes(b"x" * (2 * 1024 * 1024))
    result = _run(
        csv_workspace, "import os\nprint(sorted(os.listdir('.')))\n", sandbox_workspace_mb=1
    )
    assert result.status == "ok", result.error
    assert "'big.bin'" not in result.output.splitlines()[0]
    assert "/workspace holds no copy of big.bin" in result.output
    import tempfile

    left = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(STAGE_PREFIX)]
    assert left == []


def test_the_denylist_is_the_deployments_to_set(csv_workspace: ToolEnv) -> None:
    result = _run(csv_workspace, "print(open('.env').read(), end='')\n", secret_denylist=[".git/"])
    assert (result.status, result.output) == ("ok", f"TOKEN={CREDENTIAL}\n"), result.error
