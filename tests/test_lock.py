"""requirements.lock is in step with pyproject.toml: every dependency pinned, hashed, in range.

No network: the lock is read as text and held to pyproject.toml's own ranges. (That the pins
install together is checked by the image build itself: `pip install --require-hashes` and
`pip check` in the Dockerfile, and by tests/test_image.py where Docker runs.)
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"
# The image's interpreter and platform (Dockerfile: python:3.11-slim), where every pin of the
# lock that applies must exist: the universal lock also covers other platforms and Pythons.
IMAGE_ENVIRONMENTS = [
    {"python_version": "3.11", "python_full_version": full, "sys_platform": "linux",
     "platform_system": "Linux", "platform_machine": machine, "implementation_name": "cpython",
     "platform_python_implementation": "CPython", "os_name": "posix"}
    for full in ("3.11.0", "3.11.14")  # the lock splits some pins at a 3.11 patch release
    for machine in ("x86_64", "aarch64")
]  # fmt: skip
PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)\s*(?:;(?P<marker>.+))?$"
)


@dataclass(frozen=True)
class Pin:
    """One ``name==version ; marker`` entry of the lock, with its hashes."""

    name: str
    version: Version
    marker: Marker | None
    hashes: tuple[str, ...]

    def applies(self, environment: dict[str, str]) -> bool:
        return self.marker is None or self.marker.evaluate(environment)


def parse_lock(text: str) -> list[Pin]:
    """The entries of a pip requirements file with hashes (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    pins = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(re.split(r"\s+--hash=", line, maxsplit=1)[0].strip())
        assert match, f"not a pinned requirement: {line!r}"
        marker = match["marker"]
        pins.append(
            Pin(
                name=canonicalize_name(match["name"]),
                version=Version(match["version"]),
                marker=Marker(marker.strip()) if marker else None,
                hashes=tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", line)),
            )
        )
    return pins


def problems(lock: list[Pin], required: list[str]) -> list[str]:
    """What is wrong with ``lock`` for ``required`` (pyproject's requirement strings)."""
    found = []
    by_name: dict[str, list[Pin]] = {}
    for pin in lock:
        by_name.setdefault(pin.name, []).append(pin)
        if not pin.hashes:
            found.append(f"{pin.name}=={pin.version} has no hash")
    for text in required:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        for environment in IMAGE_ENVIRONMENTS:
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
            pins = [p for p in by_name.get(name, []) if p.applies(environment)]
            if not pins:
                where = f"{environment['python_full_version']} {environment['platform_machine']}"
                found.append(f"{text!r}: not in the lock for Python {where}")
        for pin in by_name.get(name, []):
            if not requirement.specifier.contains(pin.version, prereleases=True):
                found.append(f"{text!r}: the lock pins {pin.version}")
    return found


def _pyproject() -> dict[str, object]:
    return tomllib.loads(PYPROJECT.read_text())


def _main_and_build_requirements() -> list[str]:
    data = _pyproject()
    project = data["project"]
    build = data["build-system"]
    assert isinstance(project, dict) and isinstance(build, dict)
    return [*project["dependencies"], *build["requires"]]


def test_the_lock_pins_every_dependency_in_range_with_hashes() -> None:
    lock = parse_lock(LOCK.read_text())
    assert len(lock) > 20, "the lock lost its transitive dependencies"
    assert problems(lock, _main_and_build_requirements()) == []


def test_the_lock_names_the_command_that_made_it() -> None:
    assert "#    scripts/lock" in LOCK.read_text().split("\n", 3)[1]
    assert (ROOT / "scripts" / "lock").stat().st_mode & 0o111


@pytest.mark.parametrize(
    ("lock_text", "complaint"),
    [
        ("celery==4.4.7 \\\n    --hash=sha256:" + "a" * 64 + "\n", "the lock pins 4.4.7"),
        ("redis==5.0.0\n", "has no hash"),
        ("", "not in the lock"),
        (
            "celery==5.7.0 ; sys_platform == 'darwin' \\\n    --hash=sha256:" + "b" * 64,
            "not in the lock",
        ),
    ],
    ids=["out-of-range", "no-hash", "missing", "only-for-another-platform"],
)
def test_the_check_refuses_a_lock_out_of_step(lock_text: str, complaint: str) -> None:
    found = problems(parse_lock(lock_text), ["celery[redis]>=5.7,<6", "redis>=5.0,<9"])
    assert any(complaint in line for line in found), found
