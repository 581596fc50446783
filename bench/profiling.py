"""Profiles of service processes while a benchmark runs: ``py-spy record`` attached by pid.

Two kinds, chosen by the benchmark:

- wall clock (the default): idle samples are kept (``--idle``), because a latency is mostly
  waiting — on Redis, on SQL, on another process;
- CPU (``cpu=True``, for a benchmark whose target is CPU, ``load``): only samples of a
  thread holding the GIL (``--gil``), so a thread blocked in a socket read, which py-spy's
  idle detection does not always recognise, is not counted as work. Time in C code that
  releases the GIL (SQLite's own work, a ``send``) is not counted either. A CPU profile
  also says which library the samples were spent in (``libraries``): the first frame below
  Signalbox's own last frame, so the HTTP client under the ``anthropic`` SDK counts as the
  SDK's, and a leaf in Signalbox's own code as ``signalbox``.

Non-blocking, so the profiled process is never paused. Only samples on the path being
measured count: stacks through one of the benchmark's *focus* functions (``TurnRunner.``,
``WsSession.``...), cut at that frame, so idle pool threads and background loops
(catalogue refresh, reconciler) drop out; what is left says where a request's time goes,
inclusive and self.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLE_RATE_HZ = 250
TOP = 15
_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    """The py-spy executable next to this interpreter, or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = path.rsplit("/work/main/", 1)[-1]
    return f"{match['func']} ({path})"


@dataclass
class Profile:
    """What one process spent its CPU samples on."""

    process: str
    samples: int = 0
    inclusive: list[tuple[str, float]] = field(default_factory=list)
    self_time: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None
    cpu: bool = False  # GIL-holding samples only, else wall clock
    libraries: list[tuple[str, float]] = field(default_factory=list)  # CPU profiles only

    def to_json(self) -> dict[str, Any]:
        """The JSON form (shares of the process's samples, 0 to 1)."""
        return {
            "process": self.process,
            "samples": self.samples,
            "inclusive": [[f, round(s, 4)] for f, s in self.inclusive],
            "self": [[f, round(s, 4)] for f, s in self.self_time],
            "error": self.error,
            "cpu": self.cpu,
            "libraries": [[f, round(s, 4)] for f, s in self.libraries],
        }


def library(frame: str) -> str:
    """The package a shortened frame's code belongs to: ``anthropic``, ``json``, ``signalbox``.

    py-spy names files relative to the ``sys.path`` entry they were found on, so the first
    component of the path is the top-level package (or the stdlib module).
    """
    match = _FRAME.match(frame)
    path = match["file"] if match is not None else frame
    if "signalbox/" in path:
        return "signalbox"
    if path.startswith("<"):  # <string>, <frozen ...>, <sqlalchemy generated __init__ ...>
        return "sqlalchemy" if "sqlalchemy" in path else path.split(" ", 1)[0].strip("<>")
    return path.split("/", 1)[0].removesuffix(".py")


def _library_of_sample(frames: list[str]) -> str:
    """Which library a sample is spent in: the one Signalbox's last frame called, if any."""
    libraries = [library(f) for f in frames]
    ours = [i for i, name in enumerate(libraries) if name == "signalbox"]
    if not ours or ours[-1] == len(libraries) - 1:
        return libraries[-1]
    return libraries[ours[-1] + 1]


def summarise(
    process: str, collapsed: str, focus: tuple[str, ...], top: int = TOP, cpu: bool = False
) -> Profile:
    """The top functions of a py-spy ``--format raw`` output, on stacks through ``focus``.

    ``cpu``: the samples are GIL-holding ones; also share them out by library.
    """
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    libraries: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")[1:]]  # the first is the thread
        first = next((i for i, f in enumerate(frames) if any(x in f for x in focus)), None)
        if first is None:
            continue  # not the measured path: an idle pool thread, a background loop
        frames = frames[first:]
        total += count
        for name in set(frames):
            inclusive[name] += count
        leaf[frames[-1]] += count
        if cpu:
            libraries[_library_of_sample(frames)] += count
    if total == 0:
        return Profile(process, error=f"no samples through {', '.join(focus)}", cpu=cpu)
    return Profile(
        process=process,
        samples=total,
        inclusive=[(f, c / total) for f, c in inclusive.most_common(top)],
        self_time=[(f, c / total) for f, c in leaf.most_common(top)],
        cpu=cpu,
        libraries=[(f, c / total) for f, c in libraries.most_common(top)],
    )


@contextlib.contextmanager
def recording(
    targets: dict[str, tuple[int, tuple[str, ...]]], out_dir: Path, cpu: bool = False
) -> Iterator[list[Profile]]:
    """Record every ``name → (pid, focus)`` in ``targets`` for the duration of the block.

    ``cpu``: GIL-holding samples only (``--gil``), else wall clock (``--idle``).
    """
    exe = py_spy()
    profiles: list[Profile] = []
    if exe is None:
        profiles.extend(Profile(n, error="py-spy is not installed", cpu=cpu) for n in targets)
        yield profiles
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    running: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    for name, (pid, _focus) in targets.items():
        out = out_dir / f"{name}.collapsed"
        process = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE_HZ),
             "--format", "raw", "--nonblocking", "--gil" if cpu else "--idle", "--subprocesses",
             "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        running.append((name, out, process))
    try:
        yield profiles
    finally:
        for name, out, process in running:
            process.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
            try:
                _out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                _out, err = process.communicate()
            if out.exists():
                profiles.append(summarise(name, out.read_text(), targets[name][1], cpu=cpu))
            else:
                message = err.decode(errors="replace").strip().splitlines()
                error = message[-1] if message else "no output"
                profiles.append(Profile(name, error=error, cpu=cpu))
