"""``python -m bench.profile_loop [TURNS]``: the agent loop in-process, under pyinstrument.

The ``turn`` benchmark's baseline (``signalbox.services.orchestrator.loop.run_turn`` with the model
and the tools called in this process, on a private Redis and SQLite) run ``TURNS`` times
after a warm-up, profiled; prints the call tree. This is the profile docs/benchmarks.md
quotes for where a model step's time goes when nothing crosses a process boundary.
"""

from __future__ import annotations

import statistics
import sys
import time

from bench import turns
from bench.environment import BenchEnv
from signalbox.services.orchestrator.loop import run_turn

WARMUP_TURNS = 3
INTERVAL_S = 0.0005


def main(argv: list[str]) -> int:
    """Profile ``argv[0]`` (default 15) in-process turns and print the tree."""
    from pyinstrument import Profiler

    count = int(argv[0]) if argv else 15
    env = BenchEnv.start()
    try:
        env.tools(1, turns.TOOLS_PER_STEP)  # only for the catalogue the loop reads
        user_id, _token = env.user()
        runtime = turns.in_process_runtime(env)
        timed = runtime.events
        assert isinstance(timed, turns.TimedEvents)
        for _ in range(WARMUP_TURNS):
            run_turn(runtime, turns.queued_turn(env, user_id))
        walls: list[float] = []
        profiler = Profiler(interval=INTERVAL_S, async_mode="disabled")
        profiler.start()
        for _ in range(count):
            turn_id = turns.queued_turn(env, user_id)
            timed.finished_at = None
            started = time.perf_counter()
            run_turn(runtime, turn_id)
            assert timed.finished_at is not None
            walls.append((timed.finished_at - started) * 1000)
        profiler.stop()
        turns.stop_runtime(runtime)
    finally:
        env.stop()
    per_step = statistics.median(walls) / turns.MODEL_STEPS
    print(f"{count} turns of {turns.MODEL_STEPS} model steps: median {statistics.median(walls):.1f}"
          f" ms per turn, {per_step:.1f} ms per step")  # fmt: skip
    print(profiler.output_text(unicode=False, color=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
