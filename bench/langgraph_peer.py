"""The agent loop beside LangGraph's: the same scripted turn, in process, per model step.

The turn is the ``turn`` benchmark's: 3 tool steps of 4 instant ``sleep`` calls each, then
the answer (4 model steps), the model scripted in this process (no network). Signalbox runs
it as ``turn``'s baseline does (``run_turn`` with its SQL and Redis writes, the tools in
threads publishing on the turn's result stream: ``bench.turns.in_process_runtime``).
LangGraph runs it as a ``StateGraph`` of a model node and its prebuilt ``ToolNode`` (the
tools of a step in its thread pool, as its own agents do), without a checkpointer and with
its SQLite one (``langgraph-checkpoint-sqlite``, a file like Signalbox's database), one
thread per turn. The rounds interleave, so each ratio is of one moment of the machine.

LangGraph is an optional ``bench`` dependency: without it the benchmark reports
Signalbox's figure alone.
"""

from __future__ import annotations

import itertools
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import turns
from bench.environment import BenchEnv
from bench.stats import Result, Series
from signalbox.services.orchestrator.loop import run_turn
from signalbox.shared.ids import new_id

TARGET_RATIO = 1.5  # issue 20: the loop per model step ≤ 1.5x LangGraph with a checkpointer

TurnFn = Callable[[], None]


