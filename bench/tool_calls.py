"""Benchmarks of tool calls: dispatch, fanout, timeout and throughput.

The bench process plays the orchestrator with the orchestrator's own code: calls go out
through ``signalbox.services.orchestrator.dispatch.CeleryDispatcher`` (one Celery group, per-call
time limits) to real prefork tool workers, and results are taken back the way
``server_calls.gather`` takes them: ``XREAD BLOCK`` on the turn's result stream.
The baselines run a bare no-op Celery task (``bench.noop_app``) on workers started with
the same pool and concurrency, on the same Redis, interleaved round by round.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, group

from bench.environment import BenchEnv, proc_tree_cpu_s
from bench.noop_app import NOOP_QUEUE, NOOP_TASK, SLEEP_TASK
from bench.stats import Result, Series
from signalbox.services.orchestrator.dispatch import HARD_LIMIT_EXTRA_S, CeleryDispatcher
from signalbox.shared.ids import new_id
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult, ToolSpec, read_catalogue

GRACE_S = 5.0  # the orchestrator's default tool_grace_s: beyond it a call is lost
BARE_TIMEOUT_S = 30.0
DISPATCH_SLOTS = 2  # prefork slots of the single worker in the dispatch benchmark


@dataclass(frozen=True)
class Call:
    """One call to make: which test tool, its input and its time limit."""

    tool: str
    input: dict[str, Any]
    timeout_s: float


@dataclass(frozen=True)
class Outcome:
    """A call's result and when the caller saw it (seconds after the send started)."""

    result: ToolResult
    seen_after_s: float


class Caller:
    """The orchestrator's half of a tool call, run in the bench process."""

    def __init__(self, env: BenchEnv) -> None:
        self.env = env
        self.app = env.celery("bench-orchestrator")
        self.dispatcher = CeleryDispatcher(self.app, env.redis, env.keys)
        self.user_id = "user_bench"
        self.catalogue: dict[str, ToolSpec] = {}

    def refresh(self) -> None:
        """Read the live catalogue (after the tool workers changed)."""
        self.catalogue = read_catalogue(self.env.redis, self.env.keys)

    def run(self, calls: Sequence[Call]) -> tuple[float, dict[str, Outcome]]:
        """Send ``calls`` as one group; return the send duration and each call's outcome."""
        if not self.catalogue:
            self.refresh()
        turn_id = new_id("turn")
        requests = [
            (
                ToolCallRequest(
                    call_id=new_id("call"),
                    turn_id=turn_id,
                    conversation_id="conv_bench",
                    user_id=self.user_id,
                    workspace="default",
                    tool=c.tool,
                    input=c.input,
                    timeout_s=c.timeout_s,
                ),
                self.catalogue[c.tool],
            )
            for c in calls
        ]
        key = self.env.keys.tool_results(turn_id)
        waiting = {r.call_id for r, _ in requests}
        outcomes: dict[str, Outcome] = {}
        deadline_s = max(c.timeout_s for c in calls) + GRACE_S
        started = time.perf_counter()
        self.dispatcher.send(requests)
        sent_s = time.perf_counter() - started
        last_id = "0-0"
        while waiting:
            left = deadline_s - (time.perf_counter() - started)
            if left <= 0:
                raise TimeoutError(f"calls {sorted(waiting)} lost: no result in {deadline_s} s")
            reply: Any = self.env.redis.xread(
                {key: last_id}, block=max(1, int(left * 1000)), count=64
            )
            now = time.perf_counter() - started
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    result = ToolResult.model_validate_json(fields[b"r"])
                    if result.call_id in waiting:
                        waiting.discard(result.call_id)
                        outcomes[result.call_id] = Outcome(result, now)
        self.env.redis.delete(key)
        ordered = {r.call_id: outcomes[r.call_id] for r, _ in requests}
        return sent_s, ordered


def bare_round_trip(app: Celery) -> float:
    """Seconds for ``apply_async().get()`` of the no-op task."""
    started = time.perf_counter()
    app.send_task(NOOP_TASK, queue=NOOP_QUEUE).get(timeout=BARE_TIMEOUT_S, interval=0.005)
    return time.perf_counter() - started


def bare_parallel(app: Celery, count: int, task: str = NOOP_TASK, seconds: float = 0) -> float:
    """Seconds for ``count`` bare tasks sent at once until the last result is in.

    Each result is awaited on its own (``AsyncResult.get``: the Redis backend's pub/sub,
    no polling interval), so this is Celery's fastest way to run tasks in parallel and
    collect them: the floor under a step's tool calls.
    """
    args = [seconds] if task == SLEEP_TASK else []
    started = time.perf_counter()
    sent = [app.send_task(task, args=args, queue=NOOP_QUEUE) for _ in range(count)]
    for result in sent:
        result.get(timeout=BARE_TIMEOUT_S)
    return time.perf_counter() - started


