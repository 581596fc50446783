"""``signalbox probe``: health checks for docker-compose and Kubernetes exec probes.

- ``probe worker NAME [--queue Q]``: the Celery worker ``NAME`` (``%h`` is this host's name,
  as in the worker's own ``-n``) answers a control ``ping`` within the timeout, and, with
  ``--queue``, consumes ``Q``. Built on the deployment's settings alone: no worker module is
  imported, so a probe never loads the tools, the policy or an MCP server.
- ``probe http URL``: ``URL`` answers 200 (``/healthz``: alive; ``/readyz``: Redis and SQL
  reachable).

Exit status 0 when healthy, 1 otherwise, with the reason on stderr. ``python -m
signalbox.probe`` is the same command without the CLI's imports (docker-compose runs it
every few seconds).
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

DEFAULT_TIMEOUT_S = 5.0


def worker_name(name: str) -> str:
    """``name`` with ``%h`` replaced by this host's name (a container's or a pod's)."""
    return name.replace("%h", socket.gethostname())


def probe_worker(name: str, queue: str | None, timeout_s: float) -> int:
    """0 if the worker answers a ping (and consumes ``queue``), else 1."""
    from signalbox.shared.celery_app import make_celery
    from signalbox.shared.settings import CommonSettings, load

    target = worker_name(name)
    app = make_celery("signalbox-probe", load(CommonSettings))
    try:
        replies = app.control.ping(destination=[target], timeout=timeout_s)
        if not any(target in reply for reply in replies or []):
            print(f"probe: worker {target!r} did not answer within {timeout_s} s", file=sys.stderr)
            return 1
        if queue is not None:
            active = app.control.inspect(destination=[target], timeout=timeout_s).active_queues()
            names = {q.get("name") for q in (active or {}).get(target, [])}
            if queue not in names:
                print(
                    f"probe: worker {target!r} does not consume {queue!r} "
                    f"(it consumes {sorted(n for n in names if n)!r})",
                    file=sys.stderr,
                )
                return 1
    except Exception as exc:  # the broker is down, or refused us
        print(f"probe: worker {target!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        app.close()
    return 0


def probe_http(url: str, timeout_s: float) -> int:
    """0 if ``url`` answers 200, else 1."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"probe: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"probe: {url} answered {status}", file=sys.stderr)
        return 1
    return 0


def add_arguments(probe: argparse.ArgumentParser) -> None:
    """``worker NAME [--queue Q]`` and ``http URL``, each with ``--timeout``."""
    sub = probe.add_subparsers(dest="probe_command", required=True, metavar="WHAT")
    worker = sub.add_parser("worker", help="a Celery worker answers a ping (exit 0)")
    worker.add_argument("name", help="the worker's -n name; %%h is this host (tools@%%h)")
    worker.add_argument("--queue", help="and it consumes this queue")
    http = sub.add_parser("http", help="a URL answers 200 (/healthz, /readyz)")
    http.add_argument("url")
    for one in (worker, http):
        one.add_argument(
            "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds (default 5)"
        )


def run(args: argparse.Namespace) -> int:
    """The exit status of the probe ``args`` name."""
    if args.probe_command == "worker":
        return probe_worker(args.name, args.queue, args.timeout)
    return probe_http(args.url, args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m signalbox.probe``: as ``signalbox probe``."""
    parser = argparse.ArgumentParser(prog="python -m signalbox.probe", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
