"""The benchmark suite runs end to end at a tiny size. No timing is asserted: benchmarks
measure, and a slow CI machine must not fail a test for being slow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE_TIMEOUT_S = 300  # about 40 s on a quiet 2-core machine; over 100 s was seen at load 10
SERIES_FIELDS = {"name", "unit", "n", "median", "p99", "min", "max", "samples"}


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 20)
def test_bench_quick_run_writes_results_and_the_page(tmp_path: Path) -> None:
    results_dir = tmp_path / "results"
    docs_dir = tmp_path / "docs"
    run = subprocess.run(
        [
            sys.executable, "-m", "bench", "--quick", "--rounds", "2",
            "--only", "first_event,turn,dispatch,fanout,load",
            "--results-dir", str(results_dir), "--docs-dir", str(docs_dir),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )  # fmt: skip
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}"

    (path,) = results_dir.glob("*-quick.json")
    body = json.loads(path.read_text())
    assert body["quick"] is True
    assert body["errors"] == []
    machine = body["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["redis"] and machine["commit"]

    by_id = {r["id"]: r for r in body["results"]}
    assert set(by_id) == {"first_event", "turn", "dispatch", "fanout", "load"}
    for result in body["results"]:
        assert set(result["measured"]) >= SERIES_FIELDS, result
        if result["id"] != "load":  # the load's samples are its conversations
            assert result["measured"]["n"] == len(result["measured"]["samples"]) == 2
        assert result["baseline"] is not None and set(result["baseline"]) >= SERIES_FIELDS
        assert isinstance(result["ratio"], float) and result["ratio"] > 0
        assert isinstance(result["met"], bool)
        assert result["target"] and result["what"]
    assert by_id["fanout"]["extra"]["efficiency"] > 0
    assert by_id["turn"]["extra"]["model_steps"] == 4
    # The load run checks correctness, not speed: at its quick size every turn completes
    # and every event reaches its client once, in order.
    load = by_id["load"]["extra"]
    conversations = load["conversations"]
    assert by_id["load"]["measured"]["n"] == conversations > 1
    assert load["completed"] == load["sql_turn_statuses"]["completed"] == conversations, load
    assert load["events_received"] == load["events_expected"] > 0, load
    assert load["lost_events"] == load["duplicated_events"] == load["out_of_order_events"] == 0
    assert load["tool_executions"] == load["tool_executions_expected"] == conversations * 12
    assert by_id["load"]["met"] is True, by_id["load"]["notes"]
    # CPU per turn by process, against bare Celery making the run's task hops (issue 20):
    # at least one run_turn delivery per turn, and the 12 tool calls.
    hops = load["hops"]
    assert hops["tool_calls"] == conversations * 12
    assert hops["run_turn_deliveries"] >= conversations
    bare = load["bare_celery"]
    assert bare["tasks"] == hops["run_turn_deliveries"] + hops["tool_calls"] == sum(bare["rounds"])
    assert set(bare["cpu_ms_per_turn"]) == {"workers", "redis", "producer (bench process)"}
    assert load["stack_cpu_ms_per_turn"] > 0 and load["cpu_ratio_to_bare_celery"] > 0
    # Redis commands per turn: at least each turn's events appended to its stream.
    commands = load["redis_commands_per_turn"]
    per_turn = load["events_expected"] / conversations
    assert commands["by_command"]["xadd"] >= per_turn and commands["total"] > per_turn

    page = (docs_dir / "benchmarks.md").read_text()
    assert machine["commit"] in page
    for label in (
        "`first_event`",
        "`turn`",
        "`dispatch`",
        "`fanout@",
        "## Load",
        "`load@",
        "bare Celery, the same hops",
        "Redis commands per turn",
    ):
        assert label in page
    assert (docs_dir / "bench-latency.png").stat().st_size > 0
    for label in ("first_event", "turn", "dispatch", "fanout", "load@"):
        assert label in run.stdout  # each benchmark printed its line


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 20)
def test_bench_cost_compares_caching_with_none(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable, "-m", "bench", "--quick", "--only", "cost",
            "--results-dir", str(tmp_path), "--no-docs",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )  # fmt: skip
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}"

    (path,) = tmp_path.glob("*-quick.json")
    body = json.loads(path.read_text())
    assert body["errors"] == []
    by_label = {r["label"]: r for r in body["results"]}
    assert set(by_label) == {"cost@4_turns", "cost@sub_agents"}
    turns = by_label["cost@4_turns"]
    assert turns["measured"]["n"] == turns["baseline"]["n"] == 4
    # Token counts, not timings: the fake's tokenizer is deterministic, so caching must save.
    assert turns["extra"]["ratio_last_turn"] > 1
    assert turns["extra"]["cost_usd_cached"] < turns["extra"]["cost_usd_uncached"]