def bare_batch(app: Celery, count: int) -> float:
    """Seconds for ``count`` no-op tasks sent as one group until every result is in."""
    signatures = [app.signature(NOOP_TASK, queue=NOOP_QUEUE) for _ in range(count)]
    started = time.perf_counter()
    group(signatures, app=app).apply_async().get(timeout=BARE_TIMEOUT_S * 4, interval=0.005)
    return time.perf_counter() - started


INSTANT = Call("sleep", {"seconds": 0}, 5.0)


def dispatch(env: BenchEnv, rounds: int, warmup: int) -> list[Result]:
    """One call's round trip through Signalbox vs a bare Celery ``apply_async().get()``."""
    env.tools(1, DISPATCH_SLOTS)
    env.noop_workers(1, DISPATCH_SLOTS)
    caller = Caller(env)
    caller.refresh()
    bare = env.celery("bench-bare")
    ours: list[float] = []
    base: list[float] = []
    for i in range(warmup + rounds):
        _sent, outcomes = caller.run([INSTANT])
        (outcome,) = outcomes.values()
        bare_s = bare_round_trip(bare)
        if i >= warmup:
            ours.append(outcome.seen_after_s * 1000)
            base.append(bare_s * 1000)
    measured = Series("signalbox dispatch", ours)
    baseline = Series("celery apply_async().get()", base)
    ratio = measured.median / baseline.median
    return [
        Result(
            id="dispatch",
            what="one tool call: dispatch → prefork tool worker → result on the turn's "
            "result stream, seen by XREAD",
            measured=measured,
            baseline=baseline,
            target="≤ 1.5x the bare round trip",
            met=ratio <= 1.5,
            extra={"worker_slots": DISPATCH_SLOTS, "tool": "sleep(0)"},
        )
    ]


def fanout(env: BenchEnv, rounds: int, warmup: int, quick: bool) -> list[Result]:
    """N calls sleeping 0.5 s each on N worker slots: how close to 0.5 s the step ends."""
    sizes = [(1, 4)] if quick else [(1, 16), (4, 16)]
    results = []
    for processes, slots in sizes:
        env.tools(processes, slots)
        caller = Caller(env)
        caller.refresh()
        calls = [Call("sleep", {"seconds": 0.5}, 5.0)] * (processes * slots)
        walls: list[float] = []
        sends: list[float] = []
        cpu: list[float] = []
        pids = env.tools(processes, slots).pids
        env.noop_workers(processes, slots)
        bare = env.celery("bench-bare")
        bare_walls: list[float] = []
        for i in range(warmup + rounds):
            cpu_before = proc_tree_cpu_s(pids)
            sent_s, outcomes = caller.run(calls)
            cpu.append((proc_tree_cpu_s(pids) - cpu_before) * 1000 / len(calls))
            if any(o.result.status != "ok" for o in outcomes.values()):
                raise RuntimeError(f"fanout: a call failed: {outcomes}")
            bare_s = bare_parallel(bare, len(calls), SLEEP_TASK, 0.5)
            if i >= warmup:
                walls.append(max(o.seen_after_s for o in outcomes.values()) * 1000)
                sends.append(sent_s * 1000)
                bare_walls.append(bare_s * 1000)
        measured = Series(f"{len(calls)} x sleep(0.5)", walls)
        bare_median = Series("bare", bare_walls).median
        efficiency = 500.0 / measured.median
        results.append(
            Result(
                id="fanout",
                variant=f"{len(calls)}x{processes}p",
                what=f"{len(calls)} calls sleeping 0.5 s, {processes} worker process(es) x "
                f"{slots} slots: send → last result",
                measured=measured,
                baseline=Series("ideal", [500.0]),
                target="≤ 600 ms (efficiency ≥ 0.83)",
                met=measured.median <= 600,
                extra={
                    "efficiency": round(efficiency, 3),
                    "send_ms_median": round(Series("send", sends).median, 3),
                    "worker_cpu_ms_per_call": round(Series("cpu", cpu[warmup:]).median, 3),
                    "bare_celery_ms_median": round(bare_median, 3),
                    "ratio_to_bare_celery": round(measured.median / bare_median, 3),
                },
                notes=[
                    "`bare_celery_ms_median`: the same number of bare Celery tasks sleeping "
                    "0.5 s on bare workers of the same pool and size, each result awaited "
                    "(`bench.tool_calls.bare_parallel`), interleaved round by round.",
                ],
            )
        )
    env.stop_noop()
    return results


