"""Starting and stopping a stack's children together: ``start_together``, ``stop_together``,
``Stack.start`` and ``Stack.stop``.

The children here are small Python programs that say what they saw, except in the last test,
where a real stack fails to start.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from signalbox.processes import (
    Child,
    Launch,
    StartError,
    log_contains,
    start_together,
    stop_together,
)
from signalbox.stack import Stack, StackConfig
from tests.databases import database_for

# Says "up" once its SIGTERM handling is in place, then waits for a signal.
UP = "import signal, sys\n{setup}\nprint('up', flush=True)\nwhile True:\n    signal.pause()\n"


def _child(tmp_path: Path, name: str, code: str) -> Child:
    return Child(
        name=name,
        args=[sys.executable, "-c", code],
        log_path=tmp_path / "logs" / f"{name}.log",
        env=dict(os.environ),
    )


def _waiter(tmp_path: Path, name: str, setup: str = "") -> Child:
    return _child(tmp_path, name, UP.format(setup=setup))


def test_a_child_starts_only_once_those_it_comes_after_are_ready(tmp_path: Path) -> None:
    first = _waiter(tmp_path, "first")
    other = _waiter(tmp_path, "other")
    # What "later" finds in first's log the moment it starts.
    later = _child(
        tmp_path,
        "later",
        f"import pathlib\ntext = pathlib.Path({str(first.log_path)!r}).read_text()\n"
        + UP.format(setup="print('first was up:', 'up' in text.splitlines(), flush=True)"),
    )
    order: list[str] = []
    launches = [
        Launch(later, log_contains(later, "up\n"), after=("first",)),
        Launch(first, log_contains(first, "up\n")),
        Launch(other, log_contains(other, "up\n")),
    ]
    try:
        start_together(launches, on_start=lambda child: order.append(child.name))
        assert all(child.alive() for child in (first, later, other))
        assert "first was up: True" in later.log_tail()
        assert order == ["first", "other", "later"]  # those waiting on nothing, at once
    finally:
        stop_together([first, later, other])


def test_a_child_that_exits_fails_the_start_with_its_log_and_what_follows_never_starts(
    tmp_path: Path,
) -> None:
    broken = _child(tmp_path, "broken", "print('boom: bad settings'); raise SystemExit(3)")
    after_it = _waiter(tmp_path, "after-it")
    beside = _waiter(tmp_path, "beside")
    try:
        with pytest.raises(StartError) as failed:
            start_together(
                [
                    Launch(broken, log_contains(broken, "never printed")),
                    Launch(after_it, log_contains(after_it, "up\n"), after=("broken",)),
                    Launch(beside, log_contains(beside, "never printed")),
                ]
            )
        assert "broken exited during start-up" in str(failed.value)
        assert "boom: bad settings" in str(failed.value)
        assert after_it.process is None
        assert beside.alive()  # left for the caller to stop
    finally:
        stop_together([broken, after_it, beside])
    assert not beside.alive()


def test_a_child_not_ready_in_its_time_fails_the_start(tmp_path: Path) -> None:
    slow = _waiter(tmp_path, "slow")
    try:
        with pytest.raises(StartError, match=r"slow not ready within 0\.5 s"):
            start_together([Launch(slow, log_contains(slow, "never printed"), timeout_s=0.5)])
    finally:
        stop_together([slow])


def test_an_unknown_or_circular_order_is_refused_before_anything_starts(tmp_path: Path) -> None:
    a, b = _waiter(tmp_path, "a"), _waiter(tmp_path, "b")
    never = log_contains(a, "never printed")
    with pytest.raises(ValueError, match="unknown"):
        start_together([Launch(a, never, after=("nobody",))])
    with pytest.raises(ValueError, match="cycle"):
        start_together([Launch(a, never, after=("b",)), Launch(b, never, after=("a",))])
    assert a.process is None and b.process is None


def test_children_that_ignore_sigterm_share_one_deadline_then_are_killed(tmp_path: Path) -> None:
    stubborn = [
        _waiter(tmp_path, f"stubborn{i}", "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
        for i in range(3)
    ]
    start_together([Launch(child, log_contains(child, "up\n")) for child in stubborn])
    began = time.monotonic()
    stop_together(stubborn, timeout_s=3.0)
    took = time.monotonic() - began
    assert [child.process.returncode for child in stubborn if child.process] == [
        -signal.SIGKILL
    ] * 3
    assert 3.0 <= took < 6.0, took  # one deadline after the other: 9 s at least


def test_child_stop_alone_stops_one_child(tmp_path: Path) -> None:
    one, two = _waiter(tmp_path, "one"), _waiter(tmp_path, "two")
    start_together([Launch(child, log_contains(child, "up\n")) for child in (one, two)])
    try:
        one.stop()
        assert one.process is not None and one.process.returncode == -signal.SIGTERM
        assert two.alive()
    finally:
        stop_together([one, two])


def test_stack_stop_stops_the_workers_together_and_then_the_http_services(
    tmp_path: Path,
) -> None:
    """Each worker on SIGTERM waits until every worker has had its SIGTERM, then exits: it
    exits by itself only if they were signalled together. The services note their SIGTERM."""
    journal = tmp_path / "journal"
    workers = ("tools1", "orchestrator1", "scheduler")

    def note(name: str, what: str) -> str:
        return f"open({str(journal)!r}, 'a').write('{name} {what}\\n')"

    def worker(name: str) -> Child:
        wait_all = f"all(f'{{w}} term' in lines for w in {workers!r})"
        on_term = (
            "def on_term(*_):\n"
            f"    {note(name, 'term')}\n"
            "    import pathlib, time\n"
            "    while True:\n"
            f"        lines = pathlib.Path({str(journal)!r}).read_text().splitlines()\n"
            f"        if {wait_all}:\n"
            "            break\n"
            "        time.sleep(0.01)  # the other workers' signal: polled\n"
            f"    {note(name, 'exit')}\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, on_term)"
        )
        return _waiter(tmp_path, name, on_term)

    def service(name: str) -> Child:
        on_term = (
            f"def on_term(*_):\n    {note(name, 'term')}\n    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, on_term)"
        )
        return _waiter(tmp_path, name, on_term)

    stack = Stack(StackConfig(var_dir=tmp_path, redis_url="", database_url="", internal_token=""))
    children = [service("proposals"), service("gateway"), *(worker(name) for name in workers)]
    start_together([Launch(child, log_contains(child, "up\n")) for child in children])
    stack.children.update((child.name, child) for child in children)

    stack.stop(timeout_s=30.0)

    assert stack.children == {}
    assert [child.process.returncode for child in children if child.process] == [0] * 5
    lines = journal.read_text().splitlines()
    last_worker_exit = max(lines.index(f"{name} exit") for name in workers)
    assert all(lines.index(f"{name} term") > last_worker_exit for name in ("proposals", "gateway"))


def test_a_stack_that_fails_to_start_stops_what_started_and_names_the_failing_child(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
    internal_token: str,
) -> None:
    """A tool worker that refuses the sandbox queue (no bubblewrap where it is told to look)."""
    made: list[Child] = []

    class Recording(Stack):
        def _child(self, name: str, args: list[str], worker: bool = False) -> Child:
            child = super()._child(name, args, worker)
            made.append(child)
            return child

    stack = Recording(
        StackConfig(
            var_dir=tmp_path,
            redis_url=redis_url,
            database_url=database_for(request, tmp_path, "failing"),
            internal_token=internal_token,
            redis_prefix=redis_prefix + "failing-stack:",
            extra_env={"ANTHROPIC_API_KEY": "", "SIGNALBOX_SANDBOX_BWRAP": "/nonexistent/bwrap"},
        )
    )
    with pytest.raises(StartError) as failed:
        stack.start()
    assert "tools1 exited during start-up" in str(failed.value)
    assert "refusing to consume 'tools.sandbox'" in str(failed.value)
    by_name = {child.name: child for child in made}
    assert set(by_name) == {"proposals", "gateway", "tools1", "orchestrator1", "scheduler"}
    assert by_name["orchestrator1"].process is None  # after the tool workers: never started
    for name in ("proposals", "gateway", "scheduler"):  # started (tools1 after proposals)
        assert by_name[name].process is not None, name
    assert not any(child.alive() for child in made)
    assert stack.children == {}
