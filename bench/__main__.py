"""``python -m bench``: run the benchmarks, print them, write JSON and docs/benchmarks.md.

python -m bench                       # the whole suite (about 15 minutes on 2 cores)
python -m bench --only relay,turn     # some of it; the page keeps the others' last figures
python -m bench --quick --rounds 2    # tiny sizes, for the smoke test (no page)
python -m bench --only load           # issue 7's load run: 200 conversations at once (~1 min)
python -m bench --only load_per_call  # the same, a task per tool call (load@200-per-call)
python -m bench --only tracing        # CPU per turn with traces on vs off (~5 min)
python -m bench --profile             # also profile the services where a target is missed
python -m bench --only load --postgres postgresql://postgres@127.0.0.1/postgres
                                      # the load run on PostgreSQL (load@200-postgres)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import (
    cost,
    fairness,
    gateway_load,
    langgraph_peer,
    load,
    plans,
    report,
    tool_calls,
    tool_overhead,
    tracing_cost,
    turns,
)
from bench.environment import BenchEnv
from bench.profiling import SAMPLE_RATE_HZ, recording
from bench.stats import Result


@dataclass(frozen=True)
class Options:
    """How one benchmark is run."""

    rounds: int
    warmup: int
    quick: bool


Runner = Callable[[BenchEnv, Options], list[Result]]


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its runner, default rounds, and the processes worth profiling."""

    run: Runner
    rounds: int
    quick_rounds: int
    profile: dict[str, tuple[str, ...]] = field(default_factory=dict)  # process → focus
    profile_cpu: bool = False  # a CPU profile (GIL-holding samples), else wall clock


# The functions a request passes through in each service: profiles keep only those stacks.
GATEWAY_FOCUS = (
    "WsSession.",
    "websocket_endpoint",
    "StreamReader.",
    "RelayHub.",
    "Subscription.",
    "Gateway.db.",  # SQL work, in a worker thread
    "Gateway.enqueue_turn.",  # the Celery publish, in a worker thread
    "_store_and_send (signalbox/services/gateway/turns.py)",  # a turn's submission, a thread
)
ORCHESTRATOR_FOCUS = ("run_turn (signalbox/services/orchestrator/loop.py)",)
TOOLS_FOCUS = (
    "run_tool (signalbox/services/tools/tasks.py)",
    "run_batch_task (signalbox/services/tools/tasks.py)",
)
TURN_PROFILE = {
    "orchestrator1": ORCHESTRATOR_FOCUS,
    "gateway": GATEWAY_FOCUS,
    "tools1": TOOLS_FOCUS,
}