def timeout(env: BenchEnv, rounds: int, warmup: int) -> list[Result]:
    """A hung call with a 1 s limit beside 3 quick ones: when is its timeout reported?"""
    env.tools(1, 4)
    caller = Caller(env)
    caller.refresh()
    quick = [INSTANT] * 3
    results = []
    variants = [
        ("soft", {"seconds": 30}, rounds),
        # Ignores the soft limit, so only the hard kill (limit + HARD_LIMIT_EXTRA_S) ends it.
        ("hard", {"seconds": 30, "ignore_soft_limit": True}, max(1, min(rounds, 3))),
    ]
    for variant, hung_input, n in variants:
        reported: list[float] = []
        others_ok = True
        statuses: list[str] = []
        for i in range(warmup + n):
            _sent, outcomes = caller.run([Call("sleep", hung_input, 1.0), *quick])
            hung, *rest = outcomes.values()
            if i >= warmup:
                reported.append(hung.seen_after_s * 1000)
                statuses.append(hung.result.status)
                others_ok = others_ok and all(o.result.status == "ok" for o in rest)
        measured = Series(f"hung call ({variant} limit) reported", reported)
        in_window = all(1000 <= r <= 1300 for r in reported)
        all_timeout = all(s == "timeout" for s in statuses)
        results.append(
            Result(
                id="timeout",
                variant=variant,
                what="a hung call with a 1 s limit beside 3 quick calls: send → its "
                f"`timeout` result seen ({variant} time limit)",
                measured=measured,
                baseline=Series("its limit", [1000.0]),
                target="reported in 1.0-1.3 s; the 3 others ok",
                met=in_window and others_ok and all_timeout,
                notes=[]
                if variant == "soft"
                else [
                    "A call that ignores the soft limit is killed at the hard limit, which "
                    f"the orchestrator sets {HARD_LIMIT_EXTRA_S:g} s after the soft one "
                    "(dispatch.HARD_LIMIT_EXTRA_S)."
                ],
                extra={"others_ok": others_ok, "statuses": sorted(set(statuses))},
            )
        )
    return results


def throughput(
    env: BenchEnv, rounds: int, warmup: int, quick: bool, slots: int = 2
) -> list[Result]:
    """Trivial calls per second through Signalbox vs bare Celery tasks, same workers."""
    sizes = [1] if quick else [1, 2, 4]
    batch = 40 if quick else 300
    results = []
    for processes in sizes:
        env.tools(processes, slots)
        env.noop_workers(processes, slots)
        caller = Caller(env)
        caller.refresh()
        bare = env.celery("bench-bare")
        ours: list[float] = []
        base: list[float] = []
        ours_cpu: list[float] = []
        base_cpu: list[float] = []
        tool_pids = env.tools(processes, slots).pids
        noop_pids = env.noop_workers(processes, slots).pids
        for i in range(warmup + rounds):
            size = batch if i >= warmup else max(10, batch // 10)
            cpu_before = proc_tree_cpu_s(tool_pids)
            _sent, outcomes = caller.run([INSTANT] * size)
            ours_s = max(o.seen_after_s for o in outcomes.values())
            ours_cpu.append((proc_tree_cpu_s(tool_pids) - cpu_before) * 1000 / size)
            cpu_before = proc_tree_cpu_s(noop_pids)
            bare_s = bare_batch(bare, size)
            base_cpu.append((proc_tree_cpu_s(noop_pids) - cpu_before) * 1000 / size)
            if i >= warmup:
                ours.append(size / ours_s)
                base.append(size / bare_s)
        measured = Series("signalbox calls/s", ours, unit="calls/s", higher_is_better=True)
        baseline = Series("bare celery tasks/s", base, unit="calls/s", higher_is_better=True)
        results.append(
            Result(
                id="throughput",
                variant=f"{processes}p",
                what=f"{batch} trivial calls as one group, {processes} tool worker "
                f"process(es) x {slots} prefork slots: calls per second",
                measured=measured,
                baseline=baseline,
                target="≥ 0.7x bare Celery",
                met=measured.median / baseline.median >= 0.7,
                extra={
                    "batch": batch,
                    "slots": slots,
                    "worker_cpu_ms_per_call": round(Series("c", ours_cpu[warmup:]).median, 3),
                    "bare_worker_cpu_ms_per_task": round(Series("c", base_cpu[warmup:]).median, 3),
                },
            )
        )
    env.stop_noop()
    return results
