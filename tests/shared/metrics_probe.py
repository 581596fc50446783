"""Run as ``python -m tests.shared.metrics_probe DIR``: prometheus_client's multiprocess mode
as a prefork tool worker uses it (``shared/metrics.py``), in a process of its own because it
switches prometheus_client globally. Prints what the main process's registry then reports.

Three forked children each count one run and hold a live gauge up: the first exits through
the pool's shutdown path (``mark_dead``), the second is SIGKILLed (a hard time limit: no
shutdown code runs), the third is still running when the main process collects.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from prometheus_client import Counter, Gauge

from signalbox.shared.metrics import enable_multiprocess, mark_dead, worker_registry


def main(path: str) -> None:
    """Fork, count, collect, print one JSON object."""
    enable_multiprocess(path)
    runs = Counter("probe_runs", "runs", ["tool"], registry=None)
    running = Gauge("probe_running", "running", registry=None, multiprocess_mode="livesum")
    children: list[int] = []
    release_r, release_w = os.pipe()
    for i in range(3):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            runs.labels("read_file").inc()
            running.inc()
            os.write(ready_w, b"x")
            if i == 0:
                mark_dead(os.getpid())  # the pool's worker_process_shutdown
                os._exit(0)
            os.read(release_r, 1)  # held until released (or killed)
            os._exit(0)
        os.read(ready_r, 1)
        children.append(pid)
    os.waitpid(children[0], 0)
    os.kill(children[1], signal.SIGKILL)
    os.waitpid(children[1], 0)
    found: dict[str, float] = {}
    for family in worker_registry(path).collect():
        for sample in family.samples:
            found[sample.name] = found.get(sample.name, 0.0) + sample.value
    os.write(release_w, b"x")
    os.waitpid(children[2], 0)
    print(
        json.dumps(
            {
                "values": found,
                "files": sorted(os.listdir(path)),
                "children": children,
                "main": os.getpid(),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
