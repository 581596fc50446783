"""``pip install .`` installs one top-level package, ``signalbox``, and everything it needs.

The repository keeps ``shared/`` and ``services/`` at its top; the distribution maps them
under ``signalbox`` (``signalbox/shared`` and ``signalbox/services`` link to them), so an
installed Signalbox never takes the generic names ``shared`` or ``services`` from another
distribution, and every import of the code itself reads ``signalbox.shared...``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project installed with ``pip install --target`` from a copy-free build."""
    target = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--target", str(target), str(ROOT)],
        check=True, env=env, cwd=tmp_path_factory.mktemp("cwd"), timeout=280,
    )  # fmt: skip
    return target


def test_only_signalbox_at_the_top_level(installed: Path) -> None:
    top = sorted(p.name for p in installed.iterdir() if p.name != "bin")
    packages = [name for name in top if not name.endswith(".dist-info")]
    assert packages == ["signalbox"], top


def test_the_installed_copy_runs_without_the_repository(installed: Path) -> None:
    # From an empty directory, with only the installed copy on the path: the services'
    # modules, their migrations, price table and web UI are all in it.
    probe = (
        "import signalbox.services.gateway.app, signalbox.services.orchestrator.tasks;"
        "import signalbox.shared.db.migrate as m;"
        "from pathlib import Path;"
        "import signalbox.services.gateway as g, signalbox.services.orchestrator as o;"
        "assert any(m.MIGRATIONS.glob('versions/0001_*.py')), m.MIGRATIONS;"
        "assert (Path(o.__file__).parent / 'prices.toml').is_file();"
        "assert (Path(g.__file__).parent / 'static' / 'index.html').is_file();"
        "import importlib.util as u;"
        "assert u.find_spec('shared') is None and u.find_spec('services') is None;"
        "print(signalbox.services.gateway.app.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(installed), "PYTHONSAFEPATH": "1"}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=env, cwd=installed.parent, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(installed)), out.stdout