def langgraph_turns(db_path: Path) -> dict[str, TurnFn] | None:
    """One turn function per LangGraph setup (None without LangGraph installed):
    ``memory`` (no checkpointer), ``sqlite`` (its default durability, ``async``: a step's
    checkpoint is written while the next runs) and ``sqlite_sync`` (each step's checkpoint
    committed before the next step, as Signalbox commits its steps)."""
    try:
        from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition
    except ImportError:
        return None

    @tool
    def sleep(seconds: float) -> str:
        """Sleep for ``seconds`` (0: return at once)."""
        time.sleep(seconds)
        return f"slept {seconds:g} s"

    def model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        messages: list[AnyMessage] = state["messages"]
        step = sum(1 for m in messages if isinstance(m, AIMessage)) + 1
        if step > turns.TOOL_STEPS:
            return {"messages": [AIMessage(content="done")]}
        calls = [
            {"name": "sleep", "args": dict(turns.INSTANT_INPUT), "id": new_id("toolu")}
            for _ in range(turns.TOOLS_PER_STEP)
        ]
        return {"messages": [AIMessage(content=f"step {step}", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([sleep]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)  # to "tools", or the end
    graph.add_edge("tools", "model")
    plain = graph.compile()
    # check_same_thread=False: LangGraph writes checkpoints from its own threads.
    conn = sqlite3.connect(str(db_path), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    saved = graph.compile(checkpointer=saver)
    counter = itertools.count()

    def run(compiled: Any, durability: str | None) -> None:
        config = {"configurable": {"thread_id": f"t{next(counter)}"}}
        kwargs = {"durability": durability} if durability else {}
        out = compiled.invoke(
            {"messages": [HumanMessage(content="run the tools")]}, config, **kwargs
        )
        ais = [m for m in out["messages"] if isinstance(m, AIMessage)]
        if len(ais) != turns.MODEL_STEPS or ais[-1].tool_calls:
            raise RuntimeError(f"langgraph: expected {turns.MODEL_STEPS} model steps: {ais}")

    return {
        "memory": lambda: run(plain, None),
        "sqlite": lambda: run(saved, None),
        "sqlite_sync": lambda: run(saved, "sync"),
    }


def _per_step_ms(seconds: float) -> float:
    return seconds * 1000 / turns.MODEL_STEPS


def _rounds(
    total: int,
    warmup: int,
    signalbox_turn: Callable[[], float],
    peers: dict[str, TurnFn],
    ours: list[float],
    ours_cpu: list[float],
    theirs: dict[str, list[float]],
    theirs_cpu: dict[str, list[float]],
) -> None:
    """Interleaved rounds: one Signalbox turn, then one of each peer."""
    for i in range(total):
        cpu = time.process_time()
        wall = signalbox_turn()
        cpu = time.process_time() - cpu
        if i >= warmup:
            ours.append(_per_step_ms(wall))
            ours_cpu.append(_per_step_ms(cpu))
        for name, peer in peers.items():
            cpu, started = time.process_time(), time.perf_counter()
            peer()
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            if i >= warmup:
                theirs[name].append(_per_step_ms(wall))
                theirs_cpu[name].append(_per_step_ms(cpu))


def loop(env: BenchEnv, rounds: int, warmup: int) -> list[Result]:
    """Signalbox's in-process loop vs LangGraph's graph on the same turn, per model step."""
    env.tools(1, turns.TOOLS_PER_STEP)  # only for the catalogue the loop reads
    user_id, _token = env.user()
    runtime = turns.in_process_runtime(env)
    timed = runtime.events
    assert isinstance(timed, turns.TimedEvents)

    def signalbox_turn() -> float:
        turn_id = turns.queued_turn(env, user_id)
        timed.finished_at = None
        started = time.perf_counter()
        outcome = run_turn(runtime, turn_id)
        if outcome != "completed" or timed.finished_at is None:
            raise RuntimeError(f"loop: the in-process turn ended {outcome!r}")
        return timed.finished_at - started

    peers = langgraph_turns(env.var_dir / "langgraph.db") or {}
    ours: list[float] = []
    ours_cpu: list[float] = []
    theirs: dict[str, list[float]] = {name: [] for name in peers}
    theirs_cpu: dict[str, list[float]] = {name: [] for name in peers}
    try:
        _rounds(warmup + rounds, warmup, signalbox_turn, peers, ours, ours_cpu, theirs, theirs_cpu)
    finally:
        turns.stop_runtime(runtime)

    measured = Series("Signalbox in-process loop, per model step", ours)
    extra: dict[str, Any] = {
        "model_steps": turns.MODEL_STEPS,
        "langgraph_installed": bool(peers),
        "signalbox_cpu_ms_per_step": round(statistics.median(ours_cpu), 3),
    }
    baseline = None
    if peers:
        baseline = Series("LangGraph + SQLite checkpointer, per model step", theirs["sqlite"])
        for name in peers:
            extra[f"langgraph_{name}_ms_per_step"] = round(statistics.median(theirs[name]), 3)
            extra[f"langgraph_{name}_cpu_ms_per_step"] = round(
                statistics.median(theirs_cpu[name]), 3
            )
            extra[f"ratio_to_langgraph_{name}"] = round(
                measured.median / statistics.median(theirs[name]), 3
            )
    met = None if baseline is None else measured.median <= TARGET_RATIO * baseline.median
    return [
        Result(
            id="loop",
            what=f"the `turn` benchmark's turn ({turns.TOOL_STEPS} tool steps x "
            f"{turns.TOOLS_PER_STEP} instant tools, then an answer), model and tools in "
            "process: Signalbox's loop (SQL + Redis) vs LangGraph's graph, ms per model step",
            measured=measured,
            baseline=baseline,
            target=f"≤ {TARGET_RATIO:g}x LangGraph with its SQLite checkpointer",
            met=met,
            extra=extra,
            notes=[
                "LangGraph: a `StateGraph` of a scripted model node and its prebuilt "
                "`ToolNode`; `sqlite` is its `SqliteSaver` on a file with the default "
                "durability (`async`), `sqlite_sync` the same with `durability='sync'` "
                "(each step committed before the next, as Signalbox does), `memory` no "
                "checkpointer. Rounds interleave: one Signalbox turn, then one of each.",
                "CPU figures are this process's (`time.process_time`, tool threads "
                "included); Signalbox's Redis server is another process and not in them.",
            ],
        )
    ]