# In the order they run: fewest restarts of tool workers between neighbours.
BENCHMARKS: dict[str, Benchmark] = {
    "first_event": Benchmark(
        lambda env, o: turns.first_event(env, o.rounds, o.warmup),
        rounds=50,
        quick_rounds=3,
        profile={"gateway": GATEWAY_FOCUS, "orchestrator1": ORCHESTRATOR_FOCUS},
    ),
    "turn": Benchmark(
        lambda env, o: turns.turn(env, o.rounds, o.warmup),
        rounds=20,
        quick_rounds=2,
        profile=TURN_PROFILE,
    ),
    # The same turn with a quick tool: a step's four calls as one task.
    "turn_quick": Benchmark(
        lambda env, o: turns.turn(env, o.rounds, o.warmup, quick=True),
        rounds=20,
        quick_rounds=2,
        profile=TURN_PROFILE,
    ),
    "loop": Benchmark(
        lambda env, o: langgraph_peer.loop(env, o.rounds, o.warmup), rounds=20, quick_rounds=2
    ),
    "plans": Benchmark(lambda env, o: plans.plans(env, o.rounds, o.warmup), 5, 1),
    "timeout": Benchmark(lambda env, o: tool_calls.timeout(env, o.rounds, o.warmup), 5, 1),
    "dispatch": Benchmark(
        lambda env, o: tool_calls.dispatch(env, o.rounds, o.warmup),
        rounds=100,
        quick_rounds=3,
        profile={"tools1": TOOLS_FOCUS},
    ),
    "throughput": Benchmark(
        lambda env, o: tool_calls.throughput(env, o.rounds, o.warmup, o.quick),
        rounds=5,
        quick_rounds=1,
    ),
    "cost": Benchmark(lambda env, o: cost.cost(env, o.quick), rounds=1, quick_rounds=1),
    "tool_overhead": Benchmark(
        lambda _env, o: tool_overhead.tool_overhead(o.rounds, o.warmup),
        rounds=2000,
        quick_rounds=20,
    ),
    "fanout": Benchmark(
        lambda env, o: tool_calls.fanout(env, o.rounds, o.warmup, o.quick),
        rounds=10,
        quick_rounds=2,
    ),
    "relay": Benchmark(
        lambda env, o: gateway_load.relay(env, o.quick),
        rounds=1,
        quick_rounds=1,
        profile={"gateway": GATEWAY_FOCUS},
    ),
    "connections": Benchmark(
        lambda env, o: gateway_load.connections(env, o.quick, o.rounds),
        rounds=1,
        quick_rounds=1,
    ),
    "fairness": Benchmark(
        lambda env, o: fairness.fairness(env, o.rounds, o.quick), rounds=5, quick_rounds=1
    ),
    # Last: it adds a second orchestrator (stopped again at its end) and 200 conversations.
    # Its target is CPU per turn, so its profile is of CPU, not of waiting.
    "load": Benchmark(
        lambda env, o: load.load(env, o.quick, o.warmup),
        rounds=1,
        quick_rounds=1,
        profile={
            "gateway": GATEWAY_FOCUS,
            "orchestrator1": ORCHESTRATOR_FOCUS,
            "tools1": TOOLS_FOCUS,
        },
        profile_cpu=True,
    ),
    # The same load with a task per tool call: the tool hop batches save, side by side.
    "load_per_call": Benchmark(
        lambda env, o: load.load(env, o.quick, o.warmup, tool=load.PER_CALL_TOOL),
        rounds=1,
        quick_rounds=1,
    ),
    # After load: it runs `turn` and `load` again, twice each (traces off, then on).
    "tracing": Benchmark(
        lambda env, o: tracing_cost.tracing(env, o.rounds, o.warmup, o.quick),
        rounds=10,
        quick_rounds=1,
    ),
}


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few rounds")
    parser.add_argument("--only", default="", help=f"ids, comma-separated: {','.join(BENCHMARKS)}")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds of each")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured rounds first")
    parser.add_argument("--results-dir", type=Path, default=report.RESULTS_DIR)
    parser.add_argument(
        "--docs-dir",
        type=Path,
        default=None,
        help="where benchmarks.md and its plots go (default: docs/, not with --quick)",
    )
    parser.add_argument("--no-docs", action="store_true", help="do not write the page")
    parser.add_argument(
        "--profile", action="store_true", help="also profile the services (an extra pass)"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and state here")
    parser.add_argument(
        "--postgres",
        default=None,
        metavar="URL",
        help="run on a database of its own on this PostgreSQL server (default: SQLite); "
        "the load benchmark's variant says so (load@200-postgres)",
    )
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; expected one of {', '.join(BENCHMARKS)}")
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    args.selected = only or list(BENCHMARKS)
    return args


def _line(result: Result) -> str:
    m, b = result.measured, result.baseline

    def fmt(value: float) -> str:
        return "—" if math.isnan(value) else f"{value:9.2f}"

    base = f"baseline {fmt(b.median)} / {fmt(b.p99)}" if b else "baseline —"
    ratio = f"{result.ratio:6.2f}x" if result.ratio is not None else "     —"
    verdict = {True: "met", False: "MISSED", None: "-"}[result.met]
    return (
        f"{result.label:<16} median {fmt(m.median)} p99 {fmt(m.p99)} {m.unit:<8} {base}  "
        f"ratio {ratio}  [{verdict}: {result.target}]"
    )


def _children(env: BenchEnv) -> dict[str, int]:
    running = {name: child.pid for name, child in env.stack.children.items() if child.alive()}
    return running


def _profile(
    env: BenchEnv, bench_id: str, bench: Benchmark, options: Options
) -> list[dict[str, Any]]:
    """Run ``bench`` once more, unmeasured, with py-spy on the processes it names."""
    targets = {n: (p, bench.profile[n]) for n, p in _children(env).items() if n in bench.profile}
    try:
        out_dir = env.var_dir / "profiles" / bench_id
        with recording(targets, out_dir, cpu=bench.profile_cpu) as found:
            bench.run(env, Options(max(3, options.rounds // 2), 0, options.quick))
    except Exception as exc:  # a profile is a bonus; the figures are already taken
        print(f"  profiling {bench_id} failed: {exc!r}", flush=True)
    print(f"  profiled {', '.join(targets)}", flush=True)
    return [p.to_json() for p in found]


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks; returns the exit status (1 if any could not run)."""
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.time()
    results: list[Result] = []
    errors: list[dict[str, str]] = []
    profiles: dict[str, list[dict[str, Any]]] = {}
    rounds_used: dict[str, int] = {}
    env = BenchEnv.start(args.keep, args.postgres)
    machine = env.machine
    try:
        print(f"machine: {machine.caption()}", flush=True)
        for bench_id in args.selected:
            bench = BENCHMARKS[bench_id]
            default_rounds = bench.quick_rounds if args.quick else bench.rounds
            options = Options(
                rounds=args.rounds or default_rounds,
                warmup=args.warmup if args.warmup is not None else (1 if args.quick else 3),
                quick=args.quick,
            )
            rounds_used[bench_id] = options.rounds
            began = time.monotonic()
            load_before = os.getloadavg()[0]
            try:
                got = bench.run(env, options)
            except Exception as exc:
                traceback.print_exc()
                errors.append({"id": bench_id, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{bench_id}: FAILED ({exc})", flush=True)
                continue
            for result in got:
                # Other work on the machine shows here; the ratios are what survives it.
                result.extra["loadavg_1m_before"] = round(load_before, 2)
                result.extra["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
            results.extend(got)
            for result in got:
                print(_line(result), flush=True)
            print(f"  ({bench_id} took {time.monotonic() - began:.1f} s)", flush=True)
            if args.profile and bench.profile:
                profiles[bench_id] = _profile(env, bench_id, bench, options)
    finally:
        env.stop()
    run = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "quick": args.quick,
        "rounds": rounds_used,
        "machine": machine.to_json(),
        "results": [r.to_json() for r in results],
        "errors": errors,
        "profiles": profiles,
        "profile_rate_hz": SAMPLE_RATE_HZ,
    }
    path = report.write_results(run, args.results_dir)
    print(f"results: {path}")
    docs_dir = args.docs_dir or (None if args.quick else report.DOCS_DIR)
    if docs_dir is not None and not args.no_docs:
        page = report.write_docs(report.merged(run, args.results_dir, path), docs_dir)
        print(f"docs: {page}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
